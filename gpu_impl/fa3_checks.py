"""The checks of one metadata hand-off, over recorded precompute and call (re-exported by gpu_impl.fa3_calls).

Invariant (one sentence): :func:`quick_check` reports, from shapes and scalars alone, every mismatch the
sufficient conditions of docs/sanitize.md decide (SHAPE, BATCH_PERMUTATION, ``S_p <= S_c or S_c == 1``,
QUERY_COVER, METADATA_ORIGIN); :func:`deep_check` runs ``spec.invariants.check_all`` on the tile plan the call
builds from the metadata; :func:`graph_replay_check` is the quick check as a CUDA-graph replay uses the
recompute. Every formula comes from refmodel or gpu_impl.kernels.base; nothing is re-derived here.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from refmodel.fa3_scheduler import PREPARE_MAX_BATCH_ONE_CTA, Schedule, combine_capacity
from refmodel.fa3_builds import empty_row_split_count
from refmodel.metadata import get_scheduler_metadata as ref_get_scheduler_metadata
from refmodel.metadata_layout import UNWRITTEN, read_past_write
from refmodel.prepare import m_blocks_for
from spec.violation import Violation

from .errors import MetadataShapeError
from .fa3_arguments import ARGUMENTS_INVARIANT
from .fa3_records import CallRecord, PrecomputeRecord, call_schedule_of, precompute_schedule
from .kernels.base import build_tile_plan, check_plan

__all__ = ["quick_check", "deep_check", "pair_summary", "violation_signature", "captured_call_for",
           "graph_replay_check", "origin_violation", "padded_replay_read"]

# ------------------------------------------------------------------------------------------------------------
# The checks
# ------------------------------------------------------------------------------------------------------------


def origin_violation(call: CallRecord) -> Violation:
    return Violation("METADATA_ORIGIN", None, {"metadata_numel": call.metadata_numel},
                     f"{call.function} was given a scheduler_metadata tensor ({call.metadata_numel} int32) that was not "
                     f"produced by a recorded get_scheduler_metadata call (nor copied from one): its inputs are "
                     f"unknown, so nothing says it matches this call")


def quick_check(pre: Optional[PrecomputeRecord], call: CallRecord) -> list[Violation]:
    """Check a precompute against the call consuming its metadata from shapes and scalars only (no device sync).

    * SHAPE: the precompute's metadata size, and the tensor's size, equal the size the call expects
      (``nvec*b4 + semaphore``); a mismatch is FA3's loud error, reported so the pair is seen; nothing else
      is checked then.
    * BATCH_PERMUTATION from the batch sizes: b_c > b_p reads slots the precompute never wrote; with Sort,
      b_c < b_p makes ``varlen_batch_idx[0:b_c]`` name batches the call does not have.
    * SPLIT_BOUND from ``S_p <= S_c or S_c == 1``. Sufficient for SPLIT_BOUND and COMBINE_CAPACITY: the
      prepare step clamps every per-batch split to ``min(ceil(n_blocks/blocks_per_sm), S_p)`` (all 1 when
      b_p > 992), so each split in md is <= S_p <= S_c, and ``kMax(S_c, dv) >= S_c`` for every S_c; with
      S_c == 1 FA3 ignores md's split counts. It is not necessary: a pair with S_p > S_c whose current lengths
      give small splits passes :func:`deep_check` (reported here as a mismatch the next skewed batch overflows).
    * QUERY_COVER from what the scalars allow: md's m-blocks (precompute tiles, unforced PackGQA, its qhpk)
      times the kernel's kBlockM cover the call's packed rows, per batch when both sides' query lengths are
      known (always for a non-varlen q), else for every length up to max_seqlen_q assuming the same
      cu_seqlens_q on both sides.

    ``pre=None`` (metadata of unknown origin) gives one METADATA_ORIGIN violation.
    """
    if not call.metadata_passed:
        return []
    if pre is None:
        return [origin_violation(call)]
    P = precompute_schedule(pre)
    C = call_schedule_of(call)
    expected = C.metadata_size
    if expected == 0:
        return []  # mha_fwd ignores scheduler_metadata
    sizes = {"produced": P.metadata_size, "expected": expected, "passed": call.metadata_numel}
    if P.metadata_size != expected or (call.metadata_numel is not None and call.metadata_numel != expected):
        return [Violation("SHAPE", None, sizes,
                          f"metadata of {call.metadata_numel} int32 values (precompute produces {P.metadata_size}) but "
                          f"the call expects {expected} (nvec*b4 + semaphore): FA3 raises, a loud and safe error")]
    if not call.kernel_runs or not C.inputs.uses_prepare:
        return []  # the kernels read no per-batch vectors (gpu_impl.kernels.base.check_plan)
    out: list[Violation] = []
    b_p, b_c = pre.batch_size, call.batch_size
    # per-batch slots exist only where the layout has per-batch vectors: the "semaphore-splits" builds without their
    # split vector (the num_splits argument 1, flash_api.cpp@a8937124 994) hold the semaphore alone
    if C.num_vectors and (b_c > b_p or (b_c < b_p and C.sort)):
        out.append(Violation(
            "BATCH_PERMUTATION", None, {"precompute_batch": b_p, "call_batch": b_c, "sort": C.sort},
            f"metadata computed for {b_p} sequences, call has {b_c}: "
            + (f"virtual batches {b_p}..{b_c - 1} read slots the precompute never wrote" if b_c > b_p else
               f"varlen_batch_idx[0:{b_c}] is a prefix of a sort of {b_p} batches, not a permutation of 0..{b_c - 1}")))
    s_c = C.num_splits
    s_p = 1 if b_p > PREPARE_MAX_BATCH_ONE_CTA else P.num_splits
    if s_c > 1 and s_p > s_c:
        k_max = combine_capacity(s_c, C.inputs.headdim_v)
        out.append(Violation(
            "SPLIT_BOUND", None, {"s_p": s_p, "s_c": s_c, "k_max": k_max, "possible_out_of_bounds_splits": [s_c, s_p - 1],
                                  "check": "S_p <= S_c or S_c == 1"},
            f"the precompute allows up to S_p={s_p} splits per batch but the call's partial buffers hold S_c={s_c} "
            f"(combine reads kMax={k_max}): any batch given more than {s_c} splits is written and read out of bounds"))
    out.extend(_quick_query_cover(pre, call, P, C))
    return out


def _quick_query_cover(pre: PrecomputeRecord, call: CallRecord, P: Schedule, C: Schedule) -> list[Violation]:
    qp, fp, bm_p = P.qhead_per_khead, P.pack_gqa, P.block_m
    qc, fc, bm_c = C.qhead_per_khead, C.kernel_pack_gqa, C.kernel_block_m

    def short(lq_p: int, lq_c: int) -> Optional[tuple]:
        have = m_blocks_for(lq_p, qp, fp, bm_p)
        need = m_blocks_for(lq_c, qc, fc, bm_c)
        return None if have >= need else (have, need)

    def violation(bb, lq_p, lq_c, have, need, assumed):
        rows = lq_c * (qc if fc else 1)
        return Violation("QUERY_COVER", bb, {"metadata_m_blocks": have, "m_blocks_needed": need,
                                             "kernel_block_m": bm_c, "rows": rows, "precompute_rows": lq_p,
                                             "uncovered_rows": [have * bm_c, rows - 1], "assumed_lengths": assumed},
                         f"{'batch ' + str(bb) if bb is not None else 'a batch'} of {lq_c} query rows: md gives "
                         f"{have} m-blocks (precompute kBlockM={bm_p}, pack={fp}, qhpk={qp}) but the call needs {need} "
                         f"of {bm_c} rows (pack={fc}, qhpk={qc}): rows {have * bm_c}..{rows - 1} are never computed")

    lq_c = call.seqlens_q
    if pre.cu_seqlens_q is not None:
        cu = pre.cu_seqlens_q
        lq_p = tuple(cu[i + 1] - cu[i] for i in range(pre.batch_size))
    elif not pre.has_cu_seqlens_q:
        lq_p = (pre.max_seqlen_q,) * pre.batch_size
    else:
        lq_p = None
    if lq_p is None and lq_c is not None:
        lq_p = lq_c          # same cu_seqlens_q assumed on both sides
    if lq_c is None and lq_p is not None:
        lq_c = lq_p
    if lq_p is not None:
        n = min(len(lq_p), len(lq_c))
        if n and len(set(lq_p[:n])) == 1 and len(set(lq_c[:n])) == 1:
            gap = short(lq_p[0], lq_c[0])
            return [] if gap is None else [violation(None, lq_p[0], lq_c[0], *gap, False)]
        for bb in range(n):
            gap = short(lq_p[bb], lq_c[bb])
            if gap is not None:
                return [violation(bb, lq_p[bb], lq_c[bb], *gap, False)]
        return []
    # Neither side's per-batch query lengths are on the host: any length L <= max_seqlen_q may occur.
    f_p, f_c = (qp if fp else 1), (qc if fc else 1)
    if f_p * bm_c >= f_c * bm_p:
        return []  # ceil(L*f_p/bm_p)*bm_c >= L*f_p*bm_c/bm_p >= L*f_c for every L
    first_bad = bm_p // math.gcd(f_p, bm_p)
    for L in range(1, min(call.seqlen_q, first_bad) + 1):
        gap = short(L, L)
        if gap is not None:
            return [violation(None, L, L, *gap, True)]
    return []


def deep_check(pre: Optional[PrecomputeRecord], call: CallRecord, metadata=None) -> list[Violation]:
    """The full ``spec.invariants.check_all`` for the call reading this metadata (gpu_impl.kernels.base
    ``build_tile_plan`` + ``check_plan``), with the call's own per-batch lengths.

    ``metadata``: a host copy of the tensor the call was given (a tensor or a list of ints), or None to recompute
    it from ``pre`` with refmodel (``get_scheduler_metadata``; needs the precompute's host lengths). The call must
    have been recorded with its host lengths (``read_tensors=True``). A size mismatch is reported as SHAPE.
    """
    if not call.metadata_passed:
        return []
    if metadata is None:
        if pre is None:
            return [origin_violation(call)]
        metadata = ref_get_scheduler_metadata(**pre.scheduler_kwargs())
    elif not isinstance(metadata, torch.Tensor):
        metadata = torch.tensor([int(x) for x in metadata], dtype=torch.int32)
    metadata = metadata.detach().to("cpu")
    C = call_schedule_of(call)
    try:
        plan = build_tile_plan(call.call_shape(), C, metadata, device=metadata.device)
    except MetadataShapeError as exc:
        return [Violation("SHAPE", None, {"produced": int(metadata.numel()), "expected": C.metadata_size},
                          f"{exc}: FA3 raises, a loud and safe error")]
    out = [] if pre is not None else [origin_violation(call)]
    return out + check_plan(plan)


def pair_summary(pre: Optional[PrecomputeRecord], call: CallRecord) -> dict:
    """What was passed to FA3 on both sides, normalised (used by conformance to compare engines)."""
    C = call_schedule_of(call)
    pre_part = None
    s_p = None
    if pre is not None:
        pre_part = {"batch_size": pre.batch_size, "max_seqlen_q": pre.max_seqlen_q, "max_seqlen_k": pre.max_seqlen_k,
                    "num_heads": pre.num_heads, "num_heads_k": pre.num_heads_k, "headdim": pre.headdim,
                    "headdim_v": pre.headdim_v_resolved, "page_size": pre.page_size, "causal": pre.causal,
                    "window_size": list(pre.window_size), "has_softcap": pre.has_softcap,
                    "num_splits": pre.num_splits, "qkv_dtype": pre.qkv_dtype}
        s_p = precompute_schedule(pre).num_splits
    call_part = {"batch_size": call.batch_size, "num_heads": call.num_heads, "num_heads_k": call.num_heads_k,
                 "headdim": call.headdim, "headdim_v": call.headdim_v, "seqlen_k": call.seqlen_k,
                 "page_size": call.page_size, "num_splits": call.num_splits, "causal": call.causal,
                 "window_size": list(call.window_size), "softcap": call.softcap, "dtype": call.dtype,
                 "metadata_passed": call.metadata_passed}
    return {"precomputed": pre is not None, "precompute": pre_part, "call": call_part, "s_p": s_p,
            "s_c": C.num_splits}


def violation_signature(pre: Optional[PrecomputeRecord], call: CallRecord, violations: Sequence[Violation]) -> tuple:
    """A key that is equal for the same mismatch seen again (invariants + both sides' scalars, not lengths).

    A cause alone (PRECOMPUTE_ARGUMENTS, no overflow on the call) is keyed by the arguments that differ, not by
    the step's lengths (``max_seqlen_k``, the page table's width), so it is warned about and written once."""
    names = tuple(sorted({v.invariant for v in violations}))
    if names == (ARGUMENTS_INVARIANT,):
        diffs = violations[0].detail.get("differences", [])
        return names, tuple((d["argument"],) if d["argument"] in ("max_seqlen_k", "causal/window_size")
                            else (d["argument"], str(d["precompute"]), str(d["call"])) for d in diffs)
    return (names, None if pre is None else pre.schedule_key()[1:], call.schedule_key()[1:])


def captured_call_for(calls: Sequence[CallRecord], batch_size: int) -> tuple:
    """``(calls, padded)``: the captured calls a replay with ``batch_size`` real rows runs.

    The captured calls of exactly that batch size; else those of the smallest captured size above it
    (``padded`` True): sglang's and vLLM's graph runners replay the smallest captured graph that holds the batch
    and fill the rest with padding rows (``gpu_impl.backend.cuda_graph_batch_size``; vLLM's
    ``cudagraph_capture_sizes``). ``([], False)`` when no captured call is that large.
    """
    exact = [c for c in calls if c.batch_size == batch_size]
    if exact:
        return exact, False
    larger = [c.batch_size for c in calls if c.batch_size > batch_size]
    if not larger:
        return [], False
    b = min(larger)
    return [c for c in calls if c.batch_size == b], True


def graph_replay_check(pre: PrecomputeRecord, call: CallRecord) -> list[Violation]:
    """:func:`quick_check` of a recompute written into a captured graph's metadata buffer, as the replay uses it.

    At a replay no host code runs: FA3's shape check does not fire, so a metadata size other than the captured
    call's (a padded batch whose ``round_up(b, 4)`` differs) is a silent layout mismatch, reported as SHAPE
    with that message; and the captured call's padding rows (batches ``b_p .. b_c - 1``) read slots this
    precompute did not write -- what they hold is the buffer's tail (zeroed by vLLM, the previous recompute's in
    sglang), which only a deep check reads, so that BATCH_PERMUTATION verdict is left to it. Everything else
    (SPLIT_BOUND against the captured S_c, QUERY_COVER) is checked for the real rows.
    """
    out = []
    for v in quick_check(pre, call):
        if v.invariant == "SHAPE":
            v = Violation("SHAPE", None, dict(v.detail, replay=True),
                          f"the recompute wrote {v.detail.get('produced')} int32 values (metadata of {pre.batch_size} "
                          f"sequences) into the buffer of a graph captured for {call.batch_size}, which reads "
                          f"{v.detail.get('expected')}: at a replay FA3 checks nothing, so the captured kernel reads "
                          f"the vectors at the captured layout's offsets (a silent layout mismatch)")
        elif v.invariant == "BATCH_PERMUTATION" and call.batch_size > pre.batch_size:
            continue
        out.append(v)
    return out


def padded_replay_read(pre: Optional[PrecomputeRecord], call: CallRecord, metadata) -> Optional[list[Violation]]:
    """The exact verdict on a CUDA-graph replay whose captured call reads more metadata than the recompute wrote.

    ``metadata``: the int32 the captured call reads (a host copy of the persistent buffer's view, the call's own
    size: at a replay FA3 checks nothing). Where the build's empty-row rule decides the slots past the write
    (refmodel.metadata_layout ``read_past_write``: the "semaphore-splits" builds, a split count per padded row with
    no query tokens), returns the violations of those slots: [] when every one holds the build's empty-row split
    count (0: the row gets no tiles and the combine skips it; ``refmodel.fa3_builds.empty_row_split_count``), else
    PADDED_ROWS_READ_DEFINED for a slot holding refmodel's UNWRITTEN (no one wrote it) and
    READS_OWN_STEP_METADATA for any other value (the step's copy wrote 1 + b values and zeroed nothing there: a
    split count left by an earlier step, for which FA3 schedules tiles of a padded row). None where the rule does not
    apply (another layout, a call that does not split, a slot of a row with query tokens): the size difference
    stays the replay's SHAPE.
    """
    if pre is None or not call.metadata_passed or call.seqlens_q is None:
        return None
    P, C = precompute_schedule(pre), call_schedule_of(call)
    values = [int(v) for v in (metadata.reshape(-1).tolist() if isinstance(metadata, torch.Tensor) else metadata)]
    past = read_past_write(C, P.metadata_size, values, call.seqlens_q)
    if past is None:
        return None
    empty = empty_row_split_count(C.inputs.build)
    unwritten = [row for row, value, ok in past if not ok and value == UNWRITTEN]
    stale = [(row, value) for row, value, ok in past if not ok and value != UNWRITTEN]
    out = []
    if unwritten:
        out.append(Violation("PADDED_ROWS_READ_DEFINED", None,
                             {"virtual_batches": unwritten, "batch": call.batch_size, "path": "replay"},
                             f"the replay reads split counts no precompute wrote for padded rows {unwritten[:8]} of "
                             f"{call.batch_size} (the recompute covered {pre.batch_size})"))
    if stale:
        out.append(Violation("READS_OWN_STEP_METADATA", None,
                             {"padded_rows": [r for r, _ in stale], "split_counts": [v for _, v in stale],
                              "written": P.metadata_size, "read": C.metadata_size, "path": "replay"},
                             f"the replay reads split counts {[v for _, v in stale][:8]} for padded rows "
                             f"{[r for r, _ in stale][:8]} past the {P.metadata_size} int32 this step's recompute "
                             f"wrote (not the empty row's {empty}): values left by an earlier step, for which FA3 "
                             f"schedules tiles of rows with no query tokens"))
    return out
