"""The package as a user installs it, without a clone: the wheel carries every data file the code reads, installs
into a fresh environment by the README's own lines (torch's CPU build first, then the wheel), and every command
runs from a directory that has nothing to do with the repository.

The wheel is built once per module (``pip wheel --no-deps --no-build-isolation`` of a copy of the tracked sources,
so nothing is written into the checkout). The fresh environment takes torch from uv's cache (hard links, the
README's ``python -m gpu_impl.engines.torch_build``) and the other dependencies from the configured indexes.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("spec", "refmodel", "gpu_impl", "fa3verify")
README = ROOT / "README.md"

#: Reads anchored above a package (``parents[2]``, ``parent.parent.parent``, two ``dirname``s): each names a
#: folder of the source tree that an installed package does not have, and what the code does without it.
SOURCE_TREE_ONLY = {
    "gpu_impl/engines/envs.py": "PROJECT_ROOT: the folder holding the packages (a path for the engine driver, no "
                                "file read; installed: envs.project_path links the packages alone)",
    "fa3verify/catalogue/entries.py": "tests/corpus: the catalogue's corpus (a case file is listed only when present)",
    "fa3verify/gpu_check/runner.py": "tests/gpu: gpu-check's pytest stage (inconclusive, naming the folder, when absent)",
    "fa3verify/z3_cache.py": "the folder holding the four packages, whose .py/.json the cache key hashes (installed: "
                             "site-packages, where the same four packages are)",
}
_ABOVE = re.compile(r"parents\[[1-9]\]|parent\.parent|dirname\(os\.path\.dirname")


def _sources() -> list:
    """The files a build sees: tracked and untracked-but-not-ignored (what a fresh clone plus local edits holds)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split("\n")
    return sorted(p for p in out if p and (ROOT / p).is_file())


def _build(tmp: Path, pyproject_text: str | None = None) -> Path:
    src, out = tmp / "src", tmp / "dist"
    for rel in _sources():
        if rel.split("/")[0] in PACKAGES or rel in ("pyproject.toml", "README.md"):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    if pyproject_text is not None:
        (src / "pyproject.toml").write_text(pyproject_text)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           str(src), "-w", str(out)], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = out.glob("*.whl")
    return wheel


def _package_files() -> list:
    return [p for p in _sources() if p.split("/")[0] in PACKAGES and "__pycache__" not in p]


def _read_targets() -> dict:
    """{module: [files or folders its ``__file__``-anchored reads name]}: every string constant of a statement that
    mentions ``__file__`` that names an existing path beside the module (or under its ``data``-like folder)."""
    found = {}
    for rel in _package_files():
        if not rel.endswith(".py"):
            continue
        text = (ROOT / rel).read_text(encoding="utf-8")
        if "__file__" not in text:
            continue
        here = (ROOT / rel).parent
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.Return, ast.Expr)):
                continue
            if not any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(node)):
                continue
            words = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            for i in range(len(words)):  # "data", "x.json" -> data/x.json; each suffix that exists beside the module
                for j in range(i + 1, len(words) + 1):
                    target = here.joinpath(*words[i:j]) if all("/" not in w and w for w in words[i:j]) else None
                    if target is not None and target.exists() and target != here:
                        found.setdefault(rel, set()).add(str(target.relative_to(ROOT)))
    return {k: sorted(v) for k, v in found.items()}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    t = time.monotonic()
    path = _build(tmp_path_factory.mktemp("wheel"))
    print(f"wheel built in {time.monotonic() - t:.1f}s")
    return path


def _missing(wheel: Path) -> list:
    """Every file of the four packages (data and code) that the wheel lacks."""
    names = set(zipfile.ZipFile(wheel).namelist())
    return [p for p in _package_files() if p not in names]


def test_the_wheel_carries_every_file_of_the_packages(wheel):
    assert _missing(wheel) == []
    names = set(zipfile.ZipFile(wheel).namelist())
    reads = _read_targets()
    # the reads the audit must see (a guard against an audit that finds nothing)
    assert "gpu_impl/engine_forms.json" in reads["gpu_impl/sut.py"]
    assert "gpu_impl/engines/fakes" in reads["gpu_impl/engines/envs.py"]
    assert "fa3verify/fidelity_vectors" in reads["fa3verify/fidelity_builds.py"]
    for module, targets in reads.items():
        for target in targets:
            files = [target] if (ROOT / target).is_file() else \
                [str(p.relative_to(ROOT)) for p in (ROOT / target).rglob("*") if p.is_file()
                 and "__pycache__" not in p.parts]
            assert files and all(f in names for f in files), (module, target, [f for f in files if f not in names])


