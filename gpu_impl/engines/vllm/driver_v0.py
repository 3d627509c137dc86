"""The vLLM driver's generation ``v0``: releases whose FlashAttention metadata builder reads the V1 model runner
object itself (vLLM 0.8.5 .. 0.9.2: ``__init__(runner)`` / ``__init__(runner, kv_cache_spec, block_table)``) or is
built from the config alone but still stepped by that runner (0.10.0: ``__init__(kv_cache_spec, vllm_config,
device)``), with the single-module configuration (``vllm/config.py``: no ``CUDAGraphMode``; a full CUDA graph is
``CompilationConfig.full_cuda_graph``, from 0.9.1).

Invariant: what decides a step is vLLM's code: the release's own ``FlashAttentionMetadataBuilder`` (constructed and
called with the parameters its own signature names: ``runner``, ``kv_cache_spec``, ``block_table``, ``vllm_config``,
``device``; ``build(num_reqs, num_actual_tokens, max_query_len, common_prefix_len[, common_attn_metadata])`` or
``build(common_prefix_len, common_attn_metadata[, fast_build])``), its ``FlashAttentionImpl.forward``, its
``BlockTable`` / ``MultiGroupBlockTable`` (the block-table width and the persistent slot mapping), its
``CommonAttentionMetadata`` where it has one (fields as the release defines them), and its capture-time
``build_for_cudagraph_capture`` where it has one. The runner object the builder reads is a stand-in holding the
runner's persistent arrays (``query_start_loc``, ``seq_lens`` and their CPU / numpy mirrors), filled as the
release's ``_prepare_inputs`` fills them (real rows, padded query starts = the token count, padded ``seq_lens`` 0).

A full CUDA graph is driven as those runners drive it (``gpu_model_runner.py`` of 0.9.1 .. 0.10.0): the attention
metadata is built for the real, unpadded batch (only the model's inputs are padded to the capture size); the graph
of a capture size N was captured by ``_dummy_run(N)``: ``min(N, max_num_seqs)`` requests of ``max_model_len``
tokens, ``max_query_len = N``, so the captured call carries those scalars (``max_seqlen_q`` N, ``max_seqlen_k``
``max_model_len``, the builder's split bound) and, at every replay, reads the persistent buffers as the replay's
build left them (query starts, ``seq_lens``, block table, the builder's scheduler-metadata buffer). A batch above
the largest capture size runs eagerly. Where the builder keeps a persistent metadata buffer of ``max_num_seqs + 1``
int32 (0.9.1 .. 0.10.0), that is the layout of the FA3 build the wheel ships (``vllm-fork-8798f277``: the semaphore
and b split counts, read from the wheels); the replay is judged under it. Judged under a build with another layout
(``FA3VERIFY_FA3_BUILD``), a full CUDA graph scenario stops with that reason (inconclusive) instead. The capture batch's query starts are written as its one-token requests
(the runner leaves whatever its persistent buffer held; nothing the captured call's scalars depend on).
"""

from __future__ import annotations

import inspect
import types

from gpu_impl.engines.protocol import Unsupported
from gpu_impl.engines.vllm.standins import ModelStandIn, cumsum
from gpu_impl.engines.vllm.layers import attention_layer, layer_heads
from gpu_impl.engines.vllm.driver_v2 import ABOVE_GRAPHS

__all__ = ["ConfigV0", "STOOD_IN", "MODES_V0"]

#: What this generation stands in for, besides ``vllm_glue.FAKED`` (reported in the driver's hello).
STOOD_IN = (
    "the V1 model runner object the builder reads (runner-bound releases): model_config, vllm_config, "
    "parallel_config, device, max_num_reqs, block_size, attention_chunk_size (the model's) and its persistent arrays "
    "query_start_loc / seq_lens (device, CPU and numpy views) and slot_mapping_cpu, filled as _prepare_inputs fills "
    "them; the runner's input batch holds the release's own BlockTable",
    "a full CUDA graph's capture batch (_dummy_run): its query starts are written as one-token requests",
)

#: The scenario's cuda_graph values this generation drives: ``full`` only where the release's CompilationConfig has
#: ``full_cuda_graph`` (0.9.1 on).
MODES_V0 = ("none", "piecewise", "full")


def _judging_build() -> str:
    """The FA3 build this driver judges under (gpu_impl.engines.vllm.front ``release_build``)."""
    from gpu_impl.engines.vllm.front import release_build

    return release_build()


