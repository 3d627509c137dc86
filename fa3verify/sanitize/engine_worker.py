"""An engine worker under the runtime sanitizer: the engine driver (``FA3VERIFY_SANITIZE_DRIVER``, its plugin's
``driver_module``) with plain FA3 stand-ins, wrapped by ``fa3verify.sanitize`` exactly as it wraps real FA3 in a
user's process.

Invariant: in this worker the only thing that checks a metadata hand-off is the sanitizer: the fake FA3 kernel
module routes to emulator-backed FA3 that trusts its metadata as the real kernel does
(``gpu_impl.engines.emulator_fa3``), the sanitizer is installed from ``FA3VERIFY_SANITIZE`` before the engine is
imported (its import hook wraps the entry points as their modules load, so the engine's dispatcher and backend bind
the wrappers), and every answer carries the sanitizer's status (what it wrapped, which bindings hold the
wrappers, what it could not reach).

Run as ``python -m fa3verify.sanitize.engine_worker`` inside an engine environment (``open_sanitized``
starts it). Variables: those of the start hook (``FA3VERIFY_SANITIZE``, ``FA3VERIFY_SANITIZE_DIR``,
``FA3VERIFY_SANITIZE_DEEP``), ``FA3VERIFY_SANITIZE_DRIVER`` and ``FA3VERIFY_SANITIZE_INSTALL`` = ``start``
(default: before the engine's import, as the ``.pth`` hook does) or ``late`` (after the engine's import: the
sanitizer must find and replace the bindings
already made, through ``gc``).

Stand-in: on CPU no CUDA stream captures, so the driver's own capture flag answers the sanitizer's "is a graph
being captured?" (``torch.cuda.is_current_stream_capturing`` on a GPU).
"""

from __future__ import annotations

import os
import sys

INSTALL_WHEN = ("start", "late")
ENV_INSTALL = "FA3VERIFY_SANITIZE_INSTALL"
#: "0": the worker's sanitizer reports overflows only, not causes (the harness's tests of the replay-time check)
ENV_CAUSES = "FA3VERIFY_SANITIZE_CAUSES"
#: the engine driver the worker serves (its plugin's ``driver_module``: ``run_worker(stdin, stdout, fa3, observer)``)
ENV_DRIVER = "FA3VERIFY_SANITIZE_DRIVER"


class SanitizerObserver:
    """What the driver calls back: the engine once imported (late install happens then), and the status."""

    def __init__(self, mode: str, deep: bool, out_dir: str, when: str, causes: bool = True):
        self.mode, self.deep, self.out_dir, self.when, self.causes = mode, deep, out_dir, when, causes
        self.engine = None

    def capturing(self) -> bool:
        return bool(self.engine is not None and self.engine.is_capturing())

    def install(self) -> None:
        import fa3verify.sanitize as sanitize

        sanitize.install(mode=self.mode, deep=self.deep, out_dir=self.out_dir, capturing=self.capturing,
                         causes=self.causes)

    def engine_started(self, engine) -> None:
        self.engine = engine
        if self.when == "late":
            self.install()

    def status(self) -> dict:
        import fa3verify.sanitize as sanitize

        return dict(sanitize.status(), install=self.when)


def settings(environ=None) -> tuple:
    """(mode, deep, out_dir, when) from the environment; ValueError naming the variable and the allowed values."""
    from . import DEFAULT_DIR, ENV_DEEP, ENV_DIR, ENV_MODE, MODES

    env = os.environ if environ is None else environ
    mode = env.get(ENV_MODE, "").strip()
    if mode not in MODES:
        raise ValueError(f"{ENV_MODE}: must be one of {', '.join(MODES)}, got {mode!r}")
    when = env.get(ENV_INSTALL, "start").strip() or "start"
    if when not in INSTALL_WHEN:
        raise ValueError(f"{ENV_INSTALL}: must be one of {', '.join(INSTALL_WHEN)}, got {when!r}")
    deep = env.get(ENV_DEEP, "").strip().lower() in ("1", "true", "yes")
    return mode, deep, env.get(ENV_DIR) or DEFAULT_DIR, when


def main() -> int:
    protocol_out = sys.stdout
    sys.stdout = sys.stderr  # nothing but responses on the protocol stream
    try:
        mode, deep, out_dir, when = settings()
    except ValueError as exc:
        sys.stderr.write(f"fa3verify: {exc}\n")
        return 2
    driver_name = os.environ.get(ENV_DRIVER, "").strip()
    if not driver_name:
        sys.stderr.write(f"fa3verify: {ENV_DRIVER}: must name the engine driver module (its plugin's "
                         f"driver_module), got nothing\n")
        return 2
    observer = SanitizerObserver(mode, deep, out_dir, when, causes=os.environ.get(ENV_CAUSES, "1").strip() != "0")
    if when == "start":
        observer.install()
    import importlib

    driver = importlib.import_module(driver_name)
    return driver.run_worker(stdin=sys.stdin, stdout=protocol_out, fa3="emulator", observer=observer)


if __name__ == "__main__":
    raise SystemExit(main())
