"""vLLM's FlashAttention backend as a system under test: a worker process in the release's engine environment, on
the release's own code (``vllm==V``) or on a checkout or wheel (``vllm-src=PATH``) put first on the path.

Invariant: a scenario reaches vLLM's own metadata builder and attention impl (``vllm_driver``) as plain data and
comes back as a :class:`gpu_impl.scenario.ScenarioResult` whose findings are the checking shim's verdicts on what
vLLM passed to FA3; a worker that dies, misses the engine deadline (it is killed) or answers garbage raises
:class:`~gpu_impl.engines.errors.DriverError` naming it (``worker_client``: inconclusive, never a pass). Models
``vllm/v1/attention/backends/flash_attn.py`` by running it.

:func:`scenario_to_vllm` maps the suite's Scenario (sglang-shaped: ``spec.model.config.ServerConfig`` and
``ModelConfig``) onto the driver's fields: ``tp_size`` -> tp, ``attn_cp_size`` -> decode context parallel,
``cuda_graph`` -> full CUDA graph (vLLM's default mode for FA3 is FULL_AND_PIECEWISE; decode batches take the full
graph), ``enable_deterministic_inference`` -> ``VLLM_BATCH_INVARIANT``, ``context_length`` -> max_model_len,
``page_size`` -> block size (vLLM's FA3 needs a multiple of 16: smaller sizes are raised to 16); the scenario's
vLLM options (``Scenario.options["vllm"]``, :mod:`.options`: piecewise graphs, KV dtype, layers and windows) go as they are. Policy fields
(guard, metadata heads) do not apply: vLLM's code decides. A seeded defect is a transformation the driver applies
from outside vLLM's code (:data:`VLLM_DEFECTS`).
"""

from __future__ import annotations

import os

from pathlib import Path
from typing import Optional

from gpu_impl.sut import EngineSpec, SystemUnderTest
from gpu_impl.engines import envs
from gpu_impl.engines.vllm import recipes as vllm_recipes
from gpu_impl.engines.vllm.options import OPTIONS_KEY
from gpu_impl.engines.checkouts import resolve_checkout
from gpu_impl.engines.errors import CheckoutImportError, DriverError, ScenarioUnsupported
from gpu_impl.engines.host import EngineHost
from gpu_impl.engines.worker_client import engine_start_timeout_s, engine_timeout_s

__all__ = ["VllmWorker", "VllmSUT", "scenario_to_vllm", "resolve_vllm_source", "VLLM_DEFECTS"]

#: Set in a driver's environment to the checkout it runs: build outputs the checkout lacks (a plain clone has no
#: ``vllm/vllm_flash_attn/`` and no compiled extensions) are then found in the release's package (``vllm_glue``).
SOURCE_VARIABLE = "FA3VERIFY_VLLM_SOURCE"


def resolve_vllm_source(path: str) -> tuple:
    """(directory to put first on the path, vLLM version or None, revision) of a vLLM checkout or wheel.

    ``path``: a vLLM clone (the directory holding ``vllm/``) or a ``.whl`` file (unpacked once into the engine
    home); anything else is a :class:`CheckoutImportError` naming what was expected."""
    return resolve_checkout(path, "vllm", unpack_prefix="vllm-",
                            want="a vLLM clone's root, the directory holding vllm/")


def nearest_vllm_release(version: Optional[str]) -> str:
    """The registered vLLM release a checkout of ``version`` runs beside: the newest at or before it, else the
    oldest; the newest when the checkout says no version."""
    from gpu_impl.engines.sglang.recipes import release_key

    releases = vllm_recipes.RELEASES
    try:
        key = release_key(str(version).split("+")[0].split("rc")[0].split(".dev")[0])
    except (ValueError, AttributeError):
        return releases[-1]
    older = [r for r in releases if release_key(r) <= key]
    return older[-1] if older else releases[0]