def _semaphore_splits_layout() -> bool:
    """Whether that build lays the metadata out as the semaphore and b split counts (refmodel.fa3_builds), the
    layout of the FA3 vLLM 0.8.5 .. 0.10.0 ship (vllm-fork-8798f277) and of their max_num_seqs + 1 buffer."""
    from refmodel.fa3_builds import metadata_layout_kind

    return metadata_layout_kind(_judging_build()) == "semaphore-splits"

def _call(fn, given: dict):
    """``fn`` called with the parameters its own signature names, taken from ``given``."""
    params = {name: p for name, p in inspect.signature(fn).parameters.items() if name != "self"}
    missing = [name for name, p in params.items() if name not in given and p.default is inspect.Parameter.empty]
    if missing:
        raise Unsupported(f"{getattr(fn, '__qualname__', fn)}: parameter(s) {', '.join(missing)} not driven by "
                          f"generation v0")
    return fn(**{name: given[name] for name in params if name in given})


class _RunnerStandIn:
    """The V1 model runner's fields the runner-bound builder reads (see STOOD_IN)."""

    def __init__(self, vc, s: dict, block_table):
        import torch

        n, tokens = s["max_num_seqs"], max(s["max_num_batched_tokens"], max(s["capture_sizes"]))
        self.vllm_config, self.model_config = vc, vc.model_config
        self.parallel_config, self.scheduler_config = vc.parallel_config, vc.scheduler_config
        self.cache_config, self.compilation_config = vc.cache_config, vc.compilation_config
        self.device = torch.device("cpu")
        self.max_num_reqs, self.block_size, self.max_model_len = n, s["block_size"], s["max_model_len"]
        self.attention_chunk_size = None
        self.query_start_loc = torch.zeros(n + 1, dtype=torch.int32)
        self.query_start_loc_cpu = torch.zeros(n + 1, dtype=torch.int32)
        self.query_start_loc_np = self.query_start_loc_cpu.numpy()
        self.seq_lens = torch.zeros(n, dtype=torch.int32)
        self.seq_lens_cpu = torch.zeros(n, dtype=torch.int32)
        self.seq_lens_np = self.seq_lens_cpu.numpy()
        self.slot_mapping_cpu = torch.zeros(tokens, dtype=torch.int64)
        self.input_batch = types.SimpleNamespace(block_table=block_table)

    def fill(self, query_lens, seq_lens) -> None:
        """The runner's arrays for a batch, as ``_prepare_inputs`` writes them: query starts (padded entries = the
        token count), ``seq_lens`` (padded rows 0), device copies of both."""
        n = len(query_lens)
        self.query_start_loc_np[0] = 0
        self.query_start_loc_np[1:n + 1] = list(cumsum(query_lens))
        self.query_start_loc_np[n + 1:] = sum(query_lens)
        self.seq_lens_np[:n] = seq_lens
        self.seq_lens_np[n:] = 0
        self.query_start_loc.copy_(self.query_start_loc_cpu)
        self.seq_lens.copy_(self.seq_lens_cpu)


def _local_chunk(fa, s: dict):
    """The model's local-attention chunk size for a runner-bound builder (None: no chunked layer): the builder of
    0.8.5 .. 0.9.2 reads the runner's ``attention_chunk_size`` (one per model) and makes the local metadata itself;
    0.10.0's builder has no such branch (its runner makes the virtual batches for ChunkedLocalAttentionSpec groups,
    ``gpu_model_runner.py:769``), nor do layers of different chunk sizes exist there (refused). Under a full CUDA
    graph (0.9.1 .. 0.9.2) the builder's local tensors are new on every build, so a replay re-issues the captured
    local calls on the capture's tensors, as the graph reads them (judged: READS_OWN_STEP_METADATA). 0.10.0's full
    graph over chunked layers is driven: its ``_dummy_run`` builds the chunked group's capture metadata on the
    runner's persistent arrays without virtual batches, and a replay's local calls read the chunked group's own
    persistent metadata buffer, which the step's build over the virtual batches refills (``ConfigV0._metadata``)."""
    chunks = {c for c in (s["attention_chunk_size"] or ()) if c is not None}
    if not chunks:
        return None
    from gpu_impl.engines.vllm.paths import local_not_driven

    if "attention_chunk_size" not in inspect.getsource(fa.FlashAttentionMetadataBuilder.build) \
            and _runner_virtual_batches() is None:
        raise Unsupported("attention_chunk_size: " + local_not_driven("v0@0.10.0"))
    if len(chunks) > 1:
        raise Unsupported(f"attention_chunk_size: this release's runner has one chunk size per model "
                          f"(model_config.attention_chunk_size), got {sorted(chunks)}")
    return chunks.pop()


