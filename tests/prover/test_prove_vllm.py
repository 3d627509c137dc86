"""``prove --engine-profile vllm==V`` and ``conform --engine vllm==V``: vLLM's FA3 flow from its release profile.

The prover plays the profile (gpu_impl.engines.vllm.theorems): vLLM 0.33.0 passes the same heads and the same num_splits on
both sides, with the call's KV extent at least the precompute's max_seqlen_k, so the flow is proved. The negative
control is a profile variant with vLLM #20301's pattern (the precompute's max_num_splits differs from the call's):
refuted with a concrete counterexample. Conformance checks each claim on the released code (engine env needed).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spec.model.config import MODELS
from gpu_impl.plugin import engine_profile_for
from spec.model.engine_profiles import ProfileError
from gpu_impl.engines.vllm.profiles import VLLM_RELEASES, VllmProfileError, vllm_profile_for, vllm_profile_from_dict
from gpu_impl.engines.vllm.theorems import run_vllm_theorems

REPO = Path(__file__).resolve().parents[2]
QWEN = [MODELS["qwen3-30b-a3b"]]


def variant(precompute: dict, call: dict, modes=("full",)):
    return vllm_profile_from_dict("0.33.0+pr20301", {"precompute_modes": list(modes),
                                                     "num_splits": {"precompute": precompute, "call": call}})


def test_the_vllm_profile_is_read_from_its_json():
    kind, p = engine_profile_for("vllm==0.33.0")
    assert kind == "vllm" and p is vllm_profile_for("0.33.0")
    assert p.modes == ("none", "piecewise", "full") and p.splits("full") == (32, 32) and p.splits("none") == (0, 0)
    assert p.heads == ("layer", "layer") and not p.headdim_v_passed
    raw = json.loads((REPO / "gpu_impl" / "engines" / "vllm" / "profiles.json").read_text())["releases"][0]
    assert raw["same_num_splits_both_sides"] == all(p.splits(m)[0] == p.splits(m)[1] for m in p.modes)
    with pytest.raises(ProfileError, match=r"no profile for vllm 0\.1\.0; releases with a profile: "
                       + re.escape(", ".join(VLLM_RELEASES))):
        engine_profile_for("vllm==0.1.0")
    with pytest.raises(ProfileError, match="want sglang==V .* or vllm==V"):
        engine_profile_for("trt==1")


def test_a_malformed_profile_names_the_field():
    with pytest.raises(VllmProfileError, match=r"model\.num_splits\.call\.full: expected an integer in \[0, 256\]"):
        variant({"full": 32}, {"full": "32"})
    with pytest.raises(VllmProfileError, match=r"model\.precompute_modes"):
        variant({}, {}, modes=("eager",))


def test_the_released_flow_is_proved_on_a_model():
    (r,) = run_vllm_theorems(vllm_profile_for("0.33.0"), models=QWEN)
    assert r.verdict == "proved" and r.expected and not r.failed, r.message


@pytest.mark.parametrize("pre, call", [({"full": 0}, {"full": 32}), ({"full": 32}, {"full": 8})])
def test_negative_control_pr20301_split_counts_that_differ_are_refuted_with_a_counterexample(pre, call):
    (r,) = run_vllm_theorems(variant(pre, call), models=QWEN)
    assert r.verdict == "refuted" and r.failed, r.message
    w = r.witness
    assert w["invariant"] == "SPLIT_BOUND" and w["S_p"] > w["S_c"] > 1
    assert (w["precompute"]["num_splits"], w["call"]["num_splits"]) == (pre["full"], call["full"])
    assert max(w["splits"]) > w["S_c"] and w["call"]["seqlen_k"] >= w["precompute"]["max_seqlen_k"]
    assert "counterexample" in r.message and "qwen3-30b-a3b" in w["config"]


def test_prove_flow_summary_fails_on_the_variant():
    from fa3verify.commands.prove import prove_flow
    from gpu_impl.sut import parse_engine

    bad = prove_flow(parse_engine("vllm==0.33.0"), variant({"full": 0}, {"full": 32}))
    assert bad.exit_code == 1 and bad.findings and bad.findings[0].invariant == "SPLIT_BOUND"


def _cli(capsys, *args):
    """``fa3verify ARGS`` run in-process (fa3verify.cli.main): (exit code, stdout, stderr)."""
    from fa3verify.cli import main

    capsys.readouterr()
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_prove_engine_profile_vllm_proves_the_release(tmp_path, capsys):
    rc, stdout, stderr = _cli(capsys, "prove", "--engine-profile", "vllm==0.33.0", "--json", str(tmp_path / "p.json"))
    assert rc == 0, stdout + stderr
    data = json.loads((tmp_path / "p.json").read_text())
    (check,) = data["checks"]
    assert check["name"] == "vllm-flow" and check["verdict"] == "proved"
    assert "configurations" in check["message"]


def test_cli_prove_engine_profile_vllm_refuses_what_does_not_apply(capsys):
    for extra, option in ((["--guard", "pre-fix"], "--guard"), (["--only", "hazard"], "--only"),
                          (["--engine", "sglang==0.5.23"], "--engine")):
        rc, _, stderr = _cli(capsys, "prove", "--engine-profile", "vllm==0.33.0", *extra)
        assert rc == 2 and f"{option}: does not apply" in stderr, stderr
    rc, _, stderr = _cli(capsys, "prove", "--engine-profile", "vllm==9.9.9")
    assert rc == 2 and f"releases with a profile: {', '.join(VLLM_RELEASES)}" in stderr


# -- conformance on the released code (the vLLM engine environment) ----------------------------------------------

@pytest.fixture(scope="module")
def vllm_sut(engine_sut):
    from gpu_impl.engines import envs

    if not envs.env_ready("0.33.0", engine="vllm"):
        pytest.skip(f"no environment for vllm 0.33.0 under {envs.env_dir('0.33.0', engine='vllm')} (set "
                    f"FA3VERIFY_ENGINE_HOME to a folder holding one, or `fa3verify engine setup vllm==0.33.0`)")
    return engine_sut("vllm==0.33.0")  # the test process's shared worker (tests/engine_pool.py)


@pytest.mark.engine
def test_conform_the_profile_holds_on_the_released_code(vllm_sut):
    from fa3verify.commands.conform import claims_summary
    from gpu_impl.engines.vllm.conformance import PROBES, conform_vllm

    good = claims_summary(conform_vllm(vllm_sut, vllm_profile_for("0.33.0")))
    assert good.exit_code == 0 and not good.findings, [f.message for f in good.findings]
    assert len(good.checks) > 50
    # negative control: a profile claiming the call passes 0 under full CUDA graph is contradicted by the code
    wrong = vllm_profile_from_dict("0.33.0", {"precompute_modes": ["none", "piecewise", "full"],
                                              "num_splits": {"precompute": {"none": 0, "piecewise": 0, "full": 32},
                                                             "call": {"none": 0, "piecewise": 0, "full": 0}}})
    bad = claims_summary(conform_vllm(vllm_sut, wrong, probes=[p for p in PROBES if p[1]["cuda_graph"] == "full"][:1]))
    assert bad.exit_code == 1
    assert {f.message.split(": ")[1].split(" [")[0] for f in bad.findings} == {"call num_splits = 0"}


# -- the counterexample as a case file, replayed on the released code -----------------------------------------

def test_a_refuted_variant_writes_its_counterexample_as_a_vllm_case(tmp_path):
    from spec.model.cases import Case

    (r,) = run_vllm_theorems(variant({"full": 0}, {"full": 32}), models=QWEN, cases_dir=str(tmp_path))
    assert r.verdict == "refuted" and r.case_file and "case file" in r.message
    case = Case.load(r.case_file)
    assert case.source == "prove:vllm-flow" and case.engine == {"name": "vllm", "release": "0.33.0"}
    assert case.defects == ["graph-split-count-from-capture"] and case.server["cuda_graph"]
    assert case.options["vllm"]["max_num_splits_for_cuda_graph"] == 32 and case.expected["invariant"] == "SPLIT_BOUND"
    assert case.batches[0]["seq_lens"] == [int(x) for x in r.witness["seq_lens"]]
    # a difference no seeded defect makes (32 vs 8) is written without one: it replays the released code as it is
    (other,) = run_vllm_theorems(variant({"full": 32}, {"full": 8}), models=QWEN, cases_dir=str(tmp_path / "o"))
    assert Case.load(other.case_file).defects == []


@pytest.mark.engine
def test_the_counterexample_replays_on_vllm_with_the_seeded_defect_and_passes_without(vllm_sut, cli_on_engine_pool,
                                                                                     tmp_path, capsys):
    """The prover's #20301 counterexample is only meaningful under the seeded defect: with it the real builder and
    impl give SPLIT_BOUND; without it (the released code) the same batch passes."""
    from fa3verify.cli import main
    from fa3verify.commands.replay import replay

    (r,) = run_vllm_theorems(variant({"full": 0}, {"full": 32}), models=QWEN, cases_dir=str(tmp_path))
    summary, observed = replay(r.case_file, sut=vllm_sut)
    assert summary.exit_code == 1 and observed.still_fails and "SPLIT_BOUND" in observed.invariants
    _, fixed = replay(r.case_file, sut=vllm_sut, defects=())
    assert not fixed.fails and fixed.verdict == "PASSES NOW"
    assert main(["replay", r.case_file, "--without-defects"]) == 0  # the CLI's replay, on the shared worker


def test_a_release_sharing_a_row_is_proved_under_that_rows_profile():
    """vLLM 0.9.0.1 and 0.10.1.1 share the rows of 0.9.0 and 0.10.1 (releases.json shares_row: byte-identical
    driven files): their profile is that row's, so their gate's flow theorem runs instead of ending inconclusive."""
    from gpu_impl.engines.vllm.profiles import VllmProfileError, vllm_profile_for
    from gpu_impl.engines.vllm.recipes import SHARES_ROW

    assert SHARES_ROW["0.9.0.1"] == "0.9.0" and SHARES_ROW["0.10.1.1"] == "0.10.1"
    assert vllm_profile_for("0.9.0.1") == vllm_profile_for("0.9.0")
    assert vllm_profile_for("0.10.1.1") == vllm_profile_for("0.10.1")
    with pytest.raises(VllmProfileError, match="no profile for vllm 0.9.3"):
        vllm_profile_for("0.9.3")   # neither a row nor sharing one
