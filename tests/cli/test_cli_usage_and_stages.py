"""Small command-line contracts: a mistyped option prints the usage of the command it was given to; a model-policy
option typed with a real engine is refused even at its default value; `check` titles its table `check`; a fuzz
stage that a Ctrl-C ended says `interrupted`, not `done`; `make test` lists skips with their reasons."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from fa3verify import cli
from fa3verify.errors import UsageError
from interrupt_after import interrupt_after

REPO = Path(__file__).resolve().parents[2]


# -- a mistyped option ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,usage", [
    (["gate", "--guardd", "x"], "usage: fa3verify gate "),
    (["fuzz", "--cases", "3", "--bogus"], "usage: fa3verify fuzz "),
    (["engine", "matrix", "--bogus"], "usage: fa3verify engine matrix "),
    (["report", "run.json", "--htm", "x.html", "--nope"], "usage: fa3verify report"),
])
def test_a_mistyped_option_prints_its_commands_usage(capsys, argv, usage):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert "unrecognized arguments" in err and "usage: fa3verify [-h] [--version] COMMAND" not in err


def test_negative_control_an_unknown_command_still_prints_the_top_level_usage(capsys):
    with pytest.raises(SystemExit):
        cli.main(["gatee"])
    assert capsys.readouterr().err.startswith("usage: fa3verify [-h] [--version] COMMAND")


# -- a model-policy option with a real engine ---------------------------------------------------------------------

@pytest.mark.parametrize("argv,named", [
    (["gate", "--guard", "fixed", "--engine", "sglang==0.5.13"], "--guard fixed"),
    (["fuzz", "--guard=fixed", "--engine", "sglang==0.5.23", "--cases", "1"], "--guard fixed"),
    (["gate", "--metadata-heads", "tp", "--engine", "vllm==0.33.0"], "--metadata-heads tp"),
    (["replay", "tests/corpus/worked_example_prefix_guard.json", "--guard", "fixed", "--engine", "sglang==0.5.13"],
     "--guard fixed"),
])
def test_a_policy_option_typed_with_a_real_engine_is_exit_2_naming_both(capsys, monkeypatch, argv, named):
    monkeypatch.chdir(REPO)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    engine = argv[argv.index("--engine") + 1]
    assert f"{named}: conflicts with --engine {engine}" in err and "would be ignored" in err, err


def _args(**values):
    return argparse.Namespace(guard="fixed", metadata_heads="tp", keep_stale_cp_metadata=False,
                              cp_decode_sharded_kv=False, **values)


def test_negative_control_the_check_passes_the_model_and_an_engine_without_policy_options():
    from fa3verify.validation import check_typed_policy_options

    check_typed_policy_options(_args(engine="model", typed_options={"--guard", "--engine"}))
    check_typed_policy_options(_args(engine="sglang==0.5.13", typed_options={"--engine", "--cases"}))
    with pytest.raises(UsageError, match="--guard fixed: conflicts with --engine sglang==0.5.13"):
        check_typed_policy_options(_args(engine="sglang==0.5.13", typed_options={"--engine", "--guard"}))


def test_typed_options_knows_prefixes_and_equals_forms():
    parser = cli.command_parser(cli.build_parser(), argparse.Namespace(command="fuzz"))
    assert {"--guard", "--metadata-heads"} <= cli.typed_options(parser, ["--guard=x", "--metadata-h", "tp"])
    assert "--guard" not in cli.typed_options(parser, ["--guard-timeout-s", "3", "--", "--guard"])


# -- check's table -------------------------------------------------------------------------------------------------

def test_checks_table_is_titled_check(monkeypatch, capsys, tmp_path):
    import fa3verify.commands.gate as gating
    from fa3verify.summary import Check, RunSummary

    def small_gate(*a, **k):
        return RunSummary(command="gate", checks=[Check("combine", "theorem", "proved", 0.1)])

    monkeypatch.setattr(gating, "gate", small_gate)
    out_json = tmp_path / "check.json"
    assert cli.main(["check", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "fa3verify check" in out and "fa3verify gate" not in out
    assert '"command": "check"' in out_json.read_text()



def test_checks_stage_lines_say_check(monkeypatch, capsys, tmp_path):
    """The stage lines of `check` name it (they said `fa3verify gate:`); `gate`'s own still say gate."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check", "--budget-s", "1"]) == 0
    err = capsys.readouterr().err
    assert "fa3verify check: prove (z3 theorems) ..." in err and "fa3verify check: fuzz (emulated kernel" in err
    assert "fa3verify gate:" not in err
    assert cli.main(["gate", "--budget-s", "1", "--cases-dir", str(tmp_path / "cases")]) == 0
    err = capsys.readouterr().err
    assert "fa3verify gate: prove (z3 theorems) ..." in err and "fa3verify check:" not in err

# -- an interrupted fuzz stage -------------------------------------------------------------------------------------



@pytest.mark.parametrize("argv,command", [
    (["fuzz", "--guard", "pre-fix", "--cases", "100000", "--seed", "0"], "fuzz"),
    (["gate", "--cases", "100000", "--seed", "0"], "gate"),
])
def test_an_interrupted_fuzz_stage_says_interrupted_with_what_it_ran(tmp_path, capsys, monkeypatch, argv, command):
    import fa3verify.commands.fuzz as fuzzing

    if command == "gate":  # the proofs are not the point here: one theorem
        import fa3verify.commands.gate as gating
        import fa3verify.commands.prove as proving

        real_prove = proving.prove
        monkeypatch.setattr(proving, "prove", lambda policy, **k: real_prove(policy, **{**k, "only": ["combine"]}))
        assert gating  # the gate imports prove from fa3verify.commands.prove at call time
    interrupt_after(monkeypatch, fuzzing, "evaluate", 20)
    assert cli.main([*argv, "--cases-dir", str(tmp_path / "cases")]) == 3
    err = capsys.readouterr().err
    [end] = [line for line in err.splitlines() if re.match(rf"fa3verify {command}: fuzz \(.*\) \w+ in ", line)]
    assert re.search(r"\) interrupted in \d+\.\ds \([1-9]\d* cases, \d+ failing\)$", end), end
    assert " done in " not in end


def test_negative_control_an_uninterrupted_fuzz_stage_says_done(tmp_path, capsys):
    assert cli.main(["fuzz", "--cases", "3", "--seed", "0", "--cases-dir", str(tmp_path / "cases")]) == 0
    err = capsys.readouterr().err
    assert re.search(r"fa3verify fuzz: fuzz \(emulated kernel, 3 cases\) done in \d+\.\ds \(3 cases, 0 failing\)",
                     err), err


# -- make test ----------------------------------------------------------------------------------------------------

def test_make_test_lists_skipped_tests_with_their_reasons():
    recipe = (REPO / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    [pytest_line] = [line for line in recipe.splitlines() if " -m pytest " in line]
    assert re.search(r"\s-r\w*s", pytest_line), pytest_line


def test_prove_keeps_its_policy_with_an_engine():
    """prove --engine X chooses the model theorems under the policy and replays their witnesses on X: not refused."""
    from fa3verify.validation import check_typed_policy_options

    check_typed_policy_options(_args(engine="sglang==0.5.13", typed_options={"--guard"}, command="prove"))
