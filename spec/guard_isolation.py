"""User guards run in a child process with a deadline, so a guard can never end, hang or fool the tool.

Invariant: calling an :class:`IsolatedGuard` returns a bool only when the guard itself returned a bool within
:data:`GUARD_TIMEOUT_S`; a raise, ``sys.exit``/``os._exit`` (in the function or at import), a non-bool result
(generator, coroutine, class instance, the string "False") or a missed deadline raises GuardRaised (or its
subclass GuardTimeout), which every engine reports as a finding (GUARD_RAISED, GUARD_TIMEOUT), never a pass.

The backend the guard models is sglang's ``FlashAttentionBackend.__init__``
(``python/sglang/srt/layers/attention/flashattention_backend.py``), which calls the guard once on
``server_args``; here each call ships the ServerArgs-like namespace's attributes (plain values) to the child
(spec/guard_child.py). Simplification: after a guard times out or its process ends, later calls fail at once
with the same fault instead of restarting it, so a broken guard costs one deadline, not one per configuration.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import time
import weakref
from typing import Any

#: Seconds one guard call may take (the command line's --guard-timeout-s sets it).
GUARD_TIMEOUT_S = 10.0
#: Seconds importing a guard's module may take (a module importing torch or sglang takes a few seconds).
GUARD_IMPORT_TIMEOUT_S = 120.0

_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guard_child.py")
_LIVE: "weakref.WeakSet[IsolatedGuard]" = weakref.WeakSet()


class _Dead(Exception):
    """The child ended (EOF on its pipe) or missed its deadline."""

    def __init__(self, message: str, timed_out: bool):
        super().__init__(message)
        self.timed_out = timed_out


class IsolatedGuard:
    """A ``--guard`` spec (``module:function`` or ``file.py:function``) evaluated in its own child process."""

    def __init__(self, spec: str):
        self.spec = spec
        self.__qualname__ = spec.rpartition(":")[2]
        self.__name__ = self.__qualname__
        self._proc = None
        self._buf = b""
        self._fault = None  # (exception class, message) once the guard timed out or its process ended
        self._start()
        _LIVE.add(self)

    def __reduce__(self):  # worker processes re-load the guard from its spec
        from .guards import load_guard

        return (load_guard, (self.spec,))

    def __repr__(self) -> str:
        return f"IsolatedGuard({self.spec!r})"

    # -- process handling -------------------------------------------------------------------------------------
    def _start(self) -> None:
        from .guards import GuardSpecError

        self._pid = os.getpid()
        self._proc = subprocess.Popen([sys.executable, "-u", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      bufsize=0, start_new_session=True)
        try:
            reply = self._exchange({"sys_path": [os.path.abspath(p) if p else os.getcwd() for p in sys.path],
                                    "spec": self.spec}, GUARD_IMPORT_TIMEOUT_S)
        except _Dead as exc:
            self.close()
            raise GuardSpecError(f"guard spec {self.spec!r}: importing it {exc}") from None
        if "load_error" in reply:
            self.close()
            raise GuardSpecError(reply["load_error"])

    def _exchange(self, obj: dict, timeout_s: float) -> dict:
        proc = self._proc
        try:
            proc.stdin.write((json.dumps(obj) + "\n").encode())
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _Dead(self._ended(), timed_out=False) from None
        deadline = time.monotonic() + timeout_s
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise _Dead(f"took longer than the {timeout_s:g} s deadline (GUARD_TIMEOUT)", timed_out=True)
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise _Dead(self._ended(), timed_out=False)
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def _ended(self) -> str:
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self.close()
        return (f"ended its process with exit code {code} (sys.exit / os._exit in the guard): "
                f"a backend's __init__ would have ended the server")

    def close(self) -> None:
        """End the child process (idempotent; a forked copy leaves the parent's child alone)."""
        proc, self._proc = self._proc, None
        if proc is None or getattr(self, "_pid", None) != os.getpid():
            return
        if proc.poll() is None:
            try:
                proc.kill()
            except OSError:
                pass
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- the call ---------------------------------------------------------------------------------------------
    def __call__(self, server_args: Any) -> bool:
        from .guards import GuardRaised, GuardTimeout, guard_raised_message

        if self._fault is not None:
            cls, message = self._fault
            raise cls(message)
        attrs = _plain_attributes(server_args)
        if self._pid != os.getpid():  # a forked worker: the inherited pipes belong to the parent's child
            self._proc, self._buf = None, b""
        if self._proc is None:
            self._start()
        try:
            reply = self._exchange({"call": attrs}, GUARD_TIMEOUT_S)
        except _Dead as exc:
            cls = GuardTimeout if exc.timed_out else GuardRaised
            message = f"guard {self.spec} {exc}"
            self._fault = (cls, message)
            raise cls(message) from None
        if "ok" in reply:
            return bool(reply["ok"])
        if "bad_return" in reply:
            raise GuardRaised(bad_return_message(self.spec, reply["bad_return"]))
        raise GuardRaised(guard_raised_message(self.spec, reply["raised"], reply["message"], reply.get("attr"),
                                               type(server_args).__name__), missing_attribute=reply.get("attr"))


def bad_return_message(name: str, type_name: str) -> str:
    """The message of a guard that returned something other than a bool."""
    return (f"guard {name} returned a {type_name}, not a bool: the backend would treat it as "
            f"{'True' if type_name not in ('NoneType',) else 'False'} whatever it means; return True or False")


def _plain_attributes(obj: Any) -> dict:
    from .guards import GuardRaised

    try:
        attrs = dict(vars(obj))
        json.dumps(attrs)
    except (TypeError, ValueError):
        raise GuardRaised(f"cannot pass a {type(obj).__name__} to an isolated guard: its attributes must be plain "
                          f"values (bool, int, str, None)") from None
    return attrs


@atexit.register
def _close_all() -> None:
    for guard in list(_LIVE):
        guard.close()
