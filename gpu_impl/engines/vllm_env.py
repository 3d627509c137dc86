"""The isolated, cached engine environment for one vLLM release (data: :data:`RECIPES`; code: :func:`ensure_env`).

Invariant: an environment is used only when its stamp holds the hash of the current recipe and its import probe
(``vllm.v1.attention.backends.flash_attn`` with the CPU glue installed, FA3 chosen) passed; otherwise it is
rebuilt. It lives under ``$FA3VERIFY_ENGINE_HOME`` (or ``~/.cache/fa3verify/engines``) as ``vllm-V``; only
directories this module made (marked) are removed. Builds are serialised by a file lock.

What goes in (found by importing vLLM 0.33.0 on CPU; docs/engines-vllm.md): the CPU torch of the project, vLLM
itself without dependencies (its wheel pins torch 2.14 with CUDA), the light pure-Python packages the backend's
import chain asks for, ``xgrammar`` and ``triton`` without dependencies. Constraints keep torch the CPU build and
make torchvision / torchaudio / torchcodec unresolvable (each replaces or breaks the CPU torch; transformers
probes torchvision, so the sglang fakes' torchvision stand-in is on the driver's path).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from .envs import FAKES_DIR, PROJECT_ROOT, engine_home
from .errors import EnvSetupError, UnknownRelease

__all__ = ["RECIPES", "RELEASES", "check_release", "driver_environ", "ensure_env", "env_dir", "env_ready",
           "setup_times"]

MARKER = ".fa3verify-env"
STAMP = ".fa3verify-stamp.json"
LAYOUT_VERSION = 1

#: Per release: what its environment installs. ``light`` with dependencies (under the constraints),
#: ``no_deps`` without.
RECIPES = {
    "0.33.0": {
        "torch": "torch==2.13.0",
        "constraints": ["torch==2.13.0", "torchvision==0.0.0", "torchaudio==0.0.0", "torchcodec==0.0.0"],
        "light": ["numpy", "packaging", "regex", "cachetools", "psutil", "tqdm", "pyyaml", "pydantic", "msgspec",
                  "cloudpickle", "blake3", "py-cpuinfo", "pyzmq", "einops", "typing_extensions", "filelock",
                  "requests", "cbor2", "pybase64", "orjson", "transformers>=5.16.1,<5.21.0", "aiohttp",
                  "oss-harmony", "openai", "pillow", "uvloop", "prometheus_client", "opentelemetry-api",
                  "starlette", "partial_json_parser", "fastapi", "llguidance<1.8.0,>=1.7.0",
                  "apache-tvm-ffi==0.1.11"],
        "no_deps": ["xgrammar==0.2.8", "triton==3.9.0"],
    },
}
RELEASES = tuple(RECIPES)

PROBE = ("from gpu_impl.engines import vllm_glue; vllm_glue.install(); "
         "import vllm.v1.attention.backends.fa_utils as u; import vllm.v1.attention.backends.flash_attn; "
         "v = u.get_flash_attn_version(); assert v == 3, v; print('fa', v)")


def check_release(release: str) -> str:
    if release not in RECIPES:
        raise UnknownRelease(f"vllm=={release}: not a vLLM release this suite knows (registered: "
                             f"{', '.join(RELEASES)})")
    return release


def env_dir(release: str, root: Optional[Path] = None) -> Path:
    return (root or engine_home()) / f"vllm-{release}"


def _hash(release: str) -> str:
    data = {"layout": LAYOUT_VERSION, "release": release, **RECIPES[release]}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _stamp(d: Path) -> Optional[dict]:
    try:
        return json.loads((d / STAMP).read_text())
    except (OSError, ValueError):
        return None


def env_ready(release: str, root: Optional[Path] = None) -> bool:
    d = env_dir(release, root)
    st = _stamp(d)
    return bool(st and st.get("recipe") == _hash(release) and (d / "bin" / "python").exists())


def setup_times(release: str, root: Optional[Path] = None) -> Optional[dict]:
    st = _stamp(env_dir(release, root))
    return None if st is None else st.get("seconds")


def driver_environ(base: Optional[dict] = None) -> dict:
    """The driver's environment: the project root and the torchvision stand-in on PYTHONPATH, one torch thread."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(FAKES_DIR), str(PROJECT_ROOT)])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONNOUSERSITE"] = "1"
    env["VLLM_LOGGING_LEVEL"] = env.get("VLLM_LOGGING_LEVEL", "ERROR")
    env.pop("PYTHONHOME", None)
    return env


