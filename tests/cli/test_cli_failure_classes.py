"""Failure classes of the command line beyond the first ones (each with the defect it catches)."""

import json
import os
import time
from pathlib import Path

import pytest

from fa3verify.cli import main

REPO = Path(__file__).resolve().parents[2]
WORLD_ONE_CASE = REPO / "tests" / "corpus" / "catalogue-04-graph-split-count-at-capture.json"


@pytest.mark.parametrize("budget,cases", [(float("nan"), None), (float("inf"), None), (-1.0, None), (None, None),
                                          (None, 0)])
def test_a_fuzz_campaign_is_always_bounded(budget, cases):
    """API callers too: a NaN budget would never be reached (class 3)."""
    from fa3verify.commands.fuzz import run_campaign
    from fa3verify.policy import load_policy

    with pytest.raises(ValueError, match="budget_s|max_cases"):
        run_campaign(load_policy("fixed"), kernel=None, budget_s=budget, max_cases=cases)


def test_a_failed_report_write_keeps_the_previous_report(tmp_path, monkeypatch):
    """Reports are written through a temporary file and a rename (class 4)."""
    import fa3verify.summary as summary_mod

    path = tmp_path / "run.json"
    path.write_text("previous report")

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(summary_mod.os, "replace", broken)
    with pytest.raises(OSError):
        summary_mod.write_json(summary_mod.RunSummary(command="prove"), str(path))
    assert path.read_text() == "previous report"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_under_torchrun_an_earlier_runs_verdict_is_never_read_as_this_ones(tmp_path, monkeypatch, capsys):
    """A rank 0 that finds only a stale verdict-0.json says inconclusive, not pass (class 1)."""
    import gpu_impl.distributed as distributed

    out = tmp_path / "ranks"
    out.mkdir()
    stale = out / "verdict-0.json"
    stale.write_text(json.dumps({"outcome": "pass", "findings": []}))
    old = time.time() - 3600
    os.utime(stale, (old, old))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(distributed, "torchrun_main", lambda *a, **k: None)
    assert main(["run-ranks", str(WORLD_ONE_CASE), "--out-dir", str(out), "--metadata-only"]) == 3
    assert "no verdict written by this run" in capsys.readouterr().out


def test_an_unexpected_error_is_inconclusive_never_pass_or_violation(monkeypatch, capsys):
    """A crash is exit 3 with one line, not a traceback read as exit 1 (class 1/2)."""
    import fa3verify.commands.invariants as inv

    def crash(args):
        raise RuntimeError("seeded crash")

    monkeypatch.setattr(inv, "run", crash)
    from fa3verify.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["invariants"])
    args.func = crash
    monkeypatch.setattr("fa3verify.cli.build_parser", lambda: _Fixed(parser, args))
    assert main(["invariants"]) == 3
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: seeded crash" in err and "Traceback" not in err


class _Fixed:
    def __init__(self, parser, args):
        self.parser, self.args = parser, args

    def parse_args(self, argv):
        return self.args

    def print_help(self):
        self.parser.print_help()


def test_z3_does_not_swallow_sigint():
    """z3's own Ctrl-C handler would turn an interrupt into "unknown" and let prove run on (class 4)."""
    import z3

    import spec.theorems.symbolic  # noqa: F401 - sets the parameter at import

    assert z3.get_param("ctrl_c") == "false"


def test_guard_results_are_bools_in_process_too():
    """A callable guard handed to the engines directly (not a spec) is held to the same rule (class 1)."""
    from types import SimpleNamespace

    from spec.model.guards import GuardRaised, evaluate_guard

    with pytest.raises(GuardRaised, match="not a bool"):
        evaluate_guard(lambda a: "False", SimpleNamespace())
    assert evaluate_guard(lambda a: False, SimpleNamespace()) is False


def test_saving_a_case_never_follows_a_planted_symlink(tmp_path):
    """A dangling symlink at a case file's name must not make the writer create its target (class 4)."""
    from spec.model.cases import Case

    data = json.loads((REPO / "tests" / "corpus" / "worked_example_prefix_guard.json").read_text())
    case = Case.from_dict(data)
    first = case.save(tmp_path / "cases")
    first.unlink()
    target = tmp_path / "elsewhere.json"
    os.symlink(target, first)
    assert case.save(tmp_path / "cases") == first
    assert not target.exists()


def test_a_forked_worker_gets_its_own_guard_process(tmp_path):
    """A guard loaded before a fork must not share its pipes with the forked worker (class 1: crossed answers)."""
    from types import SimpleNamespace

    from spec.model.guards import evaluate_guard, load_guard

    path = tmp_path / "g.py"
    path.write_text("def g(a):\n    return bool(a.enable_dp_attention)\n")
    guard = load_guard(f"{path}:g")
    assert evaluate_guard(guard, SimpleNamespace(enable_dp_attention=True)) is True
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forked worker uses the inherited object directly, as a fork-based pool does
        try:
            answer = evaluate_guard(guard, SimpleNamespace(enable_dp_attention=False))
            os.write(write_end, (b"F" if answer is False else b"T") + str(guard._proc.pid).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    reply = os.read(read_end, 64).decode()
    assert reply[0] == "F"
    assert int(reply[1:]) != guard._proc.pid, "the worker talked to the parent's guard process"
    assert evaluate_guard(guard, SimpleNamespace(enable_dp_attention=True)) is True
