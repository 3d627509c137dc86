"""The bug catalogue: every entry is caught by the engines it names, nothing fires with its defect off,
the command's exit codes, the defect registry, and docs/catalogue.md is generated from the same data."""

import json
import time
from pathlib import Path

import pytest

from fa3verify import catalogue as cat
from fa3verify.cli import main
from gpu_impl.defects import DEFECTS, SEEDED_POLICIES, check_defects, defects_of
from gpu_impl.guards import load_guard

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory):
    cases = tmp_path_factory.mktemp("catalogue-cases")
    start = time.perf_counter()
    results = cat.run_catalogue(mode="fast", cases_dir=str(cases))
    return results, time.perf_counter() - start, cases


def test_every_entry_is_caught_by_its_engines_without_false_alarm(fast_run):
    results, seconds, _ = fast_run
    assert [r.entry.id for r in results] == [f"{i:02d}" for i in range(1, 14)]
    for r in results:
        detail = {side: {k: (v.status, v.detail[:160]) for k, v in runs.items()}
                  for side, runs in (("on", r.on), ("off", r.off))}
        assert r.ok, f"{r.entry.id}: {detail}"
        for engine in r.entry.catchers:
            assert engine in r.caught_by, f"{r.entry.id} not caught by {engine}: {detail}"
        assert not r.false_alarms, f"{r.entry.id} fired with the defect off: {detail}"
        for engine, outcome in r.off.items():
            assert outcome.status in ("silent", "n/a"), f"{r.entry.id} off {engine}: {outcome.status}"


def test_caught_findings_name_the_expected_invariant(fast_run):
    expected = {"01": "SPLIT_BOUND", "02": "SPLIT_BOUND", "03": "CP_PATH_MATCHES_ACTIVITY", "04": "SPLIT_BOUND",
                "05": "SHAPE", "06": "SHAPE", "07": "BATCH_PERMUTATION", "08": "NO_NAN", "10": "NO_CRASH",
                "11": "QUERY_COVER", "12": "BATCH_PERMUTATION"}
    by_id = {r.entry.id: r for r in fast_run[0]}
    for eid, inv in expected.items():
        fuzz = by_id[eid].on["fuzz"]
        assert inv in fuzz.invariants, (eid, fuzz.invariants, fuzz.detail)
    assert set(by_id["09"].on["fuzz"].invariants) & {"MASKED_ROW_LSE", "MATCHES_ORACLE"}
    # prove's witness for entry 2 is a DP-attention configuration, for entry 11 FA3's tile corner
    assert "dpa" in by_id["02"].on["prove"].detail
    assert "host-kernel-tile" in by_id["11"].on["prove"].detail
    # entry 13: FA3's int L2 split branch, found by theorem 8 and replayed as FA3's own rejection
    assert by_id["13"].on["prove"].invariants == ["SPLIT_COUNT_POSITIVE"]
    assert by_id["13"].on["prove"].case["expected"]["invariant"] == "FA3_REJECTS_NUM_SPLITS"


def test_each_catching_run_writes_a_replayable_case(fast_run):
    results, _, cases = fast_run
    for r in results:
        assert r.case_file, r.entry.id
        path = Path(r.case_file)
        assert path.name == r.entry.case_name and path.parent == cases
        replayed = cat.replay_corpus_file(path)
        assert replayed["matches"] and replayed["still_fails"], (r.entry.id, replayed)


def test_shape_entries_report_a_shape_error_never_a_silent_violation(fast_run):
    by_id = {r.entry.id: r for r in fast_run[0]}
    for eid in ("05", "06"):
        fuzz = by_id[eid].on["fuzz"]
        assert fuzz.status == "caught" and fuzz.invariants == ["SHAPE"]
        assert "no silent violation" in fuzz.detail
        assert fuzz.case.expected["outcome"] == "shape_error" if hasattr(fuzz.case, "expected") else \
            fuzz.case["expected"]["outcome"] == "shape_error"


def test_docs_catalogue_md_is_generated_and_fresh():
    doc = REPO / "docs" / "catalogue.md"
    assert doc.exists(), "run: fa3verify catalogue --write-docs docs/catalogue.md"
    assert doc.read_text() == cat.catalogue_markdown(), \
        "docs/catalogue.md is stale: run `fa3verify catalogue --write-docs docs/catalogue.md`"


