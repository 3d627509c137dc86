"""Case files never run code the user did not name; a z3 unknown is inconclusive; logs
show progress; --version; the help examples work as printed."""

import json
import re
import shlex
from pathlib import Path

import pytest

from fa3verify.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]
PREFIX_CASE = REPO / "tests" / "corpus" / "worked_example_prefix_guard.json"


@pytest.fixture
def evil(tmp_path):
    """A case whose policy.guard names a file that leaves a marker when imported or called."""
    marker = tmp_path / "PWNED"
    guard = tmp_path / "evil.py"
    guard.write_text(f"open({str(marker)!r}, 'w').write('imported')\ndef g(a):\n    return False\n")
    data = json.loads(PREFIX_CASE.read_text())
    data["policy"]["guard"] = f"{guard}:g"
    case = tmp_path / "case.json"
    case.write_text(json.dumps(data))
    return case, guard, marker


@pytest.mark.parametrize("spec_kind", ["file", "module"])
@pytest.mark.parametrize("command", [["replay"], ["run-ranks", "--metadata-only"]])
def test_a_case_file_cannot_make_the_tool_import_code(tmp_path, capsys, evil, command, spec_kind):
    case, guard, marker = evil
    if spec_kind == "module":
        data = json.loads(case.read_text())
        data["policy"]["guard"] = "os:system"
        case.write_text(json.dumps(data))
    assert main([command[0], str(case), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert "policy.guard" in err and "--trust-case-guard" in err and "Traceback" not in err
    assert not marker.exists()


def test_the_guard_named_on_the_command_line_or_trusted_runs(tmp_path, evil):
    case, guard, marker = evil
    assert main(["replay", str(case), "--guard", f"{guard}:g"]) == 1  # the guard never disables: still fails
    assert marker.exists()
    marker.unlink()
    assert main(["replay", str(case), "--trust-case-guard"]) == 1
    assert marker.exists()


def test_a_command_line_guard_overrides_the_case_guard_without_loading_it(tmp_path, evil):
    case, guard, marker = evil
    assert main(["replay", str(case), "--guard", "pre-fix"]) == 1
    assert not marker.exists()


@pytest.mark.parametrize("spec", ["fixed", "pre-fix", "none", "gpu_impl.defects:graph_split_count_from_capture",
                                  "gpu_impl.guards:prefix_guard_dp_only"])
def test_builtin_and_project_guards_stay_allowed_in_case_files(spec):
    from fa3verify.trust import guard_to_run

    assert guard_to_run(spec) == spec


@pytest.mark.parametrize("spec", ["os:system", "gpu_impl.defects_evil:g", "x.py:g", "spec.model.guards.x:y"])
def test_other_guards_in_case_files_need_trust(spec):
    from fa3verify.errors import UsageError
    from fa3verify.trust import guard_to_run

    with pytest.raises(UsageError, match="policy.guard"):
        guard_to_run(spec)
    assert guard_to_run(spec, trust_case_guard=True) == spec


# -- class 6: solver time-outs -----------------------------------------------------------------------------------

def test_a_tiny_solver_timeout_is_never_a_failure_or_a_proof(tmp_path, capsys):
    rc = main(["prove", "--only", "2-drift", "--timeout-s", "0.001", "--json", str(tmp_path / "p.json")])
    summary = json.loads((tmp_path / "p.json").read_text())
    assert rc in (0, 3), summary
    assert not any(c["failed"] for c in summary["checks"])
    for c in summary["checks"]:
        assert c["verdict"] != "proved" or "breaks" not in c["name"], c


@pytest.mark.parametrize("command", [["prove"], ["gate", "--cases", "1"], ["run-ranks", str(PREFIX_CASE)]])
@pytest.mark.parametrize("value", ["0", "nan", "-1", "1e9"])
def test_timeout_s_is_validated_the_same_way_everywhere(capsys, command, value):
    assert main(command + [f"--timeout-s={value}"]) == 2
    assert "--timeout-s: expected a finite number in (0, 86400]" in capsys.readouterr().err


# -- class 7: logs, version, help --------------------------------------------------------------------------------

def test_the_gate_prints_one_line_per_stage_on_a_non_terminal(tmp_path, capsys, monkeypatch):
    import fa3verify.commands.prove as proving

    real = proving.theorem_results
    monkeypatch.setattr(proving, "theorem_results",
                        lambda pol, t, d, only, dropped: real(pol, t, d, ["kv-cover"], dropped))
    rc = main(["gate", "--cases", "3", "--cases-dir", str(tmp_path / "c")])
    assert rc == 0
    err = capsys.readouterr().err
    assert re.search(r"fa3verify gate: prove \(z3 theorems\) \.\.\.", err)
    assert re.search(r"fa3verify gate: prove \(z3 theorems\) done in \d+\.\ds \(1 theorems, 0 failed\)", err)
    assert re.search(r"fa3verify gate: fuzz \(emulated kernel, 3 cases\) done in \d+\.\ds \(3 cases, 0 failing\)", err)


def test_version(capsys):
    from fa3verify import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"fa3verify {__version__}"


def _help_examples():
    """Every `fa3verify ...` example line of every subcommand's help (epilog), as printed."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    out = []
    for name, p in sub.choices.items():
        for line in (p.epilog or "").splitlines() + (p.description or "").splitlines():
            line = line.split("#")[0].split(" > ")[0].strip()  # comments and shell redirections
            m = re.search(r"fa3verify (\S.*)$", line)
            if m and not line.endswith("\\") and "torchrun" not in line and ";" not in line:
                out.append((name, m.group(1).strip()))
    return out


@pytest.mark.parametrize("command,example", _help_examples())
def test_help_examples_parse_and_name_only_known_things(command, example, capsys):
    """Each help example parses; the names it gives (theorems, assumptions, guards) are accepted."""
    from fa3verify.commands.prove import check_assumptions, check_only
    from fa3verify.validation import check_args

    argv = shlex.split(example)
    args = build_parser().parse_args(argv)
    if getattr(args, "device", None) in (None, "cpu"):  # cuda examples need a GPU
        check_args(args)
    if argv[0] == "prove":
        check_only(args.only)
        check_assumptions(args.drop_assumption)
