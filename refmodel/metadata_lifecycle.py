"""FA3's scheduler metadata as state: a tensor that lives across layers, decode steps and CUDA-graph replays.

The facts this module models are in ``metadata_lifecycle_facts.json`` (docs/invariants.md renders them), read from
FA3's ``hopper/`` at commit 0251105a and the engines' released wheels (sglang 0.5.23, vLLM 0.33.0):

- a **precompute** (``mha_fwd_get_scheduler_metadata``) returns a fresh tensor: the prepare kernel writes the per-batch
  vectors for virtual batches ``0..b-1`` and 0 to the semaphore (flash_prepare_scheduler.cu 77, 197-215); slots
  ``[b, b4)`` keep uninitialised memory (:data:`UNWRITTEN`);
- a **launch** given metadata (``mha_fwd``, flash_api.cpp 1004-1025) checks only its size, runs no prepare step and
  does not zero the semaphore first; its dynamic persistent scheduler starts CTA i at tile i and fetches every further
  tile as ``atomicAdd(semaphore, 1) + num_sm`` (tile_scheduler.hpp 763-788); afterwards the combine kernel (S_c > 1,
  flash_fwd_combine_kernel.h 439-441) or the host (S_c == 1, flash_api.cpp 1186-1188) writes 0 back. FA3 before
  1a58058a did not reset after a one-split launch: :class:`FA3Behaviour` ``reset_after_reuse``;
- an engine **copies** a precompute into a persistent buffer (``buf[:n] = md``, and ``buf[n:] = 0`` in both
  sglang 0.5.23 and vLLM 0.33.0) and passes the view ``buf[:n]``;
- a **capture** fixes the launch's geometry (S_c, the partial buffers, the combine's kMax and grid, the page-table
  width, the metadata view's address and length): mha_fwd's host code does not run again; a **replay** re-runs only
  the engine's metadata recompute over the persistent buffer and then the recorded kernels.

Every slot carries its provenance (:class:`Origin`: which step's precompute wrote it, or the engine's zero fill, or a
kernel), so invariants over a whole sequence of launches (spec.lifecycle_invariants) can ask whose data a launch read.
Formulas are refmodel's own: the schedule (fa3_scheduler.resolve_schedule), the prepare step (prepare), the layout
and codec (metadata_layout); nothing here re-derives them. Plain ints, no torch.

Simplified (docs/invariants.md says so too): the main kernel is not run; a launch's effect on the semaphore is the
count of tile fetches its scheduler makes, ``min(num_sm, T) + max(0, T - s - num_sm)`` for T tiles (sum of m-blocks x
heads x splits over the call's batches, negative values read as 0) and a start s >= 0; a capture records the launch
without running it (warm-up runs before a capture are eager steps of the scenario).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional, Sequence

from . import fa3_builds
from .fa3_scheduler import Schedule, ScheduleInputs, call_inputs, combine_capacity, precompute_inputs, resolve_schedule
from .metadata_layout import UNWRITTEN, MetadataLayout, decode_values_for_schedule, encode_metadata_values
from .prepare import prepare_scheduler

__all__ = ["Origin", "MetadataTensor", "View", "Precomputed", "FA3Behaviour", "Read", "LaunchRecord",
           "CapturedLaunch", "precompute", "allocate_persistent", "copy_into", "launch", "capture", "tile_fetches",
           "semaphore_after_launch", "skipped_tiles", "read_slots", "launch_tiles",
           "LayerShape", "EngineModel", "Step", "Trace", "run_sequence", "METADATA_INPUT_FIELDS"]

_tensor_ids = itertools.count(1)


@dataclass(frozen=True)
class Origin:
    """Who last wrote a slot: ``precompute`` (the prepare kernel of step ``step``), ``unwritten`` (a precompute's
    uninitialised slot, copied with it), ``zero_fill`` (torch.zeros or an engine's tail zeroing; step None at
    allocation) or ``kernel`` (the semaphore after a launch)."""

    kind: str
    step: Optional[int]

    @property
    def defined(self) -> bool:
        """A value someone chose (not uninitialised memory)."""
        return self.kind != "unwritten"


@dataclass
class MetadataTensor:
    """An int32 metadata tensor (or a persistent buffer): slot values and their provenance."""

    values: list
    origins: list
    ident: int = field(default_factory=lambda: next(_tensor_ids))

    def __len__(self) -> int:
        return len(self.values)

    def view(self, offset: int = 0, length: Optional[int] = None) -> "View":
        length = len(self.values) - offset if length is None else length
        if offset < 0 or length < 0 or offset + length > len(self.values):
            raise ValueError(f"view: [{offset}, {offset + length}) outside a tensor of {len(self.values)} slots")
        return View(self, offset, length)


@dataclass(frozen=True)
class View:
    """A contiguous slice ``tensor[offset:offset+length]``: what a call receives as ``scheduler_metadata``."""

    tensor: MetadataTensor
    offset: int
    length: int

    def values(self) -> list:
        return self.tensor.values[self.offset:self.offset + self.length]


@dataclass(frozen=True)
class Precomputed:
    """A precompute's result: its resolved schedule, its fresh tensor and the step it was made for."""

    schedule: Schedule
    tensor: MetadataTensor
    step: Optional[int]

    @property
    def size(self) -> int:
        return len(self.tensor)


