"""Theorems 1-4 (metadata consistency), as bounded z3 queries over the configuration domain.

Bounds (stated once): batch size b in 1..8 (and b > 992 separately: every split is 1), per-sequence lengths in
1..2^20 (the call's static seqlen_k up to 2^21), query rows per sequence up to 2^16 for multi-row calls, heads and
head dims of the real models in `spec.model.domain.MODELS` (theorem 1 adds FA3's asymmetric head-dim instances), SM
counts 78/108/114/132, split counts 1..256 (a positive num_splits is a symbolic value in 1..256).

Method. The discrete part of a configuration is enumerated concretely and grouped by what FA3 actually decides
from it (`spec.theorems.symbolic.SideParams` of both sides: tiles, pack-GQA, layout, split-heuristic table); lengths, b
and fixed split counts stay symbolic. Each group is checked in two stages:

- stage 1 (cheap, no float): a violation of SPLIT_BOUND or COMBINE_CAPACITY needs a per-batch split s with
  S_c < s, and the prepare step gives s <= S_p (lemma "prepare-split-bound"); kMax(S_c, dv) >= S_c. So both need
  S_p > S_c. Stage 1 asks z3 for S_c > 1 and S_p > S_c, or a QUERY_COVER violation; unsat proves the group SAFE.
- stage 2 (only where stage 1 is sat): the full prepare step (float32 blocks_per_sm, per-batch splits), one query
  per b = 1..8, first witness wins. The call's static seqlen_k is first constrained to sglang's eager page-table
  width ceil(max/page)*page (a replayable witness), then to any width >= the longest sequence (CUDA graph).

BATCH_PERMUTATION holds whenever both sides use the same b (the sort permutes (split, m_blocks, batch) tuples
together); KV_COVER is the separate lemma "kv-cover". Every witness is replayed concretely through refmodel and
`spec.invariants` before it is reported; a disagreement is reported as inconclusive, never as a result.

This module holds the shared decode encoding (groups, stages 1 and 2, the witness search, the concrete replay)
and the entry point :func:`spec.theorems.metadata_jobs.run_metadata_theorems`; each theorem family is its own module: lemmas (theorem 0,
``metadata_lemmas``), freshness (1, ``metadata_freshness``), drift (2,
``metadata_drift``) and the policy theorems (3, 4, ``metadata_policy``). The entry point runs them
as jobs (``metadata_jobs``, ``spec.theorems.jobs``): theorems that share queries run together with one cache,
every job in its own z3 context, so a theorem's witness does not depend on what else the process ran.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import z3

from refmodel.fa3_scheduler import ceil_div, get_num_splits, resolve_schedule, with_inputs
from refmodel.fa3_scheduler import call_inputs, precompute_inputs  # noqa: F401 - reached through this module by tests
from refmodel.prepare import prepare_scheduler

from spec.model import domain as D
from spec.theorems.base import select
from spec.theorems.results import TheoremResult
from spec.theorems.z3ctx import checked
from spec.theorems.symbolic import (
    BV,
    Heuristic,
    SideParams,
    boolval,  # noqa: F401 - the theorem-family modules build their constants through these helpers
    bv,
    ceil_div_const,
    side_params,
    smax,
    smin,
    solver,
    sym_blocks_per_sm_range,
    sym_m_blocks,
    sym_pack,
    sym_split_count,
    var,
)

__all__ = ["THEOREMS", "B_MAX", "LEN_MAX", "Q_MAX"]

B_MAX = 8
LEN_MAX = 2 ** 20
WITNESS_LEN = 32768  # witnesses are searched within a 32k context first (replayable cheaply)
KC_MAX = 2 ** 21
Q_MAX = 2 ** 16
SEED = 0


# ------------------------------------------------------------------------------------------------------------
# Small helpers
# ------------------------------------------------------------------------------------------------------------


@dataclass
class Budget:
    timeout_s: float
    unknowns: list = field(default_factory=list)
    queries: int = 0
    #: group key -> (verdict, witness), shared by the theorems of one run (identical queries are asked once)
    cache: dict = field(default_factory=dict)

    def check(self, s: z3.Solver, label: str):
        """Ask `s`; an unknown is recorded as inconclusive whatever z3's reason says.

        z3 answers a timed-out repeated check on the same solver with the reason "canceled", not "timeout": that
        is a timeout, never a user's Ctrl-C. A real SIGINT is the one Python's handler sees: `checked` raises it
        as KeyboardInterrupt at once (spec/theorems/z3ctx.py).
        """
        self.queries += 1
        r = checked(s)
        if r == z3.unknown:
            self.unknowns.append(f"{label}: {s.reason_unknown()}")
        return r


def val(model: z3.ModelRef, term) -> int:
    v = model.eval(term, model_completion=True)
    if z3.is_true(v) or z3.is_false(v):
        return int(z3.is_true(v))
    x = v.as_long()
    return x - (1 << BV) if x >= 1 << (BV - 1) else x


def _max(terms):
    out = terms[0]
    for t in terms[1:]:
        out = smax(out, t)
    return out


def _ceil_small(n, d):
    """ceil(n / d) for 0 <= n < 2^15 and symbolic d >= 1, dividing in 16 bits (d >= n gives 1)."""
    n16, d16 = z3.Extract(15, 0, n), z3.Extract(15, 0, d)
    return z3.If(n == bv(0), bv(0), z3.If(z3.UGE(d, n), bv(1), z3.ZeroExt(BV - 16, z3.UDiv(n16 + d16 - 1, d16))))


def _ceil_var(s: z3.Solver, name: str, x, c: int):
    """A fresh n with (n-1)*c < x <= n*c, i.e. n = ceil(x / c) for 1 <= x (multiplication by a constant only)."""
    n = var(name)
    s.add(n >= 0, n <= bv(KC_MAX), (n - 1) * bv(c) < x, x <= n * bv(c))
    return n


def matches(name: str, only) -> bool:
    """Whether ``--only`` selects theorem ``name``: the one rule of every group (spec.theorems.base.select: the
    name, a part of it, its family, or a former id)."""
    return not only or bool(select(only, [name]))


def is_known_guard(label: str) -> Optional[str]:
    return label if label in ("fixed", "pre-fix", "none") else None


# ------------------------------------------------------------------------------------------------------------
# Groups of configurations
# ------------------------------------------------------------------------------------------------------------


@dataclass
class Group:
    """Configurations whose queries are identical: both sides' SideParams, KV layout, fixed-split class."""

    P: SideParams
    C: SideParams
    sharded_cp: int          # 0: replicated KV; else the CP size the call's KV is sharded over
    page_size: int           # page size of the first config (eager witnesses use its page-table width)
    fixed: bool              # a positive num_splits on both sides: symbolic value in 1..256
    configs: list = field(default_factory=list)
    p_static_free: bool = False  # the precompute's max_seqlen_k is any value >= the longest sequence

    @property
    def example(self) -> D.Config:
        """The group's first configuration (witnesses are replayed on it first)."""
        return self.configs[0]

    @property
    def key(self) -> tuple:
        """Identity of the group's queries."""
        return (self.P.key, self.C.key, self.sharded_cp, self.fixed, self.p_static_free)


