"""Isolated, cached engine environments: one venv per sglang release, built from ``recipes.recipe(release)``.

Invariant: an environment is used only when its stamp holds the hash of the current recipe and its import probe
(sglang's ``flashattention_backend`` with the fakes on the path) passed; otherwise it is rebuilt from scratch.
The root is ``$FA3VERIFY_ENGINE_HOME`` or ``~/.cache/fa3verify/engines``. Only directories this module created
(marked with ``.fa3verify-env``) are ever removed. Builds of one release are serialised with a file lock, so two
test sessions (or two helpers) sharing the cache do not race.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from . import recipes
from .errors import EnvSetupError, NoPrecompute, UnknownRelease

__all__ = ["FAKES_DIR", "PROJECT_ROOT", "check_release", "engine_home", "ensure_env", "env_dir", "env_python",
           "env_ready", "driver_environ", "setup_times"]

FAKES_DIR = Path(__file__).resolve().parent / "fakes"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
MARKER = ".fa3verify-env"
STAMP = ".fa3verify-stamp.json"

#: What the import probe imports: the backend module (which pulls in the FA3 dispatcher) and its test kit parent.
PROBE = "import sglang.srt.layers.attention.flashattention_backend"


def engine_home() -> Path:
    """Where engine environments live: ``$FA3VERIFY_ENGINE_HOME`` or ``~/.cache/fa3verify/engines``."""
    env = os.environ.get("FA3VERIFY_ENGINE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fa3verify" / "engines"


def check_release(release: str) -> str:
    """The release if this suite can drive it; else NoPrecompute (< 0.5.11) or UnknownRelease (not registered)."""
    try:
        known_form = recipes.has_precompute(release)
    except ValueError:
        raise UnknownRelease(f"sglang=={release}: not a release number (registered: {_registered()})") from None
    if not known_form:
        raise NoPrecompute(f"sglang=={release}: sglang {release} has no FA3 metadata precompute (first in "
                           f"{recipes.FIRST_PRECOMPUTE}): nothing to gate")
    base = release.split(".post")[0]
    if base not in recipes.RELEASES:
        raise UnknownRelease(f"sglang=={release}: not a release this suite knows (registered: {_registered()})")
    return base


def _registered() -> str:
    return f"{recipes.RELEASES[0]} .. {recipes.RELEASES[-1]}"


def env_dir(release: str, root: Optional[Path] = None) -> Path:
    return (root or engine_home()) / f"sglang-{release}"


def env_python(release: str, root: Optional[Path] = None) -> Path:
    return env_dir(release, root) / "bin" / "python"


def _read_stamp(path: Path) -> Optional[dict]:
    try:
        return json.loads((path / STAMP).read_text())
    except (OSError, ValueError):
        return None


def env_ready(release: str, root: Optional[Path] = None) -> bool:
    """Whether the release's environment exists, is stamped with the current recipe and passed its probe."""
    d = env_dir(release, root)
    stamp = _read_stamp(d)
    return bool(stamp and stamp.get("recipe") == recipes.recipe_hash(release) and (d / "bin" / "python").exists())


def setup_times(release: str, root: Optional[Path] = None) -> Optional[dict]:
    """Seconds each build step took when the environment was made (from its stamp), or None."""
    stamp = _read_stamp(env_dir(release, root))
    return None if stamp is None else stamp.get("seconds")


