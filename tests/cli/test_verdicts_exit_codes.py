"""Pins of fa3verify's verdict code: the exit-code mapping, a summary's exit code, the gate's merge of
prove and fuzz, and replay's still-fails / passes-now decision. A mutant here is a false pass waiting to happen,
so every branch is pinned on a hand-built input (no solver, no campaign runs)."""

import pytest

from fa3verify import exitcodes
from fa3verify.commands.replay import ReplayOutcome
from fa3verify.summary import Check, Finding, RunSummary


def test_exit_code_numbers_and_names():
    assert (exitcodes.PASS, exitcodes.VIOLATION, exitcodes.USAGE, exitcodes.INCONCLUSIVE) == (0, 1, 2, 3)
    assert [exitcodes.verdict_name(c) for c in (0, 1, 2, 3)] == ["pass", "fail", "usage-error", "inconclusive"]
    assert exitcodes.verdict_name(7) == "fail"          # an unknown code is never a pass
    assert exitcodes.verdict_name(-1) == "fail"


@pytest.mark.parametrize("codes, expected", [
    ([], 0), ([0], 0), ([0, 0], 0), ([3], 3), ([0, 3], 3), ([2], 2), ([3, 2], 2), ([2, 3, 0], 2),
    ([1], 1), ([0, 1], 1), ([3, 1], 1), ([2, 1], 1), ([1, 2, 3, 0], 1),
])
def test_combine_orders_violation_usage_inconclusive_pass(codes, expected):
    assert exitcodes.combine(codes) == expected
    assert exitcodes.combine(iter(codes)) == expected   # any iterable, consumed once


def check(verdict="pass", failed=False, inconclusive=False):
    return Check(name="c", kind="theorem", verdict=verdict, seconds=0.0, failed=failed, inconclusive=inconclusive)


def test_summary_exit_code_priority():
    assert RunSummary("x").exit_code == 3                                     # nothing ran is never a pass
    assert RunSummary("x", checks=[check()]).exit_code == 0
    assert RunSummary("x", checks=[check(), check(inconclusive=True)]).exit_code == 3
    assert RunSummary("x", checks=[check(inconclusive=True), check(failed=True)]).exit_code == 1
    assert RunSummary("x", checks=[check()], failures=1).exit_code == 1
    assert RunSummary("x", checks=[check(failed=True)], interrupted=True).exit_code == 3
    assert RunSummary("x", checks=[check(failed=True)], interrupted=True, usage_error="bad").exit_code == 2
    assert RunSummary("x", checks=[check()]).verdict == "pass"
    assert RunSummary("x", checks=[check(failed=True)]).verdict == "fail"


def test_merge_folds_every_field():
    a = RunSummary("gate", checks=[check()], findings=[Finding("A", case_file=None, engine="prove")], cases=2, failures=0,
                   elapsed_s=1.0)
    b = RunSummary("fuzz", checks=[check(failed=True)], findings=[Finding("B", case_file="f.json", engine="fuzz")], cases=5,
                   failures=3, elapsed_s=2.5, first_failure_s=0.7, interrupted=True)
    a.merge(b)
    assert [c.failed for c in a.checks] == [False, True]
    assert [f.invariant for f in a.findings] == ["A", "B"]
    assert (a.cases, a.failures, a.elapsed_s, a.first_failure_s, a.interrupted) == (7, 3, 3.5, 0.7, True)
    c = RunSummary("gate", first_failure_s=0.2)
    c.merge(RunSummary("fuzz", first_failure_s=0.9))
    assert c.first_failure_s == 0.2 and c.interrupted is False
    d = RunSummary("gate", interrupted=True)
    d.merge(RunSummary("fuzz"))
    assert d.interrupted is True and d.first_failure_s is None


def fake_gate(monkeypatch, prove_summary, fuzz_summary, calls):
    import fa3verify.commands.fuzz
    import fa3verify.commands.prove

    def prove(policy, timeout_s, cases_dir):
        calls.append(("prove", timeout_s, cases_dir))
        if isinstance(prove_summary, BaseException):
            raise prove_summary
        return prove_summary

    def fuzz(sut, **kw):
        calls.append(("fuzz", kw))
        return fuzz_summary

    monkeypatch.setattr(fa3verify.commands.prove, "prove", prove)
    monkeypatch.setattr(fa3verify.commands.fuzz, "fuzz", fuzz)


