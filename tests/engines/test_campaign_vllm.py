"""vLLM through the one campaign: family ``vllm`` (gpu_impl/engines/vllm/strategies.py), case files with vLLM's options
(``options.vllm``, gpu_impl/engines/vllm/options.py), replay on ``vllm==V``; the seeded vLLM #20301 defect found by the campaign and replayed.

Unit tests need nothing; those marked ``engine`` run vLLM 0.33.0's own builder and impl in the cached environment
and skip without it (see tests/engines/test_engine_vllm.py).
"""

import json
import random

import pytest

from fa3verify.cli import main
from gpu_impl.engines import envs
from vllm_campaign import assert_cli_replays_as_seeded, find_seeded_split

RELEASE = "0.33.0"
DEFECT = "graph-split-count-from-capture"


# ---------------------------------------------------------------- unit: no environment needed


def test_the_vllm_family_covers_every_configuration_family():
    from fa3verify.strategies import family
    from gpu_impl.engines.vllm.strategies import vllm_family_label

    cases = [family("vllm")(random.Random(i)) for i in range(600)]
    labels = {vllm_family_label(c) for c in cases}
    for part in ("cg=none", "cg=piecewise", "cg=full", "bi=0", "bi=1", "kv=auto", "kv=fp8", "sw=none", "sw=one",
                 "sw=mixed", "dcp=1", "dcp=2"):
        assert any(part in lab for lab in labels), part
    assert not any("dcp=2" in lab and "sw=none" not in lab for lab in labels)  # DCP only without windows
    modes = {s["mode"] for c in cases for s in c.steps}
    assert modes == {"decode", "mixed"}  # skewed decode and chunked-prefill steps
    assert all(sum(s["extend_lens"] or [1] * len(s["seq_lens"])) <= 8192 for c in cases for s in c.steps)
    assert all(c.server.cuda_graph for c in (family("vllm-full-graph")(random.Random(i)) for i in range(50)))


def test_a_vllm_case_round_trips_through_the_one_schema_and_names_bad_fields(tmp_path):
    from fa3verify.case_files import scenario_case
    from fa3verify.strategies import family
    from spec.model.cases import Case, CaseFormatError

    fc = family("vllm")(random.Random(3))
    case = scenario_case(fc, source="fuzz", policy={"guard": "fixed", "metadata_heads": "tp",
                                                    "clear_stale_cp_metadata": True},
                         engine={"name": "vllm", "release": RELEASE}, expected={"outcome": "pass"}, notes="",
                         defects=[DEFECT])
    back = Case.from_json(case.to_json())
    assert back.options == fc.options and back.engine == {"name": "vllm", "release": RELEASE} and back.defects == [DEFECT]
    data = json.loads(case.to_json())
    assert data["options"] == {"vllm": fc.options["vllm"]} and "vllm" not in data  # written as options
    legacy = {k: v for k, v in data.items() if k != "options"}  # a file written before options
    for bad, field in (({"kv_cache_dtype": "int4"}, "vllm.kv_cache_dtype"), ({"frob": 1}, "vllm.frob"),
                       ({"num_layers": 2, "sliding_window": [4096]}, "vllm.sliding_window"),
                       ({"capture_sizes": [0]}, "vllm.capture_sizes"), ("x", "vllm")):
        for spelled, where in (({**data, "options": {"vllm": bad}}, "options." + field), ({**legacy, "vllm": bad}, field)):
            with pytest.raises(CaseFormatError, match="^" + where.replace(".", r"\.") + ":"):
                Case.from_dict(spelled)
    for spelled in ({**legacy, "vllm": {"piecewise": True}}, {**data, "options": {"vllm": {"piecewise": True}}}):
        graph = {**spelled, "server": {**data["server"], "cuda_graph": True}}
        with pytest.raises(CaseFormatError, match="vllm.piecewise"):
            Case.from_dict(graph)
    with pytest.raises(CaseFormatError, match="engine.release"):
        Case.from_dict({**data, "engine": {"name": "vllm"}})


def test_a_vllm_case_is_refused_by_the_model_naming_the_engine(tmp_path, capsys):
    from fa3verify.case_files import scenario_case
    from fa3verify.strategies import family

    fc = family("vllm")(random.Random(5))
    case = scenario_case(fc, source="fuzz", policy={"guard": "fixed", "metadata_heads": "tp",
                                                    "clear_stale_cp_metadata": True},
                         engine={"name": "vllm", "release": RELEASE}, expected={"outcome": "pass"}, notes="")
    path = case.save(tmp_path)
    assert main(["replay", str(path), "--engine", "model"]) == 2
    assert "vllm==V" in capsys.readouterr().err


def test_the_mapping_carries_the_vllm_options_and_seeds_only_what_the_driver_can():
    from fa3verify.commands.fuzz import scenario_for
    from fa3verify.policy import load_policy
    from fa3verify.strategies import family
    from gpu_impl.engines.vllm import driver as vllm_driver
    from gpu_impl.engines.vllm.host import scenario_to_vllm

    policy = load_policy()
    for i in range(40):
        fc = family("vllm")(random.Random(i))
        out = scenario_to_vllm(scenario_for(fc, policy, {DEFECT}))
        vllm_driver.check_scenario(out)  # every drawn case is one the driver accepts
        assert out["defect"] == {"precompute_num_splits": 0}
        assert out["kv_cache_dtype"] == fc.options["vllm"]["kv_cache_dtype"]
        assert out["cuda_graph"] == ("full" if fc.server.cuda_graph else
                                     "piecewise" if fc.options["vllm"]["piecewise"] else "none")
    with pytest.raises(Exception, match="defects") as info:
        scenario_to_vllm(scenario_for(fc, policy, {"call-not-varlen"}))
    assert type(info.value).__name__ == "ScenarioUnsupported"  # skipped and counted by the campaign, never a pass


