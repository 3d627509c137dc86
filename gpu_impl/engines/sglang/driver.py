"""The sglang engine worker: runs scenarios on a release's own ``FlashAttentionBackend`` and reports every FA3
metadata precompute and every kernel call that consumed it.

Invariant: what is checked is what sglang's code passed to FA3: ``get_scheduler_metadata`` and
``flash_attn_with_kvcache`` are replaced (through the fake ``sgl_kernel.flash_attn``) by the recording and
checking shim ``gpu_impl.fa3_calls.CheckingFA3`` in record mode with deep checks, over a shape-only FA3 (or the
emulator when numerics are asked for); the backend is constructed through the release's test kit
(``sglang/test/kits/attention_unittest``) with the rank's parallel layout set where that release reads it
(``sglang_glue``). Models ``python/sglang/srt/layers/attention/flashattention_backend.py`` by running it.

Run as ``python -m gpu_impl.engines.sglang.driver`` inside an engine environment, with the fakes and the project
root on PYTHONPATH (``envs.driver_environ``); one JSON request per stdin line, one JSON response per stdout line.
Requests: ``{"op": "hello"}``, ``{"op": "run", "scenario": ..., "numerics": false}``, ``{"op": "validate",
"server": ..., "model": ...}``, ``{"op": "quit"}``. Every response has ``ok``; failures carry ``error`` and
``kind`` ("import", "unsupported", "bad_request", "crash").

FA3 modes (chosen by whoever starts the worker, :func:`run_worker`'s ``fa3``; sglang's code never sees the choice):
``"checking"`` (the default, above) and ``"emulator"``: the fake ``sgl_kernel.flash_attn`` routes to
:class:`gpu_impl.engines.emulator_fa3.EmulatorFA3`, plain FA3 stand-ins that check nothing, so that a runtime
checker wrapping the entry points from outside (``fa3verify.sanitize``, started by ``fa3verify.sanitize
.engine_worker``) is what sees the hand-off; a ``MetadataMismatch`` it raises out of sglang's code is answered as
a finding (``detail.source`` "sanitizer"), and ``run_worker(observer=...)``'s ``status()`` rides on every answer.

Simplifications (also in docs): one full-attention layer per model (sliding-window layers never consume the
metadata and are not driven); extend and mixed steps are not run on the engine (they exercise the eager runner's
CP-v2 bookkeeping, not the decode metadata; the trace says so); an idle DP rank runs no eager call (as the
model), and under CUDA graph replays the graph with padding rows; CUDA-graph batch sizes are the model's
``gpu_impl.backend.CUDA_GRAPH_BATCH_SIZES``; in record mode the KV pool is a few pages shared by all rows (no
numerics read it); MLA models and fp8 KV caches are refused.
"""

from __future__ import annotations

import io
import os
import sys
import time
from typing import Optional

from gpu_impl.engines import protocol
from gpu_impl.engines.protocol import Unsupported
from gpu_impl.engines.protocol import quiet as _quiet
from gpu_impl.engines.call_sites import caller_location
from gpu_impl.engines.sglang.rank import RankBackend

_PROTOCOL_OUT = sys.stdout


#: What the fake ``sgl_kernel.flash_attn`` routes to: the checking shim, or plain emulator-backed FA3.
FA3_MODES = ("checking", "emulator")


