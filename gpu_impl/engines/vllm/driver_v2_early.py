"""The V2 model runner's first CUDA-graph API (vLLM 0.17.0 .. 0.17.1, ``vllm/v1/worker/gpu/``), driven beside the
V1 runner: driver generation ``v2early`` (releases.json ``v2_runner.generation``).

Invariant: what decides a step is the release's code, as its ``GPUModelRunner.execute_model`` asks it:
``CudaGraphManager.get_cudagraph_runtime_mode`` (``cudagraph_utils.py``: the mode and the captured size, from
``get_cudagraph_sizes`` over the resolved capture sizes, uniform decode graphs where the mode has a separate FULL
decode routine) and ``dp_utils.get_cudagraph_and_dp_padding`` (the padded token count) dispatch each batch;
``prepare_inputs_to_capture`` (``InputBatch.make_dummy``, the DCP local lengths) builds a FULL graph's capture batch,
with the request count ``CudaGraphManager.capture_graph`` gives it; ``DefaultModelState.prepare_attn``
(``model_states/default.py``: the real request and token counts, ``max_seq_len`` = ``max_model_len`` on every step)
and ``build_attn_metadata`` build the metadata through the real ``FlashAttentionMetadataBuilder``; the real
``FlashAttentionImpl.forward`` makes the call. A FULL graph is captured the first time a batch dispatches to it, and
every replay re-issues the captured calls on the persistent buffers as the replay's build left them
(``run_fullgraph``), as driver generation v2 does (``driver_v2.ConfigV2``, whose pieces this reuses).

What differs from the API generation v2 follows (0.18.0 on), read from 0.17.1 against 0.18.0: no
``BatchExecutionDescriptor`` and no ``CudaGraphManager.dispatch`` (the graphs are keyed by token count alone), no
``InputBatch.num_reqs_after_padding`` (a replay's metadata covers the real requests), ``prepare_attn`` takes no
CUDA-graph mode, and the block table is not aligned (``BlockTables.__init__``: ``cdiv(max_model_len, block_size *
cp_size)`` per request).

Stood in (besides ``driver_v2.STOOD_IN``, whose input-buffer fill, model-state ``self``, block-table holder and DCP
kernel this generation shares): :data:`STOOD_IN`.
"""

from __future__ import annotations

import dataclasses

from gpu_impl.engines.protocol import Unsupported
from gpu_impl.engines.vllm.driver_v2 import ABOVE_GRAPHS, STOOD_IN as V2_STOOD_IN, ConfigV2, dcp_local_seq_lens

__all__ = ["ConfigV2Early", "GraphKey", "STOOD_IN"]

#: What this generation stands in for, besides ``vllm_glue.FAKED``.
STOOD_IN = tuple(s for s in V2_STOOD_IN if not s.startswith(("before 0.27", "cudagraph_utils.get_pp_group"))) + (
    "the Triton kernel of cp_utils.prepare_dcp_local_seq_lens (vLLM's get_dcp_local_seq_lens in torch; the FA builder "
    "computes its own local lengths)",
    "the graphs CudaGraphManager.capture records at start-up (its graphs dict keyed by token count): every size its "
    "capture would take as a FULL graph (get_cudagraph_sizes' sizes under a FULL mixed mode, its uniform decode sizes "
    "under a separate FULL decode routine) counts as captured and is captured on first use; torch.cuda's graph pool "
    "handle (none)",
    "the runner's BlockTables (its constructor pins host memory): the per-request width its constructor computes, "
    "cdiv(max_model_len, block_size * cp_size), no alignment",
)


@dataclasses.dataclass(frozen=True)
class GraphKey:
    """What a step was dispatched to (the fields the worker reports of a descriptor): the mode, the padded token count
    (a FULL graph's key in ``CudaGraphManager.graphs``), the requests a FULL graph was captured with, and whether it
    is a uniform decode graph (its ``uniform_token_count``, else None)."""

    cg_mode: object
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None


