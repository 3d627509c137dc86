"""FA3's scheduler-metadata tensor: layout, size, encoder, decoder and `get_scheduler_metadata`.

Layout (sm90, FA3 `hopper/flash_api.cpp` `mha_fwd_get_scheduler_metadata`): one int32 vector of length
`nvec * b4 + 1`, b4 = batch rounded up to a multiple of 4, with per-batch vectors at
`0: num_splits_dynamic`, `b4: num_m_blocks`, `2*b4: varlen_batch_idx` (Sort only), then
`num_nheads_in_l2` (Swizzle only), then the tile-count semaphore (set to 0 by the prepare step).

FA3 allocates the tensor with `torch.empty`, so slots [b, b4) of each vector hold whatever memory held.
This model fills them with the documented sentinel `UNWRITTEN` so a reader of such a slot is detectable.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from . import fa3_builds
from .fa3_scheduler import Schedule, ScheduleInputs, precompute_inputs, resolve_schedule
from .prepare import PrepareResult, launch_check, prepare_scheduler

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

    @property
    def num_vectors(self) -> int:
        if self.fork:
            return 1 + int(self.fork_dynamic_split) + int(self.swizzle)
        return 2 + int(self.sort) + int(self.swizzle)

    @property
    def size(self) -> int:
        return self.num_vectors * self.b4 + int(self.has_semaphore)

    @property
    def splits_offset(self) -> Optional[int]:
        if self.fork:  # vllm-project/flash-attention@617264c1 flash_api.cpp 703-704, 1107-1108
            return self.b4 if self.fork_dynamic_split else None
        return 0

    @property
    def m_blocks_offset(self) -> Optional[int]:
        return None if self.fork else self.b4

    @property
    def seqlen_q_offset(self) -> Optional[int]:
        """The fork's prepare_seqlen_q vector, at 0 (flash_api.cpp@617264c1 703, 1107); upstream has none."""
        return 0 if self.fork else None

    @property
    def batch_idx_offset(self) -> Optional[int]:
        return 2 * self.b4 if self.sort else None

    @property
    def nheads_in_l2_offset(self) -> Optional[int]:
        if self.fork:
            return self.b4 * (self.num_vectors - 1) if self.swizzle else None
        return self.b4 * (3 if self.sort else 2) if self.swizzle else None

    @property
    def semaphore_offset(self) -> int:
        return self.num_vectors * self.b4

    @classmethod
    def for_schedule(cls, schedule: Schedule) -> "MetadataLayout":
        inp = schedule.inputs
        fork = inp.build == fa3_builds.VLLM_FORK
        return cls(batch_size=inp.batch_size, b4=schedule.b4, sort=schedule.sort,
                   swizzle=schedule.swizzle, has_semaphore=schedule.needs_semaphore, fork=fork,
                   fork_dynamic_split=fork and fa3_builds.fork_uses_dynamic_split(inp.uses_prepare, inp.batch_size,
                                                                                  schedule.num_splits))


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


def metadata_size(schedule_or_inputs) -> int:
    """Length of the metadata tensor for a precompute or a call: `nvec*b4 + semaphore` (flash_api.cpp)."""
    schedule = schedule_or_inputs if isinstance(schedule_or_inputs, Schedule) else resolve_schedule(schedule_or_inputs)
    return schedule.metadata_size


def encode_metadata(schedule: Schedule, result: PrepareResult) -> torch.Tensor:
    """Write a prepare result into FA3's int32 layout; unwritten slots get `UNWRITTEN` (flash_api.cpp)."""
    layout = MetadataLayout.for_schedule(schedule)
    out = torch.full((layout.size,), UNWRITTEN, dtype=torch.int32)
    b = layout.batch_size
    for offset, values in ((layout.splits_offset, result.num_splits), (layout.m_blocks_offset, result.num_m_blocks),
                           (layout.seqlen_q_offset, result.prepare_seqlen_q),
                           (layout.batch_idx_offset, result.batch_idx), (layout.nheads_in_l2_offset, result.nheads_in_l2)):
        if offset is not None:  # every value is a C++ int already; the int32 slots take it unchanged
            out[offset:offset + b] = torch.tensor(values)
    if layout.has_semaphore:
        out[layout.semaphore_offset] = 0
    return out