class ShapeOnlyFA3:
    """FA3 without numerics: the metadata from refmodel (``get_scheduler_metadata``), calls return zeros of the
    output's shape. Enough for record mode: every check reads shapes, scalars and the metadata tensor."""

    def __init__(self, num_sm: int, arch: int = 90, build: str = "upstream-0251105a"):
        self.num_sm, self.arch, self.build = num_sm, arch, build

    def get_scheduler_metadata(self, *args, **kwargs):
        from refmodel.metadata import get_scheduler_metadata

        from gpu_impl.fa3_calls import record_precompute

        pre = record_precompute(*args, num_sm=self.num_sm, arch=self.arch, read_tensors=True, build=self.build,
                                **kwargs)
        return get_scheduler_metadata(**pre.scheduler_kwargs())

    def flash_attn_with_kvcache(self, *args, **kwargs):
        import torch

        from gpu_impl.fa3_calls import bind_call

        a = bind_call(*args, **kwargs)
        q, v = a["q"], a["v_cache"]
        out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
        if a.get("return_softmax_lse"):
            lse = torch.zeros(q.shape[:-1], dtype=torch.float32).transpose(-1, -2)
            return out, lse, None, None
        return out

    def flash_attn_varlen_func(self, *args, **kwargs):
        raise Unsupported("flash_attn_varlen_func (extend) is not run by the engine driver")


