"""The engine matrix's run: its releases gated by one or more lanes, each release's engine kept open until the case
files of every earlier failing row are known, so that the fix-release replays run on it as in a release-by-release
run.

Invariant: the rows and the fix releases do not depend on how many lanes run them (with ``--cases N``, the same
case files). A lane gates one release at a time (:func:`fa3verify.engine_matrix.gate_release`), answers its row and
keeps the release's engine open; :func:`run_matrix` hands that lane the replays of its release once every earlier
release has its row -- so the ledger then holds the case files of every earlier failing row, as a release-by-release
run's does -- and only then is the lane free for the next release. Releases are handed out in release order, so the
earliest release in flight never waits for another: the run cannot deadlock.

Two kinds of lane behind one small interface (``start_row``, ``start_replay``, ``interrupt``, ``kill``, ``close``):
:class:`InProcessLane` (the only lane of ``--jobs 1``, and of API callers that open releases with a callable) and
:class:`ProcessLane` (``--jobs N``: a ``python -m fa3verify.matrix_worker`` process speaking JSON lines through
:mod:`spec.process.worker_client`, every answer within :data:`LANE_TIMEOUT_S`; one that dies or misses it makes its
release's row inconclusive and is replaced). A SIGINT stops the run: the lanes in flight are interrupted (a process
lane gets the signal forwarded) and get :data:`STOP_GRACE_S` to answer (a second SIGINT: none) before they are
killed, no release is handed out after it, and every release not gated to its end is an inconclusive row saying so.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import asdict
from typing import Callable, Optional

from spec.process.deadlines import seconds_from_env
from spec.process.worker_client import WorkerClient, WorkerError

from .engine_matrix import (INTERRUPTED, MatrixRow, ReleaseRun, RowOptions, default_engine, gate_release,
                            inconclusive_row, shared_row)
from .matrix_fixes import CaseReplays, FixLedger, replay_on_release

__all__ = ["run_matrix", "InProcessLane", "ProcessLane", "replay_files", "LANE_TIMEOUT_S", "ENV_LANE_TIMEOUT"]

#: A process lane's deadline for one answer (a release's row, or its replays), in seconds:
#: ``$FA3VERIFY_MATRIX_LANE_TIMEOUT`` sets it (a number in (0, 86400]). A row's own stages have deadlines of their
#: own; this bounds a lane that stops answering.
LANE_TIMEOUT_S = 1800.0
ENV_LANE_TIMEOUT = "FA3VERIFY_MATRIX_LANE_TIMEOUT"
_POLL_S = 0.25
#: After a SIGINT, how long the lanes in flight get to end their release and answer (a second SIGINT: none); then
#: they are killed and their releases are inconclusive rows.
STOP_GRACE_S = 60.0
#: the key of a lane's answer to a request that raised (:mod:`fa3verify.matrix_worker`)
RAISED = "raised"


class InProcessLane:
    """A lane in this process: ``open_sut(release)`` opens a release; each call runs now and posts its answer."""

    def __init__(self, open_sut: Callable, options: RowOptions, say: Callable[[str], None]):
        self.open_sut, self.options, self.say = open_sut, options, say
        self.witness_cache: dict = {}
        self.held = None

    def start_row(self, release: str, answers: queue.Queue) -> None:
        run = gate_release(release, self.open_sut, self.options, self.say, self.witness_cache)
        self.held = run.sut
        answers.put((self, "row", run))

    def start_replay(self, release: str, files: list, answers: queue.Queue) -> None:
        answers.put((self, "replay", replay_files(self.held, files)))
        self._release_engine()

    def _release_engine(self) -> None:
        if self.held is not None:
            self.held.close()
            self.held = None

    def interrupt(self) -> None:
        """Nothing to forward: this process's SIGINT reaches the gate running here."""

    def kill(self) -> None:
        """Nothing to kill: a gate in this process ends on the SIGINT itself."""

    def close(self) -> None:
        self._release_engine()


class ProcessLane:
    """A lane in its own process (:mod:`fa3verify.matrix_worker`): each call is sent from a thread that posts the
    answer, or the WorkerError of a lane that died or missed :data:`LANE_TIMEOUT_S`."""

    def __init__(self, options: RowOptions, no_setup: bool, number: int, timeout_s: float):
        self.options, self.no_setup, self.timeout_s = options, no_setup, timeout_s
        self.client = WorkerClient([sys.executable, "-m", "fa3verify.matrix_worker"],
                                   f"engine matrix lane {number}", capture_stderr=False)

    def _ask(self, kind: str, request: dict, answers: queue.Queue, decode: Callable) -> None:
        def exchange() -> None:
            try:
                answer = self.client.request(request, self.timeout_s, hint=f"${ENV_LANE_TIMEOUT} sets it")
                answers.put((self, kind, _raised_or(answer, decode)))
            except BaseException as exc:  # noqa: BLE001 - the lane's failure is its release's answer
                answers.put((self, kind, exc))

        threading.Thread(target=exchange, name=f"{self.client.name} {kind}", daemon=True).start()

    def start_row(self, release: str, answers: queue.Queue) -> None:
        self._ask("row", {"op": "row", "release": release, "no_setup": self.no_setup, "options": asdict(self.options)},
                  answers, _decode_run)

    def start_replay(self, release: str, files: list, answers: queue.Queue) -> None:
        self._ask("replay", {"op": "replay", "files": files}, answers,
                  lambda a: (dict(a["verdicts"]), float(a["seconds"]), bool(a["interrupted"])))

    def interrupt(self) -> None:
        if self.client.running:
            try:
                os.kill(self.client.pid, signal.SIGINT)
            except OSError:
                pass

    def kill(self) -> None:
        """End the lane now (its request's thread then answers with the WorkerError of a killed lane)."""
        self.client.kill()

    def close(self) -> None:
        self.client.close(goodbye={"op": "bye"}, grace_s=10.0)


