"""Theorem 9: the tile vLLM's FA3 fork chooses, as z3 queries over the sides of the metadata hand-off.

Invariant (``fork-tile-agree``): under the fork's build (refmodel.fa3_builds ``vllm-fork-617264c1``), a
precompute and a call that agree on ``seqlen_q`` and on ``h / h_k`` choose the same (kBlockM, kBlockN), for every
head-dim instance and dtype FA3 compiles, causal or not, local or not, paged (page sizes 16..256) or not, any
``seqlen_q`` in 1..2^20 and any head counts 1..256 with ``h % h_k == 0`` (the two sides' ``h`` and ``h_k`` may
differ). The fork's choice reads ``seqlen_q * (h / h_k) <= 64`` (``use_one_mma_wg``, heuristics.h 10-14), the
decode causal drop reads ``seqlen_q == 1`` and paged TMA reads ``seqlen_q * (h / h_k) > kBlockM``: nothing else
of the two sides' differences reaches the tile.

Companion (``fork-tile-drift``, an expected refutation): on vLLM's domain (the models of ``spec.model.config`` without
MLA, tp 1, 2, 4, 8, block sizes 16 and 64, bf16 or fp8 KV, full attention, causal), a precompute whose
``max_seqlen_q`` is one more than the call's (what a driver off by one passes) chooses another tile. The witness
is turned into lengths by refmodel (:func:`split_bound_case`): a mixed batch whose precomputed metadata gives a
batch more splits than the call's buffers hold (SPLIT_BOUND); with ``cases_dir`` it is written as a vLLM case file
(``vllm==0.33.0``, seeded defect ``precompute-max-seqlen-q-off-by-one``, applied by the vLLM driver from outside
vLLM's code) that ``fa3verify replay`` runs on vLLM's own builder. vLLM's own code passes the same
``max_query_len`` to both sides, so the refutation is the hazard class, not a finding; under upstream's build the
same query has no witness (upstream's tiles do not read ``seqlen_q`` or ``h / h_k`` on this domain).

Encoding: the sides' ``seqlen_q``, ``h`` and ``h_k`` are 32-bit bit-vectors (``seqlen_q * (h / h_k)`` stays below
2^28, nothing wraps); the tile for each (causal, one MMA warp group, paged non-TMA) is a lookup table computed by
calling refmodel's tile functions (``tile_size_fwd_sm90_vllm_fork``, ``tile_size_fwd_sm90``), as spec.theorems.symbolic
does for the split heuristic. Domain simplifications: sm90, no left padding, no appended KV, no softcap (they only
turn paged TMA off or do not reach these tiles); window and chunk are resolved flags (``local``), not lengths.
``tests/prover/test_theorems_fork_tile.py`` checks the encoding against refmodel's ``resolve_schedule`` on a grid.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from typing import Optional

import z3

from refmodel.fa3_builds import UPSTREAM, VLLM_FORK, build as fa3_build, tile_size_fwd_sm90_build, \
    tile_size_fwd_sm90_vllm_fork
from refmodel.fa3_scheduler import rounded_headdims, tile_size_fwd_sm90

from spec.theorems.results import TheoremResult
from spec.theorems.symbolic import bv, boolval, solver, var
from spec.theorems.base import SEEDED_DEFECTS, select, unrefuted_result
from spec.theorems.z3ctx import checked
from spec.finding import TheoremVerdict

__all__ = ["THEOREMS", "DEFECTS", "TileInstance", "TILE_INSTANCES", "VllmTilePoint", "vllm_tile_points",
           "sym_tile", "tile_table", "SideVars", "side_vars", "fork_tile_jobs", "run_fork_tile_theorems", "split_bound_case",
           "scan_length_key", "DriftQuery", "OFF_BY_ONE_DEFECT", "MAX_SEQLEN_Q", "MAX_HEADS"]

THEOREMS = ("fork-tile-agree", "fork-tile-drift")
#: Seeded defects of the encoding (negative controls of ``fork-tile-agree``).
DEFECTS: dict[str, str] = SEEDED_DEFECTS["fork_tile"]
#: The driver defect the drift witness replays under (gpu_impl.defects; the vLLM driver applies it).
OFF_BY_ONE_DEFECT = "precompute-max-seqlen-q-off-by-one"
MAX_SEQLEN_Q = 2 ** 20
MAX_HEADS = 256
#: vLLM's per-step query budget (max_num_batched_tokens of the driver): the drift witness's call seqlen_q stays in it.
VLLM_MAX_QUERY = 8192
#: Longest KV the drift witness's lengths are searched over (tokens, in steps of 16).
MAX_SCAN_KV = 32768
SOURCE = ("vllm-project/flash-attention@617264c1 hopper/heuristics.h 10-14 (use_one_mma_wg), tile_size.h 10-93, "
          "flash_api.cpp 466 (paged TMA), 835 (seqlen_k = max_seqlen_k)")


@dataclasses.dataclass(frozen=True)
class TileInstance:
    """The static inputs both sides share: head dims, element size, causal argument, resolved local, page size."""

    headdim: int
    headdim_v: int
    element_size: int
    causal: bool
    local: bool
    page_size: Optional[int]

    @property
    def label(self) -> str:
        page = "dense" if self.page_size is None else f"page {self.page_size}"
        mask = "local" if self.local else ("causal" if self.causal else "non-causal")
        return f"d={self.headdim} dv={self.headdim_v} elem={self.element_size} {mask} {page}"


_HEAD_DIMS = ((48, 48), (64, 64), (96, 96), (112, 112), (128, 128), (192, 192), (256, 256), (192, 128), (64, 256),
              (64, 512))
#: Every instance the agreement theorem covers (fp8 only where dv <= 256, as flash_api.cpp 788-791).
TILE_INSTANCES = tuple(TileInstance(d, dv, e, causal, local, page)
                       for (d, dv), e in itertools.product(_HEAD_DIMS, (2, 1)) if not (e == 1 and dv > 256)
                       for causal, local in ((False, False), (True, False), (False, True))
                       for page in (None, 16, 64, 128, 256))


@dataclasses.dataclass(frozen=True)
class SideVars:
    """One side's symbolic ``seqlen_q``, ``h``, ``h_k`` and the domain constraints on them."""

    seqlen_q: z3.BitVecRef
    h: z3.BitVecRef
    h_k: z3.BitVecRef
    domain: z3.BoolRef

    @property
    def qhpk(self):
        return z3.UDiv(self.h, self.h_k)


