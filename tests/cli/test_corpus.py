"""The regression corpus (tests/corpus/): every case still fails the way it says, or passes when it says "pass".

Scenario cases (schema fa3verify.case/1) replay through fa3verify.commands.replay.replay; kernel-level cases (schema
fa3verify.kernel-case/1, the catalogue's kernel defects) through fa3verify.catalogue.replay_kernel_case. Each
defect-carrying case also passes once its defect is removed, so it fails *because of* the defect.
"""

import json
from pathlib import Path

import pytest

from fa3verify import catalogue as cat
from fa3verify.commands.replay import replay

CORPUS = Path(__file__).resolve().parent.parent / "corpus"
FILES = sorted(CORPUS.glob("*.json"))


def test_the_corpus_holds_every_catalogue_entry_and_the_extra_cases():
    names = {p.name for p in FILES}
    for entry in cat.ENTRIES:
        assert entry.case_name in names, \
            f"missing {entry.case_name}: run fa3verify catalogue --write-corpus tests/corpus"
    assert set(cat.EXTRA_CORPUS) <= names


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_case_replays_with_its_expected_outcome(path):
    result = cat.replay_corpus_file(path)
    expected = result["expected"]
    assert result["matches"], (f"{path.name}: expected {expected['outcome']} {expected.get('invariant')}, "
                               f"observed {result['outcome']} {result['invariants']} {result['messages'][:1]}")
    if expected["outcome"] != "pass":
        assert result["still_fails"]


@pytest.mark.parametrize("name,flag", [
    ("worked_example_prefix_guard.json", {"guard": "fixed"}),
    ("catalogue-01-prefix-guard-prefill-cp.json", {"guard": "fixed"}),
    ("catalogue-02-no-dp-attention-guard.json", {"guard": "fixed"}),
    ("catalogue-03-stale-cp-metadata-runner.json", {"keep_stale": False}),
    ("mixed_after_cp_v2_stale_runner.json", {"keep_stale": False}),
    ("catalogue-04-graph-split-count-at-capture.json", {"guard": "fixed"}),
    ("catalogue-06-varlen-metadata-dense-call.json", {"guard": "fixed"}),
    ("catalogue-12-metadata-before-padding.json", {"guard": "fixed"}),
])
def test_scenario_case_passes_with_the_fix(name, flag):
    summary, observed = replay(str(CORPUS / name), **flag)
    assert observed.outcome == "pass" and summary.exit_code == 0, (name, observed.findings[:1])


def test_graph_buffer_case_passes_when_the_replay_copies_into_the_captured_buffer():
    case = json.loads((CORPUS / "catalogue-07-graph-metadata-new-buffer.json").read_text())
    assert case["policy"]["guard"] == "gpu_impl.defects:graph_metadata_new_buffer"
    # the same policy (guard 'none', attn_tp heads) without the switch
    summary, observed = replay(str(CORPUS / "catalogue-07-graph-metadata-new-buffer.json"), guard="none")
    assert observed.outcome == "pass", observed.findings[:1]


@pytest.mark.parametrize("name", ["catalogue-08-combine-no-neg-inf-guard.json",
                                  "catalogue-09-finite-mask-sentinel.json",
                                  "catalogue-10-heuristic-zero-division.json"])
def test_kernel_case_passes_without_its_kernel_switch(name):
    assert json.loads((CORPUS / name).read_text())["defects"]
    result = cat.replay_kernel_case(CORPUS / name, defects=())
    assert result["outcome"] == "pass", result


def test_cascade_case_passes_with_the_prefix_metadata_built_for_one_batch():
    kc = json.loads((CORPUS / "catalogue-05-cascade-prefix-batch-size.json").read_text())
    md = kc["call"]["metadata"]
    assert md["batch_size"] > 4  # b4 grows: FA3's shape check fires
    total, prefix = kc["call"]["seqlens_q"][0], kc["call"]["seqlens_k"][0]
    kc["call"]["metadata"] = {**md, "batch_size": 1, "cache_seqlens": [prefix], "cu_seqlens_q": [0, total]}
    assert cat.evaluate_kernel_case(kc, defects=())[0] == "pass"


def test_malformed_kernel_case_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": cat.KERNEL_CASE_SCHEMA, "call": {}}))
    with pytest.raises(ValueError, match="missing field"):
        cat.replay_kernel_case(bad)
