"""The checks on a tile plan: ``spec.invariants``' verdicts on what the call reads, and the damage a GPU shows.

Invariant: every access the plan makes out of bounds is named (a ``spec.violation.Violation``: the offending
indices in ``detail``, the sentence in ``message``; in :data:`INVARIANTS` order) before any numerics, by
``spec.invariants.check_all`` bridged from a metadata tensor (:func:`spec_verdicts`); :func:`poison_of` marks the
batches and rows whose result is garbage on a GPU (``hopper/epilogue_fwd.hpp``, ``hopper/flash_fwd_combine_kernel.h``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from refmodel.metadata import UNWRITTEN
from spec.violation import Violation

from ..errors import OutOfBoundsAccess
from .tile_plan import TilePlan


#: Invariant names, in the order a fault is reported when one call breaks several (the first is raised).
INVARIANTS = ("BATCH_PERMUTATION", "SPLIT_BOUND", "QUERY_COVER", "COMBINE_CAPACITY", "KV_COVER")


# ----------------------------------------------------------------------------------------------------------
# The checks: spec.invariants' verdicts on what the call reads
# ----------------------------------------------------------------------------------------------------------


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
    # the stub's tensor must have the call's size: b4 slots per vector, except the semaphore-and-splits layout of
    # the older fork builds, whose split vector has b slots (a stub of b4 would fail spec's SHAPE check and hide
    # every violation)
    n = schedule.inputs.batch_size if decoded.layout.legacy else decoded.layout.b4
    stub_schedule = dataclasses.replace(schedule, inputs=dataclasses.replace(schedule.inputs, batch_size=n))
    stub_result = PrepareResult(num_splits=list(decoded.num_splits)[:n], num_m_blocks=list(decoded.num_m_blocks)[:n],
                                batch_idx=None if decoded.batch_idx is None else list(decoded.batch_idx),
                                nheads_in_l2=None if decoded.nheads_in_l2 is None else list(decoded.nheads_in_l2),
                                blocks_per_sm=None,
                                prepare_seqlen_q=None if decoded.prepare_seqlen_q is None else list(decoded.prepare_seqlen_q))
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
                                                     found[i].detail.get("virtual_batch", plan.shape.batch_size), i))
    return [found[i] for i in order]


def raise_first(violations: Sequence[Violation]) -> None:
    """Raise :class:`OutOfBoundsAccess` for the first violation (all of them attached)."""
    if violations:
        v = violations[0]
        raise OutOfBoundsAccess(v.invariant, v.batch, v.detail, v.message, violations=list(violations))


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
            bb = plan.valid_batch(v.detail["virtual_batch"])
            if bb is not None:
                p.batches.add(bb)
        elif v.invariant == "BATCH_PERMUTATION":
            if "missing" in v.detail:
                p.batches.update(v.detail["missing"])
            elif "vector" in v.detail:
                bb = plan.valid_batch(v.detail["virtual_batch"])
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
