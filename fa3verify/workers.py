"""Crash isolation: run cases in worker subprocesses, so one that kills its process costs one case, not the campaign.

An illegal memory access on a GPU poisons the CUDA context of the process that made it: every later CUDA call
in that process fails. So the GPU fuzzer and ``gpu-check`` run each case in a worker process (multiprocessing,
*spawn* context: a fork of a process that touched CUDA is unusable). :class:`WorkerPool` keeps ``n`` workers,
sends each a task (a picklable zero-argument callable, usually ``functools.partial(module_level_fn, ...)``),
and turns every way a task can end into a :class:`WorkerResult`:

=============  =========================================================  ===========  ==================
kind           what happened                                              ``crashed``  worker afterwards
=============  =========================================================  ===========  ==================
``ok``         the task returned a value                                  False        reused
``error``      the task raised an ordinary exception                      False        reused
``cuda_error`` the task raised, and the text names a CUDA error           True         replaced
               (:data:`CUDA_ERROR_PATTERNS`: "illegal memory access",
               "CUDA error", "device-side assert", ...)
``died``       the process exited (``os._exit``, ``os.abort``, a signal)  True         replaced
``timeout``    no answer within ``timeout_s``; the process is killed      True         replaced
=============  =========================================================  ===========  ==================

A crash is a *finding*, not an error of the pool: the caller records it (``gpu-check`` writes a case file with
``error_text``) and goes on; the pool starts a replacement worker at once, so later tasks still run.

Workers keep state between tasks (an adapter, a CUDA context): ``init(*init_args)`` runs once in each new
worker, and tasks may cache objects in :func:`worker_state`. A task that fails in ``init`` raises
:class:`WorkerInitError` in the parent: a pool whose workers cannot start cannot run anything.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

__all__ = ["WorkerPool", "WorkerResult", "WorkerInitError", "CUDA_ERROR_PATTERNS", "is_cuda_error",
           "worker_state", "probe_task", "PROBE_KINDS"]

#: Substrings (case-insensitive) of an exception's text that mean the worker's CUDA context is unusable.
CUDA_ERROR_PATTERNS = (
    "illegal memory access",
    "cuda error",
    "cudaerror",
    "cuda_error",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "an illegal",
    "cublas_status",
    "cudnn_status",
    "acceleratorerror",
)

#: Seconds a worker gets to start (interpreter, imports, ``init``) before it counts as dead.
DEFAULT_START_TIMEOUT_S = 180.0

# the worker side keeps its state here (one dict per worker process)
_STATE: dict = {}


def is_cuda_error(text: str) -> bool:
    """Whether an error text names a CUDA error that leaves the process's CUDA context unusable."""
    low = (text or "").lower()
    return any(p in low for p in CUDA_ERROR_PATTERNS)


def worker_state() -> dict:
    """A dict private to the current worker process that lives across its tasks (cache adapters here)."""
    return _STATE


@dataclass
class WorkerResult:
    """How one task ended. ``value`` when ``ok``; ``error_text`` (a traceback or what the pool saw) otherwise.

    ``crashed`` is True when the worker died, timed out or reported a CUDA error: the task is a finding and
    the worker was replaced. ``exitcode`` is the dead worker's exit status (negative: killed by that signal).
    """

    ok: bool
    value: Any = None
    error_text: str = ""
    crashed: bool = False
    exitcode: Optional[int] = None
    elapsed: float = 0.0
    kind: str = "ok"
    worker_pid: Optional[int] = None

    def summary(self) -> str:
        """One line: the kind, the exit status and the last line of the error text."""
        if self.ok:
            return f"ok in {self.elapsed:.2f}s"
        last = (self.error_text.strip().splitlines() or [""])[-1][:300]
        code = f", exit status {self.exitcode}" if self.exitcode is not None else ""
        return f"{self.kind}{code} after {self.elapsed:.2f}s: {last}"

    def to_dict(self, with_value: bool = False) -> dict:
        d = asdict(self)
        if not with_value:
            d.pop("value")
        return d