def test_a_dcp_case_shrinks_within_the_vllm_domain_and_an_sglang_case_keeps_sglangs():
    """Under vLLM attn_cp_size is decode context parallel (no prefill CP): a DCP case's candidates are judged by the
    vLLM family's domain, so it shrinks; the same configuration as an sglang case stays outside sglang's domain."""
    import dataclasses

    from fa3verify.shrinking import shrink_case
    from fa3verify.strategies import family

    case = next(c for c in (family("vllm")(random.Random(i)) for i in range(200))
                if c.server.attn_cp_size == 2 and sum(len(s["seq_lens"]) for s in c.steps) > 2)

    def long_row(c):  # stands for "fails the same way": some row of at least 1000 tokens under DCP 2
        return c.server.attn_cp_size == 2 and any(x >= 1000 for s in c.steps for x in s["seq_lens"])

    case = dataclasses.replace(case, steps=tuple({**s, "seq_lens": [4000] + list(s["seq_lens"][1:])}
                                                 if i == 0 else s for i, s in enumerate(case.steps)))
    small = shrink_case(case, long_row)
    assert small.server.attn_cp_size == 2 and [s["seq_lens"] for s in small.steps] == [[1000]]
    as_sglang = dataclasses.replace(case, options={})
    assert shrink_case(as_sglang, long_row) == as_sglang  # every candidate is outside sglang's domain


# ---------------------------------------------------------------- engine: vLLM's own code through the campaign


@pytest.fixture(scope="module")
def vllm_sut(engine_sut):
    if not envs.env_ready(RELEASE, engine="vllm"):
        pytest.skip(f"no environment for vllm {RELEASE} under {envs.env_dir(RELEASE, engine='vllm')}")
    return engine_sut(f"vllm=={RELEASE}")  # the test process's shared worker (tests/engine_pool.py)


@pytest.mark.engine
def test_cli_fuzz_on_vllm_runs_the_campaign_over_the_vllm_family_and_passes(cli_on_engine_pool, tmp_path):
    out = tmp_path / "summary.json"
    rc = main(["fuzz", "--engine", f"vllm=={RELEASE}", "--cases", "40", "--out", str(tmp_path / "cases"),
               "--json", str(out)])  # the CLI's campaign, on the shared worker
    summary = json.loads(out.read_text())
    assert rc == 0, [c.get("message") for c in summary["checks"]]  # the message carries the domain's rejections
    assert summary["cases"] == 40 and summary["failures"] == 0
    assert not (tmp_path / "cases").exists()


@pytest.mark.engine
def test_negative_control_the_seeded_pr20301_defect_is_found_saved_and_replays(vllm_sut, cli_on_engine_pool,
                                                                               tmp_path, capsys):
    """vLLM #20301's pattern seeded into the real code path (the precompute with the heuristic, the call with the
    CUDA-graph 32): the campaign finds SPLIT_BOUND, saves a case naming vllm==0.33.0 and the defect; it replays as
    still failing, and as passing with --without-defects."""
    from fa3verify.commands.fuzz import fuzz

    case_file, case = find_seeded_split(vllm_sut, tmp_path / "cases", DEFECT, "vllm-full-graph", 200, RELEASE)
    assert case.server["cuda_graph"] and case.options.get("vllm") is not None
    assert_cli_replays_as_seeded(case_file, capsys)  # the CLI's replay, on the shared worker
    # silent when off: the same draws without the defect, on 0.33.0 with its own full-graph replay finding fixed
    # (the replay precompute aligned to the captured call, release_copies.ALIGNED_REPLAY_0_33_0; the clean release
    # fails these draws with that finding, SHAPE silent at the replay, docs/engines-vllm.md)
    from gpu_impl.engines.vllm.host import VllmSUT
    from gpu_impl.sut import parse_engine
    from release_copies import ALIGNED_REPLAY_0_33_0, vllm_patched_copy

    aligned = VllmSUT(spec=parse_engine(f"vllm-src={vllm_patched_copy(RELEASE, tmp_path / 'aligned', ALIGNED_REPLAY_0_33_0)}"),
                      progress=lambda line: None)
    try:
        control = fuzz(sut=aligned, max_cases=200, budget_s=None, out_dir=str(tmp_path / "off"),
                       strategy="vllm-full-graph", show_progress=False)
    finally:
        aligned.close()
    assert control.exit_code == 0 and control.cases == 200


def test_seeded_defects_on_an_engine_whose_driver_applies_none_are_refused_not_ignored():
    from fa3verify.commands.fuzz import run_campaign
    from fa3verify.policy import load_policy
    from gpu_impl.sut import parse_engine

    class SglangLike:
        spec = parse_engine("sglang==0.5.23")

        def run(self, *a, **k):  # never reached: the refusal comes first
            raise AssertionError("ran")

    with pytest.raises(ValueError, match="defects: .* cannot be seeded into sglang==0.5.23"):
        run_campaign(load_policy(), None, max_cases=1, budget_s=None, sut=SglangLike(), defects={DEFECT})
