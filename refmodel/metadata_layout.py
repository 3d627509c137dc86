"""FA3's scheduler-metadata layout in plain ints: the vectors' offsets, the encoder and the decoder of a list.

The layout is refmodel.metadata's (FA3 ``hopper/flash_api.cpp`` ``mha_fwd_get_scheduler_metadata``): one int32
vector of length ``nvec * b4 + 1``; slots FA3 never writes hold :data:`UNWRITTEN`. Invariant: a list encoded here
holds, slot for slot, the values of refmodel.metadata's int32 tensor (each value wraps to a C++ int as the int32
slot does), and decoding a list gives what decoding that tensor gives. No torch: the metadata invariants
(spec.invariants) and the prover's replays read metadata without loading it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

from . import fa3_builds
from .cint import to_int32
from .fa3_scheduler import Schedule
from .prepare import PrepareResult, prepare_scheduler

__all__ = ["UNWRITTEN", "MetadataLayout", "DecodedMetadata", "encode_metadata_values", "decode_metadata_values",
           "decode_values_for_schedule", "call_own_schedule", "call_own_metadata", "read_past_write"]


#: Value of metadata slots FA3 never writes (INT32_MIN): FA3 leaves uninitialised memory there.
UNWRITTEN = -(2**31)


@dataclass(frozen=True)
class MetadataLayout:
    """Offsets of the per-batch vectors inside the metadata tensor (flash_api.cpp)."""

    batch_size: int
    b4: int
    sort: bool
    swizzle: bool
    has_semaphore: bool = True
    #: the vLLM fork's layout (fa3_builds): prepare_seqlen_q, [dynamic splits], [heads-in-L2]; Sort off
    fork: bool = False
    fork_dynamic_split: bool = False
    #: the fork before 5824e6e2 (fa3_builds "semaphore-splits"): the semaphore at 0, then b dynamic split counts
    #: (flash_api.cpp@a8937124 642-652, 1008-1028); no m-blocks, no batch order, no heads-in-L2
    legacy: bool = False
    legacy_dynamic_split: bool = False

    @property
    def num_vectors(self) -> int:
        if self.legacy:
            return int(self.legacy_dynamic_split)
        if self.fork:
            return 1 + int(self.fork_dynamic_split) + int(self.swizzle)
        return 2 + int(self.sort) + int(self.swizzle)

    @property
    def size(self) -> int:
        if self.legacy:
            return int(self.has_semaphore) + int(self.legacy_dynamic_split) * self.batch_size
        return self.num_vectors * self.b4 + int(self.has_semaphore)

    @property
    def splits_offset(self) -> Optional[int]:
        if self.legacy:  # tile_count_semaphore.data_ptr<int>() + 1 (flash_api.cpp@a8937124 652, 1028)
            return 1 if self.legacy_dynamic_split else None
        if self.fork:  # vllm-project/flash-attention@617264c1 flash_api.cpp 703-704, 1107-1108
            return self.b4 if self.fork_dynamic_split else None
        return 0

    @property
    def m_blocks_offset(self) -> Optional[int]:
        return None if self.fork or self.legacy else self.b4

    @property
    def seqlen_q_offset(self) -> Optional[int]:
        """The fork's prepare_seqlen_q vector, at 0 (flash_api.cpp@617264c1 703, 1107); upstream has none."""
        return 0 if self.fork else None

    @property
    def batch_idx_offset(self) -> Optional[int]:
        return 2 * self.b4 if self.sort and not self.legacy else None

    @property
    def nheads_in_l2_offset(self) -> Optional[int]:
        if self.legacy:
            return None
        if self.fork:
            return self.b4 * (self.num_vectors - 1) if self.swizzle else None
        return self.b4 * (3 if self.sort else 2) if self.swizzle else None

    @property
    def semaphore_offset(self) -> int:
        if self.legacy:
            return 0
        return self.num_vectors * self.b4

    @classmethod
    def for_schedule(cls, schedule: Schedule) -> "MetadataLayout":
        inp = schedule.inputs
        kind = fa3_builds.metadata_layout_kind(inp.build)
        fork = kind == "fork"
        return cls(batch_size=inp.batch_size, b4=schedule.b4, sort=schedule.sort,
                   swizzle=schedule.swizzle, has_semaphore=schedule.needs_semaphore, fork=fork,
                   fork_dynamic_split=fork and fa3_builds.fork_uses_dynamic_split(inp.uses_prepare, inp.batch_size,
                                                                                  schedule.num_splits),
                   legacy=kind == "semaphore-splits", legacy_dynamic_split=schedule.legacy_dynamic_split)