def _runner_virtual_batches():
    """The release's ``make_local_attention_virtual_batches`` where its runner applies it to a
    ``ChunkedLocalAttentionSpec`` group's CommonAttentionMetadata before the plain builder (0.10.0:
    ``gpu_model_runner.py:769``); None where the builder makes the local metadata itself (0.8.5 .. 0.9.2)."""
    try:
        from vllm.v1.attention.backends.utils import make_local_attention_virtual_batches as virtual
        from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec  # noqa: F401 - the group's spec
    except ImportError:
        return None
    return virtual if "common_attn_metadata" in inspect.signature(virtual).parameters else None


class ConfigV0:
    """One scenario's vLLM objects, stepped the way the runner of 0.8.5 .. 0.10.0 steps them (module doc)."""

    def __init__(self, engine, s: dict, numerics: bool = False):
        import os

        import torch
        from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config

        from gpu_impl.engines.vllm.recipes import locate

        release = getattr(engine.vllm, "__version__", "?")
        if numerics:
            raise Unsupported("numerics: not driven through generation v0 (record mode only)")
        if s["cuda_graph"] not in MODES_V0:
            raise Unsupported(f"cuda_graph: vLLM {release} has no {s['cuda_graph']!r} mode (generation v0 drives "
                              f"{', '.join(MODES_V0)})")
        if s["dcp"] > 1:
            raise Unsupported(f"dcp: vLLM {release} has no decode context parallelism")
        if s["head_dim_v"] not in (None, s["head_dim"]):
            raise Unsupported(f"head_dim_v: vLLM {release} has no backend whose V head size differs from K's")
        if s["kv_cache_dtype"] == "fp8":
            raise Unsupported(f"kv_cache_dtype: fp8 in vLLM {release}'s impl quantizes the query with the compiled "
                              f"_C op scaled_fp8_quant (CUDA), not faked")
        full_field = "full_cuda_graph" in inspect.signature(CompilationConfig).parameters
        if s["cuda_graph"] == "full" and not full_field:
            raise Unsupported(f"cuda_graph: vLLM {release} has no full CUDA graph (CompilationConfig.full_cuda_graph)")
        chunk = _local_chunk(engine.fa, s)
        fa = engine.fa
        self.s, self.fa, self.numerics, self.release = s, fa, False, release
        os.environ["VLLM_BATCH_INVARIANT"] = "1" if s["batch_invariant"] else "0"
        self.dtype = getattr(torch, s["dtype"])
        vc = VllmConfig()
        cc = vc.compilation_config
        cc.cudagraph_capture_sizes = list(s["capture_sizes"])
        if full_field:
            cc.full_cuda_graph = s["cuda_graph"] == "full"
        vc.scheduler_config.max_num_seqs = s["max_num_seqs"]
        vc.scheduler_config.max_num_batched_tokens = s["max_num_batched_tokens"]
        vc.parallel_config.tensor_parallel_size = s["tp"]
        if vc.cache_config is None:  # 0.8.5's VllmConfig leaves it unset
            from vllm.config import CacheConfig

            vc.cache_config = CacheConfig()
        vc.cache_config.cache_dtype = s["kv_cache_dtype"]
        vc.cache_config.block_size = s["block_size"]
        model = ModelStandIn(s, self.dtype)
        model.attention_chunk_size = chunk  # the runner reads the model's (Llama 4: its config's) chunk size
        model.disable_cascade_attn = True
        object.__setattr__(vc, "model_config", model)
        self.vc = vc
        if s["layer_kv_heads"]:
            _refuse_heterogeneous(vc, s, release)
        self.h, self.hk, self.dv = s["num_heads"] // s["tp"], max(1, s["num_kv_heads"] // s["tp"]), s["head_dim"]
        Attention = locate("Attention")  # noqa: N806 - vLLM's class
        from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

        windows = s["sliding_window"] or [None] * s["num_layers"]
        chunked = s["attention_chunk_size"] or [None] * s["num_layers"]
        self.layers = {}
        with set_current_vllm_config(vc):
            for i, w in enumerate(windows):
                # a chunked local layer is an impl with use_irope (Llama 4's RoPE layers), which reads the builder's
                # local_attn_metadata
                irope = ({"use_irope": True} if chunked[i] is not None and "use_irope" in
                         inspect.signature(fa.FlashAttentionImpl).parameters else {})
                impl = fa.FlashAttentionImpl(num_heads=layer_heads(s, i, len(windows), self.h, self.hk),
                                             head_size=s["head_dim"], scale=s["head_dim"] ** -0.5,
                                             num_kv_heads=self.hk, alibi_slopes=None, sliding_window=w,
                                             kv_cache_dtype=s["kv_cache_dtype"],
                                             logits_soft_cap=s["logits_soft_cap"] or None, **irope)
                layer = attention_layer(Attention, impl, i)
                cc.static_forward_context[layer.layer_name] = layer
                self.layers[layer.layer_name] = layer
            spec_args = dict(block_size=s["block_size"], num_kv_heads=self.hk, head_size=s["head_dim"],
                             dtype=self.dtype, use_mla=False)
            w0 = windows[0]
            if w0 is not None and len(set(windows)) == 1:
                spec = _call(SlidingWindowSpec, {**spec_args, "sliding_window": w0})
            else:
                spec = _call(FullAttentionSpec, {**spec_args, "sliding_window": None})
            self.block_table = self._block_table()
            self.runner = _RunnerStandIn(vc, s, self.block_table)
            self.runner.attention_chunk_size = chunk  # as the runner: model_config.attention_chunk_size
            try:
                self.builder = _call(fa.FlashAttentionMetadataBuilder, {
                    "runner": self.runner, "kv_cache_spec": spec, "block_table": self.block_table,
                    "vllm_config": vc, "device": torch.device("cpu"), "layer_names": list(self.layers)})
            except ValueError as exc:  # the release's own check (capture sizes above 992 under a full graph)
                raise Unsupported(f"vLLM's metadata builder refuses this configuration: {exc}") from exc
            #: 0.10.0: the chunked layers' KV-cache group (ChunkedLocalAttentionSpec), its own builder, and the
            #: runner's virtual batches for it (gpu_model_runner.py:769, the release's own function); None before
            self.local_builder = self.local_virtual = None
            self.local_chunk, self.local_md = chunk, {}
            if chunk is not None and _runner_virtual_batches() is not None:
                from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec

                local_spec = _call(ChunkedLocalAttentionSpec, {**spec_args, "attention_chunk_size": chunk})
                self.local_names = [n for n, c in zip(self.layers, chunked) if c is not None]
                self.local_builder = _call(fa.FlashAttentionMetadataBuilder, {
                    "runner": self.runner, "kv_cache_spec": local_spec, "block_table": self.block_table,
                    "vllm_config": vc, "device": torch.device("cpu"), "layer_names": self.local_names})
                self.local_virtual = _runner_virtual_batches()
        buffer = getattr(self.builder, "scheduler_metadata", None)
        if s["cuda_graph"] == "full" and buffer is not None and not _semaphore_splits_layout():
            # the captured graph reads this buffer at the layout of the FA3 the wheel ships (the semaphore and
            # batch split counts): judging a replay under a build with a longer layout would judge another kernel
            raise RuntimeError(
                f"full CUDA graph: vLLM {release}'s builder copies the metadata into its persistent buffer of "
                f"max_num_seqs + 1 = {buffer.numel()} int32, the layout of the FA3 build its wheel ships, but the "
                f"driver judges under {_judging_build()}, which lays out more: a replay cannot be judged")
        self.kv_cache = torch.zeros(self._kv_shape(), dtype=self.dtype)
        self.spec = spec
        self.max_blocks = self.block_table.max_num_blocks_per_req
        self.captured: dict = {}
        self.steps_built = 0

    def _block_table(self):
        """The release's own block table for one KV-cache group, as its runner makes it: ``MultiGroupBlockTable``
        (0.9.0 on; its constructor computes the width ``cdiv(max_model_len, block_size)``), else ``BlockTable`` with
        the runner's ``cdiv(max_model_len, block_size)``."""
        import torch
        import vllm.v1.worker.block_table as bt

        s = self.s
        given = {"max_num_reqs": s["max_num_seqs"], "max_model_len": s["max_model_len"],
                 "max_num_batched_tokens": max(s["max_num_batched_tokens"], max(s["capture_sizes"])),
                 "pin_memory": False, "device": torch.device("cpu"), "block_size": s["block_size"],
                 "block_sizes": [s["block_size"]],
                 "max_num_blocks_per_req": -(-s["max_model_len"] // s["block_size"])}
        if hasattr(bt, "MultiGroupBlockTable"):
            return _call(bt.MultiGroupBlockTable, given).block_tables[0]
        return _call(bt.BlockTable, given)

    def _kv_shape(self) -> tuple:
        """One block of the KV cache as the release's backend lays it out (``get_kv_cache_shape``)."""
        s = self.s
        given = {"num_blocks": 1, "block_size": s["block_size"], "num_kv_heads": self.hk, "head_size": s["head_dim"],
                 "cache_dtype_str": s["kv_cache_dtype"]}
        return tuple(_call(self.fa.FlashAttentionBackend.get_kv_cache_shape, given))

    # ------------------------------------------------------------------ one step

    def _metadata(self, query_lens, seq_lens, capture: bool = False):
        """The release's builder on the runner's arrays for a batch (``_prepare_inputs``; ``capture``: the capture
        batch of ``_dummy_run``, ``max_query_len`` = its token count)."""
        import dataclasses

        import torch

        n, t = len(query_lens), sum(query_lens)
        self.runner.fill(query_lens, seq_lens)
        bt = self.block_table
        given = {"query_start_loc": self.runner.query_start_loc[:n + 1],
                 "query_start_loc_cpu": self.runner.query_start_loc_cpu[:n + 1],
                 "seq_lens": self.runner.seq_lens[:n], "seq_lens_cpu": self.runner.seq_lens_cpu[:n],
                 "num_computed_tokens_cpu": torch.tensor([k - q for q, k in zip(query_lens, seq_lens)],
                                                         dtype=torch.int32),
                 "num_reqs": n, "num_actual_tokens": t, "max_query_len": t if capture else max(query_lens),
                 "block_table_tensor": bt.get_device_tensor()[:n],
                 # the persistent slot mapping: the block table's (0.9.0 on), else the runner's (0.8.5)
                 "slot_mapping": getattr(bt, "slot_mapping", self.runner.slot_mapping_cpu)[:t]}
        try:  # 0.8.5 has no CommonAttentionMetadata (its builder reads the runner only)
            from vllm.v1.attention.backends.utils import CommonAttentionMetadata as cam_class
        except ImportError:
            cam_class = None
        cam = None
        if cam_class is not None:
            fields = {f.name for f in dataclasses.fields(cam_class)}
            cam = cam_class(**{k: v for k, v in given.items() if k in fields})
        build = self.builder.build
        if capture and hasattr(self.builder, "build_for_cudagraph_capture"):
            build = self.builder.build_for_cudagraph_capture
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vc):
            if self.local_builder is not None and capture:
                # 0.10.0's _dummy_run builds every KV-cache group's capture metadata on the runner's persistent
                # arrays, the chunked group's too, without virtual batches (gpu_model_runner.py 2108-2130)
                local_md = self.local_builder.build_for_cudagraph_capture(cam)
                self.local_md = {name: local_md for name in self.local_names}
            elif self.local_builder is not None:  # 0.10.0's runner: virtual batches for the chunked group, then build
                from gpu_impl.engines.vllm.local import release_stops_on_buffer_overflow

                local_cam = self.local_virtual(self.local_chunk, cam, self.s["block_size"])
                with release_stops_on_buffer_overflow(self.local_builder):
                    local_md = _call(self.local_builder.build, {"common_prefix_len": 0,
                                                                "common_attn_metadata": local_cam, "fast_build": False})
                self.local_md = {name: local_md for name in self.local_names}
            try:
                return _call(build, {**given, "common_prefix_len": 0, "common_attn_metadata": cam,
                                     "fast_build": False})
            except AssertionError as exc:
                # 0.9.1 .. 0.10.0's build asserts scheduler_metadata under a full CUDA graph, but computes none when
                # the layers have more than one sliding-window configuration (it turns aot_schedule off): vLLM itself
                # stops there, loudly, so the release does not run this configuration
                if self.s["cuda_graph"] != "full" or getattr(self.builder, "aot_schedule", True):
                    raise
                raise Unsupported(
                    f"cuda_graph: vLLM {self.release}'s FlashAttentionMetadataBuilder.build asserts a precomputed "
                    f"scheduler_metadata under a full CUDA graph but precomputes none when the layers' sliding windows "
                    f"differ (aot_schedule turned off): the release stops with an AssertionError") from exc
            except RuntimeError as exc:
                buffer = getattr(self.builder, "scheduler_metadata", None)
                if buffer is None or "must match" not in str(exc):
                    raise
                raise RuntimeError(
                    f"full CUDA graph: vLLM {self.release}'s builder copies the metadata into "
                    f"its persistent buffer of max_num_seqs + 1 = {buffer.numel()} int32 (the layout of the FA3 build "
                    f"its wheel ships), which the metadata of the modelled build overflows: that older layout is "
                    f"not modelled ({' '.join(str(exc).split())[:160]})") from exc

    def _graph_size(self, num_tokens: int):
        """The capture size a batch replays under a full CUDA graph (``pad_for_cudagraph``); None: eager."""
        sizes = self.s["capture_sizes"]
        if self.s["cuda_graph"] != "full" or num_tokens > max(sizes):
            return None
        return next(x for x in sizes if x >= num_tokens)

    def _capture(self, size: int, front) -> list:
        """``_dummy_run(size)`` with attention: ``min(size, max_num_seqs)`` requests of ``max_model_len`` tokens, the
        layers' forward recorded as the graph will launch it."""
        s = self.s
        reqs = min(size, s["max_num_seqs"])
        q = [size // reqs] * reqs
        q[-1] += size % reqs
        md = self._metadata(q, [s["max_model_len"]] * reqs, capture=True)
        front.recording = []
        try:
            self.forward(md, size)
        finally:
            calls, front.recording = front.recording, None
        return calls

    def step(self, query_lens, seq_lens, front):
        """One batch the way the runner of these releases steps it: (metadata, path label, graph descriptor)."""
        size = self._graph_size(sum(query_lens))
        desc = None
        # each builder precomputes for the batch (0.10.0: the chunked group's own builder beside the global one):
        # the front matches a persistent buffer's bytes to the step's precomputes of both
        front.metadata_groups = 2 if self.local_builder is not None else 1
        if size is not None and size not in self.captured:
            self.captured[size] = self._capture(size, front)
            front.capture_events.extend(front.drain())
        md = self._metadata(query_lens, seq_lens)
        self.steps_built += 1
        if size is None:
            self.forward(md, self.padded_tokens(sum(query_lens)))
            path = ABOVE_GRAPHS if self.s["cuda_graph"] == "full" else self.s["cuda_graph"]
            return md, path, desc
        reqs = min(size, self.s["max_num_seqs"])
        desc = types.SimpleNamespace(num_tokens=size, num_reqs=reqs, max_query_len=size, uniform_token_count=None)
        front.replay(self.captured[size])
        return md, "full", desc

    def padded_tokens(self, num_tokens: int) -> int:
        """Under piecewise CUDA graphs the hidden states are padded to the capture size and the attention runs
        eagerly on ``query[:num_actual_tokens]``; otherwise the batch's own count."""
        s = self.s
        if s["cuda_graph"] == "piecewise" and num_tokens <= max(s["capture_sizes"]):
            return next(x for x in s["capture_sizes"] if x >= num_tokens)
        return num_tokens

    def forward(self, md, num_tokens: int) -> None:
        import torch
        from vllm.config import set_current_vllm_config

        s = self.s
        with set_current_vllm_config(self.vc):
            for layer in self.layers.values():
                h = layer.impl.num_heads
                query = torch.zeros(num_tokens, h, s["head_dim"], dtype=self.dtype)
                key = torch.zeros(num_tokens, self.hk, s["head_dim"], dtype=self.dtype)
                value = torch.zeros(num_tokens, self.hk, self.dv, dtype=self.dtype)
                out = torch.zeros(num_tokens, h, self.dv, dtype=self.dtype)
                layer.impl.forward(layer, query, key, value, self.kv_cache, self.local_md.get(layer.layer_name, md),
                                   out)


def _refuse_heterogeneous(vc, s: dict, release: str) -> None:
    """Layers with their own KV-head counts on 0.8.5 .. 0.10.0: the release's own KV-cache configuration decides
    (``get_kv_cache_config`` over the layers' specs: NotImplementedError where their page sizes differ); where it
    accepts them, Unsupported all the same (generation v0 builds one builder for all layers)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from gpu_impl.engines.vllm.heterolayers import kv_cache_groups, layer_kv_heads

    dtype = getattr(torch, s["dtype"])
    specs = {f"model.layers.{i}.self_attn.attn": _call(FullAttentionSpec, dict(
        block_size=s["block_size"], num_kv_heads=layer_kv_heads(s, i, s["tp"]), head_size=s["head_dim"],
        dtype=dtype, use_mla=False, sliding_window=None)) for i in range(s["num_layers"])}
    kv_cache_groups(vc, specs)
    raise Unsupported(f"layer_kv_heads: vLLM {release}'s KV-cache grouping accepts these layers, but generation v0 "
                      f"drives one metadata builder for all layers (not driven)")
