"""CUDA-graph capture and replay the way the V1 model runner (``vllm/v1/worker/gpu_model_runner.py``, vLLM 0.10.1 ..
0.33.0) does them, for the first driver generation (``driver.Config``).

Invariant: what decides a step is the release's code. The capture sizes are the ones the release's
``VllmConfig._set_cudagraph_sizes`` resolves from the scenario's sizes and the scheduler's limits; the release's
``CudagraphDispatcher`` (``vllm/v1/cudagraph_dispatcher.py``, keys from ``initialize_cudagraph_keys``) decides each
batch's runtime mode (FULL, PIECEWISE or none) and padded token count (releases whose dispatcher takes a finished
descriptor, 0.10.1 .. 0.11.2, get the count from ``VllmConfig.pad_for_cudagraph`` first, as their runner does); the
padded request count is the descriptor's ``num_reqs`` where the release's ``BatchDescriptor`` has one (0.12.0 on:
``pad_attn``, the attention metadata covers the padded rows), else the real count (0.10.1 .. 0.11.2 build the
metadata over the real rows only, while the graph launches the capture batch). A FULL graph is captured the first time
a batch dispatches to its descriptor, with the dummy batch ``_dummy_run`` builds for it (``graphs.json``: its
seq_lens by release) and the release's own ``build_for_cudagraph_capture`` (``max_seq_len`` = ``max_model_len``); the
layers' calls at capture are recorded, and every replay re-issues them on the persistent buffers as the replay's
``build`` left them (the runner's ``query_start_loc``, ``seq_lens`` and block table, and the builder's persistent
``scheduler_metadata``, which ``_store_scheduler_metadata`` copies into and zeroes past the recompute). Batches the
dispatcher gives no graph run eagerly.

Stood in (runner code, which needs CUDA to construct): the runner's persistent input buffers and their fill
(``query_start_loc`` with the rows past the batch at the token count, ``seq_lens`` with padded rows 0, a zero block
table as wide as the runner's), the capture's dummy batch (``_dummy_run``'s request split), the runner's
``_check_and_update_cudagraph_mode`` (a FULL mode is driven only where the builder's ``cudagraph_support`` is
``ALWAYS``; otherwise the scenario is refused with the support named). Left out: the warm-up runs before each capture
(``cudagraph_num_of_warmups`` eager dummy runs), and graphs are captured on first use, not all at start-up: a
capture on first use leaves the builders' persistent scheduler-metadata buffers as the previous step's build left them
(:func:`capture_keeps_persistent_metadata`), since under vLLM that capture ran before the first step; so a replay
whose build writes no metadata (DCP's skipped context attention, 0.26.0 on) reads the previous step's, as in vLLM,
and every other replay reads its own build's (which rewrites the part of the buffer the graph reads).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import types
from pathlib import Path

from gpu_impl.engines.protocol import Unsupported

__all__ = ["V1Graphs", "resolve_capture_sizes", "STOOD_IN_V1", "capture_seq_len_rule", "capture_metadata_rule",
           "capture_keeps_persistent_metadata"]

#: What the first generation's capture and replay stand in for (reported in the driver's hello).
STOOD_IN_V1 = (
    "the V1 runner's persistent input buffers and their fill (query_start_loc: rows past the batch at the token "
    "count; seq_lens: padded rows 0; a zero block table as wide as the runner's)",
    "the capture's dummy batch (_dummy_run: its request split and seq_lens by release, graphs.json)",
    "the capture's metadata per layer where a KV-cache group has several attention groups (_dummy_run: each group's "
    "own layers, or every layer of the KV-cache group the last group's on 0.10.1 .. 0.10.2; graphs.json "
    "capture_metadata_layers)",
    "the runner's _check_and_update_cudagraph_mode (FULL modes only where the builder's cudagraph_support is ALWAYS)",
)

RULES_PATH = Path(__file__).with_name("graphs.json")


@functools.lru_cache(maxsize=1)
def _rules() -> dict:
    return json.loads(RULES_PATH.read_text())


def capture_seq_len_rule(release) -> str:
    """'max_model_len' or 'max_query_len': the seq_lens of a capture batch in ``release`` (graphs.json)."""
    rule = _rules()["capture_seq_lens"]
    return "max_model_len" if release in rule["max_model_len"] else rule["default"]


def capture_metadata_rule(release) -> str:
    """'kv_cache_group' or 'attention_group': which layers get an attention group's capture metadata in
    ``release``'s ``_dummy_run`` (graphs.json ``capture_metadata_layers``)."""
    rule = _rules()["capture_metadata_layers"]
    return "kv_cache_group" if release in rule["kv_cache_group"] else rule["default"]


