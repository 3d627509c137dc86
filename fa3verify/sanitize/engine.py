"""The runtime sanitizer over a real sglang release: the harness side of ``fa3verify.sanitize.engine_worker``.

Invariant: :func:`open_sanitized_sglang` gives a system under test that runs the release's own
``FlashAttentionBackend`` (the engine driver, ``gpu_impl.engines.sglang.driver``) with FA3's entry points served
by plain emulator-backed stand-ins and wrapped by the sanitizer, installed from ``FA3VERIFY_SANITIZE`` as a user's
run installs it; the choice is made here, by which worker is started -- nothing in sglang's code or in the
driver's checking path consults it. A ``MetadataMismatch`` the sanitizer raises inside sglang comes back as the
scenario's finding (``detail["source"] == "sanitizer"``, its message, its case file); ``sut.observed`` is the
sanitizer's status after the latest answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from . import ENV_DEEP, ENV_DIR, ENV_MODE, MODES
from .engine_worker import ENV_CAUSES, ENV_INSTALL, INSTALL_WHEN

WORKER = "fa3verify.sanitize.engine_worker"

__all__ = ["WORKER", "open_sanitized_sglang"]


def open_sanitized_sglang(release: str, mode: str = "raise", out_dir=None, deep: bool = False,
                          install: str = "start", progress=print, root: Optional[Path] = None, causes: bool = True):
    """A ``SglangSUT`` for ``sglang==release`` whose worker runs under the sanitizer (not started yet).

    ``install``: "start" (before sglang is imported, as the ``.pth`` hook does) or "late" (after: the bindings
    sglang made are found and replaced through ``gc``). ``causes``: False runs the sanitizer without the cause
    check (overflows only). ValueError names a bad argument.
    """
    from gpu_impl.engines.sglang.host import SglangSUT
    from gpu_impl.sut import parse_engine

    if mode not in MODES:
        raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
    if install not in INSTALL_WHEN:
        raise ValueError(f"install: must be one of {', '.join(INSTALL_WHEN)}, got {install!r}")
    env = {ENV_MODE: mode, ENV_INSTALL: install, ENV_DEEP: "1" if deep else "0", ENV_CAUSES: "1" if causes else "0"}
    if out_dir is not None:
        env[ENV_DIR] = str(Path(out_dir).resolve())
    spec = parse_engine(f"sglang=={release}")
    return SglangSUT(spec, progress=progress, root=root, worker=WORKER, worker_env=env)
