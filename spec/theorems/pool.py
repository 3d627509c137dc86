"""The parallel side of spec.theorems.jobs: a few forked worker processes that each run many parts, one at a time.

Invariant: a worker runs a part exactly as a sequential run does (:func:`spec.theorems.jobs.run_part`: a fresh z3
context, the cyclic collector paused), so what it sends back is what the caller would have computed; what a
worker keeps between parts is pure Python caches (split tables, schedules), never z3 state.

Workers are forked from the caller, so they start with everything it has imported and need no pickling of the
parts. The first worker may be forked before `preload` (torch, for the replays) and takes only light parts while
the caller loads it; the others are forked after it, and a light-only worker with nothing left to run is retired
and replaced by one forked after the preload. Protocol: the caller writes ``"j p\\n"`` (job, part) on a worker's
task pipe; the worker answers on its result pipe with an 8-byte length and a pickle of ``("ok", value)`` or
``("raised", exception, traceback text)``; end of file on the task pipe ends the worker.
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from spec.process.deadlines import seconds_from_env
from spec.process.interrupts import raise_if_swallowed

_HEADER = struct.Struct("!Q")
_POLL_S = 0.25  # how often the caller looks for a swallowed Ctrl-C, or a part past its deadline

#: A part's deadline in a worker (seconds); ``$FA3VERIFY_THEOREM_PART_TIMEOUT`` sets it (a number in (0, 3600]).
#: Each z3 query is bounded by the part's own timeout; this bounds everything else a part does (its Python-side
#: replays), so that a worker that stops answering is killed and its theorems are inconclusive, never a hang.
PART_DEADLINE_S = 600.0
ENV_PART_DEADLINE = "FA3VERIFY_THEOREM_PART_TIMEOUT"


def part_deadline_s(environ=None) -> float:
    """The deadline of one theorem part in a worker: ``$FA3VERIFY_THEOREM_PART_TIMEOUT`` or
    :data:`PART_DEADLINE_S`; a value that is not a finite number in (0, 3600] raises ValueError naming it."""
    return seconds_from_env(ENV_PART_DEADLINE, PART_DEADLINE_S, environ)


@dataclass
class Crashed:
    """A part whose worker process ended without an answer."""

    what: str


@dataclass
class _Worker:
    pid: int
    task_fd: int
    result_fd: int
    heavy: bool                                   # forked after the preload: may run any part
    queue: list = field(default_factory=list)     # parts sent, in order; queue[0] is running
    started: float = 0.0                          # when queue[0] started (seconds since the run started)
    buf: bytearray = field(default_factory=bytearray)


def _worker_main(jobs: list, run_part: Callable, task_fd: int, result_fd: int) -> None:
    """A worker (SIGINT ignored since its fork): run the parts the caller names, answer each, leave at the end of
    the task pipe."""
    code = 0
    try:
        pending = b""
        while True:
            while b"\n" not in pending:
                chunk = os.read(task_fd, 4096)
                if not chunk:
                    return
                pending += chunk
            line, pending = pending.split(b"\n", 1)
            j, p = map(int, line.split())
            try:
                message = ("ok", run_part(jobs[j].parts[p]))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
                message = ("raised", exc, traceback.format_exc())
            try:
                data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # noqa: BLE001 - an unpicklable answer is an error of the part
                data = pickle.dumps(("raised", None, f"the part's {message[0]} value could not be sent: {exc!r}\n"
                                     + (message[2] if message[0] == "raised" else "")))
            view = memoryview(_HEADER.pack(len(data)) + data)
            while view:
                view = view[os.write(result_fd, view):]
    except BaseException:  # noqa: BLE001 - nothing may escape a forked child
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream cannot stop the exit
                pass
        os._exit(code)


def run_parallel(jobs: list, workers: int, preload: Optional[Callable[[], None]], start: float,
                 run_part: Callable, known: Optional[dict] = None,
                 deadline_s: Optional[float] = None) -> tuple[dict, dict]:
    """Run every needed part of `jobs` on up to `workers` forked workers: ({key: value}, {key: (t0, t1)}).

    `deadline_s`: seconds a part may run before its worker is killed (None: :func:`part_deadline_s`, from the
    environment).

    Keys are (job, part); `known` values (remembered ones) are not run. A part that a `stop` made unnecessary has
    no value; a part whose worker died has a Crashed value; an exception raised in a part is raised here after
    every worker is killed.
    """
    known = known or {}
    deadline = part_deadline_s() if deadline_s is None else deadline_s
    values: dict = dict(known)
    timing: dict = {k: (0.0, 0.0) for k in known}
    stops = {}  # job -> the first known part its `stop` accepts: later parts are not needed
    for (j, p), v in sorted(known.items()):
        if jobs[j].stop is not None and j not in stops and jobs[j].stop(v):
            stops[j] = p
    order = sorted(((j, p) for j, job in enumerate(jobs) for p in range(len(job.parts))
                    if (j, p) not in known and not (j in stops and p > stops[j])),
                   key=lambda k: -jobs[k[0]].part_weight(k[1]))  # longest first; job order breaks ties
    pending = list(order)
    pool: dict = {}  # result fd -> worker
    sel = selectors.DefaultSelector()
    preloaded = preload is None or all(jobs[j].light for j, _ in pending)

    def spawn(heavy: bool) -> _Worker:
        task_r, task_w = os.pipe()
        result_r, result_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        # SIGINT waits until the worker is in `pool`: a Ctrl-C between the fork and that would leave a worker
        # nobody kills (the child ignores SIGINT before it unblocks it)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child leaves through os._exit
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides on Ctrl-C (it kills the workers)
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
                os.close(task_w)
                os.close(result_r)
                for other in pool.values():  # another worker's pipes: its end of file must not wait for this one
                    os.close(other.task_fd)
                    os.close(other.result_fd)
                _worker_main(jobs, run_part, task_r, result_w)
            os.close(task_r)
            os.close(result_w)
            os.set_blocking(result_r, False)
            w = _Worker(pid, task_w, result_r, heavy)
            pool[result_r] = w
            sel.register(result_r, selectors.EVENT_READ)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return w

    def send(w: _Worker, key) -> None:
        if not w.queue:
            w.started = time.perf_counter() - start
        w.queue.append(key)
        os.write(w.task_fd, f"{key[0]} {key[1]}\n".encode())

    def remove(w: _Worker, kill: bool) -> None:
        sel.unregister(w.result_fd)
        del pool[w.result_fd]
        os.close(w.result_fd)
        os.close(w.task_fd)
        if kill:
            _kill(w.pid)
        else:
            _reap(w.pid)

    def runnable(w: _Worker):
        return next((k for k in pending if w.heavy or jobs[k[0]].light), None)

    def fill() -> None:
        nonlocal preloaded
        if not preloaded and not any(jobs[k[0]].light for k in pending):
            preload()
            preloaded = True
        if not preloaded and not pool:
            # a light-only worker starts at once with about the preload's time of light parts queued
            w = spawn(heavy=False)
            queued = 0.0
            for k in [k for k in pending if jobs[k[0]].light]:
                if w.queue and queued >= 1.9:  # torch's import, measured (2 cores)
                    break
                pending.remove(k)
                send(w, k)
                queued += jobs[k[0]].part_weight(k[1])
            preload()
            preloaded = True
        for w in list(pool.values()):
            if w.queue:
                continue
            k = runnable(w)
            if k is not None:
                pending.remove(k)
                send(w, k)
            elif pending:  # a light-only worker, only heavy parts left: one forked after the preload replaces it
                remove(w, kill=False)
        while len(pool) < workers and pending:
            w = spawn(heavy=preloaded)
            k = runnable(w)
            if k is None:
                remove(w, kill=False)
                break
            pending.remove(k)
            send(w, k)

    def answered(w: _Worker, value) -> None:
        key = w.queue.pop(0)
        now = time.perf_counter() - start
        timing[key] = (w.started, now)
        w.started = now
        values[key] = value
        j, p = key
        job = jobs[j]
        if job.stop is None or isinstance(value, Crashed) or not job.stop(value):
            return
        # the job's parts after this one are not needed (`finish` never sees them): not started, or stopped
        pending[:] = [k for k in pending if not (k[0] == j and k[1] > p)]
        for other in list(pool.values()):
            if other.queue and other.queue[0][0] == j and other.queue[0][1] > p:
                for k in other.queue[1:]:
                    if not (k[0] == j and k[1] > p):
                        pending.insert(0, k)
                remove(other, kill=True)

    try:
        while pending or any(w.queue for w in pool.values()):
            raise_if_swallowed()  # a Ctrl-C dropped in a callback stops the run here (spec/process/interrupts.py)
            late = time.perf_counter() - start - deadline
            for w in [w for w in pool.values() if w.queue and w.started < late]:
                remove_late(w, deadline, pool, sel, pending, answered)
            fill()
            for sk, _ in sel.select(timeout=_POLL_S):
                w = pool.get(sk.fd)
                if w is None:
                    continue  # removed by a stop while this round's events were gathered
                try:
                    chunk = os.read(w.result_fd, 1 << 20)
                except BlockingIOError:
                    continue
                if not chunk:  # the worker died
                    _, status = os.waitpid(w.pid, 0)
                    remove_dead(w, status, pool, sel, pending, answered)
                    continue
                w.buf += chunk
                while len(w.buf) >= _HEADER.size:
                    (size,) = _HEADER.unpack_from(w.buf)
                    if len(w.buf) < _HEADER.size + size:
                        break
                    data = bytes(w.buf[_HEADER.size:_HEADER.size + size])
                    del w.buf[:_HEADER.size + size]
                    answered(w, _value(pickle.loads(data)))
        for w in list(pool.values()):
            remove(w, kill=False)
    except BaseException:
        for w in list(pool.values()):
            remove(w, kill=True)
        raise
    finally:
        sel.close()
    return values, timing


def remove_dead(w: _Worker, status: int, pool: dict, sel, pending: list, answered) -> None:
    """A worker that died: its running part is Crashed, the parts queued behind it go back to pending."""
    _retire(w, _death(status), pool, sel, pending, answered)


def remove_late(w: _Worker, deadline: float, pool: dict, sel, pending: list, answered) -> None:
    """A worker whose running part is past its deadline: killed, and then as one that died."""
    _kill(w.pid)
    _retire(w, f"the worker process (pid {w.pid}) missed its deadline of {deadline:g} s ({ENV_PART_DEADLINE}) "
               f"and was killed",
            pool, sel, pending, answered)


def _retire(w: _Worker, why: str, pool: dict, sel, pending: list, answered) -> None:
    sel.unregister(w.result_fd)
    del pool[w.result_fd]
    os.close(w.result_fd)
    os.close(w.task_fd)
    if w.queue:
        rest = w.queue[1:]
        w.queue = w.queue[:1]
        answered(w, Crashed(why))
        pending[:0] = rest


def _death(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"the worker process died (signal {name})"
    return f"the worker process exited with status {os.WEXITSTATUS(status)} without an answer"


def _value(message) -> Any:
    """A part's value, or its exception raised here."""
    if message[0] == "ok":
        return message[1]
    _, exc, text = message
    if isinstance(exc, BaseException):
        raise exc
    raise RuntimeError(f"a theorem part failed in its worker process:\n{text}")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
