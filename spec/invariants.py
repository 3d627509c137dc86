"""Metadata-consistency invariants between a precompute and the call that consumes its metadata.

Vocabulary: the *precompute* P is a `get_scheduler_metadata(...)` call, modelled by refmodel as a resolved
`Schedule` (`P_sched`) and the prepare step's `PrepareResult` (`P_result`); the *call* C is the
`flash_attn_with_kvcache(..., scheduler_metadata=md)` call, modelled as its own resolved `Schedule`
(`C_sched`, from `refmodel.call_inputs`) plus its per-batch lengths (`call_lengths`). FA3 checks only the
metadata's shape (`hopper/flash_api.cpp`, `CHECK_SHAPE(scheduler_metadata, metadata_size)`); everything else
in `md` is trusted. The invariants below say what "trusting md" needs.

What the call reads from `md` is modelled exactly as FA3 does: the precompute's tensor (refmodel
`encode_metadata`, unwritten slots = `UNWRITTEN`) decoded with the *call's* layout (`decode_metadata` with
the call's b, Sort, Swizzle), for virtual batches `0 .. b_c-1`.

`SHAPE` is special: a size mismatch makes FA3 raise (loud and safe), so it is reported as the outcome
"shape_error", never as a Violation; when the shapes differ no other invariant is evaluated.

Relations between the invariants (proved in `spec.theorems.metadata`, cheap to state here):
`kMax(S_c, dv) >= S_c` for every S_c in 1..256, so SPLIT_BOUND implies COMBINE_CAPACITY; KV_COVER holds by
FA3's design for every split count >= 1 (lemma "kv-cover").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from refmodel.fa3_scheduler import Schedule, ScheduleInputs, ceil_div, combine_capacity, resolve_schedule
from refmodel.kv_blocks import kv_block_bounds, split_block_range
from refmodel.metadata_layout import UNWRITTEN, DecodedMetadata, decode_values_for_schedule, encode_metadata_values
from refmodel.prepare import PrepareResult, prepare_scheduler

from spec.violation import Violation
from spec.finding import Outcome

__all__ = [
    "Violation", "CallLengths", "Evaluation", "InvariantInfo", "INVARIANTS", "SILENT_INVARIANTS",
    "check_shape", "check_split_bound", "check_combine_capacity", "check_batch_permutation",
    "check_query_cover", "check_kv_cover", "check_all", "evaluate", "SAFE", "metadata_for",
    "read_metadata", "invariant_table_markdown", "evaluate_inputs",
]

RangeFn = Callable[[int, int, int, int], tuple[int, int]]


@dataclass(frozen=True)
class CallLengths:
    """Per-batch lengths of the call: cache lengths (`cache_seqlens` = seqused_k) and query rows.

    `seqlens_q` defaults to the call's static seqlen_q for every batch (1 in decode).
    """

    seqused_k: tuple
    seqlens_q: Optional[tuple] = None

    @classmethod
    def coerce(cls, value: Any, batch_size: int, default_q: int) -> "CallLengths":
        """Accept a CallLengths, a mapping {"seqused_k"|"cache_seqlens", "seqlens_q"} or a plain list of cache lengths."""
        if isinstance(value, CallLengths):
            out = value
        elif isinstance(value, Mapping):
            k = value.get("seqused_k", value.get("cache_seqlens"))
            if k is None:
                raise ValueError("call_lengths: mapping needs 'seqused_k' (or 'cache_seqlens')")
            q = value.get("seqlens_q")
            out = cls(tuple(int(x) for x in _as_list(k)), None if q is None else tuple(int(x) for x in _as_list(q)))
        else:
            out = cls(tuple(int(x) for x in _as_list(value)))
        if len(out.seqused_k) != batch_size:
            raise ValueError(f"call_lengths.seqused_k: expected {batch_size} entries (the call's batch), "
                             f"got {len(out.seqused_k)}")
        if out.seqlens_q is None:
            out = cls(out.seqused_k, tuple([int(default_q)] * batch_size))
        elif len(out.seqlens_q) != batch_size:
            raise ValueError(f"call_lengths.seqlens_q: expected {batch_size} entries, got {len(out.seqlens_q)}")
        return out


def _as_list(x) -> list:
    return list(x.tolist()) if hasattr(x, "tolist") else list(x)


@dataclass(frozen=True)
class _Ctx:
    """What the call sees: its schedule, lengths, and the metadata decoded with its own layout."""

    P: Schedule
    R: PrepareResult
    C: Schedule
    lengths: CallLengths
    md: DecodedMetadata

    @property
    def b(self) -> int:
        """The call's batch size b_c."""
        return self.C.inputs.batch_size

    @property
    def split(self) -> bool:
        """The call runs the Split kernel (S_c > 1); otherwise md's split counts are ignored."""
        return self.C.num_splits > 1

    def actual_batch(self, vb: int) -> Optional[int]:
        """Actual batch of virtual batch vb (batch_idx[vb] when Sort), or None when that is not a valid batch."""
        bb = self.md.batch_idx[vb] if self.C.sort else vb
        return bb if 0 <= bb < self.b else None


