"""Pins of refmodel.metadata_lifecycle on hand-worked small sequences (FA3 hopper/ at 0251105a).

Each test says what FA3 does and where (docs/invariants.md, "The metadata's lifecycle"): which slots a precompute,
a copy and a launch write and for which step, the tile-count semaphore after each launch
(tile_scheduler.hpp 763-788: min(num_sm, T) + max(0, T - s - num_sm) fetches from a start s), copies with and
without a zeroed tail, capture and replay geometry, and every refusal's whole message.
"""

import dataclasses

import pytest

from refmodel import fa3_builds
from refmodel.fa3_scheduler import call_inputs, precompute_inputs, resolve_schedule
from refmodel.metadata_layout import UNWRITTEN
from refmodel.metadata_lifecycle import (CapturedLaunch, EngineModel, FA3Behaviour, LaunchRecord, LayerShape,
                                         MetadataTensor, Origin, Precomputed, Read, Step, Trace, View,
                                         allocate_persistent, capture, copy_into, launch, precompute, run_sequence,
                                         semaphore_after_launch, skipped_tiles, tile_fetches)

#: 4 SMs, 8 query heads over 2 KV heads (PackGQA: the kernel's heads are the 2 KV heads), head dim 128
SMALL = EngineModel(layers=(LayerShape(8, 2),), num_sm=4, max_graph_batch=4, context_len=1024)
LENS = [200, 50, 120]
U = UNWRITTEN


def _fresh(n, fill=0):
    return MetadataTensor([fill] * n, [Origin("zero_fill", None)] * n)


def _call(engine, b, width, layer=0):
    return resolve_schedule(engine.call_inputs(engine.layers[layer], b, width))


# ---- precompute: flash_prepare_scheduler.cu 77 (semaphore 0), 197-215 (vectors below b); flash_api.cpp 627-637

def test_precompute_writes_vectors_below_b_and_the_semaphore_for_its_step():
    pre = precompute(SMALL.precompute_inputs(3, 200), LENS, step=5)
    # one split, Sort and Swizzle: [splits | m_blocks | batch_idx | nheads_in_l2] x b4 = 4, then the semaphore
    assert pre.tensor.values == [1, 1, 1, U, 1, 1, 1, U, 0, 1, 2, U, 2, 2, 2, U, 0]
    assert pre.step == 5 and pre.size == 17
    kinds = ["unwritten" if i % 4 == 3 and i < 16 else "precompute" for i in range(17)]
    assert pre.tensor.origins == [Origin(k, 5) for k in kinds]
    assert not Origin("unwritten", 5).defined and Origin("zero_fill", None).defined


def test_precompute_step_defaults_to_none_and_passes_seqlens_q_to_the_prepare_step():
    inputs = precompute_inputs(3, 200, 2000, 8, 2, 128, varlen_q=True, causal=True, num_sm=4)
    assert precompute(inputs, [2000, 50, 1200]).step is None
    with_q = precompute(inputs, [2000, 50, 1200], seqlens_q=[1, 200, 1])
    without_q = precompute(inputs, [2000, 50, 1200])
    assert with_q.tensor.values != without_q.tensor.values   # the prepare kernel reads cu_seqlens_q / seqused_q


def test_precompute_refuses_a_calls_inputs_with_the_whole_message():
    with pytest.raises(ValueError) as err:
        precompute(SMALL.call_inputs(SMALL.layers[0], 3, 256), LENS)
    assert str(err.value) == "inputs: a precompute's inputs (precompute_inputs) are needed, got a call's"


# ---- persistent buffers and copies: sglang 0.5.23 2453-2460, vLLM 0.33.0 762-766 -------------------------------

def test_allocate_persistent_is_zeros_from_size_one_and_refuses_zero():
    buf = allocate_persistent(1)
    assert buf.values == [0] and buf.origins == [Origin("zero_fill", None)]
    assert allocate_persistent(3).values == [0, 0, 0]
    with pytest.raises(ValueError) as err:
        allocate_persistent(0)
    assert str(err.value) == "size: must be >= 1, got 0"


