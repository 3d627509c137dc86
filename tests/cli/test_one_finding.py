"""One finding type from the judge to every report, outcomes as an enum, and the numerics check written once
(``spec.finding``, ``fa3verify.judge``, ``gpu_impl.oracle_check``), each with a negative control."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from fa3verify.campaign import Budget, Observation, run_campaign
from fa3verify.judge import Verdict, judge, judge_call
from fa3verify.summary import Finding as SummaryFinding
from fa3verify.summary import RunSummary, finding_lines
from gpu_impl.oracle_check import compare_call, compare_output
from spec.finding import REPORT_FIELDS, Finding, Outcome
from spec.violation import Violation

ROOT = Path(__file__).resolve().parent.parent.parent


def test_a_check_and_a_report_name_the_same_finding_type():
    assert Violation is Finding and SummaryFinding is Finding


def test_outcomes_serialise_as_the_words_reports_and_case_files_carry():
    assert json.dumps([o for o in Outcome]) == json.dumps([o.value for o in Outcome])
    assert [Outcome.PASS, Outcome.NAN] == ["pass", "nan"] and repr([Outcome.VIOLATION]) == "['violation']"
    assert f"{Outcome.SHAPE_ERROR}" == "shape_error" and Outcome("clear_error") is Outcome.CLEAR_ERROR
    assert Outcome.of([], []) is Outcome.PASS and Outcome.of([], ["shape"]) is Outcome.SHAPE_ERROR
    # negative control: a finding outranks a shape error
    assert Outcome.of(["found"], ["shape"]) is Outcome.VIOLATION


def test_a_reported_finding_writes_exactly_the_run_summary_fields():
    found = Finding.at_step("SPLIT_BOUND", 2, 1, "S_p 3 > S_c 2", {"mode": "decode", "path": "eager"})
    reported = found.reported(case_file="c.json", engine="fuzz", replay="fa3verify replay c.json")
    assert list(reported.report_dict()) == list(REPORT_FIELDS)
    assert reported.report_dict()["message"] == "S_p 3 > S_c 2" and reported.signature == found.signature
    assert list(reported.api_dict()) == list(REPORT_FIELDS) + ["case"]
    assert found.to_dict() == {"invariant": "SPLIT_BOUND", "step": 2, "dp_rank": 1, "message": "S_p 3 > S_c 2",
                               "detail": {"mode": "decode", "path": "eager"}}
    back = Finding.from_report({**reported.report_dict(), "unknown": 1})
    assert back.report_dict() == reported.report_dict()
    assert finding_lines(reported)[0] == "[fuzz] SPLIT_BOUND: S_p 3 > S_c 2"
    # negative control: the run's own keys never reach the report
    assert not {"step", "dp_rank", "detail", "batch"} & set(reported.report_dict())
    assert str(found) == repr(found) and str(reported).startswith("[fuzz] SPLIT_BOUND")


def test_the_judges_finding_is_the_object_the_campaign_keeps():
    made = Finding.fault("ODD", "odd")

    class Target:
        def observe(self, case):
            return Observation.of(Verdict(Outcome.VIOLATION, [made])) if case % 2 else Observation.of(
                Verdict(Outcome.PASS))

    camp = run_campaign(Target(), lambda rng: rng.randrange(10), budget=Budget(cases=20), seed=1)
    assert list(camp.failures) == ["ODD"] and camp.failures["ODD"].finding is made
    assert camp.failures["ODD"].invariant == "ODD" and camp.failures["ODD"].message == "odd"


def test_a_judged_scenario_has_an_enum_outcome():
    from fa3verify.commands.fuzz import scenario_for
    from fa3verify.policy import load_policy
    from fa3verify.strategies import random_fuzz_case

    case = random_fuzz_case(random.Random(5))
    verdict = judge(None, scenario_for(case, load_policy()))
    assert isinstance(verdict.outcome, Outcome) and verdict.outcome == verdict.result.outcome


@pytest.mark.parametrize("raised, outcome, invariants", [
    (None, Outcome.PASS, []),
    (ValueError("num_splits: bad"), Outcome.CLEAR_ERROR, []),
    (RuntimeError("boom"), Outcome.VIOLATION, ["NO_CRASH"]),
])
def test_a_kernel_call_is_judged_by_the_judge(raised, outcome, invariants):
    def call():
        if raised is not None:
            raise raised
        return "out"

    verdict = judge_call(call, lambda returned: [])
    assert verdict.outcome is outcome and verdict.invariants == invariants


def test_a_kernel_calls_oracle_findings_are_its_verdicts():
    """Negative control of judge_call's check: a finding of the comparison makes the call a violation."""
    verdict = judge_call(lambda: "out", lambda returned: [Finding("NO_NAN", message="nan")])
    assert verdict.outcome is Outcome.VIOLATION and verdict.findings[0].signature == "NO_NAN"


def _outputs():
    gen = torch.Generator().manual_seed(0)
    exact = torch.randn(4, 2, 8, generator=gen, dtype=torch.float64)
    return exact.to(torch.bfloat16), exact, exact.float().double()


def test_the_numerics_check_passes_a_matching_output():
    out, exact, low = _outputs()
    assert compare_output(out, exact, low) is None


def test_the_numerics_check_finds_nan_rows():
    out, exact, low = _outputs()
    out[2, 0, 0] = float("nan")
    miss = compare_output(out, exact, low)
    assert miss.invariant == "NO_NAN" and miss.detail == {"rows": [2]}
    assert miss.message == "NaN in output rows [2] where the oracle has none"
    # without the NaN check (the extend path), the same output misses the tolerance
    assert compare_output(out, exact, low, nan_check=False).invariant == "MATCHES_ORACLE"


def test_the_numerics_check_finds_an_output_past_the_bound():
    out, exact, low = _outputs()
    out[1] += 1.0
    miss = compare_output(out, exact, low, error_rows=True)
    assert miss.invariant == "MATCHES_ORACLE" and miss.detail["rows"] == [1]
    assert miss.message.startswith("max error ") and "exceeds FA3's bound" in miss.message


def test_the_kernel_call_check_finds_a_masked_rows_lse():
    out, exact, low = _outputs()
    ref_lse = torch.tensor([0.0, float("-inf"), 1.0, 2.0], dtype=torch.float64)
    assert compare_call(out, ref_lse.float(), exact, ref_lse, exact, low) == []
    bad = ref_lse.float().clone()
    bad[1] = 3.0
    assert [f.invariant for f in compare_call(out, bad, exact, ref_lse, exact, low)] == ["MASKED_ROW_LSE"]


def test_the_numerics_check_is_written_once():
    """No module but gpu_impl/oracle_check.py decides a scenario's or a kernel case's numerics finding."""
    for path in ("gpu_impl/scenario.py", "gpu_impl/rank_verdict.py", "gpu_impl/engines/vllm/numerics.py",
                 "fa3verify/kernel_cases.py"):
        text = (ROOT / path).read_text()
        assert "fa3_output_close" not in text and "torch.isnan" not in text, path


def test_the_run_summary_json_carries_the_reported_fields_only():
    s = RunSummary("fuzz")
    s.findings.append(Finding.at_step("NO_NAN", 0, 0, "nan", {"rows": [1]}).reported(engine="fuzz", case_file="c"))
    assert list(s.to_dict()["findings"][0]) == list(REPORT_FIELDS)