#: The request a launched worker answers right after its hello: vLLM's config validation of a plain configuration,
#: whose first run imports vLLM's config classes (measured 8 s of a cold worker's first validation under load).
WARM_UP = {"tp": 1, "dcp": 1, "block_size": 16, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128,
           "dtype": "bfloat16", "max_model_len": 4096}


def release_fa3_build(release: str) -> str:
    """The FA3 build a vLLM release's driver judges under: the one refmodel/fa3_builds.json maps it to (read from its
    wheel for 0.10.1 .. 0.32.0), else the build modelled for 0.33.0 (``front.VLLM_BUILD``)."""
    from gpu_impl.engines.vllm.front import VLLM_BUILD
    from refmodel.fa3_builds import build_for_engine

    try:
        return build_for_engine("vllm", release)
    except ValueError:
        return VLLM_BUILD


class VllmWorker(EngineHost):
    """One driver process (``python -m gpu_impl.engines.vllm.driver``) speaking JSON lines: its hello within the
    start deadline (``start_timeout``: seconds, default ``$FA3VERIFY_ENGINE_START_TIMEOUT`` or 900), every answer
    within the engine deadline (``timeout``: seconds, default ``$FA3VERIFY_ENGINE_TIMEOUT`` or 900;
    ``worker_client``)."""

    def __init__(self, release: str, progress=print, root=None, timeout: Optional[float] = None,
                 source: Optional[Path] = None, label: Optional[str] = None, start_timeout: Optional[float] = None,
                 greet: bool = True):
        """``source``: a checkout's root (from :func:`resolve_vllm_source`), imported instead of the release's vLLM
        (the hello must show it was); ``label``: the engine's name in messages (default ``vllm==release``).
        ``greet`` False: start the process and queue :data:`WARM_UP` behind its import, and read the hello (and the
        warm-up's answer) only at :meth:`greet`, so the import runs while the caller does other work."""
        self.release = envs.check_release(release, engine="vllm")
        self.timeout = engine_timeout_s(timeout)
        self.start_timeout = engine_start_timeout_s(start_timeout)
        label = label or f"vllm=={self.release}"
        d = envs.ensure_env(release, progress=progress, root=root, engine="vllm")
        env = envs.driver_environ(extra_paths=[str(source)] if source else (), engine="vllm")
        from gpu_impl.engines.vllm.scenario import GENERATION_VARIABLE
        from gpu_impl.engines.vllm.front import BUILD_VARIABLE

        env[GENERATION_VARIABLE] = vllm_recipes.DRIVER_GENERATIONS[self.release]
        if source:
            env[SOURCE_VARIABLE] = str(source)
        # a checkout is judged under the build of the release whose environment it runs in (the nearest release at
        # or before its version), unless FA3VERIFY_FA3_BUILD names another
        env[BUILD_VARIABLE] = ((os.environ.get(BUILD_VARIABLE) if source else None)
                               or release_fa3_build(self.release))

        def import_error(first, worker):
            if source:
                return CheckoutImportError(f"{label}: does not import in the environment of vllm=={release} "
                                           f"({d}): {first.get('error')}")
            return DriverError(f"{label}: the driver did not start: {first.get('error')}", worker=worker.name,
                               pid=worker.pid)

        super().__init__(str(d / "bin" / "python"), "gpu_impl.engines.vllm.driver", label, "vllm", env,
                         timeout_s=self.timeout, start_timeout_s=self.start_timeout, source=source,
                         import_error=import_error, greet=greet, warm_up={"op": "validate", "scenario": dict(WARM_UP)})

    def request(self, obj: dict, timeout: Optional[float] = None) -> dict:
        return super().request(obj, timeout)

    def run(self, scenario: dict, numerics: bool = False) -> dict:
        """The driver's answer for one vLLM scenario (``vllm_driver.scenario_defaults`` fields); ``numerics``: the
        calls on the FA3 emulator, outputs judged against the oracle (``vllm_numerics``)."""
        return self.answer(self.request({"op": "run", "scenario": scenario, "numerics": bool(numerics)}), self.label)

    def validate(self, scenario: dict) -> dict:
        """vLLM's own config validation of one scenario's configuration: ``{"accepted", "message"}``."""
        resp = self.request({"op": "validate", "scenario": scenario})
        if not resp.get("ok"):
            if resp.get("kind") == "bad_request":
                raise ValueError(f"{self.label}: {resp.get('error')}")
            raise DriverError(f"{self.label}: validate: {resp.get('kind')}: {resp.get('error')}")
        return resp

    def close(self) -> None:
        self._worker.close()