def test_copy_zeroes_the_tail_by_default_for_the_precomputes_step():
    pre = precompute(SMALL.precompute_inputs(3, 200), LENS, step=2)
    buf = _fresh(20, fill=9)
    view = copy_into(buf, pre)
    assert len(buf) == 20 and buf.values == pre.tensor.values + [0, 0, 0]
    assert buf.origins[17:] == [Origin("zero_fill", 2)] * 3          # step None: the precompute's step
    assert (view.offset, view.length, view.tensor is buf) == (0, 17, True)
    copy_into(buf, pre, zero_tail=True, step=7)
    assert buf.origins[17:] == [Origin("zero_fill", 7)] * 3


def test_copy_without_zero_tail_keeps_the_tail():
    pre = precompute(SMALL.precompute_inputs(3, 200), LENS, step=2)
    buf = _fresh(19, fill=9)
    copy_into(buf, pre, zero_tail=False, step=3)
    assert buf.values[17:] == [9, 9] and buf.origins[17:] == [Origin("zero_fill", None)] * 2
    assert buf.origins[:17] == pre.tensor.origins


def test_copy_refuses_a_buffer_too_small_with_the_whole_message():
    pre = precompute(SMALL.precompute_inputs(3, 200), LENS, step=0)
    with pytest.raises(ValueError) as err:
        copy_into(_fresh(16), pre)
    assert str(err.value) == "md: 17 slots do not fit the persistent buffer of 16"
    assert len(copy_into(_fresh(17), pre).values()) == 17              # exactly fits


def test_view_bounds_and_message():
    t = _fresh(5)
    assert (t.view(2).offset, t.view(2).length) == (2, 3)
    assert t.view(0, 0).length == 0 and t.view(5, 0).length == 0
    for offset, length, end in ((-1, 2, 1), (0, 6, 6), (3, 3, 6), (0, -1, -1)):
        with pytest.raises(ValueError) as err:
            t.view(offset, length)
        assert str(err.value) == f"view: [{offset}, {end}) outside a tensor of 5 slots"


# ---- launches: flash_api.cpp 1004-1025, 1167-1188; tile_scheduler.hpp 600-633, 763-788 -------------------------

def test_tile_fetches_and_skipped_tiles_by_hand():
    assert tile_fetches(10, 2, 4) == 4 + 4 and tile_fetches(6, 0, 4) == 6
    assert skipped_tiles(10, 0, 4) == 0 and skipped_tiles(10, 2, 4) == 2 and skipped_tiles(5, 3, 4) == 1
    assert skipped_tiles(10, -3, 4) == 0


def test_semaphore_after_launch_resets_by_default():
    assert semaphore_after_launch(0, 6, 4, 1, True) == (6, 0)                # flash_api.cpp 1186-1188
    assert semaphore_after_launch(0, 6, 4, 1, True, reset_after_reuse=False) == (6, 6)
    assert semaphore_after_launch(3, 6, 4, 1, False) == (3, 3)               # flash_api.cpp 1167: no kernel


def test_one_split_launch_reads_slots_below_b_and_counts_six_tiles():
    pre = precompute(SMALL.precompute_inputs(3, 200), LENS, step=5)
    call = _call(SMALL, 3, 256)
    assert call.num_splits == 1 and call.kernel_pack_gqa
    rec = launch(pre.tensor.view(), call, LENS, 5)
    assert (rec.layer, rec.mode, rec.real_batch, rec.step) == (0, "eager", 3, 5)
    assert rec.shape_error is False and rec.kernel_ran is True
    # T = 3 batches x 1 m-block x 2 packed heads = 6; fetches min(4, 6) + max(0, 6 - 0 - 4) = 6; host reset to 0
    assert (rec.tiles, rec.semaphore_start, rec.semaphore_end, rec.semaphore_after, rec.skipped_tiles) == (6, 0, 6, 0, 0)
    assert rec.semaphore_origin == Origin("precompute", 5)
    assert pre.tensor.values[16] == 0 and pre.tensor.origins[16] == Origin("kernel", 5)
    # without Split the split vector is not read (tile_scheduler.hpp 600-603)
    assert [(r.slot, r.vector, r.vb, r.value) for r in rec.reads] == [
        (4, "m_blocks", 0, 1), (5, "m_blocks", 1, 1), (6, "m_blocks", 2, 1),
        (8, "batch_idx", 0, 0), (9, "batch_idx", 1, 1), (10, "batch_idx", 2, 2),
        (12, "nheads_in_l2", 0, 2), (13, "nheads_in_l2", 1, 2), (14, "nheads_in_l2", 2, 2)]
    assert {r.origin for r in rec.reads} == {Origin("precompute", 5)}


