"""The docs' numbers, names and examples agree with the code they describe (the claims that had
drifted): the theorem count, the check kinds and JUnit classes, ``policy.engine``, the case file name in the
CLI's help, the case-format error examples, the CI page's environment variables, the sanitizer's overhead bar,
an engine without an environment, and Hypothesis as a test dependency only."""

import ast
import copy
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUNTIME_PACKAGES = ("fa3verify", "spec", "refmodel", "gpu_impl")


def _doc(name: str) -> str:
    return (DOCS / name).read_text()


def test_theorem_counts_in_the_docs_are_the_registry_size():
    from spec.theorems import THEOREMS

    n = len(THEOREMS)
    for page in ("engines.md", "reports.md", "commands.md"):
        counts = {int(c) for c in re.findall(r"\b(\d+) theorems\b", _doc(page))}
        assert counts <= {n}, (page, counts, n)
    assert f"{n} today" in _doc("engines.md")


def _check_kinds_in_code() -> set:
    """Every literal ``kind=`` of a ``Check(...)`` built in fa3verify/ (the rows of a run summary)."""
    kinds = set()
    for path in (ROOT / "fa3verify").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Check":
                for kw in node.keywords:
                    if kw.arg == "kind":
                        assert isinstance(kw.value, ast.Constant), (path, ast.dump(kw.value))
                        kinds.add(kw.value.value)
    return kinds


def test_reports_page_names_every_check_kind_and_junit_class():
    kinds = _check_kinds_in_code()
    assert kinds == {"theorem", "property", "replay", "catalogue", "engine-matrix"}  # a new one: document it
    text = _doc("reports.md")
    row = next(line for line in text.splitlines() if line.startswith("| `checks[]` |"))
    assert set(re.findall(r"`([a-z-]+)` \(", row.split("by `kind`:")[1].split("; `verdict`")[0])) == kinds
    junit = text[text.index("class name `fa3verify.KIND`"):]
    assert {k for k in kinds if f"`fa3verify.{k}`" in junit} == kinds
    from fa3verify.summary import Check, RunSummary  # noqa: F401 - the class name is fa3verify.KIND

    assert 'classname=f"fa3verify.{check.kind}"' in (ROOT / "fa3verify" / "summary.py").read_text()


def test_reports_page_documents_policy_engine_where_the_code_sets_it():
    setters = [p.relative_to(ROOT).as_posix() for d in ("fa3verify", "gpu_impl") for p in (ROOT / d).rglob("*.py")
               if re.search(r'policy=\{[^}]*"engine"', p.read_text())]
    assert sorted(setters) == ["fa3verify/commands/conform.py", "gpu_impl/engines/vllm/conformance.py"]
    # the one gate sets it through the engine's plugin (an engine whose own code decides names itself)
    assert "plugin.summary_policy(" in (ROOT / "fa3verify" / "commands" / "gate.py").read_text()
    assert re.search(r'return \{\*\*record, "engine": str\(spec\)\}', (ROOT / "gpu_impl" / "plugin.py").read_text())
    row = next(line for line in _doc("reports.md").splitlines() if line.startswith("| `policy` |"))
    assert "`gate --engine X` adds `engine: X`" in row and "`conform` has `engine`" in row


def test_the_cli_help_example_case_file_has_the_name_case_save_writes():
    from fa3verify.cli import DESCRIPTION

    names = re.findall(r"fa3verify replay (\S+\.json)", DESCRIPTION)
    assert names
    pattern = re.compile(r"(prove|fuzz|conform|replay|case)-[a-z0-9-]+-[0-9a-f]{16}\.json$")
    for name in names:
        assert pattern.search(Path(name).name), name
    assert all(n in _doc("commands.md") for n in names)


def test_the_case_format_error_examples_are_what_the_loader_says():
    from spec.model.cases import Case, CaseFormatError

    base = json.loads((ROOT / "tests" / "corpus" / "worked_example_prefix_guard.json").read_text())

    def message(mutate) -> str:
        data = copy.deepcopy(base)
        mutate(data)
        with pytest.raises(CaseFormatError) as exc:
            Case.from_dict(data)
        return str(exc.value)

    errors = _doc("case-format.md")[_doc("case-format.md").index("## Errors"):]
    got = [message(lambda d: d["server"].update(num_splits=300)),
           message(lambda d: d.update(batches=[{"mode": "extend", "seq_lens": [10], "extend_lens": [11]}])),
           message(lambda d: d["server"].update(tp_size=64))]
    for text in got:
        assert f"`{text}`" in errors, text


def _header_variables(script: Path) -> set:
    head = script.read_text().split("\nset -euo pipefail")[0]
    return set(re.findall(r"^#\s+(FA3VERIFY_[A-Z_]+)", head, re.M))