def test_reads_above_a_package_are_the_known_source_tree_ones():
    """A module that reads through a path above its package reads the source tree, which an installed package
    does not have: each such module is listed with what it does without that folder."""
    above = set()
    for rel in _package_files():
        if rel.endswith(".py"):
            for line in (ROOT / rel).read_text(encoding="utf-8").splitlines():
                if "__file__" in line and _ABOVE.search(line):
                    above.add(rel)
    assert above == set(SOURCE_TREE_ONLY)


def test_the_audit_catches_a_data_file_left_out(tmp_path):
    """Negative control: the package-data table as it was (no gpu_impl/*.json, no fakes' METADATA) builds a wheel
    the audit refuses, naming both files."""
    text = (ROOT / "pyproject.toml").read_text()
    old = re.sub(r'^gpu_impl = \["\*\.json"\]\n', "", text, flags=re.M)
    old = old.replace('"gpu_impl.engines" = ["fakes/*.dist-info/METADATA"]\n', "")
    assert old != text
    missing = _missing(_build(tmp_path, old))
    assert "gpu_impl/engine_forms.json" in missing
    assert any(m.endswith(".dist-info/METADATA") and "/fakes/" in m for m in missing), missing


def test_the_torch_requirement_is_loose_as_written_and_the_readme_installs_the_cpu_build_before_it(wheel):
    """torch stays `torch>=2.1` in the wheel (a GPU machine keeps its CUDA build); so the README installs the
    package without dependencies, then torch's CPU build, and only then the dependencies (which torch satisfies)."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    torch = [line for line in meta.splitlines() if re.match(r"Requires-Dist: torch\b", line)]
    assert torch == ["Requires-Dist: torch>=2.1"]
    assert '"torch>=2.1",' in (ROOT / "pyproject.toml").read_text()
    lines = _readme_install_lines()
    first_with_deps = next(i for i, line in enumerate(lines) if ".whl" in line and "--no-deps" not in line)
    torch_line = next(i for i, line in enumerate(lines) if "-m gpu_impl.engines.torch_build" in line)
    no_deps = next(i for i, line in enumerate(lines) if ".whl" in line and "--no-deps" in line)
    assert no_deps < torch_line < first_with_deps and "uv" in lines[no_deps].split()


def test_a_broken_installation_is_exit_3_naming_the_error_not_a_traceback(tmp_path):
    """The console script's launcher: a package without engine_forms.json (the wheel before its package-data was
    fixed) fails every command with exit 3 and one line, never a traceback with exit 1 ("violation found")."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / "site" / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "site" / "gpu_impl" / "engine_forms.json").unlink()
    run = tmp_path / "elsewhere"
    run.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    env.pop("FA3VERIFY_TRACEBACK", None)
    proc = subprocess.run([sys.executable, "-m", "fa3verify", "--help"], cwd=run, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error: FileNotFoundError" in proc.stderr
    assert "engine_forms.json" in proc.stderr


def _readme_install_lines() -> list:
    text = README.read_text()
    section = text.split("## Install without a clone", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """A fresh environment made by the README's lines, run as written (bash, from the wheel's folder)."""
    lines = _readme_install_lines()
    assert any("torch_build" in line for line in lines) and lines[0].startswith("python3.11 -m venv ")
    where = tmp_path_factory.mktemp("install")
    assert all(wheel.name in line for line in lines if ".whl" in line), (wheel.name, lines)
    shutil.copy(wheel, where / wheel.name)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(ROOT)))  # nothing of the checkout's .venv
    if shutil.which("python3.11", path=env["PATH"]) is None:
        pytest.skip("no python3.11 on PATH: the README's first line cannot run here")
    seconds = {}
    for line in lines:
        t = time.monotonic()
        proc = subprocess.run(["bash", "-c", line], cwd=where, env=env, capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)
        seconds[line] = round(time.monotonic() - t, 1)
        assert proc.returncode == 0, (line, proc.stdout[-3000:], proc.stderr[-3000:])
    print("README install lines:", seconds)
    venv = where / lines[0].split()[-1]
    return venv, env, seconds, proc.stdout