def test_entries_are_complete_and_use_registered_switches():
    assert len(cat.ENTRIES) == 13 and len({e.id for e in cat.ENTRIES}) == 13
    used = set()
    for e in cat.ENTRIES:
        assert e.reference and e.url.startswith("https://") and e.what_went_wrong and e.defect and e.invariant
        assert set(e.catchers) <= {"prove", "fuzz"} and e.catchers
        check_defects(e.switches)
        used |= set(e.switches)
        assert (e.prove != "") == ("prove" in e.catchers), e.id
    # every registered defect is seeded by some entry (the counterfactual fix serves entry 11's off run; the hazard
    # controls have no upstream report: tests/engines/test_fuzz_vllm_decode_tile.py and tests/cli/test_fuzz_large_decode_batch.py
    # seed them)
    controls = {"precompute-max-seqlen-q-off-by-one", "precompute-max-seqlen-q-two"}
    assert set(DEFECTS) - used == {"fa3-kernel-uses-host-tiles"} | controls
    assert {n for n, d in DEFECTS.items() if d.kind == "hazard-control"} == controls
    with pytest.raises(ValueError, match="unknown name"):
        check_defects(["no-such-defect"])


def test_seeded_policies_load_as_guard_specs_and_carry_their_switches():
    for name, policy in SEEDED_POLICIES.items():
        guard = load_guard(policy.spec)
        assert guard is policy and defects_of(guard) == policy.defects
        assert all(DEFECTS[d].layer == "backend" for d in policy.defects)
    assert defects_of(load_guard("fixed")) == frozenset()


def test_resolve_ids_accepts_numbers_and_slugs():
    assert [e.id for e in cat.resolve_ids(["4", "07", "finite-mask-sentinel"])] == ["04", "07", "09"]
    with pytest.raises(ValueError, match="unknown entry"):
        cat.resolve_ids(["14"])


def test_cli_only_json_and_exit_codes(tmp_path, capsys):
    out = tmp_path / "cat.json"
    rc = main(["catalogue", "--only", "6", "--only", "10", "--json", str(out), "--cases-dir", str(tmp_path / "c")])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["verdict"] == "pass" and data["exit_code"] == 0
    assert [e["id"] for e in data["catalogue"]] == ["06", "10"]
    assert all(e["ok"] and e["caught_by"] == ["fuzz"] for e in data["catalogue"])
    assert all(c["kind"] == "catalogue" for c in data["checks"])
    text = capsys.readouterr().out
    assert "catalogue: 2/2 entries caught" in text
    assert main(["catalogue", "--only", "99"]) == 2


def test_a_defect_the_engine_cannot_see_fails_the_catalogue(monkeypatch, tmp_path):
    # entry 04's defect lives in CUDA-graph replays: fuzzing eager configurations can never catch it
    eager = cat._scenario_engine(cat.family_eager_tp, cat._Policy("gpu_impl.defects:graph_split_count_from_capture"),
                                 cat._Policy("fixed"), ("SPLIT_BOUND",))
    monkeypatch.setitem(cat._FUZZ, "04", eager)
    # one run: the command's exit code, and the entry's result as its JSON reports it (EntryResult.to_dict)
    out = tmp_path / "cat.json"
    assert main(["catalogue", "--only", "4", "--cases-dir", str(tmp_path), "--json", str(out)]) == 1
    (res,) = json.loads(out.read_text())["catalogue"]
    assert res["id"] == "04" and res["on"]["fuzz"]["status"] == "missed" and not res["ok"]


def test_a_false_alarm_fails_the_entry(monkeypatch):
    # the "off" policy keeps the defect: the off run must report it as a false alarm
    leaky = cat._scenario_engine(cat.family_graph_tp, cat._Policy("gpu_impl.defects:graph_split_count_from_capture"),
                                 cat._Policy("gpu_impl.defects:graph_split_count_from_capture"), ("SPLIT_BOUND",))
    monkeypatch.setitem(cat._FUZZ, "04", leaky)
    res = cat.run_entry(cat.resolve_ids(["4"])[0])
    assert res.off["fuzz"].status == "fired" and res.false_alarms == ["fuzz"] and not res.ok


def test_an_engine_that_raises_is_reported_not_a_crash(monkeypatch):
    def broken(on, budget):
        raise RuntimeError("solver exploded")

    monkeypatch.setitem(cat._PROVE, "08", broken)
    res = cat.run_entry(cat.resolve_ids(["8"])[0])
    assert res.on["prove"].status == "error" and "solver exploded" in res.on["prove"].detail
    assert not res.ok and res.on["fuzz"].status == "caught"


def test_empty_workload_is_a_defined_result_without_the_defect():
    call = {"seqlens_q": [0, 0], "seqlens_k": [900, 1000], "capacity_k": 1024, "max_seqlen_q": 0, "heads": [8, 1],
            "head_dim": 128, "head_dim_v": 128, "causal": True, "num_splits": 0, "seed": 1}
    assert cat.evaluate_kernel_case(cat._kernel_case("10", call, ()))[0] == "pass"
    outcome, invs, msgs = cat.evaluate_kernel_case(cat._kernel_case("10", call, ("heuristic-zero-division",)))
    assert (outcome, invs) == ("violation", ["NO_CRASH"]) and "ZeroDivisionError" in msgs[0]
