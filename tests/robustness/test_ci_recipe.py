"""The CI recipe (examples/ci/github-workflow*.yml) cannot rot: its steps are examples/ci/run-gate.sh subcommands,
and this file runs that script (the model as the system under test, on CPU, a fixed case count), checks the job
summary it writes against the run summary, and checks the workflows' shape (fork-safe permissions, a pinned
commit, the caches keyed by the recipe hash). The real runner cannot be tried here: the script is what it runs.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "examples" / "ci"
SCRIPT = CI / "run-gate.sh"
WORKFLOWS = {"sglang": CI / "github-workflow.yml", "vllm": CI / "github-workflow-vllm.yml"}

SUBCOMMANDS = ("cache-key", "install", "gate", "report", "all")


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FA3VERIFY_", "GITHUB_"))}
    env.update(PYTHONPATH=str(ROOT), FA3VERIFY_BIN=f"{sys.executable} -m fa3verify",
               GITHUB_STEP_SUMMARY=str(tmp_path / "step-summary.md"), FA3VERIFY_PYTHON=sys.executable)
    env.update(extra)
    return env


def _run(tmp_path, *args, timeout=900, **extra):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=_env(tmp_path, **extra),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def _table_rows(markdown: str) -> list:
    return [line.split(" | ")[0].lstrip("| ") for line in markdown.splitlines()
            if line.startswith("| ") and not line.startswith("| check |")]


#: The command the script runs for a whole gate: the real command line with its prove stage cut to the theorems that
#: evaluate the guard (tests/gate_guard_theorems.py); the subject here is the script's rows, artifacts and exit code.
GUARD_THEOREMS_BIN = f"{sys.executable} {ROOT / 'tests' / 'gate_guard_theorems.py'}"


def test_a_failing_gate_through_the_script_exits_1_with_the_failing_rows_and_every_artifact(tmp_path):
    proc = _run(tmp_path, "all", FA3VERIFY_GUARD="pre-fix", FA3VERIFY_CASES="20", FA3VERIFY_BIN=GUARD_THEOREMS_BIN)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = tmp_path / "fa3verify-out"
    for name in ("gate.json", "report.xml", "gate.html", "summary.md", "gate.log"):
        assert (out / name).is_file(), name
    assert (out / "exit-code").read_text().strip() == "1" and list((out / "cases").glob("*.json"))
    run = json.loads((out / "gate.json").read_text())
    failing = [c["name"] for c in run["checks"] if c["failed"] or c["inconclusive"]]
    summary = (tmp_path / "step-summary.md").read_text()
    assert summary == (out / "summary.md").read_text()
    assert summary.startswith("## fa3verify gate: FAIL (exit 1)")
    assert failing and _table_rows(summary) == failing  # every failing row, and no passing one
    assert all(f["replay"] in summary for f in run["findings"])


def test_bad_input_is_exit_2_and_the_summary_says_there_is_no_result(tmp_path):
    proc = _run(tmp_path, "gate", FA3VERIFY_ENGINE="bogus", FA3VERIFY_CASES="1")
    assert proc.returncode == 2 and "--engine" in proc.stdout + proc.stderr
    proc = _run(tmp_path, "report")
    assert proc.returncode == 0
    text = (tmp_path / "step-summary.md").read_text()
    assert text.startswith("## fa3verify gate: NO RESULT (exit 2)") and "--engine" in text
    assert not (CI / "job_summary.py").exists()  # one renderer: `fa3verify report --markdown`
    assert _run(tmp_path, "bogus").returncode == 2


def _job_summary(tmp_path, *extra):
    from fa3verify.cli import main

    rc = main(["report", str(tmp_path / "gate.json"), "--markdown", str(tmp_path / "summary.md"), *extra])
    return rc, (tmp_path / "summary.md").read_text()


def test_the_job_summary_shows_failed_and_inconclusive_rows_only(tmp_path):
    """Negative control for the summary: a passing row is never listed; a failed and an inconclusive one are.
    The summary is the tool's (`report --markdown --exit-code N --log PATH`); no result is NO RESULT, exit 2."""
    checks = [{"name": "ok", "kind": "theorem", "verdict": "proved", "failed": False, "inconclusive": False},
              {"name": "bad|pipe", "kind": "property", "verdict": "fail", "failed": True, "inconclusive": False,
               "case_file": "c.json", "message": "two\nlines"},
              {"name": "slow", "kind": "theorem", "verdict": "unknown", "failed": False, "inconclusive": True}]
    from fa3verify.summary import RunSummary

    data = RunSummary(command="gate").to_dict()
    data.update({"verdict": "fail", "checks": [dict(c, seconds=0.1, message=c.get("message", ""))
                                                for c in checks], "cases": 3, "failures": 1})
    (tmp_path / "gate.json").write_text(json.dumps(data))
    rc, text = _job_summary(tmp_path, "--exit-code", "1")
    assert rc == 0 and text.startswith("## fa3verify gate: FAIL (exit 1)")
    assert _table_rows(text) == ["bad\\|pipe", "slow"]
    (tmp_path / "gate.log").write_text("line one\nthe last line of the log\n")
    (tmp_path / "gate.json").write_text("{not json")
    rc, text = _job_summary(tmp_path, "--exit-code", "1", "--log", str(tmp_path / "gate.log"))
    assert rc == 2 and text.startswith("## fa3verify gate: NO RESULT (exit 1)") and "the last line" in text
    (tmp_path / "gate.json").unlink()
    rc, text = _job_summary(tmp_path, "--exit-code", "2")
    assert rc == 2 and text.startswith("## fa3verify gate: NO RESULT (exit 2)") and "no such file" in text
    from fa3verify.cli import main

    assert main(["report", str(tmp_path / "gate.json"), "--markdown", str(tmp_path / "s.md"),
                 "--exit-code", "256"]) == 2 and not (tmp_path / "s.md").exists()


