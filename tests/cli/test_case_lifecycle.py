"""A case file's ``lifecycle`` object (spec.model.case_lifecycle): the driven sequence of a lifecycle finding -- layers
a step and the seeded engine defect -- carried to the engine drivers; case files without it load as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spec.model.case_bounds import CaseFormatError
from spec.model.cases import Case

CORPUS = Path(__file__).resolve().parents[1] / "corpus_lifecycle"


def _case(**extra) -> dict:
    data = json.loads((CORPUS / "vllm-0.34.0-dcp-full-graph-empty-context.json").read_text())
    data.pop("lifecycle", None)
    data["vllm"].pop("num_layers", None)
    return {**data, **extra}


def test_a_case_without_the_object_loads_as_one_layer_and_no_engine_defect():
    case = Case.from_dict(_case())
    assert case.lifecycle is None and "lifecycle" not in case.to_dict()


def test_the_object_round_trips_and_makes_a_distinct_case():
    plain = Case.from_dict(_case())
    seq = {"layers": 2, "engine_defect": "capture-width-of-capture-batch"}
    case = Case.from_dict(_case(lifecycle=seq))
    assert case.lifecycle == seq and Case.from_json(case.to_json()).lifecycle == seq
    assert case.signature() != plain.signature()
    assert Case.from_dict(_case(lifecycle={"layers": 3})).lifecycle == {"layers": 3, "engine_defect": None}


@pytest.mark.parametrize("value, field", [
    ({"layers": 0}, "lifecycle.layers"), ({"layers": 65}, "lifecycle.layers"), ({"layers": True}, "lifecycle.layers"),
    ({"layer": 2}, "lifecycle.layer"), ({"engine_defect": 3}, "lifecycle.engine_defect"),
    ({"engine_defect": ""}, "lifecycle.engine_defect"), ([2], "lifecycle"),
])
def test_a_bad_object_is_refused_naming_its_field(value, field):
    with pytest.raises(CaseFormatError) as exc:
        Case.from_dict(_case(lifecycle=value))
    assert exc.value.field == field


def test_layers_and_vllm_num_layers_must_agree_where_both_are_given():
    data = _case(lifecycle={"layers": 2})
    data["vllm"]["num_layers"] = 2
    assert Case.from_dict(data).lifecycle["layers"] == 2
    data["vllm"]["num_layers"] = 1
    with pytest.raises(CaseFormatError, match="lifecycle.layers"):
        Case.from_dict(data)


def test_every_lifecycle_case_in_the_corpus_carries_its_sequence():
    for path in sorted(CORPUS.glob("*.json")):
        case = Case.load(path)
        assert case.lifecycle is not None and case.lifecycle["layers"] == 2, path.name


def test_the_vllm_mapping_runs_the_cases_layers_and_engine_defect():
    from gpu_impl.engines.vllm import driver as vllm_driver
    from gpu_impl.engines.vllm.host import scenario_to_vllm
    from gpu_impl.scenario import Step
    from spec.model.config import ModelConfig, ServerConfig

    class Scn:
        server = ServerConfig(tp_size=1, cuda_graph=True, page_size=16)
        model = ModelConfig(name="m", num_heads=32, num_kv_heads=4, head_dim=128)
        steps = [Step(mode="decode", seq_lens=[9, 3])]
        lifecycle = {"layers": 3, "engine_defect": "capture-width-of-capture-batch"}

    out = scenario_to_vllm(Scn)
    assert (out["num_layers"], out["lifecycle_defect"]) == (3, "capture-width-of-capture-batch")
    vllm_driver.check_scenario(out)
    Scn.lifecycle = {"layers": 1, "engine_defect": "no-such-defect"}
    with pytest.raises(ValueError, match="lifecycle_defect"):   # the driver names the field before any run
        vllm_driver.check_scenario(scenario_to_vllm(Scn))


def test_the_sglang_host_sends_the_cases_sequence_with_the_run():
    from gpu_impl.engines.sglang.host import SglangSUT

    sent = []
    sut = SglangSUT.__new__(SglangSUT)
    sut.request = lambda obj, *a, **k: sent.append(obj) or {"ok": True}
    sut._answer = lambda resp: resp

    class Scn:
        from spec.model.config import ModelConfig, ServerConfig
        from gpu_impl.scenario import Step

        server = ServerConfig(tp_size=1)
        model = ModelConfig(name="m", num_heads=32, num_kv_heads=4, head_dim=128)
        steps = [Step(mode="decode", seq_lens=[9])]
        seed = 0
        lifecycle = {"layers": 2, "engine_defect": "precompute-over-real-rows"}

    sut.run(Scn)
    assert (sent[0]["layers"], sent[0]["lifecycle_defect"]) == (2, "precompute-over-real-rows")
    Scn.lifecycle = None
    sut.run(Scn)
    assert "layers" not in sent[1] and "lifecycle_defect" not in sent[1]


def test_the_padded_rows_replay_case_expects_the_pass_of_the_empty_row_rule():
    # vLLM 0.16.0's FULL-graph replay over 6 of 8 captured rows: the slots past the recompute are the padded rows'
    # split counts, zeroed by vLLM, the empty row of the build 0.16.0 ships (refmodel.fa3_builds.empty_row_split_count)
    case = Case.load(CORPUS / "vllm-0.16.0-full-graph-padded-rows.json")
    assert case.to_dict()["expected"]["outcome"] == "pass" and case.to_dict()["expected"]["invariant"] is None
    assert case.lifecycle == {"layers": 2, "engine_defect": None}
