"""gpu-check's ``sanitizer`` stage: the pre-fix worked example under ``compute-sanitizer --tool memcheck``.

Invariant: memcheck reports errors (out-of-bounds split buffers, ``hopper/flash_fwd_combine_kernel.h``) for the
pre-fix worked example; it runs only on a GPU with compute-sanitizer on PATH (skipped otherwise), in a child
``python -m fa3verify.commands.gpu_check --child-worked-example pre-fix``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from spec.finding import StageStatus
from spec.process.worker_client import run_command

from .runner import repo_root, tail, parse_memcheck

if TYPE_CHECKING:
    from .runner import GpuCheck, Stage


def run(check: GpuCheck, stage: Stage) -> None:
    p = check.plan
    stage.expectation = "memcheck reports errors for the pre-fix worked example (out-of-bounds split buffers)"
    tool = shutil.which("compute-sanitizer")
    stage.numbers["compute_sanitizer"] = tool
    if p.dry_run:
        stage.status, stage.message = StageStatus.SKIPPED, "dry run: no GPU to check"
        return
    if not tool:
        stage.status, stage.message = StageStatus.SKIPPED, "compute-sanitizer is not on PATH"
        return
    limit = check.budget(p.sanitizer_timeout_s, reserve=5)
    if limit < 30:
        stage.status, stage.message = StageStatus.INCONCLUSIVE, f"only {limit:.0f}s left; memcheck needs more"
        return
    cmd = [tool, "--tool", "memcheck", "--print-limit", "20", "--error-exitcode", "99",
           sys.executable, "-m", "fa3verify.commands.gpu_check", "--child-worked-example", "pre-fix",
           "--long", str(p.worked_long), "--seed", str(p.seed)]
    stage.numbers["command"] = " ".join(cmd)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    t0 = time.perf_counter()
    try:
        proc = run_command(cmd, limit, cwd=repo_root(), env=env, text=True)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stage.status, stage.message = StageStatus.INCONCLUSIVE, f"memcheck did not finish within {limit:.0f}s"
        stage.numbers["output_tail"] = tail(out)
        return
    text = proc.stdout + "\n" + proc.stderr
    parsed = parse_memcheck(text)
    stage.numbers.update(returncode=proc.returncode, run_seconds=round(time.perf_counter() - t0, 1), **parsed)
    stage.numbers["output_tail"] = tail(text, 3000)
    if parsed["errors"] is None:
        stage.status = StageStatus.INCONCLUSIVE
        stage.message = f"no memcheck ERROR SUMMARY in the output (exit {proc.returncode})"
    elif parsed["errors"] > 0:
        stage.status = StageStatus.PASS
        path = check.save_case("sanitizer", "pre-fix", {"command": stage.numbers["command"], **parsed,
                                                       "output": tail(text, 20000)})
        check.finding("sanitizer", "memcheck", f"memcheck: {parsed['errors']} error(s) in the pre-fix worked "
                     f"example; first: {parsed['first_errors'][:1]}", case_file=path)
        stage.message = f"{parsed['errors']} memcheck error(s)"
    else:
        stage.status = StageStatus.FAIL
        stage.message = "memcheck finished without errors on the pre-fix case"
