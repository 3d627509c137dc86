"""Ctrl-C, judged by the signal handler alone: a run stops on a real SIGINT, and on nothing else.

Invariant: while :func:`watching` is active, every SIGINT the process receives is counted by its own handler
(which raises KeyboardInterrupt, as Python's default handler does), and a command that saw one never ends in
a pass. Two CPython behaviours make the default handler alone unsafe; both were seen on a loaded machine with
`prove` interrupted at its start (tests/robustness/test_sigint_paths.py reproduces each one deterministically):

- **An interrupt swallowed.** A KeyboardInterrupt raised inside a weakref callback or a ``__del__`` (the import
  system runs one for every module lock) is printed as "Exception ignored" and dropped, and the run goes on to
  pass. Here :data:`sys.unraisablehook` marks it instead, and :func:`raise_if_swallowed`, called by the loops
  that run for long (the theorem runners, the fuzz campaign), raises it again there.
- **An exit by SIGINT after the interrupt was handled.** A KeyboardInterrupt that passed through code run by
  ``exec`` of a string (dataclasses and namedtuple build their methods that way) sets CPython's
  ``_Py_UnhandledKeyboardInterrupt`` flag (Python/pythonrun.c, ``run_eval_code_obj``) even when a caller catches
  it, and ``python -m`` then ends the process by SIGINT (Modules/main.c, ``Py_RunMain``) instead of with the
  command's exit status 3. :func:`forget_handled_interrupt` clears the flag once the interrupt has been handled.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

_state = {"seen": 0, "swallowed": False, "depth": 0}


def _on_sigint(signum, frame) -> None:
    _state["seen"] += 1
    raise KeyboardInterrupt


def _unraisable(previous):
    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            _state["swallowed"] = True  # raised again at the next checkpoint, not printed as a stray traceback
            return
        previous(unraisable)
    return hook


@contextmanager
def watching() -> Iterator[None]:
    """Count SIGINTs and keep swallowed interrupts for the duration of the block (a no-op off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _state["depth"]:  # nested (a command run from a command): the outer watch already counts
        yield
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started with SIGINT ignored (`nohup`, `cmd &`): stays so
        yield
        return
    _state.update(seen=0, swallowed=False, depth=1)
    previous_handler = signal.signal(signal.SIGINT, _on_sigint)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _unraisable(previous_hook)
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGINT, previous_handler)
        _state["depth"] = 0


def seen() -> bool:
    """Whether a SIGINT reached the handler since the watch began."""
    return _state["seen"] > 0


def raise_if_swallowed() -> None:
    """Raise KeyboardInterrupt here if one was swallowed (in a callback) since the last checkpoint."""
    if _state["swallowed"]:
        _state["swallowed"] = False
        raise KeyboardInterrupt


def forget_handled_interrupt() -> None:
    """Clear CPython's "unhandled KeyboardInterrupt" flag: the interrupt was handled, the exit status stands.

    ``run_eval_code_obj`` resets the flag on entry, so running one empty statement through it is enough.
    """
    exec("pass", {})  # noqa: S102 - a constant statement; see the module docstring
