"""The tile plan: what FA3's split kernel and combine will read for one call.

Invariant: a given metadata tensor passes FA3's ``CHECK_SHAPE`` or raises
:class:`~gpu_impl.errors.MetadataShapeError`; the per-virtual-batch split counts, m-block counts and batch order
come from that metadata when given, else from the call's own prepare step with the kernel's tiles and forced
pack-GQA (``hopper/flash_fwd_launch_template.h``), else from the static shapes when the call is not varlen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from refmodel.combine import combine_capacity
from refmodel.fa3_scheduler import Schedule
from refmodel.metadata import UNWRITTEN, DecodedMetadata, call_own_metadata, decode_for_schedule, encode_metadata
from refmodel.prepare import m_blocks_for

from ..errors import MetadataShapeError
from .call_model import CallShape


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
        decoded = decode_for_schedule(scheduler_metadata, schedule)
        source = "metadata"
    else:
        own, result = call_own_metadata(schedule, shape.seqused_k, seqlens_q=list(shape.seqlens_q),
                                        leftpad_k=None if shape.cache_leftpad is None else list(shape.cache_leftpad),
                                        seqlens_new=None if shape.seqlens_new is None else list(shape.seqlens_new))
        decoded = decode_for_schedule(encode_metadata(own, result), own)
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
                               leftpad_k=None if shape.cache_leftpad is None else list(shape.cache_leftpad),
                               seqlens_new=None if shape.seqlens_new is None else list(shape.seqlens_new))
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
