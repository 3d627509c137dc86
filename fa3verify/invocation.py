"""How to run fa3verify as typed, for the commands the tool prints (the replay lines, ``finding_terms.replay_line``).

Invariant: :func:`command_words` runs this same installation when typed in the shell the tool was started from (the
same working directory and PATH): ``fa3verify`` when that name on PATH is the script that is running (an activated
environment, an installed tool), else the script's path as the user typed it (``.venv/bin/fa3verify``: relative
to the working directory, as the case files the lines name are); under ``python -m fa3verify``, that interpreter
with ``-m fa3verify``. In-process callers (``fa3verify.api``, the pytest plugin, the tests' ``cli.main([...])``)
record nothing and get ``fa3verify``.

Simplifications: the shell is assumed to look ``fa3verify`` and ``python`` up on the PATH this process sees; an
alias or a function of the same name is not seen.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Optional

__all__ = ["record", "command_words"]

_invoked: Optional[str] = None


def record(argv0: Optional[str]) -> None:
    """Remember how the tool was started (``sys.argv[0]`` of its console script or of ``python -m fa3verify``)."""
    global _invoked
    _invoked = argv0 or None


def _same_file(a: Optional[str], b: str) -> bool:
    try:
        return bool(a) and os.path.samefile(a, b)
    except OSError:
        return False


def command_words(argv0: Optional[str] = None, path: Optional[str] = None) -> list:
    """The words that start fa3verify as typed (``["fa3verify"]``, ``[".venv/bin/fa3verify"]`` or
    ``[PYTHON, "-m", "fa3verify"]``); ``argv0`` defaults to what :func:`record` kept, ``path`` to ``$PATH``."""
    argv0 = argv0 if argv0 is not None else _invoked
    if not argv0:
        return ["fa3verify"]
    if _same_file(shutil.which("fa3verify", path=path), argv0):
        return ["fa3verify"]
    if os.path.basename(argv0) == "__main__.py":  # python -m fa3verify
        if _same_file(shutil.which("fa3verify", path=path), os.path.join(os.path.dirname(sys.executable),
                                                                          "fa3verify")):
            return ["fa3verify"]
        name = os.path.basename(sys.executable)
        python = name if _same_file(shutil.which(name, path=path), sys.executable) else sys.executable
        return [python, "-m", "fa3verify"]
    return [argv0]
