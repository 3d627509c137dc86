"""One client for every worker process the suite talks to over pipes, with one deadline policy: the engine
workers (``gpu_impl.engines``: sglang, vLLM, sglang under the runtime sanitizer) and the guard sandbox
(:mod:`spec.model.guard_isolation`).

Protocol: one JSON object per line each way, on the worker's stdin (requests) and stdout (answers); the
worker's stderr goes to a temporary file whose last lines error messages quote (or, ``capture_stderr=False``,
to this process's stderr).

Invariant (the deadline policy): every wait on a worker has a deadline -- writing a request (a worker that
stopped reading cannot block the pipe), reading its answer, its goodbye at :meth:`WorkerClient.close`. A missed
deadline kills the worker and every process it started (it runs in its own session; the group is killed) and
raises :class:`WorkerError` with ``timed_out`` set, naming the worker: ``NAME (pid N): no answer within S s;
killed``. A worker that exits or closes its pipe raises it with the exit code, a line that is not JSON with the
line. A WorkerError is never a pass or a violation: the command line reports it as inconclusive (exit 3).
No worker outlives this process: the ones still running at exit are killed. A forked copy of a client leaves
the parent's worker alone (it may not talk to it, wait for it or kill it).

:func:`run_command` is ``subprocess.run`` for one-shot commands under the same policy: its timeout kills the
command with everything it started (``subprocess.run`` kills only the command: a test runner's workers or a
build's compilers would go on running, holding a GPU or the machine's cores, after the deadline that ended it).

This module lives in spec, the lowest layer that starts processes, so that spec's guard sandbox and gpu_impl's
engine clients share it (``gpu_impl`` may import ``spec``, never the reverse); it imports only the standard
library.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import subprocess
import tempfile
import time
import weakref
from typing import Any, Callable, Optional, Sequence

__all__ = ["WorkerClient", "WorkerError", "run_command"]

#: Seconds a killed worker gets to be reaped, and a closed pipe's worker to exit after its goodbye.
REAP_S = 5.0
#: Longest single select: a worker that exits without closing its stdout (a child holds it) is seen this fast.
POLL_S = 1.0

_LIVE: "weakref.WeakSet[WorkerClient]" = weakref.WeakSet()


def _encode(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


class WorkerError(RuntimeError):
    """A worker missed its deadline (``timed_out``), exited (``returncode``), or answered something that is not
    a JSON line. ``worker`` is its name, ``pid`` its process id."""

    def __init__(self, message: str, worker: str = "", pid: Optional[int] = None, timed_out: bool = False,
                 returncode: Optional[int] = None):
        super().__init__(message)
        self.worker, self.pid, self.timed_out, self.returncode = worker, pid, timed_out, returncode


class WorkerClient:
    """A worker process speaking JSON lines, every exchange bounded by a deadline.

    ``argv``: the command; ``name``: what messages call it (``engine worker sglang==0.5.13``); ``error``: the
    WorkerError subclass raised (an engine client raises its DriverError); ``encode``: a request as its line
    (default compact JSON). ``env``/``cwd`` as for Popen.
    """

    def __init__(self, argv: Sequence[str], name: str, *, env: Optional[dict] = None, cwd: Optional[str] = None,
                 capture_stderr: bool = True, error: type = WorkerError,
                 encode: Optional[Callable[[Any], str]] = None):
        self.name, self.error = name, error
        self._encode = encode or _encode
        self._owner = os.getpid()
        self._buf = b""
        self._stderr = tempfile.TemporaryFile() if capture_stderr else None
        try:
            self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._stderr, env=env, cwd=cwd, bufsize=0, start_new_session=True)
        except OSError as exc:
            self._close_files()
            raise error(f"{name}: cannot start {argv[0]} ({exc})", worker=name) from None
        self.pid = self.proc.pid
        os.set_blocking(self.proc.stdin.fileno(), False)
        _LIVE.add(self)

    # -- naming -------------------------------------------------------------------------------------------------
    @property
    def label(self) -> str:
        """``NAME (pid N)``: how every message names the worker."""
        return f"{self.name} (pid {self.pid})"

    @property
    def running(self) -> bool:
        return self._mine() and self.proc.poll() is None

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.poll()

    def _mine(self) -> bool:
        return os.getpid() == self._owner

    def _fail(self, what: str, timed_out: bool = False, code: Optional[int] = None):
        return self.error(f"{self.label}: {what}{self.stderr_tail()}", worker=self.name, pid=self.pid,
                          timed_out=timed_out, returncode=code)

    # -- exchanges ----------------------------------------------------------------------------------------------
    def request(self, obj: Any, timeout_s: float, hint: str = "") -> Any:
        """Send ``obj`` and return the answer, the two within ``timeout_s`` seconds together (``hint``: what a
        missed deadline's message adds, in parentheses: which deadline it was and how to change it)."""
        deadline = time.monotonic() + float(timeout_s)
        self._send(obj, deadline, timeout_s, hint)
        return self._receive(deadline, timeout_s, hint)

    def send(self, obj: Any, timeout_s: float, hint: str = "") -> None:
        """Write one request line within ``timeout_s`` (a worker that stopped reading is killed)."""
        self._send(obj, time.monotonic() + float(timeout_s), timeout_s, hint)

    def receive(self, timeout_s: float, hint: str = "") -> Any:
        """The next answer line, decoded, within ``timeout_s`` (the worker's first line: its hello)."""
        return self._receive(time.monotonic() + float(timeout_s), timeout_s, hint)

    @staticmethod
    def _missed(what: str, hint: str) -> str:
        return f"{what}; killed" + (f" ({hint})" if hint else "")

    def _send(self, obj: Any, deadline: float, timeout_s: float, hint: str = "") -> None:
        if not self._mine():
            raise self.error(f"{self.label}: belongs to process {self._owner}, not to this one", worker=self.name,
                             pid=self.pid)
        line = self._encode(obj)
        data = (line if line.endswith("\n") else line + "\n").encode()
        fd = self.proc.stdin.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_WRITE)
            while data:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise self._fail(self._missed(f"did not read its request within {timeout_s:g} s", hint),
                                     timed_out=True)
                if not sel.select(timeout=min(left, POLL_S)):
                    continue
                try:
                    data = data[os.write(fd, data):]
                except BlockingIOError:
                    continue
                except OSError as exc:  # BrokenPipeError: it exited or closed its stdin
                    code = self._wait_exit()
                    raise self._fail(f"cannot send ({exc.strerror or exc}); exit code {code}", code=code) from None

    def _receive(self, deadline: float, timeout_s: float, hint: str = "") -> Any:
        if not self._mine():
            raise self.error(f"{self.label}: belongs to process {self._owner}, not to this one", worker=self.name,
                             pid=self.pid)
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise self._fail(self._missed(f"no answer within {timeout_s:g} s", hint), timed_out=True)
                if not sel.select(timeout=min(left, POLL_S)):
                    if self.proc.poll() is not None:
                        break  # exited; a child of its may still hold the pipe open
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                self._buf += chunk
        if b"\n" not in self._buf:
            code = self._wait_exit()
            raise self._fail(f"exited (code {code}) without an answer", code=code)
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            raise self._fail(f"answered a line that is not JSON: {line[:200]!r}") from None

    # -- ending -------------------------------------------------------------------------------------------------
    def _wait_exit(self) -> Optional[int]:
        """The exit code of a worker that closed its pipe (killed when it does not exit within REAP_S)."""
        try:
            return self.proc.wait(timeout=REAP_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.poll()

    def kill(self) -> None:
        """Kill the worker and its process group now, and reap it (within REAP_S). Idempotent."""
        if not self._mine():
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                try:
                    self.proc.kill()
                except OSError:
                    pass
        else:  # the leader is gone; what it started may still run in its group
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=REAP_S)
        except subprocess.TimeoutExpired:
            pass

    def close(self, goodbye: Any = None, grace_s: float = 10.0) -> None:
        """End the worker: send ``goodbye`` (if given) and give it ``grace_s`` to exit, then kill it; close the
        pipes and the stderr file. Idempotent; in a forked copy it only forgets the parent's worker."""
        _LIVE.discard(self)
        if not self._mine():
            return
        if self.proc.poll() is None and goodbye is not None:
            try:
                self.send(goodbye, grace_s)
                self.proc.stdin.close()
                self.proc.wait(timeout=grace_s)
            except (WorkerError, OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._close_files()

    def _close_files(self) -> None:
        if self._stderr is not None:
            try:
                self._stderr.close()
            except OSError:
                pass
            self._stderr = None

    def stderr_tail(self, lines: int = 15, chars: int = 2000) -> str:
        """The last lines the worker wrote to stderr, as an indented block ("" when none are kept)."""
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - chars))
            tail = self._stderr.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""
        if not tail:
            return ""
        return "\n  worker stderr (last lines):\n    " + "\n    ".join(tail.splitlines()[-lines:])

    def __del__(self):
        try:
            if self._mine() and self.proc.poll() is None:
                self.kill()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def run_command(argv: Sequence[str], timeout_s: float, *, input=None, **popen) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, timeout=timeout_s, **popen)`` in a session of its own: past
    ``timeout_s`` (and on any interruption) the command's whole process group is killed, and the output is
    collected for at most REAP_S more; raises ``subprocess.TimeoutExpired`` with what was collected, as
    ``subprocess.run`` does."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE if input is not None else popen.pop("stdin", None),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **popen)
    try:
        out, err = proc.communicate(input, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=REAP_S)
        except subprocess.TimeoutExpired:
            out = err = None
            for stream in (proc.stdout, proc.stderr):
                stream.close()
        raise subprocess.TimeoutExpired(list(argv), timeout_s, output=out, stderr=err) from None
    except BaseException:
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.wait(timeout=REAP_S)
    except subprocess.TimeoutExpired:
        pass


@atexit.register
def _kill_all() -> None:
    for client in list(_LIVE):
        client.kill()
