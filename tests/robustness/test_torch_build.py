"""Where torch's CPU build comes from (gpu_impl/engines/torch_build.py): both branches of the one decision, probed
through pip with a fake index configuration (a temp folder of fake wheels as the only find-links, no index, no
configuration file), and the configured branch installed for real from a fake wheel into a fresh venv.

The stock-index branch cannot be installed here (the machine reaches no PyTorch wheel host); its command line is
checked instead: uv with ``--torch-backend cpu`` and the plain pinned requirement.
"""

import os
import subprocess
import sys
import venv
import zipfile

import pytest

from gpu_impl.engines import torch_build
from gpu_impl.engines.sglang import recipes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAG = "cp311-cp311-manylinux_2_28_x86_64"


def fake_index_environ(wheels_dir) -> dict:
    """This process's environment with pip's configuration replaced: only ``wheels_dir``, no index, no file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels_dir),
               PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONPATH=ROOT)
    return env


def fake_wheels(folder, *names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")  # pip lists versions from file names; nothing reads these
    return folder


def test_the_decision_prefers_the_configured_cpu_build_then_uv_then_refuses():
    got = torch_build.plan("torch==2.13.0", ["2.14.0", "2.13.0+cpu", "2.13.0"], uv_available=False)
    assert (got.source, got.requirement, got.installer_args) == ("configured", "torch==2.13.0+cpu", ())
    got = torch_build.plan("torch==2.13.0", ["2.14.0+cpu", "2.13.0", "2.13.0+cu128"], uv_available=True)
    assert (got.source, got.requirement, got.installer_args) == ("uv-cpu-backend", "torch==2.13.0",
                                                                 ("--torch-backend", "cpu"))
    with pytest.raises(torch_build.NoCpuTorch, match=r"2\.13\.0\+cpu.*offer no CPU build.*install uv"):
        torch_build.plan("torch==2.13.0", ["2.13.0"], uv_available=False)
    with pytest.raises(ValueError, match="torch requirement"):
        torch_build.cpu_version("torch>=2.1")
    assert torch_build.cpu_version(recipes.TORCH) == "2.13.0+cpu"


def test_pip_index_listing_is_parsed_and_a_missing_listing_is_no_versions():
    text = "torch (2.13.0+cpu)\nAvailable versions: 2.13.0+cpu, 2.13.0\n  INSTALLED: 2.13.0+cpu\n"
    assert torch_build.parse_versions(text) == ["2.13.0+cpu", "2.13.0"]
    assert torch_build.parse_versions("ERROR: No matching distribution found for torch") == []


@pytest.mark.parametrize("names, source", [
    ((f"torch-2.13.0+cpu-{TAG}.whl", f"torch-2.13.0-{TAG}.whl"), "configured"),   # this machine's kind of set-up
    ((f"torch-2.13.0-{TAG}.whl", f"torch-2.14.0-{TAG}.whl"), "uv-cpu-backend"),   # a stock index: CUDA builds only
    ((), "uv-cpu-backend"),                                                         # nothing offered at all
])
def test_both_branches_from_a_fake_index_configuration(tmp_path, names, source):
    env = fake_index_environ(fake_wheels(tmp_path / "wheels", *names))
    offered = torch_build.offered_versions(sys.executable, environ=env)
    assert ("2.13.0+cpu" in offered) == (source == "configured")
    assert torch_build.plan(recipes.TORCH, offered, uv_available=True).source == source
    # the command-line helper decides the same way and prints the command it would run
    proc = subprocess.run([sys.executable, "-m", "gpu_impl.engines.torch_build", "--dry-run"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    command = proc.stderr.strip().splitlines()[-1]
    if source == "configured":
        assert " pip install " in command and command.endswith(" torch==2.13.0+cpu")
        assert "--torch-backend" not in command
    else:
        assert " pip install " in command and "--torch-backend cpu" in command and command.endswith("torch==2.13.0")
        assert "--no-index" in command  # pip's configuration (here: no index) still applies to everything else


def _minimal_torch_wheel(folder):
    """A wheel named and versioned like torch's CPU build whose module reports that version and no CUDA."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "torch-2.13.0+cpu-py3-none-any.whl"
    info = "torch-2.13.0+cpu.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("torch/__init__.py", "__version__ = '2.13.0+cpu'\nclass version:\n    cuda = None\n")
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return folder


def test_the_configured_branch_installs_the_cpu_build_into_a_fresh_environment(tmp_path):
    env = fake_index_environ(_minimal_torch_wheel(tmp_path / "wheels"))
    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(target)
    py = str(target / "bin" / "python")
    proc = subprocess.run([sys.executable, "-m", "gpu_impl.engines.torch_build", "--python", py], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([py, "-c", "import torch; print(torch.__version__, torch.version.cuda)"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env={"PATH": os.environ.get("PATH", "")})
    assert out.stdout.split() == ["2.13.0+cpu", "None"], out.stderr


def test_no_cpu_build_and_no_uv_is_exit_2_with_the_way_out(tmp_path):
    """Negative control: with uv hidden and only a CUDA build offered, the helper refuses (exit 2), one line."""
    env = fake_index_environ(fake_wheels(tmp_path / "wheels", f"torch-2.13.0-{TAG}.whl"))
    code = ("import sys; from gpu_impl.engines import installers, torch_build; installers.find_uv = lambda: None; "
            "sys.exit(torch_build.main(['--dry-run']))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "offer no CPU build" in lines[0] and "install uv" in lines[0]


def test_make_setup_installs_uv_then_torch_through_the_one_decision():
    """``make setup`` never installs a bare ``torch==2.13.0`` (a stock index resolves that to the CUDA build)."""
    text = open(os.path.join(ROOT, "Makefile")).read()
    recipe = text[text.index("$(STAMP): pyproject.toml"):text.index("check: $(STAMP)")]
    uv_at, torch_at = recipe.index('pip install -q "uv>=0.13"'), recipe.index("-m gpu_impl.engines.torch_build")
    assert uv_at < torch_at and '"torch==2.13.0"' not in recipe
