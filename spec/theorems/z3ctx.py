"""One z3 context per theorem: helpers that build terms in the context of the theorem being run.

`isolated(fn)` runs a theorem in a fresh z3 Context, so its witness does not depend on what else ran before
in the process; outside a run, terms are built in z3's main context.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
from contextlib import contextmanager
from typing import Callable, TypeVar

import z3

# SIGINT must reach Python (the run stops, exit 3) instead of turning the current query into "unknown"
z3.set_param("ctrl_c", False)

T = TypeVar("T")

_CTX: list = []


def ctx() -> z3.Context:
    """The context of the theorem being run, or z3's main context."""
    return _CTX[-1] if _CTX else z3.main_ctx()


@contextmanager
def fresh_context():
    """A new z3 context for the duration of the block."""
    _CTX.append(z3.Context())
    try:
        yield
    finally:
        _CTX.pop()


def isolated(fn: Callable[[], T]) -> T:
    """Run one theorem in its own z3 context (deterministic whatever ran before it)."""
    with fresh_context():
        return fn()


def Int(name: str):
    return z3.Int(name, ctx())


def Ints(names: str):
    return z3.Ints(names, ctx())


def Real(name: str):
    return z3.Real(name, ctx())


def Bool(name: str):
    return z3.Bool(name, ctx())


def BitVec(name: str, width: int):
    return z3.BitVec(name, width, ctx())


def BitVecVal(v, width: int):
    return z3.BitVecVal(v, width, ctx())


def IntVal(v):
    return z3.IntVal(v, ctx())


def RealVal(v):
    return z3.RealVal(v, ctx())


def BoolVal(v):
    return z3.BoolVal(v, ctx())


#: z3 resource units (its ``rlimit`` count) that one second of a query's ``timeout_s`` buys. Measured on the
#: prover's own queries (`fa3verify bench`): the slowest theorem query on a quiet core does at least ~0.7M units
#: a second and the largest needs 2.8M units in all, so 10M a second leaves the default 10 s per query ~35 times
#: the work any theorem asks today.
RLIMIT_PER_SECOND = 10_000_000
#: z3 reads ``rlimit`` as a 32-bit unsigned count (a larger value wraps around): the largest bound it keeps.
RLIMIT_MAX = 2**32 - 1
#: the wall-clock deadline of a query, as a multiple of its ``timeout_s``: only a safety net on a machine so loaded
#: (or a query so unlike the measured ones) that the resource bound is not reached in time.
WALL_FACTOR = 3


def bound(solver, timeout_s: float):
    """Bound each check of `solver` by work, not time: the same answer whatever the machine's load.

    Invariant: a query's answer is a function of the query alone while the machine runs at least 1/WALL_FACTOR as
    fast as the reference. Each check gets ``rlimit`` = ``timeout_s`` * RLIMIT_PER_SECOND resource units (z3 counts
    them per check, also on a solver asked again), and a wall-clock ``timeout`` of WALL_FACTOR * ``timeout_s`` as
    the outer deadline. Either way a bound that runs out is unknown (inconclusive), never an answer. Above
    RLIMIT_MAX / RLIMIT_PER_SECOND seconds (429 s) only the wall-clock deadline is left to bound a query.
    """
    units = int(timeout_s * RLIMIT_PER_SECOND)
    solver.set("rlimit", max(1, units) if units <= RLIMIT_MAX else 0)
    solver.set("timeout", max(1, int(timeout_s * WALL_FACTOR * 1000)))
    return solver


def checked(solver: z3.Solver, *assumptions) -> z3.CheckSatResult:
    """`solver.check(*assumptions)`, stoppable by a real SIGINT at once; every other unknown stays an answer.

    The check runs in a helper thread while this one waits, so Python's own SIGINT handler (the only judge of
    a user's Ctrl-C) runs during a long query: it raises KeyboardInterrupt here, the query is interrupted, and
    the KeyboardInterrupt goes on to the caller. z3's reason strings decide nothing: a timed-out repeated check
    says "canceled", which is a timeout (unknown), never a signal. Solvers are built with ``ctrl_c`` off, so
    z3 never takes SIGINT from Python. The helper is one long-lived thread per process (`_helper`; starting a
    thread per check cost more than most checks), which never takes SIGINT itself.
    """
    if threading.current_thread() is not threading.main_thread():
        return solver.check(*assumptions)  # signals are only delivered to the main thread: nothing to wait for
    box: list = []
    done = threading.Lock()
    done.acquire()
    _helper().put((solver, assumptions, box, done))
    try:
        done.acquire()
    except KeyboardInterrupt:
        if not box:  # still running (the helper fills box before it releases done)
            solver.ctx.interrupt()
            done.acquire()
        raise
    kind, value = box[0]
    if kind == "raised":
        raise value
    return value


#: (pid, queue) of this process's check helper; a forked child starts its own (threads do not survive fork).
_HELPER: list = []


def _helper():
    """The queue of this process's check helper thread, started on first use."""
    pid = os.getpid()
    if _HELPER and _HELPER[0][0] == pid:
        return _HELPER[0][1]
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_serve, args=(jobs,), name="z3-check", daemon=True).start()
    _HELPER[:] = [(pid, jobs)]
    return jobs


def _serve(jobs) -> None:
    """Run each (solver, assumptions, box, done) check; the result or exception goes in box, then done is released."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # SIGINT is the main thread's to take
    while True:
        solver, assumptions, box, done = jobs.get()
        try:
            box.append(("ok", solver.check(*assumptions)))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread as is
            box.append(("raised", exc))
        finally:
            del solver, assumptions
            done.release()


#: Tactics for a one-shot proof obligation whose equalities define most of its variables: simplify, substitute
#: the defined variables away (solve-eqs), then z3's SMT core. Only the way z3 searches changes: unsat is a proof
#: whatever the tactic, and an unknown stays inconclusive.
PREPROCESS = ("simplify", "propagate-values", "solve-eqs", "smt")


def solve(constraints, timeout_s: float, preprocess: bool = False):
    """Check `constraints` in the current theorem's context: ("unsat"|"sat"|"unknown", model or None).

    Deterministic (fixed seeds) and bounded by `timeout_s` of work (:func:`bound`); an "unknown" is never read as a proof by callers.
    `preprocess` checks with the PREPROCESS tactics instead of z3's default solver (for obligations measured
    faster that way; see spec/theorems/algebra_merge.py).
    """
    z3.set_param("smt.random_seed", 0)
    z3.set_param("sat.random_seed", 0)
    z3.set_param("nlsat.seed", 0)
    solver = z3.Then(*PREPROCESS, ctx=ctx()).solver() if preprocess else z3.Solver(ctx=ctx())
    solver.set("ctrl_c", False)
    bound(solver, timeout_s)
    solver.set("random_seed", 0)
    solver.add(*constraints)
    res = checked(solver)
    if res == z3.unsat:
        return "unsat", None
    if res == z3.sat:
        return "sat", solver.model()
    return "unknown", None