class EngineFA3:
    """What the fake ``sgl_kernel.flash_attn`` routes to: CheckingFA3 (record mode, deep) plus the CUDA-graph view.

    A persistent CUDA-graph buffer is written by slice assignment (``buf[:n] = md``), which the checker's
    registry cannot follow; a metadata tensor of unknown origin whose contents equal the latest precompute's output
    is that precompute's metadata (the bytes FA3 reads are exactly those), so it is attributed to it. Calls made
    while ``capturing`` are kept with their arguments: a replay re-records the captured call's own tensors (their
    contents updated in place by the replay-time metadata init) with its frozen shapes and scalars.
    """

    def __init__(self, num_sm: int, numerics: bool, build: str = "upstream-0251105a",
                 lifecycle_defect: Optional[str] = None):
        from refmodel.fa3_builds import UPSTREAM

        from gpu_impl.fa3_calls import CheckingFA3
        from gpu_impl.engines.lifecycle_judge import LifecycleJudge

        #: the FA3 build that judges this run: the release's (refmodel/fa3_builds.json), or upstream's for
        #: numerics (the emulator models upstream's kernel)
        self.build = UPSTREAM if numerics else build
        if numerics:
            from gpu_impl.kernels.emulated import EmulatedKernel

            impl = EmulatedKernel(mode="gpu-like", num_sm=num_sm)
        else:
            impl = ShapeOnlyFA3(num_sm, build=self.build)
        self.checker = CheckingFA3(impl, mode="record", deep=True, num_sm=num_sm, arch=90, record_all=True,
                                   build=self.build)
        self.last_md = None
        self.last_pre = None
        #: (step, dp_rank) the driver is at (set by Engine._run_steps), and id(precompute) -> (its record, where)
        self.where = (0, 0)
        #: the metadata-lifecycle checks of every launch (and the seeded defect of the driven sequence, if any)
        self.judge = LifecycleJudge(lifecycle_defect)
        self.made_at: dict = self.judge.made_at
        #: a graph replay's real rows (set by RankBackend; the rest of the graph batch are padding rows)
        self.real_rows: Optional[int] = None
        self.capturing = False
        self.captured: list = []
        #: "eager" | "capture" | "replay": the path of the calls being made now (set by RankBackend)
        self.path = "eager"
        self.tags: list = []
        #: numerics: real rows whose output had NaN, per call (RankBackend)
        self.nan_rows: list = []
        #: where the engine's code made each side (:func:`caller_location`): per call, as ``tags``; per precompute
        #: record (by id, the record kept alive beside it); per captured call, as ``captured``
        self.call_sources: list = []
        self.pre_sources: dict = {}
        self.captured_sources: list = []

    def _attribute(self, md) -> None:
        import torch

        if md is None or self.last_md is None or self.checker.origin_of(md) is self.last_pre:
            return
        if isinstance(md, torch.Tensor) and md.shape == self.last_md.shape and torch.equal(md, self.last_md):
            self.checker.registry.remember(md, self.last_pre)

    def get_scheduler_metadata(self, *args, **kwargs):
        if (self.judge.defect == "precompute-over-real-rows" and self.path == "replay" and not args
                and self.real_rows is not None and self.real_rows < int(kwargs.get("batch_size", 0))):
            kwargs = _over_real_rows(kwargs, self.real_rows)
        md = self.checker.get_scheduler_metadata(*args, **kwargs)
        self.last_md, self.last_pre = md.clone(), self.checker.origin_of(md)
        self.judge.note_precompute(self.last_pre, self.where)
        if self.last_pre is not None:
            self.pre_sources[id(self.last_pre)] = (self.last_pre, caller_location("get_scheduler_metadata"))
        return md

    def flash_attn_with_kvcache(self, *args, **kwargs):
        from gpu_impl.fa3_calls import bind_call

        if self.capturing and self.judge.defect == "capture-width-of-capture-batch" and "page_table" in kwargs:
            kwargs = _capture_batch_width(kwargs)
        md = bind_call(*args, **kwargs)["scheduler_metadata"]
        self._attribute(md)
        where = caller_location("flash_attn_with_kvcache")
        if self.capturing:
            self.captured.append((args, kwargs))
            self.captured_sources.append(where)
        self.tags.append(self.path)
        self.call_sources.append(where)
        events = len(self.checker.events)
        out = self.checker.flash_attn_with_kvcache(*args, **kwargs)
        if len(self.checker.events) > events:
            self._judge_launch(-1, md, "capture" if self.capturing else self.path)
        return out

    def _judge_launch(self, index: int, md, path: str) -> None:
        """The lifecycle checks of the launch whose checker event is ``events[index]``, added to its violations;
        then what the launch leaves in the metadata's semaphore slot."""
        pre, call, violations = self.checker.events[index]
        found = self.judge.before(pre, call, md, self.where, path, violations)
        if found:
            self.checker.events[index] = (pre, call, list(violations) + found)
        self.judge.after(call, md, path)

    def flash_attn_varlen_func(self, *args, **kwargs):
        return self.checker.flash_attn_varlen_func(*args, **kwargs)

    def replay(self, args, kwargs) -> None:
        """The captured call replayed: its tensors as they are now, its shapes and scalars as captured."""
        from gpu_impl.fa3_calls import bind_call, record_call

        md = bind_call(*args, **kwargs)["scheduler_metadata"]
        self._attribute(md)
        call = record_call(*args, num_sm=self.checker.num_sm, arch=90, read_tensors=True, build=self.build, **kwargs)
        if md is None:
            pre, violations = None, []
        else:
            pre, violations = self.checker.check(call, md)
        self.checker.events.append((pre, call, violations))
        if md is not None:
            self._judge_launch(-1, md, "replay")
        self.tags.append("replay")
        at = next((i for i, (a, _) in enumerate(self.captured) if a is args), None)
        self.call_sources.append(self.captured_sources[at] if at is not None and at < len(self.captured_sources)
                                 else None)

    def source_of(self, pre) -> Optional[str]:
        """Where the engine's code made the precompute ``pre`` (None when unknown)."""
        kept = self.pre_sources.get(id(pre)) if pre is not None else None
        return kept[1] if kept is not None and kept[0] is pre else None

    def drain(self) -> list:
        """(precompute, call, violations, path) of every call since the last drain; where each side was made
        comes with :meth:`drain_sources` (call it right after)."""
        events, self.checker.events = self.checker.events, []
        tags, self.tags = self.tags, []
        if len(tags) != len(events):
            raise RuntimeError(f"engine driver: {len(events)} FA3 events but {len(tags)} calls seen")
        sources, self.call_sources = self.call_sources, []
        sources = (sources + [None] * len(events))[:len(events)]
        self._drained_sources = [{"precompute": self.source_of(ev[0]), "call": src}
                                 for ev, src in zip(events, sources)]
        return [(*ev, tag) for ev, tag in zip(events, tags)]

    def drain_sources(self) -> list:
        """{"precompute", "call"} source locations of the events the last :meth:`drain` returned, in order."""
        return getattr(self, "_drained_sources", [])




