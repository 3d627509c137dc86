"""A third engine needs only a SUT module plus data: ``--engine sut=MODULE:CLASS`` through the generic registry.

The system under test here (tests/third_engine/recorded_sut.py) answers from a recorded FA3 event log with one
seeded defect (its configuration llama-3.2-1b/tp8/cp8+pcp answers as under the pre-fix guard): fuzz and gate must
find it (exit 1), a case found on it replays on it only when ``--engine`` names it again (exit 2 otherwise, with
the command to type), a scenario its log does not hold is unsupported (never a pass), and conform compares it with
the profile it says it conforms to and finds the defect (a system naming no profile: exit 2 naming
--engine-profile). No file of the harness or of gpu_impl names it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGET = "third_engine.recorded_sut:RecordedSUT"
ENGINE = f"sut={TARGET}"


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests"))


def cli(argv, capsys):
    from fa3verify.cli import main

    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out + out.err


def fuzz_case(tmp_path, capsys) -> Path:
    rc, out = cli(["fuzz", "--engine", ENGINE, "--cases", "12", "--seed", "0", "--cases-dir", str(tmp_path / "c")],
                  capsys)
    assert rc == 1, out
    files = sorted((tmp_path / "c").glob("fuzz-split-bound-*.json"))
    assert files, out
    return files[0]


def test_fuzz_finds_the_seeded_defect_and_the_case_records_the_engine(tmp_path, capsys):
    case = fuzz_case(tmp_path, capsys)
    data = json.loads(case.read_text())
    assert data["engine"] == {"name": "sut", "target": TARGET}
    assert data["server"]["attn_cp_size"] == 8 and data["expected"]["invariant"] == "SPLIT_BOUND"
    assert data["policy"]["guard"] == "fixed"  # the harness's policy; the engine's own code decided


def test_gate_finds_the_seeded_defect_on_it(tmp_path, capsys):
    rc, out = cli(["gate", "--engine", ENGINE, "--cases", "12", "--seed", "0", "--cases-dir", str(tmp_path / "g")],
                  capsys)
    assert rc == 1, out
    assert f"fuzz on {ENGINE}" in out and "SPLIT_BOUND: llama-3.2-1b/tp8/cp8+pcp" in out
    assert f"witness replay on {ENGINE} done" in out and "(1 rows, 0 failed)" in out


def test_a_case_found_on_it_replays_only_when_named(tmp_path, capsys):
    case = fuzz_case(tmp_path, capsys)
    rc, out = cli(["replay", str(case)], capsys)
    assert rc == 2, out
    assert f"the case was found on the system under test {TARGET}" in out and f"pass --engine {ENGINE}" in out
    rc, out = cli(["replay", str(case), "--engine", ENGINE], capsys)
    assert rc == 1, out
    assert "SPLIT_BOUND" in out and f"on {ENGINE}" in out


def test_an_unrecorded_scenario_is_unsupported_never_a_pass(capsys):
    rc, out = cli(["replay", str(ROOT / "tests/corpus/worked_example_prefix_guard.json"), "--engine", ENGINE],
                  capsys)
    assert rc == 2, out
    assert "is not in its recorded log" in out and "cannot run this case" in out


@pytest.mark.parametrize("profile_option", [[], ["--engine-profile", "sglang==0.5.15"]])
def test_conform_compares_it_with_the_profile_it_names_and_finds_the_seeded_defect(tmp_path, capsys,
                                                                                   profile_option):
    """conform asks the system what it conforms to (its conformance_profile(): sglang 0.5.15, which its log was
    recorded under) and draws from its own domain; its FA3 events are compared (none reads "event only in the
    model"), the clean configurations agree and every difference is on the defective configuration."""
    defective = json.loads((ROOT / "tests/third_engine/configurations.json").read_text())["defective"]
    report = tmp_path / "conform.json"
    rc, out = cli(["conform", "--engine", ENGINE, *profile_option, "--cases", "12", "--seed", "0",
                   "--cases-dir", str(tmp_path / "k"), "--json", str(report)], capsys)
    assert rc == 1, out
    assert "profile: sglang 0.5.15" in out and "event only in the model" not in out
    counts = json.loads(report.read_text())["conform"]
    assert counts["compared"] == 12 and counts["events_compared"] > 0, counts
    assert 0 < len(counts["differences"]) < counts["compared"], counts
    for path in (tmp_path / "k").glob("conform-*.json"):
        case = json.loads(path.read_text())
        assert [{"server": case["server"], "model": case["model"]}] == defective, path


def test_conform_on_a_system_that_names_no_profile_is_a_usage_error(tmp_path, capsys):
    engine = "sut=third_engine.recorded_sut:UnprofiledRecordedSUT"
    rc, out = cli(["conform", "--engine", engine, "--cases", "3", "--cases-dir", str(tmp_path / "k")], capsys)
    assert rc == 2, out
    assert "--engine-profile" in out and f"{engine} names no release" in out


@pytest.mark.parametrize("engine, words", [
    ("sut=os.path:join", "os.path.join is not a SystemUnderTest subclass"),
    ("sut=no_such_module_here:X", "cannot import module 'no_such_module_here'"),
    ("sut=justamodule", "want sut=MODULE:CLASS"),
    ("sut=", "needs a value"),
    (f"sut={TARGET}@/", "RecordedSUT('/') failed: IsADirectoryError"),
])
def test_a_bad_named_engine_is_a_usage_error_naming_engine(tmp_path, capsys, engine, words):
    rc, out = cli(["fuzz", "--engine", engine, "--cases", "1", "--cases-dir", str(tmp_path / "c")], capsys)
    assert rc == 2, out
    assert "--engine" in out and words in out and "Traceback" not in out


def test_model_policy_options_do_not_apply_to_it(tmp_path, capsys):
    rc, out = cli(["fuzz", "--engine", ENGINE, "--guard", "pre-fix", "--cases", "1", "--cases-dir",
                   str(tmp_path / "c")], capsys)
    assert rc == 2 and f"--guard: does not apply to --engine {ENGINE}" in out, out


def test_the_harness_never_names_it():
    """Only the generic registry form runs it: no file of fa3verify/ or gpu_impl/ mentions the test SUT."""
    for word in ("recorded_sut", "RecordedSUT", "third_engine"):
        found = subprocess.run(["grep", "-rl", word, "fa3verify", "gpu_impl"], cwd=ROOT, capture_output=True,
                               text=True)
        assert found.returncode == 1 and not found.stdout, found.stdout


def test_an_empty_log_is_inconclusive_never_a_pass(tmp_path, capsys):
    rc, out = cli(["fuzz", "--engine", f"{ENGINE}@{tmp_path / 'none.json'}", "--cases", "4", "--cases-dir",
                   str(tmp_path / "c")], capsys)
    assert rc == 3, out
    assert "INCONCLUSIVE" in out