def test_install_runs_venv_uv_torch_cpu_build_then_fa3_verify(tmp_path):
    proc = _run(tmp_path, "install", FA3VERIFY_DRY_RUN="1", FA3VERIFY_VENV=str(tmp_path / "v"))
    assert proc.returncode == 0, proc.stderr
    lines = [ln[len("run-gate: "):] for ln in proc.stderr.splitlines() if ln.startswith("run-gate: ")]
    py = str(tmp_path / "v" / "bin" / "python")
    assert lines == [f"{sys.executable} -m venv {tmp_path / 'v'}",
                     f"{py} -m pip install -q --disable-pip-version-check uv>=0.13",
                     f"{py} -m gpu_impl.engines.torch_build --python {py}",
                     f"{py} -m gpu_impl.engines.installers install --python {py} {ROOT}",
                     f"{tmp_path / 'v' / 'bin' / 'fa3verify'} --version"]  # the command starts, away from ROOT
    assert not (tmp_path / "v").exists()


def test_a_relative_venv_is_taken_from_the_directory_the_script_starts_in(tmp_path):
    """The workflow runs the steps from the workspace root with the default FA3VERIFY_VENV (.fa3verify-venv): every
    command names it as an absolute path under that root, although the script changes directory to run some."""
    proc = _run(tmp_path, "install", FA3VERIFY_DRY_RUN="1")
    assert proc.returncode == 0, proc.stderr
    venv = tmp_path / ".fa3verify-venv"
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("run-gate: ")]
    assert lines and all(str(venv) in ln for ln in lines), lines
    assert not any(" .fa3verify-venv" in ln for ln in lines)