def read_metadata(P_sched: Schedule, P_result: PrepareResult, C_sched: Schedule) -> DecodedMetadata:
    """The vectors the call reads: P's tensor (unwritten slots UNWRITTEN) decoded with C's layout (flash_api.cpp).

    The tensor is read as its int32 values (refmodel.metadata_layout: slot for slot refmodel.metadata's tensor).
    """
    values = encode_metadata_values(P_sched, P_result)
    need = C_sched.num_vectors * C_sched.b4
    if len(values) < need:  # only reachable when SHAPE fails; pad so decoding never raises
        values = values + [UNWRITTEN] * (need - len(values))
    return decode_values_for_schedule(values, C_sched)   # C's layout, under C's FA3 build (refmodel.fa3_builds)


def _ctx(P_sched, P_result, C_sched, call_lengths) -> _Ctx:
    lengths = CallLengths.coerce(call_lengths, C_sched.inputs.batch_size, C_sched.inputs.seqlen_q)
    return _Ctx(P_sched, P_result, C_sched, lengths, read_metadata(P_sched, P_result, C_sched))


# ------------------------------------------------------------------------------------------------------------
# The invariants
# ------------------------------------------------------------------------------------------------------------


def check_shape(P_sched: Schedule, P_result: PrepareResult, C_sched: Schedule, call_lengths=None) -> list[Violation]:
    """SHAPE: the metadata size the call expects equals the size the precompute produced (flash_api.cpp CHECK_SHAPE).

    A mismatch is FA3's loud TORCH_CHECK failure: safe. `evaluate` reports it as outcome "shape_error"; this
    function returns it as a pseudo-violation so callers can see the two sizes.
    """
    if C_sched.metadata_size == 0:
        return []  # neither semaphore nor prepare: FA3 ignores scheduler_metadata
    if P_sched.metadata_size != C_sched.metadata_size:
        return [Violation("SHAPE", None, {"produced": P_sched.metadata_size, "expected": C_sched.metadata_size},
                          f"metadata has {P_sched.metadata_size} int32 values but the call expects "
                          f"{C_sched.metadata_size} (nvec*b4 + semaphore): FA3 raises, a loud and safe error")]
    return []


def check_split_bound(P_sched: Schedule, P_result: PrepareResult, C_sched: Schedule, call_lengths) -> list[Violation]:
    """SPLIT_BOUND: if S_c > 1, every split count the call reads from md is <= S_c (tile_scheduler.hpp, flash_api.cpp out_accum[S_c]).

    The split kernel writes out_accum/lse_accum[split] for split < md.num_splits[vb] and the combine reads them;
    both buffers hold S_c splits (mha_fwd allocates them from the call's own num_splits).
    """
    return _check_split_bound(_ctx(P_sched, P_result, C_sched, call_lengths))


