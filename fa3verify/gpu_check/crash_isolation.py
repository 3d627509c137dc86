"""gpu-check's ``crash_isolation`` stage: a worker that exits on purpose is recorded and replaced.

Invariant: a task that kills its worker (``os._exit(3)``) comes back as a crash of kind ``died``, and the next
task runs in a replacement worker (the self-test of :mod:`fa3verify.workers`), so a real kernel crash later
costs one case, not the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spec.finding import StageStatus

if TYPE_CHECKING:
    from .runner import GpuCheck, Stage


def run(check: GpuCheck, stage: Stage) -> None:
    import functools

    from ..workers import probe_task

    stage.expectation = "a worker that calls os._exit(3) is recorded as a crash and replaced; the next task runs"
    crash = check.pool.run(functools.partial(probe_task, "exit"), timeout_s=60)
    after = check.pool.run(functools.partial(probe_task, "ok", "alive"), timeout_s=check.budget(180))
    stage.numbers.update(crash_kind=crash.kind, crash_exitcode=crash.exitcode, next_task_ok=after.ok,
                         replacements=check.pool.replacements)
    good = crash.crashed and crash.kind == "died" and after.ok and after.value == "alive"
    stage.status = StageStatus.PASS if good else (StageStatus.INCONCLUSIVE if not after.ok and after.crashed else StageStatus.FAIL)
    if not after.ok:
        stage.message = f"replacement worker: {after.summary()}"
