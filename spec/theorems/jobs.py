"""Theorem jobs: the units a prove run is made of, each part in its own z3 context, run in order or in parallel.

A :class:`Job` computes one or more theorems (``names``, in catalogue order) from one or more *parts*: zero-argument
callables that each run in a fresh z3 context (:func:`spec.theorems.z3ctx.isolated`) with the cyclic garbage collector
paused during the part, so z3 sees the same sequence of terms whatever ran before in the
process. A part's value is therefore a function of its arguments alone: the same in a sequential run and in a
forked worker, witness for witness (tests/prover/test_prover_parallel.py compares them byte for byte).

Theorems that share work (a query cache, the configuration domain) are one part; a theorem made of independent
queries (the exact-merge chain per split count) may be several parts, merged by the job's ``finish`` in order, and
``stop`` says which part's value makes the later ones irrelevant (a refutation at n splits hides n+1..).

:func:`run_jobs` runs the parts in order (``workers`` 1) or on up to ``workers`` forked worker processes that take
the longest parts first (spec.theorems.pool). In parallel:

- results come back in the jobs' order, whatever order the parts finish in;
- a part whose worker dies (a signal, ``os._exit``) makes its job's theorems inconclusive, never proved (the
  worker is replaced and the other parts go on);
- an exception in a part is raised in the caller, as in a sequential run;
- Ctrl-C (KeyboardInterrupt in the caller) kills every worker at once and is raised; workers ignore SIGINT
  themselves (the terminal sends it to the whole process group) so only the caller decides;
- per-query z3 timeouts are the part's own, as in a sequential run, and a part that runs past
  ``$FA3VERIFY_THEOREM_PART_TIMEOUT`` (default 600 s) has its worker killed: its job's theorems are inconclusive,
  named, never a hang. In order, a part runs in the caller and only its z3 queries are bounded.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from spec.theorems import memo as theorem_memo
from spec.process.interrupts import raise_if_swallowed
from spec.theorems.results import TheoremResult
from spec.theorems.pool import Crashed as _Crashed
from spec.theorems.z3ctx import isolated
from spec.finding import TheoremVerdict

__all__ = ["Job", "JobRun", "run_jobs", "run_part", "default_workers", "fork_available"]


@dataclass
class Job:
    """Theorems computed together: `parts` (each in its own z3 context), merged by `finish` in order.

    `finish(values)` gets the values of the parts up to the first one `stop` accepts (all, without `stop`) and
    returns the TheoremResults of `names`; by default each part returns a list of results, concatenated.
    `weight` is the expected seconds of a part, or one figure per part (the scheduler starts long parts first);
    `light` parts need no torch (a parallel run starts them while the caller loads it for the others, see
    `run_jobs`'s `preload`).
    """

    names: tuple
    parts: tuple
    finish: Optional[Callable[[list], list]] = None
    stop: Optional[Callable[[Any], bool]] = None
    weight: Any = 0.1
    light: bool = False
    #: what the parts compute, for spec.theorems.memo (None: never remembered); part p is remembered as key + (p,)
    key: Optional[tuple] = None
    #: where the parts write case files (a remembered value that wrote some is only given back for the same one)
    cases_dir: Optional[str] = None

    def part_weight(self, p: int) -> float:
        return float(self.weight[p] if isinstance(self.weight, (tuple, list)) else self.weight)

    def results(self, values: list) -> list:
        if self.finish is not None:
            return list(self.finish(values))
        return [r for v in values for r in v]


@dataclass
class JobRun:
    """The results of a run, in job order, and when each was known (seconds since the run started)."""

    results: list = field(default_factory=list)
    finished_s: list = field(default_factory=list)
    workers: int = 1
    elapsed_s: float = 0.0


def run_part(fn: Callable[[], Any]) -> Any:
    """Run one part in a fresh z3 context, the cyclic collector paused during it.

    The pause keeps the moments z3 terms are freed (and their ids reused) a function of the part alone: a
    collection started by what ran before could free terms of this context in the middle of it. Garbage of
    other contexts does not matter (z3 numbers terms per context).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return isolated(fn)
    finally:
        if enabled:
            gc.enable()


def fork_available() -> bool:
    """Whether parts can run in forked workers here (POSIX fork)."""
    return hasattr(os, "fork") and sys.platform != "win32"


def default_workers() -> int:
    """The CPUs this process may run on (the parallel default of `fa3verify prove`)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def run_jobs(jobs: Sequence[Job], workers: int = 1, preload: Optional[Callable[[], None]] = None,
             part_deadline_s: Optional[float] = None) -> JobRun:
    """Every job's results in job order; `workers` > 1 runs parts in forked processes (see the module docstring);
    `part_deadline_s` bounds each part there (None: ``$FA3VERIFY_THEOREM_PART_TIMEOUT`` or its default).

    `preload` is what the parts that are not light will import (torch, for the replays). In parallel it is called
    in this process once the first light parts are running, before any other part starts, so the workers forked
    after it share it; in order, it runs in a background thread beside the parts (z3 releases the GIL while it
    solves), and the parts' own imports wait for it where they meet.
    """
    start = time.perf_counter()
    jobs = list(jobs)
    before = theorem_memo.state() if theorem_memo.enabled() else None
    fp = None if before is None else theorem_memo.fingerprint(before)
    known: dict = {}
    if fp is not None:
        for j, job in enumerate(jobs):
            for p in range(len(job.parts)):
                hit, value = theorem_memo.lookup(_part_key(job, p), job.cases_dir, fp)
                if hit:
                    known[(j, p)] = value
    parts = [(j, p) for j, job in enumerate(jobs) for p in range(len(job.parts)) if (j, p) not in known]
    if workers <= 1 or len(parts) <= 1 or not fork_available():
        loader = None
        if preload is not None and not all(jobs[j].light for j, _ in parts):
            loader = threading.Thread(target=_quietly, args=(preload,), name="theorem-preload", daemon=True)
            loader.start()
        try:
            run, computed = _run_sequential(jobs, start, known)
        finally:
            if loader is not None:
                loader.join()
    else:
        run, computed = _run_parallel(jobs, min(workers, len(parts)), preload, start, known, part_deadline_s)
    if before is not None:
        remember = theorem_memo.after_run(before)
        for (j, p), value in computed.items():
            theorem_memo.store(_part_key(jobs[j], p), jobs[j].cases_dir, remember, value)
    run.elapsed_s = time.perf_counter() - start
    return run


def _part_key(job: Job, p: int) -> Optional[tuple]:
    return None if job.key is None else (*job.key, p)


def _needed(job: Job, values: list) -> list:
    """The values `finish` gets: up to and including the first part `stop` accepts."""
    out = []
    for v in values:
        out.append(v)
        if job.stop is not None and not isinstance(v, _Crashed) and job.stop(v):
            break
    return out


def _collect(run: JobRun, job: Job, values: list, timing: list) -> None:
    """Append a job's results with when each was known: its part's end, less the seconds of the results after it
    in the part (a part computes its theorems one after another; what it does first counts for the first)."""
    values = _needed(job, values)
    crashed = [v for v in values if isinstance(v, _Crashed)]
    if crashed:
        results = [TheoremResult(n, TheoremVerdict.INCONCLUSIVE, 0.0, {}, None,
                                 f"{crashed[0].what}: no verdict (a crashed worker is inconclusive, never a pass)",
                                 failed=False, expected=False) for n in job.names]
    else:
        results = job.results(values)
    used = timing[:len(values)]
    end = max((t1 for _, t1 in used), default=0.0)
    begin = min((t0 for t0, _ in used), default=0.0)
    later = 0.0
    known = []
    for r in reversed(results):
        known.append(max(begin, end - later) if len(used) == 1 else end)
        later += float(r.seconds or 0.0)
    for r, at in zip(results, reversed(known)):
        run.results.append(r)
        run.finished_s.append(at)


def _quietly(fn: Callable[[], None]) -> None:
    """Run a preload; a failure is left to the part that needs what it loads (its own import raises it)."""
    try:
        fn()
    except BaseException:  # noqa: BLE001 - see the docstring
        pass


def _run_sequential(jobs: list, start: float, known: dict) -> tuple[JobRun, dict]:
    run = JobRun(workers=1)
    computed: dict = {}
    for j, job in enumerate(jobs):
        values, timing = [], []
        for p, part in enumerate(job.parts):
            t0 = time.perf_counter() - start
            raise_if_swallowed()  # a Ctrl-C dropped in a callback stops the run here (spec/process/interrupts.py)
            if (j, p) in known:
                values.append(known[(j, p)])
            else:
                values.append(run_part(part))
                computed[(j, p)] = values[-1]
            timing.append((t0, time.perf_counter() - start))
            if job.stop is not None and job.stop(values[-1]):
                break
        _collect(run, job, values, timing)
    return run, computed


def _run_parallel(jobs: list, workers: int, preload, start: float, known: dict,
                  deadline_s: Optional[float] = None) -> tuple[JobRun, dict]:
    from spec.theorems.pool import run_parallel

    values, timing = run_parallel(jobs, workers, preload, start, run_part, known, deadline_s)
    computed = {k: v for k, v in values.items() if k not in known and not isinstance(v, _Crashed)}
    run = JobRun(workers=workers)
    for j, job in enumerate(jobs):
        keys = [(j, p) for p in range(len(job.parts)) if (j, p) in values]
        # parts missing here come after one `stop` accepted, so `_needed` never reaches them
        keys = keys[:len(_needed(job, [values[k] for k in keys]))]
        _collect(run, job, [values[k] for k in keys], [timing[k] for k in keys])
    return run, computed