class SanitizedFront:
    """Mode "emulator": what the fake ``sgl_kernel.flash_attn`` routes to -- :class:`EmulatorFA3`, checking nothing.

    Keeps the CUDA-graph bookkeeping :class:`RankBackend` drives (``capturing``, ``captured``, ``path``) and the
    emulator's own plan of every call for the trace. A replay runs no Python on a GPU, so none of the entry
    points is called then: :meth:`replay` plans the captured call on the emulator directly (a checker wrapping
    the entry points sees only the recompute written into the graph's metadata buffer, as on a GPU).
    """

    def __init__(self, num_sm: int, numerics: bool):
        from gpu_impl.engines.emulator_fa3 import EmulatorFA3

        self.impl = EmulatorFA3(num_sm, numerics=numerics)
        self.capturing = False
        self.captured: list = []
        self.path = "eager"
        self.where = (0, 0)
        self.nan_rows: list = []
        self._paths: list = []

    def get_scheduler_metadata(self, *args, **kwargs):
        return self.impl.get_scheduler_metadata(*args, **kwargs)

    def flash_attn_with_kvcache(self, *args, **kwargs):
        if self.capturing:
            self.captured.append((args, kwargs))
        self._paths.append(self.path)
        from gpu_impl.fa3_calls import bind_call

        a = bind_call(*args, **kwargs)
        q, kc, vc = a.pop("q"), a.pop("k_cache"), a.pop("v_cache")
        return self.impl.flash_attn_with_kvcache(q, kc, vc, **a)

    def flash_attn_varlen_func(self, *args, **kwargs):
        return self.impl.flash_attn_varlen_func(*args, **kwargs)

    def replay(self, args, kwargs) -> None:
        """The captured call replayed with its tensors as they are now (no wrapped entry point runs)."""
        self.flash_attn_with_kvcache(*args, **kwargs)
        self._paths[-1] = "replay"

    def drain(self) -> list:
        plans, self.impl.plans = self.impl.plans, []
        paths, self._paths = self._paths, []
        return [{"path": p, **plan} for p, plan in zip(paths, plans)]