def _run(release: str, step: str, cmd: list, env: Optional[dict] = None, timeout: int = 1800) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EnvSetupError(f"vllm=={release}: set-up step '{step}' took over {timeout}s") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip() and "WARNING: Location" not in ln]
        raise EnvSetupError(f"vllm=={release}: set-up step '{step}' failed (exit {proc.returncode}):\n    "
                            + "\n    ".join(lines[-12:]))
    return proc.stdout


def _python() -> str:
    explicit = os.environ.get("FA3VERIFY_ENGINE_PYTHON")
    if explicit:
        return explicit
    if sys.version_info[:2] == (3, 11):
        return getattr(sys, "_base_executable", None) or sys.executable
    found = shutil.which("python3.11")
    if not found:
        raise EnvSetupError("the vLLM engine environment needs python3.11 (set FA3VERIFY_ENGINE_PYTHON to one)")
    return found


def ensure_env(release: str, progress: Callable[[str], None] = print, root: Optional[Path] = None,
               wheel: Optional[str] = None) -> Path:
    """The directory of vLLM ``release``'s environment, built now if missing or stale. ``wheel``: a local copy of
    the release's wheel to install instead of asking the registry (``$FA3VERIFY_VLLM_WHEEL``)."""
    release = check_release(release)
    root = root or engine_home()
    d = env_dir(release, root)
    if env_ready(release, root):
        return d
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"vllm-{release}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not env_ready(release, root):
            _build(release, d, progress, wheel or os.environ.get("FA3VERIFY_VLLM_WHEEL"))
    return d


def _build(release: str, d: Path, progress, wheel: Optional[str]) -> None:
    recipe = RECIPES[release]
    if d.exists():
        if not (d / MARKER).exists():
            raise EnvSetupError(f"vllm=={release}: {d} exists and was not made by fa3-verify; remove it or set "
                                f"FA3VERIFY_ENGINE_HOME to another directory")
        shutil.rmtree(d)
    seconds: dict = {}
    start = time.monotonic()

    def step(name: str, cmd: list, env=None) -> str:
        progress(f"vllm=={release}: {name}")
        t = time.monotonic()
        out = _run(release, name, cmd, env)
        seconds[name] = round(time.monotonic() - t, 1)
        return out

    step("create venv", [_python(), "-m", "venv", str(d)])
    (d / MARKER).write_text("made by fa3-verify (gpu_impl/engines/vllm_env.py); safe to delete\n")
    py = str(d / "bin" / "python")
    cons = d / "constraints.txt"
    cons.write_text("\n".join(recipe["constraints"]) + "\n")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(cons)]
    step("install torch (CPU)", pip + [recipe["torch"]])
    step(f"install vllm=={release} (no deps)", pip + ["--no-deps", wheel or f"vllm=={release}"])
    step("install light dependencies", pip + list(recipe["light"]))
    step("install xgrammar, triton (no deps)", pip + ["--no-deps"] + list(recipe["no_deps"]))
    tv = step("check torch", [py, "-c", "import torch; print(torch.__version__)"]).strip()
    if not tv.startswith(recipe["torch"].split("==")[1]) or "+cpu" not in tv:
        raise EnvSetupError(f"vllm=={release}: torch became {tv!r}; the engine needs the CPU build {recipe['torch']}")
    step("import probe", [py, "-c", PROBE], env=driver_environ())
    seconds["total"] = round(time.monotonic() - start, 1)
    (d / STAMP).write_text(json.dumps({"recipe": _hash(release), "release": release, "seconds": seconds}, indent=1))
    progress(f"vllm=={release}: environment ready in {seconds['total']}s ({d})")
