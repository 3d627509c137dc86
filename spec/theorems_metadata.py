"""Theorems 1-4 of issue 3 (metadata consistency), as bounded z3 queries over the configuration domain.

Bounds (stated once): batch size b in 1..8 (and b > 992 separately: every split is 1), per-sequence lengths in
1..2^20 (the call's static seqlen_k up to 2^21), query rows per sequence up to 2^16 for multi-row calls, heads and
head dims of the real models in `spec.domain.MODELS` (theorem 1 adds FA3's asymmetric head-dim instances), SM
counts 78/108/114/132, split counts 1..256 (a positive num_splits is a symbolic value in 1..256).

Method. The discrete part of a configuration is enumerated concretely and grouped by what FA3 actually decides
from it (`spec.symbolic.SideParams` of both sides: tiles, pack-GQA, layout, split-heuristic table); lengths, b
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
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Optional

import z3

from refmodel.fa3_scheduler import (
    ScheduleInputs,
    call_inputs,
    ceil_div,
    get_num_splits,
    precompute_inputs,
    resolve_schedule,
)
from refmodel.metadata import call_own_metadata
from refmodel.prepare import prepare_scheduler
from refmodel.splitkv import split_block_range

from . import domain as D
from .cases import Case
from .invariants import evaluate
from .results import TheoremResult
from .symbolic import (
    BV,
    Heuristic,
    SideParams,
    bv,
    ceil_div_const,
    side_params,
    smax,
    smin,
    solver,
    sym_blocks_per_sm_range,
    sym_dynamic_split,
    sym_m_blocks,
    sym_pack,
    sym_split_block_range,
    sym_split_count,
)

__all__ = ["run_metadata_theorems", "THEOREMS", "B_MAX", "LEN_MAX", "Q_MAX", "FRESHNESS_HEAD_DIMS",
           "FRESHNESS_CORNER_SOURCE", "kv_cover_lemma"]

B_MAX = 8
LEN_MAX = 2 ** 20
WITNESS_LEN = 32768  # witnesses are searched within a 32k context first (replayable cheaply)
KC_MAX = 2 ** 21
Q_MAX = 2 ** 16
SEED = 0

#: FA3 head-dim instances theorem 1 ranges over: the real models' (d, d) plus FA3's asymmetric V dims
#: (flash_api.cpp mha_fwd allows dv != d for d <= 64 with dv <= 512, and d in (128, 192] with dv in (96, 128]).
FRESHNESS_HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128),
                       (64, 96), (64, 128), (64, 192), (64, 256), (64, 512))

#: Where FA3's precompute and its kernel disagree about query tiles (theorem 1's expected refutation).
FRESHNESS_CORNER_SOURCE = (
    "hopper/flash_api.cpp:563-564 (precompute: d_rounded = round_up_headdim(d), dv_rounded = round_up_headdimv(dv)); "
    "hopper/flash_api.cpp:653-658 (mha_fwd_get_scheduler_metadata: tile_size_fwd_sm90(d_rounded, dv_rounded, ...) "
    "and prepare_varlen_num_blocks(params, stream, params.pack_gqa, kBlockM, kBlockN)); "
    "hopper/flash_api.cpp:260-267 (run_mha_fwd_constexpr: d <= 64 and 64 < dv <= 256 runs the <64, 256> instance); "
    "hopper/tile_size.h:14-25 (d <= 64: dv == 256 -> kBlockM 128, otherwise kBlockM 192); "
    "hopper/flash_fwd_launch_template.h:163-164 (without metadata the call prepares with the kernel's kBlockM and "
    "forced PackGQA, so only the precompute path is affected); hopper/flash_api.cpp:373-377 (PackGQA forced for "
    "Split / paged non-TMA while an explicit pack_gqa=False reaches the precompute's prepare step)")


# ------------------------------------------------------------------------------------------------------------
# Small helpers
# ------------------------------------------------------------------------------------------------------------


@dataclass
class _Budget:
    timeout_s: float
    unknowns: list = field(default_factory=list)
    queries: int = 0
    #: group key -> (verdict, witness), shared by the theorems of one run (identical queries are asked once)
    cache: dict = field(default_factory=dict)

    def check(self, s: z3.Solver, label: str):
        self.queries += 1
        r = s.check()
        if r == z3.unknown:
            self.unknowns.append(f"{label}: {s.reason_unknown()}")
        return r


def _val(model: z3.ModelRef, term) -> int:
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
    n = z3.BitVec(name, BV)
    s.add(n >= 0, n <= bv(KC_MAX), (n - 1) * bv(c) < x, x <= n * bv(c))
    return n


def _matches(name: str, only) -> bool:
    if not only:
        return True
    for o in only:
        o = str(o)
        if name == o or name.split("-", 1)[0] == o or o in name:
            return True
    return False


def _is_known_guard(label: str) -> Optional[str]:
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


def _group_configs(configs: Iterable[D.Config], metadata_heads: str, heuristic_p: Heuristic,
                   heuristic_c: Heuristic) -> list[Group]:
    groups: dict[tuple, Group] = {}
    for cfg in configs:
        fixed = cfg.backend_num_splits > 0
        pin = cfg.precompute_inputs(metadata_heads)
        cin = cfg.call_inputs()
        if fixed:
            pin = dataclasses.replace(pin, num_splits=D.FIXED_SPLITS_REPRESENTATIVE)
            cin = dataclasses.replace(cin, num_splits=D.FIXED_SPLITS_REPRESENTATIVE)
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
    kc = z3.BitVec("kc", BV)
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
    x = z3.BitVec("p_static", BV)
    s.add(x >= lmax, x <= bv(KC_MAX))
    return x


def _local_len(s: z3.Solver, name: str, L, cp: int):
    """A rank-local length of a sequence sharded over cp ranks: floor(L/cp) or ceil(L/cp) (balanced sharding)."""
    x = z3.BitVec(name, BV)
    s.add(z3.UGE(x, z3.UDiv(L, bv(cp))), z3.ULE(x, ceil_div_const(L, cp)))
    return x


def _stage1(family, budget: _Budget, fresh: bool = False) -> tuple[str, Optional[dict]]:
    """Can S_p > S_c > 1, or a QUERY_COVER violation, happen? ('unsat'|'sat'|'unknown', model).

    `family` is a Group or a list of Groups that differ only in SM count and split tables (a symbolic index picks
    one): one query then covers all of them.
    """
    groups = family if isinstance(family, list) else [family]
    g = groups[0]
    s = solver(budget.timeout_s, SEED)
    lmax = z3.BitVec("Lmax", BV)
    s.add(lmax >= 1, lmax <= bv(LEN_MAX))
    lcall = _local_len(s, "Lmax_local", lmax, g.sharded_cp) if g.sharded_cp else lmax
    kc = _call_static(s, g, lcall, eager=False, fresh=fresh, lmax_p=lmax)
    p_static = kc if fresh else _p_static(s, g, lmax)
    k = z3.BitVec("k", BV)
    s.add(k >= 1, k <= 256)
    idx = z3.BitVec("family_index", BV)
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
        return "sat", {"index": _val(m, idx), "Lmax": _val(m, lmax), "kc": _val(m, kc), "S_p": _val(m, Sp),
                       "S_c": _val(m, Sc), "query_cover": bool(_val(m, m_p * bv(g.C.kernel_block_m) < rows_c))}
    return ("unsat" if r == z3.unsat else "unknown"), None


def _families(groups: list) -> list:
    """Groups that differ only in SM count and split tables, batched for one stage-1 query each."""
    fam: dict = {}
    for g in groups:
        strip = lambda sp: dataclasses.replace(sp, num_sm=0, table=(), tail=0).key  # noqa: E731
        fam.setdefault((strip(g.P), strip(g.C), g.sharded_cp, g.fixed, g.p_static_free), []).append(g)
    return list(fam.values())


def _prove_groups(groups: list, budget: _Budget, fresh: bool = False):
    """Yield (group, verdict, witness) for groups not proved by their family's stage-1 query, in order."""
    for fam in _families(groups):
        fkey = ("family", tuple(g.key for g in fam), fresh)
        if fkey not in budget.cache:
            budget.cache[fkey] = _stage1(fam, budget, fresh)[0]
        if budget.cache[fkey] == "unsat":
            continue
        for g in fam:
            verdict, w = _find_witness(g, budget, fresh)
            yield g, verdict, w


