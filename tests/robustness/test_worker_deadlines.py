"""Every wait on a worker has a deadline: a worker that sleeps forever costs its deadline, is killed,
and comes back as an inconclusive result naming it (exit 3 at the command line), never a hang.

One test per kind of worker: the shared pipe client, the sglang engine worker, the vLLM engine worker, the
sanitizer's engine worker, the guard sandbox, a multi-rank rank, the crash-isolating pool and a theorem worker. Engines are faked
(tests/fake_workers.py: an engine environment whose python is a stuck worker), so nothing here needs an engine
environment. Deadlines are 1-3 s; elapsed times are checked only against generous bounds (deadline + 20 s or
more), and every call that could hang on a client without a deadline runs under a watchdog, so such a client
fails the test instead of blocking the suite.
"""

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fake_workers import SLOW_START_S, fake_engine_home, gone

REPO = Path(__file__).resolve().parents[2]
CASE = str(REPO / "tests" / "corpus" / "worked_example_fixed_guard.json")
SLACK_S = 20.0


def within(limit_s: float, fn):
    """(value, exception, seconds) of ``fn()``; fails the test when it is still waiting after ``limit_s``."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["exc"] = exc

    start = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        pytest.fail(f"still waiting after {limit_s:.0f} s: a wait without a deadline")
    return box.get("value"), box.get("exc"), time.monotonic() - start


def named_pid(message: str, name: str) -> int:
    """The pid a message gives for ``name`` (``NAME (pid N)``)."""
    m = re.search(re.escape(name) + r" \(pid (\d+)\)", message)
    assert m, f"{name!r} with its pid not in: {message}"
    return int(m.group(1))


def cli(args, env, timeout_s):
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    try:
        return subprocess.run([sys.executable, "-m", "fa3verify", *args], cwd=REPO, env=full, capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"fa3verify {' '.join(args)} still running after {timeout_s} s: a wait without a deadline")


# -- the shared client -------------------------------------------------------------------------------------------

def test_the_shared_client_kills_a_silent_worker_and_names_it():
    from spec.process.worker_client import WorkerClient, WorkerError

    client = WorkerClient([sys.executable, "-c", "import time; time.sleep(300)"], "test worker")
    _, exc, seconds = within(1 + SLACK_S, lambda: client.receive(1.0))
    assert isinstance(exc, WorkerError) and exc.timed_out and seconds < 1 + SLACK_S
    assert f"test worker (pid {client.pid}): no answer within 1 s; killed" in str(exc)
    assert gone(client.pid)
    client.close()


def test_a_command_past_its_deadline_is_killed_with_what_it_started():
    """subprocess.run's timeout kills only the command: what it started (a test runner's workers) goes on
    running. run_command kills the command's process group."""
    from spec.process.worker_client import run_command

    script = "sleep 300 & echo $!; sleep 300"
    _, exc, seconds = within(1 + SLACK_S, lambda: run_command(["sh", "-c", script], 1.0, text=True))
    assert isinstance(exc, subprocess.TimeoutExpired) and seconds < 1 + SLACK_S, exc
    assert gone(int(exc.output.split()[0]))
    done = run_command([sys.executable, "-c", "import sys; print('out'); sys.exit(4)"], 60, text=True)
    assert (done.returncode, done.stdout) == (4, "out\n")


# -- sglang ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, what", [("silent", "no answer within 2 s; killed"),
                                        ("stall", "no answer within 2 s; killed"),
                                        ("deaf", "did not read its request within 2 s; killed")])
def test_a_stuck_sglang_worker_is_killed_at_its_deadline(tmp_path, mode, what):
    from gpu_impl.engines.errors import DriverError
    from gpu_impl.engines.sglang.host import SglangSUT
    from gpu_impl.sut import parse_engine

    root = fake_engine_home(tmp_path, "sglang", "0.5.13", mode)
    sut = SglangSUT(parse_engine("sglang==0.5.13"), progress=lambda line: None, root=root, timeout_s=2,
                    start_timeout_s=2)
    # a request larger than a pipe's buffer: a worker that never reads blocks the write, not only the answer
    request = {"op": "hello", "padding": "x" * (1 << 20)}
    _, exc, seconds = within(2 * 2 + SLACK_S, lambda: sut.request(request))
    assert isinstance(exc, DriverError) and exc.timed_out, exc
    assert seconds < 2 * 2 + SLACK_S
    assert what in str(exc)
    assert gone(named_pid(str(exc), "engine worker sglang==0.5.13"))
    sut.close()