def side_vars(prefix: str, max_seqlen_q: int = MAX_SEQLEN_Q) -> SideVars:
    """Fresh variables for one side, 1 <= seqlen_q <= ``max_seqlen_q``, 1 <= h_k <= h <= 256, h % h_k == 0."""
    sq, h, hk = var(f"{prefix}_seqlen_q"), var(f"{prefix}_h"), var(f"{prefix}_h_k")
    dom = z3.And(z3.UGE(sq, bv(1)), z3.ULE(sq, bv(max_seqlen_q)), z3.UGE(hk, bv(1)), z3.ULE(hk, h),
                 z3.ULE(h, bv(MAX_HEADS)), z3.URem(h, hk) == bv(0))
    return SideVars(sq, h, hk, dom)


def tile_table(inst: TileInstance, build: str) -> dict:
    """(causal, one_wg, non_tma) -> (kBlockM, kBlockN) of ``inst`` under ``build`` (read it, do not change it)."""
    return _table(inst, build)


@functools.lru_cache(maxsize=None)
def _table(inst: TileInstance, build: str) -> dict:
    """(causal, one_wg, non_tma) -> (kBlockM, kBlockN), from refmodel's tile functions for this build (a pure
    function of its arguments: computed once per instance and build; callers only read it)."""
    d_r, dv_r = rounded_headdims(inst.headdim, inst.headdim_v)
    out = {}
    for causal, wg, non_tma in itertools.product((False, True), repeat=3):
        if build == VLLM_FORK:
            out[(causal, wg, non_tma)] = tile_size_fwd_sm90_vllm_fork(d_r, dv_r, causal, inst.local,
                                                                      inst.element_size, non_tma, wg)
        elif build != UPSTREAM:  # the sglang wheel builds: their own table (refmodel/tile_size_sm90.json)
            out[(causal, wg, non_tma)] = tile_size_fwd_sm90_build(build, d_r, dv_r, causal, inst.local,
                                                                  inst.element_size, non_tma, one_mma_wg=wg)
        else:
            out[(causal, wg, non_tma)] = tile_size_fwd_sm90(d_r, dv_r, causal, inst.local, inst.element_size,
                                                            paged_kv_non_tma=non_tma)
    return out


