"""The kernel-adapter interface, and the FA3 call model both adapters share.

An adapter is an object with FA3's two Python entry points, ``get_scheduler_metadata(...)`` and
``flash_attn_with_kvcache(...)`` (argument names of ``hopper/flash_attn_interface.py``), plus ``name``,
``mode``, ``describe()``, ``effective_call_inputs(...)`` and ``last_trace`` (see :class:`KernelAdapter`).

The shared call model (read in ``hopper/flash_api.cpp`` ``mha_fwd``, ``hopper/tile_scheduler.hpp``
``VarlenDynamicPersistentTileScheduler``, ``hopper/flash_fwd_launch_template.h``,
``hopper/epilogue_fwd.hpp`` and ``hopper/flash_fwd_combine_kernel.h``; nothing copied):

1. :func:`call_shape` reads the call's static sizes from its tensors, as ``mha_fwd`` does: ``seqlen_k`` is
   ``k_cache.size(1)``, or ``page_table.size(1) * page_size`` when paged; an int ``cache_seqlens`` becomes a
   per-batch tensor (so the call is varlen and runs the prepare step).
2. :func:`call_schedule` resolves the call's own schedule with refmodel (``call_inputs`` +
   ``resolve_schedule``): the split count ``S_c`` that sizes the partial buffers, pack-GQA, tiles, Sort/Swizzle
   and the metadata size the call expects.
3. :func:`build_tile_plan` decides what the kernels will read: FA3's ``CHECK_SHAPE`` on a given metadata
   tensor (:class:`~gpu_impl.errors.MetadataShapeError`), then the per-virtual-batch split counts, m-block
   counts and batch order -- from the metadata when one is given, from the call's own prepare step otherwise
   (run, as ``flash_fwd_launch_template.h`` runs it, with the kernel's tiles and forced pack-GQA), or from the
   static shapes when the call is not varlen.
4. :func:`check_plan` names every access the plan makes out of bounds (:class:`Violation`), before any
   numerics.

The verdicts come from ``spec.invariants.check_all`` (the project's one statement of the invariants),
bridged from a metadata *tensor* to spec's (precompute, call) vocabulary by :func:`spec_verdicts`.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from refmodel.combine import combine_capacity
from refmodel.fa3_scheduler import Schedule, ScheduleInputs, call_inputs, resolve_schedule
from refmodel.metadata import UNWRITTEN, DecodedMetadata, call_own_metadata, decode_metadata, encode_metadata
from refmodel.prepare import m_blocks_for, prepare_scheduler

from ..errors import MetadataShapeError, OutOfBoundsAccess

__all__ = [
    "INVARIANTS", "KernelAdapter", "CallArgs", "CallShape", "TilePlan", "Violation", "Poison",
    "UNSUPPORTED_ARGUMENTS", "call_shape", "call_schedule", "build_tile_plan", "check_plan",
    "spec_verdicts", "own_metadata_comparison",
    "poison_of", "raise_first", "schedule_summary", "reject_unsupported",
]

#: Invariant names, in the order a fault is reported when one call breaks several (the first is raised).
INVARIANTS = ("BATCH_PERMUTATION", "SPLIT_BOUND", "QUERY_COVER", "COMBINE_CAPACITY", "KV_COVER")

#: FA3 arguments neither adapter models, with the value meaning "not used".
UNSUPPORTED_ARGUMENTS = {
    "k": None, "v": None, "qv": None, "rotary_cos": None, "rotary_sin": None, "cache_batch_idx": None,
    "cu_seqlens_k_new": None, "rotary_seqlens": None, "q_descale": None, "k_descale": None, "v_descale": None,
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
            f"{name}: not supported by the {adapter!r} kernel adapter (it models decode/prefill over an existing "
            f"KV cache: no appended KV, rotary, qv, cache_batch_idx, FP8 descaling or attention_chunk); "
            f"got {type(value).__name__}")


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
        return self.total_q > 0 and self.batch_size * self.cache_slots > 0 and self.num_heads_k > 0


def call_shape(q, k_cache, v_cache, cache_seqlens=None, cache_leftpad=None, page_table=None, cu_seqlens_q=None,
               max_seqlen_q=None) -> CallShape:
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
        if not isinstance(page_table, torch.Tensor) or page_table.dim() != 2 or page_table.shape[0] != batch_size:
            raise ValueError(f"page_table: must be an int32 tensor (b={batch_size}, max_pages_per_seq)")
        page_size = k_cache.shape[1]
        seqlen_k = page_table.shape[1] * page_size
    else:
        if k_cache.shape[0] != batch_size:
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
                         pack_gqa=None, sm_margin=0, num_sm=132, arch=90) -> ScheduleInputs:
    """refmodel's ``call_inputs`` for a call of this shape (``mha_fwd``'s scheduling inputs)."""
    return call_inputs(
        shape.batch_size, shape.seqlen_q, shape.seqlen_k, shape.num_heads, shape.num_heads_k, shape.headdim,
        headdim_v=shape.headdim_v, qkv_dtype=schedule_dtype(shape.dtype), varlen_q=shape.varlen_q,
        has_cache_seqlens=shape.cache_seqlens is not None, has_leftpad=shape.cache_leftpad is not None,
        page_size=shape.page_size, causal=causal, window_size=window_size, has_softcap=float(softcap) > 0,
        num_splits=num_splits, pack_gqa=pack_gqa, sm_margin=sm_margin, num_sm=num_sm, arch=arch)


def call_schedule(shape: CallShape, args: CallArgs, num_sm: int = 132, arch: int = 90) -> Schedule:
    """The call's own resolved schedule (S_c, pack, tiles, Sort/Swizzle, metadata size) via refmodel."""
    return resolve_schedule(call_schedule_inputs(shape, args.causal, args.window_size, args.softcap, args.num_splits,
                                                 args.pack_gqa, args.sm_margin, num_sm, arch))


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