def replay_files(sut, files: list) -> tuple:
    """(verdict per case file, seconds, interrupted) of replaying ``files`` on an open engine; a SIGINT ends the
    replays there, keeping the verdicts so far."""
    start, verdicts = time.perf_counter(), {}
    try:
        for f in files:
            verdicts[f] = replay_on_release(f, sut)
    except KeyboardInterrupt:
        return verdicts, time.perf_counter() - start, True
    return verdicts, time.perf_counter() - start, False


def lane_timeout_s() -> float:
    """:data:`LANE_TIMEOUT_S`, or ``$FA3VERIFY_MATRIX_LANE_TIMEOUT``; a value that is not a number in (0, 86400] is a
    UsageError naming it (exit 2, before any lane starts)."""
    from .errors import UsageError

    return seconds_from_env(ENV_LANE_TIMEOUT, LANE_TIMEOUT_S, maximum=86400.0, error=UsageError)


class LaneCrash(RuntimeError):
    """A lane's gate raised something that is not a worker's failure (a defect here: the command's internal error)."""


def _raised_or(answer, decode: Callable):
    if not isinstance(answer, dict):
        raise WorkerError(f"engine matrix lane: answered {str(answer)[:200]!r}, not an object")
    if RAISED in answer:
        return LaneCrash(f"{answer[RAISED]}\n{answer.get('traceback', '')}".rstrip())
    return decode(answer)


def _decode_run(answer: dict) -> ReleaseRun:
    return ReleaseRun(MatrixRow(**answer["row"]), sut=None, cases=[CaseReplays(**c) for c in answer["cases"]],
                      interrupted=bool(answer["interrupted"]), open=bool(answer["open"]))


def run_matrix(releases, open_sut: Optional[Callable] = None, budget_s: Optional[float] = 20.0,
               max_cases: Optional[int] = None, seed: int = 0, timeout_s: float = 10.0,
               cases_dir: str = "fa3verify-out/engine-matrix", progress: Optional[Callable[[str], None]] = None,
               with_probes: bool = True, engine: Optional[str] = None, runs_as: Optional[dict] = None,
               fixes: Optional[list] = None, jobs: int = 1, no_setup: bool = False) -> list:
    """Gate every release of ``engine``, one row each, in release order. ``jobs`` 1: one lane in this process,
    ``open_sut(release)`` opening each release; ``jobs`` N > 1: N process lanes, each opening a release as the
    command line does (``no_setup``: a release without a ready environment is unavailable, not built). ``runs_as``:
    release -> the release whose row runs it (a release sharing an earlier row copies that row, saying so).
    ``fixes``: a list that receives the fix-release replays (:class:`fa3verify.matrix_fixes.FixLedger` entries):
    every failing row's case files replayed on their own release and on every later one, while that release's
    engine is open."""
    engine = engine or default_engine()
    say = progress or (lambda line: None)
    options = RowOptions(engine=engine, budget_s=budget_s, max_cases=max_cases, seed=seed, timeout_s=timeout_s,
                         cases_dir=cases_dir, with_probes=with_probes, keep_open=fixes is not None)
    releases = list(releases)
    shared = {r: s for r, s in (runs_as or {}).items()
              if r in releases and s and s != r and s in releases[:releases.index(r)]}
    gated = [r for r in releases if r not in shared]
    if jobs > 1:
        timeout_s = lane_timeout_s()  # a bad deadline is the user's error, named before any lane starts
        say(f"{min(jobs, len(gated))} lanes side by side (--jobs {jobs}), each its own process")

        def new_lane(number: int) -> ProcessLane:
            return ProcessLane(options, no_setup, number, timeout_s)

        lanes = [new_lane(i + 1) for i in range(min(jobs, max(len(gated), 1)))]
    else:
        if open_sut is None:
            raise ValueError("run_matrix: jobs 1 needs open_sut")
        lanes, new_lane = [InProcessLane(open_sut, options, say)], None
    say("witness searches on the model are shared by releases with the same guard and assumptions (and kept in "
        "the z3 cache where it is on)")
    ledger = FixLedger()
    try:
        by_release = _schedule(gated, lanes, new_lane, ledger, options, say)
    finally:
        for lane in lanes:
            lane.close()
    rows = []
    for release in releases:
        if release in shared:
            rows.append(shared_row(by_release[shared[release]], release))
            say(f"{engine} {release}: runs as {shared[release]} (driven files byte-identical): {rows[-1].verdict}")
        else:
            rows.append(by_release[release])
    if fixes is not None:
        fixes.extend(ledger.entries([r.release for r in rows]))
    return rows