#: Seeded defects (``gpu_impl.defects`` names) the vLLM driver applies, and the driver's transformation for each:
#: vLLM #20301's pattern, the precompute's ``max_num_splits`` other than the call's -- the metadata is computed with
#: the heuristic (0) while the call keeps the split count it was captured with (full CUDA graph: 32).
#: ``precompute-max-seqlen-q-off-by-one`` (theorem 9's drift): the precompute asks for ``max_seqlen_q + 1``.
VLLM_DEFECTS = {"graph-split-count-from-capture": {"precompute_num_splits": 0},
                "precompute-max-seqlen-q-off-by-one": {"precompute_max_seqlen_q_delta": 1}}


def _unsupported(message: str):
    return ScenarioUnsupported(message)


def scenario_to_vllm(scn) -> dict:
    """The driver fields for a gpu_impl.scenario.Scenario (see the module doc for the mapping).

    The scenario's vLLM options (``scn.options["vllm"]``, :mod:`.options`) add what the server/model cannot say: piecewise graphs,
    the KV cache dtype, layers and their sliding windows, capture sizes, the CUDA-graph split count; its seeded
    defects become the driver's transformation (:data:`VLLM_DEFECTS`); a V head size other than K's goes to the driver
    (``head_dim_v``: vLLM's DiffKV backend, refused by the driver where the release has none). A feature the driver
    does not run (MLA, a defect it cannot seed) raises ``ScenarioUnsupported``."""
    server, model = scn.server, scn.model
    if model.is_mla:
        raise _unsupported("model.is_mla: vLLM's MLA backends are not the FlashAttention backend driven here")
    defects = sorted(getattr(scn, "defects", ()) or ())
    cannot = [d for d in defects if d not in VLLM_DEFECTS]
    if cannot:
        raise _unsupported(f"defects: {cannot} cannot be seeded in vLLM's code; the vLLM driver seeds "
                           f"{sorted(VLLM_DEFECTS)}")
    steps = []
    for st in scn.steps:
        if st.mode == "decode":
            steps.append({"seq_lens": list(st.seq_lens)})
        elif st.mode in ("extend", "mixed"):
            ext = list(st.extend_lens or [1] * len(st.seq_lens))
            steps.append({"seq_lens": list(st.seq_lens), "query_lens": ext})
    opts = dict((getattr(scn, "options", None) or {}).get(OPTIONS_KEY) or {})
    graph = (("full_and_piecewise" if opts.get("full_and_piecewise") else "full") if server.cuda_graph
             else ("piecewise" if opts.get("piecewise") else "none"))
    fp8 = model.dtype == "float8_e4m3"  # sglang's vocabulary: the KV cache (and so FA3's qkv dtype) is fp8
    out = {"num_heads": model.num_heads, "num_kv_heads": model.num_kv_heads, "head_dim": model.head_dim,
           "dtype": "bfloat16" if fp8 else model.dtype, **({"kv_cache_dtype": "fp8"} if fp8 else {}),
           "tp": server.tp_size, "dcp": server.attn_cp_size, "cuda_graph": graph,
           "batch_invariant": bool(server.enable_deterministic_inference), "num_sm": server.num_sm,
           "max_model_len": max([server.context_length] + [max(s["seq_lens"]) for s in steps]),
           "block_size": max(16, -(-server.page_size // 16) * 16), "steps": steps,
           "seed": int(getattr(scn, "seed", 0) or 0) % (2 ** 63)}
    if model.head_dim_v not in (None, model.head_dim):  # vLLM's DiffKV backend (the driver refuses it where absent)
        out["head_dim_v"] = model.head_dim_v
    for name in ("kv_cache_dtype", "num_layers", "sliding_window", "capture_sizes", "max_num_splits_for_cuda_graph",
                 "common_prefix", "draft_tokens", "runner", "attention_chunk_size", "layer_kv_heads"):
        if opts.get(name) is not None:
            out[name] = opts[name]
    for d in defects:
        out["defect"] = {**(out.get("defect") or {}), **VLLM_DEFECTS[d]}
    lifecycle = getattr(scn, "lifecycle", None)
    if lifecycle:  # a lifecycle case's driven sequence (spec.model.case_lifecycle)
        out["num_layers"] = lifecycle.get("layers", 1)
        out["lifecycle_defect"] = lifecycle.get("engine_defect")
    return out


class VllmSUT(SystemUnderTest):
    """vLLM release ``V`` (``vllm==V``), or a checkout or wheel (``vllm-src=PATH``) beside its nearest release,
    driven in that release's engine environment."""

    has_worker = True

    def __init__(self, release: Optional[str] = None, progress=print, root=None, timeout_s: Optional[float] = None,
                 spec: Optional[EngineSpec] = None, start_timeout_s: Optional[float] = None):
        """``spec``: ``vllm-src=PATH`` (the checkout is resolved now: a path that holds no vLLM is refused here);
        else release ``release``. ``timeout_s``: the deadline of each answer of the worker (default
        ``$FA3VERIFY_ENGINE_TIMEOUT`` or 900 s); ``start_timeout_s``: the deadline of its start, the hello
        (default ``$FA3VERIFY_ENGINE_START_TIMEOUT`` or 900 s); both checked here, before any worker starts."""
        self.spec = spec or EngineSpec("vllm", release=release)
        self.source = self.version = self.revision = None
        if self.spec.kind == "vllm-src":
            self.source, self.version, self.revision = resolve_vllm_source(self.spec.path)
            self.release = nearest_vllm_release(self.version)
        else:
            self.release = self.spec.release
        self.timeout_s = engine_timeout_s(timeout_s)
        self.start_timeout_s = engine_start_timeout_s(start_timeout_s)
        self._worker: Optional[VllmWorker] = None
        self._progress, self._root = progress, root

    @property
    def worker(self) -> VllmWorker:
        """The running driver; one that died or was killed at a missed deadline is replaced by a fresh one (as
        ``SglangSUT.start`` does), so an API caller's next scenario does not meet a dead worker."""
        if self._worker is not None and not self._worker.running:
            self.close()
        if self._worker is None:
            self._worker = VllmWorker(self.release, progress=self._progress, root=self._root,
                                      timeout=self.timeout_s, source=self.source, label=str(self.spec),
                                      start_timeout=self.start_timeout_s)
        self._worker.greet()  # a launched one: its hello now
        return self._worker

    def start(self) -> dict:
        """Start the driver (import vLLM once); returns its hello. Idempotent."""
        return self.worker.greet()

    def launch(self) -> None:
        """Start the driver's process without waiting for it (its import, and a warm-up of vLLM's config
        validation, run beside whatever the caller does next); the first use waits for its hello. Idempotent."""
        if self._worker is None or not self._worker.running:
            self.close()
            self._worker = VllmWorker(self.release, progress=self._progress, root=self._root,
                                      timeout=self.timeout_s, source=self.source, label=str(self.spec),
                                      start_timeout=self.start_timeout_s, greet=False)

    def run(self, scenario, kernel=None, numerics: bool = False, device: str = "cpu"):
        from gpu_impl.engines.protocol import result_from_wire

        return result_from_wire(self.worker.run(scenario_to_vllm(scenario), numerics=numerics))

    def validate(self, server_config, model_config=None) -> tuple:
        """(accepted, message): vLLM's own config validation (``vllm_validation``) of a server and model
        configuration (a dict or ServerConfig; the model defaults to llama-3-8b), mapped to vLLM's fields as a run
        maps them (:func:`scenario_to_vllm`); accepted is None where vLLM's driver does not run it at all."""
        import dataclasses

        from gpu_impl.config import MODELS, ServerConfig
        from gpu_impl.scenario import Scenario, Step

        server = server_config if dataclasses.is_dataclass(server_config) else ServerConfig(**dict(server_config))
        model = MODELS["llama-3-8b"] if model_config is None else model_config
        scn = Scenario(server=server, model=model, guard=None, steps=[Step("decode", [128])])
        try:
            wire = scenario_to_vllm(scn)
        except Exception as exc:  # noqa: BLE001 - a configuration vLLM's driver does not run decides nothing
            return None, f"not driven by the vLLM driver: {exc}"
        try:
            answer = self.worker.validate({k: wire[k] for k in self.VALIDATED if k in wire})
        except ValueError as exc:  # fields the driver itself refuses (tp 0): not vLLM's verdict
            return None, f"not driven by the vLLM driver: {exc}"
        return answer.get("accepted"), str(answer.get("message") or "")

    #: the driver fields vLLM's config validation reads (``vllm_validation``): a verdict is cached on them
    VALIDATED = ("tp", "dcp", "block_size", "kv_cache_dtype", "num_heads", "num_kv_heads", "head_dim", "dtype",
                 "max_model_len")

    def domain(self):
        """vLLM's configuration families (the suite's ``vllm`` family: graph modes, windows, KV dtype, DCP; ``vllm-v2``
        for a release driven by the second generation, which adds vLLM's FULL_AND_PIECEWISE mode; ``vllm-paths-both``
        where both runners are driven, ``vllm-paths-both-drafts`` where the V2 runner's drafter is driven too; each
        with its share of layers that differ from the config and K/V head sizes that differ, ``strategies._differing_layers_case``),
        each drawn case kept only where vLLM's own config validation accepts it (:meth:`check_case`); reach per path.
        One per SUT."""
        if getattr(self, "_domain", None) is None:
            from gpu_impl.domain import ConfigDomain

            self._verdicts: dict = {}
            from gpu_impl.engines.vllm.paths import PATH_KEYS, both_runners, release_paths

            table = release_paths(self.release)
            if vllm_recipes.DRIVER_GENERATIONS.get(self.release) == "v2":
                from gpu_impl.engines.vllm.driver_v2 import PATHS_V2

                family, keys = "vllm-v2", PATHS_V2
            else:  # the V1 runner's paths (shared prefixes, drafts), and the V2 runner where it ships both
                family = "vllm-paths-both" if both_runners(self.release) else "vllm-paths"
                if family == "vllm-paths-both" and table.get("V2 drafter") is None:
                    family = "vllm-paths-both-drafts"  # the V2 runner's drafter is driven too
                keys = ("none", "piecewise", "full")
            self._domain = ConfigDomain(str(self.spec), family=family, check=self.check_case,
                                        reach_keys=keys + tuple(k for k in PATH_KEYS if k not in keys),
                                        not_covered={k: why for k, why in table.items() if why})
        return self._domain

    def check_case(self, case) -> Optional[str]:
        """None when vLLM accepts a drawn case's configuration, else its reason (``vllm_validation``; an
        inconclusive validation is a rejection with that message). A case the driver does not run at all is
        left to the run (counted as unsupported there)."""
        from gpu_impl.scenario import Scenario, Step

        scn = Scenario(server=case.server, model=case.model, guard=None, steps=[Step(**s) for s in case.steps],
                       seed=case.seed, options=dict(getattr(case, "options", None) or {}))
        try:
            wire = scenario_to_vllm(scn)
        except Exception:  # noqa: BLE001 - not driven: the run says so
            return None
        key = tuple(str(wire.get(k)) for k in self.VALIDATED)
        if key not in self._verdicts:
            try:
                answer = self.worker.validate({k: wire[k] for k in self.VALIDATED if k in wire})
            except ValueError:  # fields the driver itself refuses: the run says so
                return None
            accepted = answer.get("accepted")
            self._verdicts[key] = (None if accepted is True else
                                   f"inconclusive (validation did not run on CPU): {answer.get('message')}"
                                   if accepted is None else str(answer.get("message")))
        return self._verdicts[key]

    #: a case's CUDA-graph mode (``scenario_to_vllm``'s ``cuda_graph``) as the engine matrix names its path
    GRAPH_PATHS = {"none": "eager", "piecewise": "piecewise CUDA graph", "full": "full CUDA graph (FULL)",
                   "full_and_piecewise": "full CUDA graph (FULL_AND_PIECEWISE)"}

    def case_family(self, case) -> tuple:
        """(configuration family, path) of a case in vLLM's terms: its sliding windows, DCP, KV cache dtype,
        batch invariance, chunked local layers, shared prefix, drafter, runner, layers with their own KV heads and head
        sizes (the family), and its CUDA-graph mode (the path)."""
        server, model = dict(case.server or {}), dict(case.model or {})
        opts = dict((getattr(case, "options", None) or {}).get(OPTIONS_KEY) or {})
        graph = (("full_and_piecewise" if opts.get("full_and_piecewise") else "full") if server.get("cuda_graph")
                 else ("piecewise" if opts.get("piecewise") else "none"))
        parts = []
        window = opts.get("sliding_window")
        if isinstance(window, list):
            settings = sorted({w for w in window if w is not None})
            parts.append("mixed sliding windows" if len(set(window)) > 1 else f"sliding window {settings[0]}"
                         if settings else "")
        elif window is not None:
            parts.append(f"sliding window {window}")
        if int(server.get("attn_cp_size", 1) or 1) > 1:
            parts.append(f"DCP {server['attn_cp_size']}")
        if opts.get("kv_cache_dtype") == "fp8" or model.get("dtype") == "float8_e4m3":
            parts.append("fp8 KV cache")
        if server.get("enable_deterministic_inference"):
            parts.append("batch invariant")
        chunk = opts.get("attention_chunk_size")
        if chunk:
            sizes = sorted({c for c in (chunk if isinstance(chunk, list) else [chunk]) if c is not None})
            parts.append("chunked local attention " + "/".join(map(str, sizes)))
        if opts.get("common_prefix"):
            parts.append(f"shared prefix {opts['common_prefix']}")
        if opts.get("draft_tokens"):
            parts.append(f"drafter {opts['draft_tokens']}")
        if opts.get("runner") == "v2":
            parts.append("V2 runner")
        if opts.get("layer_kv_heads"):
            parts.append("layers with their own KV heads")
        dv = model.get("head_dim_v")
        parts.append(f"head sizes K {model.get('head_dim')} / V {dv}" if dv not in (None, model.get("head_dim"))
                     else f"head size {model.get('head_dim')}")
        return " + ".join(p for p in parts if p), self.GRAPH_PATHS[graph]

    def family_probes(self) -> tuple:
        """None: vLLM's families are the campaign's own (``vllm`` / ``vllm-v2``), counted per path in its reach."""
        return ()

    def assumption_facts(self) -> dict:
        """The release's facts where spec's assumptions apply to vLLM (``spec/model/assumption_facts.json``); a checkout
        has those of its nearest release."""
        from spec.model.assumption_facts import facts_for

        return facts_for("vllm", self.release)

    def describe(self) -> str:
        return str(self.spec) + (f" (runs beside vllm=={self.release})" if self.source is not None else "")

    def identity(self) -> dict:
        if self.source is not None:
            return {"name": "vllm-src", "path": str(self.spec.path), "revision": self.revision,
                    "version": self.version, "release": self.release}
        ident = {"name": str(self.spec), "release": self.spec.release}
        # the release is the spec's: asking for it never waits on a worker still importing (the gate asks before
        # its z3 stages, which run beside that import); the worker's own word is added once its hello is in
        hello = self._worker.greeted if self._worker is not None else None
        if hello is not None:
            ident["reported_version"] = hello.get("release")
        return ident

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None
