"""Progress for every long command, engines included: `replay --engine` and `run-ranks --engine` start
the engine's worker as their own stage (fa3verify.engine_choice.start_engine), so a CI log shows a line on stderr
when the start begins and one when it ends, and nothing of it on stdout (which may carry a report). The engine is
a stand-in (tests/fake_engines.py) whose worker start prints a line, as an environment build does."""

from __future__ import annotations

from pathlib import Path

import pytest

from fa3verify import cli

from fake_engines import ProfileSUT, install

CASE = str(Path(__file__).resolve().parent.parent / "corpus" / "worked_example_prefix_guard.json")


class StartingSUT(ProfileSUT):
    """The model under a release's profile whose worker has to be started (and says so on stdout)."""

    has_worker = True  # it describes itself as a real engine does (gpu_impl.sut.SystemUnderTest.has_worker)

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.starts = 0

    def start(self):
        self.starts += 1
        print("building the engine environment ... ok")


def _stage_lines(text: str, command: str) -> list:
    return [line for line in text.splitlines() if line.startswith(f"fa3verify {command}: ")]


def _run(monkeypatch, capsys, argv):
    opened = install(monkeypatch, lambda spec: StartingSUT(spec.release))
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err, opened


@pytest.mark.parametrize("command, argv", [
    ("replay", ["replay", CASE, "--engine", "sglang==0.5.14", "--json", "-"]),
    ("run-ranks", ["run-ranks", CASE, "--engine", "sglang==0.5.14", "--json", "-"]),
])
def test_the_engine_start_is_a_stage_on_stderr(monkeypatch, capsys, command, argv):
    code, out, err, opened = _run(monkeypatch, capsys, argv)
    assert code == 1  # the worked example fails on 0.5.14's profile
    assert [s.starts for s in opened] == [1]
    lines = _stage_lines(err, command)
    begin = [i for i, line in enumerate(lines) if "start sglang==0.5.14" in line and line.endswith("...")]
    end = [i for i, line in enumerate(lines) if "start sglang==0.5.14" in line and " done in " in line]
    assert len(begin) == 1 and len(end) == 1 and begin[0] < end[0], lines
    assert "building the engine environment" in err  # what the start prints is progress too
    assert "fa3verify " + command + ":" not in out and "building the engine" not in out


@pytest.mark.parametrize("argv", [["replay", CASE, "--engine", "sglang==0.5.14"],
                                  ["run-ranks", CASE, "--engine", "sglang==0.5.14"]])
def test_negative_control_an_engine_never_started_gives_no_start_line(monkeypatch, capsys, argv):
    import fa3verify.engine_choice as engine_choice

    monkeypatch.setattr(engine_choice, "start_engine", lambda sut, command: None)  # the defect: no start stage
    code, _out, err, opened = _run(monkeypatch, capsys, argv)
    assert code == 1 and [s.starts for s in opened] == [0]
    assert not [line for line in _stage_lines(err, argv[0]) if "start sglang" in line]


def test_the_model_has_no_start_stage(capsys):
    assert cli.main(["replay", CASE]) == 1
    assert not _stage_lines(capsys.readouterr().err, "replay")
