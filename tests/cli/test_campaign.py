"""The one campaign loop and the one case schema: what the loop counts, parallel targets, case files
with a `defects` field and kernel-level cases read by `fa3verify replay`, each with its negative control."""

import json
import random
from pathlib import Path

import pytest

from fa3verify.campaign import Budget, Observation, run_campaign
from fa3verify.cli import main
from gpu_impl.engines.model.sut import ModelSUT
from spec.finding import Finding

CORPUS = Path(__file__).resolve().parent.parent / "corpus"


class _Echo:
    """A toy target: a case is an int; odd ones violate ODD (signature by residue mod 3)."""

    def __init__(self, parallel=1):
        self.parallel = parallel
        self.batches = []

    def observe(self, case):
        return self.observe_many([case])[0]

    def observe_many(self, cases):
        self.batches.append(list(cases))
        return [Observation("violation", ["ODD"], ["odd"], [Finding("ODD", message="odd", signature_key=f"ODD:{c % 3}")])
                if c % 2 else
                Observation("pass") for c in cases]


def _ints(rng):
    return rng.randrange(100)


def test_the_campaign_counts_draws_and_keeps_the_first_case_of_each_signature():
    camp = run_campaign(_Echo(), _ints, budget=Budget(cases=60), seed=3)
    assert camp.draws == camp.cases == 60 and 0 < camp.failing_cases < 60
    assert set(camp.failures) <= {"ODD:0", "ODD:1", "ODD:2"}
    assert sum(f.count for f in camp.failures.values()) == camp.failing_cases
    # the same seed gives the same cases
    again = run_campaign(_Echo(), _ints, budget=Budget(cases=60), seed=3)
    assert {s: (f.case, f.count) for s, f in again.failures.items()} == \
        {s: (f.case, f.count) for s, f in camp.failures.items()}


def test_a_family_that_gives_no_case_uses_the_budget_and_runs_nothing():
    camp = run_campaign(_Echo(), lambda rng: None, budget=Budget(cases=10))
    assert camp.draws == 10 and camp.cases == 0 and not camp.failures


def test_a_parallel_target_gets_batches_and_the_cases_are_recorded_in_draw_order():
    serial, wide = _Echo(), _Echo(parallel=4)
    a = run_campaign(serial, _ints, budget=Budget(cases=10), seed=1)
    b = run_campaign(wide, _ints, budget=Budget(cases=10), seed=1)
    assert [len(x) for x in wide.batches] == [4, 4, 2]
    assert [c for x in wide.batches for c in x] == [c for x in serial.batches for c in x]
    assert {s: f.case for s, f in a.failures.items()} == {s: f.case for s, f in b.failures.items()}


def test_the_stop_condition_ends_the_campaign():
    camp = run_campaign(_Echo(), _ints, budget=Budget(cases=1000), stop=lambda c: bool(c.failures))
    assert camp.stopped and camp.failing_cases == 1 and camp.cases < 1000


@pytest.mark.parametrize("budget", [Budget(), Budget(seconds=float("nan")), Budget(cases=0)])
def test_an_unbounded_budget_is_refused(budget):
    with pytest.raises(ValueError, match="budget_s|max_cases"):
        run_campaign(_Echo(), _ints, budget=budget)


def test_every_strategy_family_is_named_and_gives_cases():
    from fa3verify.strategies import FAMILIES, KERNEL_FAMILIES, family

    for name in list(FAMILIES) + [f"kernel:{k}" for k in KERNEL_FAMILIES]:
        made = [family(name)(random.Random(i)) for i in range(20)]
        assert any(m is not None for m in made), name
    with pytest.raises(ValueError, match="unknown"):
        family("no-such-family")


def _with_defects_field(tmp_path, defects):
    """Corpus case 04 (a guard spec carrying the switch) rewritten with the builtin guard and a `defects` field."""
    data = json.loads((CORPUS / "catalogue-04-graph-split-count-at-capture.json").read_text())
    data["policy"]["guard"] = "fixed"
    data["defects"] = defects
    path = tmp_path / "case.json"
    path.write_text(json.dumps(data))
    return path


def test_a_scenario_case_with_a_defects_field_replays_with_its_defect(tmp_path, capsys):
    path = _with_defects_field(tmp_path, ["graph-split-count-from-capture"])
    assert main(["replay", str(path)]) == 1
    assert "STILL FAILS" in capsys.readouterr().out
    # negative control: the same case without its defect passes
    assert main(["replay", str(path), "--without-defects"]) == 0