class WorkerInitError(RuntimeError):
    """A worker could not start: its ``init`` raised, or the process died or hung while starting."""


# ----------------------------------------------------------------------------------------------------------
# The worker process
# ----------------------------------------------------------------------------------------------------------


def _worker_main(conn, init: Optional[Callable], init_args: tuple) -> None:
    """Body of a worker process: run ``init`` once, then answer tasks until told to stop (None) or EOF."""
    try:
        if init is not None:
            init(*init_args)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises WorkerInitError
        _send(conn, ("init_error", traceback.format_exc()))
        return
    _send(conn, ("ready", os.getpid()))
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            value = task()
        except BaseException:  # noqa: BLE001 - every exception is an answer
            _send(conn, ("error", traceback.format_exc()))
            continue
        if not _send(conn, ("ok", value)):
            _send(conn, ("error", "the task's return value could not be sent to the parent (not picklable?):\n"
                                  + traceback.format_exc()))


def _send(conn, message) -> bool:
    try:
        conn.send(message)
        return True
    except Exception:  # noqa: BLE001 - e.g. an unpicklable value; the caller decides
        return False


# ----------------------------------------------------------------------------------------------------------
# The parent side
# ----------------------------------------------------------------------------------------------------------


class _Worker:
    """One worker process and its pipe, as the parent sees it."""

    def __init__(self, ctx, init, init_args):
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child_conn, init, init_args), daemon=True,
                                   name="fa3verify-worker")
        self.process.start()
        child_conn.close()
        self.conn = parent_conn
        self.ready = False
        self.started = time.perf_counter()
        self.pid = self.process.pid

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the worker said 'ready'; WorkerInitError if it failed or died or hung starting."""
        while not self.poll_ready(timeout_s):
            remaining = timeout_s - (time.perf_counter() - self.started)
            multiprocessing.connection.wait([self.conn, self.process.sentinel], timeout=max(0.01, remaining))

    def poll_ready(self, timeout_s: float) -> bool:
        """Without blocking: True once the worker is ready, False while it starts; WorkerInitError when it
        failed, died or has been starting for longer than ``timeout_s``."""
        if self.ready:
            return True
        try:
            if self.conn.poll(0):
                tag, payload = self.conn.recv()
                if tag == "init_error":
                    self.reap()
                    raise WorkerInitError(f"worker init failed:\n{payload}")
                self.ready = True
                return True
        except (EOFError, OSError):
            code = self.reap()
            raise WorkerInitError(f"worker {self.pid} died while starting (exit status {code})") from None
        if not self.process.is_alive():
            code = self.reap()
            raise WorkerInitError(f"worker {self.pid} died while starting (exit status {code})")
        if time.perf_counter() - self.started > timeout_s:
            self.kill()
            raise WorkerInitError(f"worker {self.pid} did not start within {timeout_s:.0f}s")
        return False

    def reap(self, timeout_s: float = 5.0) -> Optional[int]:
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.kill()
        self._close_conn()
        return self.process.exitcode

    def kill(self) -> Optional[int]:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(3.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(3.0)
        self._close_conn()
        return self.process.exitcode

    def stop(self) -> None:
        """Ask politely (None), then kill if it does not leave."""
        try:
            self.conn.send(None)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.process.join(3.0)
        self.kill()

    def _close_conn(self) -> None:
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass


class WorkerPool:
    """``n`` worker subprocesses (spawn context) that run tasks and survive crashes.

    ``init(*init_args)`` runs once per worker (picklable, module level). ``timeout_s`` bounds one task; a task
    past it is killed and recorded as ``timeout``. Use as a context manager, or call :meth:`close`.

    Counters: ``tasks`` (answered), ``crashes`` (died, timed out or CUDA error), ``replacements`` (workers
    started after the first ``n``).
    """

    def __init__(self, n: int = 1, init: Optional[Callable] = None, timeout_s: float = 60.0,
                 init_args: Sequence = (), start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 context: str = "spawn"):
        if int(n) < 1:
            raise ValueError(f"n: must be >= 1 worker, got {n}")
        if timeout_s is None or float(timeout_s) <= 0:
            raise ValueError(f"timeout_s: must be > 0 seconds, got {timeout_s}")
        self.n = int(n)
        self.init = init
        self.init_args = tuple(init_args)
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self._ctx = multiprocessing.get_context(context)
        self._workers: list[_Worker] = [_Worker(self._ctx, self.init, self.init_args) for _ in range(self.n)]
        self.tasks = 0
        self.crashes = 0
        self.replacements = 0
        self._closed = False

    # -- public ---------------------------------------------------------------------------------------
    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    @property
    def pids(self) -> list[int]:
        """Process ids of the current workers (a replaced worker's pid disappears from here)."""
        return [w.pid for w in self._workers]

    def wait_ready(self) -> None:
        """Wait for every worker to finish starting; WorkerInitError if one cannot."""
        for w in self._workers:
            w.wait_ready(self.start_timeout_s)

    def run(self, task: Callable[[], Any], timeout_s: Optional[float] = None) -> WorkerResult:
        """Run one task in a worker and wait for it; never raises for what the task does."""
        for _, result in self.run_many([task], timeout_s=timeout_s):
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def run_many(self, tasks: Iterable[Callable[[], Any]], timeout_s: Optional[float] = None
                 ) -> Iterator[tuple[int, WorkerResult]]:
        """Run tasks on all workers at once; yield ``(index, result)`` as each finishes (completion order).

        ``tasks`` may be a lazy iterable (a generator that decides from earlier results, or a budget check):
        the next task is pulled only when a worker is free.
        """
        if self._closed:
            raise RuntimeError("WorkerPool: closed")
        limit = self.timeout_s if timeout_s is None else float(timeout_s)
        source = iter(enumerate(tasks))
        busy: dict[int, tuple[int, float]] = {}  # slot -> (task index, start time)
        exhausted = False
        while True:
            # hand out work to idle workers that have finished starting (a replacement may still be starting)
            for slot in range(self.n):
                if exhausted:
                    break
                if slot in busy or not self._workers[slot].poll_ready(self.start_timeout_s):
                    continue
                try:
                    index, task = next(source)
                except StopIteration:
                    exhausted = True
                    break
                started = time.perf_counter()
                failed = self._dispatch(slot, task)
                if failed is not None:
                    failed.elapsed = time.perf_counter() - started
                    self.tasks += 1
                    yield index, failed
                    continue
                busy[slot] = (index, started)
            if not busy and exhausted:
                return
            # wait for an answer, a death, a starting worker becoming ready, or the earliest deadline
            now = time.perf_counter()
            deadlines = [start + limit for _, start in busy.values()]
            starting = [] if exhausted else [w for s, w in enumerate(self._workers) if s not in busy and not w.ready]
            deadlines += [w.started + self.start_timeout_s for w in starting]
            wait_s = max(0.0, min(deadlines) - now) if deadlines else 0.0
            handles = {}
            for s in busy:
                handles[self._workers[s].conn] = s
                handles[self._workers[s].process.sentinel] = s
            for w in starting:
                handles[w.conn] = None
                handles[w.process.sentinel] = None
            ready = multiprocessing.connection.wait(list(handles), timeout=wait_s)
            done_slots = {handles[r] for r in ready if handles.get(r) is not None}
            now = time.perf_counter()
            for slot, (index, start) in list(busy.items()):
                if slot in done_slots:
                    result = self._collect(slot)
                elif now - start >= limit:
                    result = self._timeout(slot, limit)
                else:
                    continue
                result.elapsed = time.perf_counter() - start
                del busy[slot]
                self.tasks += 1
                yield index, result

    def close(self) -> None:
        """Stop every worker (politely, then by force)."""
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            w.stop()

    # -- internals ------------------------------------------------------------------------------------
    def _dispatch(self, slot: int, task) -> Optional[WorkerResult]:
        """Send a task to worker ``slot``; a WorkerResult when it could not be sent (then it is final)."""
        worker = self._workers[slot]
        try:
            worker.conn.send(task)
        except (BrokenPipeError, EOFError, OSError):
            return self._died(slot, "the worker was gone before the task reached it")
        except Exception:  # noqa: BLE001 - the task itself cannot be pickled: the caller's error, not a crash
            return WorkerResult(ok=False, kind="error", worker_pid=worker.pid,
                                error_text="the task could not be sent to the worker (not picklable?):\n"
                                           + traceback.format_exc())
        return None

    def _collect(self, slot: int) -> WorkerResult:
        worker = self._workers[slot]
        try:
            if not worker.conn.poll():
                raise EOFError  # only the sentinel fired: the process is gone
            tag, payload = worker.conn.recv()
        except (EOFError, OSError):
            return self._died(slot, "the worker process exited before answering")
        if tag == "ok":
            return WorkerResult(ok=True, value=payload, kind="ok", worker_pid=worker.pid)
        text = str(payload)
        if is_cuda_error(text):
            self.crashes += 1
            worker.kill()
            self._replace(slot)
            return WorkerResult(ok=False, error_text=text, crashed=True, kind="cuda_error", worker_pid=worker.pid,
                                exitcode=worker.process.exitcode)
        return WorkerResult(ok=False, error_text=text, kind="error", worker_pid=worker.pid)

    def _died(self, slot: int, what: str) -> WorkerResult:
        worker = self._workers[slot]
        code = worker.reap()
        self.crashes += 1
        self._replace(slot)
        return WorkerResult(ok=False, crashed=True, kind="died", exitcode=code, worker_pid=worker.pid,
                            error_text=f"{what}: exit status {code}{_signal_name(code)}")

    def _timeout(self, slot: int, limit: float) -> WorkerResult:
        worker = self._workers[slot]
        code = worker.kill()
        self.crashes += 1
        self._replace(slot)
        return WorkerResult(ok=False, crashed=True, kind="timeout", exitcode=code, worker_pid=worker.pid,
                            error_text=f"no answer within {limit:.1f}s: worker {worker.pid} killed "
                                       f"(exit status {code}{_signal_name(code)})")

    def _replace(self, slot: int) -> None:
        """Start a new worker in ``slot`` now (it finishes starting while the caller goes on)."""
        self._workers[slot] = _Worker(self._ctx, self.init, self.init_args)
        self.replacements += 1


def _signal_name(code: Optional[int]) -> str:
    if code is None or code >= 0:
        return ""
    import signal

    try:
        return f" ({signal.Signals(-code).name})"
    except ValueError:
        return ""


# ----------------------------------------------------------------------------------------------------------
# A task that misbehaves on purpose (tests and gpu-check's isolation self-test)
# ----------------------------------------------------------------------------------------------------------

#: What :func:`probe_task` can do.
PROBE_KINDS = ("ok", "exit", "abort", "sleep", "cuda_error", "raise", "pid")


def probe_task(kind: str = "ok", value: Any = None, sleep_s: float = 3600.0) -> Any:
    """Behave as ``kind`` says: return ``value`` ("ok"), the worker's pid ("pid"), ``os._exit(3)`` ("exit"),
    ``os.abort()`` ("abort"), sleep ``sleep_s`` ("sleep", past any timeout), raise the CUDA runtime's
    illegal-access error ("cuda_error") or an ordinary ``ValueError`` ("raise")."""
    if kind == "ok":
        return value
    if kind == "pid":
        return os.getpid()
    if kind == "exit":
        os._exit(3)
    if kind == "abort":
        os.abort()
    if kind == "sleep":
        time.sleep(sleep_s)
        return value
    if kind == "cuda_error":
        raise RuntimeError("CUDA error: an illegal memory access was encountered\n"
                           "CUDA kernel errors might be asynchronously reported at some other API call")
    if kind == "raise":
        raise ValueError("an ordinary error raised by the task on purpose")
    raise ValueError(f"kind: must be one of {PROBE_KINDS}, got {kind!r}")
