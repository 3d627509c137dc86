"""User guards run in a child process with a deadline, so a guard can never end, hang or fool the tool.

Invariant: calling an :class:`IsolatedGuard` returns a bool only when the guard itself returned a bool within
:data:`GUARD_TIMEOUT_S`; a raise, ``sys.exit``/``os._exit`` (in the function or at import), a non-bool result
(generator, coroutine, class instance, the string "False") or a missed deadline raises GuardRaised (or its
subclass GuardTimeout), which every engine reports as a finding (GUARD_RAISED, GUARD_TIMEOUT), never a pass.

The backend the guard models is sglang's ``FlashAttentionBackend.__init__``
(``python/sglang/srt/layers/attention/flashattention_backend.py``), which calls the guard once on
``server_args``; here each call ships the ServerArgs-like namespace's attributes (plain values) to the child
(spec/model/guard_child.py) through :class:`spec.process.worker_client.WorkerClient`, the one deadline policy of every worker
the suite drives. An import past its deadline (``$FA3VERIFY_GUARD_IMPORT_TIMEOUT``, default 120 s) raises
:class:`GuardImportTimeout` (inconclusive); one that fails raises GuardSpecError (bad input). Simplification:
after a guard times out or its process ends, later calls fail at once with the same fault instead of restarting
it, so a broken guard costs one deadline, not one per configuration.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import weakref
from typing import Any

from spec.process.deadlines import seconds_from_env
from spec.process.worker_client import WorkerClient, WorkerError
from spec.model.guard_errors import GuardRaised, GuardSpecError, GuardTimeout, bad_return_message, guard_raised_message

#: Seconds one guard call may take (the command line's --guard-timeout-s sets it).
GUARD_TIMEOUT_S = 10.0
#: Seconds importing a guard's module may take (a module importing torch or sglang takes a few seconds);
#: ``$FA3VERIFY_GUARD_IMPORT_TIMEOUT`` sets it (a finite number of seconds in (0, 3600]).
GUARD_IMPORT_TIMEOUT_S = 120.0
ENV_IMPORT_TIMEOUT = "FA3VERIFY_GUARD_IMPORT_TIMEOUT"

_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guard_child.py")
_LIVE: "weakref.WeakSet[IsolatedGuard]" = weakref.WeakSet()


class GuardImportTimeout(WorkerError):
    """Importing a guard's module missed its deadline (the child was killed): a WorkerError, so the command line
    reports it as inconclusive (exit 3), not as a guard that cannot be imported (exit 2)."""


def import_timeout_s(environ=None) -> float:
    """The deadline of a guard's import: ``$FA3VERIFY_GUARD_IMPORT_TIMEOUT`` or :data:`GUARD_IMPORT_TIMEOUT_S`;
    a value that is not a finite number in (0, 3600] raises GuardSpecError naming the variable."""
    return seconds_from_env(ENV_IMPORT_TIMEOUT, GUARD_IMPORT_TIMEOUT_S, environ, GuardSpecError)


class IsolatedGuard:
    """A ``--guard`` spec (``module:function`` or ``file.py:function``) evaluated in its own child process
    (a :class:`spec.process.worker_client.WorkerClient`: the deadline policy of every worker the suite drives)."""

    def __init__(self, spec: str):
        self.spec = spec
        self.__qualname__ = spec.rpartition(":")[2]
        self.__name__ = self.__qualname__
        self._proc = None  # the WorkerClient of the child process
        self._fault = None  # (exception class, message) once the guard timed out or its process ended
        self._start()
        _LIVE.add(self)

    def __reduce__(self):  # worker processes start their own child from the spec (load_guard checked it here)
        return (IsolatedGuard, (self.spec,))

    def __repr__(self) -> str:
        return f"IsolatedGuard({self.spec!r})"

    # -- process handling -------------------------------------------------------------------------------------
    def _start(self) -> None:
        limit = import_timeout_s()
        self._pid = os.getpid()
        self._proc = WorkerClient([sys.executable, "-u", _CHILD], f"guard {self.spec}", capture_stderr=False)
        try:
            reply = self._exchange({"sys_path": [os.path.abspath(p) if p else os.getcwd() for p in sys.path],
                                    "spec": self.spec}, limit)
        except WorkerError as exc:
            self.close()
            message = f"guard spec {self.spec!r}: importing it {self._fault_text(exc, limit, tag='')}"
            if exc.timed_out:  # maybe only a loaded machine: inconclusive, not bad input
                raise GuardImportTimeout(f"{message} (${ENV_IMPORT_TIMEOUT} allows more)", worker=exc.worker,
                                         pid=exc.pid, timed_out=True) from None
            raise GuardSpecError(message) from None
        if "load_error" in reply:
            self.close()
            raise GuardSpecError(reply["load_error"])

    def _exchange(self, obj: dict, timeout_s: float) -> dict:
        reply = self._proc.request(obj, timeout_s)
        if not isinstance(reply, dict):
            self._proc.kill()
            raise WorkerError(f"{self._proc.label}: answered {str(reply)[:100]}, not an object",
                              worker=self._proc.name, pid=self._proc.pid)
        return reply

    def _fault_text(self, exc: WorkerError, timeout_s: float, tag: str = " (GUARD_TIMEOUT)") -> str:
        pid = f"(pid {exc.pid}) " if exc.pid else ""
        if exc.timed_out:
            return f"{pid}took longer than the {timeout_s:g} s deadline{tag}; its process was killed"
        if exc.returncode is not None:
            return (f"{pid}ended its process with exit code {exc.returncode} (sys.exit / os._exit in the guard): "
                    f"a backend's __init__ would have ended the server")
        return f"{pid}broke the guard protocol: {exc}"

    def close(self) -> None:
        """End the child process (idempotent; a forked copy leaves the parent's child alone)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- the call ---------------------------------------------------------------------------------------------
    def __call__(self, server_args: Any) -> bool:
        if self._fault is not None:
            cls, message = self._fault
            raise cls(message)
        attrs = _plain_attributes(server_args)
        if self._pid != os.getpid():  # a forked worker: the inherited pipes belong to the parent's child
            self._proc = None
        if self._proc is None:
            self._start()
        try:
            reply = self._exchange({"call": attrs}, GUARD_TIMEOUT_S)
        except WorkerError as exc:
            self.close()
            cls = GuardTimeout if exc.timed_out else GuardRaised
            message = f"guard {self.spec} {self._fault_text(exc, GUARD_TIMEOUT_S)}"
            self._fault = (cls, message)
            raise cls(message) from None
        if "ok" in reply:
            return bool(reply["ok"])
        if "bad_return" in reply:
            raise GuardRaised(bad_return_message(self.spec, reply["bad_return"]))
        raise GuardRaised(guard_raised_message(self.spec, reply["raised"], reply["message"], reply.get("attr"),
                                               type(server_args).__name__), missing_attribute=reply.get("attr"))


def _plain_attributes(obj: Any) -> dict:
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
