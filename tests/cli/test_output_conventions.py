"""Output conventions: `-` is stdout, special files are written through, reports follow the umask, one
name for the case folder, a progress line per stage on stderr (fa3verify/outputs.py,
fa3verify/progress.py). Each convention has a negative control: the defect it replaced, caught by the same
predicate."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from fa3verify import cli
from fa3verify import outputs as output_writer
from fa3verify.outputs import write_output

from fake_engines import ProfileSUT, install

REPO = Path(__file__).resolve().parents[2]
FUZZ = ["fuzz", "--guard", "pre-fix", "--cases", "30", "--seed", "0"]


def _child(*argv, cwd=None, timeout=300):
    """The command line in a child process, stdout and stderr captured through pipes (real file descriptors)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "fa3verify", *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout, proc.stderr


def _naive_atomic(path: str, text: str) -> None:
    """The writer these conventions replaced (mkstemp + rename, for any path): the negative controls' defect."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)))
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _is_json_alone(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


# -- `-` is standard output --------------------------------------------------------------------------------------

def test_json_dash_writes_the_report_alone_to_stdout_and_the_rest_to_stderr(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main([*FUZZ, "--cases-dir", "cases", "--json", "-"]) == 1
    out, err = capsys.readouterr()
    assert _is_json_alone(out) and json.loads(out)["schema"] == "fa3verify.run/1"
    assert "verdict: FAIL" in err and "fa3verify fuzz: fuzz" in err
    assert not (tmp_path / "-").exists()  # today's defect: a file named '-'


def test_negative_control_without_the_stdout_reservation_stdout_is_not_json(tmp_path, capsys, monkeypatch):
    import contextlib

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(output_writer, "stdout_reserved_for", lambda paths: contextlib.nullcontext())
    assert cli.main([*FUZZ, "--cases-dir", "cases", "--json", "-"]) == 1
    assert not _is_json_alone(capsys.readouterr().out)  # the table shares stdout: the predicate catches it


def test_junit_dash_and_a_dev_stdout_link_in_a_child_process(tmp_path):
    link = tmp_path / "out.xml"
    link.symlink_to("/dev/stdout")
    rc, out, err = _child(*FUZZ, "--cases-dir", str(tmp_path / "c"), "--junit", str(link))
    assert rc == 1
    assert out.startswith("<?xml") and "<testsuite" in out and "verdict: FAIL" in err
    assert link.is_symlink() and os.readlink(link) == "/dev/stdout"  # written through, never replaced
    rc, out, err = _child(*FUZZ, "--cases-dir", str(tmp_path / "c"), "--junit", "-", "--json", str(tmp_path / "r.json"))
    assert rc == 1 and out.startswith("<?xml") and json.loads((tmp_path / "r.json").read_text())["exit_code"] == 1


def test_two_outputs_on_stdout_and_a_dash_folder_are_exit_2(tmp_path, capsys):
    assert cli.main([*FUZZ, "--json", "-", "--junit", "-"]) == 2
    assert "standard output" in capsys.readouterr().err
    assert cli.main([*FUZZ, "--cases-dir", "-"]) == 2
    assert "--cases-dir: '-' (standard output) names no folder" in capsys.readouterr().err


# -- special files are written through ---------------------------------------------------------------------------

def test_a_symlink_to_a_character_device_stays_a_symlink(tmp_path):
    link = tmp_path / "null.json"
    link.symlink_to(os.devnull)
    write_output(str(link), "{}\n")
    assert link.is_symlink() and stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_negative_control_the_old_writer_replaces_the_symlink(tmp_path):
    link = tmp_path / "null.json"
    link.symlink_to(os.devnull)
    _naive_atomic(str(link), "{}\n")
    assert not link.is_symlink()  # the predicate above catches the defect


def test_a_symlink_to_a_regular_file_keeps_the_link_and_updates_its_target(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target.name)
    write_output(str(link), "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    assert not list(tmp_path.glob(".fa3verify-*"))  # no temporary file left behind


def test_a_fifo_is_written_through_to_its_reader(tmp_path, monkeypatch):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, encoding="utf-8").read()), daemon=True)
    reader.start()
    monkeypatch.chdir(tmp_path)
    assert cli.main([*FUZZ, "--cases-dir", "cases", "--json", str(fifo)]) == 1
    reader.join(timeout=60)
    assert not reader.is_alive()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and json.loads(got[0])["exit_code"] == 1


def test_a_fifo_nobody_reads_ends_within_its_deadline_and_names_the_option(tmp_path, monkeypatch):
    from fa3verify.errors import UsageError

    fifo = tmp_path / "nobody.fifo"
    os.mkfifo(fifo)
    monkeypatch.setattr(output_writer, "FIFO_WAIT_S", 0.2)
    with pytest.raises(UsageError, match="--json: .* FIFO that no process opened for reading"):
        write_output(str(fifo), "{}", "--json")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_socket_is_refused_before_the_run(tmp_path, capsys):
    path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(path))
        assert cli.main([*FUZZ, "--json", str(path)]) == 2
        err = capsys.readouterr().err
        assert "--json:" in err and "is a socket" in err
    finally:
        sock.close()


def test_a_regular_report_is_still_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    path.write_text("previous report")

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        write_output(str(path), "new report")
    assert path.read_text() == "previous report" and not list(tmp_path.glob(".fa3verify-*"))


# -- the umask ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_reports_follow_the_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        for name in ("r.json", "r.xml"):
            write_output(str(tmp_path / name), "x")
            assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == mode
    finally:
        os.umask(old)


def test_negative_control_mkstemp_alone_gives_0600(tmp_path):
    old = os.umask(0o022)
    try:
        _naive_atomic(str(tmp_path / "r.json"), "x")
        assert stat.S_IMODE(os.stat(tmp_path / "r.json").st_mode) != 0o644
    finally:
        os.umask(old)


def test_every_report_of_a_run_gets_0644_under_umask_022(tmp_path, capsys):
    # in this process: the umask is the process's, which a child would inherit; the modes read the same
    old = os.umask(0o022)
    try:
        rc = cli.main([*FUZZ, "--cases-dir", str(tmp_path / "c"), "--json", str(tmp_path / "r.json"),
                       "--junit", str(tmp_path / "r.xml")])
        assert rc == 1, capsys.readouterr().err
        rc = cli.main(["report", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")])
        assert rc == 0, capsys.readouterr().err
    finally:
        os.umask(old)
    for name in ("r.json", "r.xml", "r.html"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o644, name


# -- one name for the case folder --------------------------------------------------------------------------------

def _options(command: list) -> set:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command[0]]
    for name in command[1:]:
        sub = next(a for a in sub._actions if a.dest == "engine_command").choices[name]
    return {s for a in sub._actions for s in a.option_strings}, sub.format_help()


@pytest.mark.parametrize("command", [["gate"], ["prove"], ["fuzz"], ["conform"], ["engine", "matrix"]])
def test_every_command_names_its_case_folder_cases_dir(command):
    options, _ = _options(command)
    assert "--cases-dir" in options


def test_fuzz_keeps_out_as_a_hidden_older_name(tmp_path, capsys):
    options, text = _options(["fuzz"])
    assert "--out" in options and "--out DIR" not in text.split("--cases-dir")[0]
    assert cli.main([*FUZZ, "--out", str(tmp_path / "old")]) == 1
    assert list((tmp_path / "old").glob("fuzz-*.json"))
    assert cli.main([*FUZZ, "--cases-dir", str(tmp_path / "new")]) == 1
    assert list((tmp_path / "new").glob("fuzz-*.json"))


def test_cases_dir_and_out_together_are_exit_2(tmp_path):
    with pytest.raises(SystemExit) as exc:
        cli.main([*FUZZ, "--cases-dir", str(tmp_path / "a"), "--out", str(tmp_path / "b")])
    assert exc.value.code == 2


# -- progress on stderr, engines included ------------------------------------------------------------------------

def _stage_lines(text: str, command: str) -> list:
    return [line for line in text.splitlines() if line.startswith(f"fa3verify {command}: ")]


def test_gate_on_an_engine_prints_a_line_per_stage_on_stderr_only(monkeypatch, tmp_path, capsys):
    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    code = cli.main(["gate", "--engine", "sglang==0.5.14", "--cases", "20", "--cases-dir", str(tmp_path),
                     "--json", "-"])
    assert code == 1
    out, err = capsys.readouterr()
    assert _is_json_alone(out)
    lines = _stage_lines(err, "gate")
    for stage in ("witness search", "witness replay on sglang==0.5.14", "fuzz on sglang==0.5.14"):
        assert any(stage in line and line.endswith("...") for line in lines), (stage, lines)
        assert any(stage in line and " done in " in line for line in lines), (stage, lines)


def test_negative_control_stage_lines_are_what_the_check_reads(monkeypatch, tmp_path, capsys):
    import fa3verify.progress as progress

    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    monkeypatch.setattr(progress, "log_lines_enabled", lambda show=None: False)  # the defect: no stage lines
    cli.main(["gate", "--engine", "sglang==0.5.14", "--cases", "5", "--cases-dir", str(tmp_path)])
    assert not _stage_lines(capsys.readouterr().err, "gate")


def test_a_stage_ended_by_an_error_says_stopped_and_only_a_ctrl_c_says_interrupted(monkeypatch, capsys):
    """The end line names how the stage ended: `done`, `interrupted` (a KeyboardInterrupt) or `stopped` (any other
    exception). Negative control: the line a usage error printed before (`interrupted`), read by the same check."""
    from fa3verify.progress import stage

    def ended(exc) -> str:
        try:
            with stage("prove", "z3 theorems", show=True):
                if exc is not None:
                    raise exc
        except BaseException:  # noqa: BLE001 - the outcome is what the line says
            pass
        [line] = [x for x in capsys.readouterr().err.splitlines() if not x.endswith("...")]
        return line.split("z3 theorems ", 1)[1].split(" in ", 1)[0]

    assert [ended(None), ended(KeyboardInterrupt()), ended(ValueError("bad"))] == ["done", "interrupted", "stopped"]
    # through the CLI: a bad deadline is a usage error (exit 2), and its stage line does not call it an interrupt
    monkeypatch.setenv("FA3VERIFY_THEOREM_PART_TIMEOUT", "nan")
    assert cli.main(["prove", "--only", "combine"]) == 2
    err = capsys.readouterr().err
    lines = _stage_lines(err, "prove")
    assert any(" stopped in " in line for line in lines) and not any(" interrupted" in line for line in lines), err
    before = "fa3verify prove: prove (z3 theorems) interrupted in 0.1s"  # the defect's line
    assert " interrupted" in before and " stopped in " not in before


def test_conform_and_the_engine_matrix_print_progress_on_stderr(monkeypatch, tmp_path, capsys):
    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    assert cli.main(["conform", "--engine", "sglang==0.5.23", "--cases", "30", "--cases-dir", str(tmp_path),
                     "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert _is_json_alone(out)
    assert any("conform 30 configurations" in line and "done in" in line for line in _stage_lines(err, "conform"))
    assert any("configurations drawn" in line for line in _stage_lines(err, "conform"))
    assert cli.main(["engine", "matrix", "--releases", "0.5.23", "--cases", "5", "--cases-dir", str(tmp_path / "m"),
                     "--no-probes", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert _is_json_alone(out)
    matrix = _stage_lines(err, "engine matrix")
    assert any("witness search done" in line for line in matrix) and any("0.5.23: pass" in line for line in matrix)
