"""Every output path of every subcommand is checked writable before any work (exit 2 naming the option and the
path), the default case folders included when the working directory is read-only; a write that still fails after
the verdict keeps the verdict's exit code (a PASS with a missing report is 3) and names the option and the path the
user gave, never a temporary file (fa3verify/outputs.py).

The suite runs as root, where permission bits stop nothing: the unwritable places are a folder under /proc (no
file can be created there), a path under a regular file, and a path that is a folder."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from fa3verify import cli, outputs as output_writer

REPO = Path(__file__).resolve().parents[2]
CASE = REPO / "tests" / "corpus" / "worked_example_prefix_guard.json"
#: a folder no process can create files in, root included
UNWRITABLE = "/proc/fa3verify-no-such-folder"


def _summary_file(tmp_path) -> Path:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"schema": "fa3verify.run/1", "command": "prove", "verdict": "pass", "exit_code": 0,
                                "cases": 0, "failures": 0, "elapsed_s": 1.0, "checks": [], "findings": []}))
    return path


#: (argv before the option, option, "file" or "dir"): every output option of every subcommand
OPTIONS = [
    (["check"], "--json", "file"), (["check"], "--junit", "file"),
    (["prove"], "--json", "file"), (["prove"], "--junit", "file"), (["prove"], "--cases-dir", "dir"),
    (["fuzz", "--cases", "1"], "--json", "file"), (["fuzz", "--cases", "1"], "--junit", "file"),
    (["fuzz", "--cases", "1"], "--cases-dir", "dir"), (["fuzz", "--cases", "1"], "--out", "dir"),
    (["gate", "--cases", "1"], "--json", "file"), (["gate", "--cases", "1"], "--junit", "file"),
    (["gate", "--cases", "1"], "--cases-dir", "dir"),
    (["replay", str(CASE)], "--json", "file"),
    (["bench"], "--json", "file"), (["bench"], "--markdown", "file"),
    (["catalogue"], "--json", "file"), (["catalogue"], "--cases-dir", "dir"),
    (["catalogue"], "--write-corpus", "dir"), (["catalogue"], "--write-docs", "file"),
    (["hazard-map", "--model", "llama-3-8b", "--sm", "132", "--out", "{tmp}/map.png"], "--json", "file"),
    (["hazard-map", "--model", "llama-3-8b", "--sm", "132"], "--out", "file"),
    (["report", "{run}"], "--html", "file"), (["report", "{run}"], "--markdown", "file"),
    (["report", "merge", "{run}"], "--json", "file"), (["report", "merge", "{run}"], "--junit", "file"),
    (["run-ranks", str(CASE)], "--json", "file"), (["run-ranks", str(CASE)], "--out-dir", "dir"),
    (["conform", "--cases", "1"], "--json", "file"), (["conform", "--cases", "1"], "--cases-dir", "dir"),
    (["engine", "matrix", "--cases", "1"], "--json", "file"),
    (["engine", "matrix", "--cases", "1"], "--cases-dir", "dir"),
    (["gpu-check", "--dry-run"], "--out", "dir"),
]


@pytest.fixture
def no_work(monkeypatch):
    """The command's own work replaced by a failure: an exit 2 from main proves the check came first."""
    real = cli.build_parser
    ran = []

    def never(args):
        ran.append(args.command)
        raise AssertionError("the command ran although an output path was unwritable")

    def build():
        parser = real()
        parse = parser.parse_args

        def parse_and_stub(argv=None, namespace=None):
            args = parse(argv, namespace)
            args.func = never
            return args

        parser.parse_args = parse_and_stub
        return parser

    monkeypatch.setattr(cli, "build_parser", build)
    return ran


def _argv(prefix, tmp_path, run):
    return [a.format(tmp=tmp_path, run=run) for a in prefix]


#: every option with every unwritable place it can be given (a folder is what a folder option names)
CASES = [pytest.param(prefix, option, kind, where, id=f"{' '.join(prefix)} {option} {where}")
         for prefix, option, kind in OPTIONS for where in ("unwritable_folder", "under_a_file", "a_folder")
         if not (where == "a_folder" and kind == "dir")]


@pytest.mark.parametrize("prefix,option,kind,where", CASES)
def test_every_output_option_is_checked_writable_before_the_work(tmp_path, capsys, no_work, prefix, option, kind,
                                                                 where):
    run = _summary_file(tmp_path)
    (tmp_path / "afile").write_text("keep me")
    (tmp_path / "adir").mkdir()
    name = "out.png" if option == "--out" and kind == "file" else ("out" if kind == "dir" else "out.json")
    path = {"unwritable_folder": f"{UNWRITABLE}/{name}", "under_a_file": f"{tmp_path}/afile/{name}",
            "a_folder": f"{tmp_path}/adir"}[where]
    assert cli.main([*_argv(prefix, tmp_path, run), option, path]) == 2
    err = capsys.readouterr().err
    assert f"{option}: " in err and path in err, err
    assert ".tmp" not in err and "Traceback" not in err and not no_work
    assert (tmp_path / "afile").read_text() == "keep me"