def group_configs(configs: Iterable[D.Config], metadata_heads: str, heuristic_p: Heuristic,
                   heuristic_c: Heuristic) -> list[Group]:
    groups: dict[tuple, Group] = {}
    for cfg in configs:
        fixed = cfg.backend_num_splits > 0
        pin = cfg.precompute_inputs(metadata_heads)
        cin = cfg.call_inputs()
        if fixed:
            pin = with_inputs(pin, num_splits=D.FIXED_SPLITS_REPRESENTATIVE)
            cin = with_inputs(cin, num_splits=D.FIXED_SPLITS_REPRESENTATIVE)
        P = side_params(pin, heuristic_p)
        C = side_params(cin, heuristic_c)
        sharded = cfg.server.attn_cp_size if cfg.sharded_kv else 0
        key = (P.key, C.key, sharded, fixed)
        if key not in groups:
            groups[key] = Group(P, C, sharded, cfg.server.page_size, fixed)
        groups[key].configs.append(cfg)
    return list(groups.values())


# ------------------------------------------------------------------------------------------------------------
# The decode encoding (sglang's precompute and forward_decode call)
# ------------------------------------------------------------------------------------------------------------


@dataclass
class _DecodeVars:
    b: int
    L: list
    local: list
    kc: Any
    k: Any
    Sp: Any
    Sc: Any
    splits: list
    p_static: Any


