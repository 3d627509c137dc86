"""Where torch's CPU build comes from: the package indexes pip's configuration names, or uv's CPU backend.

Invariant: torch is installed as its CPU build (the local version ``+cpu``) whatever the machine's configuration:
when the configured indexes (index-url, extra-index-url, find-links, as ``pip index versions torch`` lists them)
offer ``torch==V+cpu``, that exact version is asked for; when they do not, uv is asked with its own CPU-backend
option (``uv pip install --torch-backend cpu``: uv knows where PyTorch's CPU wheels are, so this project names no
index); with neither, the install is refused with a message saying what to configure. :func:`plan` is the one
decision; :func:`offered_versions` is the probe it decides from; ``python -m gpu_impl.engines.torch_build``
installs torch that way (``make setup`` and examples/ci/run-gate.sh run it; exit 0 installed, 2 not). Used by the engine builder
(``envs``), whose torch check after the install still refuses anything but the pinned CPU build.

Simplifications: the probe is pip's own listing of the versions its configuration offers to this interpreter
(``pip index versions``; it reads no wheel and downloads nothing); a probe that fails (no network, no pip) counts
as "no CPU build offered", so the uv branch, which needs no configured CPU build, is taken.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

__all__ = ["TorchPlan", "NoCpuTorch", "CPU_BACKEND_ARGS", "cpu_version", "offered_versions", "parse_versions",
           "plan", "install_command"]

#: uv's own option for PyTorch's CPU wheels (added to every uv install of an environment in that branch).
CPU_BACKEND_ARGS = ("--torch-backend", "cpu")

#: The probe's command after the interpreter: what pip's configuration offers for torch.
PROBE_ARGS = ("-m", "pip", "index", "versions", "torch", "--disable-pip-version-check")

_AVAILABLE = re.compile(r"^\s*Available versions:\s*(.*)$", re.MULTILINE)


class NoCpuTorch(ValueError):
    """Neither the configured indexes nor an installer with a CPU backend can give torch's CPU build."""


@dataclass(frozen=True)
class TorchPlan:
    """How torch gets installed: ``requirement`` through an installer with ``installer_args`` added.

    ``source`` is ``"configured"`` (the indexes offer the ``+cpu`` build) or ``"uv-cpu-backend"``."""

    source: str
    requirement: str
    installer_args: tuple
    note: str


def cpu_version(requirement: str) -> str:
    """``"torch==2.13.0"`` -> ``"2.13.0+cpu"``. ValueError unless the requirement pins one exact version."""
    name, sep, version = requirement.partition("==")
    if name.strip() != "torch" or not sep or not re.fullmatch(r"[0-9][0-9A-Za-z.]*", version.strip()):
        raise ValueError(f"torch requirement: want 'torch==X.Y.Z', got {requirement!r}")
    return version.strip() + "+cpu"


def parse_versions(text: str) -> list:
    """The versions of ``pip index versions`` output (its "Available versions:" line); [] when there is none."""
    m = _AVAILABLE.search(text or "")
    return [v.strip() for v in m.group(1).split(",") if v.strip()] if m else []


def offered_versions(python: Optional[str] = None, environ: Optional[dict] = None, timeout_s: float = 300) -> list:
    """The torch versions the configured indexes offer to ``python``'s pip (files and ``PIP_*`` variables as that
    pip reads them); [] when pip lists none or the probe cannot run."""
    try:
        proc = subprocess.run([python or sys.executable, *PROBE_ARGS], capture_output=True, text=True,
                              timeout=timeout_s, env=environ, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_versions(proc.stdout) if proc.returncode == 0 else []


def plan(requirement: str, offered, uv_available: bool) -> TorchPlan:
    """The one decision: the configured ``+cpu`` build when ``offered`` holds it, else uv's CPU backend when uv is
    the installer, else NoCpuTorch naming what to configure."""
    want = cpu_version(requirement)
    if want in set(offered or ()):
        return TorchPlan("configured", f"torch=={want}", (), f"torch {want} from the configured package indexes")
    if uv_available:
        return TorchPlan("uv-cpu-backend", requirement, CPU_BACKEND_ARGS,
                         f"the configured package indexes offer no torch {want}: uv {' '.join(CPU_BACKEND_ARGS)}")
    raise NoCpuTorch(f"torch {want}: the configured package indexes offer no CPU build and uv (whose "
                     f"{' '.join(CPU_BACKEND_ARGS)} would fetch one) is not the installer: install uv "
                     f"(`python -m pip install uv`; FA3VERIFY_INSTALLER=uv) or add an index or wheel folder that has "
                     f"it (PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS)")


def install_command(python: str, decided: TorchPlan) -> tuple:
    """(command, environment) installing torch into ``python``'s environment as ``decided`` says, through the
    installer ``installers.choose`` picks (uv with pip's configuration translated, else pip); uv's CPU backend
    needs uv (ValueError without it)."""
    from . import installers

    inst = installers.choose(python, want=None if decided.source == "configured" else "uv")
    return inst.command([*decided.installer_args, decided.requirement]), inst.environ


def main(argv=None) -> int:
    """``python -m gpu_impl.engines.torch_build [--python PY] [--dry-run]``: install torch's CPU build into PY's
    environment (default: this interpreter's), the way :func:`plan` decides. Exit 2 when no way is left."""
    from . import installers
    from .sglang import recipes

    parser = argparse.ArgumentParser(prog="python -m gpu_impl.engines.torch_build",
                                     description="Install torch's CPU build (the project's pinned version).")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose environment gets torch")
    parser.add_argument("--dry-run", action="store_true", help="print the decision and the command; install nothing")
    args = parser.parse_args(argv)
    try:
        decided = plan(recipes.TORCH, offered_versions(), installers.find_uv() is not None)
        cmd, env = install_command(args.python, decided)
    except (NoCpuTorch, ValueError) as exc:
        print(f"torch_build: error: {exc}", file=sys.stderr)
        return 2
    print(f"torch_build: {decided.note}", file=sys.stderr)
    print(f"torch_build: {' '.join(cmd)}", file=sys.stderr)
    if args.dry_run:
        return 0
    proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        print(f"torch_build: error: the torch install exited {proc.returncode} (see its output above)",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
