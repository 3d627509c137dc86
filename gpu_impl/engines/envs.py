"""Isolated, cached engine environments: one venv per engine release (``sglang-V``, ``vllm-V``), built from that
release's recipe (data: ``recipes`` for sglang, ``vllm_recipes`` for vLLM) by one builder.

Invariant: an environment is used only when its stamp holds the hash of the current recipe and its import probe
(the engine's attention backend with the fakes on the path) passed; otherwise it is rebuilt from scratch. The
root is ``$FA3VERIFY_ENGINE_HOME`` or ``~/.cache/fa3verify/engines``. Only directories this module created
(marked with ``.fa3verify-env``) are ever removed. Builds of one release are serialised with a file lock, so two
test sessions (or two helpers) sharing the cache do not race. The installer (uv or pip, ``installers``) is not
part of the recipe: an environment built by either is valid for the same recipe, and stamps written before the
installer was recorded stay valid. torch's CPU build is asked for as ``torch_build.plan`` decides (the configured
indexes' ``+cpu`` build, else uv's ``--torch-backend cpu`` on every install, else a refusal before anything is
built); whatever installs, torch must still be the CPU build afterwards.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from spec.process.worker_client import WorkerError, run_command

from . import installers, torch_build
from .sglang import recipes
from .vllm import recipes as vllm_recipes
from .errors import EnvSetupError, NoPrecompute, ReleaseUnavailable, UnknownRelease

__all__ = ["FAKES_DIR", "KINDS", "PROJECT_ROOT", "PACKAGES", "project_path", "check_release", "engine_home", "ensure_env", "env_dir",
           "env_python", "env_ready", "driver_environ", "recipe_hash", "setup_times", "install_steps",
           "BuildLockTimeout", "wait_for_build_lock"]

FAKES_DIR = Path(__file__).resolve().parent / "fakes"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
MARKER = ".fa3verify-env"
STAMP = ".fa3verify-stamp.json"

#: What sglang's import probe imports: the backend module (which pulls in the FA3 dispatcher).
PROBE = "import sglang.srt.layers.attention.flashattention_backend"


def _check_sglang(release: str) -> str:
    """The release if this suite can drive it; else NoPrecompute (< 0.5.11) or UnknownRelease (not registered)."""
    registered = f"{recipes.RELEASES[0]} .. {recipes.RELEASES[-1]}"
    try:
        known_form = recipes.has_precompute(release)
    except ValueError:
        raise UnknownRelease(f"sglang=={release}: not a release number (registered: {registered})") from None
    if not known_form:
        raise NoPrecompute(f"sglang=={release}: sglang {release} has no FA3 metadata precompute (first in "
                           f"{recipes.FIRST_PRECOMPUTE}): nothing to gate")
    base = release.split(".post")[0]
    if base not in recipes.RELEASES:
        raise UnknownRelease(f"sglang=={release}: not a release this suite knows (registered: {registered}); "
                             + next_step("sglang", release))
    return base


def _check_vllm(release: str) -> str:
    """The registered row that runs ``release``; ReleaseUnavailable (exit 3) for a surveyed release this suite cannot
    run, with its reason; UnknownRelease (exit 2) otherwise."""
    row = vllm_recipes.row_of(release)
    if row is not None:
        return row
    if release in vllm_recipes.WITHOUT_PRECOMPUTE:
        raise NoPrecompute(f"vllm=={release}: vLLM {release}'s FlashAttention backend has no FA3 metadata precompute "
                           f"(get_scheduler_metadata first in {vllm_recipes.FIRST_PRECOMPUTE}): nothing to gate")
    if release in vllm_recipes.UNAVAILABLE:
        raise ReleaseUnavailable(f"vllm=={release}: unavailable: {vllm_recipes.UNAVAILABLE[release]} "
                                 f"(gpu_impl/engines/vllm/releases.json)")
    if release not in vllm_recipes.RECIPES:
        raise UnknownRelease(f"vllm=={release}: not a vLLM release this suite knows (registered: "
                             f"{', '.join(vllm_recipes.RELEASES)}); " + next_step("vllm", release))
    return release


#: Per engine: the source form that runs code of any version, and what its PATH names.
_SOURCE_FORMS = {"sglang": ("sglang-src=PATH", "its checkout's python/ or its wheel"),
                 "vllm": ("vllm-src=PATH", "its checkout's root or its wheel")}


def next_step(engine: str, release: str) -> str:
    """What to do about an unregistered ``engine==release``: the nearest registered release, and the source form
    that runs that version's own code beside it (``recipes.nearest_release`` / ``vllm.nearest_vllm_release``: the
    newest registered release at or before it, else the oldest)."""
    if engine == "vllm":
        from .vllm.host import nearest_vllm_release

        nearest = nearest_vllm_release(release)
    else:
        nearest = recipes.nearest_release(release)
    form, what = _SOURCE_FORMS[engine]
    text = (f"the nearest supported release is {engine}=={nearest}; to run {engine} {release}'s own code, use "
            f"{form} ({what}), which runs beside {engine}=={nearest}'s environment")
    if engine == "vllm":  # which driver generation that runs it, and what registering the release takes
        text += "; " + vllm_recipes.unregistered_message(release)
    return text


def _sglang_pins(release: str, requires: list) -> dict:
    """The wheel's own exact pins, overridden by the recipe's per-release table."""
    return {**wheel_pins(requires), **{_norm(k): v for k, v in recipes.pins_for(release).items()}}


@dataclass(frozen=True)
class EngineKind:
    """What differs between engines for the builder and the driver environment (all else is one code path)."""

    name: str                       #: spec prefix and directory prefix (``sglang-0.5.23``)
    check: Callable[[str], str]     #: the release as registered, or UnknownRelease / NoPrecompute
    recipe: Callable[[str], dict]   #: the hashed recipe: torch, constraints, light, no_deps (+ pins)
    probe: str                      #: Python source run in the new environment with the driver's environment
    #: (release, the wheel's Requires-Dist) -> pins for names in light / no_deps; None: the wheel is not read
    pins: Optional[Callable[[str, list], dict]] = None
    #: release -> whether its build reads the wheel's pins at all (vLLM: only rows with ``wheel_pins``)
    reads_pins: Callable[[str], bool] = lambda release: True
    environ: dict = field(default_factory=dict)           #: set in the driver's environment
    environ_defaults: dict = field(default_factory=dict)  #: set there unless already set
    wheel_variable: Optional[str] = None                  #: names a local wheel to install instead of the release


KINDS = {
    "sglang": EngineKind("sglang", _check_sglang, recipes.recipe, PROBE, pins=_sglang_pins,
                         environ={"SGLANG_USE_SGL_FA3_KERNEL": "1"}),
    "vllm": EngineKind("vllm", _check_vllm, vllm_recipes.recipe, vllm_recipes.PROBE,
                       pins=vllm_recipes.wheel_requirements, reads_pins=vllm_recipes.reads_wheel_pins,
                       environ_defaults={"VLLM_LOGGING_LEVEL": "ERROR"},
                       wheel_variable=vllm_recipes.WHEEL_VARIABLE),
}


def _kind(engine: str) -> EngineKind:
    try:
        return KINDS[engine]
    except KeyError:
        raise UnknownRelease(f"engine {engine!r}: no environment recipe (allowed: {', '.join(KINDS)})") from None


#: This project's packages: what a driver process imports of it.
PACKAGES = ("spec", "refmodel", "gpu_impl", "fa3verify")


def project_path() -> Path:
    """The folder a driver process imports this project's packages from (first on its ``PYTHONPATH``, and its
    working directory). From a source tree (``pyproject.toml`` beside the packages) the tree itself. Installed as a
    package, ``PROJECT_ROOT`` is the installing environment's site-packages, which also holds its own torch, numpy
    and the rest: on the path they would shadow the engine environment's pinned packages, so the driver gets a
    folder under the engine home that holds links to the four packages alone (one per installation, made once,
    atomically)."""
    if (PROJECT_ROOT / "pyproject.toml").is_file():
        return PROJECT_ROOT
    import hashlib
    import tempfile

    home = engine_home()
    farm = home / f"project-{hashlib.sha256(str(PROJECT_ROOT).encode()).hexdigest()[:16]}"

    def linked() -> bool:
        return all(os.path.islink(farm / p) and os.path.realpath(farm / p) == os.path.realpath(PROJECT_ROOT / p)
                   for p in PACKAGES) and sorted(os.listdir(farm)) == sorted(PACKAGES)

    if farm.is_dir() and linked():
        return farm
    home.mkdir(parents=True, exist_ok=True)
    if farm.is_dir():  # links of another shape (never expected: the name hashes the installation's path)
        shutil.rmtree(farm, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=home, prefix=".project-"))
    for p in PACKAGES:
        os.symlink(PROJECT_ROOT / p, tmp / p)
    try:
        os.rename(tmp, farm)
    except OSError:  # another process made it first: its links are the same
        shutil.rmtree(tmp, ignore_errors=True)
    if not linked():
        raise EnvSetupError(f"{farm}: could not make the folder of links to fa3-verify's packages")
    return farm


def engine_home() -> Path:
    """Where engine environments live: ``$FA3VERIFY_ENGINE_HOME`` or ``~/.cache/fa3verify/engines``."""
    env = os.environ.get("FA3VERIFY_ENGINE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fa3verify" / "engines"


def check_release(release: str, engine: str = "sglang") -> str:
    """The release as registered if this suite can drive it, else UnknownRelease (or NoPrecompute for sglang)."""
    return _kind(engine).check(release)


def recipe_hash(release: str, engine: str = "sglang") -> str:
    """The hash a ready environment's stamp must hold (sglang: ``recipes.recipe_hash``, unchanged)."""
    if engine == "sglang":
        return recipes.recipe_hash(release)
    return recipes.hash_recipe(_kind(engine).recipe(release))


