"""Tests of the Python API (fa3verify.api) and the pytest plugin (--fa3verify-guard).

Wiring is tested against a stubbed gate, so it runs everywhere; the end-to-end tests run the real gate and
are skipped only while one of the gate's modules (spec theorems, case files, scenario runner) is absent.
"""

import importlib.util
import json
import os
import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from fa3verify import api, exitcodes
from fa3verify.errors import UsageError
from fa3verify.summary import Check, Finding, RunSummary

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent.parent
PREFIX_GUARD = str(REPO / "examples" / "guards" / "prefix_guard.py") + ":should_disable"
FIXED_GUARD = str(REPO / "examples" / "guards" / "fixed_guard.py") + ":should_disable"

#: Modules the real gate imports (fa3verify.commands.prove / fuzzing / gpu_impl.scenario).
GATE_MODULES = ("spec.theorems.metadata", "spec.theorems.algebra", "spec.theorems.cp", "spec.model.cases",
                "spec.invariants", "gpu_impl.scenario", "gpu_impl.kernels", "fa3verify.strategies")


def _missing_gate_modules() -> list:
    missing = []
    for name in GATE_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except ModuleNotFoundError:
            missing.append(name)
    return missing


needs_gate = pytest.mark.skipif(bool(_missing_gate_modules()),
                                reason=f"the gate's dependencies are not written yet: {_missing_gate_modules()}")


def _summary(failed: bool, tmp_path: Path) -> RunSummary:
    case = tmp_path / "split_bound-1.json"
    case.write_text(json.dumps({"schema": "fa3verify.case/1", "server": {"tp_size": 4, "attn_cp_size": 4}}))
    s = RunSummary(command="gate", seed=0, policy={"guard": "x"}, cases=5, failures=int(failed), elapsed_s=0.1)
    s.checks.append(Check(name="T1 metadata reuse", kind="theorem", verdict="refuted" if failed else "proved",
                          seconds=0.1, failed=failed, case_file=str(case) if failed else None, message="witness"))
    if failed:
        s.findings.append(Finding(invariant="SPLIT_BOUND", case_file=str(case), engine="prove",
                                  message="split 86 > S_c 29", replay=f"fa3verify replay {case}"))
    return s


@pytest.fixture
def stub_gate(monkeypatch, tmp_path):
    """Replace fa3verify.commands.gate.gate; records its arguments; `stub_gate.failed` chooses the outcome."""
    calls = []

    class Stub:
        failed = True

        def __call__(self, sut, **kwargs):
            calls.append((sut.policy, kwargs))  # the policy the model under test was constructed with
            return _summary(self.failed, tmp_path)

    stub = Stub()
    stub.calls = calls
    monkeypatch.setattr("fa3verify.commands.gate.gate", stub)
    return stub


# ------------------------------------------------------------------------------------------------
# API
# ------------------------------------------------------------------------------------------------


def test_gate_returns_structured_result(stub_gate):
    result = api.gate(guard=PREFIX_GUARD, budget_s=2, seed=5, timeout_s=3, cases_dir="out/cases")
    assert isinstance(result, api.GateResult)
    assert (result.verdict, result.exit_code, result.passed) == ("fail", exitcodes.VIOLATION, False)
    assert isinstance(result.summary, RunSummary) and len(result.checks) == 1
    [finding] = result.findings
    assert isinstance(finding, api.Finding) and finding.invariant == "SPLIT_BOUND"
    assert api.Finding is Finding  # one finding type: the run summary's, with the case file's JSON filled in
    assert "case" not in result.summary.to_dict()["findings"][0] and result.summary.findings[0].case is None
    assert finding.case["server"]["attn_cp_size"] == 4 and finding.replay.startswith("fa3verify replay ")
    data = result.to_dict()
    assert data["schema"] == "fa3verify.run/1" and data["findings"][0]["case"]["schema"] == "fa3verify.case/1"
    json.dumps(data)
    assert "SPLIT_BOUND" in result.report() and "replay:" in result.report()
    policy, kwargs = stub_gate.calls[0]
    assert policy.guard_spec == PREFIX_GUARD and policy.metadata_heads == "tp" and policy.clear_stale_cp_metadata
    assert kwargs == {"budget_s": 2.0, "seed": 5, "timeout_s": 3.0, "cases_dir": "out/cases",
                      "kernel_name": "emulated", "device": "cpu", "max_cases": None, "show_progress": False}