# ----------------------------------------------------------------------------------------------------------
# The tile plan: what the split kernel and the combine will read
# ----------------------------------------------------------------------------------------------------------


@dataclass
class TilePlan:
    """Per-virtual-batch work the kernels will do for one call.

    ``source``: ``"metadata"`` (the given tensor), ``"prepare"`` (the call's own prepare step), ``"static"``
    (not varlen: every batch gets S_c splits and the shape's m-blocks). Vectors have length b_c and hold
    what the kernels read (``UNWRITTEN`` where the metadata slot was never written). ``num_splits`` is all 1
    when the call is not Split (S_c == 1: FA3 ignores the metadata's split counts).
    """

    schedule: Schedule
    shape: CallShape
    source: str
    metadata_status: str            # "given", "ignored" (FA3 never reads it), "none"
    num_splits: list
    num_m_blocks: list
    batch_idx: list
    nheads_in_l2: Optional[list]
    decoded: Optional[DecodedMetadata]

    @property
    def split(self) -> bool:
        """FA3's ``Split`` template switch: the call's own S_c > 1."""
        return self.schedule.num_splits > 1

    @property
    def buffer_splits(self) -> int:
        return self.schedule.num_splits

    @property
    def capacity(self) -> Optional[int]:
        """Combine capacity kMax for this call (None when no combine runs)."""
        return combine_capacity(self.schedule.num_splits, self.shape.headdim_v) if self.split else None

    def rows_needed(self, bb: int) -> int:
        """m-block rows batch ``bb`` needs: Lq (times qhpk with the kernel's PackGQA)."""
        return self.shape.seqlens_q[bb] * (self.shape.qhead_per_khead if self.schedule.kernel_pack_gqa else 1)

    def m_blocks_needed(self, bb: int) -> int:
        return m_blocks_for(self.shape.seqlens_q[bb], self.shape.qhead_per_khead, self.schedule.kernel_pack_gqa,
                            self.schedule.kernel_block_m)

    def valid_batch(self, vb: int) -> Optional[int]:
        """The real batch of virtual batch ``vb``, or None when the slot is unwritten or out of range."""
        bb = self.batch_idx[vb]
        return bb if bb != UNWRITTEN and 0 <= bb < self.shape.batch_size else None

    def vectors(self) -> dict:
        return {"num_splits": list(self.num_splits), "num_m_blocks": list(self.num_m_blocks),
                "batch_idx": list(self.batch_idx), "nheads_in_l2": self.nheads_in_l2}


