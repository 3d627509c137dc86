"""The runtime sanitizer over a real engine release: the harness side of ``fa3verify.sanitize.engine_worker``.

Invariant: :func:`open_sanitized` gives a system under test that runs the release's own attention backend (the
engine driver its plugin names, ``EnginePlugin.driver_module``) with FA3's entry points served by plain
emulator-backed stand-ins and wrapped by the sanitizer, installed from ``FA3VERIFY_SANITIZE`` as a user's run
installs it; the choice is made here, by which worker is started -- nothing in the engine's code or in the
driver's checking path consults it. A ``MetadataMismatch`` the sanitizer raises inside the engine comes back as the
scenario's finding (``detail["source"] == "sanitizer"``, its message, its case file); ``sut.observed`` is the
sanitizer's status after the latest answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from . import ENV_DEEP, ENV_DIR, ENV_MODE, MODES
from .engine_worker import ENV_CAUSES, ENV_DRIVER, ENV_INSTALL, INSTALL_WHEN

WORKER = "fa3verify.sanitize.engine_worker"

__all__ = ["WORKER", "open_sanitized"]


def open_sanitized(engine: str, mode: str = "raise", out_dir=None, deep: bool = False,
                   install: str = "start", progress=print, root: Optional[Path] = None, causes: bool = True):
    """The system under test ``engine`` (``ENGINE==V``) names, its worker run under the sanitizer (not started yet):
    its plugin's ``open_worker`` with this module's worker, which serves the plugin's ``driver_module``.

    ``install``: "start" (before the engine is imported, as the ``.pth`` hook does) or "late" (after: the bindings
    the engine made are found and replaced through ``gc``). ``causes``: False runs the sanitizer without the cause
    check (overflows only). ValueError names a bad argument (an engine without a worker driver included).
    """
    from gpu_impl.sut import parse_engine

    spec = parse_engine(engine)
    if spec.plugin.driver_module is None:
        raise ValueError(f"engine: {spec} has no worker driver to run under the sanitizer")
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
    if install not in INSTALL_WHEN:
        raise ValueError(f"install: must be one of {', '.join(INSTALL_WHEN)}, got {install!r}")
    env = {ENV_MODE: mode, ENV_INSTALL: install, ENV_DEEP: "1" if deep else "0", ENV_CAUSES: "1" if causes else "0",
           ENV_DRIVER: spec.plugin.driver_module}
    if out_dir is not None:
        env[ENV_DIR] = str(Path(out_dir).resolve())
    return spec.plugin.open_worker(spec, worker=WORKER, worker_env=env, progress=progress, root=root)