def resolve_capture_sizes(vc, s: dict) -> list:
    """The capture sizes as the release resolves them (``VllmConfig._set_cudagraph_sizes``) from the scenario's sizes,
    ``max_num_seqs`` and ``max_num_batched_tokens``; the mode is the scenario's (set on ``vc`` by the caller)."""
    cc = vc.compilation_config
    cc.cudagraph_capture_sizes = list(s["capture_sizes"])
    vc.scheduler_config.max_num_batched_tokens = s["max_num_batched_tokens"]
    if hasattr(cc, "max_cudagraph_capture_size"):
        cc.max_cudagraph_capture_size = None
    try:
        vc._set_cudagraph_sizes()
    except (AttributeError, AssertionError, TypeError, ValueError) as exc:
        raise Unsupported(f"capture_sizes: vLLM's VllmConfig._set_cudagraph_sizes refuses {s['capture_sizes']}: "
                          f"{type(exc).__name__}: {exc}") from exc
    sizes = sorted(cc.cudagraph_capture_sizes or [])
    if not sizes:
        raise Unsupported(f"capture_sizes: vLLM resolved {s['capture_sizes']} to no size to capture "
                          f"(max_num_batched_tokens {s['max_num_batched_tokens']})")
    for name in ("max_cudagraph_capture_size", "max_capture_size"):
        if hasattr(cc, name) and getattr(cc, name) is None:
            setattr(cc, name, sizes[-1])
    return sizes


def _piecewise_compilation(vc) -> None:
    """What a piecewise CUDA-graph mode needs of the compilation config, as the release sets it for a default
    configuration: compilation mode (level, up to 0.10.x) VLLM_COMPILE (3) and the release's own
    ``set_splitting_ops_for_v1`` (attention split out of the captured pieces). Releases up to 0.11.x assert it in
    ``CudagraphDispatcher.__init__``."""
    import vllm.config.compilation as comp

    cc = vc.compilation_config
    enum = getattr(comp, "CompilationMode", None) or getattr(comp, "CompilationLevel", None)
    value = getattr(enum, "VLLM_COMPILE", None) or getattr(enum, "PIECEWISE", 3)
    for name in ("mode", "level"):
        if hasattr(cc, name):
            setattr(cc, name, value)
    if not cc.splitting_ops:
        params = inspect.signature(cc.set_splitting_ops_for_v1).parameters
        given = {"all2all_backend": getattr(vc.parallel_config, "all2all_backend", "naive"), "data_parallel_size": 1}
        cc.set_splitting_ops_for_v1(**{k: v for k, v in given.items() if k in params})


def _metadata_buffers(builders) -> list:
    """The persistent scheduler-metadata buffers (``FlashAttentionMetadataBuilder.scheduler_metadata``, allocated
    under a FULL CUDA-graph mode) of ``builders``, a ``GroupedBuilder``'s groups included."""
    import torch

    out = []
    for b in builders:
        inner = [g[0] for g in getattr(b, "groups", None) or ()] or [b]
        for builder in inner:
            buf = getattr(builder, "scheduler_metadata", None)
            if isinstance(buf, torch.Tensor) and all(buf is not seen for seen in out):
                out.append(buf)
    return out


