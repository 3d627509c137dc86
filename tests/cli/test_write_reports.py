"""`summary.write_reports`, the one report writer of check, fuzz, gate and prove: the table, the finding lines, and
the same JSON and JUnit bytes as the writers it calls; nothing is written that was not asked for."""

import types

from fa3verify.summary import Check, Finding, RunSummary, write_json, write_junit, write_reports


def _summary(failed: bool) -> RunSummary:
    s = RunSummary(command="fuzz", cases=3, failures=int(failed), elapsed_s=1.5, seed=0)
    s.checks.append(Check(name="fuzz (emulated)", kind="property", verdict="fail" if failed else "pass", seconds=1.5,
                          failed=failed, case_file="c.json" if failed else None, message="3 cases"))
    if failed:
        s.findings.append(Finding(invariant="SPLIT_BOUND", case_file="c.json", engine="fuzz", message="overflow",
                                  replay="fa3verify replay c.json"))
    return s


def test_reports_are_the_writers_bytes_and_the_finding_lines(tmp_path, capsys):
    summary = _summary(failed=True)
    args = types.SimpleNamespace(json=str(tmp_path / "r.json"), junit=str(tmp_path / "r.xml"))
    assert write_reports(summary, args, lambda f: f"  {f.invariant}: {f.message}") == 1
    out = capsys.readouterr().out
    assert "verdict: FAIL" in out and "  SPLIT_BOUND: overflow" in out
    write_json(summary, str(tmp_path / "d.json"))
    write_junit(summary, str(tmp_path / "d.xml"))
    assert (tmp_path / "r.json").read_bytes() == (tmp_path / "d.json").read_bytes()
    assert (tmp_path / "r.xml").read_bytes() == (tmp_path / "d.xml").read_bytes()


def test_nothing_is_written_unless_asked(tmp_path, capsys):
    args = types.SimpleNamespace(json=None)  # a command without --junit (no attribute at all)
    assert write_reports(_summary(failed=False), args) == 0
    assert "verdict: PASS" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())
