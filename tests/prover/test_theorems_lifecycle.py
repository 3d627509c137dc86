"""spec.theorems.lifecycle: the semaphore over bounded sequences and the metadata size per platform."""

import itertools

import pytest
import z3

from refmodel.metadata_lifecycle import semaphore_after_launch
from spec.theorems import THEOREMS
from spec.theorems.jobs import run_jobs
from spec.theorems.lifecycle import THEOREMS as NAMES, _check_two_cases, lifecycle_jobs, semaphore_step
from spec.theorems.z3ctx import Bool, Int, IntVal, fresh_context


def test_verdicts():
    by = {r.name: r for r in run_jobs(lifecycle_jobs()).results}
    assert set(by) == set(NAMES) <= set(THEOREMS)
    assert by["semaphore-zero"].verdict == "proved"
    assert by["metadata-size-agrees-sm90"].verdict == "proved"
    for name in ("semaphore-pre-fix", "metadata-size-sm8x", "metadata-size-fork"):
        assert by[name].verdict == "expected-refutation" and not by[name].failed, (name, by[name].message)
    pre = by["semaphore-pre-fix"]
    assert pre.witness["before"][-1]["splits"] == 1 and pre.witness["start"] > 0
    assert pre.details["replay"]["caught"] and pre.details["replay"]["skipped_tiles"] > 0
    assert by["metadata-size-fork"].details["replay"]["silent_violations"] > 0


def test_the_z3_step_is_refmodels_semaphore_after_launch():
    """The encoding agrees with refmodel.metadata_lifecycle on a grid (both FA3 behaviours)."""
    with fresh_context():
        start, tiles, sm, splits, runs = Int("s"), Int("t"), Int("g"), Int("p"), Bool("r")
        for reset in (True, False):
            end, after = semaphore_step(start, tiles, sm, splits, runs, reset)
            for s, t, g, p, r in itertools.product((0, 3, 200), (0, 1, 131, 132, 500), (1, 132), (1, 2, 64),
                                                   (True, False)):
                sub = [(start, IntVal(s)), (tiles, IntVal(t)), (sm, IntVal(g)), (splits, IntVal(p)),
                       (runs, z3.BoolVal(r, start.ctx))]
                got = tuple(z3.simplify(z3.substitute(x, *sub)).as_long() for x in (end, after))
                assert got == semaphore_after_launch(s, t, g, p, r, reset), (s, t, g, p, r, reset)


def test_the_two_case_lifting_refuses_a_function_that_is_not_piecewise_constant():
    """Negative control of the size theorems' lifting check."""
    _check_two_cases(lambda b, s: int(s > 1), "ok")
    with pytest.raises(AssertionError, match="constant in S"):
        _check_two_cases(lambda b, s: int(s > 2), "splits")
    with pytest.raises(AssertionError, match="constant in b"):
        _check_two_cases(lambda b, s: int(b > 4), "batch")


def test_only_selects_the_family():
    family = [(n,) for n in NAMES if THEOREMS[n].number == "11"]  # the family by the catalogue, not by name
    assert family and [j.names for j in lifecycle_jobs(only=["11"])] == family