@contextlib.contextmanager
def capture_keeps_persistent_metadata(builders, front):
    """Around a FULL graph's capture on first use: afterwards the builders' persistent scheduler-metadata buffers,
    and the FA3 front's record of the latest precompute (what a replay's metadata is attributed to), are as the
    previous step's build left them. vLLM captures every graph at start-up (``capture_model``), so at a step the
    buffer holds the previous build's metadata, not a capture's; a replay whose build writes none (DCP's skipped
    context attention) reads that. Before any step has built metadata the capture's stays, as the last start-up
    capture's does in vLLM (which graph that is, is not imitated)."""
    buffers = _metadata_buffers(builders)
    kept = [b.clone() for b in buffers]
    fields = ("last_md", "last_pre", "recent", "handed_out")
    state = {f: getattr(front, f) for f in fields}
    yield
    if state["last_md"] is None:
        return
    for buf, old in zip(buffers, kept):
        buf.copy_(old)
    for f, v in state.items():
        setattr(front, f, v)


def _cumsum(xs) -> list:
    out, t = [0], 0
    for x in xs:
        t += x
        out.append(t)
    return out


class V1Graphs:
    """One scenario's CUDA graphs under the V1 runner: dispatch, capture on first use, replay (module doc)."""

    def __init__(self, cfg, release):
        import torch
        from vllm.config.compilation import CUDAGraphMode
        from vllm.forward_context import BatchDescriptor
        from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

        self.cfg, self.release = cfg, release
        s, vc = cfg.s, cfg.vc
        self.mode = vc.compilation_config.cudagraph_mode
        self.sizes = sorted(vc.compilation_config.cudagraph_capture_sizes)
        if self.mode.has_full_cudagraphs():
            support = self._support()
            if support is not None and support.name != "ALWAYS":
                raise Unsupported(f"cuda_graph: {s['cuda_graph']}: the release's FlashAttention builder declares "
                                  f"cudagraph_support {support.name}; its runner would change the mode "
                                  "(_check_and_update_cudagraph_mode), which this driver does not imitate")
        self.desc_fields = {f for f in getattr(BatchDescriptor, "__dataclass_fields__", {})} or set(
            getattr(BatchDescriptor, "_fields", ()))
        #: 0.12.0 on: the attention metadata of a FULL replay covers the padded rows (``pad_attn``)
        self.pads_rows = "num_reqs" in self.desc_fields
        self.uniform_field = "uniform" if "uniform" in self.desc_fields else "uniform_decode"
        if self.mode.requires_piecewise_compilation():
            _piecewise_compilation(vc)
        try:
            self.dispatcher = CudagraphDispatcher(vc)
        except AssertionError as exc:   # the release's own check of the compilation config for this mode
            raise Unsupported(f"cuda_graph: {s['cuda_graph']}: vLLM's CudagraphDispatcher refuses the compilation "
                              f"config: {exc}") from exc
        self.dispatcher.initialize_cudagraph_keys(self.mode, 1)
        self.takes_descriptor = "batch_descriptor" in inspect.signature(self.dispatcher.dispatch).parameters
        rows = max(s["max_num_seqs"], self.sizes[-1])
        self.query_start_loc = torch.zeros(rows + 1, dtype=torch.int32)
        self.seq_lens = torch.zeros(rows, dtype=torch.int32)
        self.table = torch.zeros(rows, cfg.max_blocks, dtype=torch.int32)
        self.full = CUDAGraphMode.FULL
        self.piecewise = CUDAGraphMode.PIECEWISE
        #: descriptor -> the layers' calls at its capture
        self.captured: dict = {}

    def _support(self):
        builder = type(self.cfg.builder)
        get = getattr(builder, "get_cudagraph_support", None)
        if get is not None:
            try:
                return get(self.cfg.vc, self.cfg.spec)
            except TypeError:
                pass
        return getattr(builder, "cudagraph_support", None) or getattr(builder, "_cudagraph_support", None)

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, query_lens):
        """(runtime mode, descriptor or None, padded token count, padded request count) for a real batch, as the
        release's runner asks its dispatcher."""
        from vllm.forward_context import BatchDescriptor

        n, t = len(query_lens), sum(query_lens)
        uniform = max(query_lens) == 1  # uniform decode: every request one token (no speculative decoding)
        if self.takes_descriptor:  # 0.10.1 .. 0.11.2: the runner pads, then dispatches the finished descriptor
            padded = self.cfg.vc.pad_for_cudagraph(t) if t <= self.sizes[-1] else t
            mode, desc = self.dispatcher.dispatch(BatchDescriptor(num_tokens=padded, uniform_decode=uniform))
        else:
            params = inspect.signature(self.dispatcher.dispatch).parameters
            given = {"num_tokens": t, "uniform_decode": uniform, "has_lora": False}
            mode, desc = self.dispatcher.dispatch(**{k: v for k, v in given.items() if k in params})
        if desc is None or mode.name == "NONE":
            return mode, None, t, n
        reqs = getattr(desc, "num_reqs", None)
        return mode, desc, desc.num_tokens, (reqs if reqs is not None else n)

    # ------------------------------------------------------------------ buffers and builds
    def _fill(self, query_lens, seq_lens) -> None:
        """The runner's persistent inputs for a batch: query starts (rows past it at the token count), seq_lens
        (rows past it 0), the block table's rows (zero: one KV block, see the driver's module doc)."""
        import torch

        n = len(query_lens)
        qsl = _cumsum(query_lens)
        self.query_start_loc[:n + 1] = torch.tensor(qsl, dtype=torch.int32)
        self.query_start_loc[n + 1:] = qsl[-1]
        self.seq_lens.zero_()
        self.seq_lens[:n] = torch.tensor(seq_lens, dtype=torch.int32)
        self.table.zero_()

    def _common(self, rows: int, num_tokens: int, query_lens, max_query_len: int, max_seq_len: int):
        """vLLM's CommonAttentionMetadata over the first ``rows`` rows of the persistent buffers (``max_query_len``
        and ``max_seq_len`` as the runner passes them: the batch's own, or the capture's)."""
        import dataclasses

        import torch
        from gpu_impl.engines.vllm.recipes import locate

        CommonAttentionMetadata = locate("CommonAttentionMetadata")  # noqa: N806 - vLLM's class
        qsl = self.query_start_loc[:rows + 1]
        lens = self.seq_lens[:rows]
        q = list(query_lens) + [0] * (rows - len(query_lens))
        given = dict(query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=lens, num_reqs=rows,
                     num_actual_tokens=num_tokens, max_query_len=max_query_len, max_seq_len=max_seq_len,
                     block_table_tensor=self.table[:rows], slot_mapping=torch.zeros(num_tokens, dtype=torch.int64),
                     causal=True, seq_lens_cpu=lens.clone(), seq_lens_cpu_upper_bound=lens.clone(),
                     num_computed_tokens_cpu=lens.clone() - torch.tensor(q, dtype=torch.int32))
        fields = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
        return CommonAttentionMetadata(**{k: v for k, v in given.items() if k in fields})

    def _capture_batch(self, desc):
        """The dummy batch ``_dummy_run`` captures ``desc`` with: (query_lens, seq_lens, max_query_len) -- a
        non-uniform capture's ``max_query_len`` is its token count (``max_query_len = self.uniform_decode_query_len
        if uniform_decode else num_tokens``)."""
        s = self.cfg.s
        tokens = desc.num_tokens
        uniform = bool(getattr(desc, self.uniform_field, False))
        if uniform:
            reqs = min(s["max_num_seqs"], tokens)
            q = [1] * reqs
            max_q = 1
        else:
            reqs = min(tokens, s["max_num_seqs"])
            q = [tokens // reqs] * reqs
            q[-1] += tokens % reqs
            max_q = tokens
        if capture_seq_len_rule(self.release) == "max_model_len":
            length = s["max_model_len"]
        else:
            length = max_q + self._dcp_dummy_context(uniform)
        return q, [max(length, x) for x in q], max_q

    def _dcp_dummy_context(self, uniform: bool) -> int:
        try:
            from vllm.v1.worker.cp_utils import get_dcp_dummy_context_len
        except ImportError:
            return 0
        return get_dcp_dummy_context_len(self.cfg.s["dcp"], self.cfg.vc.parallel_config.cp_kv_cache_interleave_size,
                                         True, False, True, uniform)

    def _capture(self, desc, front) -> list:
        """Capture ``desc``'s FULL graph: the dummy batch, the release's ``build_for_cudagraph_capture``, the layers'
        forward; the calls they made, as the graph will launch them."""
        from vllm.config import set_current_vllm_config

        q, k, max_q = self._capture_batch(desc)
        self._fill(q, k)
        cam = self._common(len(q), desc.num_tokens, q, max_q, self.cfg.s["max_model_len"])
        with set_current_vllm_config(self.cfg.vc):
            md = self.cfg.builder.build_for_cudagraph_capture(cam)
            if self.cfg.local is not None:  # every attention group, the chunked layers' wrapped builders too
                from gpu_impl.engines.vllm.local import capture_layer_metadata

                self.cfg.local_md = capture_layer_metadata(capture_metadata_rule(self.release), list(self.cfg.layers),
                                                           self.cfg.s["attention_chunk_size"] or [],
                                                           self.cfg.local.build_for_capture(cam))
        front.recording = []
        try:
            self.cfg.forward(md, desc.num_tokens)
        finally:
            calls, front.recording = front.recording, None
        return calls

    # ------------------------------------------------------------------ one step
    def step(self, query_lens, seq_lens, front):
        """One batch through the V1 runner's graph dispatch; (metadata, path label, descriptor summary)."""
        from gpu_impl.engines.vllm.driver_v2 import ABOVE_GRAPHS
        from vllm.config import set_current_vllm_config

        mode, desc, tokens, reqs = self.dispatch(query_lens)
        full = desc is not None and mode == self.full
        # each attention group's builder precomputes for the batch (the chunked groups' beside the global one): the
        # front matches a persistent buffer's bytes to the step's precomputes of all of them
        front.metadata_groups = 1 + (len(self.cfg.local.groups) if self.cfg.local is not None else 0)
        if full and desc not in self.captured:
            with capture_keeps_persistent_metadata([self.cfg.builder], front):
                self.captured[desc] = self._capture(desc, front)
            front.capture_events.extend(front.drain())
        self._fill(query_lens, seq_lens)
        rows = reqs if full and self.pads_rows else len(query_lens)
        built_tokens = tokens if full and self.pads_rows else sum(query_lens)
        cam = self._common(rows, built_tokens, query_lens, max(query_lens), max(seq_lens))
        with set_current_vllm_config(self.cfg.vc):
            md = self.cfg.build(0, cam)  # the chunked local groups' metadata too (driver.Config.build)
        self.cfg.steps_built += 1
        summary = types.SimpleNamespace(num_tokens=tokens, num_reqs=reqs, max_query_len=max(query_lens),
                                        uniform_token_count=1 if max(query_lens) == 1 else None)
        if full:
            front.replay(self.captured[desc])
            return md, "full", summary
        self.cfg.forward(md, tokens if desc is not None else sum(query_lens))
        if desc is not None and mode == self.piecewise:
            return md, "piecewise", summary
        return md, ABOVE_GRAPHS if self.mode.name != "NONE" else "none", summary
