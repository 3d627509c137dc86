"""fa3verify.judge: one verdict per run, one meaning per fault (guard faults, FA3 aborts, unsupported, crashes)."""

from __future__ import annotations

import pytest

from gpu_impl.config import ServerConfig, get_model
from gpu_impl.scenario import Scenario, Step
from gpu_impl.sut import ScenarioUnsupported, SystemUnderTest, EngineSpec
from gpu_impl.engines.model.sut import ModelSUT
from spec.model.guards import GuardTimeout
from spec.process.worker_client import WorkerError

from fa3verify.judge import judge


def _scenario(guard=None, tp=2, pcp=False):
    from gpu_impl.guards import load_guard

    server = ServerConfig(tp_size=tp, attn_cp_size=2 if pcp else 1, enable_prefill_cp=pcp,
                          cp_strategy="zigzag" if pcp else None)
    return Scenario(server=server, model=get_model("llama-3.2-1b"), guard=guard or load_guard("fixed"),
                    steps=[Step("decode", [2305])])


def _timing_out(server_args):
    raise GuardTimeout("guard tests:slow missed its deadline of 0.1 s (GUARD_TIMEOUT)")


def _raising(server_args):
    raise KeyError("enable_dp_attention")


class _Raising(SystemUnderTest):
    spec = EngineSpec("model")

    def __init__(self, exc):
        self.exc = exc

    def run(self, scenario, kernel=None, numerics=False, device="cpu"):
        raise self.exc


def test_a_clean_run_passes():  # the control: nothing seeded, nothing found
    verdict = judge(ModelSUT(), _scenario())
    assert verdict.outcome == "pass" and verdict.ok and verdict.result is not None


def test_a_defect_the_run_reports_is_its_finding():
    from gpu_impl.guards import load_guard

    verdict = judge(ModelSUT(), _scenario(load_guard("none"), pcp=True))
    assert verdict.outcome == "violation" and verdict.invariants
    assert verdict.findings[0].step == 0


def test_the_policy_the_model_is_constructed_with_is_what_runs():
    """ModelSUT(policy=...) runs its own policy over a scenario's policy fields; without one, the scenario's run."""
    from fa3verify.policy import load_policy

    scn = _scenario(pcp=True)  # built under the fixed guard: the precompute is skipped, nothing found
    assert judge(ModelSUT(), scn).outcome == "pass"
    assert judge(ModelSUT(policy=load_policy("fixed")), scn).outcome == "pass"
    verdict = judge(ModelSUT(policy=load_policy("none")), scn)  # negative control: its guard, not the scenario's
    assert verdict.outcome == "violation" and verdict.invariants


def test_a_guard_timeout_is_guard_timeout_not_guard_raised():
    verdict = judge(ModelSUT(), _scenario(_timing_out))
    assert verdict.invariants == ["GUARD_TIMEOUT"]
    assert verdict.findings[0].signature == "GUARD_TIMEOUT" and verdict.findings[0].step is None
    assert verdict.result is None and "deadline" in verdict.fault


def test_a_raising_guard_is_guard_raised():
    verdict = judge(ModelSUT(), _scenario(_raising))
    assert verdict.invariants == ["GUARD_RAISED"] and verdict.findings[0].signature == "GUARD_RAISED"


def test_an_fa3_process_abort_is_a_finding_not_an_error():
    from refmodel.errors import ProcessAbort

    exc = ProcessAbort("batch_size", "the prepare kernel is launched with 0 blocks", "hopper/flash_api.cpp", 0)
    verdict = judge(_Raising(exc), _scenario())
    assert verdict.invariants == ["PROCESS_ABORT"] and "batch_size" in verdict.findings[0].message


def test_an_unsupported_scenario_is_neither_pass_nor_violation():
    verdict = judge(_Raising(ScenarioUnsupported("MLA models are not driven")), _scenario())
    assert verdict.unsupported and not verdict.findings and "MLA" in verdict.reason


def test_a_crash_is_raised_unless_asked_to_be_a_finding():
    with pytest.raises(ZeroDivisionError):
        judge(_Raising(ZeroDivisionError("x")), _scenario())
    verdict = judge(_Raising(ZeroDivisionError("x")), _scenario(), crash_is_finding=True)
    assert verdict.invariants == ["NO_CRASH"]


def test_a_worker_past_its_deadline_is_never_a_finding():
    with pytest.raises(WorkerError):
        judge(_Raising(WorkerError("worker missed its deadline")), _scenario(), crash_is_finding=True)


def test_fuzz_reports_a_guard_timeout_as_guard_timeout():
    from fa3verify.commands.fuzz import evaluate
    from fa3verify.policy import Policy
    from fa3verify.strategies import random_fuzz_case

    import random

    case = random_fuzz_case(random.Random(0))
    obs = evaluate(case, Policy("tests:slow", _timing_out), kernel=None)
    assert obs.invariants == ["GUARD_TIMEOUT"] and obs.findings[0].signature == "GUARD_TIMEOUT"


def test_fuzz_of_a_defect_that_makes_fa3_abort_reports_process_abort(tmp_path):
    from fa3verify.commands.fuzz import fuzz
    from fa3verify.policy import load_policy

    policy = load_policy("gpu_impl.defects:graph_metadata_before_padding")
    summary = fuzz(ModelSUT(policy=policy), max_cases=200, seed=0, budget_s=None, out_dir=str(tmp_path), show_progress=False)
    assert "PROCESS_ABORT" in {f.invariant for f in summary.findings}, [f.invariant for f in summary.findings]
    assert summary.exit_code == 1


def test_conform_reports_a_timing_out_model_guard_as_guard_timeout():
    from fa3verify.commands.conform import ConformanceTarget, ConformReport
    from fa3verify.policy import Policy
    from fa3verify.strategies import random_fuzz_case
    from tests.fake_engines import ProfileSUT

    import random

    report = ConformReport(engine="sglang==0.5.23", profile="0.5.23")
    target = ConformanceTarget(ProfileSUT("0.5.23"), Policy("tests:slow", _timing_out), report)
    for seed in range(20):
        obs = target.observe(random_fuzz_case(random.Random(seed)))
        if obs is not None:
            break
    assert obs is not None and obs.outcome == "violation"
    assert "GUARD_TIMEOUT" in " ".join(obs.messages)
