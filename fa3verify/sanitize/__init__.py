"""Sanitize your own runs: check every FA3 call that reuses scheduler metadata, in the process that makes it.

Invariant: while the sanitizer is installed, no call to a wrapped FA3 entry point consumes scheduler metadata
whose recorded precompute inputs schedule differently from the call's own (SHAPE, batch size,
``S_p <= S_c or S_c == 1``, QUERY_COVER; ``deep``: every ``spec.invariants`` check) without being reported --
raised as :class:`MetadataMismatch` (mode "raise"), warned once per signature ("warn") or logged ("record").

    import fa3verify.sanitize as sanitize
    sanitize.install(mode="raise")            # or: with sanitize.sanitizing("record"): ...
    ...                                       # run the engine / the test suite
    sanitize.uninstall()                      # every original function is back, identity-equal

Activation without code changes: ``FA3VERIFY_SANITIZE=raise|warn|record`` with the interpreter-start hook
(``fa3verify sanitize install-hook``, see :mod:`fa3verify.sanitize.hook`), or ``pytest --fa3verify-sanitize=MODE``.
What is wrapped and how bindings are found: :mod:`fa3verify.sanitize.targets`; what is written:
:mod:`fa3verify.sanitize.records`. docs/sanitize.md is the user's page.
"""

from __future__ import annotations

import contextlib
import os

# The heavy parts (torch, refmodel) load on first use, so the interpreter-start hook (fa3verify.sanitize.hook)
# costs nothing until an FA3 module is imported.
MODES = ("raise", "warn", "record")
DEFAULT_DIR = "fa3verify-sanitize"


def __getattr__(name):
    if name in ("Sanitizer",):
        from .core import Sanitizer
        return Sanitizer
    if name == "MetadataMismatch":
        from gpu_impl.fa3_calls import MetadataMismatch
        return MetadataMismatch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["install", "uninstall", "sanitizing", "current", "status", "MetadataMismatch", "Sanitizer", "MODES",
           "DEFAULT_DIR", "ENV_MODE", "ENV_DIR", "ENV_DEEP", "ENV_NUM_SM", "NUM_SM_RANGE", "checked_num_sm"]

ENV_MODE = "FA3VERIFY_SANITIZE"
ENV_DIR = "FA3VERIFY_SANITIZE_DIR"
ENV_DEEP = "FA3VERIFY_SANITIZE_DEEP"
ENV_NUM_SM = "FA3VERIFY_SANITIZE_NUM_SM"
#: the SM counts a device may be given with (num_sm=, FA3VERIFY_SANITIZE_NUM_SM, --fa3verify-sanitize-num-sm)
NUM_SM_RANGE = (1, 1024)


def checked_num_sm(value, name: str = "num_sm") -> int:
    """``value`` as an SM count, or ValueError naming ``name`` and the allowed range (1..1024)."""
    lo, hi = NUM_SM_RANGE
    try:
        n = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        n = None
    if n is None or not lo <= n <= hi or (isinstance(value, float) and value != int(value)):
        raise ValueError(f"{name}: must be an integer from {lo} to {hi} (the device's SM count, e.g. 132 for an "
                         f"H100 SXM or H200, 78 for an H20), got {value!r}")
    return n

_current = None


def install(mode: str = "raise", deep: bool = False, out_dir=None, **options):
    """Wrap every importable FA3 entry point (and every binding of it) and start checking.

    ``out_dir``: where case, pair and log files go (default ``$FA3VERIFY_SANITIZE_DIR`` or
    ``./fa3verify-sanitize``); options as :class:`Sanitizer` (``num_sm``: the device's SM count, 1..1024, default
    ``$FA3VERIFY_SANITIZE_NUM_SM`` or read from the first FA3 tensor's CUDA device, 132 on the CPU; ``arch``, ``follow_copies``,
    ``import_hook``, ``write_files``, ``max_events``, ``causes``: False reports only what the call's own metadata
    overflows, not a precompute whose arguments differ from the call's). Installing again with the same mode returns the
    installed sanitizer; with another mode it raises ValueError (uninstall first).
    """
    global _current
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
    if _current is not None and _current.installed:
        if _current.mode == mode and _current.deep == bool(deep):
            return _current
        raise ValueError(f"mode: the sanitizer is already installed in mode {_current.mode!r} "
                         f"(deep={_current.deep}); uninstall() before installing mode {mode!r}")
    if out_dir is None:
        out_dir = os.environ.get(ENV_DIR) or DEFAULT_DIR
    if options.get("num_sm") is not None:
        options["num_sm"] = checked_num_sm(options["num_sm"], "num_sm")
        options.setdefault("num_sm_source", "given (num_sm=)")
    elif os.environ.get(ENV_NUM_SM, "").strip():
        options["num_sm"] = checked_num_sm(os.environ[ENV_NUM_SM], ENV_NUM_SM)
        options.setdefault("num_sm_source", f"given ({ENV_NUM_SM})")
    from .core import Sanitizer

    _current = Sanitizer(mode=mode, deep=deep, out_dir=out_dir, **options).install()
    return _current


def uninstall():
    """Put every original FA3 function back (identity-equal) and stop checking; returns the sanitizer, if any."""
    global _current
    sanitizer, _current = _current, None
    if sanitizer is not None:
        sanitizer.uninstall()
    return sanitizer


def current():
    """The installed sanitizer, or None."""
    return _current if _current is not None and _current.installed else None


def status() -> dict:
    """The installed sanitizer's status (``{"installed": False}`` when none is)."""
    s = current()
    return s.status() if s is not None else {"installed": False}


@contextlib.contextmanager
def sanitizing(mode: str = "raise", deep: bool = False, out_dir=None, **options):
    """``with sanitizing("raise"): ...``: install for the block, uninstall after it (even on an exception)."""
    sanitizer = install(mode=mode, deep=deep, out_dir=out_dir, **options)
    try:
        yield sanitizer
    finally:
        if current() is sanitizer:
            uninstall()