def test_gate_options_reach_the_policy(stub_gate):
    stub_gate.failed = False
    result = api.gate(guard="pre-fix", metadata_heads="attn_tp", keep_stale_cp_metadata=True, cases=7)
    assert result.passed and result.verdict == "pass" and result.findings == []
    policy, kwargs = stub_gate.calls[0]
    assert (policy.metadata_heads, policy.clear_stale_cp_metadata) == ("attn_tp", False)
    assert kwargs["max_cases"] == 7 and kwargs["budget_s"] is None


def test_gate_accepts_a_module_level_callable(stub_gate):
    from gpu_impl.guards import prefix_guard_dp_only

    api.gate(guard=prefix_guard_dp_only, cases=1)
    # recorded where the function is defined (gpu_impl.guards re-exports spec.model.guards), so it loads back
    assert stub_gate.calls[0][0].guard_spec == "spec.model.guards:prefix_guard_dp_only"


@pytest.mark.parametrize("kwargs,field", [
    ({"metadata_heads": "all"}, "metadata_heads"),
    ({"budget_s": 0}, "budget_s"),
    ({"budget_s": None}, "budget_s"),
    ({"cases": 0}, "cases"),
    ({"timeout_s": -1}, "timeout_s"),
    ({"seed": -3}, "seed"),
    ({"kernel": "triton"}, "kernel"),
    ({"guard": "no_colon_here"}, "guard"),
    ({"guard": "examples/guards/missing.py:f"}, "guard"),
    ({"guard": lambda args: False}, "guard"),
    ({"guard": 42}, "guard"),
    ({"keep_stale_cp_metadata": "yes"}, "keep_stale_cp_metadata"),
])
def test_gate_bad_input_raises_usage_error(stub_gate, kwargs, field):
    with pytest.raises(UsageError) as exc:
        api.gate(**kwargs)
    assert str(exc.value).startswith(field + ":")
    assert stub_gate.calls == []


def test_replay_and_fuzz_validate_input(tmp_path):
    with pytest.raises(UsageError, match="^path: no such case file"):
        api.replay(tmp_path / "missing.json")
    with pytest.raises(UsageError, match="^cases:"):
        api.fuzz(cases=-1)
    with pytest.raises(UsageError, match="^timeout_s:"):
        api.prove(timeout_s=0)


@pytest.fixture(scope="module")
def real_gate_cases(tmp_path_factory):
    """One cases directory for this file's two real gates: the theorems that do not depend on the guard (the
    algebra, CP, edge and fork-tile ones, some of them refuted by design) are then computed once, the second gate's
    answered by the suite's theorem memo (tests/conftest.py), which gives back a refutation only to a run with the
    same cases directory; the guard's own theorems and the fuzz campaign run in each gate."""
    return str(tmp_path_factory.mktemp("real-gate") / "cases")


@needs_gate
def test_real_gate_fails_on_prefix_guard(real_gate_cases):
    result = api.gate(guard=PREFIX_GUARD, cases=30, seed=0, cases_dir=real_gate_cases)
    assert isinstance(result, api.GateResult)
    assert result.exit_code == exitcodes.VIOLATION and result.findings
    assert all(f.replay or f.case_file is None for f in result.findings)


# ------------------------------------------------------------------------------------------------
# pytest plugin (pytester)
# ------------------------------------------------------------------------------------------------


def _plugin_args() -> list:
    """Load the plugin explicitly unless its pytest11 entry point is installed and autoloading is on."""
    installed = any(ep.value == "fa3verify.pytest_plugin" for ep in entry_points(group="pytest11"))
    if installed and not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return ["-p", "no:cacheprovider"]
    return ["-p", "fa3verify.pytest_plugin", "-p", "no:cacheprovider"]


DOWNSTREAM_TEST = """
def test_downstream():
    assert 1 + 1 == 2
"""


def test_plugin_adds_nothing_without_option(pytester):
    pytester.makepyfile(test_downstream=DOWNSTREAM_TEST)
    result = pytester.runpytest(*_plugin_args(), "-v")
    result.assert_outcomes(passed=1)
    assert "fa3verify_gate" not in result.stdout.str()
    collected = pytester.runpytest(*_plugin_args(), "--collect-only", "-q")
    assert "fa3verify_gate" not in collected.stdout.str()