def env_dir(release: str, root: Optional[Path] = None, engine: str = "sglang") -> Path:
    return (root or engine_home()) / f"{_kind(engine).name}-{release}"


def env_python(release: str, root: Optional[Path] = None, engine: str = "sglang") -> Path:
    return env_dir(release, root, engine) / "bin" / "python"


def _read_stamp(path: Path) -> Optional[dict]:
    try:
        return json.loads((path / STAMP).read_text())
    except (OSError, ValueError):
        return None


def stamp_valid(stamp: Optional[dict], release: str, engine: str = "sglang") -> bool:
    """Whether a stamp was written for the current recipe. Only the recipe hash counts: stamps without the
    ``engine`` / ``installer`` fields (written before those were recorded) are valid for the same package set."""
    return bool(stamp and stamp.get("recipe") == recipe_hash(release, engine)
                and stamp.get("engine", engine) == engine)


def env_ready(release: str, root: Optional[Path] = None, engine: str = "sglang") -> bool:
    """Whether the release's environment exists, is stamped with the current recipe and passed its probe."""
    d = env_dir(release, root, engine)
    return stamp_valid(_read_stamp(d), release, engine) and (d / "bin" / "python").exists()


def setup_times(release: str, root: Optional[Path] = None, engine: str = "sglang") -> Optional[dict]:
    """Seconds each build step took when the environment was made (from its stamp), or None."""
    stamp = _read_stamp(env_dir(release, root, engine))
    return None if stamp is None else stamp.get("seconds")


