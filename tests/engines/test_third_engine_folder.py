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


def test_an_engine_from_outside_owns_its_case_options_schema(tmp_path):
    """Case options are the engine's own: a plugin registered from outside (one folder, one forms row) files them
    under its key and validates them with its schema; spec, which reads case files, is not touched. Unregistered,
    a case carrying them is refused naming the field (negative control)."""
    from gpu_impl.sut import register_forms, unregister_forms
    from spec.model.cases import Case, CaseFormatError

    folder = tmp_path / "toy_engine"
    folder.mkdir()
    (folder / "plugin.py").write_text(
        "from gpu_impl.plugin import EnginePlugin\n"
        "from spec.model.case_bounds import CaseFormatError\n\n\n"
        "class ToyPlugin(EnginePlugin):\n"
        "    options_key = 'toy'\n\n"
        "    def check_options(self, value, server, path):\n"
        "        if not isinstance(value, dict) or set(value) - {'lanes'} or value.get('lanes', 1) not in (1, 2, 4):\n"
        "            raise CaseFormatError(path, \"an object {'lanes': 1, 2 or 4}\", value)\n"
        "        return dict(value)\n")
    forms = folder / "engine_forms.json"
    forms.write_text(json.dumps({"forms": [{"kind": "toy", "prefix": "toy=", "takes": "path",
                                            "plugin": "toy_engine.plugin:ToyPlugin", "path": "..", "what": "a file",
                                            "example": "toy=PATH", "help": "'toy=PATH' (a toy)"}]}))
    data = {"schema": "fa3verify.case/1", "id": "x", "source": "manual",
            "server": {"tp_size": 1, "dp_size": 1, "attn_cp_size": 1, "enable_dp_attention": False,
                       "enable_prefill_cp": False},
            "model": {"name": "m", "num_heads": 8, "num_kv_heads": 8, "head_dim": 128},
            "policy": {"guard": "fixed", "metadata_heads": "tp", "clear_stale_cp_metadata": True},
            "batches": [{"mode": "decode", "seq_lens": [5]}],
            "expected": {"outcome": "pass", "invariant": None, "detail": {}}, "options": {"toy": {"lanes": 2}}}
    kinds = register_forms(forms)
    try:
        assert Case.from_dict(data).options == {"toy": {"lanes": 2}}
        with pytest.raises(CaseFormatError, match=r"^options\.toy: expected an object"):
            Case.from_dict({**data, "options": {"toy": {"lanes": 3}}})
    finally:
        unregister_forms(kinds)
    with pytest.raises(CaseFormatError, match=r"^options\.toy: expected the options of an engine"):
        Case.from_dict(data)