def test_gate_merges_prove_then_fuzz(monkeypatch):
    from fa3verify.commands.gate import gate
    from fa3verify.policy import Policy
    from gpu_impl.engines.model.sut import ModelSUT

    calls = []
    proved = RunSummary("prove", checks=[check("proved")])
    fuzzed = RunSummary("fuzz", checks=[check(failed=True)], cases=40, failures=2)
    fake_gate(monkeypatch, proved, fuzzed, calls)
    s = gate(ModelSUT(policy=Policy("fixed", None)), budget_s=5.0, seed=7, timeout_s=2.5, cases_dir="out/cases", kernel_name="emulated",
             max_cases=40, show_progress=False)
    assert [c[0] for c in calls] == ["prove", "fuzz"]
    assert calls[0] == ("prove", 2.5, "out/cases")
    assert calls[1][1] == {"kernel_name": "emulated", "device": "cpu", "seed": 7, "budget_s": 5.0, "max_cases": 40,
                           "out_dir": "out/cases", "show_progress": False}
    assert (s.command, s.seed, s.cases, s.failures, len(s.checks), s.exit_code) == ("gate", 7, 40, 2, 2, 1)
    assert s.policy == Policy("fixed", None).to_dict() and s.elapsed_s >= 0.0 and s.interrupted is False


def test_gate_passes_only_when_both_pass(monkeypatch):
    from fa3verify.commands.gate import gate
    from fa3verify.policy import Policy
    from gpu_impl.engines.model.sut import ModelSUT

    fake_gate(monkeypatch, RunSummary("prove", checks=[check("proved")]),
              RunSummary("fuzz", checks=[check()], cases=10), [])
    assert gate(ModelSUT(policy=Policy("fixed", None)), show_progress=False).exit_code == 0
    fake_gate(monkeypatch, RunSummary("prove", checks=[check("refuted", failed=True)]),
              RunSummary("fuzz", checks=[check()], cases=10), [])
    assert gate(ModelSUT(policy=Policy("fixed", None)), show_progress=False).exit_code == 1
    fake_gate(monkeypatch, RunSummary("prove", checks=[check("inconclusive", inconclusive=True)]),
              RunSummary("fuzz", checks=[check()], cases=10), [])
    assert gate(ModelSUT(policy=Policy("fixed", None)), show_progress=False).exit_code == 3


def test_an_interrupted_prove_skips_fuzz_and_is_inconclusive(monkeypatch):
    from fa3verify.commands.gate import gate
    from fa3verify.policy import Policy
    from gpu_impl.engines.model.sut import ModelSUT

    calls = []
    fake_gate(monkeypatch, KeyboardInterrupt(), RunSummary("fuzz", checks=[check()]), calls)
    s = gate(ModelSUT(policy=Policy("fixed", None)), show_progress=False)
    assert [c[0] for c in calls] == ["prove"] and s.interrupted and s.exit_code == 3


def test_gate_defaults(monkeypatch):
    from fa3verify.commands.gate import gate
    from fa3verify.policy import Policy
    from gpu_impl.engines.model.sut import ModelSUT

    calls = []
    fake_gate(monkeypatch, RunSummary("prove", checks=[check()]), RunSummary("fuzz", checks=[check()]), calls)
    gate(ModelSUT(policy=Policy("fixed", None)))
    assert calls[0] == ("prove", 10.0, "fa3verify-out/cases")
    assert calls[1][1] == {"kernel_name": "emulated", "device": "cpu", "seed": 0, "budget_s": 20.0,
                           "max_cases": None, "out_dir": "fa3verify-out/cases", "show_progress": None}


def outcome(expected, inv, observed, invariants=(), findings=()):
    return ReplayOutcome(expected_outcome=expected, expected_invariant=inv, outcome=observed,
                         invariants=list(invariants), findings=list(findings), trace=[])


F = [{"invariant": "SPLIT_BOUND"}]


@pytest.mark.parametrize("case, still_fails, fails, verdict", [
    (outcome("violation", "SPLIT_BOUND", "violation", ["SPLIT_BOUND"], F), True, True, "STILL FAILS"),
    (outcome("violation", None, "violation", ["SPLIT_BOUND"], F), True, True, "STILL FAILS"),
    (outcome("violation", "KV_COVER", "violation", ["SPLIT_BOUND"], F), False, True,
     "FAILS DIFFERENTLY (not as the case file expected)"),
    (outcome("nan", None, "violation", ["NO_NAN"], F), True, True, "STILL FAILS"),      # NaN is a violation
    (outcome("nan", None, "nan", [], F), True, True, "STILL FAILS"),
    (outcome("violation", None, "nan", [], F), False, True, "FAILS DIFFERENTLY (not as the case file expected)"),
    (outcome("shape_error", None, "violation", [], F), False, True,
     "FAILS DIFFERENTLY (not as the case file expected)"),
    (outcome("violation", "SPLIT_BOUND", "pass"), False, False, "PASSES NOW"),
    (outcome("pass", None, "pass"), False, False, "PASSES (as expected)"),
    (outcome("pass", None, "violation", ["SPLIT_BOUND"], F), False, True,
     "FAILS DIFFERENTLY (not as the case file expected)"),
    (outcome("pass", None, "pass", [], F), False, True, "FAILS DIFFERENTLY (not as the case file expected)"),
    (outcome("violation", None, "violation", [], []), True, True, "STILL FAILS"),       # outcome alone fails
])
def test_replay_decision_table(case, still_fails, fails, verdict):
    assert case.still_fails is still_fails
    assert case.fails is fails
    assert case.verdict == verdict


