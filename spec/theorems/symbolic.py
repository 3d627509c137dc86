"""z3 encodings of refmodel's FA3 scheduler formulas, over 32-bit bit-vectors and z3's float32 theory.

One rule: no formula is invented here. Each function restates one refmodel function (named in its
docstring) over z3 terms, and `tests/prover/test_symbolic_agreement.py` checks the two agree on >= 10,000 random
points and exhaustively on a small domain. Where FA3's choice depends on a few discrete inputs only, the
encoding is a lookup table *computed by calling refmodel* (the split heuristic, the combine capacity).

Encoding choices (measured):
- integers are 32-bit bit-vectors (FA3's `int`); all values stay in [0, 2^31) under the stated bounds
  (lengths <= 2^20, b <= 8, heads <= 64), so signed and unsigned readings agree and nothing wraps;
- `blocks_per_sm = ceilf(float(total) * 1.1f * float(H) / float(num_sm))` is float32 with round-to-nearest-even
  per operation (fpToFP/fpMul/fpDiv), ceil by fpRoundToIntegral(RTP), then fpToSBV (exact after the ceil);
- the split heuristic, for fixed discrete inputs, depends only on the static n-block count below its cap
  `min(128, num_sm)`: a table built from `refmodel.fa3_scheduler.get_num_splits`, encoded as an If-chain over
  runs of equal values (`SideParams.table`);
- FA3's prepare kernel is built with fast math: its division may be 2 ulp off IEEE's. `sym_blocks_per_sm_range`
  gives the band of blocks_per_sm values that allows; the theorems let blocks_per_sm range over it and call a
  violation that needs a value other than IEEE's inconclusive (refmodel fastmath);
- integer division by zero (ceil(n / blocks_per_sm) with blocks_per_sm = 0, only for an all-empty batch)
  follows refmodel's documented convention (split 1), not z3's bvudiv-by-zero.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Callable, Optional, Sequence

import numpy as np
import z3

# SIGINT must reach Python (the run stops, exit 3) instead of turning the current query into "unknown"
z3.set_param("ctrl_c", False)

from spec.theorems.z3ctx import bound
from spec.theorems.z3ctx import ctx as _ctx
from refmodel.fa3_scheduler import (
    CALL_MAX_SPLITS,
    HEURISTIC_MAX_SPLITS,
    ScheduleInputs,
    combine_capacity,
    get_num_splits,
    resolve_schedule,
    with_inputs,
)

__all__ = [
    "BV", "bv", "smin", "smax", "ceil_div_const", "ceil_div_sym", "f32_val", "sym_blocks_per_sm",
    "sym_blocks_per_sm_range", "sym_l2_split_count", "sym_dynamic_split", "sym_m_blocks", "sym_n_blocks", "run_table", "table_lookup", "sym_combine_capacity",
    "sym_split_block_range", "SideParams", "side_params", "Heuristic", "sym_split_count", "sym_pack",
    "sym_prepare_splits", "splits_over_lengths", "evaluate_term", "solver", "var", "boolval", "clear_caches",
]

#: Bit width of every integer term (FA3 computes in C++ int).
BV = 32

#: A split-count function over one side's inputs, `get_num_splits`-shaped (tests inject defective ones). It may
#: carry `over_lengths(inputs, seqlen_ks)`, its own one-pass form at many static seqlen_k (`splits_over_lengths`).
Heuristic = Callable[[ScheduleInputs], int]


def bv(x: int) -> z3.BitVecRef:
    """A 32-bit bit-vector constant in the current theorem's z3 context (spec.theorems.z3ctx), built once per context."""
    c = _ctx()
    try:
        cache = c.fa3_bv_constants
    except AttributeError:
        cache = c.fa3_bv_constants = {}
    v = int(x)
    term = cache.get(v)
    if term is None:
        term = cache[v] = z3.BitVecVal(v, BV, c)
    return term


def var(name: str, width: int = BV) -> z3.BitVecRef:
    """A bit-vector variable (default 32 bits) in the current theorem's z3 context."""
    return z3.BitVec(name, width, _ctx())


def boolval(b: bool) -> z3.BoolRef:
    """The Boolean constant `b` in the current theorem's z3 context."""
    return z3.BoolVal(bool(b), _ctx())


