"""gpu-check's ``gpu_tests`` stage: ``pytest -m gpu tests/gpu`` in a subprocess, counted from its JUnit XML.

Invariant: on a GPU at least one gpu test passes and none fails or errors; in a dry run every gpu test skips
and none fails; a missing report or a timeout is inconclusive, never a pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

from spec.finding import StageStatus
from spec.process.worker_client import run_command

from .runner import repo_root, tail, junit_counts, junit_failures

if TYPE_CHECKING:
    from .runner import GpuCheck, Stage


def run(check: GpuCheck, stage: Stage) -> None:
    p = check.plan
    stage.expectation = ("on CPU every gpu test skips (none fails)" if p.dry_run
                         else "at least one gpu test passes and none fails or errors")
    repo = repo_root()
    tests_dir = os.path.join(repo, "tests", "gpu")
    if not os.path.isdir(tests_dir):
        stage.status, stage.message = StageStatus.INCONCLUSIVE, f"no tests/gpu folder under {repo}"
        return
    limit = check.budget(p.gpu_tests_timeout_s, reserve=10)
    junit = os.path.join(check.out_dir, "gpu_tests.xml")
    if os.path.exists(junit):
        os.remove(junit)
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-rs", f"--junitxml={junit}"]
    stage.numbers["command"] = " ".join(cmd[1:])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = run_command(cmd, max(5.0, limit), cwd=repo, env=env, text=True)
    except subprocess.TimeoutExpired as exc:
        stage.status, stage.message = StageStatus.INCONCLUSIVE, f"pytest did not finish within {limit:.0f}s"
        stage.numbers["output_tail"] = tail((exc.stdout or b"").decode(errors="replace")
                                             if isinstance(exc.stdout, bytes) else (exc.stdout or ""))
        return
    counts = junit_counts(junit)
    stage.numbers.update(returncode=proc.returncode, **counts)
    stage.numbers["output_tail"] = tail(proc.stdout + proc.stderr, 1500)
    if counts.get("tests") is None:
        stage.status = StageStatus.INCONCLUSIVE
        stage.message = f"pytest exited {proc.returncode} without a JUnit report"
        return
    bad = counts["failures"] + counts["errors"]
    if bad:
        stage.status = StageStatus.FAIL
        for case in junit_failures(junit)[:10]:
            check.finding("gpu_tests", "test_failed", case)
    elif p.dry_run:
        stage.status = StageStatus.PASS
    else:
        stage.status = StageStatus.PASS if counts["passed"] >= 1 else StageStatus.INCONCLUSIVE
    stage.message = (f"{counts['passed']} passed, {counts['failures']} failed, {counts['errors']} errors, "
                     f"{counts['skipped']} skipped")