def _pick(table: dict, causal, wg, non_tma) -> tuple:
    """(bm, bn) terms: the table as a decision tree over the three flags (causal, then wg, then non_tma).

    A flag that is a constant picks its branch, and a flag whose two branches hold the same value is not read, so
    the term has one If per distinct choice instead of a chain over all eight rows (the same function of the flags).
    """
    flags = (causal, wg, non_tma)
    # each flag's constant value (True / False) or None, looked at once per call, not once per node
    consts = tuple(True if z3.is_true(f) else False if z3.is_false(f) else None for f in flags)

    def node(i, fixed):
        if len(fixed) == 3:
            return table[fixed][i]
        flag, const = flags[len(fixed)], consts[len(fixed)]
        if const is not None:
            return node(i, fixed + (const,))
        yes, no = node(i, fixed + (True,)), node(i, fixed + (False,))
        if isinstance(yes, int) and isinstance(no, int) and yes == no:
            return yes
        if not isinstance(yes, int) and not isinstance(no, int) and yes.eq(no):
            return yes
        return z3.If(flag, _term(yes), _term(no))

    return _term(node(0, ())), _term(node(1, ()))


def _term(v):
    return bv(v) if isinstance(v, int) else v


def sym_tile(inst: TileInstance, side: SideVars, build: str = VLLM_FORK, defects=frozenset(),
             wg_rows: int = 64) -> tuple:
    """(kBlockM, kBlockN) of one side as z3 terms: refmodel ``resolve_schedule``'s ``block_m`` / ``block_n``.

    Restates ``resolve_masking`` (window (-1, -1) or a resolved local window, no chunk: a decode call drops causal
    unless paged with 64 < d <= 128), ``one_mma_wg`` / ``fa3_builds.use_one_mma_wg`` (sm90, unrounded d 64 or 128,
    not local, ``seqlen_q * (h / h_k) <= 64``), ``pagedkv_tma`` (page % kBlockN == 0 and ``seqlen_q * (h / h_k) >
    kBlockM`` of the TMA tile; the fork refuses TMA for local) and ``build_tile``. Any named build: the sglang
    wheel builds test no local in the predicate (``Build.one_mma_wg`` "sglang"); ``wg_rows`` is the predicate's
    row bound (64 in every build; another value seeds a defect of spec.theorems.wheel_builds).
    """
    d = inst.headdim
    rows = side.seqlen_q * (side.h if "one-wg-reads-num-heads" in defects else side.qhpk)
    if inst.local:
        causal = boolval(False)
    elif not inst.causal:
        causal = boolval(False)
    else:
        drops = d <= 64 or d > 128 or inst.page_size is None
        causal = z3.Not(side.seqlen_q == bv(1)) if drops else boolval(True)
    kind = fa3_build(build).one_mma_wg
    if kind is not None and d in (64, 128) and not (kind == "fork" and inst.local):
        wg = z3.ULE(rows, bv(wg_rows))
    else:
        wg = boolval(False)
    table = _table(inst, build)
    if inst.page_size is None or (build == VLLM_FORK and inst.local):
        non_tma = boolval(inst.page_size is not None)
    else:
        bm0, bn0 = _pick(table, causal, wg, boolval(False))
        tma = z3.And(z3.URem(bv(inst.page_size), bn0) == bv(0), z3.UGT(rows, bm0))
        non_tma = z3.Not(tma)
    return _pick(table, causal, wg, non_tma)