def _call_static(s: z3.Solver, g: Group, lmax_call, eager: bool, fresh: bool, lmax_p):
    """The call's static seqlen_k: eager page-table width ceil(max/page)*page, or any width >= max (CUDA graph)."""
    kc = var("kc")
    if fresh:
        s.add(kc >= lmax_p, kc <= bv(KC_MAX))
        return kc
    if eager:
        s.add(kc == ceil_div_const(lmax_call, g.page_size) * bv(g.page_size))
    else:
        s.add(kc >= lmax_call, kc <= bv(KC_MAX))
    return kc


def _p_static(s: z3.Solver, g: Group, lmax):
    """The precompute's max_seqlen_k: sglang passes max(seq_lens); FA3-level drift lets it be any value >= it."""
    if not g.p_static_free:
        return lmax
    x = var("p_static")
    s.add(x >= lmax, x <= bv(KC_MAX))
    return x


def _local_len(s: z3.Solver, name: str, L, cp: int):
    """A rank-local length of a sequence sharded over cp ranks: floor(L/cp) or ceil(L/cp) (balanced sharding)."""
    x = var(name)
    s.add(z3.UGE(x, z3.UDiv(L, bv(cp))), z3.ULE(x, ceil_div_const(L, cp)))
    return x


def stage1_reads(groups: list, fresh: bool) -> tuple:
    """Everything the stage-1 query of `groups` reads: the first group's shared fields and each member's split
    counts. Two families with the same reads pose the same query (tests/cli/test_stage1_reads.py builds both)."""
    g = groups[0]
    P, C = g.P, g.C
    return (fresh, g.sharded_cp, g.p_static_free, P.block_n, C.block_n, P.pack_s1, P.pack_split, P.qhpk, P.block_m,
            C.kernel_pack_s1, C.kernel_pack_split, C.qhpk, C.kernel_block_m,
            tuple((x.fixed, x.P.fixed_splits, x.P.table, x.P.tail, x.C.fixed_splits, x.C.table, x.C.tail)
                  for x in groups))


def stage1_search(family, budget: Budget, fresh: bool = False) -> tuple[str, Optional[dict]]:
    """Can S_p > S_c > 1, or a QUERY_COVER violation, happen? ('unsat'|'sat'|'unknown', model).

    `family` is a Group or a list of Groups that differ only in SM count and split tables (a symbolic index picks
    one): one query then covers all of them. Families whose groups differ only in what the query does not read
    (`stage1_reads`: head counts behind the same tiles and tables, layout fields) pose the same query: it is asked
    once per budget cache and its answer reused (callers read only the verdict; an unknown is asked again).
    """
    groups = family if isinstance(family, list) else [family]
    query = ("stage1 query", stage1_reads(groups, fresh))
    if query in budget.cache:
        return budget.cache[query]
    out = _stage1_ask(groups, budget, fresh)
    if out[0] != "unknown":
        budget.cache[query] = out
    return out