def test_two_split_launch_reads_the_split_vector_and_counts_splits():
    engine = dataclasses.replace(SMALL, precompute_num_splits=2, call_num_splits=2)
    pre = precompute(engine.precompute_inputs(3, 2000), [2000, 50, 1200], step=1)
    call = _call(engine, 3, 2048)
    assert call.num_splits == 2
    rec = launch(pre.tensor.view(), call, [2000, 50, 1200], 1, layer=4, mode="replay", real_batch=2)
    assert (rec.layer, rec.mode, rec.real_batch) == (4, "replay", 2)
    # T = (1 + 2 + 1) splits x 1 m-block x 2 heads = 8; fetches 4 + 4; the combine resets (kernel.h 439-441)
    assert (rec.tiles, rec.semaphore_end, rec.semaphore_after) == (8, 8, 0)
    assert [(r.slot, r.vector, r.vb, r.value) for r in rec.reads if r.vector == "num_splits"] == [
        (0, "num_splits", 0, 1), (1, "num_splits", 1, 2), (2, "num_splits", 2, 1)]
    assert [(r.slot, r.value) for r in rec.reads if r.vector == "batch_idx"] == [(8, 2), (9, 0), (10, 1)]


def test_zero_split_and_zero_m_block_slots_count_no_tiles():
    """A zeroed slot (an engine's zero fill read as a batch) gives that batch 0 tiles, not 1."""
    engine = dataclasses.replace(SMALL, precompute_num_splits=2, call_num_splits=2)
    pre = precompute(engine.precompute_inputs(3, 2000), [2000, 50, 1200], step=1)
    call = _call(engine, 3, 2048)
    pre.tensor.values[1] = 0                       # batch 1: 0 splits
    assert launch(pre.tensor.view(), call, [2000, 50, 1200], 1).tiles == (1 + 0 + 1) * 2
    pre.tensor.values[4] = 0                       # batch 0: 0 m-blocks
    assert launch(pre.tensor.view(), call, [2000, 50, 1200], 1).tiles == 1 * 2


def test_launch_without_pack_gqa_counts_query_heads():
    inputs = call_inputs(3, 1, 256, 8, 2, 128, varlen_q=True, causal=True, num_sm=4, num_splits=1, pack_gqa=False)
    call = resolve_schedule(inputs)
    assert not call.kernel_pack_gqa
    md = _fresh(call.metadata_size)
    md.values[4:7] = [1, 1, 1]                     # m_blocks of 3 batches
    rec = launch(md.view(), call, LENS, 0)
    assert rec.tiles == 3 * 8 and rec.semaphore_end == 4 + (24 - 4)


def test_launch_through_an_offset_view_reads_the_offset_slots():
    pre = precompute(SMALL.precompute_inputs(3, 200), LENS, step=2)
    buf = MetadataTensor([7] * 3 + list(pre.tensor.values), [Origin("zero_fill", None)] * 3 + pre.tensor.origins)
    rec = launch(buf.view(3, 17), _call(SMALL, 3, 256), LENS, 2)
    assert (rec.view_offset, rec.view_length, rec.tensor_id) == (3, 17, buf.ident)
    assert [r.slot for r in rec.reads][:3] == [7, 8, 9] and buf.values[19] == 0
    assert buf.origins[19] == Origin("kernel", 2)


def test_a_start_above_zero_skips_tiles_and_without_reset_persists():
    pre = precompute(SMALL.precompute_inputs(3, 200), LENS, step=0)
    pre.tensor.values[16] = 1
    rec = launch(pre.tensor.view(), _call(SMALL, 3, 256), LENS, 0, fa3=FA3Behaviour(reset_after_reuse=False))
    # T = 6 from s = 1: fetches min(4, 6) + max(0, 6 - 1 - 4) = 5; tile 4 is skipped
    assert (rec.semaphore_start, rec.semaphore_end, rec.semaphore_after, rec.skipped_tiles) == (1, 6, 6, 1)
    assert pre.tensor.values[16] == 6


def test_wrong_size_is_a_shape_error_and_nothing_runs():
    pre = precompute(SMALL.precompute_inputs(3, 200), LENS, step=0)
    rec = launch(pre.tensor.view(0, 16), _call(SMALL, 3, 256), LENS, 0)
    assert rec.shape_error is True and rec.kernel_ran is False
    assert (rec.tiles, rec.skipped_tiles, rec.reads, rec.semaphore_start, rec.semaphore_after) == (0, 0, (), None, None)
    assert (rec.view_offset, rec.view_length) == (0, 16)