def _ctx_of(*terms) -> z3.Context:
    """The context of the first z3 term among `terms`, else the current theorem's."""
    for t in terms:
        if isinstance(t, z3.AstRef):
            return t.ctx
    return _ctx()


def _f32(c=None):
    return z3.Float32(c or _ctx())


def _t(x):
    return bv(x) if isinstance(x, (int, np.integer)) else x


def smin(a, b):
    """min over signed 32-bit terms (std::min on int)."""
    a, b = _t(a), _t(b)
    return z3.If(a < b, a, b)


def smax(a, b):
    """max over signed 32-bit terms (std::max on int)."""
    a, b = _t(a), _t(b)
    return z3.If(a > b, a, b)


def ceil_div_const(x, c: int):
    """`cutlass::ceil_div(x, c)` = (x + c - 1) / c for x >= 0 and a constant c >= 1 (refmodel `ceil_div`)."""
    if c == 1:
        return _t(x)
    return z3.UDiv(_t(x) + bv(c - 1), bv(c))


def ceil_div_sym(x, y, if_zero=1):
    """(x + y - 1) / y for symbolic y >= 0, with refmodel's convention `if_zero` when y == 0 (prepare.py `dynamic_split`)."""
    x, y = _t(x), _t(y)
    return z3.If(y == bv(0), _t(if_zero), z3.UDiv(x + y - bv(1), y))


def f32_val(x) -> z3.FPRef:
    """The float32 constant `np.float32(x)` as a z3 FP term, bit for bit (no second rounding)."""
    bits = int(np.float32(x).view(np.uint32))
    c = _ctx()
    return z3.fpBVToFP(z3.BitVecVal(bits, 32, c), _f32(c), ctx=c)


def _to_f32(x):
    if isinstance(x, (int, np.integer)):
        return f32_val(np.float32(int(x)))
    return z3.fpSignedToFP(z3.RNE(x.ctx), x, _f32(x.ctx), ctx=x.ctx)


def sym_blocks_per_sm(total, num_heads, num_sm):
    """`ceilf(float(total) * 1.1f * float(heads) / float(num_sm))` in float32 (refmodel prepare.py `blocks_per_sm`)."""
    c = _ctx_of(total, num_heads, num_sm)
    rne = z3.RNE(c)
    value = z3.fpDiv(rne, z3.fpMul(rne, z3.fpMul(rne, _to_f32(total), f32_val(1.1), c), _to_f32(num_heads), c),
                     _to_f32(num_sm), c)
    return z3.fpToSBV(z3.RTZ(c), z3.fpRoundToIntegral(z3.RTP(c), value, c), z3.BitVecSort(BV, c), c)


def sym_blocks_per_sm_range(total, num_heads, num_sm, ulps: int = 2):
    """(lo, hi): the ceilf of the quotient `ulps` float32 steps below and above IEEE's (refmodel fastmath `blocks_per_sm_candidates`).

    FA3's fast-math division may land anywhere in that band; lo == hi says the margin cannot matter. The quotient
    is >= 0 here, so a step is +-1 on its IEEE bits; a zero quotient is exact.
    """
    c = _ctx_of(total, num_heads, num_sm)
    rne = z3.RNE(c)
    q = z3.fpDiv(rne, z3.fpMul(rne, z3.fpMul(rne, _to_f32(total), f32_val(1.1), c), _to_f32(num_heads), c),
                 _to_f32(num_sm), c)
    bits = z3.fpToIEEEBV(q, c)
    zero = z3.fpIsZero(q, c)
    down = z3.If(zero, q, z3.fpBVToFP(bits - z3.BitVecVal(ulps, BV, c), _f32(c), c))
    up = z3.If(zero, q, z3.fpBVToFP(bits + z3.BitVecVal(ulps, BV, c), _f32(c), c))

    def ceil_int(x):
        return z3.fpToSBV(z3.RTZ(c), z3.fpRoundToIntegral(z3.RTP(c), x, c), z3.BitVecSort(BV, c), c)

    return ceil_int(down), ceil_int(up)