def _agree(timeout_s: float, defects=frozenset(), instances=TILE_INSTANCES) -> TheoremResult:
    name = THEOREMS[0]
    start = time.perf_counter()
    unknown = []
    p, c = side_vars("p"), side_vars("c")
    s = solver(timeout_s)
    # one incremental solver: the sides' shared constraints once, each instance's tiles under push/pop
    s.add(p.domain, c.domain, p.seqlen_q == c.seqlen_q, p.qhpk == c.qhpk)
    for inst in instances:
        (pm, pn), (cm, cn) = sym_tile(inst, p, VLLM_FORK, defects), sym_tile(inst, c, VLLM_FORK, defects)
        s.push()
        s.add(z3.Or(pm != cm, pn != cn))
        r = checked(s)
        if r == z3.unknown:
            unknown.append(f"{inst.label}: {s.reason_unknown()}")
        elif r == z3.sat:
            m = s.model()
            val = {k: m.eval(t, model_completion=True).as_long() for k, t in
                   (("seqlen_q", p.seqlen_q), ("h_p", p.h), ("h_k_p", p.h_k), ("h_c", c.h), ("h_k_c", c.h_k),
                    ("block_m_p", pm), ("block_n_p", pn), ("block_m_c", cm), ("block_n_c", cn))}
            witness = {"instance": inst.label, **val, "invariant": "TILE_AGREE"}
            return TheoremResult(name, TheoremVerdict.REFUTED, time.perf_counter() - start, witness, None,
                                 f"{inst.label}: sides agreeing on seqlen_q {val['seqlen_q']} and h/h_k choose "
                                 f"{val['block_m_p']}x{val['block_n_p']} vs {val['block_m_c']}x{val['block_n_c']} "
                                 f"(encoding defects {sorted(defects)})", failed=True, expected=False)
        s.pop()
    return unrefuted_result(name, start, unknown,
                            f"under {VLLM_FORK}, on {len(instances)} instances (head dims x dtype x causal/local x "
                            f"paging), seqlen_q <= 2^20 and heads <= {MAX_HEADS}: equal seqlen_q and h/h_k give the "
                            f"same tile. Source: {SOURCE}",
                            details={"instances": len(instances)})


@dataclasses.dataclass(frozen=True)
class VllmTilePoint:
    """One configuration of vLLM's domain for the drift query: model, tp, block size, KV dtype, SM count."""

    model: str
    tp: int
    block: int
    element_size: int
    num_sm: int

    def heads(self) -> tuple:
        from spec.model.config import MODELS

        m = MODELS[self.model]
        return m.num_heads // self.tp, max(1, m.num_kv_heads // self.tp)

    def instance(self) -> TileInstance:
        from spec.model.config import MODELS

        m = MODELS[self.model]
        return TileInstance(m.head_dim, m.head_dim, self.element_size, True, False, self.block)

    @property
    def label(self) -> str:
        return (f"{self.model} tp={self.tp} block_size={self.block} kv={'fp8' if self.element_size == 1 else 'auto'} "
                f"num_sm={self.num_sm}")


def vllm_tile_points(num_sm: int = 132) -> list:
    """vLLM's domain for the drift query (module doc), in a fixed order."""
    from spec.model.config import MODELS

    return [VllmTilePoint(name, tp, block, e, num_sm) for name, m in sorted(MODELS.items())
            if not m.is_mla and m.head_dim <= 256 for tp in (1, 2, 4, 8) if m.num_heads % tp == 0
            for block in (16, 64) for e in (2, 1)]