def test_an_unknown_defect_is_exit_2_naming_the_field(tmp_path, capsys):
    assert main(["replay", str(_with_defects_field(tmp_path, ["no-such-defect"]))]) == 2
    assert "defects" in capsys.readouterr().err
    assert main(["replay", str(_with_defects_field(tmp_path, "not-a-list"))]) == 2


def test_replay_reads_kernel_level_cases_of_both_schemas(tmp_path, capsys):
    legacy = CORPUS / "catalogue-08-combine-no-neg-inf-guard.json"
    assert main(["replay", str(legacy)]) == 1 and "STILL FAILS" in capsys.readouterr().out
    assert main(["replay", str(legacy), "--without-defects"]) == 0
    data = json.loads(legacy.read_text())
    data["schema"] = "fa3verify.case/1"
    current = tmp_path / "k.json"
    current.write_text(json.dumps(data))
    assert main(["replay", str(current)]) == 1
    assert main(["replay", str(current), "--guard", "fixed"]) == 2  # a scenario option on a kernel-level case


@pytest.mark.parametrize("change,field", [
    ({"capacity_k": 1 << 30}, "call"),                 # a cache that does not fit: refused, never allocated
    ({"heads": [3, 2]}, "call.heads"),
    ({"seqlens_k": [1, 2, 3]}, "call.seqlens_k"),
    ({"rogue": 1}, "call.rogue"),
])
def test_a_malformed_kernel_level_case_is_exit_2_naming_the_field(tmp_path, capsys, change, field):
    data = json.loads((CORPUS / "catalogue-08-combine-no-neg-inf-guard.json").read_text())
    data["call"].update(change)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert main(["replay", str(path)]) == 2
    assert field in capsys.readouterr().err


def test_the_caller_defect_is_applied_from_outside_and_idempotent():
    from fa3verify.kernel_cases import seed_caller_defects
    from fa3verify.strategies.kernel_calls import cascade_prefix

    call = cascade_prefix(random.Random(5))
    assert call["metadata"]["batch_size"] == 1
    bad = seed_caller_defects(call, ["cascade-prefix-metadata-batch-size"])
    assert bad["metadata"]["batch_size"] == call["num_reqs"] and call["metadata"]["batch_size"] == 1
    assert seed_caller_defects(bad, ["cascade-prefix-metadata-batch-size"]) == bad
    assert seed_caller_defects(call, []) == call


class _Loud:
    """A toy target: a case that is a multiple of 4 ends in FA3's shape check; none violates."""

    def observe(self, case):
        return Observation("shape_error" if case % 4 == 0 else "pass")


def test_shape_errors_are_counted_as_loud_not_as_failures_and_fuzz_says_how_many():
    camp = run_campaign(_Loud(), _ints, budget=Budget(cases=80), seed=1)
    draws = random.Random("fa3verify.campaign:1")
    expected = sum(random.Random(draws.getrandbits(64)).randrange(100) % 4 == 0 for _ in range(80))
    assert camp.loud == expected > 0 and camp.failing_cases == 0 and not camp.failures
    assert run_campaign(_Echo(), _ints, budget=Budget(cases=40), seed=1).loud == 0


def test_fuzz_reports_the_shape_errors_it_met(monkeypatch):
    """fuzz's row says how many cases ended in the shape check, and still passes on them (loud and safe)."""
    import fa3verify.commands.fuzz as fuzzing
    from fa3verify.campaign import Campaign
    from fa3verify.policy import load_policy

    def fake_campaign(*args, **kwargs):
        camp = Campaign(budget=Budget(cases=10))
        camp.cases, camp.loud = 10, 3
        return camp

    monkeypatch.setattr(fuzzing, "run_campaign", fake_campaign)
    summary = fuzzing.fuzz(ModelSUT(policy=load_policy()), max_cases=10, budget_s=None, show_progress=False)
    [row] = summary.checks
    assert row.verdict == "pass" and summary.exit_code == 0
    assert row.message == ("10 cases, no violation; 3 cases raised FA3's shape check (loud and safe: the call is "
                           "refused, nothing read out of bounds; not counted as violations)")