def record_stages(monkeypatch):
    """Replace progress.stage with a recorder of (command, name, show, result()) at stage end."""
    import contextlib

    import fa3verify.progress

    seen = []

    @contextlib.contextmanager
    def stage(command, name, show=None, result=None):
        yield
        seen.append((command, name, show, result() if result else None))

    monkeypatch.setattr(fa3verify.progress, "stage", stage)
    return seen


def test_gate_passes_the_policy_and_reports_each_stage(monkeypatch):
    import fa3verify.commands.fuzz
    import fa3verify.commands.gate
    import fa3verify.commands.prove
    from fa3verify.commands.gate import gate
    from fa3verify.policy import Policy
    from gpu_impl.engines.model.sut import ModelSUT

    policy = Policy("fixed", None)
    got = {}

    def prove(p, timeout_s, cases_dir):
        got["prove"] = p
        return RunSummary("prove", checks=[check("proved"), check("refuted", failed=True)])

    def fuzz(sut, **kw):
        got["fuzz"] = sut.policy  # the policy reaches fuzz through the system under test
        return RunSummary("fuzz", checks=[check()], cases=12, failures=3)

    monkeypatch.setattr(fa3verify.commands.prove, "prove", prove)
    monkeypatch.setattr(fa3verify.commands.fuzz, "fuzz", fuzz)
    clock = iter([10.0, 12.5])
    monkeypatch.setattr(fa3verify.commands.gate.time, "perf_counter", lambda: next(clock))
    seen = record_stages(monkeypatch)
    s = gate(ModelSUT(policy=policy), max_cases=40, show_progress=True)
    assert got == {"prove": policy, "fuzz": policy}
    assert s.elapsed_s == 2.5
    assert seen == [("gate", "prove (z3 theorems)", False, "2 theorems, 1 failed"),
                    ("gate", "fuzz (emulated kernel, 40 cases)", False, "12 cases, 3 failing")]
    seen.clear()
    monkeypatch.setattr(fa3verify.commands.gate.time, "perf_counter", lambda: 0.0)
    gate(ModelSUT(policy=policy), budget_s=5.0, kernel_name="fa3")
    assert [x[1:3] for x in seen] == [("prove (z3 theorems)", None), ("fuzz (fa3 kernel, 5 s)", None)]


def test_the_gate_runs_the_proof_stages_the_system_under_test_names(monkeypatch):
    """One gate: the model's plan is every theorem under its policy, an engine's the witness searches (plus the
    flow theorem where it names it), then fuzz on the same system; witnesses=False runs fuzz only."""
    import fa3verify.engine_gate
    import fa3verify.commands.fuzz
    import fa3verify.commands.prove
    from fa3verify.commands.gate import gate
    from fa3verify.policy import Policy
    from gpu_impl.sut import EngineSpec, SystemUnderTest
    from gpu_impl.engines.model.sut import ModelSUT

    calls = []
    monkeypatch.setattr(fa3verify.commands.prove, "prove", lambda policy, **k: calls.append("theorems") or RunSummary("prove"))
    monkeypatch.setattr(fa3verify.engine_gate, "witness_stages", lambda sut, summary, **k: calls.append("witnesses"))
    monkeypatch.setattr(fa3verify.engine_gate, "flow_stage", lambda sut, summary, **k: calls.append("flow-theorem"))
    monkeypatch.setattr(fa3verify.commands.fuzz, "fuzz", lambda sut, **k: calls.append(("fuzz", sut)) or
                        RunSummary("fuzz", checks=[check()], cases=1))

    class Own(SystemUnderTest):
        spec = EngineSpec("sut", target="x:Own")
        plan = ("witnesses",)

        def run(self, scenario, kernel=None, numerics=False, device="cpu"):
            raise AssertionError("not run: fuzz is stubbed")

        def proof_plan(self):
            return self.plan

    model, own, flow = ModelSUT(policy=Policy("fixed", None)), Own(), Own()
    flow.plan = ("witnesses", "flow-theorem")
    for sut, expected in ((model, ["theorems"]), (own, ["witnesses"]), (flow, ["witnesses", "flow-theorem"])):
        calls.clear()
        summary = gate(sut, show_progress=False)
        assert calls == [*expected, ("fuzz", sut)], calls
        assert ("engine" in summary.policy) is (sut is not model)  # an engine's own code decided: named
    calls.clear()
    gate(own, show_progress=False, witnesses=False)
    assert calls == [("fuzz", own)]