def sym_l2_split_count(seqlen_k, bytes_per_token: int, max_splits: int = HEURISTIC_MAX_SPLITS, width: int = BV):
    """(taken, count) of the L2 branch of `num_splits_heuristic` in `width`-bit C++ int (refmodel fa3_scheduler).

    size = seqlen_k * bytes_per_token (wraps), taken iff size > 50 MiB (signed), count = min((size + 50 MiB - 1)
    / 50 MiB, max_splits) with z3's signed division (truncation toward zero, as C++). The caller states the other
    conditions of the branch (total_mblocks >= 0.8 SMs, m_blocks >= 2 SMs, not causal/local). `width` 64 is the
    counterfactual FA3 with 64-bit sizes.
    """
    from refmodel.fa3_scheduler import L2_SPLIT_BYTES

    context = _ctx_of(seqlen_k)

    def c(x):
        return z3.BitVecVal(int(x), width, context)

    size = (z3.ZeroExt(width - BV, seqlen_k) if z3.is_bv(seqlen_k) and seqlen_k.size() < width else seqlen_k) \
        * c(bytes_per_token)
    taken = size > c(L2_SPLIT_BYTES)
    count = (size + c(L2_SPLIT_BYTES - 1)) / c(L2_SPLIT_BYTES)
    return taken, z3.If(count < c(max_splits), count, c(max_splits))


def sym_dynamic_split(n_blocks, bps, num_splits_static):
    """max(min(ceil(n / blocks_per_sm), S_static), 1), split 1 when bps == 0 (refmodel prepare.py `dynamic_split`)."""
    return smax(smin(ceil_div_sym(n_blocks, bps, if_zero=1), num_splits_static), 1)


def sym_m_blocks(seqlen_q, qhead_per_khead: int, pack, block_m: int):
    """ceil(Lq * (qhpk if PackGQA else 1) / kBlockM) (refmodel prepare.py `m_blocks_for`); `pack` bool or z3 Bool."""
    lq = _t(seqlen_q)
    if isinstance(pack, bool):
        return ceil_div_const(lq * bv(qhead_per_khead) if pack else lq, block_m)
    return z3.If(pack, ceil_div_const(lq * bv(qhead_per_khead), block_m), ceil_div_const(lq, block_m))


def sym_n_blocks(seqused_k, block_n: int, leftpad=0, seqlen_new=0):
    """ceil((seqused_k - leftpad + new) / kBlockN) (refmodel prepare.py `n_blocks_for`)."""
    return ceil_div_const(_t(seqused_k) - _t(leftpad) + _t(seqlen_new), block_n)


def run_table(values: Sequence[int]) -> list[tuple[int, int]]:
    """Compress a table into runs [(last_index, value), ...] of equal consecutive values."""
    runs: list[tuple[int, int]] = []
    for i, v in enumerate(values):
        if runs and runs[-1][1] == v:
            runs[-1] = (i, v)
        else:
            runs.append((i, int(v)))
    return runs


def table_lookup(x, values: Sequence[int], tail: Optional[int] = None):
    """values[x] for 0 <= x < len(values), `tail` (default values[-1]) beyond, as an If-chain over runs.

    The chain is built once per (term, table) in a z3 context and reused (the same term every time: z3 shares
    equal terms, so reuse changes nothing but the cost of building it, most of stage 1's Python time).
    """
    tail = values[-1] if tail is None else tail
    x = _t(x)
    try:
        memo = x.ctx.fa3_table_lookups
    except AttributeError:
        memo = x.ctx.fa3_table_lookups = {}
    key = (x.get_id(), tuple(values), tail)
    hit = memo.get(key)
    if hit is not None:
        return hit[1]  # hit[0] is x itself: the memo keeps it alive, so its id names no other term
    runs = _runs(tuple(values))
    expr = bv(tail)
    if runs and runs[-1][1] == tail:
        runs = runs[:-1]
        # the last run merges with the tail: everything beyond the previous run's end is `tail`
    for last, value in reversed(runs):
        expr = z3.If(z3.ULE(x, bv(last)), bv(value), expr)
    memo[key] = (x, expr)
    return expr


@lru_cache(maxsize=4096)
def _runs(values: tuple) -> tuple:
    return tuple(run_table(values))