def test_launch_refuses_a_precomputes_schedule_with_the_whole_message():
    pre = precompute(SMALL.precompute_inputs(3, 200), LENS, step=0)
    with pytest.raises(ValueError) as err:
        launch(pre.tensor.view(), pre.schedule, LENS, 0)
    assert str(err.value) == "call: a call's schedule is needed, got a precompute's"


@pytest.mark.parametrize("b, seqlen_q, seqlen_k, runs", [(0, 1, 100, False), (1, 0, 100, False), (1, 1, 0, False),
                                                         (1, 1, 1, True), (2, 1, 100, True)])
def test_kernel_runs_only_with_rows_queries_and_keys(b, seqlen_q, seqlen_k, runs):
    """flash_api.cpp 1167: no kernel (and no reset) when the batch, the queries or the keys are empty."""
    call = resolve_schedule(call_inputs(b, seqlen_q, seqlen_k, 8, 2, 128, varlen_q=True, causal=True, num_sm=4))
    md = _fresh(call.metadata_size, fill=3)       # start 3, every vector 3: T = b * 3 m-blocks * heads
    rec = launch(md.view(), call, [seqlen_k] * b, 9)
    assert rec.kernel_ran is runs and rec.shape_error is False
    if runs:
        assert rec.semaphore_after == 0 and md.origins[-1] == Origin("kernel", 9) and rec.reads
    else:
        assert rec.semaphore_after == 3 and rec.semaphore_end == 3 and rec.skipped_tiles == 0
        assert md.values[-1] == 3 and md.origins[-1] == Origin("zero_fill", None) and rec.reads == ()


def test_a_launch_that_does_not_run_skips_nothing_even_from_a_high_start():
    call = resolve_schedule(call_inputs(1, 0, 100, 8, 2, 128, varlen_q=True, causal=True, num_sm=4))
    md = _fresh(call.metadata_size, fill=50)
    rec = launch(md.view(), call, [100], 0)
    assert rec.tiles > 4 and rec.skipped_tiles == 0 and rec.kernel_ran is False


def test_the_vllm_fork_reads_prepare_seqlen_q():
    """vllm-project/flash-attention@617264c1 flash_api.cpp 703, 1107: prepare_seqlen_q at 0, splits at b4."""
    fork = dict(varlen_q=True, causal=True, num_sm=4, build=fa3_builds.VLLM_FORK, num_splits=2, page_size=1)
    pre = precompute(precompute_inputs(3, 1, 2000, 8, 2, 128, **fork), [2000, 50, 1200], step=0)
    call = resolve_schedule(call_inputs(3, 1, 2048, 8, 2, 128, **fork))
    rec = launch(pre.tensor.view(), call, [2000, 50, 1200], 0)
    assert {r.vector for r in rec.reads} >= {"seqlen_q", "num_splits"}
    assert [r.slot for r in rec.reads if r.vector == "seqlen_q"] == [0, 1, 2]


# ---- capture and replay: flash_api.cpp 979-1025; sglang 0.5.23 2432, 3154-3169 ---------------------------------

def test_capture_records_layer_step_and_geometry():
    pre = precompute(SMALL.precompute_inputs(3, 200), LENS, step=0)
    view = copy_into(allocate_persistent(17), pre)
    cap = capture(view, SMALL.call_inputs(SMALL.layers[0], 3, 1024), 2, 6)
    assert (cap.layer, cap.step, cap.md, cap.num_splits) == (2, 6, view, cap.call.num_splits)
    assert cap.call.inputs.seqlen_k == 1024 and cap.combine_capacity == 32


def test_run_sequence_buffer_size_rounds_max_graph_batch_up_to_four():
    trace = run_sequence(dataclasses.replace(SMALL, max_graph_batch=5), [Step("eager", (10,))])
    assert len(trace.buffer) == 1 + 8 * 4 and trace.buffer.values == [0] * 33