class Engine:
    """One imported sglang (release or checkout): builds backends per attention rank and runs scenarios."""

    #: the requests ``protocol.serve`` dispatches to methods (besides hello and quit)
    OPS = ("run", "validate")

    def __init__(self, release: str, fa3: str = "checking"):
        if fa3 not in FA3_MODES:
            raise ValueError(f"fa3: must be one of {', '.join(FA3_MODES)}, got {fa3!r}")
        self.fa3 = fa3
        t = time.monotonic()
        import torch

        torch.set_num_threads(1)
        from gpu_impl.engines.sglang import glue as sglang_glue

        with _quiet():
            import sglang
            from sglang.srt.layers.attention import flashattention_backend as fb

            self.kit = sglang_glue.kit_modules(release)
        self.glue = sglang_glue
        self.release = release
        self.sglang = sglang
        self.fb = fb
        self.patched = sglang_glue.patch_for_cpu(fb)
        self.import_s = time.monotonic() - t
        self.front = None
        self.layers, self.lifecycle_defect = 1, None

    def fa3_build(self) -> str:
        """The FA3 build this worker judges under: ``FA3VERIFY_FA3_BUILD`` (set by ``gpu_impl.engines.sglang`` from
        ``EnginePlugin.fa3_build``, so the run is judged under the build its reports name), else upstream's."""
        from refmodel.fa3_builds import UPSTREAM, check_build_name

        name = os.environ.get("FA3VERIFY_FA3_BUILD")
        return check_build_name(name) if name else UPSTREAM

    def hello(self) -> dict:
        return {"release": self.release, "version": getattr(self.sglang, "__version__", None),
                "path": os.path.dirname(self.sglang.__file__), "import_s": round(self.import_s, 2),
                "kit": "stand-in" if self.kit["standin"] else "sglang.test.kits.attention_unittest",
                "patched": self.patched, "fa3": self.fa3}

    def is_capturing(self) -> bool:
        """Whether a CUDA-graph capture is being driven now (the CPU stand-in for the stream's capture state)."""
        return bool(self.front is not None and self.front.capturing)

    # -- one scenario -------------------------------------------------------------------------------------
    def run(self, scenario: dict, numerics: bool = False, layers: int = 1, lifecycle_defect: Optional[str] = None) -> dict:
        """One scenario on the release's backend. ``layers``: attention layers per step (1..8), each a
        ``RadixAttention`` over the same precompute (the metadata's reuse across layers); ``lifecycle_defect``: a
        seeded defect of the driven sequence (``lifecycle_judge.ENGINE_DEFECTS``), the negative control of a
        lifecycle check."""
        from gpu_impl.engines.lifecycle_judge import check_engine_defect
        from gpu_impl.engines.protocol import scenario_from_wire

        if not isinstance(layers, int) or isinstance(layers, bool) or not 1 <= layers <= 8:
            raise ValueError(f"layers: an integer in 1..8, got {layers!r}")
        check_engine_defect(lifecycle_defect)
        if lifecycle_defect is not None and self.fa3 == "emulator":
            raise ValueError("lifecycle_defect: seeded through the checking FA3 only, not in emulator mode")
        self.layers, self.lifecycle_defect = layers, lifecycle_defect
        server, model, steps, seed = scenario_from_wire(scenario)
        if model.is_mla:
            raise Unsupported("MLA models: sglang computes no FA3 scheduler metadata for them; not driven")
        if model.dtype not in ("bfloat16", "float16"):
            raise Unsupported(f"model.dtype {model.dtype!r}: the engine driver runs bf16/fp16 KV caches only")
        if self.fa3 == "emulator":
            self.front = SanitizedFront(server.num_sm, numerics)
        else:
            self.front = EngineFA3(server.num_sm, numerics, build=self.fa3_build(), lifecycle_defect=lifecycle_defect)
        import importlib

        importlib.import_module("sgl_kernel.flash_attn").install(self.front)
        out = {"findings": [], "shape_errors": [], "trace": [], "notes": [],
               "fa3_build": getattr(self.front, "build", "upstream-0251105a")}
        ranks: dict = {}
        from refmodel.errors import FA3Rejected

        try:
            self._run_steps(server, model, steps, seed, numerics, ranks, out)
        except self._mismatch_class() as exc:
            self._mismatch(out, exc)
        except FA3Rejected as exc:
            self._rejected(out, exc)
        return out

    def _rejected(self, out: dict, exc) -> None:
        """FA3 refused what sglang's code passed (a ``TORCH_CHECK`` of ``hopper/flash_api.cpp``, e.g. precompute
        heads that do not divide): the request stops there, loudly (as a server's would); a loud error, not a
        silent out-of-bounds read. The FA3 events of the step and rank it stopped are not collected."""
        step, dp_rank = getattr(self.front, "where", (None, None))
        path = getattr(self.front, "path", None)
        out["trace"].append({"step": step, "dp_rank": dp_rank, "mode": "decode", "path": path,
                             "raised": "FA3Rejected", "message": str(exc)})
        out["shape_errors"].append({"invariant": "FA3_REJECTED", "step": step, "dp_rank": dp_rank,
                                    "message": f"FA3 rejects what the backend passed: {exc}",
                                    "detail": {"source": "fa3", "path": path}})

    def _run_steps(self, server, model, steps, seed, numerics, ranks, out) -> None:
        from gpu_impl.scenario import distribute_over_dp

        for index, step in enumerate(steps):
            if step.mode in ("extend", "mixed"):
                out["trace"].append({"step": index, "mode": step.mode, "dp_rank": None, "engine": "not run",
                                     "note": "extend/mixed steps are not driven on the engine"})
                continue
            seqs = step.seq_lens if step.mode == "decode" else []
            shares = distribute_over_dp(seqs, server.attn_dp_size)
            graph_bs = self._graph_bs(shares) if server.cuda_graph else 0
            for dp_rank, rows in enumerate(shares):
                if not server.cuda_graph and not rows:
                    continue  # an idle eager rank makes no FA3 call
                rank = ranks.get(dp_rank)
                if rank is None:
                    rank = ranks[dp_rank] = RankBackend(self, server, model, dp_rank, steps, numerics, seed)
                self.front.where = (index, dp_rank)
                with rank.layout():
                    if server.cuda_graph:
                        rank.graph_decode(graph_bs, rows)
                    else:
                        rank.eager_decode(rows)
                self._collect(out, index, dp_rank, rows, idle=server.attn_dp_size > 1 and not rows)

    def _mismatch_class(self):
        if self.fa3 != "emulator":
            return ()   # the checking shim records (mode "record"); nothing is raised through sglang
        from gpu_impl.fa3_calls import MetadataMismatch

        return MetadataMismatch

    def _mismatch(self, out: dict, exc) -> None:
        """A MetadataMismatch raised by a checker wrapping FA3 from outside: the request stops there (as a
        server's would), and the mismatch is the scenario's finding."""
        from gpu_impl.fa3_calls import pair_summary

        step, dp_rank = self.front.where
        summary = pair_summary(exc.precompute, exc.call) if exc.call is not None else {}
        self._collect(out, step, dp_rank, [])
        out["trace"].append({"step": step, "dp_rank": dp_rank, "mode": "decode", "path": self.front.path,
                             "metadata_passed": True, "raised": type(exc).__name__, **summary})
        first = exc.violations[0]
        detail = {"source": "sanitizer", "path": self.front.path, "s_p": summary.get("s_p"),
                  "s_c": summary.get("s_c"), "case_path": exc.case_path,
                  "violations": [v.to_dict() for v in exc.violations], "precompute": summary.get("precompute"),
                  "call": summary.get("call")}
        finding = {"invariant": first.invariant, "step": step, "dp_rank": dp_rank, "message": str(exc),
                   "detail": detail}
        (out["shape_errors"] if first.invariant == "SHAPE" else out["findings"]).append(finding)

    @staticmethod
    def _graph_bs(shares) -> int:
        from gpu_impl.backend import cuda_graph_batch_size

        return cuda_graph_batch_size(max((len(r) for r in shares), default=0) or 1)

    def _collect(self, out: dict, index: int, dp_rank: int, rows, idle: bool = False) -> None:
        """Trace entries and findings of this step and rank's FA3 events; ``idle``: an idle DP-attention rank
        (DP attention on, no real rows: it replays its graph with padding rows)."""
        from gpu_impl.fa3_calls import pair_summary

        self._collect_nan(out, index, dp_rank)
        if isinstance(self.front, SanitizedFront):
            for plan in self.front.drain():
                out["trace"].append({"step": index, "dp_rank": dp_rank, "mode": "decode", **plan})
            return
        drained = self.front.drain()
        sources = self.front.drain_sources()
        for i, (pre, call, violations, ev_path) in enumerate(drained):
            summary = pair_summary(pre, call)
            entry = {"step": index, "dp_rank": dp_rank, "mode": "decode", "path": ev_path, "idle": idle,
                     **summary}
            if i < len(sources) and any(sources[i].values()):
                entry["source"] = sources[i]
            out["trace"].append(entry)
            lens = list(call.cache_seqlens) if call.cache_seqlens is not None else list(rows)
            detail = {"mode": "decode", "path": ev_path, "s_p": summary["s_p"], "s_c": summary["s_c"],
                      "seq_lens": lens, "split_counts": _split_counts(pre)}
            for v in violations:
                d = v.to_dict() if hasattr(v, "to_dict") else {"invariant": v.invariant, "message": str(v)}
                finding = {"invariant": d.get("invariant", v.invariant), "step": index, "dp_rank": dp_rank,
                           "message": d.get("message", str(v)), "detail": {**detail, **d}}
                (out["shape_errors"] if finding["invariant"] == "SHAPE" else out["findings"]).append(finding)

    def _collect_nan(self, out: dict, index: int, dp_rank: int) -> None:
        """NO_NAN: a real row whose output had NaN in this step's calls on this rank (numerics only; the rows
        ``RankBackend._note_output`` saw), one finding a step and rank (``gpu_impl.oracle_check.engine_nan_finding``)."""
        from gpu_impl.oracle_check import engine_nan_finding

        bad = sorted({int(r) for rows in self.front.nan_rows for r in rows})
        self.front.nan_rows.clear()
        if bad:
            f = engine_nan_finding(bad)
            out["findings"].append({"invariant": f.invariant, "step": index, "dp_rank": dp_rank, "message": f.message,
                                    "detail": {"mode": "decode", **f.detail, "source": "numerics"}})

    # -- configurations the release accepts ----------------------------------------------------------------
    def validate(self, server: dict, model: dict = None) -> dict:
        from gpu_impl.engines.sglang.validation import validate_server_args

        return validate_server_args(self, server, model)


