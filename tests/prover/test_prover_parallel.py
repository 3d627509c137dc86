"""Theorem jobs (spec.theorems.jobs): a parallel prove run gives the sequential run's results byte for byte, in the
same order; a crashed worker is inconclusive, never a pass; an exception and Ctrl-C reach the caller at once."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import z3

from fa3verify.policy import load_policy
from fa3verify.commands.prove import prove, theorem_jobs, theorem_results
from spec.theorems import memo as theorem_memo
from spec.theorems.results import TheoremResult
from spec.theorems.jobs import Job, fork_available, run_jobs, run_part
from spec.theorems.algebra import algebra_jobs
from spec.theorems.cp import cp_jobs
from spec.theorems.z3ctx import Int, ctx

pytestmark = pytest.mark.skipif(not fork_available(), reason="parallel parts need os.fork")


@pytest.fixture(autouse=True)
def _real_runs():
    """Every run here is computed (the suite's memo, spec.theorems.memo, would answer the second run of a pair)."""
    with theorem_memo.suspended():
        yield


def _canonical(results, cases_dir: Path) -> str:
    """Every result as JSON without its timings, with the content of its case file instead of its path."""
    rows = []
    for r in results:
        d = r.to_dict()
        d.pop("seconds")
        d["details"] = _untimed(d["details"])
        if d["case_file"]:
            path = Path(d["case_file"])
            assert path.parent == cases_dir
            d["case_file"] = [path.name, path.read_text()]
        rows.append(d)
    return json.dumps(rows, sort_keys=True, default=str)


def _untimed(x):
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if k != "seconds"}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def test_the_pre_fix_run_is_the_same_in_parallel(tmp_path):
    """Every witness, message and case file of the pre-fix policy (refutations of 3 and 4 included)."""
    policy = load_policy("pre-fix")
    seq = theorem_results(policy, cases_dir=str(tmp_path / "seq"), jobs=1)
    par = theorem_results(policy, cases_dir=str(tmp_path / "par"), jobs=2)
    assert [r.name for r in par] == [r.name for r in seq]
    # the results are the theorems the jobs name (tests/cli/test_invariants_doc.py checks those names are THEOREMS)
    assert [r.name for r in seq] == [n for job in theorem_jobs(policy, cases_dir=None) for n in job.names]
    assert {r.name for r in seq if r.verdict == "refuted"} >= {"prefill-cp-hazard", "guard-soundness"}
    assert _canonical(par, tmp_path / "par") == _canonical(seq, tmp_path / "seq")


@pytest.mark.parametrize("defects", [{"no-skip-nonpositive"}, {"wrong-normalisation"}, {"lse-missing-max"},
                                     {"no-neg-inf-guard"}])
def test_seeded_combine_defects_give_the_same_witnesses_in_parallel(defects):
    """The exact-merge theorem split over its split counts stops at the first refuted one in both runs."""
    def run(workers):
        return run_jobs(algebra_jobs(only=["combine-exact-merge", "combine-all-empty"], defects=defects,
                                     split_counts=(1, 2, 3, 4)), workers=workers).results

    seq, par = run(1), run(2)
    assert any(r.verdict != "proved" for r in seq)
    assert _canonical(par, Path()) == _canonical(seq, Path())


def test_the_stale_runner_refutations_are_the_same_in_parallel(tmp_path):
    def run(workers, d):
        return run_jobs(cp_jobs(clear_stale=False, cases_dir=str(d)), workers=workers).results

    seq, par = run(1, tmp_path / "seq"), run(2, tmp_path / "par")
    assert any(r.verdict == "refuted" for r in seq)
    assert _canonical(par, tmp_path / "par") == _canonical(seq, tmp_path / "seq")


def test_a_part_does_not_depend_on_what_ran_before_it():
    def part():  # terms in the theorem's context (spec.theorems.z3ctx), as every theorem module builds them
        s = z3.Solver(ctx=ctx())
        x, y = Int("x"), Int("y")
        s.add(x + 2 * y == 17, x > 3, y > 1)
        assert s.check() == z3.sat
        return str(s.model())

    first = run_part(part)
    for i in range(10):  # terms of unrelated theorems, in the main context and in another one
        z3.simplify(z3.Int(f"noise{i}") * 3 + 1 > 2)
        run_part(lambda: z3.simplify(Int("r") + 1))
    assert run_part(part) == first


def _result(name, verdict="proved", seconds=0.0):
    return TheoremResult(name, verdict, seconds, {}, None, "test part")


def _sleeping(name, seconds):
    def part():
        time.sleep(seconds)
        return [_result(name, seconds=seconds)]
    return part


