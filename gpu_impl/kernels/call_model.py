"""The FA3 call both adapters share: its arguments, its static shape read from the tensors, its own schedule.

Invariant: :func:`call_shape` reads the sizes ``mha_fwd`` reads (``hopper/flash_api.cpp``: ``seqlen_k`` is
``k_cache.size(1)``, or ``page_table.size(1) * page_size`` when paged; an int ``cache_seqlens`` makes the call
varlen), and :func:`call_schedule` resolves the call's schedule with refmodel only (``call_inputs`` +
``resolve_schedule``); arguments neither adapter models are refused by name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import torch

from refmodel.fa3_scheduler import Schedule, ScheduleInputs, call_inputs, resolve_schedule


#: FA3 arguments the real-kernel adapter does not pass on, with the value meaning "not used". ``rotary_seqlens``
#: is not among them: FA3 reads it only with ``rotary_cos`` (``mha_fwd``), so alone it is ignored, not refused.
#: The emulated adapter models every one of them (gpu_impl.kernels.call_features).
UNSUPPORTED_ARGUMENTS = {
    "k": None, "v": None, "qv": None, "rotary_cos": None, "rotary_sin": None, "cache_batch_idx": None,
    "cu_seqlens_k_new": None, "q_descale": None, "k_descale": None, "v_descale": None,
    "attention_chunk": 0,
}

_SCHEDULE_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}

_FP8 = getattr(torch, "float8_e4m3fn", None)


def reject_unsupported(adapter: str, given: dict) -> None:
    """Raise ``NotImplementedError`` naming the first FA3 argument given that the adapters do not model."""
    for name, unused in UNSUPPORTED_ARGUMENTS.items():
        value = given.get(name, unused)
        if value is unused or (unused is not None and not isinstance(value, torch.Tensor) and value == unused):
            continue
        raise NotImplementedError(
            f"{name}: not supported by the {adapter!r} kernel adapter (it passes decode/prefill over an existing "
            f"KV cache on: no appended KV, rotary, qv, cache_batch_idx, FP8 descaling or attention_chunk; the "
            f"'emulated' adapter models them); got {type(value).__name__}")


def schedule_dtype(dtype: torch.dtype) -> str:
    """The qkv dtype FA3 schedules with; float32/float64 (emulator only) are scheduled as bfloat16."""
    if dtype in _SCHEDULE_DTYPES:
        return _SCHEDULE_DTYPES[dtype]
    if _FP8 is not None and dtype == _FP8:
        return "float8_e4m3fn"
    if dtype in (torch.float32, torch.float64):
        return "bfloat16"
    raise ValueError(f"q: dtype must be bfloat16/float16/float8_e4m3fn (float32/float64 allowed by the emulator), "
                     f"got {dtype}")


# ----------------------------------------------------------------------------------------------------------
# The call: its arguments, its static shape, its schedule
# ----------------------------------------------------------------------------------------------------------


@dataclass
class CallArgs:
    """The ``flash_attn_with_kvcache`` arguments the adapters model (FA3's names)."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_seqlens: Any = None
    cache_leftpad: Optional[torch.Tensor] = None
    page_table: Optional[torch.Tensor] = None
    cu_seqlens_q: Optional[torch.Tensor] = None
    max_seqlen_q: Optional[int] = None
    softmax_scale: Optional[float] = None
    causal: bool = False
    window_size: tuple = (-1, -1)
    softcap: float = 0.0
    scheduler_metadata: Optional[torch.Tensor] = None
    num_splits: int = 0
    pack_gqa: Optional[bool] = None
    sm_margin: int = 0
    return_softmax_lse: bool = False
    attention_chunk: int = 0
    #: what the numerics read when it is not the call's own tensors (appended KV, rotary, qv, cache_batch_idx,
    #: FP8 descales, packed varlen K): a gpu_impl.kernels.call_features.NumericsView
    numerics: Any = None
    #: the call's CallShape when the caller has read it already (with new-KV lengths, packed K's total_k)
    shape: Any = None

    def replace(self, **changes) -> "CallArgs":
        return dataclasses.replace(self, **changes)


def _int_list(x, name: str, n: int) -> Optional[list[int]]:
    if x is None:
        return None
    if isinstance(x, int) and not isinstance(x, bool):
        return [int(x)] * n
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: must be an int32 tensor of shape ({n},), got {type(x).__name__}")
    if x.dtype != torch.int32:
        raise ValueError(f"{name}: must have dtype torch.int32 (as FA3 requires), got {x.dtype}")
    if tuple(x.shape) != (n,):
        raise ValueError(f"{name}: must have shape ({n},), got {tuple(x.shape)}")
    return [int(v) for v in x.detach().cpu().tolist()]


@dataclass(frozen=True)
class CallShape:
    """What ``mha_fwd`` reads from a call's tensors before scheduling (``hopper/flash_api.cpp``)."""

    batch_size: int
    seqlen_q: int            # q.size(1), or max_seqlen_q with cu_seqlens_q
    seqlen_k: int            # k_cache.size(1), or page_table.size(1) * page_size
    total_q: int
    num_heads: int
    num_heads_k: int
    headdim: int
    headdim_v: int
    dtype: torch.dtype
    page_size: Optional[int]
    varlen_q: bool
    seqlens_q: tuple         # per batch
    cache_seqlens: Optional[tuple]   # per batch; None when the call has no cache_seqlens
    cache_leftpad: Optional[tuple]
    cache_slots: int         # k_cache.size(1): mha_fwd's total_k = b * k.size(1)
    seqlen_knew: int = 0     # k_new.size(1) (0 when varlen k_new or none)
    has_k_new: bool = False  # k_new passed (FA3's params.knew_ptr)
    seqlens_new: Optional[tuple] = None  # per batch new-KV lengths (None: seqlen_knew for every batch)
    total_k: Optional[int] = None        # mha_fwd's total_k + total_knew when not b * cache_slots (packed K, new KV)

    @property
    def uses_prepare(self) -> bool:
        """FA3's ``is_varlen``: cu_seqlens_q, cache_seqlens (seqused_k) or leftpad given."""
        return self.varlen_q or self.cache_seqlens is not None or self.cache_leftpad is not None

    @property
    def qhead_per_khead(self) -> int:
        return self.num_heads // self.num_heads_k

    @property
    def seqused_k(self) -> list[int]:
        return list(self.cache_seqlens) if self.cache_seqlens is not None else [self.seqlen_k] * self.batch_size

    @property
    def kernel_runs(self) -> bool:
        """``mha_fwd`` launches the kernels only when total_q > 0 and total_k > 0."""
        total_k = self.batch_size * self.cache_slots if self.total_k is None else self.total_k
        return self.total_q > 0 and total_k > 0 and self.num_heads_k > 0


def call_shape(q, k_cache, v_cache, cache_seqlens=None, cache_leftpad=None, page_table=None, cu_seqlens_q=None,
               max_seqlen_q=None, kv_batch_idx=None) -> CallShape:
    """The static shape of a ``flash_attn_with_kvcache`` call (``mha_fwd``), with light argument checks.

    Reads only sizes and the small int32 index vectors; never the q/k/v data.
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: must be a tensor, got {type(t).__name__}")
    varlen_q = cu_seqlens_q is not None
    if q.dim() != (3 if varlen_q else 4):
        raise ValueError(f"q: must be {'(total_q, h, d) with cu_seqlens_q' if varlen_q else '(b, seqlen_q, h, d)'}, "
                         f"got shape {tuple(q.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(f"{name}: must be 4-D (b, seqlen_k, h_k, d) or paged (num_pages, page_size, h_k, d), "
                             f"got shape {tuple(t.shape)}")
    num_heads, headdim = q.shape[-2], q.shape[-1]
    num_heads_k, headdim_v = k_cache.shape[2], v_cache.shape[-1]
    if num_heads_k < 1 or num_heads % num_heads_k:
        raise ValueError(f"k_cache: KV heads must be >= 1 and divide q's {num_heads} heads, got {num_heads_k}")
    if k_cache.shape[-1] != headdim:
        raise ValueError(f"k_cache: head dim must equal q's {headdim}, got {k_cache.shape[-1]}")
    if varlen_q:
        if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dim() != 1 or cu_seqlens_q.numel() < 1:
            raise ValueError("cu_seqlens_q: must be a 1-D int32 tensor of length b + 1")
        cu = _int_list(cu_seqlens_q, "cu_seqlens_q", cu_seqlens_q.numel())
        batch_size = len(cu) - 1
        seqlens_q = tuple(cu[i + 1] - cu[i] for i in range(batch_size))
        if max_seqlen_q is None:
            raise ValueError("max_seqlen_q: must be given with cu_seqlens_q (FA3 requires it)")
        seqlen_q, total_q = int(max_seqlen_q), q.shape[0]
    else:
        batch_size, seqlen_q = q.shape[0], q.shape[1]
        seqlens_q, total_q = (seqlen_q,) * batch_size, batch_size * seqlen_q
    paged = page_table is not None
    if paged:
        if not isinstance(page_table, torch.Tensor) or page_table.dim() != 2 or \
                (kv_batch_idx is None and page_table.shape[0] != batch_size):
            raise ValueError(f"page_table: must be an int32 tensor (b={batch_size}, max_pages_per_seq)")
        page_size = k_cache.shape[1]
        seqlen_k = page_table.shape[1] * page_size
    else:
        if kv_batch_idx is None and k_cache.shape[0] != batch_size:
            raise ValueError(f"k_cache: batch dim must equal the batch size {batch_size}, got {k_cache.shape[0]}")
        page_size, seqlen_k = None, k_cache.shape[1]
    cs = _int_list(cache_seqlens, "cache_seqlens", batch_size)
    lp = _int_list(cache_leftpad, "cache_leftpad", batch_size)
    return CallShape(batch_size=batch_size, seqlen_q=seqlen_q, seqlen_k=seqlen_k, total_q=total_q,
                     num_heads=num_heads, num_heads_k=num_heads_k, headdim=headdim, headdim_v=headdim_v,
                     dtype=q.dtype, page_size=page_size, varlen_q=varlen_q, seqlens_q=seqlens_q,
                     cache_seqlens=None if cs is None else tuple(cs), cache_leftpad=None if lp is None else tuple(lp),
                     cache_slots=k_cache.shape[1])


def call_schedule_inputs(shape: CallShape, causal=False, window_size=(-1, -1), softcap=0.0, num_splits=0,
                         pack_gqa=None, sm_margin=0, num_sm=132, arch=90, attention_chunk=0) -> ScheduleInputs:
    """refmodel's ``call_inputs`` for a call of this shape (``mha_fwd``'s scheduling inputs)."""
    return call_inputs(
        shape.batch_size, shape.seqlen_q, shape.seqlen_k, shape.num_heads, shape.num_heads_k, shape.headdim,
        headdim_v=shape.headdim_v, qkv_dtype=schedule_dtype(shape.dtype), varlen_q=shape.varlen_q,
        has_cache_seqlens=shape.cache_seqlens is not None, has_leftpad=shape.cache_leftpad is not None,
        page_size=shape.page_size, causal=causal, window_size=window_size, has_softcap=float(softcap) > 0,
        num_splits=num_splits, pack_gqa=pack_gqa, sm_margin=sm_margin, num_sm=num_sm, arch=arch,
        seqlen_knew=shape.seqlen_knew, has_k_new=shape.has_k_new, attention_chunk=attention_chunk)


def call_schedule(shape: CallShape, args: CallArgs, num_sm: int = 132, arch: int = 90) -> Schedule:
    """The call's own resolved schedule (S_c, pack, tiles, Sort/Swizzle, metadata size) via refmodel."""
    return resolve_schedule(call_schedule_inputs(shape, args.causal, args.window_size, args.softcap, args.num_splits,
                                                 args.pack_gqa, args.sm_margin, num_sm, arch, args.attention_chunk))


def schedule_summary(schedule: Schedule) -> dict:
    """The schedule fields a trace records."""
    return {
        "num_splits": schedule.num_splits, "pack_gqa": schedule.pack_gqa, "kernel_pack_gqa": schedule.kernel_pack_gqa,
        "block_m": schedule.block_m, "block_n": schedule.block_n, "kernel_block_m": schedule.kernel_block_m,
        "kernel_block_n": schedule.kernel_block_n, "b4": schedule.b4, "metadata_size": schedule.metadata_size,
        "sort": schedule.sort, "swizzle": schedule.swizzle, "is_causal": schedule.masking.is_causal,
        "is_local": schedule.masking.is_local, "uses_prepare": schedule.inputs.uses_prepare,
        "batch_size": schedule.inputs.batch_size, "seqlen_q": schedule.inputs.seqlen_q,
        "seqlen_k": schedule.inputs.seqlen_k, "num_heads": schedule.inputs.num_heads,
        "num_heads_k": schedule.inputs.num_heads_k, "headdim": schedule.inputs.headdim,
        "headdim_v": schedule.inputs.headdim_v, "page_size": schedule.inputs.page_size,
        "num_sm": schedule.inputs.num_sm,
    }
