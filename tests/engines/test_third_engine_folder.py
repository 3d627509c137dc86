"""A third engine is one folder and one registry line: the recorded engine (tests/third_engine/: its plugin, its
system under test, its data, and engine_forms.json's one row) registered from outside, driven by every command
through the one plugin interface. No file of fa3verify, gpu_impl or spec names it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "tests" / "third_engine"
FORMS = FOLDER / "engine_forms.json"
LOG = FOLDER / "recorded_log.json"
ENGINE = f"recorded={LOG}"


@pytest.fixture()
def registered():
    from gpu_impl.sut import register_forms, unregister_forms

    kinds = register_forms(FORMS)
    yield kinds
    unregister_forms(kinds)


def cli(argv, capsys):
    from fa3verify.cli import main

    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_the_folder_and_one_row_are_the_whole_engine(registered):
    rows = json.loads(FORMS.read_text())["forms"]
    assert registered == ["recorded"] and len(rows) == 1
    named = [p.relative_to(ROOT).as_posix() for pkg in ("fa3verify", "gpu_impl", "spec")
             for p in (ROOT / pkg).rglob("*") if p.is_file() and p.suffix in (".py", ".json")
             and ("third_engine" in p.read_text() or "RecordedPlugin" in p.read_text())]
    assert named == []


def test_fuzz_replay_and_gate_drive_it_through_its_plugin(registered, tmp_path, capsys):
    rc, out = cli(["fuzz", "--engine", ENGINE, "--cases", "12", "--seed", "0", "--cases-dir", str(tmp_path / "c")],
                  capsys)
    assert rc == 1, out
    case = sorted((tmp_path / "c").glob("fuzz-split-bound-*.json"))[0]
    data = json.loads(case.read_text())
    assert data["engine"] == {"name": "recorded", "path": str(LOG)} and data["expected"]["invariant"] == "SPLIT_BOUND"
    rc, out = cli(["replay", str(case)], capsys)  # found on code the command line must name
    assert rc == 2 and f"pass --engine {ENGINE}" in out, out
    rc, out = cli(["replay", str(case), "--engine", ENGINE], capsys)
    assert rc == 1 and f"on {ENGINE}" in out, out
    rc, out = cli(["fuzz", "--engine", ENGINE, "--guard", "pre-fix", "--cases", "1"], capsys)
    assert rc == 2 and f"--guard: does not apply to --engine {ENGINE}" in out, out


def test_negative_control_unregistered_it_is_an_unknown_engine_and_its_cases_do_not_load(tmp_path, capsys):
    rc, out = cli(["fuzz", "--engine", ENGINE, "--cases", "1"], capsys)
    assert rc == 2 and "unknown engine" in out, out
    from spec.model.cases import CaseFormatError, _check_engine

    with pytest.raises(CaseFormatError, match="engine.name"):
        _check_engine({"name": "recorded", "path": str(LOG)})


def test_the_forms_variable_registers_it_for_a_new_process(tmp_path):
    env = {**os.environ, "FA3VERIFY_ENGINE_FORMS": str(FORMS)}
    proc = subprocess.run([sys.executable, "-m", "fa3verify", "fuzz", "--engine", ENGINE, "--cases", "12", "--seed",
                           "0", "--cases-dir", str(tmp_path / "c")], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