def driver_environ(extra_paths=(), base: Optional[dict] = None, engine: str = "sglang") -> dict:
    """The environment a driver process runs with: the checkout (if any), the fakes and the project root first on
    ``PYTHONPATH``; the engine's own variables (sglang's FA3 dispatcher pinned to sgl_kernel; vLLM's log level);
    one torch thread; no user site; bytecode written unless a checkout is on the path (a uv-built environment
    compiles what the engine imports on first import; a user's checkout is not written to)."""
    kind = _kind(engine)
    env = dict(os.environ if base is None else base)
    paths = [str(p) for p in extra_paths] + [str(FAKES_DIR), str(project_path())]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(kind.environ)
    for key, value in kind.environ_defaults.items():
        env.setdefault(key, value)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONNOUSERSITE"] = "1"
    env.pop("PYTHONHOME", None)
    if not extra_paths:  # the environment keeps the bytecode of what the engine imports
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:  # never in a user's checkout, whatever the caller's environment says
        env["PYTHONDONTWRITEBYTECODE"] = "1"
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


def _run(what: str, step: str, cmd: list, env: Optional[dict] = None, timeout: int = 1800) -> str:
    try:
        proc = run_command(cmd, timeout, text=True, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EnvSetupError(f"{what}: environment set-up step '{step}' took over {timeout}s") from None
    except OSError as exc:
        raise EnvSetupError(f"{what}: environment set-up step '{step}' could not start: {exc}") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip() and "WARNING: Location" not in ln]
        tail = "\n    ".join(lines[-12:])
        raise EnvSetupError(f"{what}: environment set-up step '{step}' failed (exit {proc.returncode}):"
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
    """Bare names with their pins: a version (``5.8.1``) as ``==``, a specifier (``<5.23.0,>=5.16.1``) as is."""
    def pinned(n: str) -> str:
        pin = pins.get(_norm(n))
        if pin is None:
            return n
        return f"{n}{pin}" if pin[0] in "<>=!~" else f"{n}=={pin}"

    return [pinned(n) for n in names]


def package_steps(release: str, engine: str = "sglang", wheel: Optional[str] = None,
                  torch: Optional[str] = None) -> list:
    """(step name, installer arguments) of the first installs: the CPU torch (``torch``: the requirement
    ``torch_build.plan`` chose; default the recipe's), then the engine without deps."""
    kind, rec = _kind(engine), _kind(engine).recipe(release)
    return [("install torch (CPU)", [torch or rec["torch"]]),
            (f"install {kind.name}=={release} (no deps)", ["--no-deps", wheel or f"{kind.name}=={release}"])]


def install_steps(release: str, engine: str = "sglang", pins: Optional[dict] = None) -> list:
    """(step name, installer arguments) of the dependency installs, the engine's pins applied to bare names."""
    rec, pins = _kind(engine).recipe(release), pins or {}
    no_deps = list(rec["no_deps"])
    return [("install light dependencies", _requirements(rec["light"], pins)),
            (f"install {', '.join(re.split(r'[=<>!~ ]', n)[0] for n in no_deps)} (no deps)",
             ["--no-deps"] + _requirements(no_deps, pins))]


def ensure_env(release: str, progress: Callable[[str], None] = print, root: Optional[Path] = None,
               engine: str = "sglang", wheel: Optional[str] = None) -> Path:
    """The directory of the release's engine environment, built now if missing or stale. ``wheel``: a local copy
    of the release's wheel to install instead of asking the registry (default: the engine's wheel variable)."""
    kind = _kind(engine)
    release = kind.check(release)
    root = root or engine_home()
    d = env_dir(release, root, engine)
    if env_ready(release, root, engine) and not _altered(kind, release, d, progress):
        return d
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{kind.name}-{release}.lock", "a+") as lock:
        wait_for_build_lock(lock, f"{kind.name}=={release}")
        if env_ready(release, root, engine):
            if not record_mismatch(kind, d):
                return d  # built (or repaired) by someone else while we waited
            (d / STAMP).unlink()  # not the release's code any more: rebuilt below
        if wheel is None and kind.wheel_variable:
            wheel = os.environ.get(kind.wheel_variable) or None
        _build(kind, release, d, progress, wheel)
    return d


def record_mismatch(kind: EngineKind, d: Path) -> list:
    """The files of environment ``d``'s engine package that differ from its wheel's RECORD (or why there is no
    RECORD to check against); [] when the package is the release's own code (gpu_impl/engines/env_integrity.py)."""
    from .env_integrity import modified_files

    try:
        return modified_files(d, kind.name)
    except FileNotFoundError as exc:
        return [f"no RECORD to check against ({exc})"]


def _altered(kind: EngineKind, release: str, d: Path, progress: Callable[[str], None]) -> bool:
    """Whether the ready environment ``d``'s engine package differs from its wheel's RECORD (a module edited after
    the install): such an environment would be judged in the release's name, so it is rebuilt, naming the files."""
    changed = record_mismatch(kind, d)
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        progress(f"{kind.name}=={release}: {len(changed)} file(s) of {d} differ from the release's RECORD ({shown}); "
                 f"rebuilding the environment")
    return bool(changed)


class BuildLockTimeout(WorkerError):
    """Another process held a release's build lock past the engine deadline: inconclusive (exit 3), not a pass."""


#: How often a waiting build looks at the lock again.
LOCK_POLL_S = 0.2


def wait_for_build_lock(lock, what: str, deadline_s: Optional[float] = None) -> None:
    """Take the exclusive build lock of `lock` (an open file) within the engine deadline.

    Invariant: no build waits forever: past ``deadline_s`` (default the engine deadline,
    ``$FA3VERIFY_ENGINE_TIMEOUT`` or 900 s) it raises BuildLockTimeout naming the holder's pid, which the holder
    writes into the lock file once it has the lock.
    """
    from .worker_client import engine_timeout_s

    seconds = engine_timeout_s(deadline_s)
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                lock.seek(0)
                holder = lock.read().strip() or "unknown"
                raise BuildLockTimeout(f"{what}: another build (pid {holder}) held {lock.name} for over {seconds:g} "
                                       f"s; inconclusive (wait for it, or raise FA3VERIFY_ENGINE_TIMEOUT)",
                                       worker=f"engine build {what}", timed_out=True) from None
            time.sleep(LOCK_POLL_S)
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()}\n")
    lock.flush()


