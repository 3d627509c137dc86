"""Tests of `fa3verify report`: a run summary JSON rendered to one self-contained, escaped HTML page."""

import json

import pytest

from fa3verify import exitcodes
from fa3verify.cli import main
from fa3verify.errors import UsageError
from fa3verify.html_report import load_summary, render_html, validate_summary
from fa3verify.summary import Check, Finding, RunSummary, write_json

EVIL = "<script>alert('x')</script>"


def failing_summary() -> RunSummary:
    s = RunSummary(command="gate", seed=3, cases=120, failures=4, elapsed_s=12.5, first_failure_s=0.8,
                   policy={"guard": "pre-fix", "metadata_heads": "tp", "clear_stale_cp_metadata": True})
    s.checks.append(Check(name="T1 metadata reuse is safe", kind="theorem", verdict="refuted", seconds=1.25,
                          failed=True, case_file="cases/split_bound-1.json", message=f"witness tp=4 {EVIL}"))
    s.checks.append(Check(name="T5 combine algebra", kind="theorem", verdict="proved", seconds=0.5))
    s.checks.append(Check(name="T7 cp freshness", kind="theorem", verdict="unknown", seconds=10.0,
                          inconclusive=True, message="z3 timeout"))
    s.findings.append(Finding(invariant="SPLIT_BOUND", case_file="cases/split_bound-1.json", engine="prove",
                              message="split 86 > S_c 29 & more",
                              replay="fa3verify replay cases/split_bound-1.json"))
    return s


def test_html_has_verdict_checks_findings_and_escapes(tmp_path, capsys):
    run_json, out = tmp_path / "run.json", tmp_path / "out.html"
    write_json(failing_summary(), str(run_json))
    assert main(["report", str(run_json), "--html", str(out)]) == exitcodes.PASS
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert '<h1>FAIL</h1>' in page
    assert "T1 metadata reuse is safe" in page and "T5 combine algebra" in page
    assert "SPLIT_BOUND" in page and "fa3verify replay cases/split_bound-1.json" in page
    assert "split 86 &gt; S_c 29 &amp; more" in page
    # The message's <script> is escaped; the page itself has no script and no external resource.
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "<script" not in page.lower()
    assert "http://" not in page and "https://" not in page
    assert "12.50 s" in page and "120" in page
    assert "verdict FAIL" in capsys.readouterr().out


def test_pass_banner_and_minimal_schema():
    page = render_html(validate_summary({"verdict": "pass", "cases": 10, "failures": 0, "elapsed_s": 1.0,
                                         "cases_per_s": 10.0, "first_failure_s": None, "findings": []}))
    assert "<h1>PASS</h1>" in page and "No findings." in page and "No checks were recorded." in page


@pytest.mark.parametrize("content,problem", [
    ("{not json", "not valid JSON (line 1"),
    ("[1, 2]", "expected a JSON object"),
    ('{"cases": 3}', "missing required key 'verdict'"),
    ('{"verdict": "maybe"}', "verdict: must be one of"),
    ('{"verdict": "pass", "checks": "none"}', "checks: expected array"),
    ('{"verdict": "pass", "checks": [{"name": "x"}]}', "checks[0]: missing required key 'verdict'"),
    ('{"verdict": "fail", "findings": [{"invariant": 3}]}', "findings[0].invariant: expected string"),
    ('{"verdict": "pass", "schema": "other/2"}', "schema: expected 'fa3verify.run/1'"),
    ('{"verdict": "pass", "cases": true}', "cases: expected integer"),
])
def test_malformed_json_exits_2_naming_problem(tmp_path, capsys, content, problem):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = tmp_path / "out.html"
    assert main(["report", str(bad), "--html", str(out)]) == exitcodes.USAGE
    assert problem in capsys.readouterr().err
    assert not out.exists()


def test_missing_file_and_missing_dir(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope.json"), "--html", str(tmp_path / "o.html")]) == exitcodes.USAGE
    assert "no such file" in capsys.readouterr().err
    good = tmp_path / "run.json"
    good.write_text(json.dumps({"verdict": "pass"}))
    assert main(["report", str(good), "--html", str(tmp_path / "no" / "dir" / "o.html")]) == exitcodes.USAGE
    assert "--html: directory does not exist" in capsys.readouterr().err


def test_load_summary_round_trip(tmp_path):
    path = tmp_path / "run.json"
    write_json(failing_summary(), str(path))
    data = load_summary(str(path))
    assert data["verdict"] == "fail" and len(data["checks"]) == 3
    with pytest.raises(UsageError):
        validate_summary({"verdict": "pass", "elapsed_s": "fast"})
