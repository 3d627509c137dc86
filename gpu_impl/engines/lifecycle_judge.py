"""The metadata-lifecycle invariants (spec.lifecycle_invariants) judged on an engine driver's real FA3 hand-offs.

The sglang and vLLM drivers hand every precompute and every launch their release's code makes to
:class:`LifecycleJudge` (besides the pair checks of ``gpu_impl.fa3_calls.CheckingFA3``). It follows the real metadata
tensors the engine passes (its eager precompute, its persistent CUDA-graph buffer) over layers x steps, eager,
captured and replayed, and judges each launch before it runs:

- ``SEMAPHORE_STARTS_AT_ZERO``: the tile-count semaphore slot of the tensor handed to a launch that uses it holds 0
  (flash_api.cpp@0251105a 1015-1016: nothing zeroes it when metadata is given); not judged at capture (a captured
  launch does not run). After each launch the shape-only FA3 leaves in that slot what FA3's scheduler and its reset
  leave there (refmodel.metadata_lifecycle ``launch_tiles`` and ``semaphore_after_launch``), so the next layer and
  the next replay read what they would read on a GPU;
- ``READS_OWN_STEP_METADATA``: the precompute whose bytes the launch reads was made at this launch's own step and
  DP rank (``gpu_impl.lifecycle_checks.replay_freshness``);
- ``CAPTURE_COVERS_REPLAY`` (replays): the replay's KV lengths fit the page-table width fixed at capture, and every
  split count it reads fits the captured S_c and the combine's kMax;
- ``PADDED_ROWS_READ_DEFINED``: no slot the launch reads (refmodel.metadata_lifecycle ``read_slots``) holds a value
  no precompute wrote. The drivers' shape-only FA3 fills such slots with refmodel's ``UNWRITTEN`` sentinel, which an
  engine's ``buf[:n] = md`` copies along, so a padded row reading one is seen (on a GPU the slot holds garbage);
- ``SHARED_PRECOMPUTE_MATCHES_LAYER``: the precompute was made with this layer's heads, head dims, dtype, masking,
  paging, SM count and build (refmodel.metadata_lifecycle ``METADATA_INPUT_FIELDS``);
- ``PRECOMPUTE_CALL_SIZE_AGREE``: the precompute's size is the size the launch expects while the tensor handed to
  it has the launch's size (silent: behind a persistent view FA3's CHECK_SHAPE passes); a tensor of another size is
  the pair check's loud SHAPE.

Seeded defects (:data:`ENGINE_DEFECTS`), applied by the drivers from outside the engine's code, are the negative
controls of these checks on the real paths (tests/engines/test_engine_lifecycle.py).
"""

from __future__ import annotations

from typing import Optional

from refmodel.fa3_scheduler import combine_capacity
from refmodel.metadata_layout import UNWRITTEN, MetadataLayout, decode_values_for_schedule
from refmodel.metadata_lifecycle import (METADATA_INPUT_FIELDS, FA3Behaviour, launch_tiles, read_slots,
                                         semaphore_after_launch)
from spec.violation import Violation

from ..fa3_checks import padded_replay_read
from ..fa3_records import call_schedule_of, precompute_schedule
from ..lifecycle_checks import replay_freshness

__all__ = ["ENGINE_DEFECTS", "LifecycleJudge", "check_engine_defect"]

#: seeded defects of a driven sequence (name -> what the driver changes), each caught by one lifecycle check
ENGINE_DEFECTS = {
    "no-semaphore-reset-after-reuse": "FA3 as before 1a58058a: nothing zeroes the semaphore after a one-split launch "
                                      "that was given metadata (the shape-only FA3 leaves the scheduler's count)",
    "capture-width-of-capture-batch": "the captured call's page table is cut to the capture batch's own KV width "
                                      "instead of the whole context",
    "precompute-over-real-rows": "a CUDA-graph replay's recompute covers the real rows only, not the padded batch "
                                 "the graph launches",
    "shared-precompute-heterogeneous-heads": "the last layer has half the query heads of the others and shares "
                                             "their precompute",
}


def check_engine_defect(name) -> Optional[str]:
    """``name`` if it is a known engine defect (None passes); ValueError naming the field and the choices."""
    if name is None or name in ENGINE_DEFECTS:
        return name
    raise ValueError(f"lifecycle_defect: null or one of {', '.join(sorted(ENGINE_DEFECTS))}; got {name!r}")