def _check_split_bound(c: _Ctx) -> list[Violation]:
    C_sched = c.C
    if not c.split:
        return []
    out = []
    for vb in range(c.b):
        s = c.md.num_splits[vb]
        if s != UNWRITTEN and s > C_sched.num_splits:
            bb = c.actual_batch(vb)
            out.append(Violation("SPLIT_BOUND", bb, {"virtual_batch": vb, "metadata_splits": s,
                                                    "call_splits": C_sched.num_splits,
                                                    "out_of_bounds_splits": [C_sched.num_splits, s - 1]},
                                 f"batch {bb} (virtual {vb}) has {s} splits in the metadata but the call's "
                                 f"partial buffers hold S_c={C_sched.num_splits}: splits {C_sched.num_splits}..{s - 1} "
                                 f"are written and read out of bounds"))
    return out


def check_combine_capacity(P_sched: Schedule, P_result: PrepareResult, C_sched: Schedule, call_lengths) -> list[Violation]:
    """COMBINE_CAPACITY: if S_c > 1, every split count read from md is <= kMax(S_c, dv) (flash_fwd_combine_kernel.h, _launch_template.h).

    The combine loads LSE slots si < kMax only, and only those with si < num_splits: with a split count of exactly
    kMax every split is read, so the bound is `<=` (a count above kMax silently drops splits kMax..count-1).
    """
    return _check_combine_capacity(_ctx(P_sched, P_result, C_sched, call_lengths))


def _check_combine_capacity(c: _Ctx) -> list[Violation]:
    C_sched = c.C
    if not c.split:
        return []
    k_max = combine_capacity(C_sched.num_splits, C_sched.inputs.headdim_v)
    out = []
    for vb in range(c.b):
        s = c.md.num_splits[vb]
        if s != UNWRITTEN and s > k_max:
            bb = c.actual_batch(vb)
            out.append(Violation("COMBINE_CAPACITY", bb, {"virtual_batch": vb, "metadata_splits": s, "k_max": k_max,
                                                         "call_splits": C_sched.num_splits},
                                 f"batch {bb} has {s} splits but the combine reads at most kMax={k_max} "
                                 f"(S_c={C_sched.num_splits}, dv={C_sched.inputs.headdim_v}): splits {k_max}..{s - 1} "
                                 f"are ignored"))
    return out


def check_batch_permutation(P_sched: Schedule, P_result: PrepareResult, C_sched: Schedule, call_lengths) -> list[Violation]:
    """BATCH_PERMUTATION: the call reads only written md slots, and with Sort batch_idx[0:b_c] is a permutation of 0..b_c-1 (tile_scheduler.hpp).

    Slots read per virtual batch vb < b_c: num_m_blocks always, num_splits when S_c > 1, varlen_batch_idx when
    Sort, num_nheads_in_l2 when Swizzle (flash_api.cpp wires these pointers; tile_scheduler.hpp reads them).
    """
    return _check_batch_permutation(_ctx(P_sched, P_result, C_sched, call_lengths))


def _check_batch_permutation(c: _Ctx) -> list[Violation]:
    C_sched = c.C
    vectors = [("num_m_blocks", c.md.num_m_blocks)]
    if c.split:
        vectors.insert(0, ("num_splits", c.md.num_splits))
    if C_sched.sort:
        vectors.append(("batch_idx", c.md.batch_idx))
    if C_sched.swizzle and c.md.nheads_in_l2 is not None:   # the fork before 5824e6e2 stores no heads-in-L2
        vectors.append(("nheads_in_l2", c.md.nheads_in_l2))
    out = []
    for vb in range(c.b):
        for name, vec in vectors:
            if vec[vb] == UNWRITTEN:
                out.append(Violation("BATCH_PERMUTATION", None, {"virtual_batch": vb, "vector": name},
                                     f"the call reads {name}[{vb}], a slot the precompute never wrote "
                                     f"(precompute b={c.P.inputs.batch_size}, call b={c.b})"))
    if C_sched.sort:
        order = [c.md.batch_idx[vb] for vb in range(c.b)]
        written = [x for x in order if x != UNWRITTEN]
        outside = sorted({x for x in written if not 0 <= x < c.b})
        missing = sorted(set(range(c.b)) - set(written))
        dup = sorted({x for x in written if written.count(x) > 1})
        if outside or missing or dup:
            out.append(Violation("BATCH_PERMUTATION", missing[0] if missing else None,
                                 {"batch_idx": order, "outside": outside, "missing": missing, "duplicated": dup},
                                 f"varlen_batch_idx[0:{c.b}] = {order} is not a permutation of 0..{c.b - 1}: "
                                 f"batches {missing} are never computed, indices {outside} read past the call's batch"))
    return out