def test_the_cache_key_is_the_recipes_hash(tmp_path):
    """Stable across runs; changes when an engine recipe changes (a copy of the sources with a layout bump)."""
    key = _run(tmp_path, "cache-key").stdout.strip()
    assert re.fullmatch(r"fa3verify-[0-9a-f]{16}", key) and _run(tmp_path, "cache-key").stdout.strip() == key
    copy = tmp_path / "src"
    for pkg in ("gpu_impl", "spec"):
        shutil.copytree(ROOT / pkg, copy / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    recipes = copy / "gpu_impl" / "engines" / "vllm" / "recipes.py"
    recipes.write_text(recipes.read_text().replace("LAYOUT_VERSION = 1", "LAYOUT_VERSION = 2"))
    other = _run(tmp_path, "cache-key", FA3VERIFY_SRC=str(copy)).stdout.strip()
    assert re.fullmatch(r"fa3verify-[0-9a-f]{16}", other) and other != key


@pytest.mark.parametrize("engine", sorted(WORKFLOWS))
def test_the_workflows_are_fork_safe_pinned_cached_and_run_the_script(engine):
    text = WORKFLOWS[engine].read_text()
    assert re.search(r"^permissions:\n  contents: read\n\n", text, re.M) and "checks:" not in text
    assert "GITHUB_STEP_SUMMARY" in SCRIPT.read_text() and "actions/upload-artifact@" in text
    # pinned to a commit: the placeholder is refused by the first step until it is a 40-hex sha
    ref = re.search(r"^\s+FA3VERIFY_REF: (\S+)", text, re.M).group(1)
    assert ref == "FA3VERIFY_COMMIT_SHA" and "^[0-9a-f]{40}$" in text and "v0.1.0" not in text
    # caches: pip, uv and the engine home, keyed by the recipe hash the script prints
    for path in ("~/.cache/pip", "~/.cache/uv", "~/.cache/fa3verify"):
        assert f"            {path}\n" in text
    assert "run-gate.sh cache-key" in text and "steps.key.outputs.key" in text
    steps = re.findall(r"\.fa3-verify/examples/ci/run-gate\.sh ([a-z-]+)", text)
    assert steps and set(steps) <= set(SUBCOMMANDS) and steps[-3:] == ["install", "gate", "report"]
    want = {"sglang": "FA3VERIFY_ENGINE: sglang-src=${{ github.workspace }}/python",
            "vllm": "FA3VERIFY_ENGINE: vllm-src=${{ github.workspace }}"}[engine]
    assert want in text


def test_the_vllm_workflow_gates_the_checkout_beside_a_registered_release(tmp_path):
    from gpu_impl.engines.vllm import recipes as vllm_recipes
    from gpu_impl.engines.vllm.host import nearest_vllm_release
    from gpu_impl.sut import parse_engine

    form = re.search(r"^\s+FA3VERIFY_ENGINE: (\S+ github.workspace }})", WORKFLOWS["vllm"].read_text(), re.M).group(1)
    spec = parse_engine(form.replace("${{ github.workspace }}", str(tmp_path)))
    assert spec.kind == "vllm-src" and spec.path == str(tmp_path)
    assert nearest_vllm_release(None) in vllm_recipes.RELEASES
    assert nearest_vllm_release("0.34.0.dev12+g1234") == vllm_recipes.RELEASES[-1]


# --- the recipe's real steps, as the workflow runs them --------------------------------------------------------


def _workspace(tmp_path) -> Path:
    """A workspace root as the workflow's checkouts leave it: fa3-verify's sources, a git checkout of this tree
    (tracked and untracked-but-not-ignored files, committed), in `.fa3-verify/`."""
    ws = tmp_path / "ws"
    dest = ws / ".fa3-verify"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split("\n")
    for rel in files:
        if rel and (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    git = ["git", "-c", "user.name=fa3-verify tests", "-c", "user.email=tests@localhost"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the tree under test"]):
        subprocess.run(git + cmd, cwd=dest, check=True, capture_output=True)
    return ws


def _stock_env(ws: Path, **extra) -> dict:
    """A runner's environment: nothing of this checkout (no PYTHONPATH, no .venv on PATH), the workflow's env."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FA3VERIFY_", "GITHUB_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and not p.startswith(str(ROOT)))
    env.update(GITHUB_STEP_SUMMARY=str(ws / "step-summary.md"), FA3VERIFY_OUT="fa3verify-out",
               FA3VERIFY_SEED="0")
    env.update(extra)
    return env


def _step(ws: Path, env: dict, *args, timeout=900):
    """One workflow step: `.fa3-verify/examples/ci/run-gate.sh SUBCOMMAND`, run from the workspace root."""
    return subprocess.run([".fa3-verify/examples/ci/run-gate.sh", *args], cwd=ws, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def _summary(ws: Path) -> str:
    text = (ws / "step-summary.md").read_text()
    (ws / "step-summary.md").unlink()
    return text


@pytest.mark.skipif(shutil.which("python3.11") is None, reason="no python3.11 on PATH: the install step's Python")
def test_the_recipe_installs_gates_and_reports_for_real_from_the_workspace_root(tmp_path):
    """install, gate and report as the workflow runs them: a violation is exit 1 and a FAIL summary whose replay
    lines run as typed; a broken installation is not a violation (exit 3, "does not start"); a crash is not one
    either; a failed install is reported as such."""
    import time

    ws = _workspace(tmp_path)
    env = _stock_env(ws, FA3VERIFY_GUARD="pre-fix", FA3VERIFY_CASES="20")
    seconds = {}
    t = time.monotonic()
    proc = _step(ws, env, "install")
    seconds["install"] = round(time.monotonic() - t, 1)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    venv = ws / ".fa3verify-venv"  # the default, relative to the workspace root
    out = ws / "fa3verify-out"
    assert (venv / "bin" / "fa3verify").is_file() and (out / "install.status").read_text().strip() == "ok"
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import fa3verify; print(fa3verify.__file__)"],
                          cwd=tmp_path, capture_output=True, text=True, env=env).stdout
    assert site.startswith(str(venv)), site  # installed, not the sources

    t = time.monotonic()
    proc = _step(ws, env, "gate")
    seconds["gate"] = round(time.monotonic() - t, 1)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "outcome").read_text().strip() == "violation" and (out / "exit-code").read_text().strip() == "1"
    t = time.monotonic()
    proc = _step(ws, env, "report")
    seconds["report"] = round(time.monotonic() - t, 1)
    assert proc.returncode == 0, proc.stderr
    summary = _summary(ws)
    assert summary.startswith("## fa3verify gate: FAIL (exit 1)") and (out / "gate.html").is_file()
    run = json.loads((out / "gate.json").read_text())
    assert run["findings"] and all(f["replay"].startswith("fa3verify replay ") for f in run["findings"])
    # a replay line runs as typed in the job's shell with the environment activated (docs/ci.md)
    activated = {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}"}
    replay = subprocess.run(["bash", "-c", run["findings"][0]["replay"]], cwd=ws, env=activated,
                            capture_output=True, text=True, timeout=600)
    assert replay.returncode == 1, replay.stdout[-2000:] + replay.stderr[-2000:]

    # a broken installation (the wheel without its data file): no gate, exit 3 even with inconclusive allowed
    forms = next((venv / "lib").glob("python3*/site-packages/gpu_impl/engine_forms.json"))
    forms.rename(forms.with_suffix(".moved"))
    proc = _step(ws, {**env, "FA3VERIFY_ALLOW_INCONCLUSIVE": "1"}, "gate")
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (out / "outcome").read_text().strip() == "not-installed" and "does not start" in proc.stderr
    assert _step(ws, env, "report").returncode == 0
    summary = _summary(ws)
    assert summary.startswith("## fa3verify gate: NO RESULT (exit 3: fa3verify does not start)"), summary
    assert "FAIL" not in summary.splitlines()[0] and "install step failed" not in summary
    forms.with_suffix(".moved").rename(forms)

    # a crash of a command that starts (exit 1, no verdict): exit 3, never read as a violation or allowed
    stub = ws / "crashing-fa3verify"
    stub.write_text('#!/usr/bin/env bash\n[ "$1" = --version ] && { echo "fa3verify 0.1.0"; exit 0; }\n'
                    'echo "Traceback (most recent call last):"; echo "RuntimeError: boom" >&2; exit 1\n')
    stub.chmod(0o755)
    crash = {**env, "FA3VERIFY_BIN": str(stub), "FA3VERIFY_ALLOW_INCONCLUSIVE": "1"}
    proc = _step(ws, crash, "gate")
    assert proc.returncode == 3 and (out / "outcome").read_text().strip() == "crash", proc.stderr
    assert _step(ws, crash, "report").returncode == 0
    summary = _summary(ws)
    assert summary.startswith("## fa3verify gate: NO RESULT (exit 3: the gate crashed)") and "boom" in summary

    # an install that fails: the report says so, and that the gate did not run
    for name in ("outcome", "exit-code", "gate.json"):
        (out / name).unlink(missing_ok=True)
    failed = {**env, "FA3VERIFY_VENV": "other-venv", "FA3VERIFY_PYTHON": str(tmp_path / "no-such-python")}
    proc = _step(ws, failed, "install")
    assert proc.returncode != 0 and (out / "install.status").read_text().startswith("failed: exit ")
    assert _step(ws, failed, "report").returncode == 0
    summary = _summary(ws)
    assert summary.startswith("## fa3verify gate: NOT RUN (the install step failed)"), summary
    assert "no-such-python" in summary  # the install log's last lines
    print("run-gate.sh steps from the workspace root (s):", seconds)


# --- the workflows' path filters cover what the backend reads ----------------------------------------------------

#: Per engine: the backend files whose imports the filter must cover (paths inside the installed package), the
#: folder of the package inside the engine's repository, and files read one hop further (with where from).
BACKENDS = {
    "sglang": (["sglang/srt/layers/attention/flashattention_backend.py"], "python/",
               {"python/sglang/srt/layers/dp_attention.py": "model_runner's get_attention_tp_size (attention TP)",
                "python/sglang/srt/runtime_context.py": "get_parallel(): the guard and attn_tp_size (0.5.18+)",
                "python/sglang/srt/distributed/parallel_state_wrapper.py":
                    "ParallelState, model_runner.ps: the precompute's tp_size (0.5.16 - 0.5.20)"}),
    "vllm": (["vllm/v1/attention/backends/flash_attn.py", "vllm/v1/attention/backends/fa_utils.py"], "",
             {"vllm/v1/worker/gpu_model_runner.py": "builds the common attention metadata the builder reads",
              "vllm/config/model.py": "get_num_attention_heads / get_num_kv_heads"}),
}

#: The filters as they were (a negative control: they miss what a pull request can break the guard through).
OLD_FILTERS = {"sglang": ["python/sglang/srt/layers/attention/**", "python/sglang/srt/model_executor/**",
                          "python/sglang/srt/server_args.py"],
               "vllm": ["vllm/v1/attention/**", "vllm/attention/**", "vllm/config/**"]}


def _filters(engine: str) -> list:
    text = WORKFLOWS[engine].read_text()
    block = re.search(r"^    paths:\n((?:      - .*\n)+)", text, re.M).group(1)
    return re.findall(r'^      - "([^"]+)"', block, re.M)


def _glob(pattern: str) -> "re.Pattern":
    """A GitHub path filter as a regex: ``**`` any characters, ``*`` any but ``/``, ``?`` one but ``/``."""
    out = ""
    for part in re.split(r"(\*\*|\*|\?)", pattern):
        out += {"**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
    return re.compile(out)


def _uncovered(paths, filters) -> list:
    globs = [_glob(f) for f in filters]
    return sorted(p for p in paths if not any(g.fullmatch(p) for g in globs))


def _imported_files(site: Path, backend_files: list, package: str) -> set:
    """Every file of ``package`` that the backend files import (module-level and in functions), as paths under
    ``site``: ``a.b`` as a/b.py or a/b/__init__.py; ``from a import b`` also a/b.py when b is a module."""
    import ast

    found = set()

    def add(module: str) -> bool:
        base = site / module.replace(".", "/")
        for cand in (base.with_suffix(".py"), base / "__init__.py"):
            if cand.is_file():
                found.add(str(cand.relative_to(site)))
                return True
        return False

    for rel in backend_files:
        if not (site / rel).is_file():  # a release that keeps it elsewhere (vLLM's fa_utils before 0.14)
            continue
        found.add(rel)
        for node in ast.walk(ast.parse((site / rel).read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package:
                add(node.module)
                for alias in node.names:
                    add(f"{node.module}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == package:
                        add(alias.name)
    return found


def _ready_sites(engine: str) -> dict:
    from gpu_impl.engines import envs
    from gpu_impl.engines.sglang import recipes
    from gpu_impl.engines.vllm import recipes as vllm_recipes

    releases = recipes.RELEASES if engine == "sglang" else vllm_recipes.RELEASES
    sites = {}
    for release in releases:
        if envs.env_ready(release, engine=engine):
            found = list(envs.env_dir(release, engine=engine).glob("lib/python3*/site-packages"))
            if found:
                sites[release] = found[0]
    return sites


@pytest.mark.parametrize("engine", sorted(WORKFLOWS))
def test_the_path_filter_covers_every_file_the_backend_reads(engine):
    """Derived from the code of every release whose engine environment is built: the backend files and every module
    of the engine they import, plus the files read one hop further (BACKENDS)."""
    backend_files, prefix, extra = BACKENDS[engine]
    filters = _filters(engine)
    assert ".github/workflows/fa3-verify.yml" in filters and _uncovered(extra, filters) == []
    sites = _ready_sites(engine)
    if not sites:
        pytest.skip(f"no built {engine} engine environment to read the releases' code from (make engines)")
    for release, site in sites.items():
        files = [prefix + f for f in _imported_files(site, backend_files, engine)]
        assert len(files) > len(backend_files) + 5, (release, files)  # the derivation found the imports
        assert _uncovered(files, filters) == [], (engine, release)


@pytest.mark.parametrize("engine", sorted(WORKFLOWS))
def test_the_old_path_filter_misses_what_the_derivation_finds(engine):
    """Negative control: the filters before they were derived miss files the backend reads (for sglang 0.5.23,
    runtime_context.py, where the guard and the head counts read attn_tp_size; and dp_attention.py)."""
    backend_files, prefix, extra = BACKENDS[engine]
    missed = _uncovered(extra, OLD_FILTERS[engine])
    if engine == "sglang":
        assert missed == ["python/sglang/srt/distributed/parallel_state_wrapper.py",
                          "python/sglang/srt/layers/dp_attention.py", "python/sglang/srt/runtime_context.py"]
    sites = _ready_sites(engine)
    for release, site in sites.items():
        missed += _uncovered([prefix + f for f in _imported_files(site, backend_files, engine)], OLD_FILTERS[engine])
    if engine == "vllm" and not sites:
        pytest.skip("no built vllm engine environment to read the releases' code from (make engines)")
    assert missed


def test_the_filter_glob_follows_github_semantics():
    assert _glob("a/**").fullmatch("a/b/c.py") and not _glob("a/*").fullmatch("a/b/c.py")
    assert _glob("a/*.py").fullmatch("a/x.py") and not _glob("a/*.py").fullmatch("a/b/x.py")
    assert _glob("f*.py").fullmatch("flash_attention_v4.py") and not _glob("a.py").fullmatch("axpy")