def test_ci_page_lists_the_pre_merge_variables_and_the_run_gate_ones_exist():
    text = _doc("ci.md")
    section = text[text.index("## Pre-merge script"):text.index("As a git hook")]
    listed = set(re.findall(r"`(FA3VERIFY_[A-Z_]+)`", section))
    assert listed == _header_variables(ROOT / "examples" / "ci" / "pre-merge.sh")
    assert "FA3VERIFY_GUARD" in listed
    run_gate = _header_variables(ROOT / "examples" / "ci" / "run-gate.sh")
    workflow = (ROOT / "examples" / "ci" / "github-workflow.yml").read_text()
    named = set(re.findall(r"`(FA3VERIFY_[A-Z_]+)`", text[text.index("## GitHub Actions workflow"):
                                                          text.index("## Time, cold and warm")]))
    in_workflow = {v for v in named if re.search(rf"\b{v}\b", workflow)}
    assert {"FA3VERIFY_REPOSITORY", "FA3VERIFY_REF", "FA3VERIFY_COMMIT_SHA"} <= in_workflow
    assert named - {"FA3VERIFY_REPOSITORY", "FA3VERIFY_REF", "FA3VERIFY_COMMIT_SHA"} <= run_gate


def test_ci_page_claims_hold():
    text = _doc("ci.md")
    assert "2 minutes" not in text and "CPU-only" not in text
    # "same seed, same cases" is said only with --cases
    for m in re.finditer(r"same (?:sequence of )?cases", text):
        around = text[max(0, m.start() - 300):m.end() + 300]
        assert "--cases" in around, around
    table = text[text.index("## Time, cold and warm"):]
    assert not re.search(r"\b(COLD|WARM)_[A-Z]+\b", table)  # every measured cell is filled in
    assert re.search(r"\| total \| \d+ s", table)


def test_engines_page_says_a_missing_environment_is_built():
    text = _doc("engines.md")
    assert "a release with no environment" not in text
    assert "without a cached environment\ngets one built first" in text


def test_sanitizer_overhead_bar_and_figures_agree_with_bench():
    from fa3verify.commands import bench

    op, bar = bench.BARS["sanitize_overhead_us"]
    perf = _doc("performance.md")
    row = next(line for line in perf.splitlines() if "repeated layer call" in line)
    assert f"bar {op} {bar:g} us" in row
    worst = max(float(x) for x in re.findall(r"overhead ([\d.]+)(?: - ([\d.]+))? us", row)[0] if x)
    assert worst < bar  # the documented figure meets the bar it is shown against
    sanitize = " ".join(_doc("sanitize.md").split())
    assert "about 15 us per call" not in sanitize and "about 6-9 us per call" in sanitize


def test_hypothesis_is_a_test_dependency_that_no_runtime_module_imports():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = [re.split(r"[<>=!~ ]", d)[0].lower() for d in project["dependencies"]]
    assert "hypothesis" not in runtime
    assert any(d.lower().startswith("hypothesis") for d in project["optional-dependencies"]["test"])
    for pkg in RUNTIME_PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                assert not any(n.split(".")[0] == "hypothesis" for n in names), path
    assert "is Hypothesis" not in _doc("performance.md")


#: An absolute path into a run's output folder, as a command's printed line would show the machine it ran on.
_ABSOLUTE_OUTPUT = re.compile(r"(?<![\w.~-])/[^\s'\"]*fa3verify-out/")


def absolute_output_paths(text: str) -> list:
    """The lines of the example runs in commands.md (the blocks starting `$ fa3verify`) naming an absolute path
    into an output folder: the example must read the same on any machine, as the commands given relative paths."""
    found, inside = [], False
    for line in text.splitlines():
        if line.startswith("$ fa3verify "):
            inside = True
        elif line.startswith("```"):
            inside = False
        elif inside and _ABSOLUTE_OUTPUT.search(line):
            found.append(line)
    return found


def test_command_examples_print_output_paths_relative_to_the_working_directory():
    assert absolute_output_paths(_doc("commands.md")) == []
    # negative control: gpu-check's line as it printed it before (the absolute out folder) is caught
    before = ("$ fa3verify gpu-check --dry-run --out fa3verify-out/docs-run/gpu-check\n"
              "[gpu-check    0.0s] DRY RUN (CPU, emulated FA3); out /work/main/fa3verify-out/docs-run/gpu-check\n```")
    assert len(absolute_output_paths(before)) == 1


def test_gpu_check_prints_its_folders_as_given_under_the_working_directory(tmp_path, monkeypatch):
    import os

    from fa3verify.outputs import shown_path

    monkeypatch.chdir(tmp_path)
    assert shown_path("out/gpu") == os.path.join("out", "gpu")
    assert shown_path(str(tmp_path / "out" / "gpu")) == os.path.join("out", "gpu")
    elsewhere = tmp_path.parent / "other"
    assert shown_path(str(elsewhere)) == str(elsewhere)  # outside the working directory: absolute, never ../..