def test_plugin_gate_item_fails_with_findings(pytester, stub_gate):
    pytester.makepyfile(test_downstream=DOWNSTREAM_TEST)
    result = pytester.runpytest(*_plugin_args(), "-v", "--fa3verify-guard", PREFIX_GUARD, "--fa3verify-cases", "3",
                                "--fa3verify-seed", "2")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert f"fa3verify_gate[{PREFIX_GUARD}] FAILED" in out
    assert "SPLIT_BOUND" in out and "fa3verify replay" in out and "verdict: FAIL" in out
    assert "fa3verify: gate on guard" in out           # report header
    policy, kwargs = stub_gate.calls[0]
    assert policy.guard_spec == PREFIX_GUARD and kwargs["max_cases"] == 3 and kwargs["seed"] == 2


def test_plugin_gate_item_passes_and_is_selectable(pytester, stub_gate, tmp_path):
    stub_gate.failed = False
    pytester.makepyfile(test_downstream=DOWNSTREAM_TEST)
    summary = tmp_path / "gate.json"
    result = pytester.runpytest(*_plugin_args(), "--fa3verify-guard", "fixed", "--fa3verify-budget-s", "1",
                                "--fa3verify-json", str(summary))
    result.assert_outcomes(passed=2)
    assert json.loads(summary.read_text())["verdict"] == "pass"
    only_gate = pytester.runpytest(*_plugin_args(), "--fa3verify-guard", "fixed", "-k", "fa3verify_gate")
    only_gate.assert_outcomes(passed=1, deselected=1)
    collected = pytester.runpytest(*_plugin_args(), "--fa3verify-guard", "fixed", "--collect-only", "-q")
    assert "fa3verify_gate[fixed]" in collected.stdout.str() and "2 tests collected" in collected.stdout.str()