@lru_cache(maxsize=None)
def _capacity_table(dv: int) -> tuple[int, ...]:
    return tuple(combine_capacity(s, dv) for s in range(0, CALL_MAX_SPLITS + 1))


def sym_combine_capacity(num_splits_call, dv: int):
    """kMax(S_c, dv), a table over S_c in 0..256 built from refmodel `combine_capacity` (combine launch template)."""
    return table_lookup(num_splits_call, _capacity_table(int(dv)))


def sym_split_block_range(n_min, n_max, num_splits, split_idx):
    """[lo, hi) of split s: P = ceil((n_max - n_min) / S) (0 if empty), lo = n_min + s*P, hi = min(lo + P, n_max) (refmodel splitkv `split_block_range`).

    Works over bit-vectors (UDiv; the width of the first bit-vector argument) or over z3 Ints (`/` is floor
    division, equal to C's for the non-negative operands FA3 has here).
    """
    terms = (n_min, n_max, num_splits, split_idx)
    context = _ctx_of(*terms)
    if any(z3.is_int(x) for x in terms if isinstance(x, z3.ExprRef)):
        def c(x):
            return z3.IntVal(int(x), context) if isinstance(x, (int, np.integer)) else x

        def div(a, b):
            return a / b
    else:
        width = next((x.size() for x in terms if z3.is_bv(x)), BV)

        def c(x):
            return z3.BitVecVal(int(x), width, context) if isinstance(x, (int, np.integer)) else x

        div = z3.UDiv
    n_min, n_max, s_, idx = c(n_min), c(n_max), c(num_splits), c(split_idx)
    per = z3.If(n_max <= n_min, c(0), div(n_max - n_min + s_ - c(1), s_))
    lo = n_min + idx * per
    return lo, z3.If(lo + per < n_max, lo + per, n_max)


