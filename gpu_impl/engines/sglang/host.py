"""sglang as a system under test: a release (``sglang==V``) or a checkout / wheel (``sglang-src=PATH``) driven in
its engine environment by a long-lived worker (``sglang_driver``), one scenario per request.

Invariant: every ScenarioResult this returns came from the worker running sglang's own backend; a worker that
dies, misses the engine deadline (it is killed) or answers garbage raises :class:`DriverError` naming it
(``worker_client``: inconclusive, never a pass or a violation). A checkout runs
in the environment of the nearest registered release, with its own ``sglang`` first on the path; the worker's
``hello`` must show that sglang was imported from the checkout, else the spec is refused.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

from gpu_impl.sut import EngineSpec, SystemUnderTest
from gpu_impl.engines import envs
from gpu_impl.engines.sglang import recipes
from gpu_impl.engines.checkouts import resolve_checkout
from gpu_impl.engines.errors import CheckoutImportError, EngineUnavailable, ScenarioUnsupported
from gpu_impl.engines.protocol import result_from_wire, scenario_to_wire
from gpu_impl.engines.host import EngineHost
from gpu_impl.engines.worker_client import engine_start_timeout_s, engine_timeout_s

__all__ = ["SglangSUT", "ScenarioUnsupported", "resolve_source"]





def resolve_source(path: str) -> tuple:
    """(directory to put first on the path, sglang version, revision) of a checkout or wheel.

    ``path``: an sglang clone, its ``python/`` directory, or a ``.whl`` file (unpacked once into the engine home).
    """
    return resolve_checkout(path, "sglang", subdirs=("", "python"),
                            want="an sglang clone, its python/ directory")


class SglangSUT(SystemUnderTest):
    """sglang's own FlashAttentionBackend, in a worker process inside the release's engine environment."""

    #: the worker's main module (the engine driver); a harness may name another that serves the same protocol
    DEFAULT_WORKER = "gpu_impl.engines.sglang.driver"

    has_worker = True

    def __init__(self, spec: EngineSpec, progress: Callable[[str], None] = print, root: Optional[Path] = None,
                 worker: Optional[str] = None, worker_env: Optional[dict] = None, timeout_s: Optional[float] = None,
                 start_timeout_s: Optional[float] = None):
        """``worker``: the module run as the worker (default :data:`DEFAULT_WORKER`; ``fa3verify.sanitize
        .engine_worker`` runs the same driver under the runtime sanitizer); ``worker_env``: extra environment
        variables for it; ``timeout_s``: the deadline of each answer (default ``$FA3VERIFY_ENGINE_TIMEOUT`` or
        900 s, ``worker_client.engine_timeout_s``); ``start_timeout_s``: the deadline of the worker's start, its
        hello (default ``$FA3VERIFY_ENGINE_START_TIMEOUT`` or 900 s). Both are checked here."""
        self.spec = spec
        self.worker = worker or self.DEFAULT_WORKER
        self.worker_env = dict(worker_env or {})
        #: the worker's ``observer`` status from its latest answer (a sanitizer's status), or None
        self.observed: Optional[dict] = None
        self.source = None
        self.revision = None
        self.version = None
        if spec.kind == "sglang":
            self.release = envs.check_release(spec.release)
        elif spec.kind == "sglang-src":
            self.source, self.version, self.revision = resolve_source(spec.path)
            self.release = recipes.nearest_release(self.version or recipes.RELEASES[-1])
        else:
            raise EngineUnavailable(f"engine {spec}: not an sglang engine")
        self.timeout_s = engine_timeout_s(timeout_s)
        self.start_timeout_s = engine_start_timeout_s(start_timeout_s)
        self.env = envs.ensure_env(self.release, progress=progress, root=root)
        self._worker: Optional[EngineHost] = None
        self.hello: Optional[dict] = None

    # -- the worker ----------------------------------------------------------------------------------------
    def start(self) -> dict:
        """Start the worker (import sglang once); returns its hello. Idempotent; a worker that died or was
        killed at a missed deadline is replaced; a launched one (:meth:`launch`) is greeted now."""
        if self._worker is None or not self._worker.running:
            self.close()
            self._spawn()
        if self.hello is None:
            self.hello = dict(self._worker.hello, start_s=round(time.monotonic() - self._spawned_at, 2))
            self.observed = self._worker.first.get("observer")
        return self.hello

    def launch(self) -> None:
        """Start the worker's process without waiting for it (sglang's import runs beside whatever the caller does
        next, e.g. the gate's z3 stages); the first use (:meth:`start`, a request) reads its hello within the start
        deadline. Idempotent. The hello's ``start_s`` then counts from the launch."""
        if self._worker is None or not self._worker.running:
            self.close()
            self._spawn()

    def _spawn(self) -> None:
        extra = [str(self.source)] if self.source is not None else []
        env = envs.driver_environ(extra_paths=extra)
        env.update({"FA3VERIFY_ENGINE_RELEASE": self.release, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    # the FA3 build the worker judges under: the one this SUT says judges it (EnginePlugin.fa3_build)
                    "FA3VERIFY_FA3_BUILD": self.spec.plugin.fa3_build(self.spec)})
        env.update(self.worker_env)
        self._spawned_at = time.monotonic()
        self.hello = None
        self._worker = EngineHost(str(self.env / "bin" / "python"), self.worker, str(self.spec), "sglang", env,
                                  timeout_s=self.timeout_s, start_timeout_s=self.start_timeout_s, source=self.source,
                                  import_error=lambda first, worker: self._import_error(first), greet=False)

    def _import_error(self, resp: dict) -> Exception:
        what = f"sglang-src={self.spec.path}" if self.source is not None else f"sglang=={self.release}"
        msg = f"{what}: does not import in its environment ({self.env}): {resp.get('error')}"
        return CheckoutImportError(msg) if self.source is not None else EngineUnavailable(msg)

    def request(self, obj: dict, timeout: Optional[float] = None) -> dict:
        """The worker's answer to one request within ``timeout`` seconds (default: the engine deadline)."""
        self.start()
        return self._worker.request(obj, timeout)

    def _answer(self, resp: dict) -> dict:
        if resp.get("ok") and "observer" in resp:
            self.observed = resp["observer"]
        return self._worker.answer(resp, f"engine {self.spec}", crashed="sglang's code crashed")

    # -- SystemUnderTest -----------------------------------------------------------------------------------
    def run(self, scenario, kernel=None, numerics: bool = False, device: str = "cpu"):
        lifecycle = getattr(scenario, "lifecycle", None) or {}
        sequence = ({"layers": lifecycle.get("layers", 1), "lifecycle_defect": lifecycle.get("engine_defect")}
                    if lifecycle else {})   # a lifecycle case's driven sequence (spec.model.case_lifecycle)
        resp = self._answer(self.request({"op": "run", "scenario": scenario_to_wire(scenario),
                                          "numerics": bool(numerics), **sequence}))
        return result_from_wire(resp)

    def validate(self, server_config, model_config=None) -> tuple:
        """(accepted, message): the release's own verdict on a configuration, from its ServerArgs validation and
        then its model-load head split (accepted is None when they cannot run on CPU); a model-load message starts
        with ``model load (CHECK):``, naming the release's check."""
        import dataclasses

        server = dataclasses.asdict(server_config) if dataclasses.is_dataclass(server_config) else dict(server_config)
        model = dataclasses.asdict(model_config) if dataclasses.is_dataclass(model_config) else model_config
        resp = self._answer(self.request({"op": "validate", "server": server, "model": model}))
        if resp.get("stage") == "model_load":
            return resp["accepted"], f"model load ({resp.get('check')}): {resp['message']}"
        return resp["accepted"], resp["message"]

    def domain(self):
        """This release's own configuration space (``sglang_domain.ReleaseDomain``): its server arguments over a
        superset of what its parser takes, kept where its ServerArgs validation accepts them; one per SUT, so
        the release is asked once per configuration."""
        if getattr(self, "_domain", None) is None:
            from gpu_impl.engines.sglang.domain import ReleaseDomain

            self._domain = ReleaseDomain(self.release, self.validate, label=str(self.spec))
        return self._domain

    def assumption_facts(self) -> dict:
        """The release's facts (``spec/model/assumption_facts.json``); a checkout has those of its nearest release (a
        simplification: a checkout whose validation differs is caught where the gate replays a witness, since each
        witness is put to the checkout's own validation first)."""
        from spec.model.assumption_facts import facts_for

        return facts_for("sglang", self.release)

    def identity(self) -> dict:
        if self.source is not None:
            return {"name": "sglang-src", "path": str(self.spec.path), "revision": self.revision,
                    "version": self.version, "release": self.release}
        return {"name": "sglang", "release": self.release}

    def describe(self) -> str:
        return str(self.spec) + (f" (runs beside sglang=={self.release})" if self.source is not None else "")

    def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
