"""A theorem query is bounded by work, not by the clock, so its answer is the same on a quiet and a loaded machine.

spec.theorems.z3ctx.bound gives each check of a solver z3's resource limit (``rlimit``: timeout_s * RLIMIT_PER_SECOND
units, counted by z3 per check) and keeps a wall-clock timeout of WALL_FACTOR * timeout_s only as the outer
deadline. Bounded in seconds alone, a stage-2 query of the pre-fix run answered unknown under load in one run and
not in the other, and the witness search moved on to another batch size (tests/prover/test_prover_parallel.py).
"""

from __future__ import annotations

import z3
from z3_puzzles import pigeonhole

from spec.theorems import z3ctx
from spec.theorems.symbolic import solver


class _Recorder:
    """Records what is set on it, as a z3 solver's `set` receives it."""

    def __init__(self):
        self.params = {}

    def set(self, name, value):
        self.params[name] = value


def _rlimit_count(s) -> int:
    """z3's count of resource units spent in the solver's context so far (each test uses a fresh context)."""
    st = s.statistics()
    return next((st.get_key_value(k) for k in st.keys() if k == "rlimit count"), 0)


def test_a_query_gets_its_seconds_as_resource_units_and_a_wider_wall_deadline():
    s = z3ctx.bound(_Recorder(), 2.0)
    assert s.params == {"rlimit": 2 * z3ctx.RLIMIT_PER_SECOND, "timeout": int(2.0 * z3ctx.WALL_FACTOR * 1000)}
    assert z3ctx.WALL_FACTOR > 1


def test_a_bound_past_z3s_32_bit_count_is_left_to_the_wall_deadline_not_wrapped_around():
    """z3 keeps rlimit in 32 bits: 2**32 + n would silently become n units."""
    seconds = (z3ctx.RLIMIT_MAX + 1) / z3ctx.RLIMIT_PER_SECOND + 1
    s = z3ctx.bound(_Recorder(), seconds)
    assert s.params["rlimit"] == 0  # no resource bound ...
    assert s.params["timeout"] == int(seconds * z3ctx.WALL_FACTOR * 1000)  # ... the deadline is still there
    assert z3ctx.bound(_Recorder(), 1e-12).params["rlimit"] == 1  # never 0 (unbounded) for a tiny budget


def test_a_check_stops_when_its_work_runs_out_not_its_time(monkeypatch):
    """With the wall deadline far away, the check still ends, unknown, right at its resource bound."""
    monkeypatch.setattr(z3ctx, "WALL_FACTOR", 2000)  # 0.01 s of work, 20 s of wall clock
    with z3ctx.fresh_context():
        s = solver(0.01)
        pigeonhole(s, 14)
        assert z3ctx.checked(s) == z3.unknown
        units = int(0.01 * z3ctx.RLIMIT_PER_SECOND)
        assert units <= _rlimit_count(s) <= units * 1.1


def test_each_check_of_a_solver_asked_again_gets_the_whole_bound(monkeypatch):
    """z3 counts the units per check, so a repeated (incremental) query is not starved by the ones before it."""
    monkeypatch.setattr(z3ctx, "WALL_FACTOR", 2000)
    units = int(0.01 * z3ctx.RLIMIT_PER_SECOND)
    with z3ctx.fresh_context():
        s = solver(0.01)
        pigeonhole(s, 14, "a")
        assert z3ctx.checked(s) == z3.unknown
        before = _rlimit_count(s)
        pigeonhole(s, 14, "b")  # the second check on the same solver
        assert z3ctx.checked(s) == z3.unknown
        assert units <= _rlimit_count(s) - before <= units * 1.1


def test_the_same_query_gives_the_same_answer_and_the_same_work_twice(monkeypatch):
    """Work-bounded answers are reproducible: two runs of one bounded query do the same count of units."""
    monkeypatch.setattr(z3ctx, "WALL_FACTOR", 2000)
    counts = []
    for _ in range(2):
        with z3ctx.fresh_context():
            s = solver(0.01)
            pigeonhole(s, 12)
            counts.append((str(z3ctx.checked(s)), _rlimit_count(s)))
    assert counts[0] == counts[1]