@dataclass(frozen=True)
class FA3Behaviour:
    """What FA3 does after a launch that reused metadata (flash_api.cpp@0251105a 1167-1188).

    ``reset_after_reuse`` False is FA3 before commit 1a58058a (2025-03-29): with one split nothing zeroed the
    semaphore, so the next launch over the same tensor started from the count this one left.
    """

    reset_after_reuse: bool = True


def precompute(inputs: ScheduleInputs, cache_seqlens: Sequence[int], seqlens_q: Optional[Sequence[int]] = None,
               step: Optional[int] = None) -> Precomputed:
    """``get_scheduler_metadata`` as state: a fresh tensor written per FA3 (prepare step and layout: refmodel)."""
    if not inputs.precompute:
        raise ValueError("inputs: a precompute's inputs (precompute_inputs) are needed, got a call's")
    schedule = resolve_schedule(inputs)
    result = prepare_scheduler(schedule, list(cache_seqlens), seqlens_q=seqlens_q)
    values = encode_metadata_values(schedule, result)
    origins = [Origin("unwritten" if v == UNWRITTEN else "precompute", step) for v in values]
    return Precomputed(schedule, MetadataTensor(values, origins), step)


def allocate_persistent(size: int) -> MetadataTensor:
    """An engine's persistent buffer: ``torch.zeros(size, int32)`` (sglang 0.5.23 2453-2460; vLLM 0.33.0 762-766)."""
    if size < 1:
        raise ValueError(f"size: must be >= 1, got {size}")
    return MetadataTensor([0] * size, [Origin("zero_fill", None)] * size)


def copy_into(buffer: MetadataTensor, md: Precomputed, zero_tail: bool = True, step: Optional[int] = None) -> View:
    """``buf[:n] = md`` and, with ``zero_tail``, ``buf[n:] = 0``; returns the view ``buf[:n]`` (both engines)."""
    n = md.size
    if n > len(buffer):
        raise ValueError(f"md: {n} slots do not fit the persistent buffer of {len(buffer)}")
    buffer.values[:n] = list(md.tensor.values)
    buffer.origins[:n] = list(md.tensor.origins)
    if zero_tail:
        tail = len(buffer) - n
        buffer.values[n:] = [0] * tail
        buffer.origins[n:] = [Origin("zero_fill", step if step is not None else md.step)] * tail
    return buffer.view(0, n)


@dataclass(frozen=True)
class Read:
    """One slot a launch read: its index in the tensor, the vector, the virtual batch, value and provenance."""

    slot: int
    vector: str
    vb: int
    value: int
    origin: Origin