def _build(kind: EngineKind, release: str, d: Path, progress: Callable[[str], None], wheel: Optional[str]) -> None:
    what = f"{kind.name}=={release}"
    rec = kind.recipe(release)
    if d.exists():
        if not (d / MARKER).exists():
            raise EnvSetupError(f"{what}: {d} exists and was not made by fa3-verify; remove it or set "
                                f"FA3VERIFY_ENGINE_HOME to another directory")
        progress(f"{what}: recipe changed or build incomplete; rebuilding {d}")
        shutil.rmtree(d)
    seconds: dict = {}
    start = time.monotonic()

    def step(name: str, cmd: list, env: Optional[dict] = None) -> str:
        progress(f"{what}: {name}")
        t = time.monotonic()
        out = _run(what, name, cmd, env=env)
        seconds[name] = round(time.monotonic() - t, 1)
        return out

    py = str(d / "bin" / "python")
    try:
        installer = installers.choose(py)
        torch_plan = torch_build.plan(rec["torch"], torch_build.offered_versions(), installer.uv is not None)
    except ValueError as exc:  # a bad installer choice, or torch_build.NoCpuTorch: nothing is built
        raise EnvSetupError(f"{what}: {exc}") from None
    note = f" ({installer.note})" if installer.note and installer.note != installer.name else ""
    progress(f"{what}: installing with {installer.name}{note}; {torch_plan.note}")
    step("create venv", installer.venv_command(_base_python(), str(d)))
    (d / MARKER).write_text("made by fa3-verify (gpu_impl/engines/envs.py); safe to delete\n")
    cons = d / "constraints.txt"
    cons.write_text("\n".join(rec["constraints"]) + "\n")

    def install(name: str, args: list) -> str:
        extra = list(torch_plan.installer_args)  # uv's CPU backend on every install, or nothing
        return step(name, installer.command(extra + ["-c", str(cons)] + list(args)), env=installer.environ)

    for name, args in package_steps(release, kind.name, wheel, torch=torch_plan.requirement):
        install(name, args)
    pins: dict = {}
    if kind.pins is not None and kind.reads_pins(release):
        requires = json.loads(step(f"read {kind.name}'s pins", [py, "-c", "import importlib.metadata as m, json; "
                                                                f"print(json.dumps(m.requires({kind.name!r})))"]))
        pins = kind.pins(release, requires)
    for name, args in install_steps(release, kind.name, pins):
        install(name, args)
    check_torch(what, rec["torch"], step("check torch", [py, "-c", "import torch; print(torch.__version__, "
                                                                   "torch.version.cuda)"],
                                         env=driver_environ(engine=kind.name)))
    step("import probe", [py, "-c", kind.probe], env=driver_environ(engine=kind.name))
    changed = record_mismatch(kind, d)
    if changed:  # stamped, this environment would be rebuilt on every use
        raise EnvSetupError(f"{what}: the installed {kind.name} does not match its own RECORD: "
                            f"{', '.join(changed[:5])}")
    seconds["total"] = round(time.monotonic() - start, 1)
    (d / STAMP).write_text(json.dumps({"recipe": recipe_hash(release, kind.name), "engine": kind.name,
                                       "release": release, "pins": pins, "installer": installer.name,
                                       "torch_source": torch_plan.source,
                                       "seconds": seconds}, indent=1))
    progress(f"{what}: environment ready in {seconds['total']}s with {installer.name} ({d})")