@dataclass(frozen=True)
class DecodedMetadata:
    """A metadata tensor read back into named vectors, each of length b4 (unwritten slots included)."""

    layout: MetadataLayout
    num_splits: list[int]
    num_m_blocks: list[int]
    batch_idx: Optional[list[int]]
    nheads_in_l2: Optional[list[int]]
    semaphore: Optional[int]
    #: the vLLM fork's stored query rows per batch (its m-blocks are these over the call's kBlockM)
    prepare_seqlen_q: Optional[list[int]] = None

    def to_dict(self) -> dict:
        return {"num_splits": self.num_splits, "num_m_blocks": self.num_m_blocks, "batch_idx": self.batch_idx,
                "nheads_in_l2": self.nheads_in_l2, "semaphore": self.semaphore}


def encode_metadata_values(schedule: Schedule, result: PrepareResult) -> list:
    """A prepare result in FA3's int32 layout as a list of ints; unwritten slots hold `UNWRITTEN` (flash_api.cpp)."""
    layout = MetadataLayout.for_schedule(schedule)
    out = [UNWRITTEN] * layout.size
    b = layout.batch_size
    for offset, values in ((layout.splits_offset, result.num_splits), (layout.m_blocks_offset, result.num_m_blocks),
                           (layout.seqlen_q_offset, result.prepare_seqlen_q),
                           (layout.batch_idx_offset, result.batch_idx), (layout.nheads_in_l2_offset, result.nheads_in_l2)):
        if offset is not None:
            if len(values) != b:
                raise ValueError(f"result: a vector of {len(values)} entries for a batch of {b}")
            out[offset:offset + b] = [to_int32(v) for v in values]  # an int32 slot keeps the value as a C++ int
    if layout.has_semaphore:
        out[layout.semaphore_offset] = 0
    return out


