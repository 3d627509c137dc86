"""The one host adapter of every worker-backed engine: start its driver in the release's environment, check the
hello (a checkout must be what was imported), send requests, turn the driver's refusals into the harness's errors.

Invariant: every engine whose code runs in a worker process (sglang's driver, vLLM's driver, sglang under the
runtime sanitizer) is started, asked and closed here, on the one client and deadline policy of
:mod:`gpu_impl.engines.worker_client`; an engine folder says only what differs (the environment variables, the
module, what a failed import is called).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from gpu_impl.engines import envs
from gpu_impl.engines.errors import CheckoutImportError, DriverError, ScenarioUnsupported
from gpu_impl.engines.worker_client import EngineWorker

__all__ = ["EngineHost"]


class EngineHost:
    """One started driver process of an engine, speaking the worker protocol (``gpu_impl.engines.protocol``).

    ``python``: the environment's interpreter; ``module``: the driver run with ``-m``; ``label``: the engine's name
    in messages; ``package``: the engine's import name (``sglang``, ``vllm``), checked against the hello's ``path``
    when ``source`` (a checkout) is given; ``import_error(first, worker)``: the exception for a driver whose first
    answer is not a hello (it did not import). Deadlines are seconds (``timeout_s`` each answer, ``start_timeout_s`` the
    hello), already checked by the caller (``worker_client.engine_timeout_s``)."""

    def __init__(self, python: str, module: str, label: str, package: str, env: dict, *, timeout_s: float,
                 start_timeout_s: float, source: Optional[Path] = None,
                 import_error: Callable[[dict, EngineWorker], Exception]):
        self.label, self.package = label, package
        self._worker = EngineWorker([python, "-m", module], f"engine worker {label}", env=env,
                                    cwd=str(envs.project_path()), timeout_s=timeout_s,
                                    start_timeout_s=start_timeout_s)
        self.first = self._worker.first
        if not self.first.get("ok"):
            error = import_error(self.first, self._worker)
            self.close()
            raise error
        self.hello = dict(self.first["hello"])
        if source is not None and not str(self.hello.get("path", "")).startswith(str(source)):
            self.close()
            raise CheckoutImportError(f"{label}: {package} was imported from {self.hello.get('path')}, not from the "
                                      f"checkout {source}")

    @property
    def pid(self) -> int:
        return self._worker.pid

    @property
    def name(self) -> str:
        return self._worker.name

    @property
    def running(self) -> bool:
        """Whether the driver process still runs (False once it exited or was killed at a missed deadline)."""
        return self._worker.running

    def request(self, obj: dict, timeout: Optional[float] = None) -> dict:
        """The driver's answer to one request within ``timeout`` seconds (default: the engine deadline)."""
        return self._worker.request(obj, timeout)

    def answer(self, resp: dict, prefix: str, crashed: Optional[str] = None) -> dict:
        """``resp`` when the driver answered; otherwise its refusal as the harness's error, the message starting
        with ``prefix``: a feature it does not run is :class:`ScenarioUnsupported` (counted, never a verdict), a
        request it refuses a ValueError, anything else a :class:`DriverError` (``crashed``: its words, default the
        answer's kind)."""
        if resp.get("ok"):
            return resp
        kind, err = resp.get("kind"), resp.get("error")
        if kind == "unsupported":
            raise ScenarioUnsupported(f"{prefix}: {err}")
        if kind == "bad_request":
            raise ValueError(f"{prefix}: {err}")
        raise DriverError(f"{prefix}: {crashed or kind}: {err}\n{resp.get('traceback', '')}")

    def close(self) -> None:
        self._worker.close()