def _stage1_ask(groups: list, budget: Budget, fresh: bool) -> tuple[str, Optional[dict]]:
    g = groups[0]
    s = solver(budget.timeout_s, SEED)
    lmax = var("Lmax")
    s.add(lmax >= 1, lmax <= bv(LEN_MAX))
    lcall = _local_len(s, "Lmax_local", lmax, g.sharded_cp) if g.sharded_cp else lmax
    kc = _call_static(s, g, lcall, eager=False, fresh=fresh, lmax_p=lmax)
    p_static = kc if fresh else _p_static(s, g, lmax)
    k = var("k")
    s.add(k >= 1, k <= 256)
    idx = var("family_index")
    s.add(z3.ULT(idx, bv(len(groups))))
    n_p, n_c = ceil_div_const(p_static, g.P.block_n), ceil_div_const(kc, g.C.block_n)

    def pick(f):
        e = f(groups[-1])
        for i in range(len(groups) - 2, -1, -1):
            e = z3.If(idx == bv(i), f(groups[i]), e)
        return e

    Sp = pick(lambda x: sym_split_count(x.P, n_p, fixed=k if x.fixed else None))
    Sc = pick(lambda x: sym_split_count(x.C, n_c, fixed=k if x.fixed else None))
    pack_p = sym_pack(g.P, Sp)
    kpack_c = sym_pack(g.C, Sc, kernel=True)
    m_p = sym_m_blocks(bv(1), g.P.qhpk, pack_p, g.P.block_m)
    rows_c = z3.If(kpack_c, bv(g.C.qhpk), bv(1))
    s.add(z3.Or(z3.And(Sc > 1, Sp > Sc), m_p * bv(g.C.kernel_block_m) < rows_c))
    r = budget.check(s, "stage1")
    if r == z3.sat:
        m = s.model()
        return "sat", {"index": val(m, idx), "Lmax": val(m, lmax), "kc": val(m, kc), "S_p": val(m, Sp),
                       "S_c": val(m, Sc), "query_cover": bool(val(m, m_p * bv(g.C.kernel_block_m) < rows_c))}
    return ("unsat" if r == z3.unsat else "unknown"), None


def family_groups(groups: list) -> list:
    """Groups that differ only in SM count and split tables, batched for one stage-1 query each."""
    fam: dict = {}
    for g in groups:
        strip = lambda sp: dataclasses.replace(sp, num_sm=0, table=(), tail=0).key  # noqa: E731
        fam.setdefault((strip(g.P), strip(g.C), g.sharded_cp, g.fixed, g.p_static_free), []).append(g)
    return list(fam.values())


def prove_groups(groups: list, budget: Budget, fresh: bool = False):
    """Yield (group, verdict, witness) for groups not proved by their family's stage-1 query, in order."""
    for fam in family_groups(groups):
        fkey = ("family", tuple(g.key for g in fam), fresh)
        if fkey not in budget.cache:
            budget.cache[fkey] = stage1_search(fam, budget, fresh)[0]
        if budget.cache[fkey] == "unsat":
            continue
        for g in fam:
            verdict, w = find_witness(g, budget, fresh)
            yield g, verdict, w


