"""spec.lifecycle_invariants: invariants over sequences of launches sharing FA3 scheduler metadata.

The engine model without defects violates none of them over generated sequences (layers x eager/capture/replay
steps); each seeded defect is caught by its invariant, and only by it, on its control sequence.
"""

import dataclasses
import re

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from refmodel.fa3_builds import UPSTREAM, VLLM_FORK
from refmodel.metadata_lifecycle import EngineModel, LayerShape, Step, run_sequence
from spec.lifecycle_invariants import (CHECKS, DEFECTS, LIFECYCLE_INVARIANTS, check_trace, control_sequence,
                                       run_and_check, seed_defect, violated)

SETTINGS = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

#: (build, num_splits on both sides): upstream with the heuristic, one split (deterministic) or a fixed count; the
#: fork as vLLM runs it under full CUDA graphs (a fixed count) or with one split
SPLIT_POLICIES = [(UPSTREAM, 0), (UPSTREAM, 1), (UPSTREAM, 32), (VLLM_FORK, 32), (VLLM_FORK, 1)]


@st.composite
def sequences(draw):
    """An engine (layers of one shape, a build and split policy) and 1..6 steps; replays only of captured batches."""
    hk = draw(st.sampled_from([1, 2, 4, 8]))
    h = hk * draw(st.sampled_from([1, 2, 4, 8]))
    d = draw(st.sampled_from([64, 128, 256]))
    layers = (LayerShape(h, hk, d),) * draw(st.integers(1, 3))
    context = draw(st.sampled_from([256, 4096, 32768]))
    build, splits = draw(st.sampled_from(SPLIT_POLICIES))
    engine = EngineModel(layers=layers, context_len=context, page_size=draw(st.sampled_from([1, 16])),
                         num_sm=draw(st.sampled_from([132, 78])), precompute_num_splits=splits,
                         call_num_splits=splits, build=build, max_graph_batch=8)
    lens = st.integers(1, context)
    steps, captured = [], []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["eager", "capture", "replay"] if captured else ["eager", "capture"]))
        if kind == "eager":
            steps.append(Step("eager", tuple(draw(st.lists(lens, min_size=1, max_size=12)))))
        elif kind == "capture":
            b = draw(st.integers(1, 8))
            captured.append(b)
            steps.append(Step("capture", (1,) * b))
        else:
            b = draw(st.sampled_from(captured))
            real = draw(st.integers(1, b))
            rows = tuple(draw(st.lists(lens, min_size=real, max_size=real))) + (1,) * (b - real)
            steps.append(Step("replay", rows, real_batch=real))
    return engine, steps


@SETTINGS
@given(sequences())
def test_the_engine_model_without_defects_violates_no_lifecycle_invariant(seq):
    engine, steps = seq
    trace = run_sequence(engine, steps)
    assert check_trace(trace) == []


@pytest.mark.parametrize("name", list(LIFECYCLE_INVARIANTS))
def test_each_invariant_catches_its_seeded_defect_and_no_other_invariant_does(name):
    defect = LIFECYCLE_INVARIANTS[name].defect
    engine, steps = control_sequence(defect)
    _, clean = run_and_check(engine, steps)
    assert clean == [], f"the control sequence of {defect} is not clean: {clean[:2]}"
    trace, found = run_and_check(engine, steps, defect=defect)
    assert {v.invariant for v in found} == {name}, [v.message for v in found[:3]]
    assert all(v.step is not None or "more" in v.detail for v in found)


def test_the_semaphore_control_skips_tiles_and_the_size_control_is_silent():
    """What the two FA3-level defects do on their controls: tiles lost, and a size mismatch FA3 does not see."""
    engine, steps = control_sequence("no-semaphore-reset-after-reuse")
    trace, found = run_and_check(engine, steps, defect="no-semaphore-reset-after-reuse")
    assert max(r.skipped_tiles for r in trace.launches) > 0
    engine, steps = control_sequence("fork-precompute-heuristic-splits")
    trace, found = run_and_check(engine, steps, defect="fork-precompute-heuristic-splits")
    assert found and all(not v.detail["loud"] for v in found)
    assert not any(r.shape_error for r in trace.launches)


def test_a_size_mismatch_at_capture_is_loud():
    """Capture runs mha_fwd's host code, CHECK_SHAPE included: a capture-time mismatch raises, it is not silent."""
    engine, steps = control_sequence("fork-precompute-heuristic-splits")
    steps = [Step("capture", (1,) * 8), Step("replay", (300,) * 8)]
    trace, found = run_and_check(engine, steps, defect="fork-precompute-heuristic-splits")
    assert found and all(v.detail["loud"] for v in found if v.invariant == "PRECOMPUTE_CALL_SIZE_AGREE")


def test_registry_is_complete():
    assert set(CHECKS) == set(LIFECYCLE_INVARIANTS)
    assert {i.defect for i in LIFECYCLE_INVARIANTS.values()} == set(DEFECTS)
    for inv in LIFECYCLE_INVARIANTS.values():
        assert re.search(r"hopper/\S+@0251105a:\d+", inv.models), inv.name
        assert inv.checked and inv.statement


def test_unknown_defect_is_refused_by_name():
    engine, steps = control_sequence("replay-skips-metadata-refresh")
    with pytest.raises(ValueError, match="defect: one of"):
        seed_defect("no-such-defect", engine, steps)


def test_violations_are_capped_per_invariant():
    engine, steps = control_sequence("no-semaphore-reset-after-reuse")
    engine = EngineModel(layers=(LayerShape(32, 8),) * 12, context_len=8192, precompute_num_splits=1,
                         call_num_splits=1)
    trace, found = run_and_check(engine, steps, defect="no-semaphore-reset-after-reuse")
    assert len(found) == 9 and found[-1].detail == {"more": 11 - 8}
    assert violated(trace) == {"SEMAPHORE_STARTS_AT_ZERO"}


@SETTINGS
@given(sequences())
def test_every_generated_sequence_that_reuses_metadata_with_one_split_is_caught_before_the_fix(seq):
    """Negative control over generated sequences: FA3 before 1a58058a, one split on both sides, two or more layers,
    any launch that runs: the second layer starts from the first one's count."""
    engine, steps = seq
    engine = dataclasses.replace(engine, precompute_num_splits=1, call_num_splits=1,
                                 layers=engine.layers + engine.layers[:1])
    trace, found = run_and_check(engine, steps, defect="no-semaphore-reset-after-reuse")
    if any(r.kernel_ran for r in trace.launches):
        assert "SEMAPHORE_STARTS_AT_ZERO" in {v.invariant for v in found}


@SETTINGS
@given(sequences())
def test_every_generated_second_replay_without_a_recompute_is_caught(seq):
    engine, steps = seq
    replayed = [len(s.cache_seqlens) for s in steps if s.mode == "replay"]
    trace, found = run_and_check(engine, steps, defect="replay-skips-metadata-refresh")
    names = {v.invariant for v in found}
    if len(replayed) != len(set(replayed)):
        assert "READS_OWN_STEP_METADATA" in names
    else:
        assert names == set()      # no second replay of a batch size: the defect changes nothing