class ConfigV2Early(ConfigV2):
    """One scenario stepped the way the 0.17 V2 model runner steps it (module doc)."""

    def __init__(self, engine, s: dict, numerics: bool = False):
        if s["draft_tokens"] > 1:
            raise Unsupported("draft_tokens: the drafter on this release's V2 runner is not driven (driver generation "
                              "v2early; the drafter is driven through the V1 runner)")
        super().__init__(engine, s, numerics=numerics)

    def table_width(self, spec) -> int:
        """The 0.17 V2 runner's block-table width (``BlockTables.__init__``): ``cdiv(max_model_len, block_size *
        cp_size)``, not aligned (stood in: the constructor pins host memory)."""
        return -(-self.s["max_model_len"] // (self.s["block_size"] * self.s["dcp"]))

    def _graph_manager(self):
        import torch
        import vllm.v1.worker.gpu.cudagraph_utils as cg

        cg.prepare_dcp_local_seq_lens = dcp_local_seq_lens
        pool = torch.cuda.graph_pool_handle
        torch.cuda.graph_pool_handle = lambda: None  # the graph pool (CUDA): none
        try:
            manager = cg.CudaGraphManager(self.vc, False, torch.device("cpu"))
        finally:
            torch.cuda.graph_pool_handle = pool
        # the FULL graphs capture() would record at start-up, keyed by token count: the mixed phase's sizes under a
        # FULL mixed mode, the uniform decode phase's sizes under a separate FULL decode routine (the manager's own
        # size tables); each is captured here on first use (:meth:`step`)
        from vllm.config.compilation import CUDAGraphMode

        full = set()
        if self.mode.mixed_mode() == CUDAGraphMode.FULL:
            full |= set(manager.cudagraph_sizes.values())
        full |= set(manager.uniform_decode_cudagraph_sizes.values())
        manager.graphs = {size: None for size in full}
        return manager

    # ------------------------------------------------------------------ one step

    def dispatch(self, query_lens):
        """The step's mode and padded size, as ``execute_model`` asks them: ``get_cudagraph_runtime_mode`` (its
        ``num_reqs``, ``num_tokens``, ``max_query_len``), then ``get_cudagraph_and_dp_padding`` (one DP rank)."""
        from vllm.config.compilation import CUDAGraphMode
        from vllm.v1.worker.gpu.dp_utils import get_cudagraph_and_dp_padding

        n, t = len(query_lens), sum(query_lens)
        if self.graphs is None:
            return GraphKey(CUDAGraphMode.NONE, t, None)
        mode, size = self.graphs.get_cudagraph_runtime_mode(num_reqs=n, num_tokens=t, max_query_len=max(query_lens))
        padded, _, synced = get_cudagraph_and_dp_padding(t, size, mode.value, 1, 0)
        mode = CUDAGraphMode(synced)
        if mode != CUDAGraphMode.FULL:
            return GraphKey(mode, padded, None)
        # the requests CudaGraphManager.capture_graph gave this graph: a uniform decode graph (captured in the decode
        # phase, the mixed mode being another) min(cdiv(tokens, decode query len), max_num_reqs), else
        # min(tokens, max_num_reqs)
        g = self.graphs
        decode = self.mode.mixed_mode() != CUDAGraphMode.FULL
        q = g.uniform_decode_query_len
        reqs = min(-(-padded // q), g.max_num_reqs) if decode else min(padded, g.max_num_reqs)
        return GraphKey(mode, padded, reqs, q if decode else None)

    def _input_batch(self, desc, query_lens, seq_lens):
        """The runner's ``prepare_inputs`` for a real batch: query starts (rows past the batch at the token count),
        ``seq_lens`` (padded rows 0), the real request and token counts, the padded token count; under DCP the local
        lengths (``prepare_dcp_local_seq_lens``)."""
        import numpy as np
        from vllm.v1.worker.gpu.input_batch import InputBatch

        n, t = len(query_lens), sum(query_lens)
        dummy = InputBatch.make_dummy(n, max(t, n), self.buffers)
        qsl, _ = self._fill(query_lens, seq_lens, n)
        dcp = None
        if self.s["dcp"] > 1:
            b = self.block_tables
            dcp = dcp_local_seq_lens(self.buffers.dcp_local_seq_lens, self.buffers.seq_lens, n, b.cp_size, b.cp_rank,
                                     b.cp_interleave, num_reqs_padded=n)
        return dataclasses.replace(
            dummy, num_reqs=n, num_scheduled_tokens=np.array(query_lens, dtype=np.int32), num_tokens=t,
            num_tokens_after_padding=max(t, desc.num_tokens), query_start_loc=self.buffers.query_start_loc[:n + 1],
            query_start_loc_np=qsl, seq_lens=self.buffers.seq_lens[:n], dcp_local_seq_lens=dcp)

    def _step_metadata(self, desc, query_lens, seq_lens):
        """(the step's attention metadata, the padded token count): ``prepare_inputs``, then
        ``DefaultModelState.prepare_attn`` over the real requests with the runner's block tables and slot mappings."""
        ib = self._input_batch(desc, query_lens, seq_lens)
        metadata = self.model_state.prepare_attn(ib, (self.table[:ib.num_reqs],),
                                                 self._slots(ib.num_tokens_after_padding), self.attn_groups,
                                                 self.kv_cache_config)
        return next(iter(metadata.values())), ib.num_tokens_after_padding

    def _above_graphs(self, query_lens) -> bool:
        """Whether an eager step under a CUDA-graph mode is one no captured graph takes (every mode here captures a
        graph or a piecewise size for each batch up to the largest size)."""
        from vllm.config.compilation import CUDAGraphMode

        return self.mode != CUDAGraphMode.NONE

    def step(self, query_lens, seq_lens, front):
        """One batch through the 0.17 V2 runner's path; (metadata, path label, graph key)."""
        from vllm.config.compilation import CUDAGraphMode

        if self.numerics:
            raise Unsupported("numerics: not driven through the V2 runner (the first generation's numerics only)")
        desc = self.dispatch(query_lens)
        full = desc.cg_mode == CUDAGraphMode.FULL
        if full and desc.num_tokens not in self.captured:
            self.captured[desc.num_tokens] = self._capture(desc, front)
            front.capture_events.extend(front.drain())
        md, padded = self._step_metadata(desc, query_lens, seq_lens)
        self.steps_built += 1
        if full:
            front.replay(self.captured[desc.num_tokens])
            path = "full"
        else:
            self._forward_tokens(md, padded)
            path = {CUDAGraphMode.PIECEWISE: "piecewise"}.get(desc.cg_mode, "none")
            if path == "none" and self._above_graphs(query_lens):
                path = ABOVE_GRAPHS
        self.draft_from = len(front.checker.events)
        return md, path, desc