def _run(installed, *args, cwd, timeout=600):
    venv, env, _, _ = installed
    return subprocess.run([str(venv / "bin" / "fa3verify"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_the_readme_lines_install_the_cpu_build_and_the_package_alone(installed):
    venv, env, seconds, check_out = installed
    assert "verdict: PASS" in check_out  # the README's last line: `fa3verify check` from the wheel's folder
    py = str(venv / "bin" / "python")
    probe = ("import torch, fa3verify, gpu_impl, importlib.metadata as m; "
             "print(torch.__version__, torch.version.cuda, fa3verify.__file__, gpu_impl.__file__, "
             "m.version('fa3-verify'))")
    out = subprocess.run([py, "-c", probe], cwd=venv.parent, env=env, capture_output=True, text=True,
                         timeout=300).stdout.split()
    assert out[0] == "2.13.0+cpu" and out[1] == "None", out
    site = str(venv / "lib")
    assert out[2].startswith(site) and out[3].startswith(site) and out[4] == "0.1.0", out  # the wheel, not ROOT


def test_every_command_runs_from_an_unrelated_directory(installed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    times = {}

    def timed(name, *args, **kw):
        t = time.monotonic()
        proc = _run(installed, *args, cwd=elsewhere, **kw)
        times[name] = round(time.monotonic() - t, 1)
        return proc

    proc = timed("help", "--help")
    assert proc.returncode == 0 and "usage: fa3verify" in proc.stdout, proc.stderr
    proc = timed("prove", "prove", "--only", "prefill-cp-hazard", "--only", "guard-soundness")
    assert proc.returncode == 0 and "verdict: PASS" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = timed("fuzz", "fuzz", "--cases", "20")
    assert proc.returncode == 0 and "verdict: PASS" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    # a violation: the printed replay line runs as typed in the same directory (the script's own path)
    proc = timed("fuzz-pre-fix", "fuzz", "--guard", "pre-fix", "--cases", "60", "--out", "cases")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [ln.strip()[len("replay: "):] for ln in proc.stdout.splitlines() if ln.strip().startswith("replay: ")]
    assert lines and shlex.split(lines[0])[:2] == [str(installed[0] / "bin" / "fa3verify"), "replay"], lines
    replay = subprocess.run(["bash", "-c", lines[0]], cwd=elsewhere, env=installed[1], capture_output=True,
                            text=True, timeout=300)
    assert replay.returncode == 1 and "STILL FAILS" in replay.stdout, replay.stdout[-2000:] + replay.stderr
    print("commands from an unrelated directory (s):", times)


def test_an_engine_gate_runs_from_the_installed_package(installed, tmp_path):
    """The engine driver imports the installed packages alone (envs.project_path), with the engine environment's
    own torch, numpy and the rest."""
    venv, env, _, _ = installed
    code = ("from gpu_impl.engines import envs; import json; "
            "print(json.dumps([envs.env_ready('0.5.23'), envs.driver_environ()['PYTHONPATH']]))")
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    import json

    ready, pythonpath = json.loads(proc.stdout)
    for entry in pythonpath.split(os.pathsep):
        assert not (Path(entry) / "numpy").exists() and not (Path(entry) / "torch").exists(), entry
    links = Path(pythonpath.split(os.pathsep)[-1])
    assert sorted(os.listdir(links)) == sorted(PACKAGES)
    if not ready:
        shutil.rmtree(links)
        pytest.skip("no ready sglang 0.5.23 environment under the engine home (make engines builds it)")
    t = time.monotonic()
    try:
        proc = _run(installed, "gate", "--engine", "sglang==0.5.23", "--cases", "5", cwd=tmp_path)
    finally:
        shutil.rmtree(links)  # this installation's links (its folder is a temporary one)
    print(f"gate --engine sglang==0.5.23 --cases 5: {time.monotonic() - t:.1f}s")
    assert proc.returncode == 0 and "verdict: PASS" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "sglang==0.5.23" in proc.stdout