def _check_metadata_tensor(md, size: int, device: Optional[torch.device]) -> None:
    """FA3's checks on a given scheduler_metadata (mha_fwd: CHECK_DEVICE, CHECK_SHAPE, CHECK_CONTIGUOUS, dtype)."""
    if not isinstance(md, torch.Tensor):
        raise MetadataShapeError(f"scheduler_metadata: must be an int32 tensor, got {type(md).__name__}",
                                 expected="torch.Tensor", got=type(md).__name__)
    if device is not None and md.device != torch.device(device):
        raise MetadataShapeError(f"scheduler_metadata: must be on the call's device {device}, got {md.device}",
                                 expected=str(device), got=str(md.device))
    if tuple(md.shape) != (size,):
        raise MetadataShapeError(
            f"scheduler_metadata: shape must be ({size},) for this call (FA3 CHECK_SHAPE: nvec*b4 + semaphore), "
            f"got {tuple(md.shape)}", expected=(size,), got=tuple(md.shape))
    if not md.is_contiguous():
        raise MetadataShapeError("scheduler_metadata: must be contiguous", expected="contiguous", got="strided")
    if md.dtype != torch.int32:
        raise MetadataShapeError(f"scheduler_metadata: must have dtype int32, got {md.dtype}",
                                 expected=torch.int32, got=md.dtype)


def build_tile_plan(shape: CallShape, schedule: Schedule, scheduler_metadata=None,
                    device: Optional[torch.device] = None) -> TilePlan:
    """Check a given metadata tensor as FA3 does, then lay out what the kernels will read for this call."""
    b = shape.batch_size
    size = schedule.metadata_size
    status = "none"
    if scheduler_metadata is not None:
        if size == 0:
            status = "ignored"  # mha_fwd skips the whole metadata block: neither checked nor read
        else:
            _check_metadata_tensor(scheduler_metadata, size, device)
            status = "given"
    split = schedule.num_splits > 1
    if not schedule.inputs.uses_prepare:
        m = m_blocks_for(shape.seqlen_q, shape.qhead_per_khead, schedule.kernel_pack_gqa, schedule.kernel_block_m)
        return TilePlan(schedule, shape, "static", status, [schedule.num_splits if split else 1] * b, [m] * b,
                        list(range(b)), None, None)
    if status == "given":
        decoded = decode_metadata(scheduler_metadata, b, schedule.sort, schedule.swizzle)
        source = "metadata"
    else:
        _, result = call_own_metadata(schedule, shape.seqused_k, seqlens_q=list(shape.seqlens_q),
                                      leftpad_k=None if shape.cache_leftpad is None else list(shape.cache_leftpad))
        decoded = decode_metadata(encode_metadata(schedule, result), b, schedule.sort, schedule.swizzle)
        source = "prepare"
    return TilePlan(
        schedule, shape, source, status,
        num_splits=decoded.num_splits[:b] if split else [1] * b,
        num_m_blocks=decoded.num_m_blocks[:b],
        batch_idx=decoded.batch_idx[:b] if schedule.sort else list(range(b)),
        nheads_in_l2=None if decoded.nheads_in_l2 is None else decoded.nheads_in_l2[:b],
        decoded=decoded)


def own_metadata_comparison(plan: TilePlan) -> Optional[dict]:
    """Given metadata against what the call would have computed for itself (refmodel ``call_own_metadata``).

    Per real batch (through each side's batch order), the split count the kernels read and the m-blocks; None
    when no metadata was given or the call is not varlen. ``differs`` names the batches where the two disagree:
    not a fault by itself (stale lengths are harmless), but where the precompute was not what the call expects.
    """
    if plan.source != "metadata" or not plan.schedule.inputs.uses_prepare:
        return None
    shape, schedule = plan.shape, plan.schedule
    _, own = call_own_metadata(schedule, shape.seqused_k, seqlens_q=list(shape.seqlens_q),
                               leftpad_k=None if shape.cache_leftpad is None else list(shape.cache_leftpad))
    b = shape.batch_size
    own_order = own.batch_idx if own.batch_idx is not None else list(range(b))
    own_by_batch = {bb: (own.num_splits[vb] if plan.split else 1, own.num_m_blocks[vb]) for vb, bb in enumerate(own_order)}
    given_by_batch = {}
    for vb in range(b):
        bb = plan.valid_batch(vb)
        if bb is not None:
            given_by_batch.setdefault(bb, (plan.num_splits[vb], plan.num_m_blocks[vb]))
    differs = [bb for bb in range(b) if given_by_batch.get(bb) != own_by_batch.get(bb)]
    return {"own_num_splits": [own_by_batch[bb][0] for bb in range(b)],
            "own_num_m_blocks": [own_by_batch[bb][1] for bb in range(b)],
            "given_num_splits": [given_by_batch.get(bb, (None, None))[0] for bb in range(b)],
            "given_num_m_blocks": [given_by_batch.get(bb, (None, None))[1] for bb in range(b)],
            "differs": differs}