def test_eager_steps_record_layer_mode_real_and_reuse_without_refresh():
    engine = dataclasses.replace(SMALL, layers=(LayerShape(8, 2), LayerShape(8, 2)))
    trace = run_sequence(engine, [Step("eager", (200, 50), refresh=False), Step("eager", (201, 51), refresh=False),
                                  Step("eager", (202, 52), real_batch=1)])
    assert [(r.step, r.layer, r.mode, r.real_batch) for r in trace.launches] == [
        (0, 0, "eager", 2), (0, 1, "eager", 2), (1, 0, "eager", 2), (1, 1, "eager", 2), (2, 0, "eager", 1),
        (2, 1, "eager", 1)]
    assert [r.precompute.step for r in trace.launches] == [0, 0, 0, 0, 2, 2]


def test_capture_and_replay_write_the_buffer_for_their_steps():
    engine = dataclasses.replace(SMALL, layers=(LayerShape(8, 2), LayerShape(8, 2)))
    trace = run_sequence(engine, [Step("capture", (1, 1, 1, 1)), Step("capture", (5, 5)),
                                  Step("replay", (300, 40, 1, 1), real_batch=2),
                                  Step("replay", (301, 41, 1, 1), real_batch=2, refresh=False)])
    assert [(c.layer, c.step) for c in trace.graphs[4]] == [(0, 0), (1, 0)]
    assert [(c.layer, c.step) for c in trace.graphs[2]] == [(0, 1), (1, 1)]
    assert trace.graphs[4][0].call.inputs.seqlen_k == 1024           # the whole context (sglang 2432)
    assert [(r.step, r.layer, r.mode, r.real_batch) for r in trace.launches] == [
        (2, 0, "replay", 2), (2, 1, "replay", 2), (3, 0, "replay", 2), (3, 1, "replay", 2)]
    assert [r.precompute.step for r in trace.launches] == [2, 2, 2, 2]
    assert {r.origin for r in trace.launches[3].reads} == {Origin("precompute", 2)}


def test_capture_at_step_zero_stamps_the_zeroed_tail_with_its_step():
    trace = run_sequence(SMALL, [Step("capture", (1, 1))])
    n = trace.graphs[2][0].md.length
    assert trace.buffer.origins[n:] == [Origin("zero_fill", 0)] * (len(trace.buffer) - n)
    assert trace.buffer.origins[0] == Origin("precompute", 0)


def test_a_smaller_capture_zeroes_what_a_larger_one_left():
    engine = dataclasses.replace(SMALL, max_graph_batch=8)
    trace = run_sequence(engine, [Step("capture", (9,) * 8), Step("capture", (9,))])
    n = trace.graphs[1][0].md.length
    assert (n, len(trace.buffer)) == (17, 33)
    assert trace.buffer.values[n:] == [0] * (len(trace.buffer) - n)
    assert set(trace.buffer.origins[n:]) == {Origin("zero_fill", 1)}


def test_an_engine_without_zero_tail_leaves_the_tail_at_capture_and_replay():
    engine = dataclasses.replace(SMALL, zero_tail=False, max_graph_batch=8)
    trace = run_sequence(engine, [Step("capture", (9,) * 8), Step("capture", (9,)), Step("replay", (9,))])
    n = trace.graphs[1][0].md.length
    assert trace.buffer.origins[n:] == [Origin("precompute", 0)] * (len(trace.buffer) - n)


def test_a_replay_bound_sets_the_replays_precompute_max_seqlen_k():
    engine = dataclasses.replace(SMALL, replay_max_seqlen_k=1024)
    trace = run_sequence(engine, [Step("capture", (1, 1)), Step("replay", (30, 40))])
    assert trace.launches[0].precompute.schedule.inputs.seqlen_k == 1024
    trace = run_sequence(SMALL, [Step("capture", (1, 1)), Step("replay", (30, 40))])
    assert trace.launches[0].precompute.schedule.inputs.seqlen_k == 40


def test_a_graph_step_over_max_graph_batch_is_refused_with_the_whole_message():
    with pytest.raises(ValueError) as err:
        run_sequence(SMALL, [Step("capture", (1,) * 5)])
    assert str(err.value) == "cache_seqlens: a graph step of 5 rows exceeds max_graph_batch 4"
    with pytest.raises(ValueError) as err:
        run_sequence(SMALL, [Step("replay", (1, 1))])
    assert str(err.value) == "steps: a replay of batch 2 before any capture of that batch size"


# ---- the engine model's inputs ---------------------------------------------------------------------------------