def check_query_cover(P_sched: Schedule, P_result: PrepareResult, C_sched: Schedule, call_lengths) -> list[Violation]:
    """QUERY_COVER: md.num_m_blocks[vb] * kernel kBlockM covers the call's rows of batch_idx[vb] (tile_scheduler.hpp Prepared, flash_api.cpp run_mha_fwd).

    Rows are Lq * qhpk with the kernel's PackGQA (forced for Split and paged non-TMA) and the kernel tile comes
    from the template head dims (`kernel_headdims`), not from the host's rounded dims.
    """
    return _check_query_cover(_ctx(P_sched, P_result, C_sched, call_lengths))


def _check_query_cover(c: _Ctx) -> list[Violation]:
    C_sched = c.C
    qhpk = C_sched.qhead_per_khead if C_sched.kernel_pack_gqa else 1
    out = []
    for vb in range(c.b):
        bb = c.actual_batch(vb)
        m = c.md.num_m_blocks[vb]
        if bb is None or m == UNWRITTEN:
            continue  # reported by BATCH_PERMUTATION
        if c.split and c.md.num_splits[vb] != UNWRITTEN and c.md.num_splits[vb] <= 0:
            m = 0  # the scheduler gives the batch m_blocks * splits = 0 tiles
        rows = c.lengths.seqlens_q[bb] * qhpk
        if m * C_sched.kernel_block_m < rows:
            out.append(Violation("QUERY_COVER", bb, {"virtual_batch": vb, "metadata_m_blocks": m,
                                                    "kernel_block_m": C_sched.kernel_block_m, "rows": rows,
                                                    "uncovered_rows": [max(m, 0) * C_sched.kernel_block_m, rows - 1]},
                                 f"batch {bb}: md gives {m} m-blocks of {C_sched.kernel_block_m} rows but the call has "
                                 f"{rows} (packed) query rows: rows {max(m, 0) * C_sched.kernel_block_m}..{rows - 1} "
                                 f"are never computed"))
    return out


def check_kv_cover(P_sched: Schedule, P_result: PrepareResult, C_sched: Schedule, call_lengths,
                   range_fn: RangeFn = split_block_range) -> list[Violation]:
    """KV_COVER: for every batch and m-block, the union of the call's split ranges covers [n_min, n_max) (block.h).

    The ranges use the call's own lengths and kernel tiles with the split count from md (1 when S_c == 1), so
    stale cache_seqlens never leave keys uncovered; `range_fn` lets tests inject a defective range formula.
    """
    return _check_kv_cover(_ctx(P_sched, P_result, C_sched, call_lengths), range_fn)


def _check_kv_cover(c: _Ctx, range_fn: RangeFn = split_block_range) -> list[Violation]:
    C = c.C
    pack = C.kernel_pack_gqa
    qhpk = C.qhead_per_khead
    out = []
    for vb in range(c.b):
        bb = c.actual_batch(vb)
        if bb is None:
            continue
        splits = c.md.num_splits[vb] if c.split else 1
        if splits == UNWRITTEN or splits < 1:
            continue
        lq, lk = c.lengths.seqlens_q[bb], c.lengths.seqused_k[bb]
        rows = lq * (qhpk if pack else 1)
        seen = set()
        for m in range(ceil_div(rows, C.kernel_block_m)):
            n_min, n_max = kv_block_bounds(m, lq, lk, C.kernel_block_m, C.kernel_block_n, C.masking.is_causal,
                                           C.inputs.window_size if C.masking.is_local else (-1, -1),
                                           qhpk if pack else 1)
            if (n_min, n_max) in seen:
                continue
            seen.add((n_min, n_max))
            covered = set()
            for s in range(splits):
                lo, hi = range_fn(n_min, n_max, splits, s)
                covered.update(range(max(lo, n_min), min(hi, n_max)))
            missing = sorted(set(range(n_min, n_max)) - covered)
            if missing:
                out.append(Violation("KV_COVER", bb, {"virtual_batch": vb, "m_block": m, "n_block_range": [n_min, n_max],
                                                     "splits": splits, "uncovered_blocks": missing[:16]},
                                     f"batch {bb}, m-block {m}: {splits} splits leave KV blocks {missing[:8]} of "
                                     f"[{n_min}, {n_max}) uncovered"))
    return out