def _stage2(g: Group, budget: _Budget, b: int, eager: bool, fresh: bool = False,
            len_max: int = LEN_MAX) -> tuple[str, Optional[dict]]:
    """Full prepare step for exactly b sequences of at most len_max tokens: more splits than S_c (S_c > 1)?"""
    s = solver(budget.timeout_s, SEED)
    L = [z3.BitVec(f"L{i}", BV) for i in range(b)]
    for x in L:
        s.add(x >= 1, x <= bv(len_max))
    n = [_ceil_var(s, f"n{i}", L[i], g.P.block_n) for i in range(b)]
    lmax = _max(L)
    local = [_local_len(s, f"local{i}", L[i], g.sharded_cp) for i in range(b)] if g.sharded_cp else list(L)
    kc = _call_static(s, g, _max(local), eager=eager, fresh=fresh, lmax_p=lmax)
    p_static = kc if fresh else _p_static(s, g, lmax)
    k = z3.BitVec("k", BV)
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
    bps = z3.BitVec("blocks_per_sm", BV)
    bps_lo, bps_hi = sym_blocks_per_sm_range(total, heads, g.P.num_sm)
    s.add(bps >= bps_lo, bps <= bps_hi)
    splits = [z3.If(Sp == 1, bv(1), smax(smin(_ceil_small(x, bps), Sp), 1)) for x in n]
    s.add(Sc > 1, z3.Or([x > Sc for x in splits]))
    r = budget.check(s, f"stage2 b={b}")
    if r != z3.sat:
        return ("unsat" if r == z3.unsat else "unknown"), None
    m = s.model()
    if _val(m, bps_lo) != _val(m, bps_hi):
        # the witness sits where fast math decides: ask for one the division's rounding cannot change
        s.add(bps_lo == bps_hi)
        r = budget.check(s, f"stage2 b={b} fast-math-robust")
        if r != z3.sat:
            if r == z3.unsat:
                budget.unknowns.append(
                    f"stage2 b={b}: a violation exists only where FA3's fast-math division (<= 2 ulp) decides "
                    f"blocks_per_sm (e.g. lengths {[_val(m, x) for x in L]}, blocks_per_sm {_val(m, bps_lo)} or "
                    f"{_val(m, bps_hi)}): inconclusive")
            return "unknown", None
        m = s.model()
    return "sat", {"b": b, "seq_lens": [_val(m, x) for x in L], "call_seq_lens": [_val(m, x) for x in local],
                   "call_seqlen_k": _val(m, kc), "precompute_seqlen_k": _val(m, p_static),
                   "num_splits": _val(m, k) if g.fixed else None, "S_p": _val(m, Sp), "S_c": _val(m, Sc),
                   "splits": [_val(m, x) for x in splits], "blocks_per_sm": _val(m, bps), "eager": eager}


def _find_witness(g: Group, budget: _Budget, fresh: bool = False) -> tuple[str, Optional[dict]]:
    """Stage 1, then stage 2 for b = 1..B_MAX (eager widths first): ('proved'|'witness'|'unknown', witness)."""
    key = (g.key, g.page_size, fresh)
    if key not in budget.cache:
        budget.cache[key] = _find_witness_uncached(g, budget, fresh)
    return budget.cache[key]


def _find_witness_uncached(g: Group, budget: _Budget, fresh: bool) -> tuple[str, Optional[dict]]:
    r1, _ = _stage1(g, budget, fresh)
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


def _stage1_query_cover_only(g: Group, budget: _Budget, fresh: bool) -> tuple[str, Optional[dict]]:
    s = solver(budget.timeout_s, SEED)
    lmax = z3.BitVec("Lmax", BV)
    s.add(lmax >= 1, lmax <= bv(LEN_MAX))
    lcall = _local_len(s, "Lmax_local", lmax, g.sharded_cp) if g.sharded_cp else lmax
    kc = _call_static(s, g, lcall, eager=not fresh, fresh=fresh, lmax_p=lmax)
    k = z3.BitVec("k", BV)
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
    lm = _val(m, lmax)
    return "sat", {"b": 1, "seq_lens": [lm], "call_seq_lens": [_val(m, lcall)], "call_seqlen_k": _val(m, kc),
                   "precompute_seqlen_k": _val(m, p_static), "num_splits": _val(m, k) if g.fixed else None,
                   "S_p": _val(m, Sp), "S_c": _val(m, Sc), "eager": not fresh}


# ------------------------------------------------------------------------------------------------------------
# Concrete replay of a decode witness (refmodel + spec.invariants)
# ------------------------------------------------------------------------------------------------------------


def _concrete_decode(cfg: D.Config, metadata_heads: str, w: dict, heuristic_p: Heuristic):
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
    ev = evaluate(P, R, C, {"seqused_k": w["call_seq_lens"], "seqlens_q": [1] * b})
    return ev, cfg, P, R, C


