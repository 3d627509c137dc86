"""The V2 model runner's first form (vLLM 0.12.0 .. 0.16.0, ``vllm/v1/worker/gpu/``), driven beside the V1 runner:
driver generation ``v2first`` (releases.json ``v2_runner.generation``).

Invariant: what decides a step is the release's code, as its ``GPUModelRunner`` asks it: ``CudaGraphManager``
(``cudagraph_utils.py``: FULL graphs only, ``get_cudagraph_sizes`` / ``get_cudagraph_size`` over the resolved capture
sizes; from 0.15.0 a mixed batch takes a graph only where the mode's mixed routine is FULL, before only
FULL_DECODE_ONLY keeps it out) decides whether a batch replays a
graph and its padded token count; ``prepare_inputs_to_capture`` builds a FULL graph's capture metadata (through
``build_attn_metadata``, ``max_seq_len`` = ``max_model_len``), with the request count ``CudaGraphManager.capture_graph``
gives it; every other step's metadata comes from ``attn_utils.build_attn_metadata`` with the arguments the runner's
``prepare_inputs`` passes it (the real requests and tokens; ``max_seq_len`` = ``max_model_len`` from 0.14, the batch's
own ``seq_lens_np`` before); the real ``FlashAttentionMetadataBuilder`` (one per KV-cache group, as
``init_attn_backend`` makes it: the first generation's builder) and ``FlashAttentionImpl.forward`` run unmodified. A FULL
graph is captured the first time a batch takes it and replayed on the persistent buffers (``CudaGraphManager.run``),
as generations v2 and v2early do (``driver_v2_early.ConfigV2Early``, whose step this reuses).

What differs from 0.17 (v2early): no model states (the runner builds the metadata inline in ``prepare_inputs``), no
piecewise CUDA graphs in this runner ("TODO(woosuk): Support piecewise CUDA graph": a batch without a FULL graph runs
eagerly), no DCP in this runner, ``get_cudagraph_size`` instead of ``get_cudagraph_runtime_mode``.

Stood in (besides ``vllm_glue.FAKED``): :data:`STOOD_IN`.
"""

from __future__ import annotations

import inspect
import types

from gpu_impl.engines.protocol import Unsupported
from gpu_impl.engines.vllm.driver import Config
from gpu_impl.engines.vllm.driver_v2 import GRAPH_MODES_V2
from gpu_impl.engines.vllm.driver_v2_early import ConfigV2Early, GraphKey

__all__ = ["ConfigV2First", "STOOD_IN"]

#: What this generation stands in for, besides ``vllm_glue.FAKED``.
STOOD_IN = (
    "the runner's prepare_inputs around its build_attn_metadata call (Triton kernels and request states): query "
    "starts (rows past the batch at the token count), seq_lens (padded rows 0), the arguments it passes "
    "build_attn_metadata",
    "the runner's InputBuffers (query_start_loc and seq_lens, the two buffers the attention path reads; 0.12 .. 0.13: "
    "query_start_loc as a CPU/GPU pair, one CPU tensor here) and BlockTables (one persistent table as wide as the "
    "runner's, cdiv(max_model_len, block_size); slot mappings -1)",
    "the graphs CudaGraphManager.capture records at start-up (every size of get_cudagraph_sizes counts as captured "
    "and is captured on first use); torch.cuda's graph pool handle (none); one DP rank (the padded count is the "
    "graph's size, as the runner's DP padding gives it for dp_size 1)",
    "the scheduler output get_cudagraph_size reads before 0.16 (its num_scheduled_tokens)",
)


class _PairedBuffer:
    """A CPU/GPU buffer pair (``CpuGpuBuffer``: ``.np``, ``.cpu``, ``.gpu``, ``copy_to_gpu``) as one CPU tensor."""

    def __init__(self, tensor):
        self.cpu = self.gpu = tensor
        self.np = tensor.numpy()

    def copy_to_gpu(self, *args):
        return self.gpu


