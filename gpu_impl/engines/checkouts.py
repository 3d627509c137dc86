"""Source checkouts and wheels as systems under test: where a checkout's package is, its version and its revision.

One resolver for ``sglang-src=PATH`` and ``vllm-src=PATH`` (:func:`resolve_checkout`): a directory holding the
package (or, for sglang, a clone whose ``python/`` holds it), or a ``.whl`` file unpacked once into the engine home.
Anything else is a :class:`~gpu_impl.engines.errors.CheckoutImportError` naming the option and what was expected.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import Optional, Sequence

from . import envs
from .errors import CheckoutImportError

__all__ = ["resolve_checkout", "source_version", "git_revision"]

_VERSION = re.compile(r"""__version__\s*=\s*(?:version\s*=\s*)?["']([^"']+)["']""")


def resolve_checkout(path: str, package: str, subdirs: Sequence[str] = ("",), unpack_prefix: str = "",
                     want: str = "") -> tuple:
    """(directory to put first on the path, version or None, revision) of a checkout or wheel of ``package``.

    ``subdirs``: where under a directory the package may sit, tried in order ("" is the directory itself);
    ``unpack_prefix``: the name prefix of a wheel's unpacked copy under the engine home's ``src/``;
    ``want``: what the error says is expected."""
    option = f"{package}-src={path}"
    p = Path(path).expanduser().resolve()
    if p.is_file() and p.suffix == ".whl":
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        dest = envs.engine_home() / "src" / f"{unpack_prefix}{digest[:16]}"
        if not (dest / package).is_dir():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix="unpack-", dir=dest.parent))
            with zipfile.ZipFile(p) as zf:
                zf.extractall(tmp)
            os.replace(tmp, dest)
        root, revision = dest, f"wheel-sha256:{digest[:16]}"
    elif p.is_dir():
        candidates = [p / sub if sub else p for sub in subdirs]
        root = next((c for c in candidates if (c / package).is_dir()), candidates[-1])
        if not (root / package / "__init__.py").exists():
            raise CheckoutImportError(f"{option}: no {package} package under {p} (want {want or 'a checkout'}, "
                                      f"or a wheel file)")
        revision = git_revision(root)
    else:
        raise CheckoutImportError(f"{option}: not a directory or a .whl file")
    return root, source_version(root, package=package), revision


def source_version(root: Path, package: str = "sglang") -> Optional[str]:
    """The version of a checkout or unpacked wheel of ``package``: ``_version.py`` (generated at build time), a
    literal in ``version.py``, ``git describe --tags``, or ``pyproject.toml``; None when none says
    (fallback versions such as ``0.0.0.dev0`` say nothing)."""
    def real(v):
        return v if v and v[0].isdigit() and not v.startswith("0.0.0") else None

    for name in ("_version.py", "version.py"):
        f = root / package / name
        if f.exists():
            for m in _VERSION.finditer(f.read_text(errors="replace")):
                if real(m.group(1)):
                    return m.group(1)
    try:
        out = subprocess.run(["git", "-C", str(root), "describe", "--tags", "--abbrev=0"], capture_output=True,
                             text=True, timeout=30, stdin=subprocess.DEVNULL)
        tag = out.stdout.strip().lstrip("v") if out.returncode == 0 else ""
        if real(tag):
            return tag
    except (OSError, subprocess.TimeoutExpired):
        pass
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(errors="replace"), re.M)
        if m and real(m.group(1)):
            return m.group(1)
    return None


def git_revision(path: Path) -> str:
    """``git rev-parse HEAD`` of a checkout, ``+dirty`` when tracked files are changed; "unknown ..." otherwise."""
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if out.returncode != 0:
        return "unknown (not a git checkout)"
    try:
        dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return out.stdout.strip() + "+dirty-unknown (git status did not answer within 30 s)"
    return out.stdout.strip() + ("+dirty" if dirty else "")