@dataclass(frozen=True)
class LaunchRecord:
    """What one launch read and left behind (flash_api.cpp 1004-1025, 1167-1188; tile_scheduler.hpp 763-788)."""

    step: int
    layer: int
    mode: str                      #: "eager" or "replay"
    call: Schedule                 #: the launch's schedule (a replay's: the one fixed at capture)
    tensor_id: int
    view_offset: int
    view_length: int
    shape_error: bool              #: the view's length is not the call's metadata size (FA3 raises, nothing runs)
    kernel_ran: bool
    semaphore_start: Optional[int]
    semaphore_origin: Optional[Origin]
    semaphore_end: Optional[int]   #: after the main kernel, before any reset
    semaphore_after: Optional[int]  #: what the slot holds when the call returns
    tiles: int                     #: T: work tiles of the launch (from the metadata it read)
    skipped_tiles: int             #: tiles [num_sm, num_sm + s) a start s > 0 makes the scheduler skip
    reads: tuple                   #: every per-batch slot read (Read)
    real_batch: int                #: rows before padding ([real_batch, b) are padded rows)
    seqused_k: tuple               #: the launch's own KV lengths
    precompute: Optional[Precomputed] = None  #: the precompute the engine meant this launch to use
    captured: Optional["CapturedLaunch"] = None


def tile_fetches(tiles: int, start: int, num_sm: int) -> int:
    """atomicAdds the persistent scheduler makes: each of min(num_sm, T) working CTAs ends on one fetch past the end,
    and every tile from num_sm + start on is fetched once (tile_scheduler.hpp 763-788); start >= 0."""
    return min(num_sm, tiles) + max(0, tiles - start - num_sm)


def semaphore_after_launch(start: int, tiles: int, num_sm: int, num_splits: int, kernel_runs: bool,
                           reset_after_reuse: bool = True) -> tuple:
    """(after the main kernel, when the call returns) for a launch given metadata whose semaphore holds ``start``.

    The scheduler adds its fetches (:func:`tile_fetches`, tile_scheduler.hpp 763-788); then the combine (S_c > 1,
    flash_fwd_combine_kernel.h 439-441) or the host (flash_api.cpp 1186-1188, from 1a58058a on) writes 0. No kernel
    (flash_api.cpp 1167): nothing changes. spec.theorems.lifecycle's z3 encoding is checked against this function.
    """
    if not kernel_runs:
        return start, start
    end = start + tile_fetches(tiles, max(start, 0), num_sm)
    return end, 0 if (num_splits > 1 or reset_after_reuse) else end


def skipped_tiles(tiles: int, start: int, num_sm: int) -> int:
    """Tiles the scheduler never hands out when it starts from ``start`` > 0: [num_sm, min(T, num_sm + start))."""
    return max(0, min(tiles, num_sm + max(start, 0)) - num_sm)


def read_slots(schedule: Schedule) -> tuple:
    """(vector, virtual batch, offset in the metadata) of every per-batch slot a launch with this schedule reads: the
    vectors of its layout for virtual batches below the call's b, the split vector only when it splits
    (tile_scheduler.hpp 567, 600-603, 624-633, 697)."""
    layout = MetadataLayout.for_schedule(schedule)
    b = schedule.inputs.batch_size
    split = schedule.num_splits > 1
    vectors = [("m_blocks", layout.m_blocks_offset), ("seqlen_q", layout.seqlen_q_offset),
               ("num_splits", layout.splits_offset if split else None), ("batch_idx", layout.batch_idx_offset),
               ("nheads_in_l2", layout.nheads_in_l2_offset)]
    return tuple((name, vb, vo + vb) for name, vo in vectors if vo is not None for vb in range(b))