@dataclass(frozen=True)
class InvariantInfo:
    """Registry entry: the check function, its one-sentence statement, and the FA3 source it follows."""

    name: str
    function: Callable[..., list]
    statement: str
    fa3_source: str
    silent: bool = True


INVARIANTS: dict[str, InvariantInfo] = {
    "SHAPE": InvariantInfo(
        "SHAPE", check_shape,
        "The metadata size the call expects (nvec*b4 + semaphore) equals the size produced; a mismatch raises (safe).",
        "hopper/flash_api.cpp mha_fwd: CHECK_SHAPE(scheduler_metadata, metadata_size)", silent=False),
    "SPLIT_BOUND": InvariantInfo(
        "SPLIT_BOUND", check_split_bound,
        "If the call's split count S_c > 1, every per-batch split count it reads from md is <= S_c.",
        "hopper/flash_api.cpp (out_accum/softmax_lse_accum sized by params.num_splits); "
        "hopper/tile_scheduler.hpp VarlenDynamicPersistentTileScheduler (num_splits_dynamic_ptr[bidb])"),
    "COMBINE_CAPACITY": InvariantInfo(
        "COMBINE_CAPACITY", check_combine_capacity,
        "If S_c > 1, every per-batch split count is <= kMax(S_c, dv), the most splits the combine reads.",
        "hopper/flash_fwd_combine_launch_template.h run_mha_fwd_combine_ (kLogMaxSplits by params.num_splits); "
        "hopper/flash_fwd_combine_kernel.h (loads LSE slot si only if si < num_splits, si < kMaxSplits)"),
    "BATCH_PERMUTATION": InvariantInfo(
        "BATCH_PERMUTATION", check_batch_permutation,
        "The call reads only written md slots, and with Sort varlen_batch_idx[0:b_c] is a permutation of 0..b_c-1.",
        "hopper/flash_api.cpp (vector offsets by b_rounded); hopper/flash_prepare_scheduler.cu (writes b entries); "
        "hopper/tile_scheduler.hpp get_actual_batch"),
    "QUERY_COVER": InvariantInfo(
        "QUERY_COVER", check_query_cover,
        "For every batch, md's m-blocks times the kernel's kBlockM cover the call's (packed) query rows.",
        "hopper/tile_scheduler.hpp (Prepared: num_m_blocks_ptr); hopper/flash_api.cpp run_mha_fwd (PackGQA forced) "
        "and run_mha_fwd_constexpr (kernel head dims); hopper/tile_size.h"),
    "KV_COVER": InvariantInfo(
        "KV_COVER", check_kv_cover,
        "For every batch and m-block, the call's split ranges together cover every KV block it must visit.",
        "hopper/block.h get_n_block_min_max (split ranges from the call's own lengths)"),
}

SILENT_INVARIANTS = tuple(name for name, info in INVARIANTS.items() if info.silent)


@dataclass(frozen=True)
class Evaluation:
    """Outcome of one (P, C) pair: "shape_error" (loud, safe), "violation" (silent, unsafe) or "pass".

    From `evaluate_inputs` also: "rejected" (a TORCH_CHECK refuses the precompute or the call: loud, safe) and
    "process_abort" (FA3 ends the process, e.g. a precompute of zero batches: loud, but not safe for a server).
    """

    outcome: str
    violations: list
    shape: list
    message: str = ""

    @property
    def safe(self) -> bool:
        """SAFE(P, C): no silent violation and the process survives (a shape error or a rejection is loud and safe)."""
        return self.outcome not in (Outcome.VIOLATION, Outcome.PROCESS_ABORT)


