"""Findings in a backend engineer's terms, on every surface, from the case that is saved.

What is checked: one renderer (``fa3verify.summary.finding_lines``) prints the configuration, path, differing
arguments, S_p vs S_c, the guard's decision and a fix hint on the CLI, in JUnit, HTML, Markdown and the Python
API / pytest plugin; a finding's numbers are those of its saved (shrunk) case; replay names the engine it ran;
a refutation that is expected says so and its case file goes under ``witnesses/``; and every replay line a run
prints reproduces its finding (exit 1) as typed. Each check has a negative control: the defect it must catch.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fa3verify import cli
from fa3verify.summary import Check, Finding, RunSummary, finding_lines, finding_text, write_reports

REPO = Path(__file__).resolve().parents[2]
WORKED = str(REPO / "tests" / "corpus" / "worked_example_prefix_guard.json")


def _finding() -> Finding:
    return Finding(invariant="SPLIT_BOUND", case_file="cases/c.json", engine="prove",
                   message="batch 0 (virtual 0) has 17 splits in the metadata but the call's partial buffers hold S_c=9",
                   replay="fa3verify replay cases/c.json --guard my_guard.py:should_disable", check="prefill-cp-hazard",
                   ran_on="the model (guard 'my_guard.py:should_disable', heads tp)",
                   config="llama-3-8b/tp2/cp2+pcp/sm78/splits=0", path="eager", differs={"heads": [[16, 4], [32, 8]]},
                   seq_lens=[14858], s_p=17, s_c=9, guard="guard 'my_guard.py:should_disable' kept the precompute",
                   hint="precompute with the layer's own head counts")


def _summary() -> RunSummary:
    s = RunSummary(command="gate", cases=1, failures=1, elapsed_s=1.0, seed=0)
    s.checks.append(Check(name="drift-breaks-h_k", kind="theorem", verdict="refuted", seconds=0.1,
                          expected="the policy predicts this witness"))
    s.checks.append(Check(name="prefill-cp-hazard", kind="theorem", verdict="refuted", seconds=0.5, failed=True,
                          case_file="cases/c.json", message="prefill-CP hazard"))
    s.findings.append(_finding())
    return s


def shows_terms(text: str) -> bool:
    """Whether a surface's text carries the finding's backend terms (configuration, path, differing arguments,
    batch, S_p vs S_c, guard decision, hint, replay command)."""
    f = _finding()
    return all(part in text for part in (f.config, "(eager path)", "precomputes with heads (16, 4) but calls with "
                                         "heads (32, 8)", "b=1 seq_lens=[14858] gives S_p=17 vs S_c=9", f.guard,
                                         f.hint, f.replay))


def test_every_surface_renders_the_finding_in_backend_terms(tmp_path, capsys):
    from fa3verify.api import GateResult
    from fa3verify.html_report import render_html
    from fa3verify.summary import summary_markdown

    summary = _summary()
    args = types.SimpleNamespace(json=str(tmp_path / "r.json"), junit=str(tmp_path / "r.xml"))
    assert write_reports(summary, args) == 1
    cli_out = capsys.readouterr().out
    junit = "\n".join(el.text or "" for el in ET.parse(tmp_path / "r.xml").iter("failure"))
    data = json.loads((tmp_path / "r.json").read_text())
    html = render_html(data).replace("&#x27;", "'")
    result = GateResult.from_summary(summary)
    surfaces = {"cli": cli_out, "junit": junit, "html": html, "markdown": summary_markdown(data),
                "api": str(result.findings[0]), "pytest": result.report()}
    for name, text in surfaces.items():
        assert shows_terms(text), (name, text)
    assert data["findings"][0]["differs"] == {"heads": [[16, 4], [32, 8]]} and data["findings"][0]["s_c"] == 9
    assert result.to_dict()["findings"][0]["hint"] == _finding().hint
    # the expected refutation reads so on the table, in HTML and in Markdown; it is no failed row
    assert "refuted (expected)" in cli_out and "refuted (expected)" in html and "refuted (expected)" in surfaces["markdown"]
    assert "| drift-breaks-h_k |" not in summary_markdown(data).split("### All rows")[0]
    # negative control: the line the CLI printed before (invariant and message only) has none of the terms
    assert not shows_terms(f"  [prove] SPLIT_BOUND: {_finding().message}\n    replay: {_finding().replay}")


def test_markdown_summary_lists_the_failed_rows_first(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_summary().to_dict()))
    assert cli.main(["report", str(path), "--markdown", str(tmp_path / "summary.md")]) == 0
    md = (tmp_path / "summary.md").read_text()
    failed_part = md.split("### All rows")[0]
    assert "### Rows that failed or were inconclusive (1)" in failed_part and "| prefill-cp-hazard |" in failed_part
    assert shows_terms(md.replace("`", ""))
    assert cli.main(["report", str(path)]) == 2  # no output named: a usage error naming both options
    assert "--html or --markdown" in capsys.readouterr().err


# -- the numbers of the saved (shrunk) case --------------------------------------------------------------------

def numbers_differ_from_replay(summary) -> list:
    """Findings whose S_p, S_c, lengths or message differ from a replay of their saved case file (or whose case
    file's expected message does)."""
    from fa3verify.commands.replay import replay

    bad = []
    for f in summary.findings:
        replayed, _ = replay(f.case_file)
        r = next(x for x in replayed.findings if x.invariant == f.invariant)
        saved = json.loads(Path(f.case_file).read_text())["expected"]["detail"]["message"]
        if (f.s_p, f.s_c, f.seq_lens) != (r.s_p, r.s_c, r.seq_lens) or not f.message.startswith(r.message) \
                or saved != r.message:
            bad.append((f.message, r.message))
    return bad


def test_fuzz_findings_describe_the_saved_shrunk_case(tmp_path, monkeypatch):
    import fa3verify.commands.fuzz as fz
    from fa3verify.policy import load_policy
    from gpu_impl.engines.model.sut import ModelSUT

    summary = fz.fuzz(ModelSUT(policy=load_policy("pre-fix")), seed=0, max_cases=200, out_dir=str(tmp_path / "a"))
    assert summary.findings and all(f.config and f.s_c is not None for f in summary.findings)
    assert numbers_differ_from_replay(summary) == []
    # negative control: terms (and the message) read from the case before shrinking, as the gate did before
    real = fz.saved_case_terms
    monkeypatch.setattr(fz, "saved_case_terms", lambda failure, case, *a, **k: real(failure, failure.case, *a, **k))
    before = fz.fuzz(ModelSUT(policy=load_policy("pre-fix")), seed=0, max_cases=200, out_dir=str(tmp_path / "b"))
    assert numbers_differ_from_replay(before)  # "15 splits" in the finding, 10 in its replay


# -- replay names its engine ------------------------------------------------------------------------------------

def test_replay_names_the_engine_it_ran(tmp_path, monkeypatch, capsys):
    from fake_engines import ProfileSUT, install

    assert cli.main(["replay", WORKED, "--json", str(tmp_path / "m.json")]) == 1
    out = capsys.readouterr().out
    assert "replayed on the model (guard 'pre-fix', heads tp)" in out and "in backend terms: " in out
    assert json.loads((tmp_path / "m.json").read_text())["findings"][0]["ran_on"].startswith("the model")
    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    assert cli.main(["replay", WORKED, "--engine", "sglang==0.5.14", "--json", str(tmp_path / "e.json")]) == 1
    out = capsys.readouterr().out
    assert "replayed on sglang==0.5.14" in out
    found = json.loads((tmp_path / "e.json").read_text())["findings"][0]
    assert found["ran_on"] == "sglang==0.5.14" and found["guard"] == "sglang==0.5.14's own guard kept the precompute"
    # control: the line follows the engine that ran, not a fixed text
    assert cli.main(["replay", WORKED, "--engine", "sglang==0.5.23"]) == 0
    assert "replayed on sglang==0.5.23" in capsys.readouterr().out


# -- expected refutations ---------------------------------------------------------------------------------------

def _top_level_cases(folder: Path) -> list:
    return sorted(p.name for p in folder.glob("*.json")) if folder.is_dir() else []


def test_a_passing_prove_shows_expected_refutations_and_keeps_witnesses_apart(tmp_path, monkeypatch, capsys):
    import fa3verify.commands.prove as proving

    cases = tmp_path / "cases"
    # the root-cause fix passes; the sharded-KV theorem (a fork's path this backend lacks) is still refuted
    base = ["prove", "--guard", "pre-fix", "--metadata-heads", "attn_tp", "--only", "prefill-cp-hazard",
            "--only", "sharded-kv-decode", "--cases-dir", str(cases), "--json", str(tmp_path / "p.json")]
    assert cli.main(base) == 0
    out = capsys.readouterr().out
    rows = {c["name"]: c for c in json.loads((tmp_path / "p.json").read_text())["checks"]}
    hazard = rows["sharded-kv-decode"]
    assert hazard["verdict"] == "refuted" and not hazard["failed"] and hazard["expected"]
    assert not any(c["verdict"] == "refuted" and not c["expected"] for c in rows.values())
    assert "refuted (expected)" in out
    assert hazard["case_file"] and Path(hazard["case_file"]).parent == cases / "witnesses"
    assert Path(hazard["case_file"]).is_file() and _top_level_cases(cases) == []
    # negative control: without moving the witnesses a passing run leaves a case file that looks like a failure
    monkeypatch.setattr(proving, "move_witnesses", lambda summary, cases_dir: None)
    assert cli.main(base[:-4] + ["--cases-dir", str(tmp_path / "other")]) == 0
    assert _top_level_cases(tmp_path / "other")


def test_engine_gate_witness_rows_are_informational(tmp_path, monkeypatch, capsys):
    from fake_engines import ProfileSUT, install

    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    cases = tmp_path / "cases"
    assert cli.main(["gate", "--engine", "sglang==0.5.23", "--cases", "30", "--cases-dir", str(cases),
                     "--json", str(tmp_path / "g.json")]) == 0
    out = capsys.readouterr().out
    search = [c for c in json.loads((tmp_path / "g.json").read_text())["checks"]
              if c["name"].startswith("witness search")]
    assert search and all(c["expected"] and not c["failed"] for c in search if c["verdict"] == "refuted")
    assert all(Path(c["case_file"]).parent == cases / "witnesses" for c in search if c["case_file"])
    assert "refuted (expected)" in out and _top_level_cases(cases) == []


# -- every printed replay line reproduces as typed ---------------------------------------------------------------

def _run(argv, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "fa3verify", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


def replay_lines(out: str) -> list:
    """Every replay command a run printed (one per distinct line)."""
    return sorted({line.strip()[len("replay: "):] for line in out.splitlines()
                   if line.strip().startswith("replay: fa3verify replay ")})


def _typed(line: str, cwd) -> int:
    argv = shlex.split(line)
    assert argv[:2] == ["fa3verify", "replay"], line
    return _run(argv[1:], cwd).returncode


def _without(line: str, option: str) -> str:
    argv = shlex.split(line)
    i = argv.index(option)
    return shlex.join(argv[:i] + argv[i + 2:])


RUNS = {
    "fuzz-seeded-defect": ["fuzz", "--guard", "gpu_impl.defects:graph_split_count_from_capture", "--cases", "200",
                           "--out", "cases"],
    "gate-user-guard": ["gate", "--guard", "guards/my_guard.py:should_disable", "--cases", "60",
                        "--cases-dir", "cases"],
    "gate-model": ["gate", "--guard", "pre-fix", "--cases", "60", "--cases-dir", "cases"],
}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_every_printed_replay_line_reproduces_as_typed(tmp_path, run, monkeypatch, capsys):
    (tmp_path / "guards").mkdir()
    shutil.copy(REPO / "examples" / "guards" / "prefix_guard.py", tmp_path / "guards" / "my_guard.py")
    # the run that prints the lines runs in this process (its printed text is the same; the gates' prove stages
    # share the theorem parts that do not depend on the guard); every line it prints runs as typed, in a child
    monkeypatch.chdir(tmp_path)
    code = cli.main(RUNS[run])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    lines = replay_lines(out)
    assert lines, out
    for line in lines:
        assert _typed(line, tmp_path) == 1, line
    if run == "gate-user-guard":
        assert all("--guard guards/my_guard.py:should_disable" in line for line in lines)
        # negative control: the line without --guard (as the gate printed it before) is refused, exit 2
        assert _typed(_without(lines[0], "--guard"), tmp_path) == 2


def test_a_replay_line_of_a_case_found_on_a_checkout_names_the_checkout(tmp_path, monkeypatch, capsys):
    from fake_engines import ProfileSUT, install

    checkout = tmp_path / "sglang" / "python"
    checkout.mkdir(parents=True)
    install(monkeypatch, lambda spec: ProfileSUT("0.5.14", kind=spec.kind, path=spec.path))
    assert cli.main(["fuzz", "--engine", f"sglang-src={checkout}", "--cases", "150",
                     "--out", str(tmp_path / "cases")]) == 1
    out = capsys.readouterr().out
    lines = replay_lines(out)
    assert lines and all(f"--engine sglang-src={checkout}" in line for line in lines)
    assert "ran on: sglang-src=" in out and "fix: " in out
    for line in lines:
        assert cli.main(shlex.split(line)[1:]) == 1, line
    # negative control: without --engine the case is refused (a case file never names code to run), exit 2
    assert cli.main(shlex.split(_without(lines[0], "--engine"))[1:]) == 2