def launch_tiles(values: Sequence[int], schedule: Schedule) -> int:
    """T: the work tiles a launch with this schedule takes from metadata ``values`` (m-blocks x heads x splits over
    its batches; negative values, such as unwritten slots, read as 0)."""
    decoded = decode_values_for_schedule(list(values), schedule)
    heads = schedule.inputs.num_heads_k if schedule.kernel_pack_gqa else schedule.inputs.num_heads
    tiles = 0
    for vb in range(schedule.inputs.batch_size):
        m = max(decoded.num_m_blocks[vb], 0)
        s = max(decoded.num_splits[vb], 0) if schedule.num_splits > 1 else 1
        tiles += m * heads * s
    return tiles


def _reads(values: list, offset: int, schedule: Schedule, tensor: MetadataTensor) -> tuple:
    """The per-batch slots the main kernel and the combine read, for virtual batches below the call's b."""
    return tuple(Read(offset + at, name, vb, values[at], tensor.origins[offset + at])
                 for name, vb, at in read_slots(schedule))


def launch(md: View, call: Schedule, seqused_k: Sequence[int], step: int, layer: int = 0, mode: str = "eager",
           real_batch: Optional[int] = None, fa3: FA3Behaviour = FA3Behaviour(),
           precomputed: Optional[Precomputed] = None, captured: Optional["CapturedLaunch"] = None) -> LaunchRecord:
    """A call given ``md`` (flash_api.cpp 1004-1025, 1167-1188): reads, the semaphore's count, and FA3's reset."""
    if call.inputs.precompute:
        raise ValueError("call: a call's schedule is needed, got a precompute's")
    b = call.inputs.batch_size
    real = b if real_batch is None else real_batch
    common = dict(step=step, layer=layer, mode=mode, call=call, tensor_id=md.tensor.ident, view_offset=md.offset,
                  view_length=md.length, real_batch=real, seqused_k=tuple(seqused_k), precompute=precomputed,
                  captured=captured)
    if md.length != call.metadata_size:   # CHECK_SHAPE: loud, nothing runs
        return LaunchRecord(shape_error=True, kernel_ran=False, semaphore_start=None, semaphore_origin=None,
                            semaphore_end=None, semaphore_after=None, tiles=0, skipped_tiles=0, reads=(), **common)
    values = md.values()
    reads = _reads(values, md.offset, call, md.tensor)
    runs = b > 0 and call.inputs.seqlen_q > 0 and call.inputs.seqlen_k > 0   # flash_api.cpp 1167
    sem_slot = md.offset + MetadataLayout.for_schedule(call).semaphore_offset if call.needs_semaphore else None
    sem_start = md.tensor.values[sem_slot] if sem_slot is not None else None
    sem_origin = md.tensor.origins[sem_slot] if sem_slot is not None else None
    tiles = launch_tiles(values, call)
    sem_end = sem_after = sem_start
    skipped = 0
    if sem_slot is not None:
        sem_end, sem_after = semaphore_after_launch(sem_start, tiles, call.inputs.num_sm, call.num_splits, runs,
                                                    fa3.reset_after_reuse)
        skipped = skipped_tiles(tiles, sem_start, call.inputs.num_sm) if runs else 0
    if runs and sem_slot is not None:
        md.tensor.values[sem_slot] = sem_after
        md.tensor.origins[sem_slot] = Origin("kernel", step)
    return LaunchRecord(shape_error=False, kernel_ran=runs, semaphore_start=sem_start, semaphore_origin=sem_origin,
                        semaphore_end=sem_end, semaphore_after=sem_after, tiles=tiles, skipped_tiles=skipped,
                        reads=reads if runs else (), **common)


@dataclass(frozen=True)
class CapturedLaunch:
    """A launch recorded in a CUDA graph: the geometry mha_fwd's host code fixed at capture."""

    call: Schedule          #: S_c, tiles, pack, b, seqlen_q, the page-table width (seqlen_k)
    md: View                #: the metadata tensor's address and length
    layer: int
    step: int

    @property
    def num_splits(self) -> int:
        return self.call.num_splits

    @property
    def combine_capacity(self) -> int:
        """kMax: the most splits the captured combine reads (flash_fwd_combine_launch_template.h)."""
        return combine_capacity(self.call.num_splits, self.call.inputs.headdim_v)