def test_results_come_in_job_order_whatever_finishes_first():
    jobs = [Job(("slow",), (_sleeping("slow", 0.6),), weight=0.1),
            Job(("fast",), (_sleeping("fast", 0.0),), weight=5.0),
            Job(("mid",), (_sleeping("mid", 0.3),), weight=1.0)]
    run = run_jobs(jobs, workers=3)
    assert [r.name for r in run.results] == ["slow", "fast", "mid"] and run.workers == 3
    assert run.finished_s[1] < run.finished_s[0]


def test_a_crashed_worker_is_inconclusive_and_the_others_still_answer():
    def dies():
        os.kill(os.getpid(), signal.SIGKILL)

    def exits():
        os._exit(7)

    jobs = [Job(("a", "b"), (dies,)), Job(("c",), (_sleeping("c", 0.0),)), Job(("d",), (exits,))]
    results = run_jobs(jobs, workers=2).results
    by = {r.name: r for r in results}
    assert [r.name for r in results] == ["a", "b", "c", "d"]
    for name in ("a", "b", "d"):
        assert by[name].verdict == "inconclusive" and not by[name].expected and by[name].inconclusive
    assert "SIGKILL" in by["a"].message and "status 7" in by["d"].message
    assert by["c"].verdict == "proved"


def test_parts_queued_behind_a_crashed_part_still_run():
    """The first worker is forked before the preload with several light parts queued; one of them kills it."""
    def dies():
        os.kill(os.getpid(), signal.SIGKILL)

    jobs = [Job(("x",), (dies,), light=True, weight=1.0)] + [
        Job((f"l{i}",), (_sleeping(f"l{i}", 0.05),), light=True, weight=0.5) for i in range(4)] + [
        Job(("heavy",), (_sleeping("heavy", 0.05),), weight=0.1)]
    results = run_jobs(jobs, workers=2, preload=lambda: time.sleep(0.5)).results
    assert [r.verdict for r in results] == ["inconclusive"] + ["proved"] * 5


def test_an_exception_in_a_part_reaches_the_caller():
    def raises():
        raise ValueError("solver exploded")

    with pytest.raises(ValueError, match="solver exploded"):
        run_jobs([Job(("a",), (raises,)), Job(("b",), (_sleeping("b", 5.0),))], workers=2)


def test_stop_drops_the_later_parts_of_a_job():
    def part(i, verdict):
        def fn():
            return {"i": i, "verdict": verdict}
        return fn

    def finish(values):
        return [_result("t", "refuted" if values[-1]["verdict"] == "sat" else "proved")] if values else []

    parts = tuple(part(i, "sat" if i == 1 else "unsat") for i in range(4))
    for workers in (1, 2):
        seen = []
        job = Job(("t",), parts, finish=lambda v: (seen.append([x["i"] for x in v]), finish(v))[1],
                  stop=lambda v: v["verdict"] == "sat")
        (r,) = run_jobs([job], workers=workers).results
        assert r.verdict == "refuted" and seen == [[0, 1]]


def test_preload_runs_once_before_any_heavy_part(tmp_path):
    marker = tmp_path / "preloaded"
    seen = tmp_path / "seen"

    def heavy():
        seen.write_text(str(marker.exists()))
        return [_result("heavy")]

    jobs = [Job(("light",), (_sleeping("light", 0.2),), light=True, weight=0.1),
            Job(("heavy",), (heavy,), weight=9.0)]
    calls = []
    run = run_jobs(jobs, workers=2, preload=lambda: (calls.append(1), marker.write_text("x")))
    assert [r.name for r in run.results] == ["light", "heavy"]
    assert calls == [1] and seen.read_text() == "True"


def test_ctrl_c_stops_a_parallel_run_at_once_and_leaves_no_worker(tmp_path):
    pids = tmp_path / "pids"

    def long_query():
        with open(pids, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        time.sleep(120)
        return [_result("never")]

    jobs = [Job((f"t{i}",), (long_query,)) for i in range(3)]
    # Python's own handler, as in a terminal: a pytest-xdist worker, or a suite started in the background of a
    # non-interactive shell, inherits SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_jobs(jobs, workers=2)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 30.0
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_prove_reports_when_the_first_failure_was_known():
    s = prove(load_policy("pre-fix"), cases_dir=None, only=["prefill-cp-hazard"], jobs=1)
    assert s.first_failure_s is not None and 0 < s.first_failure_s <= s.elapsed_s
    assert [c.name for c in s.checks] == ["prefill-cp-hazard"] and s.checks[0].failed