def test_the_old_gate_case_a_read_only_json_folder_is_exit_2_naming_the_option(capsys, no_work):
    """`gate --guard pre-fix --json <unwritable>/gate.json` ran the whole gate, printed FAIL, then ended in an
    internal error naming a temporary file (exit 3)."""
    assert cli.main(["gate", "--guard", "pre-fix", "--json", f"{UNWRITABLE}/gate.json"]) == 2
    err = capsys.readouterr().err
    assert f"--json: cannot write {UNWRITABLE}/gate.json" in err and not no_work


@pytest.mark.parametrize("argv,option", [
    (["gate", "--cases", "1"], "--cases-dir"), (["prove"], "--cases-dir"), (["fuzz", "--cases", "1"], "--cases-dir"),
    (["conform", "--cases", "1"], "--cases-dir"), (["catalogue"], "--cases-dir"),
    (["engine", "matrix", "--cases", "1"], "--cases-dir"), (["gpu-check", "--dry-run"], "--out"),
    (["run-ranks", str(CASE)], "--out-dir"),
])
def test_a_default_folder_in_a_read_only_working_directory_is_exit_2_before_the_work(monkeypatch, capsys, no_work,
                                                                                     argv, option):
    monkeypatch.chdir("/proc")  # no file can be created here, root included
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{option}: cannot write fa3verify-out/" in err and "the working directory" in err, err
    assert not no_work


def test_a_writable_output_leaves_no_probe_file_behind(tmp_path, capsys):
    out = tmp_path / "reports"
    out.mkdir()
    assert cli.main(["report", str(_summary_file(tmp_path)), "--markdown", str(out / "s.md")]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["s.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports", "run.json"]


# -- a write that fails after the verdict ---------------------------------------------------------------------------

FUZZ_FAIL = ["fuzz", "--guard", "pre-fix", "--cases", "30", "--seed", "0"]
FUZZ_PASS = ["fuzz", "--cases", "3", "--seed", "0"]


def _fail_writes_to(monkeypatch, *names):
    """The writer refuses the paths ending in ``names`` (a full disk after the up-front check), as the system would:
    an OSError naming the temporary file it was writing."""
    real = output_writer._write_output

    def refusing(path, raw, field):
        if any(str(path).endswith(n) for n in names):
            raise OSError(errno.ENOSPC, "No space left on device", os.path.join(os.path.dirname(path),
                                                                                ".fa3verify-abc123.tmp"))
        return real(path, raw, field)

    monkeypatch.setattr(output_writer, "_write_output", refusing)


def test_a_fail_whose_json_cannot_be_written_stays_exit_1_and_names_the_option(tmp_path, capsys, monkeypatch):
    _fail_writes_to(monkeypatch, "gate.json")
    json_path, junit_path = tmp_path / "gate.json", tmp_path / "gate.xml"
    rc = cli.main([*FUZZ_FAIL, "--cases-dir", str(tmp_path / "cases"), "--json", str(json_path),
                   "--junit", str(junit_path)])
    out, err = capsys.readouterr()
    assert rc == 1, err
    assert f"--json: {json_path} was not written: No space left on device" in err
    assert "the verdict FAIL stands (exit 1)" in err and ".tmp" not in err and "internal error" not in err
    assert junit_path.exists() and not json_path.exists()  # the other report is still written


def test_a_pass_whose_junit_cannot_be_written_is_not_a_clean_pass(tmp_path, capsys, monkeypatch):
    _fail_writes_to(monkeypatch, "run.xml")
    junit_path = tmp_path / "run.xml"
    rc = cli.main([*FUZZ_PASS, "--cases-dir", str(tmp_path / "cases"), "--junit", str(junit_path)])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert f"--junit: {junit_path} was not written" in err and "the verdict was PASS" in err
    assert ".tmp" not in err


def test_negative_control_the_same_runs_with_a_working_writer_exit_1_and_0(tmp_path, capsys):
    assert cli.main([*FUZZ_FAIL, "--cases-dir", str(tmp_path / "c1"), "--json", str(tmp_path / "a.json")]) == 1
    assert cli.main([*FUZZ_PASS, "--cases-dir", str(tmp_path / "c2"), "--junit", str(tmp_path / "b.xml")]) == 0
    assert "was not written" not in capsys.readouterr().err


def test_a_report_page_that_cannot_be_written_is_exit_3_naming_the_option(tmp_path, capsys, monkeypatch):
    _fail_writes_to(monkeypatch, "page.html")
    rc = cli.main(["report", str(_summary_file(tmp_path)), "--html", str(tmp_path / "page.html")])
    err = capsys.readouterr().err
    assert rc == 3 and f"--html: {tmp_path / 'page.html'} was not written" in err and ".tmp" not in err


@pytest.mark.parametrize("rc,expected", [(0, 3), (1, 1), (3, 3)])
def test_deliver_keeps_the_verdict_and_turns_only_a_pass_into_3(capsys, rc, expected):
    def refuse():
        raise output_writer.OutputNotWritten("--json", "x.json", "read-only file system")

    written = []
    assert output_writer.deliver(rc, [("--json", "x.json", refuse),
                                      ("--junit", "x.xml", lambda: written.append(1)),
                                      ("--markdown", None, refuse)], "gate") == expected
    assert written == [1]
    err = capsys.readouterr().err
    assert "fa3verify gate: error: --json: x.json was not written: read-only file system" in err
