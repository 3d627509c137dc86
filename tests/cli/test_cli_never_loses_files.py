"""Class 4: never a lost file. Outputs are checked before the run, never overwrite an input, and a run
deletes nothing it did not create; SIGINT writes what was found and exits 3."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fa3verify.cli import main
from interrupt_after import interrupt_after

REPO = Path(__file__).resolve().parents[2]
PREFIX_CASE = REPO / "tests" / "corpus" / "worked_example_prefix_guard.json"


@pytest.fixture
def case(tmp_path):
    path = tmp_path / "case.json"
    path.write_text(PREFIX_CASE.read_text())
    return path


@pytest.fixture
def guard(tmp_path):
    path = tmp_path / "guard.py"
    path.write_text("def g(a):\n    return bool(getattr(a, 'enable_dp_attention', False))\n")
    return path


def _summary(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"schema": "fa3verify.run/1", "command": "prove", "verdict": "pass", "exit_code": 0,
                                "cases": 0, "failures": 0, "elapsed_s": 1.0, "checks": [], "findings": []}))
    return path


@pytest.mark.parametrize("argv", [
    ["replay", "{case}", "--json", "{case}"],
    ["run-ranks", "{case}", "--json", "{case}"],
    ["fuzz", "--guard", "{guard}:g", "--json", "{guard}", "--cases", "1"],
    ["gate", "--guard", "{guard}:g", "--junit", "{guard}", "--cases", "1"],
    ["prove", "--guard", "{guard}:g", "--json", "{guard}"],
    ["report", "{run}", "--html", "{run}"],
])
def test_an_output_never_overwrites_the_runs_input(tmp_path, capsys, case, guard, argv):
    run = _summary(tmp_path)
    before = {p: p.read_bytes() for p in (case, guard, run)}
    argv = [a.format(case=case, guard=guard, run=run) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "never overwrites" in err and "Traceback" not in err
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize("option", ["--json", "--junit"])
@pytest.mark.parametrize("where", ["directory", "under_a_file", "same_as_other"])
def test_output_paths_are_checked_before_the_run(tmp_path, capsys, monkeypatch, option, where):
    import fa3verify.commands.gate as gating

    def never(*a, **k):
        raise AssertionError("the gate ran although an output path was bad")

    monkeypatch.setattr(gating, "gate", never)
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("keep me")
    path = {"directory": tmp_path / "adir", "under_a_file": tmp_path / "afile" / "x.xml",
            "same_as_other": tmp_path / "o.json"}[where]
    other = ["--junit" if option == "--json" else "--json", str(tmp_path / "o.json")]
    assert main(["gate", option, str(path), *other, "--cases", "1"]) == 2
    err = capsys.readouterr().err
    assert option in err or (where == "same_as_other" and "--" in err)
    assert (tmp_path / "afile").read_text() == "keep me"


@pytest.mark.parametrize("argv,flag", [
    (["fuzz", "--out", "{file}", "--cases", "1"], "--out"),
    (["prove", "--cases-dir", "{file}"], "--cases-dir"),
    (["gpu-check", "--dry-run", "--out", "{file}"], "--out"),
    (["run-ranks", str(PREFIX_CASE), "--out-dir", "{file}"], "--out-dir"),
    (["hazard-map", "--model", "llama-3-8b", "--sm", "132", "--out", "{dir}"], "--out"),
])
def test_a_folder_output_that_is_a_file_is_exit_2(tmp_path, capsys, argv, flag):
    (tmp_path / "afile").write_text("keep me")
    (tmp_path / "adir").mkdir()
    argv = [a.format(file=tmp_path / "afile", dir=tmp_path / "adir") for a in argv]
    assert main(argv) == 2
    assert flag in capsys.readouterr().err
    assert (tmp_path / "afile").read_text() == "keep me"


def test_run_ranks_never_deletes_files_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "ranks"
    out.mkdir()
    mine = out / "verdict-0.json"
    mine.write_text("my own notes")
    (out / "error-rank-1.json").write_text("also mine")
    assert main(["run-ranks", str(PREFIX_CASE), "--out-dir", str(out), "--metadata-only"]) == 2
    assert "--out-dir" in capsys.readouterr().err
    assert mine.read_text() == "my own notes" and (out / "error-rank-1.json").read_text() == "also mine"


def test_run_ranks_default_folder_moves_on_instead_of_cleaning(tmp_path, monkeypatch):
    from fa3verify.outputs import fresh_dir

    monkeypatch.chdir(tmp_path)
    base = Path("fa3verify-out/ranks")
    assert fresh_dir(str(base), ["verdict-*.json"]) == str(base)
    base.mkdir(parents=True)
    (base / "verdict-0.json").write_text("{}")
    assert fresh_dir(str(base), ["verdict-*.json"]) == str(base / "run-2")
    assert (base / "verdict-0.json").read_text() == "{}"


# -- interrupts --------------------------------------------------------------------------------------------------



def test_an_interrupted_fuzz_keeps_what_it_found_and_exits_3(tmp_path, capsys, monkeypatch):
    import fa3verify.commands.fuzz as fuzzing

    interrupt_after(monkeypatch, fuzzing, "evaluate", 40)
    out = tmp_path / "fuzz.json"
    # seed 0 meets the pre-fix guard's failure within its first 40 cases (fuzz --guard pre-fix --cases 40 --seed 0: 2)
    rc = main(["fuzz", "--guard", "pre-fix", "--cases", "100000", "--seed", "0", "--out", str(tmp_path / "cases"),
               "--json", str(out), "--junit", str(tmp_path / "fuzz.xml")])
    assert rc == 3
    summary = json.loads(out.read_text())
    assert summary["interrupted"] is True and summary["exit_code"] == 3 and 0 < summary["cases"] <= 40
    assert summary["findings"], "the failures found before the interrupt are reported"
    for f in summary["findings"]:
        assert Path(f["case_file"]).is_file()
    assert (tmp_path / "fuzz.xml").is_file()
    assert "Traceback" not in capsys.readouterr().err


def test_an_interrupted_gate_writes_its_summary_and_exits_3(tmp_path, capsys, monkeypatch):
    import fa3verify.commands.prove as proving

    interrupt_after(monkeypatch, proving, "theorem_results", 0)
    out = tmp_path / "gate.json"
    rc = main(["gate", "--cases", "5", "--cases-dir", str(tmp_path / "cases"), "--json", str(out)])
    assert rc == 3
    summary = json.loads(out.read_text())
    assert summary["interrupted"] is True and summary["verdict"] == "inconclusive"


def _run_and_interrupt(argv, wait_for: str, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # as from a terminal: a suite started in the background (`make test &`) has SIGINT ignored, and the child
    # would inherit that; the child gets the default disposition back, so Python turns SIGINT into KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-m", "fa3verify", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    for line in proc.stderr:  # the stage line printed on non-terminals says the run has started
        lines.append(line)
        if wait_for in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, "".join(lines) + err


def test_sigint_during_fuzz_exits_3_with_the_summary(tmp_path):
    rc, out, err = _run_and_interrupt(["fuzz", "--guard", "pre-fix", "--budget-s", "300", "--json", "f.json"],
                                      "fuzz (", tmp_path)
    assert rc == 3, (out, err)
    assert "Traceback" not in err
    assert json.loads((tmp_path / "f.json").read_text())["interrupted"] is True


def test_sigint_stops_prove(tmp_path):
    rc, out, err = _run_and_interrupt(["prove", "--json", "p.json"], "prove (", tmp_path)
    assert rc == 3, (out, err)
    assert "interrupted" in err and "Traceback" not in err
