"""refmodel.metadata_lifecycle: the metadata as state across layers, steps and graph replays (FA3 0251105a)."""

import json
from importlib.resources import files

import pytest

from refmodel.fa3_scheduler import resolve_schedule, scheduler_needs_semaphore
from refmodel.metadata_layout import UNWRITTEN, MetadataLayout
from refmodel.metadata_lifecycle import (EngineModel, FA3Behaviour, LayerShape, Origin, Step, allocate_persistent,
                                         copy_into, launch, precompute, run_sequence, tile_fetches)

ENGINE = EngineModel(layers=(LayerShape(32, 8),) * 2, context_len=8192)


def _pre(b=6, lens=None, step=0, **kw):
    lens = lens or [300 + 100 * i for i in range(b)]
    return precompute(ENGINE.precompute_inputs(b, max(lens)), lens, step=step), lens


def test_precompute_writes_vectors_below_b_and_zeroes_the_semaphore():
    pre, _ = _pre(b=6)
    layout = MetadataLayout.for_schedule(pre.schedule)
    assert pre.tensor.values[layout.semaphore_offset] == 0                       # flash_prepare_scheduler.cu 77
    assert pre.tensor.origins[layout.semaphore_offset] == Origin("precompute", 0)
    for vb in range(6, layout.b4):                                                 # [b, b4) never written
        assert pre.tensor.values[layout.m_blocks_offset + vb] == UNWRITTEN
        assert not pre.tensor.origins[layout.m_blocks_offset + vb].defined


def test_copy_into_zeroes_the_tail_only_when_asked():
    pre, _ = _pre(b=4)
    buf = allocate_persistent(1 + 16 * 4)
    buf.values[-1] = 77
    view = copy_into(buf, pre, zero_tail=False, step=0)
    assert view.length == pre.size and buf.values[-1] == 77
    copy_into(buf, pre, zero_tail=True, step=1)
    assert buf.values[pre.size:] == [0] * (len(buf) - pre.size)
    assert buf.origins[-1] == Origin("zero_fill", 1)


@pytest.mark.parametrize("reset, expected", [(True, 0), (False, None)])
def test_one_split_launch_resets_the_semaphore_only_after_the_fix(reset, expected):
    """flash_api.cpp 1186-1188 (added by 1a58058a): with S_c == 1 the host zeroes the slot after the launch."""
    engine = EngineModel(layers=(LayerShape(32, 8),), context_len=8192, precompute_num_splits=1, call_num_splits=1)
    lens = [300, 400, 500, 600]
    pre = precompute(engine.precompute_inputs(4, 600), lens, step=0)
    call = resolve_schedule(engine.call_inputs(engine.layers[0], 4, 600))
    first = launch(pre.tensor.view(), call, lens, 0, fa3=FA3Behaviour(reset_after_reuse=reset))
    assert first.semaphore_start == 0 and first.semaphore_end == first.tiles > 0
    assert first.semaphore_after == (first.tiles if expected is None else expected)
    second = launch(pre.tensor.view(), call, lens, 0, layer=1, fa3=FA3Behaviour(reset_after_reuse=reset))
    assert second.semaphore_start == first.semaphore_after


def test_a_split_launch_is_reset_by_the_combine_even_before_the_fix():
    trace = run_sequence(ENGINE, [Step("eager", (8000, 100, 100, 100))], FA3Behaviour(reset_after_reuse=False))
    assert trace.launches[0].call.num_splits > 1
    assert [r.semaphore_start for r in trace.launches] == [0, 0]


def test_tile_fetches_and_skipped_tiles():
    assert tile_fetches(10, 0, 4) == 10 and tile_fetches(3, 0, 4) == 3    # from zero a launch leaves T
    assert tile_fetches(10, 2, 4) == 4 + 4                                 # tiles 4, 5 skipped


def test_size_depends_on_num_splits_only_off_sm90():
    """flash_api.cpp 623 (precompute) and 990-992 (call)."""
    for s in (1, 2, 64):
        assert scheduler_needs_semaphore(90, True, True, False, s, True)
        assert scheduler_needs_semaphore(90, False, True, False, s, True)
    assert scheduler_needs_semaphore(80, True, True, False, 2, True) != scheduler_needs_semaphore(80, False, True,
                                                                                                  False, 1, True)


def test_replay_reads_the_buffer_the_graph_captured():
    trace = run_sequence(ENGINE, [Step("capture", (1,) * 8), Step("replay", (900,) * 6 + (1, 1), real_batch=6)])
    (l0, l1) = trace.launches
    assert l0.tensor_id == trace.buffer.ident and l0.mode == "replay"
    assert {r.origin for r in l0.reads} == {Origin("precompute", 1)}
    assert l0.call.inputs.seqlen_k == ENGINE.context_len


def test_facts_data_cites_fa3_lines():
    facts = json.loads(files("refmodel").joinpath("metadata_lifecycle_facts.json").read_text())["facts"]
    assert all(f["source"] for f in facts)
    assert any("flash_prepare_scheduler.cu@0251105a:77" in f["source"] for f in facts)


def test_bad_step_is_refused():
    with pytest.raises(ValueError, match="mode"):
        Step("warmup", (1,))
    with pytest.raises(ValueError, match="replay of batch"):
        run_sequence(ENGINE, [Step("replay", (5, 5))])