def driver_environ(extra_paths=(), base: Optional[dict] = None) -> dict:
    """The environment a driver process runs with: the checkout (if any), the fakes and the project root first on
    ``PYTHONPATH``; sglang's FA3 dispatcher pinned to sgl_kernel; one torch thread."""
    env = dict(os.environ if base is None else base)
    paths = [str(p) for p in extra_paths] + [str(FAKES_DIR), str(PROJECT_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["SGLANG_USE_SGL_FA3_KERNEL"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONNOUSERSITE"] = "1"
    env.pop("PYTHONHOME", None)
    return env


def _base_python() -> str:
    explicit = os.environ.get("FA3VERIFY_ENGINE_PYTHON")
    if explicit:
        return explicit
    if sys.version_info[:2] == (3, 11):
        return getattr(sys, "_base_executable", None) or sys.executable
    found = shutil.which("python3.11")
    if not found:
        raise EnvSetupError("engine environments need python3.11 (set FA3VERIFY_ENGINE_PYTHON to one)")
    return found


def _run(step: str, cmd: list, release: str, env: Optional[dict] = None, timeout: int = 1800) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EnvSetupError(f"sglang=={release}: environment set-up step '{step}' took over {timeout}s") from None
    except OSError as exc:
        raise EnvSetupError(f"sglang=={release}: environment set-up step '{step}' could not start: {exc}") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip() and "WARNING: Location" not in ln]
        tail = "\n    ".join(lines[-12:])
        raise EnvSetupError(f"sglang=={release}: environment set-up step '{step}' failed (exit {proc.returncode}):"
                            f"\n    {tail}")
    return proc.stdout


_PIN = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(\[[^\]]*\])?\s*==\s*([^;\s,]+)\s*$")


def wheel_pins(requires: list) -> dict:
    """Exact, unconditional pins (``name==version`` without an environment marker) of a wheel's Requires-Dist,
    by normalised name."""
    out = {}
    for line in requires or ():
        m = _PIN.match(line)
        if m:
            out[_norm(m.group(1))] = m.group(3)
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(names, pins: dict) -> list:
    return [f"{n}=={pins[_norm(n)]}" if _norm(n) in pins else n for n in names]


def ensure_env(release: str, progress: Callable[[str], None] = print, root: Optional[Path] = None) -> Path:
    """The directory of release ``release``'s engine environment, built now if missing or stale."""
    release = check_release(release)
    root = root or engine_home()
    d = env_dir(release, root)
    if env_ready(release, root):
        return d
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"sglang-{release}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if env_ready(release, root):  # built by someone else while we waited
            return d
        _build(release, d, progress)
    return d


def _build(release: str, d: Path, progress: Callable[[str], None]) -> None:
    if d.exists():
        if not (d / MARKER).exists():
            raise EnvSetupError(f"sglang=={release}: {d} exists and was not made by fa3-verify; remove it or set "
                                f"FA3VERIFY_ENGINE_HOME to another directory")
        progress(f"sglang=={release}: recipe changed or build incomplete; rebuilding {d}")
        shutil.rmtree(d)
    seconds: dict = {}
    start = time.monotonic()

    def step(name: str, cmd: list, env: Optional[dict] = None) -> str:
        progress(f"sglang=={release}: {name}")
        t = time.monotonic()
        out = _run(name, cmd, release, env=env)
        seconds[name] = round(time.monotonic() - t, 1)
        return out

    step("create venv", [_base_python(), "-m", "venv", str(d)])
    (d / MARKER).write_text("made by fa3-verify (gpu_impl/engines/envs.py); safe to delete\n")
    py = str(d / "bin" / "python")
    cons = d / "constraints.txt"
    cons.write_text("\n".join(recipes.CONSTRAINTS) + "\n")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(cons)]
    step("install torch (CPU)", pip + [recipes.TORCH])
    step(f"install sglang=={release} (no deps)", pip + ["--no-deps", f"sglang=={release}"])
    requires = json.loads(step("read sglang's pins", [py, "-c", "import importlib.metadata as m, json; "
                                                      "print(json.dumps(m.requires('sglang')))"]))
    pins = {**wheel_pins(requires), **{_norm(k): v for k, v in recipes.pins_for(release).items()}}
    step("install light dependencies", pip + _requirements(recipes.LIGHT, pins))
    step("install triton, xgrammar (no deps)", pip + ["--no-deps"] + _requirements(recipes.NO_DEPS, pins))
    torch_version = step("check torch", [py, "-c", "import torch; print(torch.__version__)"]).strip()
    if not torch_version.startswith(recipes.TORCH.split("==")[1]) or "+cpu" not in torch_version:
        raise EnvSetupError(f"sglang=={release}: torch became {torch_version!r}; the engine needs the CPU build "
                            f"{recipes.TORCH}")
    step("import probe", [py, "-c", PROBE], env=driver_environ())
    seconds["total"] = round(time.monotonic() - start, 1)
    (d / STAMP).write_text(json.dumps({"recipe": recipes.recipe_hash(release), "release": release,
                                       "pins": pins, "seconds": seconds}, indent=1))
    progress(f"sglang=={release}: environment ready in {seconds['total']}s ({d})")