def test_engine_inputs_carry_head_dims_dtype_and_varlen():
    engine = EngineModel(layers=(LayerShape(8, 2, headdim=128, headdim_v=64),), qkv_dtype="float8_e4m3fn")
    call = engine.call_inputs(engine.layers[0], 2, 512)
    pre = engine.precompute_inputs(2, 0)
    for inp in (call, pre):
        assert (inp.headdim, inp.headdim_v, inp.element_size, inp.varlen_q) == (128, 64, 1, True)
    assert pre.seqlen_k == 1 and pre.seqlen_q == 1 and pre.precompute and not call.precompute
    bf16 = EngineModel(layers=(LayerShape(8, 2),))
    assert bf16.call_inputs(bf16.layers[0], 2, 512).element_size == 2
    assert bf16.precompute_inputs(2, 5).element_size == 2 and bf16.precompute_inputs(2, 5).headdim_v == 128


def test_heads_for_precompute():
    layers = (LayerShape(8, 2), LayerShape(8, 1))
    assert EngineModel(layers=layers).heads_for_precompute() == (8, 2)
    assert EngineModel(layers=layers, precompute_layer=1).heads_for_precompute() == (8, 1)
    assert EngineModel(layers=layers, precompute_heads=[4, 1]).heads_for_precompute() == (4, 1)


def test_page_width_rounds_up_to_whole_pages():
    assert EngineModel(layers=(), page_size=16).page_width(17) == 32
    assert EngineModel(layers=(), page_size=16).page_width(16) == 16
    assert EngineModel(layers=(), page_size=1).page_width(0) == 1
    assert type(EngineModel(layers=(), page_size=16).page_width(17)) is int


# ---- Step's refusals, defaults, frozen dataclasses ---------------------------------------------------------------

def test_step_refusals_whole_messages_at_the_boundary():
    assert Step("eager", (0,)).cache_seqlens == (0,)
    for lens in ((), (-1,), (3, -1)):
        with pytest.raises(ValueError) as err:
            Step("eager", lens)
        assert str(err.value) == f"cache_seqlens: one or more lengths >= 0, got {lens}"
    with pytest.raises(ValueError) as err:
        Step("warmup", (1,))
    assert str(err.value) == "mode: one of eager, capture, replay; got 'warmup'"


def test_defaults():
    step = Step("eager", (1,))
    assert (step.real_batch, step.refresh) == (None, True)
    assert FA3Behaviour().reset_after_reuse is True
    assert (LayerShape(8, 2).headdim, LayerShape(8, 2).headdim_v) == (128, None)
    e = EngineModel(layers=())
    assert (e.context_len, e.page_size, e.num_sm, e.precompute_num_splits, e.call_num_splits, e.precompute_layer,
            e.precompute_heads, e.zero_tail, e.precompute_padded_batch, e.capture_width, e.replay_max_seqlen_k,
            e.max_graph_batch, e.build, e.qkv_dtype) == (4096, 1, 132, 0, 0, None, None, True, True, None, None, 16,
                                                         fa3_builds.UPSTREAM, "bfloat16")
    assert (Trace().launches, Trace().graphs, Trace().buffer) == ([], {}, None)
    assert _fresh(2).ident != _fresh(2).ident


@pytest.mark.parametrize("cls", [Origin, View, Precomputed, FA3Behaviour, Read, LaunchRecord, CapturedLaunch,
                                 LayerShape, EngineModel, Step])
def test_frozen_dataclasses(cls):
    assert cls.__dataclass_params__.frozen


def test_a_call_without_the_semaphore_reads_and_writes_no_semaphore():
    """flash_api.cpp 990-992: on sm90 a call that is neither varlen nor causal with one split has no semaphore slot
    (here an empty batch: metadata_size 0), so a launch reads no start, skips nothing and writes nothing."""
    call = resolve_schedule(call_inputs(0, 1, 2048, 8, 2, 128, has_cache_seqlens=False, causal=False, num_sm=4,
                                        num_splits=2))
    assert (call.needs_semaphore, call.metadata_size) == (False, 0)
    md = _fresh(3, fill=5)
    rec = launch(md.view(0, 0), call, [], 3)
    assert (rec.shape_error, rec.kernel_ran, rec.semaphore_start, rec.semaphore_origin, rec.semaphore_end,
            rec.semaphore_after, rec.skipped_tiles, rec.tiles) == (False, False, None, None, None, None, 0, 0)
    assert md.values == [5, 5, 5] and md.origins == [Origin("zero_fill", None)] * 3