def decode_metadata_values(values: Sequence[int], batch_size: int, sort: bool, swizzle: bool) -> DecodedMetadata:
    """Read int32 metadata values back into named vectors using FA3's layout for (b, Sort, Swizzle)."""
    values = [int(v) for v in values]
    b4 = -(-batch_size // 4) * 4
    layout = MetadataLayout(batch_size=batch_size, b4=b4, sort=sort, swizzle=swizzle)  # with the semaphore slot
    if len(values) < layout.num_vectors * b4:
        raise ValueError(f"metadata: expected at least {layout.num_vectors * b4} int32 values for batch_size="
                         f"{batch_size}, sort={sort}, swizzle={swizzle}; got {len(values)}")

    def vector(offset: Optional[int]) -> Optional[list[int]]:
        return None if offset is None else values[offset:offset + b4]

    sem = values[layout.semaphore_offset] if len(values) > layout.semaphore_offset else None
    return DecodedMetadata(layout, vector(layout.splits_offset), vector(layout.m_blocks_offset),
                           vector(layout.batch_idx_offset), vector(layout.nheads_in_l2_offset), sem)


def decode_values_for_schedule(values: Sequence[int], schedule: Schedule) -> DecodedMetadata:
    """Read metadata values as the kernels of this call's build read them: upstream's vectors, or the vLLM fork's.

    The fork stores ``prepare_seqlen_q`` and its tile scheduler takes m-blocks as ``ceil(prepare_seqlen_q /
    kBlockM)`` with the kernel's kBlockM (vllm-project/flash-attention@617264c1 hopper/tile_scheduler.hpp 475-479),
    and split counts from the dynamic vector, present only when the call splits (503-505; flash_api.cpp 1108).
    Unwritten slots stay ``UNWRITTEN``; without a dynamic vector every split count is 1.
    """
    inp = schedule.inputs
    kind = fa3_builds.metadata_layout_kind(inp.build)
    if kind == "semaphore-splits":
        return _decode_legacy(values, schedule)
    if kind != "fork":
        return decode_metadata_values(values, inp.batch_size, schedule.sort, schedule.swizzle)
    values = [int(v) for v in values]
    layout = MetadataLayout.for_schedule(schedule)
    if len(values) < layout.num_vectors * layout.b4:
        raise ValueError(f"metadata: expected at least {layout.num_vectors * layout.b4} int32 values for the fork's "
                         f"layout (batch_size={inp.batch_size}); got {len(values)}")
    b4 = layout.b4

    def vector(offset: Optional[int]) -> Optional[list[int]]:
        return None if offset is None else values[offset:offset + b4]

    seqlens = vector(layout.seqlen_q_offset)
    m_blocks = [v if v == UNWRITTEN else -(-v // schedule.kernel_block_m) for v in seqlens]
    splits = vector(layout.splits_offset) or [1] * b4
    sem = values[layout.semaphore_offset] if len(values) > layout.semaphore_offset else None
    return DecodedMetadata(layout, splits, m_blocks, None, vector(layout.nheads_in_l2_offset), sem, seqlens)


def _decode_legacy(values: Sequence[int], schedule: Schedule) -> DecodedMetadata:
    """The fork before 5824e6e2 (fa3_builds "semaphore-splits"): the semaphore at 0 and, with a dynamic split vector,
    split counts at 1..b (flash_api.cpp@a8937124 1008-1028); missing slots read as ``UNWRITTEN``. Without the vector
    every batch runs the call's own split count. The metadata holds no m-blocks: that build's tile scheduler counts
    each batch's m-blocks from the call's own query lengths; they are given here at the call's ``max_seqlen_q``
    (rows x qhpk under the kernel's PackGQA over the kernel's kBlockM), exact when every batch has max_seqlen_q
    rows (decode) and an upper bound otherwise (a simplification: docs/fa3-builds.md)."""
    values = [int(v) for v in values]
    layout = MetadataLayout.for_schedule(schedule)
    b4 = layout.b4
    if layout.splits_offset is not None:
        at = layout.splits_offset
        splits = [values[at + i] if at + i < len(values) else UNWRITTEN for i in range(b4)]
    else:
        splits = [schedule.num_splits] * b4
    rows = to_int32(schedule.inputs.seqlen_q * (schedule.qhead_per_khead if schedule.kernel_pack_gqa else 1))
    own = -(-rows // schedule.kernel_block_m)
    sem = values[0] if layout.has_semaphore and values else None
    return DecodedMetadata(layout, splits, [own] * b4, None, None, sem)


def read_past_write(schedule: Schedule, written: int, values: Sequence[int],
                    seqlens_q: Sequence[int]) -> Optional[list[tuple[int, int, bool]]]:
    """What a call reads past the first ``written`` int32 of its metadata, judged by the build's empty-row rule.

    ``values``: the int32 the call reads (its own layout's size: a persistent buffer's view behind which FA3's
    CHECK_SHAPE passes); ``seqlens_q``: the call's query rows per batch. Returns ``(row, value, empty)`` for every
    slot at or past ``written``, ``empty`` True where the value is the build's empty-row split count
    (``fa3_builds.empty_row_split_count``: 0 on the "semaphore-splits" builds, whose slot 1 + row is that row's split
    count). None where the rule cannot judge the read: the build has no empty-row rule (another layout: the slots
    past the write hold other vectors), the call does not split (no split count is read there), the read is not
    longer than the write, or a slot past the write is the split count of a row with query tokens (a real row).
    """
    empty = fa3_builds.empty_row_split_count(schedule.inputs.build)
    layout = MetadataLayout.for_schedule(schedule)
    if (empty is None or schedule.num_splits <= 1 or layout.splits_offset is None or len(values) != layout.size
            or not 0 < written < layout.size):
        return None
    out = []
    for at in range(written, layout.size):
        row = at - layout.splits_offset
        if not 0 <= row < layout.batch_size or int(seqlens_q[row]) != 0:
            return None
        out.append((row, int(values[at]), int(values[at]) == empty))
    return out


def call_own_schedule(call_schedule: Schedule) -> Schedule:
    """The schedule ``mha_fwd``'s own prepare step runs with when no metadata is passed: the kernel's tiles and PackGQA.

    ``flash_fwd_launch_template.h`` (0251105a) lines 40-43 take kBlockM/kBlockN from the kernel template's head dims,
    line 377 of ``flash_api.cpp`` forces PackGQA for Split or paged-non-TMA, and lines 163-165 run
    ``prepare_varlen_num_blocks(params, stream, PackGQA, kBlockM, kBlockN, ...)`` with those values, where the
    precompute (``flash_api.cpp`` 652-658) passes the host tiles and the unforced pack decision.
    """
    if call_schedule.inputs.precompute:
        raise ValueError("call_schedule: must be a call's schedule (inputs.precompute False), got a precompute's")
    return dataclasses.replace(call_schedule, block_m=call_schedule.kernel_block_m,
                               block_n=call_schedule.kernel_block_n, pack_gqa=call_schedule.kernel_pack_gqa)


def call_own_metadata(call_schedule: Schedule, seqused_k: Sequence[int], seqlens_q: Optional[Sequence[int]] = None,
                      leftpad_k: Optional[Sequence[int]] = None,
                      seqlens_new: Optional[Sequence[int]] = None) -> tuple[Schedule, PrepareResult]:
    """What a varlen call computes for itself without ``scheduler_metadata`` (flash_fwd_launch_template.h 163-165).

    Returns the prepare schedule (:func:`call_own_schedule`) and its result; ``encode_metadata`` of the pair gives
    the tensor in the call's own layout. The kernel runs only when the call has queries and keys (flash_api.cpp
    line 1167), so a call of zero batches never launches it (unlike a precompute: ``prepare.launch_check``).
    """
    if not call_schedule.inputs.uses_prepare:
        raise ValueError("call_schedule: the call is not varlen (no cache_seqlens/cu_seqlens_q/leftpad), so FA3 "
                         "runs no prepare step and reads no per-batch metadata")
    own = call_own_schedule(call_schedule)
    return own, prepare_scheduler(own, list(seqused_k), seqlens_q=seqlens_q, leftpad_k=leftpad_k,
                                  seqlens_new=seqlens_new)
