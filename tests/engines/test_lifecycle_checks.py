"""gpu_impl.lifecycle_checks: the semaphore before a launch and a persistent buffer's freshness before a replay,
seen at run time on the sanitizer's checker (a fake CUDA-graph class on CPU)."""

import time

import pytest
import torch

from gpu_impl.fa3_calls import CheckingFA3, MetadataMismatch
from gpu_impl.kernels.emulated import EmulatedKernel
from gpu_impl.lifecycle_checks import LifecycleWatch, semaphore_violation
from engines.test_fa3_calls import SMALL, small_call_args, small_precompute


class FakeGraph:
    """torch.cuda.CUDAGraph's three methods, on CPU: capture marks the checker's 'capturing'."""

    capturing = False

    def capture_begin(self):
        FakeGraph.capturing = True

    def capture_end(self):
        FakeGraph.capturing = False

    def replay(self):
        self.replayed = getattr(self, "replayed", 0) + 1


@pytest.fixture
def setup():
    checker = CheckingFA3(EmulatedKernel(), mode="record", capturing=lambda: FakeGraph.capturing)
    watch = LifecycleWatch(checker, semaphore=True, graph_cls=FakeGraph).install()
    yield checker, watch
    watch.uninstall()
    assert "replay" not in FakeGraph.__dict__ or FakeGraph.__dict__["replay"].__name__ == "replay"


def names(checker):
    return [v.invariant for _, _, found in checker.violations() for v in found]


def recompute_into(checker, buffer, lens):
    md = small_precompute(checker, lens, (8, 2))
    view = buffer[:md.numel()]
    view.copy_(md)
    buffer[md.numel():] = 0
    checker.note_copy(view, md)
    return view


def test_fresh_metadata_passes_and_a_left_count_is_caught_before_the_launch(setup):
    checker, watch = setup
    q, k, v, kw = small_call_args(SMALL)
    md = small_precompute(checker, SMALL, (8, 2))
    checker.flash_attn_with_kvcache(q, k, v, scheduler_metadata=md, **kw)
    assert names(checker) == [] and watch.semaphores_read == 1
    md[-1] = 37          # what FA3 before 1a58058a left after a one-split launch
    checker.flash_attn_with_kvcache(q, k, v, scheduler_metadata=md, **kw)
    assert names(checker) == ["SEMAPHORE_STARTS_AT_ZERO"]


def test_semaphore_is_not_read_off_sm90():
    assert semaphore_violation(torch.tensor([5, 3], dtype=torch.int32), arch=80) is None
    assert semaphore_violation(torch.tensor([5, 3], dtype=torch.int32), arch=90).detail == {"semaphore": 3}


def test_a_replay_without_a_recompute_reads_the_previous_steps_metadata(setup):
    checker, watch = setup
    buffer = torch.zeros(1 + 8 * 4, dtype=torch.int32)
    q, k, v, kw = small_call_args(SMALL)
    view = recompute_into(checker, buffer, SMALL)
    graph = FakeGraph()
    graph.capture_begin()
    checker.flash_attn_with_kvcache(q, k, v, scheduler_metadata=view, **kw)
    graph.capture_end()
    recompute_into(checker, buffer, SMALL)       # step 1: recomputed, then replayed
    graph.replay()
    assert names(checker) == [] and watch.replays_checked == 1 and graph.replayed == 1
    graph.replay()                                # step 2: replayed over step 1's metadata
    assert names(checker) == ["READS_OWN_STEP_METADATA"]
    recompute_into(checker, buffer, SMALL)
    buffer[view.numel() - 1] = 9                  # a count left in the buffer's semaphore slot
    graph.replay()
    assert names(checker)[-1:] == ["SEMAPHORE_STARTS_AT_ZERO"]


def test_raise_mode_stops_a_stale_replay_before_it_runs():
    checker = CheckingFA3(EmulatedKernel(), mode="raise", capturing=lambda: FakeGraph.capturing)
    watch = LifecycleWatch(checker, graph_cls=FakeGraph).install()
    try:
        buffer = torch.zeros(1 + 8 * 4, dtype=torch.int32)
        q, k, v, kw = small_call_args(SMALL)
        view = recompute_into(checker, buffer, SMALL)
        graph = FakeGraph()
        graph.capture_begin()
        checker.flash_attn_with_kvcache(q, k, v, scheduler_metadata=view, **kw)
        graph.capture_end()
        with pytest.raises(MetadataMismatch, match="READS_OWN_STEP_METADATA"):
            graph.replay()
        assert not hasattr(graph, "replayed")
    finally:
        watch.uninstall()
    assert FakeGraph.replay.__qualname__ == "FakeGraph.replay"


def test_cost_per_call_is_small(setup):
    """The semaphore read on a host tensor: measured per call against the same checker without the watch."""
    checker, watch = setup
    q, k, v, kw = small_call_args(SMALL)
    md = small_precompute(checker, SMALL, (8, 2))
    call, _, _ = checker._record_call((), dict(q=q, k_cache=k, v_cache=v, scheduler_metadata=md, **kw), False, False)
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        checker.check(call, md)
    with_watch = (time.perf_counter() - t0) / n
    watch.uninstall()
    t0 = time.perf_counter()
    for _ in range(n):
        checker.check(call, md)
    without = (time.perf_counter() - t0) / n
    assert with_watch - without < 1e-3, (with_watch, without)


def test_the_sanitizer_helper_installs_on_its_checker():
    from fa3verify.sanitize.core import Sanitizer
    from fa3verify.sanitize.lifecycle import watch_lifecycle

    with pytest.raises(ValueError, match="sanitizer: none is installed"):
        watch_lifecycle(graph_cls=FakeGraph)
    s = Sanitizer(mode="record", deep=True, write_files=False, import_hook=False, follow_copies=False,
                  capturing=lambda: FakeGraph.capturing, num_sm=132, arch=90)
    watch = watch_lifecycle(s, graph_cls=FakeGraph)
    try:
        assert watch.checker is s.checker and watch.semaphore
    finally:
        watch.uninstall()


def test_measure_overhead_reports_every_figure():
    from fa3verify.sanitize.lifecycle import measure_overhead

    out = measure_overhead(calls=40)
    for key in ("semaphore_read_quick_us", "semaphore_read_deep_us", "replay_watch_us", "replay_watch_semaphore_us",
                "call_quick_us", "replay_step_us"):
        assert key in out and out[key] == out[key]      # a number, not NaN
    assert out["call_quick_us"] > 0 and out["replay_step_watched_us"] > 0
