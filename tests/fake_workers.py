"""Fake engine environments whose ``bin/python`` is a stuck worker, for the deadline tests: the real clients
(``SglangSUT``, ``VllmWorker``, the sanitizer's engine worker) start it as they start a real engine's driver, and
it misbehaves in one way. No engine environment and no engine import are needed; each fake ends itself after
``LIFETIME_S`` so that even a client without a deadline leaves no process behind for long."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

LIFETIME_S = 300

#: Seconds a ``slow`` fake takes to start (longer than the 1 s answer deadline its test sets).
SLOW_START_S = 3

#: What a fake worker does: ``silent`` never says hello; ``stall`` says hello, reads requests, never answers;
#: ``deaf`` says hello and never reads its stdin (a large request fills the pipe); ``slow`` says hello after
#: SLOW_START_S seconds (a slow import), then stalls as ``stall`` does.
MODES = ("silent", "stall", "deaf", "slow")

_SCRIPT = """#!{python}
import sys, time
MODE, LIFETIME = {mode!r}, {lifetime}
if MODE == "slow":
    time.sleep({slow_start})
    MODE = "stall"
if MODE != "silent":
    sys.stdout.write('{{"ok": true, "hello": {{"release": "{release}", "fake": "stuck worker"}}}}\\n')
    sys.stdout.flush()
if MODE == "stall":
    for line in sys.stdin:
        time.sleep(LIFETIME)
        break
else:
    time.sleep(LIFETIME)
"""


def fake_engine_home(root: Path, engine: str, release: str, mode: str) -> Path:
    """An engine home (``$FA3VERIFY_ENGINE_HOME``) holding a ready-stamped environment for ``engine==release``
    whose python is a fake worker in ``mode``."""
    from gpu_impl.engines import envs

    assert mode in MODES, mode
    d = envs.env_dir(release, root, engine)
    (d / "bin").mkdir(parents=True)
    python = d / "bin" / "python"
    python.write_text(_SCRIPT.format(python=sys.executable, mode=mode, lifetime=LIFETIME_S, release=release,
                                      slow_start=SLOW_START_S))
    python.chmod(0o755)
    installed_package(d, engine)
    (d / envs.STAMP).write_text(json.dumps({"recipe": envs.recipe_hash(release, engine), "engine": engine}))
    assert envs.env_ready(release, root, engine)
    return root


def installed_package(env: Path, name: str, text: str = "VERSION = 1\n") -> None:
    """What an installer leaves in environment ``env``: one module of package ``name`` and its dist-info RECORD with
    the module's sha256 (gpu_impl/engines/env_integrity.py checks an environment's engine code against it)."""
    import base64
    import hashlib

    site = env / "lib" / "python3.11" / "site-packages"
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text(text)
    digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    (site / f"{name}-1.0.dist-info").mkdir()
    (site / f"{name}-1.0.dist-info" / "RECORD").write_text(f"{name}/__init__.py,sha256={digest},{len(text)}\n"
                                                           f"{name}-1.0.dist-info/RECORD,,\n")


def gone(pid: int, wait_s: float = 10.0) -> bool:
    """Whether process ``pid`` no longer exists (waiting up to ``wait_s`` for it to be reaped)."""
    end = time.monotonic() + wait_s
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