def check_torch(what: str, torch_req: str, printed: str) -> None:
    """EnvSetupError unless the environment's torch (``version cuda`` as printed) is the pinned CPU build."""
    version, _, cuda = printed.strip().partition(" ")
    want = torch_req.split("==")[1]
    if version.split("+")[0] != want or "+cpu" not in version or cuda.strip() != "None":
        raise EnvSetupError(f"{what}: torch became {version!r} (CUDA {cuda.strip() or '?'}); the engine needs the CPU "
                            f"build {torch_req}")


def parse_target(text: str) -> tuple:
    """``"0.5.23"`` / ``"sglang==0.5.23"`` -> ("sglang", "0.5.23"); ``"vllm==0.33.0"`` -> ("vllm", "0.33.0")."""
    engine, sep, release = text.partition("==")
    if not sep:
        return "sglang", text
    if engine not in KINDS:
        raise UnknownRelease(f"{text}: no engine {engine!r} (allowed: {', '.join(f'{k}==V' for k in KINDS)})")
    return engine, release


def build_jobs() -> int:
    """How many environments ``main`` builds at once: ``$FA3VERIFY_ENV_JOBS``, else 1 (side-by-side builds are
    opt-in: a fresh clone's first side-by-side run raced in uv's ``find_uv_bin`` over ``sysconfig``)."""
    text = os.environ.get("FA3VERIFY_ENV_JOBS", "")
    if text:
        try:
            jobs = int(text)
        except ValueError:
            jobs = 0
        if jobs < 1:
            raise EnvSetupError(f"FA3VERIFY_ENV_JOBS: want a whole number >= 1, got {text!r}")
        return jobs
    return 1


