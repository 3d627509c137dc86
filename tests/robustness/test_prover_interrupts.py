"""Only a real SIGINT stops a proof: a solver's "unknown" is inconclusive whatever z3's reason string says.

z3 answers a repeated check on the same solver that runs out of time with the reason "canceled" (z3 5.4.1), the
word it also uses for an interrupt; reading it as Ctrl-C once aborted a whole `make test` under load.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import z3
from z3_puzzles import pigeonhole

from spec.theorems.symbolic import solver
from spec.theorems.metadata import Budget
from spec.theorems.z3ctx import checked


class _CanceledSolver:
    """A solver whose check ends as z3 ends a timed-out repeated check: unknown, reason "canceled"."""

    ctx = z3.main_ctx()

    def check(self, *assumptions):
        return z3.unknown

    def reason_unknown(self):
        return "canceled"


def test_a_canceled_unknown_is_inconclusive_not_a_keyboard_interrupt():
    budget = Budget(timeout_s=0.03)
    assert budget.check(_CanceledSolver(), "stage2 b=1 fast-math-robust") == z3.unknown
    assert budget.unknowns == ["stage2 b=1 fast-math-robust: canceled"]


def test_a_repeated_check_that_times_out_is_recorded_as_unknown():
    s = solver(0.03)
    budget = Budget(timeout_s=0.03)
    a = z3.Bool("a")
    s.add(a)
    assert budget.check(s, "first") == z3.sat
    pigeonhole(s, 14)  # the second check on the same solver: z3 reports its timeout as "canceled"
    assert budget.check(s, "second") == z3.unknown
    assert len(budget.unknowns) == 1 and budget.unknowns[0].startswith("second: ")


def test_a_real_sigint_stops_a_long_check_at_once():
    s = solver(60.0)
    pigeonhole(s, 16)
    # Python's own handler, as in a terminal (a pytest-xdist worker ignores SIGINT: its controller owns Ctrl-C)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            checked(s)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 30.0  # the 60 s query was interrupted, not waited out
