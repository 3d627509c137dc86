"""One z3 context per theorem: helpers that build terms in the context of the theorem being run.

`isolated(fn)` runs a theorem in a fresh z3 Context, so its witness does not depend on what else ran before
in the process; outside a run, terms are built in z3's main context.
"""

from __future__ import annotations

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


def IntVal(v):
    return z3.IntVal(v, ctx())


def RealVal(v):
    return z3.RealVal(v, ctx())


def BoolVal(v):
    return z3.BoolVal(v, ctx())


def solve(constraints, timeout_s: float):
    """Check `constraints` in the current theorem's context: ("unsat"|"sat"|"unknown", model or None).

    Deterministic (fixed seeds) and bounded by `timeout_s`; an "unknown" is never read as a proof by callers.
    """
    z3.set_param("smt.random_seed", 0)
    z3.set_param("sat.random_seed", 0)
    z3.set_param("nlsat.seed", 0)
    solver = z3.Solver(ctx=ctx())
    solver.set("ctrl_c", False)
    solver.set("timeout", max(1, int(timeout_s * 1000)))
    solver.set("random_seed", 0)
    solver.add(*constraints)
    res = solver.check()
    if res == z3.unsat:
        return "unsat", None
    if res == z3.sat:
        return "sat", solver.model()
    return "unknown", None