def main(argv=None) -> int:
    """``python -m gpu_impl.engines.envs TARGET...``: build (or reuse) the environments, print seconds per step.
    A target is an sglang release (``0.5.23``) or ``ENGINE==V`` (``sglang==0.5.23``, ``vllm==0.33.0``).

    Every target is checked before anything is built; the builds then run side by side (:func:`build_jobs`), and
    the result lines come in the targets' order. Any failure is exit 2, after the other builds have ended."""
    import argparse
    from concurrent.futures import ThreadPoolExecutor

    parser = argparse.ArgumentParser(prog="python -m gpu_impl.engines.envs",
                                     description="Build or reuse cached engine environments, side by side "
                                                 "(FA3VERIFY_ENV_JOBS at a time; default 1).")
    parser.add_argument("targets", nargs="+", metavar="TARGET",
                        help="sglang release (0.5.23) or ENGINE==V (sglang==0.5.23, vllm==0.33.0)")
    args = parser.parse_args(argv)
    from .errors import EngineUnavailable

    try:
        targets = [parse_target(t) for t in dict.fromkeys(args.targets)]
        for engine, release in targets:
            _kind(engine).check(release)
        jobs = build_jobs()
    except EngineUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def one(target: tuple) -> str:
        engine, release = target
        start = time.monotonic()
        d = ensure_env(release, engine=engine)
        return (f"{engine}=={release}: {d} ({time.monotonic() - start:.1f}s now; built in "
                f"{(setup_times(release, engine=engine) or {}).get('total', '?')}s)")

    import sysconfig

    sysconfig.get_config_vars()  # filled once here, not by the builds' threads at once (uv's find_uv_bin reads it)
    with ThreadPoolExecutor(max_workers=min(jobs, len(targets))) as pool:
        futures = [pool.submit(one, t) for t in targets]
    code = 0
    for future in futures:
        try:
            print(future.result())
        except EngineUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            code = 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