def _drift_witness(point: VllmTilePoint, build: str, timeout_s: float):
    """(verdict, call seqlen_q, tiles) of the off-by-one query at one point on its own solver: z3 sat/unsat/unknown
    (the reference :class:`DriftQuery` is compared with)."""
    h, hk = point.heads()
    inst = point.instance()
    p, c = side_vars("p", VLLM_MAX_QUERY + 1), side_vars("c", VLLM_MAX_QUERY)
    s = solver(timeout_s)
    s.add(p.domain, c.domain, p.h == bv(h), p.h_k == bv(hk), c.h == bv(h), c.h_k == bv(hk),
          p.seqlen_q == c.seqlen_q + bv(1))
    (pm, pn), (cm, cn) = sym_tile(inst, p, build), sym_tile(inst, c, build)
    s.add(z3.Or(pm != cm, pn != cn))
    return _smallest_call_seqlen_q(s, c, (pm, pn, cm, cn))


class DriftQuery:
    """The off-by-one query of :func:`_drift_witness` for many points on one incremental solver.

    ``p.seqlen_q == c.seqlen_q + 1`` is asserted once; each instance's tiles are built once (they read the sides'
    variables, not the point's heads); a point asks, under push/pop, for another tile with its heads substituted
    for both sides' ``h`` and ``h_k`` in the domains and the tiles (the query of :func:`_drift_witness`, whose
    equalities ``h == H`` pin those variables, with them substituted: z3 then folds ``h / h_k`` to a constant
    instead of bit-blasting a divider per point), on z3's QF_BV solver. Each check has the same ``timeout_s`` bound;
    ``tests/prover/test_theorems_fork_tile.py`` compares the answers with :func:`_drift_witness`'s on every point.
    """

    def __init__(self, build: str, timeout_s: float):
        self.build = build
        self.p, self.c = side_vars("p", VLLM_MAX_QUERY + 1), side_vars("c", VLLM_MAX_QUERY)
        self.solver = solver(timeout_s, logic="QF_BV")  # every term is a bit-vector one: z3's QF_BV solver
        self.solver.add(self.p.seqlen_q == self.c.seqlen_q + bv(1))
        self._tiles: dict = {}

    def _tiles_of(self, inst: TileInstance) -> tuple:
        got = self._tiles.get(inst)
        if got is None:
            (pm, pn), (cm, cn) = sym_tile(inst, self.p, self.build), sym_tile(inst, self.c, self.build)
            got = self._tiles[inst] = ((pm, pn, cm, cn), z3.Or(pm != cm, pn != cn))
        return got

    def witness(self, point: VllmTilePoint):
        """:func:`_drift_witness` of ``point`` under this query's build and timeout."""
        h, hk = point.heads()
        terms, differ = self._tiles_of(point.instance())
        p, c, s = self.p, self.c, self.solver
        heads = [(p.h, bv(h)), (p.h_k, bv(hk)), (c.h, bv(h)), (c.h_k, bv(hk))]
        s.push()
        try:
            s.add(*(z3.simplify(z3.substitute(t, *heads)) for t in (p.domain, c.domain, differ)))
            return _smallest_call_seqlen_q(s, c, [z3.substitute(t, *heads) for t in terms])
        finally:
            s.pop()


def _smallest_call_seqlen_q(s, c: SideVars, terms: tuple):
    """(verdict, call seqlen_q, tiles) of the query asserted on ``s``: the smallest call seqlen_q z3 finds."""
    r = checked(s)
    if r != z3.sat:
        return ("unknown" if r == z3.unknown else "unsat"), None, None
    m = s.model()
    # the smallest such call seqlen_q (deterministic): walk down while z3 still finds one
    while True:
        q = m.eval(c.seqlen_q, model_completion=True).as_long()
        tiles = [m.eval(t, model_completion=True).as_long() for t in terms]
        if q <= 1 or checked(s, z3.ULT(c.seqlen_q, bv(q))) != z3.sat:
            return "sat", q, tiles
        m = s.model()


