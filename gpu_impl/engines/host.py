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
                 import_error: Callable[[dict, EngineWorker], Exception], greet: bool = True,
                 warm_up: Optional[dict] = None):
        """``greet``: read the hello now; False: only start the process (its import runs beside whatever the caller
        does next; the first request, or :meth:`greet`, reads the hello within the start deadline), queueing
        ``warm_up`` (a request whose answer is read and dropped after the hello) when one is given."""
        self.label, self.package = label, package
        self._source, self._import_error = source, import_error
        self._worker = EngineWorker([python, "-m", module], f"engine worker {label}", env=env,
                                    cwd=str(envs.project_path()), timeout_s=timeout_s,
                                    start_timeout_s=start_timeout_s, greet=False)
        self._hello: Optional[dict] = None
        self._warming = False
        if greet:
            self.greet()
        elif warm_up is not None:
            self._worker.send_ahead(dict(warm_up))
            self._warming = True

    def greet(self) -> dict:
        """The driver's hello, read within the start deadline the first time (a driver that did not import raises
        ``import_error``; a checkout that was not the one imported, CheckoutImportError), then the queued warm-up's
        answer; idempotent."""
        if self._hello is not None:
            return self._hello
        first = self._worker.first
        if not first.get("ok"):
            error = self._import_error(first, self._worker)
            self.close()
            raise error
        hello = dict(first["hello"])
        if self._source is not None and not str(hello.get("path", "")).startswith(str(self._source)):
            self.close()
            raise CheckoutImportError(f"{self.label}: {self.package} was imported from {hello.get('path')}, not "
                                      f"from the checkout {self._source}")
        if self._warming:
            self._warming = False
            self._worker.answer_ahead()  # its verdict is not used: it only warmed the driver's imports
        self._hello = hello
        return hello

    @property
    def first(self) -> dict:
        """The driver's first line (its hello, or the import failure)."""
        return self._worker.first

    @property
    def hello(self) -> dict:
        return self.greet()

    @property
    def greeted(self) -> Optional[dict]:
        """The driver's hello if it was already read, else None; never waits (the worker may still be importing)."""
        return self._hello

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
        """The driver's answer to one request within ``timeout`` seconds (default: the engine deadline), after its
        hello."""
        self.greet()
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