def _write_case(cases_dir, theorem: str, cfg: D.Config, guard_label: str, metadata_heads: str, w: dict,
                ev, notes: str) -> Optional[str]:
    if cases_dir is None:
        return None
    server = cfg.server
    longest = max(int(x) for x in w["seq_lens"])
    if longest > server.context_length:
        server = dataclasses.replace(server, context_length=1 << (longest - 1).bit_length())
    if not w.get("eager", True):
        server = dataclasses.replace(server, cuda_graph=True, context_length=int(w["call_seqlen_k"]))
    if not _GUARD_SPEC_RE(guard_label):
        # an unnamed callable: "none" replays the same precompute (this config precomputes under the guard too)
        notes += f" [guard {guard_label!r} is not a loadable spec; the case uses guard 'none', which also precomputes]"
        guard_label = "none"
    policy = {"guard": guard_label, "metadata_heads": metadata_heads, "clear_stale_cp_metadata": True}
    if cfg.sharded_kv:
        policy["cp_decode_kv"] = "sharded"
    first = ev.violations[0]
    case = Case.from_parts(
        source=f"prove:{theorem}", server=server.to_dict(), model=cfg.model.to_dict(), policy=policy,
        batches=[{"mode": "decode", "seq_lens": [int(x) for x in w["seq_lens"]], "extend_lens": None}],
        kernel={"name": "emulated", "mode": "strict"}, seed=0,
        expected={"outcome": "violation", "invariant": first.invariant,
                  "detail": {"S_p": w.get("S_p"), "S_c": w.get("S_c"), "splits": w.get("splits"),
                             "call_seqlen_k": w.get("call_seqlen_k"), "message": first.message}},
        notes=notes)
    return str(case.save(cases_dir))


def _trigger_summary(groups: list, budget: _Budget, metadata_heads: str, seconds: float = 3.0) -> dict:
    """Which configurations can reach S_p > S_c (stage 1 sat), as flag patterns with counts (time-capped)."""
    deadline = time.perf_counter() + seconds
    patterns: dict = {}
    examples: list = []
    complete = True
    for fam in _families(groups):
        if time.perf_counter() > deadline:
            complete = False
            break
        fkey = ("family", tuple(g.key for g in fam), False)
        if fkey not in budget.cache:
            budget.cache[fkey] = _stage1(fam, budget)[0]
        if budget.cache[fkey] == "unsat":
            continue
        for g in fam:
            for cfg in g.configs:
                sv = cfg.server
                pat = (f"dp_attention={sv.enable_dp_attention}, prefill_cp={sv.enable_prefill_cp}, "
                       f"attn_cp>1={sv.attn_cp_size > 1}, sharded_kv={cfg.sharded_kv}, "
                       f"kv_heads_differ={cfg.precompute_heads(metadata_heads)[1] != cfg.call_heads[1]}")
                patterns[pat] = patterns.get(pat, 0) + 1
                if len(examples) < 5 and cfg.label() not in examples:
                    examples.append(cfg.label())
    return {"candidate_patterns": patterns, "examples": examples, "complete": complete,
            "note": "configurations whose split counts can satisfy S_p > S_c > 1 (stage 1); a per-batch "
                    "witness was replayed for the first of them"}


def _GUARD_SPEC_RE(label: str) -> bool:
    import re
    return bool(re.match(r"^(fixed|pre-fix|none|[A-Za-z_][\w.]*:[A-Za-z_]\w*|.+\.py:[A-Za-z_]\w*)$", label))


# ------------------------------------------------------------------------------------------------------------
# Policy-level theorems (3, 4) share one loop
# ------------------------------------------------------------------------------------------------------------


def _policy_search(name: str, configs: list, guard, guard_label: str, metadata_heads: str, dropped: frozenset,
                   budget: _Budget, heuristic_p: Heuristic, heuristic_c: Heuristic, cases_dir, expect_hazard: bool,
                   what: str, invariant_filter: Optional[str] = None) -> TheoremResult:
    """Every precomputing config of `configs` is SAFE for every decode batch, or a validated witness."""
    start = time.perf_counter()
    try:
        pre = [c for c in configs if D.precomputes(c, guard, dropped)]
    except Exception as exc:  # noqa: BLE001 - a raising guard is itself the finding
        return TheoremResult(name, "refuted", time.perf_counter() - start, {"guard_error": repr(exc)}, None,
                             f"the guard raised while deciding the precompute: {exc!r}", failed=True,
                             expected=False)
    groups = _group_configs(pre, metadata_heads, heuristic_p, heuristic_c)
    shape_errors = [g for g in groups if g.P.num_vectors != g.C.num_vectors
                    or g.P.has_semaphore != g.C.has_semaphore]  # FA3 raises on every call: loud, safe
    live = [g for g in groups if g not in shape_errors]
    # likely hazards first (fewer KV heads or sharded KV at the precompute), so a witness comes early
    live.sort(key=lambda g: (g.P.num_heads_k >= g.C.num_heads_k and not g.sharded_cp and not g.p_static_free))
    shape_errors = len(shape_errors)
    for g, verdict, w in _prove_groups(live, budget):
        if verdict != "witness":
            continue
        for cfg in g.configs:  # replay on the first config of the group whose concrete run confirms it
            ev, cfg_w, *_ = _concrete_decode(cfg, metadata_heads, w, heuristic_p)
            if ev.outcome == "violation" and (invariant_filter is None or
                                              any(v.invariant == invariant_filter for v in ev.violations)):
                invs = sorted({v.invariant for v in ev.violations})
                witness = {"config": cfg_w.label(),
                           "invariant": invs[0] if invariant_filter is None else invariant_filter,
                           "b": w["b"], "seq_lens": w["seq_lens"], "S_p": w["S_p"], "S_c": w["S_c"],
                           "splits": w.get("splits"), "precompute_heads": list(cfg_w.precompute_heads(metadata_heads)),
                           "call_heads": list(cfg_w.call_heads), "invariants": invs,
                           "server": cfg_w.server.to_dict(include_fork_fields=True), "model": cfg_w.model.name,
                           **{k: v for k, v in w.items() if k not in ("b", "seq_lens", "S_p", "S_c", "splits")}}
                path = _write_case(cases_dir, name, cfg_w, guard_label, metadata_heads, w, ev,
                                   f"{what}: z3 witness of theorem {name}, replayed concretely through refmodel "
                                   f"(S_p={w['S_p']}, S_c={w['S_c']}, splits={w.get('splits')})")
                ph, ch = cfg_w.precompute_heads(metadata_heads), cfg_w.call_heads
                cause = (f"precomputes with heads {ph} but calls with {ch}" if ph != ch else
                         f"precomputes from global lengths {w['seq_lens']} (max_seqlen_k {w['precompute_seqlen_k']}) "
                         f"but calls over local lengths {w['call_seq_lens']} (page-table width {w['call_seqlen_k']})")
                triggers = _trigger_summary(live, budget, metadata_heads)
                return TheoremResult(
                    name, "refuted", time.perf_counter() - start, witness, path,
                    f"{what}: {cfg_w.label()} {cause}; b={w['b']} seq_lens={w['seq_lens']} gives splits "
                    f"{w.get('splits')} > S_c={w['S_c']} (S_p={w['S_p']}; {', '.join(invs)})",
                    failed=True, expected=expect_hazard,
                    details={"groups": len(groups), "precomputing_configs": len(pre), "queries": budget.queries,
                             "triggering": triggers})
        return TheoremResult(name, "inconclusive", time.perf_counter() - start, {"symbolic_witness": w}, None,
                             "z3 witness did not replay concretely (encoding/refmodel disagreement): a bug to report",
                             failed=False, expected=False)
    secs = time.perf_counter() - start
    details = {"configs": len(configs), "precomputing_configs": len(pre), "groups": len(groups),
               "shape_error_groups": shape_errors, "queries": budget.queries, "unknown": list(budget.unknowns)}
    if budget.unknowns:
        return TheoremResult(name, "inconclusive", secs, {}, None,
                             f"{what}: z3 returned unknown on {len(budget.unknowns)} queries", failed=False,
                             expected=False, details=details)
    msg = (f"{what}: no witness over {len(configs)} configurations ({len(pre)} precompute, {len(groups)} groups, "
           f"{budget.queries} queries)")
    if not pre:
        msg = f"{what}: vacuous -- the guard disables the precompute for all {len(configs)} configurations"
    return TheoremResult(name, "proved", secs, {}, None, msg, failed=False, expected=not expect_hazard,
                         details=details)


