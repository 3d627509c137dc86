"""FA3's scheduler-metadata tensor: layout, size, encoder, decoder and `get_scheduler_metadata`.

Layout (sm90, FA3 `hopper/flash_api.cpp` `mha_fwd_get_scheduler_metadata`): one int32 vector of length
`nvec * b4 + 1`, b4 = batch rounded up to a multiple of 4, with per-batch vectors at
`0: num_splits_dynamic`, `b4: num_m_blocks`, `2*b4: varlen_batch_idx` (Sort only), then
`num_nheads_in_l2` (Swizzle only), then the tile-count semaphore (set to 0 by the prepare step).

FA3 allocates the tensor with `torch.empty`, so slots [b, b4) of each vector hold whatever memory held.
This model fills them with the documented sentinel `UNWRITTEN` so a reader of such a slot is detectable.
The layout and its codec over plain ints live in refmodel.metadata_layout (no torch); this module is their tensor
form.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import fa3_builds
from .fa3_scheduler import Schedule, ScheduleInputs, precompute_inputs, resolve_schedule
# the layout, its codec in plain ints and the call's own metadata (no torch); re-exported here
from .metadata_layout import (UNWRITTEN, DecodedMetadata, MetadataLayout, call_own_metadata, call_own_schedule,
                              decode_metadata_values, decode_values_for_schedule, encode_metadata_values)
from .prepare import PrepareResult, launch_check, prepare_scheduler


def metadata_size(schedule_or_inputs) -> int:
    """Length of the metadata tensor for a precompute or a call: `nvec*b4 + semaphore` (flash_api.cpp)."""
    schedule = schedule_or_inputs if isinstance(schedule_or_inputs, Schedule) else resolve_schedule(schedule_or_inputs)
    return schedule.metadata_size


def encode_metadata(schedule: Schedule, result: PrepareResult) -> torch.Tensor:
    """Write a prepare result into FA3's int32 layout; unwritten slots get `UNWRITTEN` (flash_api.cpp)."""
    return torch.tensor(encode_metadata_values(schedule, result), dtype=torch.int32)


def decode_metadata(metadata: torch.Tensor, batch_size: int, sort: bool, swizzle: bool) -> DecodedMetadata:
    """Read an int32 metadata tensor back into named vectors using FA3's layout for (b, Sort, Swizzle)."""
    return decode_metadata_values(metadata.detach().reshape(-1).tolist(), batch_size, sort, swizzle)


def decode_for_schedule(metadata: torch.Tensor, schedule: Schedule) -> DecodedMetadata:
    """Read metadata as the kernels of this call's build read it (refmodel.metadata_layout
    ``decode_values_for_schedule``: upstream's vectors, or the vLLM fork's)."""
    return decode_values_for_schedule(metadata.detach().reshape(-1).tolist(), schedule)


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
