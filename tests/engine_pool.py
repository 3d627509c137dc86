"""Engine workers shared across test files: one started worker per engine spec per test process (a session fixture,
``engine_sut`` in tests/conftest.py), instead of one per module.

Invariant: each :meth:`EnginePool.sut` call returns a fresh system under test (its own domain, verdict caches and
hello) on the process's one worker for that spec, and its ``close()`` only detaches it, so no test can stop a
worker another file uses; a worker that died (killed at a missed deadline, crashed) is replaced at the next call.
Sharing is as safe as a module fixture already is: the drivers keep no state between requests (every request sets
up its own layout and backend), and a module's tests already share one worker.
"""

from __future__ import annotations


def _running(sut) -> bool:
    worker = getattr(sut, "_worker", None)
    inner = getattr(worker, "_worker", worker)  # VllmSUT -> VllmWorker -> EngineWorker; SglangSUT -> EngineWorker
    return inner is not None and bool(getattr(inner, "running", False))


class EnginePool:
    """Started engine workers of this process by spec text (``sglang==V``, ``vllm==V``)."""

    def __init__(self, opener=None):
        if opener is None:
            from gpu_impl.sut import open_sut as opener
        self._open = opener
        self.owners: dict = {}
        self.starts = 0  # workers started (a test checks the sharing through it)

    def _owner(self, spec: str):
        owner = self.owners.get(spec)
        if owner is None or not _running(owner):
            if owner is not None:
                owner.close()
            owner = self._open(spec)
            owner.start()
            self.starts += 1
            self.owners[spec] = owner
        return owner

    def sut(self, spec: str):
        """A fresh, started system under test for ``spec`` on the shared worker."""
        owner = self._owner(spec)
        sut = self._open(spec)
        sut._worker = owner._worker
        for name in ("hello", "observed"):
            if hasattr(owner, name):
                setattr(sut, name, getattr(owner, name))

        def detach() -> None:
            sut._worker = None

        sut.close = detach
        return sut

    def close(self) -> None:
        owners, self.owners = self.owners, {}
        for owner in owners.values():
            owner.close()


def route_opens(pool: EnginePool, monkeypatch) -> None:
    """Make every real engine a command opens (``gpu_impl.sut.open_sut``, which ``fa3verify.engine_choice
    .open_engine`` calls for ``--engine`` and for a replayed case's own engine) a fresh system under test on
    ``pool``'s worker for that spec, so the CLI commands of a test process start each engine's worker once; the
    model stays the model. For tests whose subject is the command's verdict on the engine's code, not the start of
    its worker (a command's own ``start`` is then a no-op on the running worker)."""
    import gpu_impl.sut as sut_mod

    real = sut_mod.open_sut

    def open_pooled(spec, **options):  # options: the model's policy (gpu_impl.sut.open_sut)
        parsed = sut_mod.parse_engine(spec) if isinstance(spec, str) else spec
        return real(parsed, **options) if parsed.is_model else pool.sut(str(parsed))

    monkeypatch.setattr(sut_mod, "open_sut", open_pooled)