def _stage2(g: Group, budget: Budget, b: int, eager: bool, fresh: bool = False,
            len_max: int = LEN_MAX) -> tuple[str, Optional[dict]]:
    """Full prepare step for exactly b sequences of at most len_max tokens: more splits than S_c (S_c > 1)?"""
    s = solver(budget.timeout_s, SEED)
    L = [var(f"L{i}") for i in range(b)]
    for x in L:
        s.add(x >= 1, x <= bv(len_max))
    n = [_ceil_var(s, f"n{i}", L[i], g.P.block_n) for i in range(b)]
    lmax = _max(L)
    local = [_local_len(s, f"local{i}", L[i], g.sharded_cp) for i in range(b)] if g.sharded_cp else list(L)
    kc = _call_static(s, g, _max(local), eager=eager, fresh=fresh, lmax_p=lmax)
    p_static = kc if fresh else _p_static(s, g, lmax)
    k = var("k")
    s.add(k >= 1, k <= 256)
    Sp = sym_split_count(g.P, ceil_div_const(p_static, g.P.block_n), fixed=k if g.fixed else None)
    Sc = sym_split_count(g.C, ceil_div_const(kc, g.C.block_n), fixed=k if g.fixed else None)
    pack = sym_pack(g.P, Sp)
    m1 = [ceil_div(g.P.qhpk, g.P.block_m), ceil_div(1, g.P.block_m)]  # decode: one query row per sequence
    total = bv(0)
    for x in n:
        total = total + x
    if m1 != [1, 1]:
        total = total * z3.If(pack, bv(m1[0]), bv(m1[1]))
    heads = z3.If(pack, bv(g.P.num_heads_k), bv(g.P.num_heads))
    # fast math (refmodel fastmath): blocks_per_sm is any value the <= 2-ulp division allows, IEEE's included
    bps = var("blocks_per_sm")
    bps_lo, bps_hi = sym_blocks_per_sm_range(total, heads, g.P.num_sm)
    s.add(bps >= bps_lo, bps <= bps_hi)
    splits = [z3.If(Sp == 1, bv(1), smax(smin(_ceil_small(x, bps), Sp), 1)) for x in n]
    s.add(Sc > 1, z3.Or([x > Sc for x in splits]))
    r = budget.check(s, f"stage2 b={b}")
    if r != z3.sat:
        return ("unsat" if r == z3.unsat else "unknown"), None
    m = s.model()
    if val(m, bps_lo) != val(m, bps_hi):
        # the witness sits where fast math decides: ask for one the division's rounding cannot change (a new
        # solver with the same assertions: a second check on this one runs z3's incremental core, which took
        # minutes where a fresh one takes seconds)
        first = s
        s = solver(budget.timeout_s, SEED)
        s.add(first.assertions())
        s.add(bps_lo == bps_hi)
        r = budget.check(s, f"stage2 b={b} fast-math-robust")
        if r != z3.sat:
            if r == z3.unsat:
                budget.unknowns.append(
                    f"stage2 b={b}: a violation exists only where FA3's fast-math division (<= 2 ulp) decides "
                    f"blocks_per_sm (e.g. lengths {[val(m, x) for x in L]}, blocks_per_sm {val(m, bps_lo)} or "
                    f"{val(m, bps_hi)}): inconclusive")
            return "unknown", None
        m = s.model()
    return "sat", {"b": b, "seq_lens": [val(m, x) for x in L], "call_seq_lens": [val(m, x) for x in local],
                   "call_seqlen_k": val(m, kc), "precompute_seqlen_k": val(m, p_static),
                   "num_splits": val(m, k) if g.fixed else None, "S_p": val(m, Sp), "S_c": val(m, Sc),
                   "splits": [val(m, x) for x in splits], "blocks_per_sm": val(m, bps), "eager": eager}


def find_witness(g: Group, budget: Budget, fresh: bool = False) -> tuple[str, Optional[dict]]:
    """Stage 1, then stage 2 for b = 1..B_MAX (eager widths first): ('proved'|'witness'|'unknown', witness)."""
    key = (g.key, g.page_size, fresh)
    if key not in budget.cache:
        budget.cache[key] = _find_witness_uncached(g, budget, fresh)
    return budget.cache[key]


def _find_witness_uncached(g: Group, budget: Budget, fresh: bool) -> tuple[str, Optional[dict]]:
    r1, _ = stage1_search(g, budget, fresh)
    if r1 == "unsat":
        return "proved", None
    saw_unknown = r1 == "unknown"
    # a realistic witness first (sequences within a 32k context, eager page-table width), then the whole domain
    for len_max, eager, bs in ((WITNESS_LEN, True, (1, 2, 4)), (LEN_MAX, True, range(1, B_MAX + 1)),
                               (LEN_MAX, False, range(1, B_MAX + 1))):
        if fresh and eager:
            continue
        for b in bs:
            r, w = _stage2(g, budget, b, eager, fresh, len_max)
            if r == "sat":
                return "witness", w
            saw_unknown |= r == "unknown" and len_max == LEN_MAX
    if r1 == "sat":
        # stage 1 found S_p > S_c or a QUERY_COVER gap; stage 2 covers only split bounds: re-check QUERY_COVER
        r1q, wq = _stage1_query_cover_only(g, budget, fresh)
        if r1q == "sat":
            return "witness", wq
        saw_unknown |= r1q == "unknown"
    return ("unknown" if saw_unknown else "proved"), None


