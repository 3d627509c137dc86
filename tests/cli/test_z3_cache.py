"""The engine gate's z3 cache across runs (fa3verify/z3_cache.py): a hit gives the rows and case files the
computation gives; any changed input misses; what may differ run to run is never kept."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fa3verify import z3_cache
from fa3verify.summary import Check


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(z3_cache.ENV, str(tmp_path / "z3cache"))
    return tmp_path / "z3cache"


def _rows(cases: Path, inconclusive: bool = False) -> list:
    cases.mkdir(parents=True, exist_ok=True)
    case = cases / "prove-split-bound-0123.json"
    case.write_text('{"schema": "fa3verify.case/1", "x": 1}\n', encoding="utf-8")
    return [Check(name="witness search: prefill-cp-hazard", kind="theorem", verdict="refuted", seconds=1.25,
                  case_file=str(case), message="on the model", expected="a witness"),
            Check(name="witness search: guard-soundness", kind="theorem", verdict="proved", seconds=0.5,
                  inconclusive=inconclusive)]


def test_a_hit_gives_the_same_rows_and_case_files_in_another_directory(cache, tmp_path):
    first = tmp_path / "run1" / "witnesses"
    rows = _rows(first)
    inputs = {"guard": "none", "heads": "tp", "dropped": [], "timeout_s": 10.0}
    assert z3_cache.load("witness-search", inputs, str(first)) is None  # nothing kept yet
    assert z3_cache.store("witness-search", inputs, rows, str(first))
    second = tmp_path / "run2" / "witnesses"
    got = z3_cache.load("witness-search", inputs, str(second))
    assert got is not None and len(got) == 2
    for mine, kept in zip(rows, got):
        moved = dataclasses.replace(mine, case_file=mine.case_file and str(second / Path(mine.case_file).name))
        assert kept == moved
    assert (second / "prove-split-bound-0123.json").read_bytes() == Path(rows[0].case_file).read_bytes()


@pytest.mark.parametrize("change", [{"timeout_s": 20.0}, {"guard": "pre-fix"}, {"dropped": ["ASSUMPTION_X"]}])
def test_a_changed_input_misses(cache, tmp_path, change):
    cases = tmp_path / "cases"
    inputs = {"guard": "none", "heads": "tp", "dropped": [], "timeout_s": 10.0}
    assert z3_cache.store("witness-search", inputs, _rows(cases), str(cases))
    assert z3_cache.load("witness-search", inputs, str(cases)) is not None
    assert z3_cache.load("witness-search", {**inputs, **change}, str(cases)) is None
    assert z3_cache.load("flow-theorem", inputs, str(cases)) is None  # another stage's entry


def test_a_guard_file_is_keyed_by_its_bytes(cache, tmp_path):
    guard = tmp_path / "guard.py"
    guard.write_text("def g(a):\n    return True\n", encoding="utf-8")
    cases = tmp_path / "cases"
    inputs = {"guard": f"{guard}:g", "timeout_s": 10.0}
    assert z3_cache.store("witness-search", inputs, _rows(cases), str(cases))
    assert z3_cache.load("witness-search", inputs, str(cases)) is not None
    guard.write_text("def g(a):\n    return False\n", encoding="utf-8")
    assert z3_cache.load("witness-search", inputs, str(cases)) is None


def test_a_changed_source_file_changes_the_code_hash(tmp_path):
    for package in z3_cache.PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "mod.py").write_text("X = 1\n", encoding="utf-8")
    (tmp_path / "spec" / "data.json").write_text("{}", encoding="utf-8")
    before = z3_cache.code_hash(tmp_path)
    z3_cache._CODE.clear()
    assert z3_cache.code_hash(tmp_path) == before  # the same bytes: the same hash
    (tmp_path / "spec" / "data.json").write_text('{"a": 1}', encoding="utf-8")
    z3_cache._CODE.clear()
    changed = z3_cache.code_hash(tmp_path)
    assert changed != before
    (tmp_path / "refmodel" / "mod.py").write_text("X = 2\n", encoding="utf-8")
    z3_cache._CODE.clear()
    assert z3_cache.code_hash(tmp_path) not in (before, changed)
    z3_cache._CODE.clear()


def test_a_changed_code_hash_misses(cache, tmp_path, monkeypatch):
    cases = tmp_path / "cases"
    inputs = {"guard": "none", "timeout_s": 10.0}
    assert z3_cache.store("witness-search", inputs, _rows(cases), str(cases))
    monkeypatch.setattr(z3_cache, "code_hash", lambda root=None: "another commit")
    assert z3_cache.load("witness-search", inputs, str(cases)) is None


def test_what_may_differ_run_to_run_is_never_kept(cache, tmp_path):
    cases = tmp_path / "cases"
    inputs = {"guard": "none", "timeout_s": 10.0}
    assert not z3_cache.store("witness-search", inputs, _rows(cases, inconclusive=True), str(cases))
    outside = _rows(tmp_path / "elsewhere")
    assert not z3_cache.store("witness-search", inputs, outside, str(cases))  # a case file outside the directory
    naming = _rows(cases)
    naming[1].message = f"see {cases}/x"
    assert not z3_cache.store("witness-search", inputs, naming, str(cases))  # a row naming the run's directory
    assert z3_cache.load("witness-search", inputs, str(cases)) is None


def test_off_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.setenv(z3_cache.ENV, "off")
    cases = tmp_path / "cases"
    assert z3_cache.cache_dir() is None
    assert not z3_cache.store("witness-search", {"guard": "none"}, _rows(cases), str(cases))
    assert z3_cache.load("witness-search", {"guard": "none"}, str(cases)) is None


def test_the_witness_searches_from_the_cache_equal_those_computed(cache, tmp_path):
    """The real witness searches (the model's plan: no guard, every assumption kept), computed, then from the cache
    into another directory: the same rows and the same case files, byte for byte."""
    from fa3verify.engine_gate import plan_rows

    hits: list = []
    computed = plan_rows(None, 10.0, str(tmp_path / "a"), z3_cache=True, hits=hits)
    assert not hits and computed and any(r.case_file for r in computed)
    kept = plan_rows(None, 10.0, str(tmp_path / "b"), z3_cache=True, hits=hits)
    assert len(hits) == 1
    assert [dataclasses.replace(r, case_file=None) for r in kept] == \
        [dataclasses.replace(r, case_file=None) for r in computed]
    for a, b in zip(computed, kept):
        assert (a.case_file is None) == (b.case_file is None)
        if a.case_file:
            assert Path(b.case_file).parent == tmp_path / "b" and Path(a.case_file).name == Path(b.case_file).name
            assert Path(a.case_file).read_bytes() == Path(b.case_file).read_bytes()
    plan_rows(None, 11.0, str(tmp_path / "c"), z3_cache=True, hits=hits)  # another timeout: computed
    assert len(hits) == 1


def test_the_flow_theorem_from_the_cache_equals_the_one_computed(cache, tmp_path):
    """vLLM's flow theorem under a release's profile (no worker: the rows come from z3 on the model), computed, then
    from the cache: the same rows; the stage says where they came from."""
    from fa3verify.engine_gate import flow_theorem_rows
    from gpu_impl.engines.vllm.host import VllmSUT

    sut = VllmSUT(release="0.34.0", progress=lambda line: None)
    hits: list = []
    computed = flow_theorem_rows(sut, 10.0, str(tmp_path / "a"), replay=False, z3_cache=True, hits=hits)
    assert not hits and computed.checks and not computed.findings
    kept = flow_theorem_rows(sut, 10.0, str(tmp_path / "b"), replay=False, z3_cache=True, hits=hits)
    assert hits == [sut.spec.plugin.flow_theorem] and kept.checks == computed.checks
    assert kept.policy == computed.policy