def test_a_stuck_sglang_worker_through_the_cli_is_inconclusive_and_named(tmp_path):
    root = fake_engine_home(tmp_path / "home", "sglang", "0.5.13", "silent")
    start = time.monotonic()
    proc = cli(["replay", CASE, "--engine", "sglang==0.5.13"],
               {"FA3VERIFY_ENGINE_HOME": str(root), "FA3VERIFY_ENGINE_START_TIMEOUT": "2"}, 2 + 60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert time.monotonic() - start < 2 + 60
    assert "inconclusive: engine worker sglang==0.5.13 (pid" in proc.stderr
    assert "no answer within 2 s; killed" in proc.stderr and "Traceback" not in proc.stderr
    assert "the start deadline, FA3VERIFY_ENGINE_START_TIMEOUT" in proc.stderr  # the message says which one
    assert gone(named_pid(proc.stderr, "engine worker sglang==0.5.13"))


@pytest.mark.parametrize("variable, function, argument, bad_argument, bad_value", [
    ("FA3VERIFY_ENGINE_TIMEOUT", "engine_timeout_s", "timeout_s", 0, "abc"),
    ("FA3VERIFY_ENGINE_START_TIMEOUT", "engine_start_timeout_s", "start_timeout_s", -1, "nan"),
])
def test_a_bad_engine_deadline_is_a_usage_error_naming_the_variable(tmp_path, variable, function, argument,
                                                                     bad_argument, bad_value):
    from gpu_impl.engines import worker_client
    from gpu_impl.engines.errors import EngineUnavailable

    deadline_s = getattr(worker_client, function)
    for value in ("abc", "0", "-5", "nan", "inf", "1e9"):
        with pytest.raises(EngineUnavailable, match=variable + r": .*\(0, 86400\]"):
            deadline_s(environ={variable: value})
    with pytest.raises(EngineUnavailable, match=argument + ": "):
        deadline_s(bad_argument)
    assert deadline_s(environ={}) == 900.0 and deadline_s(environ={variable: "2"}) == 2
    root = fake_engine_home(tmp_path / "home", "sglang", "0.5.13", "silent")
    proc = cli(["replay", CASE, "--engine", "sglang==0.5.13"],
               {"FA3VERIFY_ENGINE_HOME": str(root), variable: bad_value}, 60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert variable in proc.stderr and "(0, 86400]" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_start_slower_than_the_answer_deadline_is_not_a_stalled_answer(tmp_path, engine):
    """A worker whose start (the engine's import) takes longer than the answer deadline is not killed: its hello
    has the start deadline. Negative control: the same worker under a start deadline shorter than its start is
    killed at that deadline, and after its hello a stalled answer is still killed at the answer deadline. (Before,
    one deadline bounded both, and a slow start on a loaded machine read as a stalled answer.)"""
    from gpu_impl.engines.errors import DriverError
    from gpu_impl.engines.sglang.host import SglangSUT
    from gpu_impl.engines.vllm.host import VllmSUT
    from gpu_impl.sut import parse_engine

    def make(root, start_timeout_s):
        if engine == "sglang":
            return SglangSUT(parse_engine("sglang==0.5.13"), progress=lambda line: None, root=root, timeout_s=1,
                             start_timeout_s=start_timeout_s)
        return VllmSUT("0.33.0", progress=lambda line: None, root=root, timeout_s=1, start_timeout_s=start_timeout_s)

    release = "0.5.13" if engine == "sglang" else "0.33.0"
    root = fake_engine_home(tmp_path / "ok", engine, release, "slow")
    sut = make(root, None)
    hello, exc, seconds = within(SLOW_START_S + SLACK_S, sut.start)
    assert exc is None and hello["fake"] == "stuck worker", exc
    assert seconds >= SLOW_START_S  # its start took longer than the 1 s answer deadline, and it was kept
    _, exc, _ = within(1 + SLACK_S, lambda: sut.request({"op": "hello"}) if engine == "sglang"
                       else sut.worker.request({"op": "hello"}))
    assert isinstance(exc, DriverError) and exc.timed_out and "no answer within 1 s; killed" in str(exc), exc
    assert "the answer deadline, FA3VERIFY_ENGINE_TIMEOUT" in str(exc)
    sut.close()

    root = fake_engine_home(tmp_path / "short", engine, release, "slow")
    sut = make(root, 1)
    _, exc, seconds = within(1 + SLACK_S, sut.start)
    assert isinstance(exc, DriverError) and exc.timed_out, exc
    assert "no answer within 1 s; killed (the start deadline, FA3VERIFY_ENGINE_START_TIMEOUT)" in str(exc)
    assert seconds < SLOW_START_S + SLACK_S
    assert gone(named_pid(str(exc), f"engine worker {engine}=={release}"))
    sut.close()


# -- vLLM --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["silent", "stall"])
def test_a_stuck_vllm_worker_is_killed_at_its_deadline(tmp_path, mode):
    from gpu_impl.engines.errors import DriverError
    from gpu_impl.engines.vllm.host import VllmSUT

    root = fake_engine_home(tmp_path, "vllm", "0.33.0", mode)
    sut = VllmSUT("0.33.0", progress=lambda line: None, root=root, timeout_s=2, start_timeout_s=2)
    _, exc, seconds = within(2 + SLACK_S, lambda: sut.worker.request({"op": "hello"}))
    assert isinstance(exc, DriverError) and exc.timed_out, exc
    assert seconds < 2 + SLACK_S
    assert "no answer within 2 s; killed" in str(exc)
    assert gone(named_pid(str(exc), "engine worker vllm==0.33.0"))
    sut.close()


def test_a_vllm_worker_killed_at_its_deadline_is_replaced_on_the_next_use(tmp_path):
    """The next scenario after a missed deadline gets a fresh driver (as sglang's start() does): before, VllmSUT
    kept the killed worker and every later request failed on it."""
    from gpu_impl.engines.errors import DriverError
    from gpu_impl.engines.vllm.host import VllmSUT

    root = fake_engine_home(tmp_path, "vllm", "0.33.0", "stall")
    # the answer deadline does not bound a worker's start (its hello has the start deadline, 900 s by default):
    # a slow start of the fresh worker on a loaded machine is not read as a stalled answer
    sut = VllmSUT("0.33.0", progress=lambda line: None, root=root, timeout_s=2)
    first = sut.worker
    _, exc, _ = within(2 + SLACK_S, lambda: first.request({"op": "hello"}))
    assert isinstance(exc, DriverError) and exc.timed_out and not first.running
    second = sut.worker
    assert second is not first and second.running and second.pid != first.pid
    _, exc, _ = within(2 + SLACK_S, lambda: second.request({"op": "hello"}))
    assert isinstance(exc, DriverError) and exc.timed_out  # the fresh one has the same deadline
    sut.close()
    assert gone(first.pid) and gone(second.pid)


def test_a_stuck_vllm_worker_through_the_cli_is_inconclusive_and_named(tmp_path):
    root = fake_engine_home(tmp_path / "home", "vllm", "0.33.0", "stall")
    proc = cli(["fuzz", "--engine", "vllm==0.33.0", "--cases", "1", "--out", str(tmp_path / "cases")],
               {"FA3VERIFY_ENGINE_HOME": str(root), "FA3VERIFY_ENGINE_TIMEOUT": "2"}, 2 + 60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "inconclusive: engine worker vllm==0.33.0 (pid" in proc.stderr, proc.stderr
    assert "no answer within 2 s; killed" in proc.stderr and "Traceback" not in proc.stderr
    assert gone(named_pid(proc.stderr, "engine worker vllm==0.33.0"))


# -- the sanitizer's engine worker -------------------------------------------------------------------------------

def test_a_stuck_sanitized_engine_worker_is_killed_at_its_deadline(tmp_path, monkeypatch):
    from fa3verify.sanitize.engine import open_sanitized
    from gpu_impl.engines.errors import DriverError

    root = fake_engine_home(tmp_path, "sglang", "0.5.13", "silent")
    monkeypatch.setenv("FA3VERIFY_ENGINE_START_TIMEOUT", "2")
    sut = open_sanitized("sglang==0.5.13", out_dir=tmp_path / "out", progress=lambda line: None, root=root)
    _, exc, seconds = within(2 + SLACK_S, sut.start)
    assert isinstance(exc, DriverError) and exc.timed_out, exc
    assert "no answer within 2 s; killed" in str(exc)
    assert gone(named_pid(str(exc), "engine worker sglang==0.5.13"))
    sut.close()


# -- the guard sandbox -------------------------------------------------------------------------------------------

def test_a_guard_that_sleeps_is_killed_at_its_deadline_and_named(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import spec.model.guard_isolation as isolation
    from spec.model.guards import GuardTimeout, load_guard

    path = tmp_path / "sleepy.py"
    path.write_text("import time\ndef g(a):\n    time.sleep(300)\n    return True\n")
    monkeypatch.setattr(isolation, "GUARD_TIMEOUT_S", 1.0)
    guard = load_guard(f"{path}:g")
    pid = guard._proc.pid
    _, exc, seconds = within(1 + SLACK_S, lambda: guard(SimpleNamespace(enable_dp_attention=True)))
    assert isinstance(exc, GuardTimeout), exc
    assert f"(pid {pid}) took longer than the 1 s deadline (GUARD_TIMEOUT); its process was killed" in str(exc)
    assert gone(pid)


def test_a_guard_whose_import_hangs_is_inconclusive_at_the_import_deadline(tmp_path):
    """Through the CLI: a missed import deadline is exit 3 naming the guard's process, not exit 2 (bad input)."""
    path = tmp_path / "stuck_import.py"
    path.write_text("import time\ntime.sleep(300)\ndef g(a):\n    return True\n")
    start = time.monotonic()
    proc = cli(["fuzz", "--guard", f"{path}:g", "--cases", "1", "--out", str(tmp_path / "cases")],
               {"FA3VERIFY_GUARD_IMPORT_TIMEOUT": "2"}, 2 + 60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert time.monotonic() - start < 2 + 60
    assert "inconclusive: guard spec" in proc.stderr and "took longer than the 2 s deadline" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert gone(int(re.search(r"\(pid (\d+)\)", proc.stderr).group(1)))


def test_a_bad_guard_import_deadline_names_the_variable(monkeypatch):
    from spec.model.guard_isolation import import_timeout_s
    from spec.model.guards import GuardSpecError

    for value in ("x", "0", "nan", "5000"):
        with pytest.raises(GuardSpecError, match=r"FA3VERIFY_GUARD_IMPORT_TIMEOUT: .*\(0, 3600\]"):
            import_timeout_s({"FA3VERIFY_GUARD_IMPORT_TIMEOUT": value})
    assert import_timeout_s({}) == 120.0


# -- a multi-rank rank -------------------------------------------------------------------------------------------

def test_a_hung_rank_through_the_cli_is_inconclusive_and_names_the_ranks(tmp_path):
    pytest.importorskip("torch.distributed")
    timeout = 8
    start = time.monotonic()
    proc = cli(["run-ranks", str(REPO / "tests" / "corpus" / "worked_example_prefix_guard.json"),
                "--inject-fault", "1:hang", "--timeout-s", str(timeout), "--metadata-only",
                "--out-dir", str(tmp_path / "ranks")], {}, timeout + 120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert time.monotonic() - start < timeout + 120
    assert f"no verdict within {timeout} s" in proc.stdout and "killed" in proc.stdout, proc.stdout
    for rank in re.findall(r"rank \d+ \(pid \d+\)", proc.stdout):
        assert gone(int(rank.split("pid ")[1].rstrip(")")))
    assert gone(named_pid(proc.stdout, "rank 1"))


# -- the crash-isolating pool ------------------------------------------------------------------------------------

def test_a_pool_task_that_sleeps_is_killed_at_its_deadline_and_named():
    import functools

    from fa3verify.workers import WorkerPool, probe_task

    with WorkerPool(1, timeout_s=2.0) as pool:
        pool.wait_ready()
        res, exc, seconds = within(2 + 60, lambda: pool.run(functools.partial(probe_task, "sleep", sleep_s=300)))
        assert exc is None and res.kind == "timeout" and not res.ok
        assert f"no answer within 2.0s: worker {res.worker_pid} killed" in res.error_text
        assert gone(res.worker_pid)


def _sleep_forever():
    time.sleep(300)


def test_a_pool_worker_whose_init_hangs_is_killed_at_the_start_deadline():
    from fa3verify.workers import WorkerInitError, WorkerPool

    pool = WorkerPool(1, init=_sleep_forever, timeout_s=2.0, start_timeout_s=3.0)
    pid = pool.pids[0]
    try:
        _, exc, seconds = within(3 + 60, pool.wait_ready)
        assert isinstance(exc, WorkerInitError) and f"worker {pid} did not start within 3s" in str(exc)
        assert gone(pid)
    finally:
        pool.close()


def test_a_build_lock_held_past_the_deadline_is_inconclusive_and_names_the_holder(tmp_path):
    """Another build that never lets go of a release's lock: the waiting build gives up at its deadline."""
    import fcntl

    from gpu_impl.engines.envs import BuildLockTimeout, wait_for_build_lock
    from spec.process.worker_client import WorkerError

    path = tmp_path / "sglang-0.5.13.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"f = open({str(path)!r}, 'a+'); fcntl.flock(f, fcntl.LOCK_EX); f.write(f'{{os.getpid()}}\\n'); f.flush()\n"
        "print('held', flush=True); time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with open(path, "a+") as lock:
            start = time.monotonic()
            with pytest.raises(BuildLockTimeout) as caught:
                wait_for_build_lock(lock, "sglang==0.5.13", deadline_s=0.5)
            assert time.monotonic() - start < 60
        assert isinstance(caught.value, WorkerError) and caught.value.timed_out
        assert f"pid {holder.pid}" in str(caught.value) and "sglang==0.5.13" in str(caught.value)
    finally:
        holder.kill()
        holder.wait()
    with open(path, "a+") as lock:  # once the holder is gone the lock is taken, and the new holder is named in it
        wait_for_build_lock(lock, "sglang==0.5.13", deadline_s=5)
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert path.read_text().strip() == str(os.getpid())


# -- a theorem worker (spec.theorems.pool) ------------------------------------------------------------------------

def _part_that_sleeps():
    time.sleep(300)
    return []


def _part_that_answers():
    from spec.theorems.results import TheoremResult

    return [TheoremResult("quick", "proved", 0.0, {}, None, "")]


def test_a_theorem_part_that_sleeps_is_killed_at_its_deadline_and_named(monkeypatch):
    from spec.theorems.jobs import Job, run_jobs

    monkeypatch.setenv("FA3VERIFY_THEOREM_PART_TIMEOUT", "2")
    jobs = [Job(("stuck",), (_part_that_sleeps,), weight=9.0), Job(("quick",), (_part_that_answers,))]
    run, exc, seconds = within(2 + 60, lambda: run_jobs(jobs, workers=2))
    assert exc is None, exc
    by = {r.name: r for r in run.results}
    assert by["quick"].verdict == "proved"
    stuck = by["stuck"]
    assert stuck.verdict == "inconclusive" and stuck.inconclusive and not stuck.expected
    assert "missed its deadline of 2 s (FA3VERIFY_THEOREM_PART_TIMEOUT)" in stuck.message
    assert gone(int(re.search(r"pid (\d+)", stuck.message).group(1)))


def test_a_stuck_theorem_worker_through_the_cli_is_inconclusive_and_named(tmp_path):
    """`prove` with every part stuck (a test-only sitecustomize replaces spec.theorems.jobs.run_part): exit 3 at
    the deadline, the theorems named inconclusive."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import time\nimport spec.theorems.jobs as jobs\n\n"
                                           "def run_part(fn):\n    time.sleep(300)\n\njobs.run_part = run_part\n")
    proc = cli(["prove", "--only", "zigzag", "--jobs", "2", "--cases-dir", str(tmp_path / "cases")],
               {"FA3VERIFY_THEOREM_PART_TIMEOUT": "2", "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}, 2 + 90)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "missed its deadline of 2 s" in proc.stdout + proc.stderr


def test_a_bad_theorem_part_deadline_names_the_variable(tmp_path):
    from spec.theorems.pool import part_deadline_s

    for value in ("x", "0", "nan", "5000"):
        with pytest.raises(ValueError, match=r"FA3VERIFY_THEOREM_PART_TIMEOUT: .*\(0, 3600\]"):
            part_deadline_s({"FA3VERIFY_THEOREM_PART_TIMEOUT": value})
    assert part_deadline_s({}) == 600.0
    proc = cli(["prove", "--only", "combine"], {"FA3VERIFY_THEOREM_PART_TIMEOUT": "soon"}, 120)
    assert proc.returncode == 2 and "FA3VERIFY_THEOREM_PART_TIMEOUT" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