# ----------------------------------------------------------------------------------------------------------
# The checks: spec.invariants' verdicts on what the call reads
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    """One access out of bounds: the invariant, the batch, the offending indices, and a sentence."""

    invariant: str
    batch: Optional[int]
    indices: dict = field(default_factory=dict)
    detail: str = ""

    def to_dict(self) -> dict:
        return {"invariant": self.invariant, "batch": self.batch, "indices": dict(self.indices), "detail": self.detail}


def uncovered_rows(plan: TilePlan, vb: int) -> Optional[tuple[int, int, int]]:
    """(m-blocks the kernel runs, m-blocks needed, first uncovered m-block row) for virtual batch vb, or None."""
    bb = plan.valid_batch(vb)
    if bb is None or plan.num_m_blocks[vb] == UNWRITTEN or (plan.split and plan.num_splits[vb] == UNWRITTEN):
        return None
    have = plan.num_m_blocks[vb]
    if plan.split and plan.num_splits[vb] <= 0:
        have = 0  # the tile scheduler gives the batch num_m_blocks * num_splits = 0 tiles
    need = plan.m_blocks_needed(bb)
    if have >= need:
        return None
    return max(have, 0), need, max(have, 0) * plan.schedule.kernel_block_m


def spec_verdicts(plan: TilePlan) -> list[Violation]:
    """``spec.invariants.check_all`` on the vectors this plan reads.

    spec states the invariants over a (precompute schedule, prepare result, call schedule, call lengths)
    quadruple and re-encodes the precompute's tensor. A given tensor is bridged by a stub precompute whose
    layout is the call's with all b4 slots "written" by the decoded vectors (UNWRITTEN values included), so
    spec's encode/decode reproduces exactly the values the call reads.
    """
    from refmodel.prepare import PrepareResult
    from spec import invariants

    decoded, schedule, shape = plan.decoded, plan.schedule, plan.shape
    b4 = decoded.layout.b4
    stub_schedule = dataclasses.replace(schedule, inputs=dataclasses.replace(schedule.inputs, batch_size=b4))
    stub_result = PrepareResult(num_splits=list(decoded.num_splits), num_m_blocks=list(decoded.num_m_blocks),
                                batch_idx=None if decoded.batch_idx is None else list(decoded.batch_idx),
                                nheads_in_l2=None if decoded.nheads_in_l2 is None else list(decoded.nheads_in_l2),
                                blocks_per_sm=None)
    lengths = invariants.CallLengths(tuple(shape.seqused_k), tuple(shape.seqlens_q))
    out = []
    for v in invariants.check_all(stub_schedule, stub_result, schedule, lengths):
        indices = dict(v.detail)
        if v.invariant in ("SPLIT_BOUND", "COMBINE_CAPACITY") and "metadata_splits" in indices:
            first = plan.buffer_splits if v.invariant == "SPLIT_BOUND" else plan.capacity
            indices.setdefault("splits", list(range(first, int(indices["metadata_splits"]))))
        batch = v.batch
        if batch is None and "virtual_batch" in indices:
            batch = indices["virtual_batch"]
        out.append(Violation(v.invariant, batch, indices, v.message))
    return out


def check_plan(plan: TilePlan) -> list[Violation]:
    """All violations of a plan, ordered by :data:`INVARIANTS` then by virtual batch.

    Empty when the kernels do not run (``mha_fwd`` returns without launching when the call has no queries or
    no key slots) or the call is not varlen (the kernels read no per-batch vectors).
    """
    if not plan.shape.kernel_runs or plan.source == "static":
        return []
    found = spec_verdicts(plan)
    rank = {name: i for i, name in enumerate(INVARIANTS)}
    order = sorted(range(len(found)), key=lambda i: (rank.get(found[i].invariant, len(rank)),
                                                     found[i].indices.get("virtual_batch", plan.shape.batch_size), i))
    return [found[i] for i in order]