# ------------------------------------------------------------------------------------------------------------
# Lemmas
# ------------------------------------------------------------------------------------------------------------


def kv_cover_lemma(timeout_s: float = 10.0, sym_range=sym_split_block_range,
                   concrete_range=split_block_range, name: str = "0-kv-cover") -> TheoremResult:
    """KV_COVER by design: for 0 <= n_min <= n_max <= 2^23 and S in 1..256, the S split ranges cover [n_min, n_max) (block.h).

    Three quantifier-free obligations, each an unsat query (the union of intervals [lo(s), hi(s)) for s < S is
    [n_min, n_max) by induction on s): (a) lo(0) = n_min; (b) contiguity hi(s) = min(lo(s+1), n_max) for every
    s < S; (c) the last split reaches the end, hi(S-1) = n_max. Encoded over z3 Ints (nonlinear S*P stays an atom;
    the bit-vector encoding of S*ceil(R/S) >= R times out), valid because every value is a non-negative C int below
    2^31 (n_max <= 2^31/256). A witness is replayed with `concrete_range` over every split.
    """
    start = time.perf_counter()
    c = z3.IntVal
    n_min, n_max, S, sv = z3.Ints("n_min n_max S s")
    base = [n_min >= 0, n_min <= n_max, n_max <= 2 ** 31 // 256, S >= 1, S <= 256]
    lo0, _ = sym_range(n_min, n_max, S, c(0))
    lo_s, hi_s = sym_range(n_min, n_max, S, sv)
    lo_s1, _ = sym_range(n_min, n_max, S, sv + 1)
    _, hi_last = sym_range(n_min, n_max, S, S - 1)
    obligations = [
        ("lo(0) = n_min", [n_max > n_min, lo0 != n_min]),  # noqa: E501
        ("hi(s) = min(lo(s+1), n_max)", [sv >= 0, sv < S - 1,
                                          hi_s != z3.If(lo_s1 < n_max, lo_s1, n_max), lo_s < n_max]),
        ("hi(S-1) = n_max", [n_max > n_min, hi_last < n_max]),
    ]
    for label, neg in obligations:
        s = solver(timeout_s, SEED)
        s.add(*base, *neg)
        r = s.check()
        if r == z3.unknown:
            return TheoremResult(name, "inconclusive", time.perf_counter() - start, {"obligation": label}, None,
                                 f"z3 {s.reason_unknown()} on obligation {label}", expected=False)
        if r == z3.sat:
            m = s.model()
            w = {k: m.eval(v, model_completion=True).as_long() for k, v in
                 (("n_min", n_min), ("n_max", n_max), ("num_splits", S))}
            if w["n_max"] - w["n_min"] > 2 ** 16:  # replay on a small instance of the same failure if possible
                s.add(n_max - n_min <= 2 ** 12)
                if s.check() == z3.sat:
                    m = s.model()
                    w = {k: m.eval(v, model_completion=True).as_long() for k, v in
                         (("n_min", n_min), ("n_max", n_max), ("num_splits", S))}
            covered = set()
            for i in range(w["num_splits"]):
                lo_, hi_ = concrete_range(w["n_min"], w["n_max"], w["num_splits"], i)
                covered.update(range(lo_, hi_))
            missing = sorted(set(range(w["n_min"], w["n_max"])) - covered)
            secs = time.perf_counter() - start
            if not missing:
                return TheoremResult(name, "inconclusive", secs, {**w, "obligation": label}, None,
                                     f"obligation {label} fails but the ranges still cover concretely", expected=False)
            return TheoremResult(name, "refuted", secs, {**w, "uncovered_block": missing[0], "obligation": label,
                                                         "invariant": "KV_COVER"}, None,
                                 f"{label} fails: KV block {missing[0]} of [{w['n_min']}, {w['n_max']}) is in none of "
                                 f"the {w['num_splits']} split ranges", failed=True, expected=False)
    return TheoremResult(name, "proved", time.perf_counter() - start, {}, None,
                         "the split ranges start at n_min, are contiguous and end at n_max, for every n_max <= 2^23 "
                         "KV blocks and 1..256 splits (hopper/block.h); they use the call's own lengths, so stale "
                         "cache_seqlens never leave keys uncovered")


def _prepare_split_lemma(timeout_s: float) -> TheoremResult:
    """The prepare step's split count is in [1, S_static] (and 1 when b > 992), for every n, blocks_per_sm, S."""
    start = time.perf_counter()
    s = solver(timeout_s, SEED)
    n, bps, S = (z3.BitVec(x, BV) for x in ("n", "bps", "S"))
    big_b = z3.Bool("b_over_992")
    s.add(n >= 0, n <= 2 ** 16, bps >= 0, bps <= 2 ** 24, S >= 1, S <= 256)
    split = z3.If(z3.Or(big_b, S == 1), bv(1), sym_dynamic_split(n, bps, S))
    s.add(z3.Or(split < 1, split > S, z3.And(big_b, split != 1)))
    r = s.check()
    secs = time.perf_counter() - start
    verdict = "proved" if r == z3.unsat else "refuted" if r == z3.sat else "inconclusive"
    return TheoremResult("0-batch-over-992", verdict, secs, {}, None,
                         "prepare-split-bound: 1 <= split <= S_static for every n, blocks_per_sm and S; and b > 992 "
                         "(more than one prepare CTA) gives split 1 everywhere (flash_prepare_scheduler.cu): so for "
                         "b > 992 SPLIT_BOUND and COMBINE_CAPACITY hold for any S_c >= 1, and QUERY_COVER is "
                         "per-batch, so the b <= 8 results carry over", failed=verdict == "refuted",
                         expected=verdict == "proved")


# ------------------------------------------------------------------------------------------------------------
# Theorem 1: freshness
# ------------------------------------------------------------------------------------------------------------


def _fresh_decode_groups(heuristic_p: Heuristic, heuristic_c: Heuristic) -> list[Group]:
    """Theorem 1a: P == C, sglang's decode shapes, every per-rank head split of the real models, every SM count."""
    configs = []
    for model in D.MODELS.values():
        for tp in (1, 2, 4, 8):
            if model.num_heads % tp:
                continue
            for det, ns in ((False, 0), (False, D.FIXED_SPLITS_REPRESENTATIVE)):
                for sm in D.NUM_SMS:
                    configs.append(D.Config(D.Server(tp_size=tp, num_splits=ns, enable_deterministic_inference=det,
                                                     num_sm=sm), dataclasses.replace(model, is_mla=False)))
    return _group_configs(configs, "tp", heuristic_p, heuristic_c)


def _multirow_groups() -> list[tuple]:
    """Theorem 1b: P == C multi-row varlen calls over the FA3 head-dim grid; (P_inputs, SideParams, q_lo, q_hi, tags)."""
    qhpks = sorted({(m.num_heads // t) // max(1, m.num_kv_heads // t)
                    for m in D.MODELS.values() for t in (1, 2, 4, 8) if m.num_heads % t == 0})
    out: dict[tuple, tuple] = {}
    for qhpk in qhpks:
        for d, dv in FRESHNESS_HEAD_DIMS:
            for page in (None, 1, 128):
                for causal in (True, False):
                    for pack_arg in (None, False):
                        for lo, hi in _q_classes(qhpk, d, dv, page, causal, pack_arg):
                            inp = precompute_inputs(1, lo, 0, qhpk, 1, d, headdim_v=dv, varlen_q=True, page_size=page,
                                                    causal=causal, pack_gqa=pack_arg, num_splits=2)
                            sp = _qc_params(inp)
                            # the query only reads sp and Lq <= hi: keep the widest range per sp (a superset)
                            if sp not in out or out[sp][3] < hi:
                                out[sp] = (inp, sp, lo, hi)
    return list(out.values())


@lru_cache(maxsize=None)
def _qc_params(inp: ScheduleInputs) -> tuple:
    """(qhpk, block_m, kernel_block_m, pack S==1, pack S>1, kernel pack S==1, kernel pack S>1) from refmodel.

    Tiles and pack do not read the precompute flag (`resolve_schedule`), so one side's schedule serves both.
    """
    s1 = resolve_schedule(dataclasses.replace(inp, num_splits=1))
    s2 = resolve_schedule(dataclasses.replace(inp, num_splits=2))
    return (s1.qhead_per_khead, s1.block_m, s1.kernel_block_m, s1.pack_gqa, s2.pack_gqa, s1.kernel_pack_gqa,
            s2.kernel_pack_gqa)


def _q_classes(qhpk, d, dv, page, causal, pack_arg) -> list[tuple[int, int]]:
    """Intervals of max_seqlen_q on which every FA3 decision is constant (checked at both ends with refmodel)."""
    points = {1, 2, Q_MAX}
    if page is not None and page % 64 == 0:
        # paged KV may use TMA when seqlen_q * qhpk > kBlockM (flash_api.cpp get_pagedkv_tma): split there too
        for bm in (64, 128, 192):
            points |= {max(1, bm // qhpk), bm // qhpk + 1}
    pts = sorted(p for p in points if 1 <= p <= Q_MAX)
    classes = []
    for a, b in zip(pts, pts[1:] + [Q_MAX + 1]):
        lo, hi = a, b - 1
        if lo > hi:
            continue
        ends = {_qc_params(precompute_inputs(1, q, 0, qhpk, 1, d, headdim_v=dv, varlen_q=True, page_size=page,
                                             causal=causal, pack_gqa=pack_arg, num_splits=2)) for q in (lo, hi)}
        if len(ends) != 1:
            raise NotImplementedError(f"FA3 decisions vary inside max_seqlen_q in [{lo}, {hi}] "
                                      f"(qhpk={qhpk}, d={d}, dv={dv})")
        if classes and classes[-1][2] == next(iter(ends)):
            classes[-1] = (classes[-1][0], hi, classes[-1][2])
        else:
            classes.append((lo, hi, next(iter(ends))))
    return [(lo, hi) for lo, hi, _ in classes]


def _multirow_query(sp: tuple, q_hi: int, budget: _Budget) -> tuple[str, Optional[dict]]:
    """P == C, one batch of Lq <= q_hi rows, S abstract in 1..256 (same on both sides): QUERY_COVER gap?

    m-blocks = ceil(rows_p / kBlockM_host) is encoded as (m-1)*kBM < rows_p <= m*kBM (refmodel `m_blocks_for`).
    Small witnesses are searched first (Lq <= 1024), then the whole range.
    """
    qhpk, bm, kbm, p1, p2, kp1, kp2 = sp
    for bound in sorted({min(q_hi, 256), q_hi}):
        s = solver(budget.timeout_s, SEED)
        lq, S, m_p = z3.BitVec("Lq", BV), z3.BitVec("S", BV), z3.BitVec("m", BV)
        s.add(lq >= 1, lq <= bound, S >= 1, S <= 256)
        pack = z3.If(S > 1, z3.BoolVal(p2), z3.BoolVal(p1))
        kpack = z3.If(S > 1, z3.BoolVal(kp2), z3.BoolVal(kp1))
        rows_p = z3.If(pack, lq * bv(qhpk), lq)
        s.add(m_p >= 0, m_p <= 2 ** 23, (m_p - 1) * bv(bm) < rows_p, rows_p <= m_p * bv(bm))
        rows = z3.If(kpack, lq * bv(qhpk), lq)
        s.add(m_p * bv(kbm) < rows)
        r = budget.check(s, "freshness multi-row")
        if r == z3.sat:
            m = s.model()
            return "sat", {"seqlen_q": _val(m, lq), "num_splits": _val(m, S), "m_blocks": _val(m, m_p),
                           "rows": _val(m, rows)}
        if r == z3.unknown:
            return "unknown", None
    return "unsat", None


def _corner_kind(inp: ScheduleInputs, sp: tuple) -> Optional[str]:
    qhpk, bm, kbm, p1, p2, kp1, kp2 = sp
    if bm != kbm:
        return "host-kernel-tile"
    if inp.pack_gqa is False and (kp1 != p1 or kp2 != p2):
        return "explicit-pack_gqa-false"
    return None


def _freshness(timeout_s: float, heuristic_p: Heuristic, heuristic_c: Heuristic,
               shared: Optional[dict] = None) -> TheoremResult:
    name = "1-freshness"
    start = time.perf_counter()
    budget = _Budget(timeout_s, cache=shared if shared is not None else {})
    # 1a: decode, real tables
    decode_groups = _fresh_decode_groups(heuristic_p, heuristic_c)
    for g, verdict, w in _prove_groups(decode_groups, budget, fresh=True):
        if verdict == "witness":
            cfg = g.example
            ev, cfg_w, *_ = _concrete_decode(cfg, "tp", w, heuristic_p)
            witness = {"config": cfg_w.label(), "invariants": sorted({v.invariant for v in ev.violations}),
                       "invariant": (ev.violations[0].invariant if ev.violations else None), **w}
            return TheoremResult(name, "refuted" if ev.outcome == "violation" else "inconclusive",
                                 time.perf_counter() - start, witness, None,
                                 f"fresh decode metadata violates SAFE for {cfg_w.label()}: splits {w.get('splits')} "
                                 f"> S_c={w['S_c']} (precompute and call heuristics differ)",
                                 failed=ev.outcome == "violation", expected=False)
    # 1b: multi-row varlen calls over the FA3 head-dim grid, S abstract
    corners: dict[str, dict] = {}
    unexpected = None
    checked = 0
    for inp, sp, lo, hi in _multirow_groups():
        checked += 1
        r, w = _multirow_query(sp, hi, budget)
        if r != "sat":
            continue
        kind = _corner_kind(inp, sp)
        ev = _concrete_multirow(inp, w)
        own = _concrete_multirow(inp, w, own=True)
        wit = {"kind": kind, "headdim": inp.headdim, "headdim_v": inp.headdim_v, "qhead_per_khead": sp[0],
               "page_size": inp.page_size, "causal": inp.causal, "pack_gqa": inp.pack_gqa,
               "precompute_block_m": sp[1], "kernel_block_m": sp[2], **w,
               "replayed": ev.outcome, "call_own_metadata": own.outcome, "invariant": "QUERY_COVER"}
        # the corner is the precompute's: what the call computes for itself (refmodel call_own_metadata) is SAFE
        if kind is None or ev.outcome != "violation" or own.outcome != "pass":
            unexpected = wit
            break
        corners.setdefault(kind, wit)
    secs = time.perf_counter() - start
    details = {"decode_groups": len(decode_groups), "multirow_groups": checked,
               "queries": budget.queries, "unknown": list(budget.unknowns), "expected_corners": corners,
               "fa3_source": FRESHNESS_CORNER_SOURCE}
    if unexpected is not None:
        return TheoremResult(name, "refuted", secs, unexpected, None,
                             "fresh metadata violates QUERY_COVER outside the documented corners: a new FA3 finding",
                             failed=True, expected=False, details=details)
    if budget.unknowns:
        return TheoremResult(name, "inconclusive", secs, {}, None, f"z3 unknown: {budget.unknowns[:3]}",
                             expected=False, details=details)
    if corners:
        first = corners.get("host-kernel-tile") or next(iter(corners.values()))
        return TheoremResult(
            name, "expected-refutation", secs, first, None,
            "P == C is SAFE for sglang decode (every real model, SM count, split policy) and for multi-row varlen "
            "calls except FA3's own corners: " + "; ".join(
                f"{k}: d={v['headdim']}, dv={v['headdim_v']}, qhpk={v['qhead_per_khead']}, Lq={v['seqlen_q']}, "
                f"S={v['num_splits']}: {v['m_blocks']} m-blocks of {v['kernel_block_m']} < {v['rows']} rows"
                for k, v in corners.items()) + ". Proved on every other group. Source: " + FRESHNESS_CORNER_SOURCE,
            failed=False, expected=True, details=details)
    return TheoremResult(name, "proved", secs, {}, None, "P == C implies SAFE on the whole domain",
                         details=details)


def _concrete_multirow(inp: ScheduleInputs, w: dict, own: bool = False):
    """Replay a multi-row freshness witness: one batch with Lq rows and 1 KV token, num_splits = S fixed.

    `own`: compare the call with the metadata it computes for itself (refmodel `call_own_metadata`,
    flash_fwd_launch_template.h 163-165) instead of a precompute from the same inputs.
    """
    lq = int(w["seqlen_q"])
    pin = dataclasses.replace(inp, batch_size=1, seqlen_q=max(lq, inp.seqlen_q), seqlen_k=lq + 1,
                              num_splits=int(w["num_splits"]))
    C = resolve_schedule(dataclasses.replace(pin, precompute=False, uses_prepare=True))
    if own:
        P, R = call_own_metadata(C, [lq + 1], seqlens_q=[lq])
    else:
        P = resolve_schedule(pin)
        R = prepare_scheduler(P, [lq + 1], seqlens_q=[lq])
    return evaluate(P, R, C, {"seqused_k": [lq + 1], "seqlens_q": [lq]})


# ------------------------------------------------------------------------------------------------------------
# Theorem 2: benign drift, and the single changes that break SAFE
# ------------------------------------------------------------------------------------------------------------

_DRIFT_BASE = dict(h=32, hk=4, d=128, sm=132, page=1)   # qwen3-30b-a3b at attn_tp 1 (FACTS worked example)


def _decode_inputs(pre: bool, h: int, hk: int, seqlen_q: int = 1, pack_gqa=None, d=128, sm=132, page=1):
    kw = dict(varlen_q=True, page_size=page, causal=True, num_sm=sm, pack_gqa=pack_gqa)
    if pre:
        return precompute_inputs(1, seqlen_q, 0, h, hk, d, **kw)
    return call_inputs(1, seqlen_q, 0, h, hk, d, has_cache_seqlens=True, **kw)


def _benign_drift(timeout_s: float, heuristic_p: Heuristic, heuristic_c: Heuristic,
                  shared: Optional[dict] = None) -> list[TheoremResult]:
    out = []
    start = time.perf_counter()
    budget = _Budget(timeout_s, cache=shared if shared is not None else {})
    # the proof: same static inputs on both sides, per-batch cache_seqlens free on the call side
    bad = None
    groups = _fresh_decode_groups(heuristic_p, heuristic_c)
    for g, verdict, w2 in _prove_groups(groups, budget, fresh=True):
        if verdict == "witness":
            bad = (g, w2)
            break
    secs = time.perf_counter() - start
    if bad is not None:
        g, w = bad
        out.append(TheoremResult("2-benign-drift", "refuted", secs, {"config": g.example.label(), **w,
                                                                      "invariant": "SPLIT_BOUND"}, None,
                                 "changing only cache_seqlens breaks SAFE (the precompute's split count exceeds the "
                                 "call's for equal static shapes: the two heuristics differ)", failed=True,
                                 expected=False))
    elif budget.unknowns:
        out.append(TheoremResult("2-benign-drift", "inconclusive", secs, {}, None, str(budget.unknowns[:3]),
                                 expected=False))
    else:
        out.append(TheoremResult(
            "2-benign-drift", "proved", secs, {}, None,
            f"same b and static shapes, any cache_seqlens on either side: S_p == S_c on all {len(groups)} decode "
            "groups, per-batch splits <= S_p (prepare-split-bound), m-blocks unchanged, KV ranges from the call's "
            "own lengths (kv-cover), batch order a permutation of the same b"))
    out += _drift_breaks(timeout_s)
    return out


def _drift_breaks(timeout_s: float) -> list[TheoremResult]:
    """One witness per single change that breaks SAFE (FACTS section 2 mismatch classes), replayed concretely."""
    res = []
    base = _DRIFT_BASE

    # h_k: fewer KV heads at the precompute (the PR #30439 path)
    res.append(_drift_decode("2-drift-breaks-h_k", "h_k", timeout_s,
                             [(_decode_inputs(True, base["h"], hk_p), _decode_inputs(False, base["h"], base["hk"]))
                              for hk_p in (1, 2)], p_static_free=False))
    # seqlen_k: the precompute's static max_seqlen_k larger than the call's page-table width, same lengths
    res.append(_drift_decode("2-drift-breaks-seqlen_k", "seqlen_k", timeout_s,
                             [(_decode_inputs(True, h, hk), _decode_inputs(False, h, hk))
                              for h, hk in ((base["h"], base["hk"]), (8, 1), (32, 8))], p_static_free=True))
    # seqlen_q: metadata for one row per sequence, call with more (e.g. speculative verify)
    res.append(_drift_rows("2-drift-breaks-seqlen_q", timeout_s, pack_p=None))
    # pack: precompute with pack_gqa=False, call with FA3's own (forced for Split) PackGQA
    res.append(_drift_rows("2-drift-breaks-pack", timeout_s, pack_p=False))
    # b: the call has more sequences than the metadata (same b4): it reads unwritten slots
    res.append(_drift_batch("2-drift-breaks-b", timeout_s))
    return res


def _drift_decode(name, what, timeout_s, pairs, p_static_free: bool) -> TheoremResult:
    start = time.perf_counter()
    budget = _Budget(timeout_s)
    for pin, cin in pairs:
        g = Group(side_params(pin), side_params(cin), 0, 1, False, p_static_free=p_static_free)
        verdict, w = _find_witness(g, budget)
        if verdict != "witness":
            continue
        b = w["b"]
        P = resolve_schedule(dataclasses.replace(pin, batch_size=b, seqlen_k=w["precompute_seqlen_k"]))
        R = prepare_scheduler(P, w["seq_lens"], seqlens_q=[1] * b)
        C = resolve_schedule(dataclasses.replace(cin, batch_size=b, seqlen_k=w["call_seqlen_k"]))
        ev = evaluate(P, R, C, {"seqused_k": w["call_seq_lens"], "seqlens_q": [1] * b})
        if ev.outcome != "violation":
            continue
        wit = {"change": what, "precompute_heads": [pin.num_heads, pin.num_heads_k],
               "call_heads": [cin.num_heads, cin.num_heads_k], "invariant": ev.violations[0].invariant, **w}
        return TheoremResult(name, "refuted", time.perf_counter() - start, wit, None,
                             f"changing only {what}: {ev.violations[0].message} (FA3-level witness: no server "
                             f"configuration, so no case file)", failed=False, expected=True)
    return TheoremResult(name, "inconclusive" if budget.unknowns else "proved", time.perf_counter() - start, {}, None,
                         f"no witness for a change of {what} on the representative shapes", expected=False)


def _drift_rows(name, timeout_s, pack_p) -> TheoremResult:
    """Metadata with Lq_p rows (1, or pack_gqa=False) vs a call with Lq_c rows: a QUERY_COVER gap."""
    start = time.perf_counter()
    h, hk = _DRIFT_BASE["h"], _DRIFT_BASE["hk"]
    saw_unknown = False  # a z3 unknown is never "no witness": the verdict is then inconclusive
    for q_c in (1, 2, 4, 8, 64):
        if pack_p is None and q_c == 1:
            continue
        q_p = 1 if pack_p is None else q_c
        pin = _decode_inputs(True, h, hk, seqlen_q=q_p, pack_gqa=pack_p, page=1)
        cin = _decode_inputs(False, h, hk, seqlen_q=q_c, page=1)
        s = solver(timeout_s, SEED)
        lq_c, lq_p, S = z3.BitVec("Lq_c", BV), z3.BitVec("Lq_p", BV), z3.BitVec("S", BV)
        s.add(lq_c >= 1, lq_c <= q_c, lq_p >= 1, lq_p <= q_p, S >= 1, S <= 256)
        if pack_p is False:
            s.add(lq_p == lq_c)
        P, C = _qc_params(dataclasses.replace(pin, num_splits=2)), _qc_params(dataclasses.replace(cin, num_splits=2))
        pack = z3.If(S > 1, z3.BoolVal(P[4]), z3.BoolVal(P[3]))
        kpack = z3.If(S > 1, z3.BoolVal(C[6]), z3.BoolVal(C[5]))
        m_p = sym_m_blocks(lq_p, P[0], pack, P[1])
        rows = z3.If(kpack, lq_c * bv(C[0]), lq_c)
        s.add(m_p * bv(C[2]) < rows)
        r = s.check()
        saw_unknown |= r == z3.unknown
        if r != z3.sat:
            continue
        m = s.model()
        w = {"seqlen_q_precompute": _val(m, lq_p), "seqlen_q_call": _val(m, lq_c), "num_splits": _val(m, S)}
        Pin = dataclasses.replace(pin, seqlen_q=max(q_p, w["seqlen_q_precompute"]), seqlen_k=64,
                                  num_splits=w["num_splits"])
        Ps = resolve_schedule(Pin)
        R = prepare_scheduler(Ps, [64], seqlens_q=[w["seqlen_q_precompute"]])
        Cs = resolve_schedule(dataclasses.replace(cin, seqlen_q=q_c, seqlen_k=64, num_splits=w["num_splits"]))
        ev = evaluate(Ps, R, Cs, {"seqused_k": [64], "seqlens_q": [w["seqlen_q_call"]]})
        if ev.outcome == "violation":
            what = "pack_gqa (False at the precompute)" if pack_p is False else "seqlen_q"
            return TheoremResult(name, "refuted", time.perf_counter() - start,
                                 {"change": what, "invariant": ev.violations[0].invariant, **w}, None,
                                 f"changing only {what}: {ev.violations[0].message} (FA3-level witness, no case file)",
                                 expected=True)
    if saw_unknown:
        return TheoremResult(name, "inconclusive", time.perf_counter() - start, {}, None,
                             f"z3 returned unknown (timeout {timeout_s}s) before any witness", expected=False)
    return TheoremResult(name, "proved", time.perf_counter() - start, {}, None, "no witness found", expected=False)


def _drift_batch(name, timeout_s) -> TheoremResult:
    """b_c != b_p with the same b4: the call reads unwritten slots (b_c > b_p) or a non-permutation."""
    start = time.perf_counter()
    s = solver(timeout_s, SEED)
    bp, bc = z3.BitVec("b_p", BV), z3.BitVec("b_c", BV)
    s.add(bp >= 1, bp <= B_MAX, bc >= 1, bc <= B_MAX, ceil_div_const(bp, 4) == ceil_div_const(bc, 4), bc > bp)
    r = s.check()
    if r == z3.unknown:
        return TheoremResult(name, "inconclusive", time.perf_counter() - start, {}, None,
                             f"z3 returned unknown (timeout {timeout_s}s)", expected=False)
    if r != z3.sat:
        return TheoremResult(name, "proved", time.perf_counter() - start, {}, None, "no witness", expected=False)
    m = s.model()
    b_p, b_c = _val(m, bp), _val(m, bc)
    pin = _decode_inputs(True, 32, 4)
    P = resolve_schedule(dataclasses.replace(pin, batch_size=b_p, seqlen_k=4096))
    R = prepare_scheduler(P, [4096] * b_p, seqlens_q=[1] * b_p)
    C = resolve_schedule(dataclasses.replace(_decode_inputs(False, 32, 4), batch_size=b_c, seqlen_k=4096))
    ev = evaluate(P, R, C, {"seqused_k": [4096] * b_c, "seqlens_q": [1] * b_c})
    return TheoremResult(name, "refuted" if ev.outcome == "violation" else "inconclusive", time.perf_counter() - start,
                         {"change": "b", "b_precompute": b_p, "b_call": b_c,
                          "invariant": ev.violations[0].invariant if ev.violations else None}, None,
                         f"changing only b ({b_p} -> {b_c}, same b4): "
                         f"{ev.violations[0].message if ev.violations else ev.outcome} (no case file)",
                         expected=ev.outcome == "violation")


# ------------------------------------------------------------------------------------------------------------
# Public entry point
# ------------------------------------------------------------------------------------------------------------

THEOREMS = ("0-kv-cover", "0-batch-over-992", "1-freshness", "2-benign-drift", "2-drift-breaks-h_k",
            "2-drift-breaks-seqlen_k", "2-drift-breaks-seqlen_q", "2-drift-breaks-pack", "2-drift-breaks-b",
            "3-hazard", "4-guard-soundness", "4-root-cause-alternative", "4-sharded-kv-decode", "4-guard-robustness")


def run_metadata_theorems(guard: Any = "fixed", metadata_heads: str = "tp", timeout_s: float = 10.0,
                          dropped_assumptions: frozenset = frozenset(), cases_dir=None, only=None,
                          guard_spec: Optional[str] = None, heuristic_precompute: Heuristic = get_num_splits,
                          heuristic_call: Heuristic = get_num_splits,
                          kv_range: Optional[tuple] = None) -> list[TheoremResult]:
    """Theorems 1-4 of issue 3 for a backend policy (guard, metadata_heads); each result names its verdict.

    `guard`: a callable `guard(server_args) -> bool` or "fixed" / "pre-fix" / "none"; `guard_spec` is the label
    written into case files (defaults to the name or the callable's qualname). `only`: theorem names, numbers
    ("3") or substrings. `heuristic_*` and `kv_range` (a (symbolic, concrete) split-range pair) exist for the
    negative controls in the tests. Expected verdicts: under a sound policy every safety theorem is "proved" and
    theorem 3 reports "proved" (no hazard); under the pre-fix policy with "tp" heads theorem 3 and 4 are
    "refuted" (`failed=True`) and write case files.
    """
    if metadata_heads not in D.METADATA_HEADS:
        raise ValueError(f"metadata_heads: must be one of {D.METADATA_HEADS}, got {metadata_heads!r}")
    dropped = D._check_names(dropped_assumptions)
    guard_fn, label = D.resolve_guard(guard)
    label = guard_spec or label
    known = _is_known_guard(label)
    expect_hazard = known in ("pre-fix", "none") and metadata_heads == "tp"
    results: list[TheoremResult] = []
    want = lambda n: _matches(n, only)  # noqa: E731
    shared: dict = {}

    def budget() -> _Budget:
        return _Budget(timeout_s, cache=shared)

    if want("0-kv-cover"):
        if kv_range is None:
            results.append(kv_cover_lemma(timeout_s))
        else:
            results.append(kv_cover_lemma(timeout_s, kv_range[0], kv_range[1]))
    if want("0-batch-over-992"):
        results.append(_prepare_split_lemma(timeout_s))
    if want("1-freshness"):
        results.append(_freshness(timeout_s, heuristic_precompute, heuristic_call, shared))
    if any(want(n) for n in THEOREMS if n.startswith("2-")):
        results += [r for r in _benign_drift(timeout_s, heuristic_precompute, heuristic_call, shared)
                    if want(r.name)]

    need_domain = any(want(n) for n in ("3-hazard", "4-guard-soundness", "4-sharded-kv-decode", "4-guard-robustness",
                                        "4-root-cause-alternative"))
    configs = list(D.enumerate_configs(dropped)) if need_domain else []
    replicated = [c for c in configs if not c.sharded_kv]
    sharded = [c for c in configs if c.sharded_kv]
    if want("3-hazard"):
        pcp = [c for c in replicated if c.server.enable_prefill_cp]
        results.append(_policy_search("3-hazard", pcp, guard_fn, label, metadata_heads, dropped, budget(),
                                      heuristic_precompute, heuristic_call, cases_dir, expect_hazard,
                                      "prefill-CP hazard", invariant_filter="SPLIT_BOUND"))
        if results[-1].verdict == "proved":
            results[-1].expected = not expect_hazard
    if want("4-guard-soundness"):
        results.append(_policy_search("4-guard-soundness", replicated, guard_fn, label, metadata_heads, dropped,
                                      budget(), heuristic_precompute, heuristic_call, cases_dir,
                                      expect_hazard, "guard soundness"))
    if want("4-root-cause-alternative"):
        r = _policy_search("4-root-cause-alternative", replicated, D.prefix_guard, "pre-fix", "attn_tp", dropped,
                           budget(), heuristic_precompute, heuristic_call, cases_dir, False,
                           "root-cause alternative (pre-fix guard, attn_tp heads), sglang's replicated-KV decode")
        results.append(r)
    if want("4-sharded-kv-decode"):
        r = _policy_search("4-sharded-kv-decode", sharded, guard_fn, label, metadata_heads, dropped,
                           budget(), heuristic_precompute, heuristic_call, cases_dir,
                           known in ("pre-fix", "none"),
                           "CP decode over sharded KV (metadata from global lengths, call over local KV)")
        results.append(r)
    if want("4-guard-robustness"):
        start = time.perf_counter()
        raised = D.guard_robustness(guard_fn, configs[:: max(1, len(configs) // 400)] or
                                    [D.Config(D.Server(), D.MODELS["llama-3-8b"])])
        secs = time.perf_counter() - start
        if raised:
            results.append(TheoremResult("4-guard-robustness", "refuted", secs,
                                         {"invariant": "GUARD_RAISED", **raised[0]}, None, raised[0]["message"],
                                         failed=True, expected=False, details={"raised": raised}))
        else:
            results.append(TheoremResult("4-guard-robustness", "proved", secs, {}, None,
                                         f"the guard returns on every configuration and on ServerArgs lacking any of "
                                         f"{', '.join(D.GUARD_FLAGS)}"))
    return results