def split_bound_case(point: VllmTilePoint, q: int, build: str = VLLM_FORK, length_key=None) -> Optional[dict]:
    """Lengths at which the off-by-one precompute's metadata overflows the call (refmodel decides), or None.

    The batch: one sequence of L <= 32768 keys with ``q`` new query tokens and up to 7 one-token decodes; the precompute sees
    ``max_seqlen_q = q + 1``, the call ``q`` (both ``max_seqlen_k = L``: the fork's call reads ``max_seqlen_k``).
    The lengths are scanned in ascending order and the first that overflows is returned; a length whose
    :func:`scan_length_key` was already seen is skipped (the outcome is a function of that key, so it is the
    outcome already found there: no overflow). ``length_key`` replaces that key (tests: the identity is the full
    scan).
    """
    from refmodel.fa3_scheduler import call_inputs, num_splits_over_lengths, precompute_inputs, resolve_schedule

    from spec.invariants import CallLengths, check_all, metadata_for

    h, hk = point.heads()
    inst = point.instance()
    dtype = "float8_e4m3fn" if point.element_size == 1 else "bfloat16"
    common = dict(headdim_v=inst.headdim_v, qkv_dtype=dtype, varlen_q=True, page_size=point.block, causal=True,
                  num_sm=point.num_sm, build=build)
    first = max(q, 16)
    key = scan_length_key(point, q, build, first) if length_key is None else length_key
    seen, lengths = set(), []
    for L in range(first, MAX_SCAN_KV + 1, 16):
        k = key(L)
        if k not in seen:
            seen.add(k)
            lengths.append(L)
    # the static split counts do not read the batch size (varlen: total_mblocks pretends b = 1); refmodel's
    # one-pass form is get_num_splits at each length (tests/oracle/test_split_table_one_pass.py)
    splits_p = num_splits_over_lengths(precompute_inputs(1, q + 1, first, h, hk, inst.headdim, **common), lengths)
    splits_c = num_splits_over_lengths(call_inputs(1, q, first, h, hk, inst.headdim, **common), lengths)
    for L, s_p, s_c in zip(lengths, splits_p, splits_c):
        if s_p <= s_c:
            continue
        for b in (1, 2, 4, 8):
            pin = precompute_inputs(b, q + 1, L, h, hk, inst.headdim, **common)
            C = resolve_schedule(call_inputs(b, q, L, h, hk, inst.headdim, **common))
            lens, qlens = [L] + [1] * (b - 1), [q] + [1] * (b - 1)
            P, R = metadata_for(pin, lens, qlens)
            found = check_all(P, R, C, CallLengths(tuple(lens), tuple(qlens)))
            if found:
                return {"seq_lens": lens, "query_lens": qlens, "S_p": P.num_splits, "S_c": C.num_splits,
                        "invariant": found[0].invariant, "message": found[0].detail,
                        "tiles": [P.block_m, P.block_n, C.block_m, C.block_n]}
    return None


