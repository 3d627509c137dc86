"""What keeps a warm ``gate --engine`` short: the engine's worker imports beside the gate's z3 stages, and it ends
without the interpreter's teardown.

- Asking a vLLM release's identity (the gate's witness plan asks it for the release's profile before its z3 stages)
  never waits for a launched worker's hello: the release is the spec's. Negative control: a worker whose hello
  fails the test when read.
- sglang's system under test launches its worker without reading the hello (``launch``), and ``start`` then reads it
  once; before, sglang had no ``launch`` and its import began only after the z3 stages.
- Both drivers end their process at once after the bye (``protocol.exit_worker``): an ``atexit`` handler of the
  driver's process never runs (it did when the sglang driver raised SystemExit).

No engine environment is needed: the drivers run in the project's interpreter, where the engine does not import
(their answer is the import failure, exit 3), and the hosts get stand-in workers.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpu_impl.engines.envs import project_path


class _LaunchedWorker:
    """A launched worker still importing: reading its hello is what the gate must not do before its z3 stages."""

    running = True
    greeted = None

    @property
    def hello(self):
        raise AssertionError("the worker's hello was waited for")

    def close(self):
        pass


def test_a_vllm_release_names_itself_without_waiting_for_its_launched_worker():
    from fa3verify.engine_choice import identity_of
    from fa3verify.engine_gate import witness_plan
    from gpu_impl.engines.vllm.host import VllmSUT

    sut = VllmSUT(release="0.33.0", progress=lambda line: None)
    sut._worker = _LaunchedWorker()
    assert sut.identity() == {"name": "vllm==0.33.0", "release": "0.33.0"}
    assert identity_of(sut)["release"] == "0.33.0"
    assert witness_plan(sut)  # what the gate asks before its z3 stages
    greeted = _LaunchedWorker()
    greeted.greeted = {"release": "0.33.0"}
    sut._worker = greeted  # once the hello is in, the worker's own word is added
    assert sut.identity()["reported_version"] == "0.33.0"


def test_the_stand_in_catches_a_wait_for_the_hello():
    """Negative control of the stand-in: reading its hello fails."""
    with pytest.raises(AssertionError, match="waited"):
        _LaunchedWorker().hello


def test_sglang_launches_its_worker_without_its_hello_and_start_reads_it_once(monkeypatch):
    from gpu_impl.engines.sglang import host as sglang_host
    from gpu_impl.sut import parse_engine

    made, reads = [], []

    class Host:
        def __init__(self, *args, greet=True, **kwargs):
            made.append(greet)
            self.running = True

        @property
        def hello(self):
            reads.append(1)
            return {"release": "0.5.23"}

        @property
        def first(self):
            return {"ok": True}

        def close(self):
            self.running = False

    monkeypatch.setattr(sglang_host, "EngineHost", Host)
    sut = sglang_host.SglangSUT.__new__(sglang_host.SglangSUT)
    sut.spec = parse_engine("sglang==0.5.23")
    sut.release, sut.source, sut.worker, sut.worker_env = "0.5.23", None, "gpu_impl.engines.sglang.driver", {}
    sut.env, sut.timeout_s, sut.start_timeout_s = project_path(), 10.0, 10.0
    sut._worker, sut.hello, sut.observed = None, None, None
    sut.launch()
    assert made == [False] and reads == []  # started, not waited for
    sut.launch()
    assert made == [False]  # idempotent
    hello = sut.start()
    assert hello["release"] == "0.5.23" and "start_s" in hello and reads == [1]
    assert sut.start() is hello and reads == [1] and made == [False]
    sut._worker.running = False  # a dead worker is replaced at the next start
    sut.start()
    assert made == [False, False] and reads == [1, 1]


_DRIVER_WITH_AN_EXIT_HOOK = """
import atexit, runpy, sys
atexit.register(lambda: sys.stderr.write("INTERPRETER TEARDOWN\\n"))
runpy.run_module(sys.argv[1], run_name="__main__")
"""


@pytest.mark.parametrize("driver", ["gpu_impl.engines.sglang.driver", "gpu_impl.engines.vllm.driver"])
def test_a_driver_ends_its_process_without_the_interpreters_teardown(driver):
    proc = subprocess.run([sys.executable, "-c", _DRIVER_WITH_AN_EXIT_HOOK, driver], input='{"op": "quit"}\n',
                          capture_output=True, text=True, timeout=120, cwd=str(project_path()))
    assert proc.returncode == 3 and '"kind":"import"' in proc.stdout.replace(" ", ""), (proc.stdout, proc.stderr)
    assert "INTERPRETER TEARDOWN" not in proc.stderr


def test_the_exit_hook_runs_on_a_plain_exit():
    """Negative control: the same hook does run where a process ends by SystemExit."""
    proc = subprocess.run([sys.executable, "-c", _DRIVER_WITH_AN_EXIT_HOOK.replace(
        'runpy.run_module(sys.argv[1], run_name="__main__")', "raise SystemExit(3)")], capture_output=True, text=True,
        timeout=60)
    assert proc.returncode == 3 and "INTERPRETER TEARDOWN" in proc.stderr
