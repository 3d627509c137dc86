"""Shrinking is bounded by steps, not by the clock: the same ``--cases N --seed S`` saves byte-identical case files
however slow the machine runs, and the step bound is kept and reported.

The slow machine is a clock that advances one second at every reading (``time.perf_counter``, which the suite
reads at each call): a time-boxed shrinker stops after a few candidates there and saves another case.
"""

import dataclasses
import itertools
import random
import time
from pathlib import Path

from fa3verify import shrinking
from fa3verify.cli import main
from fa3verify.strategies import random_fuzz_case


class _SlowClock:
    """A clock that advances ``step`` seconds at every reading."""

    def __init__(self, step: float = 1.0):
        self.ticks = itertools.count()
        self.step = step

    def __call__(self) -> float:
        return next(self.ticks) * self.step


def _fuzz_files(out: Path, argv: list) -> dict:
    assert main(["fuzz", *argv, "--out", str(out)]) == 1
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.json"))}


def test_the_same_cases_and_seed_save_the_same_case_files_when_the_clock_runs_slow(tmp_path, monkeypatch, capsys):
    argv = ["--guard", "pre-fix", "--cases", "60", "--seed", "0"]
    quiet = _fuzz_files(tmp_path / "quiet", argv)
    monkeypatch.setattr(time, "perf_counter", _SlowClock())
    slow = _fuzz_files(tmp_path / "slow", argv)
    assert quiet and slow.keys() == quiet.keys() and slow == quiet
    out = capsys.readouterr().out
    assert "partially" not in out and out.count(", shrunk)") >= 2 * len(quiet)  # fully shrunk, both times


def _long_case():
    """A generated case with at least two rows, its first 5000 tokens long."""
    rng = random.Random(3)
    case = next(c for c in (random_fuzz_case(random.Random(rng.getrandbits(64))) for _ in range(500))
                if c is not None and sum(len(s["seq_lens"]) for s in c.steps) > 2)
    return dataclasses.replace(case, steps=tuple({**s, "seq_lens": [5000] + list(s["seq_lens"][1:]),
                                                  "extend_lens": None} if i == 0 else s
                                                 for i, s in enumerate(case.steps)))


def _long_row(case) -> bool:  # stands for "fails the same way": some row of at least 1000 tokens
    return any(x >= 1000 for s in case.steps for x in s["seq_lens"])


def test_shrinking_without_a_deadline_does_not_read_the_clock():
    def no_clock():
        raise AssertionError("the clock was read")

    done = shrinking.shrink(_long_case(), _long_row, clock=no_clock)
    assert done.ended == "done" and not done.partial and 0 < done.steps <= shrinking.MAX_SHRINK_STEPS
    assert [s["seq_lens"] for s in done.case.steps] == [[1000]]
    assert shrinking.shrink(_long_case(), _long_row, clock=_SlowClock()) == done


def test_the_step_bound_is_kept_and_a_partial_shrink_still_fails():
    full = shrinking.shrink(_long_case(), _long_row)
    for bound in (0, 1, full.steps // 2, full.steps - 1):
        part = shrinking.shrink(_long_case(), _long_row, max_steps=bound)
        assert part.steps == bound and part.ended == "steps" and part.partial and _long_row(part.case)
    assert shrinking.shrink(_long_case(), _long_row, max_steps=full.steps) == full  # the bound met exactly: done


def test_a_deadline_stops_shrinking_before_a_step_that_would_pass_it():
    clock = _SlowClock(step=0.5)  # every candidate costs 0.5 s (its reading before and after)
    part = shrinking.shrink(_long_case(), _long_row, deadline=3.0, clock=clock)
    assert part.ended == "deadline" and part.partial and _long_row(part.case) and 0 < part.steps <= 3