def scan_length_key(point: VllmTilePoint, q: int, build: str = VLLM_FORK, at: int = 16):
    """L -> (ceil(L / kBlockN of the precompute), ceil(L / kBlockN of the call)): what :func:`split_bound_case`'s
    outcome at length L depends on, for every batch size it tries.

    Why (refmodel, on this domain: causal, window (-1, -1), no chunk, paged, no left padding, no appended KV):
    ``resolve_masking`` gives flags that do not read ``seqlen_k``, so neither side's tile does (``build_tile``,
    ``pagedkv_tma`` read seqlen_q, heads and the page size); ``get_num_splits`` reads L as ``c_ceil_div(L,
    kBlockN)`` and as ``size_one_kv_head``, which only its L2 branch reads, above 50 MiB (so the key is L itself
    when the longest length can pass that); the prepare step reads it as ``n_blocks_for`` = ceil(L / kBlockN);
    every invariant of ``check_all`` reads the split counts, tiles, batch sizes and query lengths, except
    KV_COVER, which reads L and never fails for a split count >= 1 (theorem ``kv-cover``). The tiles are read
    from refmodel at length ``at``.
    """
    from refmodel.fa3_scheduler import L2_SPLIT_BYTES, call_inputs, precompute_inputs, resolve_schedule

    h, hk = point.heads()
    inst = point.instance()
    if MAX_SCAN_KV * (inst.headdim + inst.headdim_v) * point.element_size > L2_SPLIT_BYTES:
        return lambda L: L
    dtype = "float8_e4m3fn" if point.element_size == 1 else "bfloat16"
    common = dict(headdim_v=inst.headdim_v, qkv_dtype=dtype, varlen_q=True, page_size=point.block, causal=True,
                  num_sm=point.num_sm, build=build)
    bn_p = resolve_schedule(precompute_inputs(1, q + 1, at, h, hk, inst.headdim, **common)).block_n
    bn_c = resolve_schedule(call_inputs(1, q, at, h, hk, inst.headdim, **common)).block_n
    return lambda L: (-(-L // bn_p), -(-L // bn_c))


def write_drift_case(cases_dir, point: VllmTilePoint, found: dict, release: str = "0.33.0") -> Optional[str]:
    """The drift witness as a vLLM case file (seeded defect :data:`OFF_BY_ONE_DEFECT`); None without ``cases_dir``."""
    from spec.model.cases import Case
    from spec.model.config import MODELS, ServerConfig

    if cases_dir is None:
        return None
    model = MODELS[point.model]
    if point.element_size == 1:
        model = dataclasses.replace(model, dtype="float8_e4m3")
    server = ServerConfig(tp_size=point.tp, page_size=point.block, num_sm=point.num_sm, cuda_graph=False,
                          context_length=max(found["seq_lens"]))
    case = Case.from_parts(
        source=f"prove:{THEOREMS[1]}", server=server.to_dict(), model=model.to_dict(),
        policy={"guard": "fixed", "metadata_heads": "tp", "clear_stale_cp_metadata": True},
        batches=[{"mode": "mixed", "seq_lens": found["seq_lens"], "extend_lens": found["query_lens"]}],
        engine={"name": "vllm", "release": release},
        expected={"outcome": "violation", "invariant": found["invariant"],
                  "detail": {"S_p": found["S_p"], "S_c": found["S_c"], "tiles": found["tiles"],
                             "message": found["message"]}},
        notes=(f"{THEOREMS[1]} witness under {VLLM_FORK} ({point.label}): the precompute's max_seqlen_q is one more "
               f"than the call's ({found['query_lens'][0] + 1} vs {found['query_lens'][0]}), so the fork chooses "
               f"another tile; replays on vLLM's own builder with the seeded defect {OFF_BY_ONE_DEFECT}"),
        defects=[OFF_BY_ONE_DEFECT], options={"vllm": {"piecewise": False}})
    return str(case.save(cases_dir))


def _drift(timeout_s: float, cases_dir: Optional[str] = None, build: str = VLLM_FORK,
           points=None) -> TheoremResult:
    name = THEOREMS[1]
    start = time.perf_counter()
    points = vllm_tile_points() if points is None else points
    witnesses, unknown = [], []
    query = DriftQuery(build, timeout_s)
    for point in points:
        verdict, q, tiles = query.witness(point)
        if verdict == "unknown":
            unknown.append(point.label)
        elif verdict == "sat":
            witnesses.append((point, q, tiles))
    details = {"points": len(points), "points_with_witness": len(witnesses), "build": build,
               "witness_points": [f"{p.label} seqlen_q {q}: {t[0]}x{t[1]} vs {t[2]}x{t[3]}"
                                  for p, q, t in witnesses[:8]]}
    if unknown:
        return TheoremResult(name, TheoremVerdict.INCONCLUSIVE, time.perf_counter() - start, {}, None,
                             f"z3 unknown at {unknown[:3]}", expected=False, details=details)
    if not witnesses:
        return TheoremResult(name, TheoremVerdict.PROVED, time.perf_counter() - start, {}, None,
                             f"under {build}, on {len(points)} points of vLLM's domain a precompute whose "
                             f"max_seqlen_q is one more than the call's chooses the call's tile", details=details)
    for point, q, tiles in witnesses:
        found = split_bound_case(point, q, build)
        if found is None:
            continue
        case_file = write_drift_case(cases_dir, point, found)
        witness = {"config": point.label, "call_seqlen_q": q, "precompute_max_seqlen_q": q + 1, **found,
                   "tiles": {"precompute": tiles[:2], "call": tiles[2:]}}
        return TheoremResult(
            name, TheoremVerdict.EXPECTED_REFUTATION, time.perf_counter() - start, witness, case_file,
            f"under {build}, {len(witnesses)} of {len(points)} points of vLLM's domain choose another tile when the "
            f"precompute's max_seqlen_q is off by one; {point.label}, seqlen_q {q + 1} vs {q}: "
            f"{tiles[0]}x{tiles[1]} vs {tiles[2]}x{tiles[3]}, {found['invariant']} with S_p={found['S_p']} > "
            f"S_c={found['S_c']} on lengths {found['seq_lens']} (query {found['query_lens']}); vLLM passes the same "
            f"max_query_len to both sides, so this is the hazard class, not a finding",
            failed=False, expected=True, details=details)
    point, q, tiles = witnesses[0]
    return TheoremResult(name, TheoremVerdict.EXPECTED_REFUTATION, time.perf_counter() - start,
                         {"config": point.label, "call_seqlen_q": q, "tiles": tiles, "invariant": "TILE_AGREE"}, None,
                         f"under {build}, {len(witnesses)} of {len(points)} points choose another tile when "
                         f"max_seqlen_q is off by one; no length up to 32768 turns it into a violation",
                         failed=False, expected=True, details=details)


def run_fork_tile_theorems(timeout_s: float = 10.0, only=None, cases_dir: Optional[str] = None,
                           defects=frozenset()) -> list:
    """Theorem 9's results (selected like every theorem group); ``defects`` seeds the agreement encoding."""
    from spec.theorems.jobs import run_jobs

    return run_jobs(fork_tile_jobs(timeout_s, only, cases_dir, defects)).results


def fork_tile_jobs(timeout_s: float = 10.0, only=None, cases_dir: Optional[str] = None,
                   defects=frozenset()) -> list:
    """The jobs of :func:`run_fork_tile_theorems` (spec.theorems.jobs): one per theorem."""
    from spec.theorems.jobs import Job

    defects = frozenset(defects)
    unknown = defects - set(DEFECTS)
    if unknown:
        raise ValueError(f"defects: unknown names {sorted(unknown)}; known: {sorted(DEFECTS)}")
    names = select(only, THEOREMS, lambda t: t.split("-")[0])
    run = {THEOREMS[0]: lambda: [_agree(timeout_s, defects)], THEOREMS[1]: lambda: [_drift(timeout_s, cases_dir)]}
    # weights: seconds on a quiet core, roughly; the drift's length scans make it the longest single part of a
    # prove run, so a parallel run starts it first
    weights = {THEOREMS[0]: 0.3, THEOREMS[1]: 3.0}
    return [Job((n,), (run[n],), weight=weights[n], light=n == THEOREMS[0], cases_dir=cases_dir if n == THEOREMS[1] else None,
                key=(n, timeout_s, tuple(sorted(defects)))) for n in names]


def group_jobs(request) -> list:
    """The vLLM fork's tile theorems' jobs for a :class:`spec.theorems.base.ProveRequest` (spec.theorems.jobs_for)."""
    return fork_tile_jobs(timeout_s=request.timeout_s, only=None if request.only is None else list(request.only),
                          cases_dir=request.cases_dir)
