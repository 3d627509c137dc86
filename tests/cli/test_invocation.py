"""The replay lines the tool prints run as typed in the shell the tool was started from
(``fa3verify.invocation``): the script's path as typed when ``fa3verify`` on PATH is not that script, ``fa3verify``
when it is, ``PYTHON -m fa3verify`` under ``-m``; in-process callers get ``fa3verify``."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fa3verify import invocation

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "fa3verify"


def _script(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "fa3verify"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_words_follow_how_the_tool_was_started(tmp_path, monkeypatch):
    mine = _script(tmp_path / "venv" / "bin")
    other = _script(tmp_path / "elsewhere" / "bin")
    monkeypatch.chdir(tmp_path)
    # typed as a path, and PATH has no fa3verify (or another one): the path as typed
    assert invocation.command_words("venv/bin/fa3verify", path=str(tmp_path / "none")) == ["venv/bin/fa3verify"]
    assert invocation.command_words("venv/bin/fa3verify", path=str(other.parent)) == ["venv/bin/fa3verify"]
    # PATH finds this same script (an activated environment): the bare name
    assert invocation.command_words(str(mine), path=str(mine.parent)) == ["fa3verify"]
    # in-process (nothing recorded): the bare name
    assert invocation.command_words("", path=str(other.parent)) == ["fa3verify"]
    # python -m fa3verify
    main_py = str(ROOT / "fa3verify" / "__main__.py")
    assert invocation.command_words(main_py, path=str(tmp_path / "none")) == [sys.executable, "-m", "fa3verify"]


def _replay_lines(out: str) -> list:
    return [ln.strip()[len("replay: "):] for ln in out.splitlines() if ln.strip().startswith("replay: ")]


@pytest.mark.skipif(not SCRIPT.is_file(), reason="no fa3verify console script beside this interpreter (make setup)")
@pytest.mark.parametrize("activated", [False, True])
def test_a_printed_replay_line_runs_as_typed_in_the_same_shell(tmp_path, activated):
    """The script started by a relative path (as the README's `.venv/bin/fa3verify`), PATH without it: the line
    names that path and runs; with the environment's bin on PATH (activated): the line is `fa3verify replay ...`
    and runs. Negative control: the bare line, where PATH has no fa3verify, is not found (127)."""
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(SCRIPT.parent.parent, work / "env")  # the checkout's .venv, reached by a relative path
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not (Path(p) / "fa3verify").exists())
    if activated:
        path = f"{work / 'env' / 'bin'}{os.pathsep}{path}"
    env = {**os.environ, "PATH": path}
    typed = "fa3verify" if activated else "env/bin/fa3verify"
    proc = subprocess.run(["bash", "-c", f"{typed} fuzz --guard pre-fix --cases 60 --out cases"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = _replay_lines(proc.stdout)
    assert lines and all(shlex.split(line)[:2] == [typed, "replay"] for line in lines), lines
    replay = subprocess.run(["bash", "-c", lines[0]], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert replay.returncode == 1 and "STILL FAILS" in replay.stdout, replay.stdout[-2000:] + replay.stderr
    if not activated:
        bare = shlex.join(["fa3verify", *shlex.split(lines[0])[1:]])
        assert subprocess.run(["bash", "-c", bare], cwd=work, env=env, capture_output=True,
                              timeout=60).returncode == 127
