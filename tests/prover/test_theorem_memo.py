"""The suite's memo of theorem parts (spec.theorems.memo): answers only what a part would compute again."""

from __future__ import annotations

import pytest

import refmodel.fa3_scheduler as fs
from spec.theorems import memo as theorem_memo
from spec.theorems.results import TheoremResult
from spec.theorems.jobs import Job, run_jobs
from spec.theorems.metadata_jobs import run_metadata_theorems


@pytest.fixture
def memo():
    """A fresh, enabled memo for the test (the suite's own is put back afterwards)."""
    saved = theorem_memo.MEMO
    theorem_memo.MEMO = {}
    try:
        yield theorem_memo
    finally:
        theorem_memo.MEMO = saved


def _counting_job(calls: list, key=("counting",), case_file=None, cases_dir=None, verdict="proved"):
    def part():
        calls.append(1)
        return [TheoremResult("t", verdict, 0.0, {"n": len(calls)}, case_file, "counted")]
    return Job(("t",), (part,), key=key, cases_dir=cases_dir)


def test_the_same_part_is_answered_from_the_memo_as_a_copy(memo):
    calls = []
    (first,) = run_jobs([_counting_job(calls)]).results
    first.message = "annotated by a caller"
    (second,) = run_jobs([_counting_job(calls)]).results
    assert calls == [1] and second.witness == {"n": 1} and second.message == "counted"


def test_a_job_without_a_key_or_with_other_arguments_is_computed(memo):
    calls = []
    run_jobs([_counting_job(calls, key=None)])
    run_jobs([_counting_job(calls, key=None)])
    run_jobs([_counting_job(calls, key=("counting", 2))])
    assert len(calls) == 3


def test_suspended_computes_every_part(memo):
    calls = []
    run_jobs([_counting_job(calls)])
    with theorem_memo.suspended():
        run_jobs([_counting_job(calls)])
    assert len(calls) == 2


def test_a_replaced_function_is_a_miss(memo, monkeypatch):
    """A monkeypatched refmodel function (a seeded defect, a counterfactual): the theorem runs again."""
    first = run_metadata_theorems(only=["drift-breaks-b"])
    hits = theorem_memo.stats()["hits"]
    assert run_metadata_theorems(only=["drift-breaks-b"])[0].to_dict() == first[0].to_dict()
    assert theorem_memo.stats()["hits"] == hits + 1
    real = fs.resolve_schedule
    monkeypatch.setattr(fs, "resolve_schedule", lambda inp: real(inp))
    misses = theorem_memo.stats()["misses"]
    run_metadata_theorems(only=["drift-breaks-b"])
    assert theorem_memo.stats()["misses"] == misses + 1


def test_a_value_with_case_files_is_given_back_while_they_are_there_and_relocated_for_another_directory(memo,
                                                                                                     tmp_path):
    calls = []
    case = tmp_path / "a" / "case.json"
    case.parent.mkdir()
    case.write_text('{"id": 1}')
    run_jobs([_counting_job(calls, case_file=str(case), cases_dir=str(case.parent))])
    run_jobs([_counting_job(calls, case_file=str(case), cases_dir=str(case.parent))])
    assert len(calls) == 1
    # another directory: the case file is written there at its name, byte for byte, and the result names it
    (moved,) = run_jobs([_counting_job(calls, case_file=str(case), cases_dir=str(tmp_path / "b"))]).results
    assert len(calls) == 1 and moved.case_file == str(tmp_path / "b" / "case.json")
    assert (tmp_path / "b" / "case.json").read_bytes() == case.read_bytes()
    # a file already at that name is kept, as a part's save keeps it
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "case.json").write_text('{"first": true}')
    run_jobs([_counting_job(calls, case_file=str(case), cases_dir=str(tmp_path / "c"))])
    assert len(calls) == 1 and (tmp_path / "c" / "case.json").read_text() == '{"first": true}'
    case.unlink()  # its case file is gone: computed again
    run_jobs([_counting_job(calls, case_file=str(case), cases_dir=str(case.parent))])
    assert len(calls) == 2


def test_a_value_that_names_its_directory_elsewhere_or_a_file_outside_it_is_not_relocated(memo, tmp_path):
    """Negative controls of the relocation: a message with the first directory's path in it, a case file outside
    the cases directory, and no cases directory on the asking side are computed again."""
    calls = []
    case = tmp_path / "a" / "case.json"
    case.parent.mkdir()
    case.write_text("{}")

    def naming_job(key):
        def part():
            calls.append(1)
            return [TheoremResult("t", "refuted", 0.0, {}, str(case), f"see {case.parent}")]
        return Job(("t",), (part,), key=key, cases_dir=str(case.parent))

    run_jobs([naming_job(("naming",))])
    job = naming_job(("naming",))
    run_jobs([Job(job.names, job.parts, key=job.key, cases_dir=str(tmp_path / "b"))])
    assert len(calls) == 2 and not (tmp_path / "b").exists()
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    run_jobs([_counting_job(calls, key=("outside",), case_file=str(outside), cases_dir=str(case.parent))])
    run_jobs([_counting_job(calls, key=("outside",), case_file=str(outside), cases_dir=str(tmp_path / "d"))])
    assert len(calls) == 4
    run_jobs([_counting_job(calls, key=("none",), case_file=str(case), cases_dir=str(case.parent))])
    run_jobs([_counting_job(calls, key=("none",), case_file=str(case), cases_dir=None)])
    assert len(calls) == 6


def test_a_refutation_without_a_case_file_is_not_given_back_for_another_directory(memo, tmp_path):
    """Refuted without a cases directory: no case file; with one, the run must write it (so it runs)."""
    calls = []
    run_jobs([_counting_job(calls, verdict="refuted")])
    run_jobs([_counting_job(calls, verdict="refuted", cases_dir=str(tmp_path))])
    run_jobs([_counting_job(calls, verdict="proved", key=("other",))])
    run_jobs([_counting_job(calls, verdict="proved", key=("other",), cases_dir=str(tmp_path))])
    assert len(calls) == 3  # the proved one is the same whatever the directory
