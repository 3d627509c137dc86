"""Ctrl-C at the two places where CPython's own handling goes wrong, made deterministic (spec/process/interrupts.py).

Each test runs `python -m fa3verify prove` as a user does, with a ``sitecustomize`` (on PYTHONPATH, test-only)
that sends the process a real SIGINT just before the theorems start, from inside the code shape that breaks
Python's default handling:

- inside ``exec`` of a string (how dataclasses build their methods): CPython then remembers an "unhandled"
  KeyboardInterrupt although the CLI handled it, and `python -m` died by SIGINT (status -2) instead of exit 3;
- inside a ``__del__`` (how the import system's module-lock callbacks run): the KeyboardInterrupt was printed as
  "Exception ignored" and dropped, and the run went on to pass (exit 0).

Both failed on the code before spec/process/interrupts.py; both are what a loaded machine produced when
tests/cli/test_cli_never_loses_files.py::test_sigint_stops_prove sent its SIGINT at the start of the stage.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_INJECT = {
    "exec": '''
        exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nfor _ in range(100000): pass", {})
    ''',
    "callback": '''
        class _DroppedAtOnce:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(100000):
                    pass
        _DroppedAtOnce()
    ''',
    "none": "",
}


def _prove_with_sigint(tmp_path: Path, where: str, jobs: int) -> subprocess.CompletedProcess:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent('''
        import os, signal
        import spec.theorems.jobs as jobs

        _run_jobs = jobs.run_jobs

        def run_jobs(*args, **kwargs):
        {inject}
            return _run_jobs(*args, **kwargs)

        jobs.run_jobs = run_jobs
    ''').format(inject=textwrap.indent(textwrap.dedent(_INJECT[where]), "    ")))
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
    return subprocess.run([sys.executable, "-m", "fa3verify", "prove", "--only", "combine", "--jobs", str(jobs),
                           "--json", "p.json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal


@pytest.mark.parametrize("jobs", [1, 2])
def test_sigint_inside_exec_exits_3_not_by_the_signal(tmp_path, jobs):
    proc = _prove_with_sigint(tmp_path, "exec", jobs)
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert "interrupted" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("jobs", [1, 2])
def test_sigint_swallowed_by_a_callback_still_stops_the_run(tmp_path, jobs):
    proc = _prove_with_sigint(tmp_path, "callback", jobs)
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert "interrupted" in proc.stderr and "Traceback" not in proc.stderr


def test_negative_control_the_same_run_without_a_sigint_passes(tmp_path):
    """The injection hook itself is inert: without a SIGINT the same run passes, so exit 3 above is the signal's."""
    proc = _prove_with_sigint(tmp_path, "none", 2)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert "interrupted" not in proc.stderr