def raise_first(violations: Sequence[Violation]) -> None:
    """Raise :class:`OutOfBoundsAccess` for the first violation (all of them attached)."""
    if violations:
        v = violations[0]
        raise OutOfBoundsAccess(v.invariant, v.batch, v.indices, v.detail, violations=list(violations))


@dataclass
class Poison:
    """What a faulty plan does to the output on a GPU: whole batches garbage, or some (row, head) pairs unwritten."""

    batches: set = field(default_factory=set)               # real batches whose every row is garbage
    uncovered: dict = field(default_factory=dict)           # bb -> first uncovered m-block row (packed/unpacked)

    @property
    def any(self) -> bool:
        return bool(self.batches or self.uncovered)


def poison_of(plan: TilePlan, violations: Sequence[Violation]) -> Poison:
    """Map violations to their effect on the output (gpu-like mode).

    * SPLIT_BOUND / COMBINE_CAPACITY on batch bb: the combine reads partials past the buffers for every row of
      bb (each row reads the LSE of every split < min(count, kMax)), so all of bb is garbage;
    * BATCH_PERMUTATION: a batch never visited, or visited from an unwritten slot, is garbage; a batch visited
      twice with different split counts races with itself (garbage);
    * QUERY_COVER: the rows past the covered m-blocks are never written.
    """
    p = Poison()
    b = plan.shape.batch_size
    for v in violations:
        if v.invariant in ("SPLIT_BOUND", "COMBINE_CAPACITY") and v.batch is not None:
            bb = plan.valid_batch(v.indices["virtual_batch"])
            if bb is not None:
                p.batches.add(bb)
        elif v.invariant == "BATCH_PERMUTATION":
            if "missing" in v.indices:
                p.batches.update(v.indices["missing"])
            elif "vector" in v.indices:
                bb = plan.valid_batch(v.indices["virtual_batch"])
                if bb is not None:
                    p.batches.add(bb)
    visits: dict = {}
    for vb in range(b):
        bb = plan.valid_batch(vb)
        if bb is not None:
            visits.setdefault(bb, set()).add(plan.num_splits[vb])
    p.batches.update(bb for bb, counts in visits.items() if len(counts) > 1)
    for vb in range(b):
        bb = plan.valid_batch(vb)
        if bb is None or bb in p.batches:
            continue
        gap = uncovered_rows(plan, vb)
        if gap is not None:
            p.uncovered[bb] = min(p.uncovered.get(bb, math.inf), gap[2])
    # a batch visited twice keeps the better-covering visit's rows
    for bb in list(p.uncovered):
        firsts = [uncovered_rows(plan, vb) for vb in range(b) if plan.valid_batch(vb) == bb]
        if any(g is None for g in firsts):
            del p.uncovered[bb]
    return p


# ----------------------------------------------------------------------------------------------------------
# The adapter interface
# ----------------------------------------------------------------------------------------------------------


MODES = ("strict", "gpu-like")