def test_plugin_bad_option_is_a_usage_error(pytester):
    pytester.makepyfile(test_downstream=DOWNSTREAM_TEST)
    result = pytester.runpytest(*_plugin_args(), "--fa3verify-guard", "fixed", "--fa3verify-budget-s", "0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--fa3verify-budget-s: must be > 0" in result.stderr.str()


def test_plugin_bad_guard_fails_the_item_with_message(pytester):
    pytester.makepyfile(test_downstream=DOWNSTREAM_TEST)
    result = pytester.runpytest(*_plugin_args(), "--fa3verify-guard", "nocolon")
    result.assert_outcomes(passed=1, failed=1)
    assert "fa3verify gate: bad input: guard:" in result.stdout.str()


@needs_gate
def test_plugin_runs_the_real_gate(pytester, real_gate_cases):
    pytester.makepyfile(test_downstream=DOWNSTREAM_TEST)
    result = pytester.runpytest(*_plugin_args(), "--fa3verify-guard", FIXED_GUARD, "--fa3verify-cases", "10",
                                "--fa3verify-cases-dir", real_gate_cases)
    result.assert_outcomes(passed=2)


# ------------------------------------------------------------------------------------------------
# CI examples (docs/ci.md)
# ------------------------------------------------------------------------------------------------

#: The only host docs and CI examples may link to: the code host of the upstream sources they cite. Package
#: registries are reached by package name through their clients, never by address.
LINKABLE_HOSTS = {"github.com"}


def test_workflow_has_every_step():
    """The workflows' steps: the two checkouts, Python 3.11, the cache, then run-gate.sh's install (torch's CPU
    build through gpu_impl.engines.torch_build, not a bare torch==2.13.0), gate and report, and the artifact; no
    step that needs `checks: write` (a fork's pull request lacks it). tests/robustness/test_ci_recipe.py runs the script."""
    for name in ("github-workflow.yml", "github-workflow-vllm.yml"):
        text = (REPO / "examples" / "ci" / name).read_text()
        for needle in ("actions/checkout@v4", 'python-version: "3.11"', "actions/cache@v4",
                       ".fa3-verify/examples/ci/run-gate.sh install", ".fa3-verify/examples/ci/run-gate.sh gate",
                       ".fa3-verify/examples/ci/run-gate.sh report", "actions/upload-artifact@v4",
                       "path: fa3verify-out/"):
            assert needle in text, (name, needle)
        assert "\t" not in text and "checks: write" not in text and 'pip install "torch==2.13.0"' not in text
    script = (REPO / "examples" / "ci" / "run-gate.sh").read_text()
    for needle in ("-m gpu_impl.engines.torch_build", "--junit \"$out/report.xml\"", "--json \"$out/gate.json\"",
                   "report \"$out/gate.json\" --html \"$out/gate.html\"", "GITHUB_STEP_SUMMARY"):
        assert needle in script, needle


def test_docs_and_examples_link_no_host_but_the_code_host():
    paths = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
    paths += [REPO / "examples" / "ci" / n for n in ("github-workflow.yml", "github-workflow-vllm.yml",
                                                     "pre-merge.sh", "run-gate.sh")]
    for path in paths:
        hosts = set(re.findall(r"https?://([^/\s)\"'>]+)", path.read_text().lower()))
        assert hosts <= LINKABLE_HOSTS, (path, hosts - LINKABLE_HOSTS)


def test_the_host_check_catches_a_registry_address(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("install from https://example.invalid/simple/torch")
    assert set(re.findall(r"https?://([^/\s)\"'>]+)", page.read_text())) - LINKABLE_HOSTS == {"example.invalid"}


def test_docs_index_links_every_page():
    index = (REPO / "docs" / "index.md").read_text()
    for page in ("concepts.md", "invariants.md", "commands.md", "case-format.md", "ci.md", "gpu-guide.md",
                 "performance.md", "catalogue.md", "multirank.md", "sanitize.md"):
        assert f"]({page})" in index, page


@pytest.mark.parametrize("code,allow,expected", [(0, "0", 0), (1, "0", 1), (2, "0", 2), (3, "0", 3), (3, "1", 0)])
def test_pre_merge_script_passes_the_gate_exit_code_through(tmp_path, code, allow, expected):
    import subprocess

    stub = tmp_path / "fake_fa3verify.sh"
    stub.write_text('#!/usr/bin/env bash\n'
                    'echo "$@" >> "$CALLS"\n'
                    'if [ "$1" = gate ]; then\n'
                    '  while [ $# -gt 0 ]; do [ "$1" = --json ] && echo \'{"verdict": "fail"}\' > "$2"; shift; done\n'
                    '  exit "$STUB_RC"\n'
                    'fi\n')
    stub.chmod(0o755)
    env = dict(os.environ, FA3VERIFY_BIN=str(stub), FA3VERIFY_ALWAYS="1", STUB_RC=str(code),
               CALLS=str(tmp_path / "calls"), FA3VERIFY_OUT=str(tmp_path / "out"),
               FA3VERIFY_ALLOW_INCONCLUSIVE=allow)
    proc = subprocess.run(["bash", str(REPO / "examples" / "ci" / "pre-merge.sh"), "fixed", "--metadata-heads",
                           "attn_tp"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == expected, proc.stdout + proc.stderr
    gate_call, report_call = (tmp_path / "calls").read_text().splitlines()
    assert gate_call.startswith("gate --guard fixed --budget-s 30 --seed 0") and "--metadata-heads attn_tp" in gate_call
    assert report_call.startswith("report ") and "--html" in report_call


def test_pre_merge_script_without_guard_is_a_usage_error(tmp_path):
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "FA3VERIFY_GUARD"}
    proc = subprocess.run(["bash", str(REPO / "examples" / "ci" / "pre-merge.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "GUARD" in proc.stderr



def test_plugin_json_output_is_checked_before_the_gate_runs(tmp_path):
    """--fa3verify-json: a directory, a path under a file, or the guard file itself is a usage error up front."""
    from fa3verify.pytest_plugin import checked_json_path

    guard = tmp_path / "guard.py"
    guard.write_text("def should_disable(a):\n    return True\n")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for bad in (str(tmp_path), str(blocker / "out.json"), str(guard)):
        with pytest.raises(pytest.UsageError, match="--fa3verify-json"):
            checked_json_path(bad, f"{guard}:should_disable")
    assert guard.read_text().startswith("def should_disable")
    good = str(tmp_path / "gate.json")
    assert checked_json_path(good, f"{guard}:should_disable") == good  # control: a fresh file path passes
    assert checked_json_path(None, "fixed") is None
