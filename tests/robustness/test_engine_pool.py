"""tests/engine_pool.py: the files of one test process share one engine worker per spec; each test gets a fresh
system under test on it, whose close() cannot stop the worker, and a dead worker is replaced."""

from engine_pool import EnginePool


class FakeWorker:
    def __init__(self):
        self.running = True

    def close(self):
        self.running = False


class FakeSUT:
    def __init__(self, spec):
        self.spec, self._worker, self.hello = spec, None, None

    def start(self):
        if self._worker is None or not self._worker.running:
            self._worker, self.hello = FakeWorker(), {"spec": self.spec}
        return self.hello

    def close(self):
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()


def test_one_worker_per_spec_fresh_suts_and_close_only_detaches():
    pool = EnginePool(opener=FakeSUT)
    a, b = pool.sut("sglang==0.5.13"), pool.sut("sglang==0.5.13")
    c = pool.sut("vllm==0.33.0")
    assert pool.starts == 2 and a is not b and a._worker is b._worker and a._worker is not c._worker
    assert a.hello == {"spec": "sglang==0.5.13"} and a.start() is a.hello  # started: no second start
    shared = a._worker
    a.close()
    assert shared.running and b._worker is shared and a._worker is None
    pool.close()
    assert not shared.running and not c._worker.running


def test_a_dead_worker_is_replaced_at_the_next_call():
    pool = EnginePool(opener=FakeSUT)
    first = pool.sut("sglang==0.5.23")._worker
    first.running = False  # killed at a missed deadline
    assert pool.sut("sglang==0.5.23")._worker is not first and pool.starts == 2


def test_negative_control_without_the_pool_every_module_starts_its_own():
    suts = [FakeSUT("sglang==0.5.13") for _ in range(3)]
    for s in suts:
        s.start()
    assert len({id(s._worker) for s in suts}) == 3