def evaluate(P_sched: Schedule, P_result: PrepareResult, C_sched: Schedule, call_lengths,
             range_fn: RangeFn = split_block_range) -> Evaluation:
    """Evaluate SHAPE then every silent invariant (FA3: hopper/flash_api.cpp, tile_scheduler.hpp, combine kernel)."""
    shape = check_shape(P_sched, P_result, C_sched, call_lengths)
    if shape:
        return Evaluation(Outcome.SHAPE_ERROR, [], shape)
    if C_sched.metadata_size == 0:
        return Evaluation(Outcome.PASS, [], [])
    c = _ctx(P_sched, P_result, C_sched, call_lengths)
    out: list[Violation] = (_check_split_bound(c) + _check_combine_capacity(c) + _check_batch_permutation(c)
                            + _check_query_cover(c) + _check_kv_cover(c, range_fn))
    return Evaluation(Outcome.VIOLATION if out else Outcome.PASS, out, [])


def evaluate_inputs(P_inputs: ScheduleInputs, C_inputs: ScheduleInputs, cache_seqlens: Sequence[int],
                    call_lengths, seqlens_q: Optional[Sequence[int]] = None,
                    range_fn: RangeFn = split_block_range) -> Evaluation:
    """Evaluate a precompute and a call from their inputs, FA3's rejections and process aborts included.

    The precompute runs first (refmodel `schedule_and_prepare`'s checks, flash_api.cpp 548-550, 659), then the
    call's checks (mha_fwd); a rejection on either side is "rejected" (safe), an abort "process_abort" (unsafe).
    """
    from refmodel.errors import FA3Rejected, ProcessAbort
    from refmodel.prepare import launch_check

    try:
        P_sched = resolve_schedule(P_inputs)
        launch_check(P_inputs.batch_size)
        P_result = prepare_scheduler(P_sched, [int(x) for x in cache_seqlens],
                                     seqlens_q=None if seqlens_q is None else [int(x) for x in seqlens_q])
        C_sched = resolve_schedule(C_inputs)
    except FA3Rejected as exc:
        return Evaluation(Outcome.REJECTED, [], [], str(exc))
    except ProcessAbort as exc:
        return Evaluation(Outcome.PROCESS_ABORT, [], [], str(exc))
    return evaluate(P_sched, P_result, C_sched, call_lengths, range_fn)


def check_all(P_sched: Schedule, P_result: PrepareResult, C_sched: Schedule, call_lengths,
              range_fn: RangeFn = split_block_range) -> list[Violation]:
    """Every silent-invariant violation of the call consuming P's metadata; [] when SHAPE fails (FA3 raises: safe)."""
    return evaluate(P_sched, P_result, C_sched, call_lengths, range_fn).violations


def SAFE(P_sched: Schedule, P_result: PrepareResult, C_sched: Schedule, call_lengths,
         range_fn: RangeFn = split_block_range) -> bool:
    """SAFE(P, C): the conjunction of the silent invariants, or a loud shape error."""
    return evaluate(P_sched, P_result, C_sched, call_lengths, range_fn).safe


def metadata_for(P_inputs: ScheduleInputs, cache_seqlens: Sequence[int],
                 seqlens_q: Optional[Sequence[int]] = None) -> tuple[Schedule, PrepareResult]:
    """(Schedule, PrepareResult) of a precompute: refmodel resolve_schedule + prepare_scheduler (flash_api.cpp)."""
    sched = resolve_schedule(P_inputs)
    return sched, prepare_scheduler(sched, [int(x) for x in cache_seqlens],
                                    seqlens_q=None if seqlens_q is None else [int(x) for x in seqlens_q])


def invariant_table_markdown() -> str:
    """A markdown table of the registry (name, statement, FA3 source) for the docs."""
    lines = ["| invariant | statement | FA3 source |", "|---|---|---|"]
    for info in INVARIANTS.values():
        lines.append(f"| `{info.name}` | {info.statement} | {info.fa3_source} |")
    return "\n".join(lines)
