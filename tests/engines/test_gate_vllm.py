"""``gate --engine vllm==V``: vLLM's own theorem (``vllm-flow`` under the release's profile) is a gate row that
counts, its counterexample is replayed on the engine, and a release without a profile is inconclusive, not a pass.

The unit tests need no environment (the engine is a stand-in that records what it is asked to run); the test
marked ``engine`` gates vLLM 0.33.0's own code (see tests/engines/test_engine_vllm.py for the environment)."""

import json

import pytest

from fa3verify.engine_gate import flow_theorem_rows
from gpu_impl.engines import envs
from gpu_impl.sut import EngineSpec

RELEASE = "0.33.0"


class _Result:
    findings: list = []
    outcome = "pass"  # what the judge reads of a scenario result (gpu_impl.scenario.ScenarioResult.outcome)


class RecordingEngine:
    def __init__(self, release=RELEASE):
        self.spec, self.ran = EngineSpec("vllm", release=release), []

    def run(self, scn, kernel=None, numerics=False, device=None):  # the SystemUnderTest.run signature the judge calls
        self.ran.append(scn)
        return _Result()


def test_the_released_flow_is_a_proved_gate_row(tmp_path):
    engine = RecordingEngine()
    rows = flow_theorem_rows(engine, timeout_s=10.0, cases_dir=str(tmp_path))
    [row] = rows.checks
    assert (row.name, row.verdict, row.failed, row.inconclusive) == ("vllm-flow", "proved", False, False)
    assert rows.exit_code == 0 and engine.ran == []  # nothing refuted, nothing to replay


def test_negative_control_a_pr20301_profile_fails_the_gate_and_its_counterexample_runs_on_the_engine(tmp_path,
                                                                                                  monkeypatch):
    import gpu_impl.engines.vllm.profiles as profiles

    seeded = profiles.vllm_profile_from_dict("0.33.0", {"precompute_modes": ["full"],
                                                        "num_splits": {"precompute": {"full": 0},
                                                                       "call": {"full": 32}}})
    monkeypatch.setattr(profiles, "vllm_profile_for", lambda release: seeded)
    engine = RecordingEngine()
    rows = flow_theorem_rows(engine, timeout_s=10.0, cases_dir=str(tmp_path))
    theorem = rows.checks[0]
    assert theorem.verdict == "refuted" and theorem.failed and theorem.case_file
    assert rows.exit_code == 1 and rows.findings and rows.findings[0].case_file == theorem.case_file
    assert len(engine.ran) == 1 and engine.ran[0].options.get("vllm") is not None  # the counterexample, as a vLLM scenario
    assert [c.kind for c in rows.checks] == ["theorem", "replay"]


def test_a_release_without_a_profile_is_inconclusive(tmp_path):
    rows = flow_theorem_rows(RecordingEngine("9.9.9"), timeout_s=10.0, cases_dir=str(tmp_path))
    [row] = rows.checks
    assert row.inconclusive and not row.failed and rows.exit_code == 3
    assert "no profile for vllm 9.9.9" in row.message and "gpu_impl/engines/vllm/profiles.json" in row.message


@pytest.mark.engine
def test_gate_on_vllm_runs_its_theorem_and_fuzzes_its_family(tmp_path):
    if not envs.env_ready(RELEASE, engine="vllm"):
        pytest.skip(f"no environment for vllm {RELEASE} under {envs.env_dir(RELEASE, engine='vllm')}")
    from fa3verify.cli import main

    out = tmp_path / "gate.json"
    assert main(["gate", "--engine", f"vllm=={RELEASE}", "--cases", "20", "--cases-dir", str(tmp_path / "cases"),
                 "--json", str(out)]) == 0
    checks = {c["name"]: c for c in json.loads(out.read_text())["checks"]}
    assert checks["vllm-flow"]["verdict"] == "proved"
    fuzz = [c for c in checks.values() if c["kind"] == "property"]
    assert fuzz and all(c["verdict"] == "pass" for c in fuzz)


@pytest.mark.parametrize("command", [["gate", "--cases", "1"], ["fuzz", "--cases", "1"]])
def test_an_unknown_vllm_release_is_bad_input_naming_engine(command, capsys, tmp_path):
    """Refused when the engine is opened (exit 2, naming --engine and the registered releases), not at the first
    run as an internal error (exit 3)."""
    from fa3verify.cli import main

    assert main(command + ["--engine", "vllm==9.9.9", "--json", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    from gpu_impl.engines.vllm.recipes import RELEASES

    assert f"--engine: vllm==9.9.9: not a vLLM release this suite knows (registered: {', '.join(RELEASES)})" in err
    assert "nearest driver generation is v2 (vllm==0.34.0's)" in err
    assert "Traceback" not in err and not (tmp_path / "s.json").exists()