class ConfigV2First(ConfigV2Early):
    """One scenario stepped the way the 0.12 .. 0.16 V2 model runner steps it (module doc)."""

    def __init__(self, engine, s: dict, numerics: bool = False):
        if s["cuda_graph"] not in GRAPH_MODES_V2:
            raise Unsupported(f"cuda_graph: {s['cuda_graph']!r} is not a mode of the V2 runner "
                              f"({', '.join(GRAPH_MODES_V2)})")
        if s["cuda_graph"] == "piecewise":
            raise Unsupported("cuda_graph: piecewise: this release's V2 runner has no piecewise CUDA graphs (its "
                              "execute_model: 'TODO(woosuk): Support piecewise CUDA graph')")
        for field, why in (("attention_chunk_size", "chunked local layers"), ("layer_kv_heads", "layers that differ"),
                           ("common_prefix", "cascade attention"), ("dcp", "DCP (this runner has none)")):
            if s[field] and s[field] != 1:
                raise Unsupported(f"{field}: {why} on this release's V2 runner are not driven (driver generation "
                                  f"v2first)")
        if s["draft_tokens"] > 1:
            raise Unsupported("draft_tokens: the drafter on this release's V2 runner is not driven (driver generation "
                              "v2first; the drafter is driven through the V1 runner)")
        if numerics:
            raise Unsupported("numerics: not driven through the V2 runner (the first generation's numerics only)")
        Config.__init__(self, engine, s, numerics=numerics)
        import torch
        from vllm.config.compilation import CUDAGraphMode
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

        self.engine = engine
        self.mode = getattr(CUDAGraphMode, GRAPH_MODES_V2[s["cuda_graph"]])
        self.vc.compilation_config.cudagraph_mode = self.mode
        self.vc.scheduler_config.max_num_batched_tokens = s["max_num_batched_tokens"]
        self.kv_cache_config = KVCacheConfig(num_blocks=1, kv_cache_tensors=[],
                                             kv_cache_groups=[KVCacheGroupSpec(list(self.layers), self.spec)])
        self.builders = [self.builder]  # init_attn_backend: one builder per KV-cache group, made as the first one is
        max_tokens = max(s["max_num_batched_tokens"], max(s["capture_sizes"]))
        import vllm.v1.worker.gpu.cudagraph_utils as cg

        self.cg = cg
        qsl = torch.zeros(s["max_num_seqs"] + 1, dtype=torch.int32)
        paired = "copy_to_gpu" in inspect.getsource(cg.prepare_inputs_to_capture)  # 0.12 .. 0.13
        self.buffers = types.SimpleNamespace(query_start_loc=_PairedBuffer(qsl) if paired else qsl,
                                             seq_lens=torch.zeros(s["max_num_seqs"], dtype=torch.int32))
        self._qsl = qsl
        self.table = torch.zeros(s["max_num_seqs"], self.max_blocks, dtype=torch.int32)
        self.tables = (self.table,)  # one KV-cache group: the second generation's per-group tables
        self.block_tables = types.SimpleNamespace(input_block_tables=[self.table],
                                                  slot_mappings=torch.full((1, max_tokens), -1, dtype=torch.int64))
        self.graphs = self._graph_manager() if self.mode.has_full_cudagraphs() else None
        self.captured: dict = {}

    def _graph_manager(self):
        import torch

        cg = self.cg
        params = inspect.signature(cg.CudaGraphManager).parameters
        pool = torch.cuda.graph_pool_handle
        torch.cuda.graph_pool_handle = lambda: None  # the graph pool (CUDA): none
        try:
            manager = cg.CudaGraphManager(self.vc, *((False,) if "uses_mrope" in params else ()), torch.device("cpu"))
        finally:
            torch.cuda.graph_pool_handle = pool
        manager.graphs = {size: None for size in set(manager.cudagraph_sizes.values())}  # capture_graphs' sizes
        return manager

    def dispatch(self, query_lens):
        """Whether the batch replays a FULL graph, and its padded count (``get_cudagraph_size``, as the runner asks it
        with one DP rank); a FULL graph's requests: ``capture_graph``'s ``min(num_tokens, max_num_reqs)``."""
        from vllm.config.compilation import CUDAGraphMode

        n, t = len(query_lens), sum(query_lens)
        if self.graphs is None:
            return GraphKey(CUDAGraphMode.NONE, t, None)
        g = self.graphs
        if "scheduler_output" in inspect.signature(g.get_cudagraph_size).parameters:  # before 0.16
            size = g.get_cudagraph_size(types.SimpleNamespace(num_scheduled_tokens=dict(enumerate(query_lens))), t)
        else:
            size = g.get_cudagraph_size(t, list(query_lens))
        if size is None:
            return GraphKey(CUDAGraphMode.NONE, t, None)
        return GraphKey(CUDAGraphMode.FULL, size, min(size, g.max_num_reqs))

    def _capture(self, desc, front) -> list:
        """The FULL graph of ``desc``: ``prepare_inputs_to_capture`` (its metadata), then the layers' forward; the
        calls it made, as the graph will launch them."""
        out = self.cg.prepare_inputs_to_capture(desc.num_reqs, desc.num_tokens, self.buffers, self.block_tables,
                                                self.builders, self.s["max_model_len"], self.kv_cache_config)
        md = next(iter((out[0] if isinstance(out, tuple) else out).values()))  # (metadata, slots) from 0.15
        front.recording = []
        try:
            Config.forward(self, md, desc.num_tokens)
        finally:
            calls, front.recording = front.recording, None
        return calls

    def _above_graphs(self, query_lens) -> bool:
        """A batch without a FULL graph runs eagerly; it is above the captured graphs only past the largest size (a
        mixed batch under FULL_AND_PIECEWISE runs eagerly here: no piecewise graphs in this runner)."""
        return self.graphs is not None and sum(query_lens) > max(self.graphs.cudagraph_sizes, default=0)

    def _step_metadata(self, desc, query_lens, seq_lens):
        """The runner's ``prepare_inputs``: the input buffers for the real batch, then ``build_attn_metadata`` with
        the arguments it passes (the release's parameters, read)."""
        import numpy as np
        import torch
        from vllm.v1.worker.gpu.attn_utils import build_attn_metadata

        n, t = len(query_lens), sum(query_lens)
        qsl = np.zeros(n + 1, dtype=np.int32)
        qsl[1:] = np.cumsum(query_lens)
        self._qsl.zero_()
        self._qsl[:n + 1] = torch.from_numpy(qsl)
        self._qsl[n + 1:] = t
        self.buffers.seq_lens.zero_()
        self.buffers.seq_lens[:n] = torch.tensor(seq_lens, dtype=torch.int32)
        self.table[:n].zero_()
        given = {"attn_metadata_builders": self.builders, "num_reqs": n, "num_tokens": t,
                 "query_start_loc_gpu": self._qsl[:n + 1], "query_start_loc_cpu": torch.from_numpy(qsl),
                 "seq_lens": self.buffers.seq_lens, "max_seq_len": self.s["max_model_len"],
                 "seq_lens_np": np.array(seq_lens, dtype=np.int32),
                 "num_computed_tokens_cpu": torch.tensor([k - q for q, k in zip(query_lens, seq_lens)],
                                                         dtype=torch.int32),
                 "block_tables": [self.table[:n]], "slot_mappings": self._slots(t),
                 "kv_cache_config": self.kv_cache_config}
        params = inspect.signature(build_attn_metadata).parameters
        metadata = build_attn_metadata(**{k: v for k, v in given.items() if k in params})
        return next(iter(metadata.values())), max(t, desc.num_tokens)
