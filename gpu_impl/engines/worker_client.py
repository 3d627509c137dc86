"""The harness side of the engine worker protocol (:func:`gpu_impl.engines.protocol.serve`): one client for every
engine worker (sglang's driver, vLLM's driver, sglang under the runtime sanitizer), on the one deadline policy of
:mod:`spec.worker_client`.

Invariant: every answer an engine client acts on came from its worker within the engine deadline
(:func:`engine_timeout_s`: ``$FA3VERIFY_ENGINE_TIMEOUT`` seconds, default 900, or the client's ``timeout_s``),
the worker's hello included; a worker past it is killed with what it started and raises
:class:`~gpu_impl.engines.errors.DriverError` naming it (``engine worker sglang==0.5.13 (pid N): no answer within
900 s; killed``), as does a worker that exits or answers something that is not a response -- never a pass or a
violation (the command line: inconclusive, exit 3).
"""

from __future__ import annotations

import math
import os
from typing import Optional, Sequence

from spec.worker_client import WorkerClient

from .errors import DriverError, EngineUnavailable
from .protocol import encode

__all__ = ["ENV_TIMEOUT", "DEFAULT_TIMEOUT_S", "MAX_TIMEOUT_S", "EngineWorker", "engine_timeout_s"]

#: The variable that sets the engine deadline (seconds one answer of an engine worker may take).
ENV_TIMEOUT = "FA3VERIFY_ENGINE_TIMEOUT"
#: Its default: starting a worker imports the engine (seconds to a minute); a 32k-token scenario takes under 10 s.
DEFAULT_TIMEOUT_S = 900.0
MAX_TIMEOUT_S = 86400.0


def engine_timeout_s(value=None, environ=None) -> float:
    """The engine deadline: ``value`` if given, else ``$FA3VERIFY_ENGINE_TIMEOUT``, else 900 s; anything but a
    finite number in (0, 86400] raises EngineUnavailable naming where it came from and the allowed range."""
    source = "timeout_s"
    if value is None:
        text = (os.environ if environ is None else environ).get(ENV_TIMEOUT, "").strip()
        if not text:
            return DEFAULT_TIMEOUT_S
        source, value = ENV_TIMEOUT, text
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise EngineUnavailable(f"{source}: the engine deadline must be a finite number of seconds in "
                                f"(0, {MAX_TIMEOUT_S:g}], got {value!r}")
    return seconds


class EngineWorker:
    """One engine worker process: started, its first line read (``first``: the hello, or the import failure),
    then one answer per request, each within ``timeout_s``.

    ``argv``: the worker's command (the environment's python, ``-m``, the driver module); ``name``: what errors
    call it (``engine worker sglang==0.5.13``).
    """

    def __init__(self, argv: Sequence[str], name: str, env: Optional[dict] = None, cwd: Optional[str] = None,
                 timeout_s: Optional[float] = None):
        self.name = name
        self.timeout_s = engine_timeout_s(timeout_s)
        self.client = WorkerClient(argv, name, env=env, cwd=cwd, error=DriverError, encode=encode)
        self.first = self._checked(self.client.receive(self.timeout_s))

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
        return self._checked(self.client.request(obj, limit))

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
