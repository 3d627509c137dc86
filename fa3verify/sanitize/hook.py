"""Activation at interpreter start: ``FA3VERIFY_SANITIZE=raise|warn|record`` through a ``.pth`` file.

Invariant: the hook does nothing -- not even an import of this package -- unless ``FA3VERIFY_SANITIZE`` is set,
and when it is set every interpreter of that environment (serving engines' spawned workers included) is
sanitized from its first FA3 import on; a value outside raise|warn|record stops the interpreter with exit
status 2 and a message naming the variable (never a silent run without checks).

The ``.pth`` file (:data:`PTH_NAME`) holds optional directory lines (added to ``sys.path``) and one import line,
:data:`PTH_LINE`. ``fa3verify sanitize install-hook [--venv PATH] [--add-path DIR]`` writes it into the
environment's ``site-packages`` (``make setup`` does so for the project's ``.venv``); it never replaces a
different file of that name. At start only a tiny import watcher is registered; the sanitizer itself (torch,
refmodel) loads when the first FA3 entry-point module is imported.

Variables: ``FA3VERIFY_SANITIZE`` (mode), ``FA3VERIFY_SANITIZE_DIR`` (output folder, default
``./fa3verify-sanitize``), ``FA3VERIFY_SANITIZE_DEEP=1`` (deep checks: a device sync per call),
``FA3VERIFY_SANITIZE_NUM_SM`` (the device's SM count, 1..1024; default: read from the device).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from . import DEFAULT_DIR, ENV_DEEP, ENV_DIR, ENV_MODE, ENV_NUM_SM, MODES, checked_num_sm

PTH_NAME = "fa3verify_sanitize.pth"
PTH_LINE = ("import os; os.environ.get('FA3VERIFY_SANITIZE') and "
            "__import__('fa3verify.sanitize.hook').sanitize.hook.start()\n")

__all__ = ["PTH_NAME", "PTH_LINE", "start", "pth_text", "write_pth", "remove_pth", "HookFileError"]

_started = False


class HookFileError(ValueError):
    """The .pth file cannot be written or removed as asked (the message names the path and why)."""


def _settings() -> tuple:
    mode = os.environ.get(ENV_MODE, "").strip()
    if mode not in MODES:
        sys.stderr.write(f"fa3verify: {ENV_MODE}: must be one of {', '.join(MODES)} (or unset), got {mode!r}; "
                         f"not starting without the checks it asks for\n")
        sys.stderr.flush()
        os._exit(2)   # at interpreter start (site), SystemExit would become a site-import failure
    deep = os.environ.get(ENV_DEEP, "").strip().lower() in ("1", "true", "yes")
    if os.environ.get(ENV_NUM_SM, "").strip():
        try:
            checked_num_sm(os.environ[ENV_NUM_SM], ENV_NUM_SM)
        except ValueError as exc:
            sys.stderr.write(f"fa3verify: {exc}; not starting without the checks it asks for\n")
            sys.stderr.flush()
            os._exit(2)
    return mode, deep, os.environ.get(ENV_DIR) or DEFAULT_DIR


def start() -> None:
    """Called by the .pth line when FA3VERIFY_SANITIZE is set: validate it, then sanitize from the first FA3 import."""
    global _started
    if _started:
        return
    mode, deep, out_dir = _settings()
    _started = True
    from .targets import ENTRY_POINTS, EntryPointFinder, install_finder, remove_finder

    def full_install(_module=None) -> None:
        import fa3verify.sanitize as sanitize

        remove_finder(finder)
        sanitize.install(mode=mode, deep=deep, out_dir=out_dir)   # writes its log summary at exit

    finder = EntryPointFinder(ENTRY_POINTS, full_install)
    if any(name in sys.modules for name in ENTRY_POINTS):
        full_install()
    else:
        install_finder(finder)


def pth_text(add_paths: Sequence[str] = ()) -> str:
    """The .pth file's content: directory lines, then the activation line."""
    lines = [str(Path(p).resolve()) + "\n" for p in add_paths]
    return "".join(lines) + PTH_LINE


def write_pth(site_packages, add_paths: Sequence[str] = ()) -> tuple:
    """Write the hook into ``site_packages``: ``(path, "written" | "unchanged")``; HookFileError if a different
    file of that name is there (it is never replaced) or the folder does not exist."""
    d = Path(site_packages)
    if not d.is_dir():
        raise HookFileError(f"--venv: site-packages folder does not exist: {d}")
    for p in add_paths:
        if not Path(p).is_dir():
            raise HookFileError(f"--add-path: not a directory: {p}")
    path = d / PTH_NAME
    text = pth_text(add_paths)
    if path.exists():
        if path.read_text() == text:
            return path, "unchanged"
        raise HookFileError(f"{path}: exists with different content; not replacing it (remove it with "
                            f"`fa3verify sanitize uninstall-hook` if fa3verify wrote it, then install again)")
    path.write_text(text)
    return path, "written"


def remove_pth(site_packages) -> tuple:
    """Remove the hook file if fa3verify wrote it: ``(path, "removed" | "absent")``; HookFileError otherwise."""
    path = Path(site_packages) / PTH_NAME
    if not path.exists():
        return path, "absent"
    lines = path.read_text().splitlines(keepends=True)
    if not lines or lines[-1] != PTH_LINE or not all(Path(line.strip()).is_absolute() for line in lines[:-1]):
        raise HookFileError(f"{path}: was not written by fa3verify (its last line is not the activation line); "
                            f"not removing it")
    path.unlink()
    return path, "removed"


def site_packages_of(python: Optional[str] = None) -> str:
    """The purelib folder of the interpreter ``python`` (default: this one)."""
    import subprocess
    import sysconfig

    if python is None:
        return sysconfig.get_paths()["purelib"]
    # always ask that interpreter: a venv's bin/python is a symlink to the same binary as other venvs'
    # (resolving it would name the wrong environment)
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise HookFileError(f"--venv: {python} did not run: {out.stderr.strip()[:300]}")
    return out.stdout.strip()