def _over_real_rows(kwargs: dict, rows: int) -> dict:
    """Seeded defect ``precompute-over-real-rows``: the recompute's keyword arguments cut to the real rows."""
    out = dict(kwargs, batch_size=rows)
    if out.get("cache_seqlens") is not None:
        out["cache_seqlens"] = out["cache_seqlens"][:rows]
    if out.get("cu_seqlens_q") is not None:
        out["cu_seqlens_q"] = out["cu_seqlens_q"][:rows + 1]
    return out


def _capture_batch_width(kwargs: dict) -> dict:
    """Seeded defect ``capture-width-of-capture-batch``: the captured call's page table cut to the pages the
    capture batch's own longest sequence needs."""
    table, lens = kwargs["page_table"], kwargs.get("cache_seqlens")
    page = int(kwargs["k_cache"].shape[1]) if kwargs.get("k_cache") is not None else 1
    longest = int(lens.max()) if lens is not None and lens.numel() else 1
    return dict(kwargs, page_table=table[:, :max(1, -(-longest // page))])


def _split_counts(pre):
    if pre is None:
        return None
    from refmodel.metadata import schedule_and_prepare

    try:
        _, res = schedule_and_prepare(**pre.scheduler_kwargs())
    except Exception:  # noqa: BLE001 - a precompute the model cannot prepare has no split counts to show
        return None
    return [int(x) for x in res.num_splits]


def make_engine(fa3: str = "checking") -> Engine:
    """The engine of the release this worker was started for (``FA3VERIFY_ENGINE_RELEASE``)."""
    return Engine(os.environ.get("FA3VERIFY_ENGINE_RELEASE", "unknown"), fa3=fa3)


def run_worker(stdin=None, stdout=None, fa3: str = "checking", observer=None) -> int:
    """The worker loop (:func:`protocol.serve`) over this release's engine in FA3 mode ``fa3``.

    ``fa3``: "checking" (the recording shim) or "emulator" (plain FA3 stand-ins, for a checker installed from
    outside). ``observer``: an object with ``engine_started(engine)`` and ``status() -> dict``; its status is sent
    as ``observer`` on the hello and on every answer.
    """
    return protocol.serve(lambda: make_engine(fa3), stdin or sys.stdin, stdout or _PROTOCOL_OUT, observer=observer)


if __name__ == "__main__":
    sys.stdout = sys.stderr  # nothing but responses on the protocol stream
    protocol.exit_worker(run_worker(stdin=sys.stdin, stdout=_PROTOCOL_OUT))  # no interpreter teardown after the bye
