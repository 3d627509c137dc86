"""Crash isolation (fa3verify.workers): every way a worker can die becomes a recorded crash, and the campaign goes on.

Spawn is slow (a fresh interpreter per worker), so the tests share pools and keep timeouts short.
"""

import functools
import os
import signal

import pytest

from fa3verify.workers import (WorkerInitError, WorkerPool, WorkerResult, is_cuda_error, probe_task,
                               worker_state)


def task(kind, **kw):
    return functools.partial(probe_task, kind, **kw)


def _remember(key, value):
    state = worker_state()
    state[key] = value
    return dict(state)


def _init_fails():
    raise RuntimeError("no GPU in this worker")


def _init_marks(tag):
    worker_state()["init"] = tag


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(1, init=_init_marks, init_args=("marked",), timeout_s=1.5) as p:
        yield p


def test_ok_task_returns_its_value_and_the_worker_is_reused(pool):
    first = pool.run(task("pid"))
    second = pool.run(task("ok", value={"x": 1}))
    assert first.ok and first.kind == "ok" and not first.crashed
    assert second.ok and second.value == {"x": 1}
    assert pool.run(task("pid")).value == first.value  # same process: state and CUDA context survive
    assert pool.run(functools.partial(worker_state)).value["init"] == "marked"


@pytest.mark.parametrize("kind, expect_kind, expect_code", [
    ("exit", "died", 3),
    ("abort", "died", -signal.SIGABRT),
    ("sleep", "timeout", None),
    ("cuda_error", "cuda_error", None),
])
def test_every_crash_is_recorded_and_later_tasks_still_run(pool, kind, expect_kind, expect_code):
    before_pid = pool.pids[0]
    crashes, replacements = pool.crashes, pool.replacements
    result = pool.run(task(kind))
    assert isinstance(result, WorkerResult)
    assert not result.ok and result.crashed and result.kind == expect_kind, result
    assert result.error_text, "a crash carries an error text for the case file"
    assert result.worker_pid == before_pid
    if expect_code is not None:
        assert result.exitcode == expect_code
    if kind == "cuda_error":
        assert "illegal memory access" in result.error_text and is_cuda_error(result.error_text)
    if kind == "sleep":
        assert 1.4 <= result.elapsed < 10
    assert pool.crashes == crashes + 1 and pool.replacements == replacements + 1
    assert pool.pids[0] != before_pid  # replaced
    after = pool.run(task("ok", value=kind))
    assert after.ok and after.value == kind
    assert pool.run(functools.partial(worker_state)).value["init"] == "marked"  # init ran in the replacement


def test_an_ordinary_exception_is_an_error_not_a_crash(pool):
    pid = pool.pids[0]
    result = pool.run(task("raise"))
    assert not result.ok and not result.crashed and result.kind == "error"
    assert "ValueError" in result.error_text and "on purpose" in result.error_text
    assert pool.pids[0] == pid  # kept: its state is fine
    assert pool.run(task("ok", value=1)).value == 1


def test_worker_state_lives_across_tasks(pool):
    pool.run(functools.partial(_remember, "adapter", "cached"))
    assert pool.run(functools.partial(_remember, "other", 2)).value["adapter"] == "cached"


def test_unpicklable_task_is_an_error_of_the_caller(pool):
    result = pool.run(lambda: 1)  # noqa: E731 - a lambda cannot be pickled
    assert not result.ok and not result.crashed and result.kind == "error"
    assert pool.run(task("ok", value=2)).value == 2


def test_run_many_with_two_workers_survives_a_mixed_campaign():
    kinds = ["ok", "exit", "ok", "cuda_error", "raise", "ok", "abort", "ok"]
    with WorkerPool(2, timeout_s=20) as pool:
        results = dict(pool.run_many(task(k, value=i) for i, k in enumerate(kinds)))
    assert sorted(results) == list(range(len(kinds)))
    for i, k in enumerate(kinds):
        r = results[i]
        if k == "ok":
            assert r.ok and r.value == i
        elif k == "raise":
            assert r.kind == "error" and not r.crashed
        else:
            assert r.crashed and not r.ok
    assert pool.crashes == 3 and pool.tasks == len(kinds)


def test_a_lazy_task_source_stops_when_the_caller_says_so():
    produced = []

    def source():
        for i in range(100):
            if len(produced) >= 3:
                return
            produced.append(i)
            yield task("ok", value=i)

    with WorkerPool(1, timeout_s=20) as pool:
        values = [r.value for _, r in pool.run_many(source())]
    assert values == [0, 1, 2]


def test_init_failure_raises_in_the_parent():
    with pytest.raises(WorkerInitError, match="no GPU in this worker"):
        with WorkerPool(1, init=_init_fails, timeout_s=5) as pool:
            pool.run(task("ok"))


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="n: must be >= 1"):
        WorkerPool(0)
    with pytest.raises(ValueError, match="timeout_s"):
        WorkerPool(1, timeout_s=0)


def test_cuda_error_patterns():
    assert is_cuda_error("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert is_cuda_error("torch.AcceleratorError: CUDA error: unspecified launch failure")
    assert is_cuda_error("device-side assert triggered")
    assert not is_cuda_error("ValueError: q: must be a tensor")
    assert WorkerResult(ok=False, kind="died", exitcode=-6, error_text="x\nlast line").summary().startswith("died")
    assert os.getpid() > 0
