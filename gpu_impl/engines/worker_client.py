"""The harness side of the engine worker protocol (:func:`gpu_impl.engines.protocol.serve`): one client for every
engine worker (sglang's driver, vLLM's driver, sglang under the runtime sanitizer), on the one deadline policy of
:mod:`spec.process.worker_client`.

Invariant: every answer an engine client acts on came from its worker within its deadline -- the worker's
first line (its hello: starting a worker imports the engine) within the start deadline
(:func:`engine_start_timeout_s`: ``$FA3VERIFY_ENGINE_START_TIMEOUT`` seconds, default 900, or the client's
``start_timeout_s``), every later answer within the engine deadline (:func:`engine_timeout_s`:
``$FA3VERIFY_ENGINE_TIMEOUT`` seconds, default 900, or the client's ``timeout_s``); the two are separate, so a
slow start is never read as a stalled answer, nor a short answer deadline paid by the import. A worker past its
deadline is killed with what it started and raises :class:`~gpu_impl.engines.errors.DriverError` naming it
(``engine worker sglang==0.5.13 (pid N): no answer within 900 s; killed``), as does a worker that exits or answers
something that is not a response -- never a pass or a violation (the command line: inconclusive, exit 3).
"""

from __future__ import annotations

from typing import Optional, Sequence

from spec.process.deadlines import checked_seconds, seconds_from_env
from spec.process.worker_client import WorkerClient

from .errors import DriverError, EngineUnavailable
from .protocol import encode

__all__ = ["ENV_TIMEOUT", "ENV_START_TIMEOUT", "DEFAULT_TIMEOUT_S", "DEFAULT_START_TIMEOUT_S", "MAX_TIMEOUT_S",
           "EngineWorker", "engine_timeout_s", "engine_start_timeout_s"]

#: The variable that sets the engine deadline (seconds one answer of an engine worker may take, its hello aside).
ENV_TIMEOUT = "FA3VERIFY_ENGINE_TIMEOUT"
#: Its default: a 32k-token scenario takes under 10 s; a real engine's first scenario compiles for minutes on a
#: busy machine.
DEFAULT_TIMEOUT_S = 900.0
#: The variable that sets the start deadline (seconds from starting a worker to its hello: the engine's import).
ENV_START_TIMEOUT = "FA3VERIFY_ENGINE_START_TIMEOUT"
#: Its default: importing sglang or vLLM takes seconds to a minute, several minutes on a loaded machine.
DEFAULT_START_TIMEOUT_S = 900.0
MAX_TIMEOUT_S = 86400.0


def _deadline_s(value, environ, variable: str, argument: str, default: float, what: str) -> float:
    """``value`` if given, else ``$variable``, else ``default``; anything but a finite number in (0, 86400] raises
    EngineUnavailable naming where it came from and the allowed range (spec.process.deadlines, the one parser)."""
    if value is not None:
        return checked_seconds(value, argument, MAX_TIMEOUT_S, EngineUnavailable, what)
    return seconds_from_env(variable, default, environ, EngineUnavailable, MAX_TIMEOUT_S, what)


def engine_timeout_s(value=None, environ=None) -> float:
    """The engine deadline of each answer: ``value`` if given, else ``$FA3VERIFY_ENGINE_TIMEOUT``, else 900 s;
    anything but a finite number in (0, 86400] raises EngineUnavailable naming where it came from and the range."""
    return _deadline_s(value, environ, ENV_TIMEOUT, "timeout_s", DEFAULT_TIMEOUT_S, "the engine deadline")


def engine_start_timeout_s(value=None, environ=None) -> float:
    """The start deadline (a worker's hello): ``value`` if given, else ``$FA3VERIFY_ENGINE_START_TIMEOUT``, else
    900 s; anything but a finite number in (0, 86400] raises EngineUnavailable naming where it came from and the
    range."""
    return _deadline_s(value, environ, ENV_START_TIMEOUT, "start_timeout_s", DEFAULT_START_TIMEOUT_S,
                       "the engine start deadline")


class EngineWorker:
    """One engine worker process: started, its first line read within ``start_timeout_s`` (``first``: the hello,
    or the import failure), then one answer per request, each within ``timeout_s``.

    ``argv``: the worker's command (the environment's python, ``-m``, the driver module); ``name``: what errors
    call it (``engine worker sglang==0.5.13``).
    """

    def __init__(self, argv: Sequence[str], name: str, env: Optional[dict] = None, cwd: Optional[str] = None,
                 timeout_s: Optional[float] = None, start_timeout_s: Optional[float] = None, greet: bool = True):
        """``greet``: read the first line now; False: only start the process (its import runs while the caller
        does other work), the first line is read, within the start deadline, when :attr:`first` is asked."""
        self.name = name
        self.timeout_s = engine_timeout_s(timeout_s)
        self.start_timeout_s = engine_start_timeout_s(start_timeout_s)
        self.client = WorkerClient(argv, name, env=env, cwd=cwd, error=DriverError, encode=encode)
        self._first: Optional[dict] = None
        if greet:
            _ = self.first

    @property
    def first(self) -> dict:
        """The worker's first line (its hello, or the import failure), read within the start deadline."""
        if self._first is None:
            self._first = self._checked(self.client.receive(self.start_timeout_s,
                                                            hint=f"the start deadline, {ENV_START_TIMEOUT}"))
        return self._first

    @property
    def greeted(self) -> bool:
        """Whether the first line was read."""
        return self._first is not None

    def send_ahead(self, obj: dict) -> None:
        """Queue one request before the first line was read (the worker answers it after its hello); its answer is
        read by :meth:`answer_ahead`."""
        self.client.send(obj, self.start_timeout_s, hint=f"the start deadline, {ENV_START_TIMEOUT}")

    def answer_ahead(self) -> dict:
        """The answer to the request :meth:`send_ahead` queued (after :attr:`first`), within the engine deadline."""
        _ = self.first
        return self._checked(self.client.receive(self.timeout_s, hint=f"the answer deadline, {ENV_TIMEOUT}"))

    @property
    def pid(self) -> int:
        return self.client.pid

    @property
    def running(self) -> bool:
        return self.client.running

    def request(self, obj: dict, timeout_s: Optional[float] = None) -> dict:
        """The worker's answer to one request (DriverError when it is not running, misses the deadline, exits or
        answers something that is not a response)."""
        if not self.client.running:
            raise DriverError(f"{self.client.label}: not running (exit code {self.client.returncode})"
                              f"{self.client.stderr_tail()}", worker=self.name, pid=self.pid,
                              returncode=self.client.returncode)
        limit = self.timeout_s if timeout_s is None else engine_timeout_s(timeout_s)
        return self._checked(self.client.request(obj, limit, hint=f"the answer deadline, {ENV_TIMEOUT}"))

    def _checked(self, resp) -> dict:
        if not isinstance(resp, dict) or "ok" not in resp:
            self.client.kill()
            raise DriverError(f"{self.client.label}: not a response: {str(resp)[:200]}; killed", worker=self.name,
                              pid=self.pid)
        return resp

    def stderr_tail(self) -> str:
        return self.client.stderr_tail()

    def kill(self) -> None:
        self.client.kill()

    def close(self) -> None:
        """Ask the worker to quit (it has 10 s), then kill it; idempotent."""
        self.client.close(goodbye={"op": "quit"}, grace_s=10.0)