class LifecycleJudge:
    """Judges every launch of a driven sequence against the metadata's life (see the module doc)."""

    def __init__(self, defect: Optional[str] = None):
        self.defect = check_engine_defect(defect)
        self.fa3 = FA3Behaviour(reset_after_reuse=self.defect != "no-semaphore-reset-after-reuse")
        #: id(precompute record) -> (record, (step, dp_rank) it was made at)
        self.made_at: dict = {}
        self.launches = 0

    def note_precompute(self, pre, where) -> None:
        if pre is not None:
            self.made_at[id(pre)] = (pre, tuple(where))

    # -- one launch --------------------------------------------------------------------------------------------
    def before(self, pre, call, md, where, path: str, pair=()) -> list:
        """The lifecycle violations of a launch (``path``: "eager", "capture" or "replay") given tensor ``md``;
        ``pair``: the pair check's violations of the same launch (a SHAPE there already names the precompute that
        does not fit this launch, so the shared-precompute and size checks add nothing to it)."""
        import torch

        if call is None or not isinstance(md, torch.Tensor):
            return []
        self.launches += 1
        sched = call_schedule_of(call)
        if md.numel() != sched.metadata_size:
            return []   # CHECK_SHAPE raises: the pair check's SHAPE (loud), nothing is launched
        values = [int(v) for v in md.detach().reshape(-1).to("cpu").tolist()]
        found = []
        if path != "capture" and call.kernel_runs and sched.needs_semaphore:
            sem = values[MetadataLayout.for_schedule(sched).semaphore_offset]
            if sem != 0:
                found.append(Violation("SEMAPHORE_STARTS_AT_ZERO", None, {"semaphore": sem, "path": path},
                                       f"the {path} launch starts its tile scheduler from a semaphore of {sem}: FA3 "
                                       f"does not zero it when metadata is given (flash_api.cpp 1015-1016), so the "
                                       f"dynamic scheduler skips up to {sem} tiles"))
        if path != "capture":
            found += replay_freshness(pre, self.made_at, where, path)
        if path == "replay":
            found += self._capture_covers(call, sched, values)
        undefined = sorted({vb for name, vb, at in read_slots(sched) if values[at] == UNWRITTEN})
        if undefined:
            found.append(Violation("PADDED_ROWS_READ_DEFINED", None,
                                   {"virtual_batches": undefined, "batch": sched.inputs.batch_size, "path": path},
                                   f"the {path} launch reads metadata slots no precompute wrote, for virtual batches "
                                   f"{undefined[:8]} of {sched.inputs.batch_size} (a precompute over fewer rows)"))
        if pre is not None and not any(v.invariant == "SHAPE" for v in pair):
            # a replay reading past its recompute's write where the build's empty-row rule judged the slots there
            # (the pair check's verdict, fa3_checks.padded_replay_read): the sizes differ by design, not silently
            judged = path == "replay" and padded_replay_read(pre, call, values) is not None
            found += self._shared_and_size(pre, sched, path, sizes=not judged)
        return found

    def after(self, call, md, path: str) -> None:
        """What the launch leaves in the semaphore slot: the scheduler's fetches, then FA3's reset (or none, seeded)."""
        import torch

        if path == "capture" or call is None or not isinstance(md, torch.Tensor) or not call.kernel_runs:
            return
        sched = call_schedule_of(call)
        if md.numel() != sched.metadata_size or not sched.needs_semaphore:
            return
        flat = md.reshape(-1)
        values = [int(v) for v in flat.detach().to("cpu").tolist()]
        at = MetadataLayout.for_schedule(sched).semaphore_offset
        _, after = semaphore_after_launch(max(values[at], 0), launch_tiles(values, sched), sched.inputs.num_sm,
                                          sched.num_splits, True, self.fa3.reset_after_reuse)
        if after != values[at]:
            flat[at] = after

    # -- the checks that need the captured geometry or the precompute --------------------------------------------
    @staticmethod
    def _capture_covers(call, sched, values) -> list:
        problems = {}
        lens = [int(x) for x in (call.cache_seqlens or ())]
        if lens and max(lens) > sched.inputs.seqlen_k:
            problems["kv_width"] = [max(lens), sched.inputs.seqlen_k]
        if sched.num_splits > 1:
            bound = min(sched.num_splits, combine_capacity(sched.num_splits, sched.inputs.headdim_v))
            decoded = decode_values_for_schedule(values, sched)
            over = [int(s) for s in decoded.num_splits[:sched.inputs.batch_size] if s > bound]
            if over:
                problems["splits"] = [max(over), bound]
        if not problems:
            return []
        return [Violation("CAPTURE_COVERS_REPLAY", None, problems,
                          "the graph's captured launch does not cover this replay: "
                          + ", ".join(f"{k} {v[0]} > {v[1]}" for k, v in problems.items()))]

    @staticmethod
    def _shared_and_size(pre, sched, path: str, sizes: bool = True) -> list:
        try:
            p = precompute_schedule(pre)
        except ValueError:
            return []   # FA3 rejects the precompute itself (the driver reports FA3_REJECTED)
        found = []
        diff = {f: [getattr(p.inputs, f), getattr(sched.inputs, f)] for f in METADATA_INPUT_FIELDS
                if getattr(p.inputs, f) != getattr(sched.inputs, f)}
        if diff:
            found.append(Violation("SHARED_PRECOMPUTE_MATCHES_LAYER", None, {"fields": diff, "path": path},
                                   "the layer uses a precompute made for other shapes: "
                                   + ", ".join(f"{k} {v[0]} (precompute) != {v[1]} (layer)"
                                               for k, v in diff.items())))
        if sizes and p.metadata_size != sched.metadata_size:
            found.append(Violation("PRECOMPUTE_CALL_SIZE_AGREE", None,
                                   {"precompute_size": p.metadata_size, "call_size": sched.metadata_size,
                                    "path": path},
                                   f"the {path} launch expects {sched.metadata_size} metadata slots; its precompute "
                                   f"made {p.metadata_size} (silent: the tensor it was handed has the launch's size)"))
        return found