def _stage1_query_cover_only(g: Group, budget: Budget, fresh: bool) -> tuple[str, Optional[dict]]:
    s = solver(budget.timeout_s, SEED)
    lmax = var("Lmax")
    s.add(lmax >= 1, lmax <= bv(LEN_MAX))
    lcall = _local_len(s, "Lmax_local", lmax, g.sharded_cp) if g.sharded_cp else lmax
    kc = _call_static(s, g, lcall, eager=not fresh, fresh=fresh, lmax_p=lmax)
    k = var("k")
    s.add(k >= 1, k <= 256)
    p_static = kc if fresh else _p_static(s, g, lmax)
    Sp = sym_split_count(g.P, ceil_div_const(p_static, g.P.block_n), fixed=k if g.fixed else None)
    Sc = sym_split_count(g.C, ceil_div_const(kc, g.C.block_n), fixed=k if g.fixed else None)
    m_p = sym_m_blocks(bv(1), g.P.qhpk, sym_pack(g.P, Sp), g.P.block_m)
    rows_c = z3.If(sym_pack(g.C, Sc, kernel=True), bv(g.C.qhpk), bv(1))
    s.add(m_p * bv(g.C.kernel_block_m) < rows_c)
    r = budget.check(s, "stage1 query-cover")
    if r != z3.sat:
        return ("unsat" if r == z3.unsat else "unknown"), None
    m = s.model()
    lm = val(m, lmax)
    return "sat", {"b": 1, "seq_lens": [lm], "call_seq_lens": [val(m, lcall)], "call_seqlen_k": val(m, kc),
                   "precompute_seqlen_k": val(m, p_static), "num_splits": val(m, k) if g.fixed else None,
                   "S_p": val(m, Sp), "S_c": val(m, Sc), "eager": not fresh}


# ------------------------------------------------------------------------------------------------------------
# Concrete replay of a decode witness (refmodel + spec.invariants)
# ------------------------------------------------------------------------------------------------------------


def concrete_decode(cfg: D.Config, metadata_heads: str, w: dict, heuristic_p: Heuristic):
    """Replay a decode witness through refmodel: (Evaluation, config with the witness's num_splits)."""
    if w.get("num_splits") is not None and cfg.backend_num_splits > 0 and not cfg.server.enable_deterministic_inference:
        cfg = D.Config(dataclasses.replace(cfg.server, num_splits=int(w["num_splits"])), cfg.model)
    b = w["b"]
    pin = cfg.precompute_inputs(metadata_heads, batch_size=b, max_seqlen_k=w["precompute_seqlen_k"])
    if pin.num_splits <= 0 and heuristic_p is not get_num_splits:
        pin = dataclasses.replace(pin, num_splits=int(heuristic_p(pin)))
    P = resolve_schedule(pin)
    R = prepare_scheduler(P, w["seq_lens"], seqlens_q=[1] * b)
    C = resolve_schedule(cfg.call_inputs(batch_size=b, seqlen_k=w["call_seqlen_k"]))
    ev = evaluate_metadata(P, R, C, {"seqused_k": w["call_seq_lens"], "seqlens_q": [1] * b})
    return ev, cfg, P, R, C


def evaluate_metadata(*args, **kwargs):
    """spec.invariants.evaluate, imported at the first replay (it loads torch, which proving alone does not need)."""
    from spec.invariants import evaluate

    return evaluate(*args, **kwargs)


# ------------------------------------------------------------------------------------------------------------
# Public entry point
# ------------------------------------------------------------------------------------------------------------

THEOREMS = ("kv-cover", "batch-over-992", "freshness", "benign-drift", "drift-breaks-h_k",
            "drift-breaks-seqlen_k", "drift-breaks-seqlen_q", "drift-breaks-pack", "drift-breaks-b",
            "prefill-cp-hazard", "guard-soundness", "root-cause-alternative", "sharded-kv-decode", "guard-robustness")