def _schedule(releases: list, lanes: list, new_lane, ledger: FixLedger, options: RowOptions, say) -> dict:
    """Every release's row (release -> MatrixRow), gated by ``lanes`` as the module doc says; ``lanes`` is updated
    in place when a process lane dies and ``new_lane(number)`` replaces it."""
    order = {r: i for i, r in enumerate(releases)}
    answers: queue.Queue = queue.Queue()
    todo, idle = deque(releases), list(lanes)
    rows: dict = {}
    busy: dict = {}        # lane -> release it is gating or replaying on
    waiting: dict = {}     # release -> its lane, holding its engine until every earlier release has a row
    stopped, stop_deadline = False, None
    while (todo and not stopped) or busy or waiting:
        try:
            if stop_deadline is not None and time.monotonic() > stop_deadline:
                for lane in busy:  # past the grace after a SIGINT: ended now, their rows say so below
                    lane.kill()
                stop_deadline = float("inf")
            while idle and todo and not stopped:
                lane, release = idle.pop(0), todo.popleft()
                busy[lane] = release
                lane.start_row(release, answers)
            _hand_out_replays(releases, order, rows, waiting, busy, ledger, answers, stopped,
                              lambda release, n: say(f"{options.engine} {release}: replaying {n} case files of failing "
                                                     f"rows (its own and earlier releases') ..."))
            if not busy:
                continue
            try:
                lane, kind, answer = answers.get(timeout=_POLL_S)
            except queue.Empty:
                continue
        except KeyboardInterrupt:
            if not stopped:
                say(f"interrupted (SIGINT): the releases in flight end within {STOP_GRACE_S:g} s (a second SIGINT: "
                    f"now), no further release is gated")
                stop_deadline = time.monotonic() + STOP_GRACE_S
            else:
                stop_deadline = time.monotonic()
            stopped = True
            for lane in busy:
                lane.interrupt()
            continue
        release = busy.pop(lane)
        if isinstance(answer, WorkerError):
            if stopped:  # killed after a SIGINT, or died on it: no new lane
                lane.close()
            else:
                _replace(lane, lanes, idle, new_lane)
            if kind == "row":
                why = str(answer).splitlines()[0]
                why = f"interrupted (SIGINT) while gated, its lane ended: {why}" if stopped else why
                rows[release] = inconclusive_row(release, options.engine, why)
                say(f"{options.engine} {release}: inconclusive ({rows[release].message})")
            elif not stopped:
                why = " ".join(str(answer).split())[:160]
                ledger.record(release, {f: f"NOT RUN ({why})" for f in ledger.pending(release)})
            continue
        if isinstance(answer, BaseException):  # a LaneCrash (or the exchange's own failure): the command's error
            raise answer
        if kind == "row":
            rows[release] = answer.row
            ledger.add(answer.cases)
            stopped = stopped or answer.interrupted
            if answer.open:
                waiting[release] = lane
            else:
                idle.append(lane)
        else:
            verdicts, seconds, interrupted = answer
            if not (stopped or interrupted):
                ledger.record(release, verdicts)
            stopped = stopped or interrupted
            rows[release].seconds = round(rows[release].seconds + seconds, 2)
            idle.append(lane)
    for release in releases:
        if release not in rows:
            rows[release] = inconclusive_row(release, options.engine, INTERRUPTED)
    return rows


def _hand_out_replays(releases, order, rows, waiting, busy, ledger, answers, stopped, announce) -> None:
    """Each waiting lane whose release has every earlier release's row gets its replays (after a SIGINT: none,
    its engine is closed)."""
    for release in sorted(waiting, key=order.get):
        if stopped or _earlier_rows_known(release, releases, order, rows):
            lane = waiting.pop(release)
            busy[lane] = release
            files = [] if stopped else ledger.pending(release)
            if files:
                announce(release, len(files))
            lane.start_replay(release, files, answers)


def _earlier_rows_known(release: str, releases: list, order: dict, rows: dict) -> bool:
    """Whether every release before ``release`` has its row (so the ledger holds every earlier failing row's case
    files)."""
    return all(r in rows for r in releases[:order[release]])


def _replace(lane, lanes: list, idle: list, new_lane) -> None:
    """A process lane that died or missed its deadline: closed, and a new one takes its place."""
    lane.close()
    at = lanes.index(lane)
    if new_lane is None:  # an in-process lane does not die
        idle.append(lane)
        return
    lanes[at] = new_lane(at + 1)
    idle.append(lanes[at])