class KernelAdapter(abc.ABC):
    """One FA3 implementation behind FA3's Python entry points.

    * ``name``: registry name; ``mode``: ``"strict"`` (faults raise :class:`~gpu_impl.errors.OutOfBoundsAccess`)
      or ``"gpu-like"`` (faults poison the result as on a GPU);
    * ``get_scheduler_metadata(...)`` / ``flash_attn_with_kvcache(...)``: FA3's signatures
      (``hopper/flash_attn_interface.py``); arguments in :data:`UNSUPPORTED_ARGUMENTS` raise
      ``NotImplementedError`` naming the argument; ``return_softmax_lse=True`` returns ``(out, lse)``;
    * ``effective_call_inputs(...)``: the refmodel ``ScheduleInputs`` the kernel will schedule this call from
      (differs from the call's own when the adapter reshapes the call, e.g. gathers paged KV);
    * ``describe()``: which implementation/build runs;
    * ``last_trace``: a dict about the most recent ``flash_attn_with_kvcache`` call (call schedule, metadata
      vectors used, verdicts); ``last_metadata_trace``: the same for the most recent precompute.
    """

    name: str = "abstract"

    def __init__(self, mode: str = "strict", device=None, num_sm: int = 132, arch: int = 90):
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.device = None if device is None else torch.device(device)
        self.num_sm = int(num_sm)
        self.arch = int(arch)
        self.last_trace: Optional[dict] = None
        self.last_metadata_trace: Optional[dict] = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"

    @abc.abstractmethod
    def describe(self) -> str:
        """Which implementation and build this adapter runs."""

    @abc.abstractmethod
    def get_scheduler_metadata(self, batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                               cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None,
                               cu_seqlens_k_new=None, cache_leftpad=None, page_size=None, max_seqlen_k_new=0,
                               causal=False, window_size=(-1, -1), attention_chunk=0, has_softcap=False,
                               num_splits=0, pack_gqa=None, sm_margin=0):
        """FA3's ``get_scheduler_metadata``: the int32 metadata tensor for these precompute inputs."""

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                                cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                                q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                                window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                                scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                                return_softmax_lse=False):
        """FA3's ``flash_attn_with_kvcache``; returns ``out`` or ``(out, softmax_lse)``."""
        reject_unsupported(self.name, dict(k=k, v=v, qv=qv, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                           cache_batch_idx=cache_batch_idx, cu_seqlens_k_new=cu_seqlens_k_new,
                                           rotary_seqlens=rotary_seqlens, q_descale=q_descale, k_descale=k_descale,
                                           v_descale=v_descale, attention_chunk=attention_chunk))
        if len(tuple(window_size)) != 2:
            raise ValueError(f"window_size: must be a pair (left, right), got {window_size!r}")
        args = CallArgs(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                        cache_leftpad=cache_leftpad, page_table=page_table, cu_seqlens_q=cu_seqlens_q,
                        max_seqlen_q=max_seqlen_q, softmax_scale=softmax_scale, causal=bool(causal),
                        window_size=(int(window_size[0]), int(window_size[1])), softcap=float(softcap or 0.0),
                        scheduler_metadata=scheduler_metadata, num_splits=int(num_splits), pack_gqa=pack_gqa,
                        sm_margin=int(sm_margin), return_softmax_lse=bool(return_softmax_lse))
        out, lse = self._run(args)
        return (out, lse) if return_softmax_lse else out

    @abc.abstractmethod
    def _run(self, args: CallArgs) -> tuple[torch.Tensor, torch.Tensor]:
        """Execute one call; return (out, lse) in FA3's layouts."""

    def effective_call_inputs(self, q, k_cache, v_cache, cache_seqlens=None, cache_leftpad=None, page_table=None,
                              cu_seqlens_q=None, max_seqlen_q=None, causal=False, window_size=(-1, -1), softcap=0.0,
                              num_splits=0, pack_gqa=None, sm_margin=0) -> ScheduleInputs:
        """The ``ScheduleInputs`` this adapter's kernel schedules the call from (here: the call's own)."""
        shape = call_shape(q, k_cache, v_cache, cache_seqlens, cache_leftpad, page_table, cu_seqlens_q, max_seqlen_q)
        return call_schedule_inputs(shape, causal, window_size, softcap, num_splits, pack_gqa, sm_margin,
                                    self.num_sm, self.arch)

    def _trace(self, shape: CallShape, plan: Optional[TilePlan], violations: Sequence[Violation], **extra) -> dict:
        trace = {
            "adapter": self.name, "mode": self.mode, "describe": self.describe(),
            "call": {"batch_size": shape.batch_size, "seqlen_q": shape.seqlen_q, "seqlen_k": shape.seqlen_k,
                     "num_heads": shape.num_heads, "num_heads_k": shape.num_heads_k, "headdim": shape.headdim,
                     "headdim_v": shape.headdim_v, "page_size": shape.page_size, "varlen_q": shape.varlen_q,
                     "cache_seqlens": None if shape.cache_seqlens is None else list(shape.cache_seqlens)},
            "schedule": None if plan is None else schedule_summary(plan.schedule),
            "metadata": None if plan is None else {"status": plan.metadata_status, "source": plan.source,
                                                   **plan.vectors()},
            "combine_capacity": None if plan is None else plan.capacity,
            "verdicts": [v.to_dict() for v in violations],
            "ok": not violations,
        }
        trace.update(extra)
        self.last_trace = trace
        return trace