def decode_metadata(metadata: torch.Tensor, batch_size: int, sort: bool, swizzle: bool) -> DecodedMetadata:
    """Read an int32 metadata tensor back into named vectors using FA3's layout for (b, Sort, Swizzle)."""
    b4 = -(-batch_size // 4) * 4
    layout = MetadataLayout(batch_size=batch_size, b4=b4, sort=sort, swizzle=swizzle)  # with the semaphore slot
    values = [int(v) for v in metadata.detach().reshape(-1).tolist()]
    if len(values) < layout.num_vectors * b4:
        raise ValueError(f"metadata: expected at least {layout.num_vectors * b4} int32 values for batch_size="
                         f"{batch_size}, sort={sort}, swizzle={swizzle}; got {len(values)}")

    def vector(offset: Optional[int]) -> Optional[list[int]]:
        return None if offset is None else values[offset:offset + b4]

    sem = values[layout.semaphore_offset] if len(values) > layout.semaphore_offset else None
    return DecodedMetadata(layout, vector(layout.splits_offset), vector(layout.m_blocks_offset),
                           vector(layout.batch_idx_offset), vector(layout.nheads_in_l2_offset), sem)


def decode_for_schedule(metadata: torch.Tensor, schedule: Schedule) -> DecodedMetadata:
    """Read metadata as the kernels of this call's build read it: upstream's vectors, or the vLLM fork's.

    The fork stores ``prepare_seqlen_q`` and its tile scheduler takes m-blocks as ``ceil(prepare_seqlen_q /
    kBlockM)`` with the kernel's kBlockM (vllm-project/flash-attention@617264c1 hopper/tile_scheduler.hpp 475-479),
    and split counts from the dynamic vector, present only when the call splits (503-505; flash_api.cpp 1108).
    Unwritten slots stay ``UNWRITTEN``; without a dynamic vector every split count is 1.
    """
    inp = schedule.inputs
    if inp.build != fa3_builds.VLLM_FORK:
        return decode_metadata(metadata, inp.batch_size, schedule.sort, schedule.swizzle)
    layout = MetadataLayout.for_schedule(schedule)
    values = [int(v) for v in metadata.detach().reshape(-1).tolist()]
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


def _as_int_list(x, name: str, n: Optional[int] = None) -> Optional[list[int]]:
    if x is None:
        return None
    values = [int(v) for v in x]  # a sequence or a 1-D tensor
    if n is not None and len(values) != n:
        raise ValueError(f"{name}: expected {n} entries, got {len(values)}")
    return values


def lengths_from_cu(cu: Optional[Sequence[int]], name: str, batch_size: int) -> Optional[list[int]]:
    """Per-batch lengths from a cumulative (b+1,) vector such as cu_seqlens_q."""
    values = _as_int_list(cu, name, batch_size + 1)
    if values is None:
        return None
    lens = [values[i + 1] - values[i] for i in range(batch_size)]
    if any(v < 0 for v in lens):
        raise ValueError(f"{name}: must be non-decreasing, got {values}")
    return lens


def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                           cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None,
                           cu_seqlens_k_new=None, cache_leftpad=None, page_size=None, max_seqlen_k_new=0,
                           causal=False, window_size=(-1, -1), attention_chunk=0, has_softcap=False,
                           num_splits=0, pack_gqa=None, sm_margin=0, num_sm: int = 132, arch: int = 90,
                           build: str = fa3_builds.UPSTREAM) -> torch.Tensor:
    """FA3's `get_scheduler_metadata` with its Python signature plus `num_sm`/`arch` (flash_attn_interface.py).

    Returns the int32 tensor of `mha_fwd_get_scheduler_metadata` with FA3's exact layout; slots FA3 never
    writes hold `UNWRITTEN`.
    """
    schedule, result = schedule_and_prepare(
        batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, cache_seqlens,
        qkv_dtype=qkv_dtype, headdim_v=headdim_v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k_new=cu_seqlens_k_new,
        cache_leftpad=cache_leftpad, page_size=page_size, max_seqlen_k_new=max_seqlen_k_new, causal=causal,
        window_size=window_size, attention_chunk=attention_chunk, has_softcap=has_softcap, num_splits=num_splits,
        pack_gqa=pack_gqa, sm_margin=sm_margin, num_sm=num_sm, arch=arch, build=build)
    out = encode_metadata(schedule, result)
    if isinstance(cache_seqlens, torch.Tensor):
        out = out.to(cache_seqlens.device)
    return out


def schedule_and_prepare(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, cache_seqlens,
                         qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None, cu_seqlens_k_new=None,
                         cache_leftpad=None, page_size=None, max_seqlen_k_new=0, causal=False, window_size=(-1, -1),
                         attention_chunk=0, has_softcap=False, num_splits=0, pack_gqa=None, sm_margin=0,
                         num_sm: int = 132, arch: int = 90,
                         build: str = fa3_builds.UPSTREAM) -> tuple[Schedule, PrepareResult]:
    """The precompute's resolved schedule and prepare result, before encoding (flash_api.cpp)."""
    inputs: ScheduleInputs = precompute_inputs(
        batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, qkv_dtype=qkv_dtype,
        headdim_v=headdim_v, varlen_q=cu_seqlens_q is not None, has_leftpad=cache_leftpad is not None,
        page_size=page_size, max_seqlen_k_new=max_seqlen_k_new, causal=causal, window_size=window_size,
        attention_chunk=attention_chunk, has_softcap=has_softcap, num_splits=num_splits, pack_gqa=pack_gqa,
        sm_margin=sm_margin, num_sm=num_sm, arch=arch, build=build)
    schedule = resolve_schedule(inputs)
    b = int(batch_size)
    launch_check(b)  # batch_size == 0: FA3 ends the process (ProcessAbort), it does not return metadata
    seqused = _as_int_list(cache_seqlens, "cache_seqlens", b)
    if any(v < 0 for v in seqused):
        raise ValueError(f"cache_seqlens: entries must be >= 0, got {seqused}")
    lq = lengths_from_cu(cu_seqlens_q, "cu_seqlens_q", b)
    lnew = lengths_from_cu(cu_seqlens_k_new, "cu_seqlens_k_new", b)
    leftpad = _as_int_list(cache_leftpad, "cache_leftpad", b)
    result = prepare_scheduler(schedule, seqused, seqlens_q=lq, leftpad_k=leftpad, seqlens_new=lnew)
    return schedule, result


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