# ------------------------------------------------------------------------------------------------------------
# One side of the hand-off, with everything FA3 decides from discrete inputs made concrete by refmodel
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SideParams:
    """FA3's resolved decisions for one side (precompute or call) whose only symbolic input is the static seqlen_k.

    Built by `side_params` from refmodel `resolve_schedule`; `table[n]` is the split count FA3 chooses when the
    static n-block count is n (`tail` beyond), `fixed_splits` the num_splits argument when positive.
    """

    num_heads: int
    num_heads_k: int
    qhpk: int
    headdim_v: int
    block_m: int
    block_n: int
    kernel_block_m: int
    kernel_block_n: int
    pack_s1: bool
    pack_split: bool
    kernel_pack_s1: bool
    kernel_pack_split: bool
    sort: bool
    swizzle: bool
    num_vectors: int
    has_semaphore: bool
    num_sm: int
    fixed_splits: Optional[int]
    table: tuple
    tail: int

    @cached_property
    def key(self) -> tuple:
        """Hashable identity (everything the encodings read); computed once per object (its fields are frozen)."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def metadata_size(self, batch_size: int) -> int:
        """nvec * b4 + semaphore (refmodel `Schedule.metadata_size`)."""
        return self.num_vectors * (-(-batch_size // 4) * 4) + int(self.has_semaphore)


_SKIP = {"num_splits", "pack_gqa", "kernel_pack_gqa", "inputs", "masking"}


def _schedule_fields(s) -> dict:
    """Decisions that must not depend on seqlen_k or S (window values, resolved from seqlen_k, are excluded)."""
    return {f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name not in _SKIP} | {
        "metadata_size": s.metadata_size, "is_causal": s.masking.is_causal, "is_local": s.masking.is_local}


def _with_seqlen_k(inputs: ScheduleInputs, seqlen_k: int) -> ScheduleInputs:
    """``dataclasses.replace(inputs, seqlen_k=seqlen_k)`` without running ``__init__`` again (refmodel `with_inputs`)."""
    return with_inputs(inputs, seqlen_k=seqlen_k)


def splits_over_lengths(heuristic: Heuristic, inputs: ScheduleInputs, seqlen_ks: Sequence[int]) -> tuple[int, ...]:
    """`heuristic` of `inputs` at each static seqlen_k of `seqlen_ks`: by the heuristic's own `over_lengths` when it
    carries one, else one call per length (the two must agree; tests/oracle/test_split_table_one_pass.py checks both).

    An `over_lengths` copied from a wrapped function (``functools.wraps`` copies ``__dict__``) is not the
    wrapper's own: such a wrapper is called per length, so a defect it seeds is seen.
    """
    over = getattr(heuristic, "over_lengths", None)
    if over is not None and over is not getattr(getattr(heuristic, "__wrapped__", None), "over_lengths", None):
        return tuple(int(v) for v in over(inputs, seqlen_ks))
    return tuple(int(heuristic(_with_seqlen_k(inputs, L))) for L in seqlen_ks)


@lru_cache(maxsize=4096)
def _split_table(inputs: ScheduleInputs, heuristic: Heuristic, block_n: int) -> tuple[tuple, int]:
    """(table, tail): the split count for static n-blocks 0..cap, and the value beyond (checked at far points)."""
    cap = min(HEURISTIC_MAX_SPLITS, inputs.num_sm)

    base = with_inputs(inputs, num_splits=0)
    far_points = (cap + 1, cap + 7, (2 ** 20) // block_n)
    n_blocks = [*range(cap + 1), *far_points]
    values = splits_over_lengths(heuristic, base, [n * block_n for n in n_blocks])
    table = tuple(int(v) for v in values[:cap + 1])
    tail = table[-1]
    for far in values[cap + 1:]:
        # beyond the cap the heuristic must not depend on seqlen_k (it would through the 50 MiB L2 branch)
        if int(far) != tail:
            raise NotImplementedError(
                f"split heuristic depends on seqlen_k beyond its cap (L2 branch active) for {inputs}")
    return table, tail


@lru_cache(maxsize=4096)
def _side_params_cached(inputs: ScheduleInputs, heuristic: Heuristic) -> SideParams:
    s1 = resolve_schedule(with_inputs(inputs, num_splits=1))
    s2 = resolve_schedule(with_inputs(inputs, num_splits=2))
    if _schedule_fields(s1) != _schedule_fields(s2):
        raise NotImplementedError(f"FA3 decisions other than pack depend on the split count here: {inputs}")
    cap = min(HEURISTIC_MAX_SPLITS, inputs.num_sm)
    if inputs.num_splits > 0:
        table, tail = (inputs.num_splits,), inputs.num_splits
    else:
        # get_num_splits does not read the precompute flag: both sides share one table
        table, tail = _split_table(with_inputs(inputs, precompute=True), heuristic, s1.block_n)
        for n in (1, cap + 1, (2 ** 20) // s1.block_n):
            far_sched = resolve_schedule(with_inputs(inputs, seqlen_k=n * s1.block_n, num_splits=1))
            if _schedule_fields(far_sched) != _schedule_fields(s1):
                raise NotImplementedError(f"FA3 decisions depend on seqlen_k for {inputs}")
    return SideParams(
        num_heads=inputs.num_heads, num_heads_k=inputs.num_heads_k, qhpk=s1.qhead_per_khead,
        headdim_v=inputs.headdim_v, block_m=s1.block_m, block_n=s1.block_n, kernel_block_m=s1.kernel_block_m,
        kernel_block_n=s1.kernel_block_n, pack_s1=s1.pack_gqa, pack_split=s2.pack_gqa,
        kernel_pack_s1=s1.kernel_pack_gqa, kernel_pack_split=s2.kernel_pack_gqa, sort=s1.sort, swizzle=s1.swizzle,
        num_vectors=s1.num_vectors, has_semaphore=s1.needs_semaphore, num_sm=inputs.num_sm,
        fixed_splits=inputs.num_splits if inputs.num_splits > 0 else None, table=table, tail=tail)


def side_params(inputs: ScheduleInputs, heuristic: Heuristic = get_num_splits) -> SideParams:
    """SideParams of one side, from refmodel: tiles, pack for S == 1 / S > 1, layout, and the split table.

    `inputs.seqlen_k` is ignored (it is the symbolic part); `heuristic` defaults to refmodel `get_num_splits`
    (flash_api.cpp) and is only replaced by tests seeding a defect.
    """
    return _side_params_of(inputs, heuristic)


@lru_cache(maxsize=65536)
def _side_params_of(inputs: ScheduleInputs, heuristic: Heuristic) -> SideParams:
    return _side_params_cached(with_inputs(inputs, seqlen_k=0), heuristic)


def clear_caches() -> None:
    """Forget every refmodel-derived table this module memoises (for a counterfactual that swaps a refmodel function)."""
    for cached in (_side_params_of, _side_params_cached, _split_table, _runs, _capacity_table):
        cached.cache_clear()


def sym_split_count(side: SideParams, n_blocks_static, fixed=None):
    """The side's split count S: the num_splits argument, else the heuristic table at the static n-blocks (flash_api.cpp `get_num_splits`).

    `fixed` (a z3 term) replaces a positive num_splits argument by a symbolic value in 1..256.
    """
    if side.fixed_splits is not None:
        return _t(fixed) if fixed is not None else bv(side.fixed_splits)
    return table_lookup(n_blocks_static, side.table, side.tail)


def sym_pack(side: SideParams, split_count, kernel: bool = False):
    """PackGQA for split count S: the S > 1 decision or the S == 1 one (flash_api.cpp `get_pack_gqa`, `run_mha_fwd`)."""
    a, b = (side.kernel_pack_split, side.kernel_pack_s1) if kernel else (side.pack_split, side.pack_s1)
    if a == b:
        return boolval(a)
    return z3.If(_t(split_count) > bv(1), boolval(a), boolval(b))


def sym_prepare_splits(side: SideParams, split_count, seqused_k: Sequence, seqlens_q: Sequence, active: Sequence,
                       multi_cta=False):
    """Per-batch split counts and m-blocks of the prepare step, in batch order (refmodel prepare.py `prepare_scheduler`).

    `active[i]` says batch i exists (i < b); inactive batches contribute nothing to the total. The sort only
    permutes (split, m_blocks, batch) tuples together, so per-batch properties are checked in batch order.
    Returns (splits, m_blocks, blocks_per_sm).
    """
    pack = sym_pack(side, split_count)
    prep_heads = z3.If(pack, bv(side.num_heads_k), bv(side.num_heads))
    n = [z3.If(a, sym_n_blocks(k, side.block_n), bv(0)) for k, a in zip(seqused_k, active)]
    m = [z3.If(a, sym_m_blocks(q, side.qhpk, pack, side.block_m), bv(0)) for q, a in zip(seqlens_q, active)]
    total = bv(0)
    for mi, ni in zip(m, n):
        total = total + (ni if _is_one(mi) else mi * ni)
    bps = sym_blocks_per_sm(total, prep_heads, side.num_sm)
    one_split = z3.Or(_t(split_count) == bv(1), boolval(multi_cta) if isinstance(multi_cta, bool) else multi_cta)
    splits = [z3.If(one_split, bv(1), sym_dynamic_split(ni, bps, split_count)) for ni in n]
    return splits, m, bps


def _is_one(term) -> bool:
    return z3.is_bv_value(term) and term.as_long() == 1


def evaluate_term(term, assignment: dict):
    """Evaluate a z3 term with concrete values substituted (`assignment` maps z3 constants to ints/bools)."""
    subs = [(k, z3.BitVecVal(int(v), k.size(), k.ctx) if z3.is_bv(k) else z3.BoolVal(bool(v), k.ctx))
            for k, v in assignment.items()]
    out = z3.simplify(z3.substitute(term, *subs) if subs else term)
    if z3.is_bv_value(out):
        v = out.as_long()
        return v - (1 << BV) if v >= 1 << (BV - 1) else v
    if z3.is_true(out) or z3.is_false(out):
        return z3.is_true(out)
    raise ValueError(f"term did not simplify to a value: {out}")


def solver(timeout_s: float, seed: int = 0, logic: Optional[str] = None) -> z3.Solver:
    """A z3 solver with a fixed seed and each check bounded by `timeout_s` of work (deterministic under load);
    ``logic`` (e.g. "QF_BV") asks for z3's solver for that logic instead of its default one."""
    s = z3.SolverFor(logic, ctx=_ctx()) if logic else z3.Solver(ctx=_ctx())
    s.set("ctrl_c", False)  # SIGINT reaches Python (the run stops, exit 3), never an "unknown" read as an answer
    bound(s, timeout_s)
    s.set("random_seed", seed)
    return s