def capture(md: View, call: ScheduleInputs, layer: int, step: int) -> CapturedLaunch:
    """Record a launch in a graph: its host decisions are taken now and never again (the kernels do not run)."""
    return CapturedLaunch(resolve_schedule(call), md, layer, step)


# ---- an engine's metadata path over a sequence of steps ------------------------------------------------------


#: the precompute's inputs that must equal a layer's call for its metadata to be that layer's (not lengths or batch)
METADATA_INPUT_FIELDS = ("num_heads", "num_heads_k", "headdim", "headdim_v", "element_size", "causal", "window_size",
                         "attention_chunk", "has_softcap", "page_size", "num_sm", "arch", "build")


@dataclass(frozen=True)
class LayerShape:
    """One attention layer's per-rank shapes."""

    num_heads: int
    num_heads_k: int
    headdim: int = 128
    headdim_v: Optional[int] = None   #: None: headdim


@dataclass(frozen=True)
class EngineModel:
    """An engine's decode metadata path (sglang 0.5.23 / vLLM 0.33.0 style): one precompute per step shared by every
    layer, copied into a persistent buffer under CUDA graphs. The seeded defects of spec.lifecycle_invariants are
    changes of these fields."""

    layers: tuple
    context_len: int = 4096          #: the page-table width of a captured call (the whole context)
    page_size: int = 1
    num_sm: int = 132
    precompute_num_splits: int = 0   #: num_splits the precompute gets (0: heuristic)
    call_num_splits: int = 0         #: num_splits the call gets
    precompute_layer: Optional[int] = None  #: None: the precompute's heads equal every layer's (else that layer's)
    precompute_heads: Optional[tuple] = None  #: (h, h_k) the precompute uses; None: precompute_layer's / layer 0's
    zero_tail: bool = True           #: the engine's copy zeroes buf[n:]
    precompute_padded_batch: bool = True  #: graph steps precompute over the padded batch (False: the real rows)
    capture_width: Optional[int] = None   #: page-table width at capture (None: context_len)
    replay_max_seqlen_k: Optional[int] = None  #: max_seqlen_k of a replay's recompute (None: the rows' longest;
    #: sglang 0.5.16+ under CUDA graph without host lengths: the context length, spec/model/engine_profiles.json)
    max_graph_batch: int = 16
    build: str = fa3_builds.UPSTREAM
    qkv_dtype: str = "bfloat16"

    def heads_for_precompute(self) -> tuple:
        if self.precompute_heads is not None:
            return tuple(self.precompute_heads)
        layer = self.layers[self.precompute_layer or 0]
        return layer.num_heads, layer.num_heads_k

    def precompute_inputs(self, batch: int, max_seqlen_k: int) -> ScheduleInputs:
        h, hk = self.heads_for_precompute()
        layer = self.layers[self.precompute_layer or 0]
        return precompute_inputs(batch, 1, max(max_seqlen_k, 1), h, hk, layer.headdim, headdim_v=layer.headdim_v,
                                 qkv_dtype=self.qkv_dtype, varlen_q=True,
                                 page_size=self.page_size, causal=True, num_splits=self.precompute_num_splits,
                                 num_sm=self.num_sm, build=self.build)

    def call_inputs(self, layer: LayerShape, batch: int, width: int) -> ScheduleInputs:
        return call_inputs(batch, 1, width, layer.num_heads, layer.num_heads_k, layer.headdim,
                           headdim_v=layer.headdim_v, qkv_dtype=self.qkv_dtype, varlen_q=True, page_size=self.page_size, causal=True,
                           num_splits=self.call_num_splits, num_sm=self.num_sm, build=self.build)

    def page_width(self, max_len: int) -> int:
        """The eager call's page-table width: max_seq_len_k rounded up to whole pages (sglang's eager decode)."""
        pages = -(-max(max_len, 1) // self.page_size)
        return pages * self.page_size


@dataclass(frozen=True)
class Step:
    """One decode step: eager, a graph capture, or a replay of the graph captured for this batch size.

    ``cache_seqlens`` has one entry per row the launch sees (graph steps: padded rows included, after ``real_batch``);
    ``refresh`` False: the engine does not recompute metadata this step (it reuses what the buffer or its last eager
    precompute holds)."""

    mode: str
    cache_seqlens: tuple
    real_batch: Optional[int] = None
    refresh: bool = True

    def __post_init__(self):
        if self.mode not in ("eager", "capture", "replay"):
            raise ValueError(f"mode: one of eager, capture, replay; got {self.mode!r}")
        if not self.cache_seqlens or any(int(v) < 0 for v in self.cache_seqlens):
            raise ValueError(f"cache_seqlens: one or more lengths >= 0, got {self.cache_seqlens}")


@dataclass
class Trace:
    """A sequence's launches in order, and the graphs it captured (batch size -> one CapturedLaunch per layer)."""

    launches: list = field(default_factory=list)
    graphs: dict = field(default_factory=dict)
    buffer: Optional[MetadataTensor] = None


def run_sequence(engine: EngineModel, steps: Sequence[Step], fa3: FA3Behaviour = FA3Behaviour()) -> Trace:
    """Run an engine's metadata path over a sequence of steps and every layer; returns the trace of launches."""
    trace = Trace()
    size = 1 + -(-engine.max_graph_batch // 4) * 4 * 4   # 1 + round_up(max_bs, 4) * 4 (both engines)
    trace.buffer = allocate_persistent(size)
    last_eager: Optional[Precomputed] = None
    last_graph: Optional[Precomputed] = None
    for t, step in enumerate(steps):
        lens = [int(v) for v in step.cache_seqlens]
        b = len(lens)
        real = b if step.real_batch is None else int(step.real_batch)
        if step.mode == "eager":
            if step.refresh or last_eager is None:
                last_eager = precompute(engine.precompute_inputs(b, max(lens)), lens, step=t)
            pre = last_eager
            width = engine.page_width(max(lens))
            for i, layer in enumerate(engine.layers):
                call = resolve_schedule(engine.call_inputs(layer, b, width))
                trace.launches.append(launch(pre.tensor.view(), call, lens, t, i, "eager", real, fa3, pre))
            continue
        if b > engine.max_graph_batch:
            raise ValueError(f"cache_seqlens: a graph step of {b} rows exceeds max_graph_batch {engine.max_graph_batch}")
        pre_b = b if engine.precompute_padded_batch else real
        if step.mode == "capture":
            # the capture's precompute sees the capture batch's lengths (sglang 0.5.23 710-716: max(max_seq_len_k, 1));
            # the captured call's page table is the whole context (2432: max_num_pages)
            last_graph = precompute(engine.precompute_inputs(pre_b, max(lens[:pre_b])), lens[:pre_b], step=t)
            view = copy_into(trace.buffer, last_graph, engine.zero_tail, t)
            width = engine.capture_width if engine.capture_width is not None else engine.context_len
            trace.graphs[b] = [capture(view, engine.call_inputs(layer, b, width), i, t)
                               for i, layer in enumerate(engine.layers)]
            continue
        graph = trace.graphs.get(b)
        if graph is None:
            raise ValueError(f"steps: a replay of batch {b} before any capture of that batch size")
        if step.refresh or last_graph is None:
            bound = engine.replay_max_seqlen_k if engine.replay_max_seqlen_k is not None else max(lens[:pre_b])
            last_graph = precompute(engine.precompute_inputs(pre_b, bound), lens[:pre_b], step=t)
            copy_into(trace.buffer, last_graph, engine.zero_tail, t)
        for cap in graph:
            trace.launches.append(launch(cap.md, cap.call, lens, t, cap.layer, "replay", real, fa3, last_graph, cap))
    return trace
