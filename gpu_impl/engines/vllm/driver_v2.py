"""The vLLM driver's second generation: batches reach the FlashAttention backend through the V2 model runner's own
input and CUDA-graph code (``vllm/v1/worker/gpu/``), for releases that ship only that runner (0.34.0 on).

Invariant: what decides a step is vLLM's code: ``CudaGraphManager`` (``cudagraph_utils.py``) builds the capture
descriptors from the resolved capture sizes and dispatches each batch (FULL graph, PIECEWISE or eager, the padded
request and token counts); ``prepare_inputs_to_capture`` and ``InputBatch.make_dummy`` (``input_batch.py``) build a
FULL graph's capture batch, ``set_dcp_capture_context`` its DCP context; ``DefaultModelState.prepare_attn``
(``model_states/default.py``: padded sizes under FULL, ``max_seq_len`` = ``max_model_len`` at capture) and
``build_attn_metadata`` (``attn_utils.py``) build the ``CommonAttentionMetadata`` that the real
``FlashAttentionMetadataBuilder`` (made by ``AttentionGroup.create_metadata_builders``) turns into metadata; the real
``FlashAttentionImpl.forward`` makes the call. A FULL graph is captured the first time a batch dispatches to it: the
capture-time call (its scalars: ``max_seqlen_q``, ``max_seqlen_k``, ``num_splits``, batch) is recorded, and every
replay re-issues that call on the persistent buffers as the replay's build left them (input buffers, block table,
the builder's persistent scheduler-metadata buffer), which is what a graph replay launches.

Stood in (our code, no CUDA): the model runner's own fill of its input buffers, a Triton kernel
(``prepare_pos_seq_lens``: cumulative query starts, padded starts = the token count, padded ``seq_lens`` = 0,
written here in the same layout), the model state's ``self`` (the four fields ``prepare_attn`` reads), the block
tables' holder (one persistent table per the runner's width; ``cp_size``/``cp_interleave``/``block_sizes`` for the
DCP capture context), the pipeline-parallel group (first and last rank), the global graph pool (none) and the Triton
kernel of ``cp_utils.prepare_dcp_local_seq_lens`` (vLLM's ``get_dcp_local_seq_lens`` in torch; FA does not read it).
"""

from __future__ import annotations

import dataclasses
import types

from gpu_impl.engines.protocol import Unsupported
from gpu_impl.engines.vllm.driver import Config

__all__ = ["ConfigV2", "GRAPH_MODES_V2", "PATHS_V2", "ABOVE_GRAPHS", "STOOD_IN"]

#: What this generation stands in for, besides ``vllm_glue.FAKED`` (reported in the driver's hello).
STOOD_IN = (
    "the V2 runner's fill of its input buffers (prepare_inputs and its Triton kernel prepare_pos_seq_lens): query "
    "starts, padded starts = the token count, padded seq_lens = 0, the CPU upper bound, written in the same layout",
    "the model state's self for DefaultModelState.prepare_attn (max_model_len, supports_mm_inputs=False, "
    "encoder_cache=None, model_config)",
    "the runner's BlockTables: one persistent table as wide as the runner's (get_dummy_block_tables, "
    "get_dummy_slot_mappings, cp_size, cp_interleave, block_sizes)",
    "cudagraph_utils.get_pp_group (first and last rank), the platform's global graph pool (none), and the Triton "
    "kernel of cp_utils.prepare_dcp_local_seq_lens (vLLM's get_dcp_local_seq_lens in torch)",
    "before 0.27 (no get_block_table_width): the block-table width the V2 runner computes inline in "
    "initialize_kv_cache (blocks per request rounded up to a multiple of 128 // block_size) taken from the "
    "release's V1 MultiGroupBlockTable, which applies the same rule in its constructor",
)

#: the path of a batch no captured graph takes under a CUDA-graph mode (dispatched eagerly)
ABOVE_GRAPHS = "none: above the captured graphs"
#: every path label a second-generation trace carries (a FULL graph's capture-time pair is "full: capture")
PATHS_V2 = ("none", "piecewise", "full", "full: capture", ABOVE_GRAPHS)

#: the driver's ``cuda_graph`` field -> vLLM's CUDAGraphMode name: ``full`` is FULL (every batch that fits takes a
#: FULL graph, as the first generation drives it), ``full_and_piecewise`` vLLM's default for FA3 (uniform decode
#: batches take FULL graphs, the rest PIECEWISE)
GRAPH_MODES_V2 = {"none": "NONE", "piecewise": "PIECEWISE", "full": "FULL", "full_and_piecewise": "FULL_AND_PIECEWISE"}


class _BlockTablesStandIn:
    """What ``prepare_inputs_to_capture`` / ``set_dummy_context`` read of the runner's ``BlockTables``: one table per
    KV-cache group (``tables``; ``table``: the first)."""

    def __init__(self, table, block_size: int, cp_size: int, cp_interleave: int, tables=None, block_sizes=None):
        import torch

        self.tables = tuple(tables) if tables else (table,)
        self.table, self.block_sizes = table, list(block_sizes or [block_size])
        self.cp_size, self.cp_rank, self.cp_interleave = cp_size, 0, cp_interleave
        self.input_block_tables = list(self.tables)
        self._torch = torch

    def get_dummy_block_tables(self, num_reqs: int):
        for table in self.tables:
            table[:num_reqs].zero_()
        return tuple(table[:num_reqs] for table in self.tables)

    def get_dummy_slot_mappings(self, num_tokens: int):
        return self._torch.full((len(self.tables), num_tokens), -1, dtype=self._torch.int64)


def dcp_local_seq_lens(out, seq_lens, num_reqs, dcp_size, dcp_rank, cp_interleave, *, num_reqs_padded=None):
    """Stand-in for the Triton kernel behind ``cp_utils.prepare_dcp_local_seq_lens`` (a DCP FULL capture): each
    request's local length by vLLM's own ``get_dcp_local_seq_lens``; padded rows 0. The FA builder computes its own
    local context lengths and does not read these."""
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    out.zero_()
    out[:num_reqs] = get_dcp_local_seq_lens(seq_lens[:num_reqs], dcp_size, dcp_rank, cp_interleave)
    return out[:num_reqs_padded]


def _parameters(fn) -> set:
    """The parameter names of a release's function (how this generation follows a signature that changed)."""
    import inspect

    return set(inspect.signature(fn).parameters)


def _v2_table(name: str) -> dict:
    """One table of releases.json ``v2_runner`` (what a release's V2 runner passes where releases differ)."""
    from gpu_impl.engines.vllm.recipes import v2_runner_table

    return v2_runner_table(name)


def _field_names(obj) -> set:
    return {f.name for f in dataclasses.fields(obj)}


class ConfigV2(Config):
    """One scenario's vLLM objects, stepped the way the V2 model runner steps them (module doc)."""

    RUNNER = "v2"

    def __init__(self, engine, s: dict, numerics: bool = False):
        if s["cuda_graph"] not in GRAPH_MODES_V2:
            raise Unsupported(f"cuda_graph: {s['cuda_graph']!r} is not a mode of the V2 runner "
                              f"({', '.join(GRAPH_MODES_V2)})")
        if s["layer_kv_heads"] and s["draft_tokens"]:
            from gpu_impl.engines.vllm.paths import not_covered_reason

            raise Unsupported("draft_tokens: " + not_covered_reason("layers differ from the config@v2 drafter"))
        if s["common_prefix"]:
            raise Unsupported("common_prefix: cascade attention is driven through the V1 runner only (driver "
                              "generation v1; the V2 runner has no cascade path)")
        if s["dcp"] > 1 and s["cuda_graph"] in ("full", "full_and_piecewise"):
            import vllm.v1.worker.gpu.cudagraph_utils as cg

            if not hasattr(cg, "set_dcp_capture_context"):
                # 0.28 .. 0.31: a FULL graph is captured on the dummy batch, whose contexts are empty, so the
                # builder skips DCP's context attention at capture (should_skip_dcp_context_attention) and the graph
                # holds no context call to judge at its replays; not judged (docs/engines-vllm.md)
                raise Unsupported("dcp: DCP under CUDA graphs on this release's V2 runner is not driven: its capture "
                                  "has no DCP capture context (cudagraph_utils.set_dcp_capture_context, 0.34 on), so "
                                  "the captured graph holds no context attention call to judge")
        super().__init__(engine, s, numerics=numerics)
        import torch
        from vllm.config.compilation import CUDAGraphMode
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.worker.gpu.input_batch import InputBuffers
        from vllm.v1.worker.utils import AttentionGroup

        self.engine = engine
        self.mode = getattr(CUDAGraphMode, GRAPH_MODES_V2[s["cuda_graph"]])
        vc = self.vc
        vc.compilation_config.cudagraph_mode = self.mode
        sizes = list(s["capture_sizes"])
        # the resolved capture sizes (VllmConfig's resolution from the shared sizes, no spec decode: query len 1)
        vc.compilation_config.prefill_cudagraph_capture_token_sizes = sizes
        vc.compilation_config.decode_cudagraph_capture_request_sizes = sorted({min(x, s["max_num_seqs"])
                                                                                for x in sizes})
        vc.scheduler_config.max_num_batched_tokens = s["max_num_batched_tokens"]
        if s["attention_chunk_size"] or s["layer_kv_heads"]:
            # several attention groups: the release's own init_attn_backend makes them (heterolayers), and over
            # chunked local layers the release resolves the CUDA-graph mode (local.runner_v2_mode)
            from gpu_impl.engines.vllm.heterolayers import runner_attention_groups

            self.kv_cache_config, self.attn_groups, support = runner_attention_groups(self, self.kv_groups_raw)
            if s["attention_chunk_size"]:
                from gpu_impl.engines.vllm.local import runner_v2_mode

                self.mode = getattr(CUDAGraphMode, runner_v2_mode(vc, s, self.attn_groups, support))
                vc.compilation_config.cudagraph_mode = self.mode
                # the path labels follow the mode the release resolved
                s["cuda_graph"] = {v: k for k, v in GRAPH_MODES_V2.items()}[self.mode.name]
            self.builder = self.attn_groups[0][0].get_metadata_builder(0)
        else:
            group = AttentionGroup(self.backend, list(self.layers), self.spec, 0)
            from vllm.config import set_current_vllm_config

            with set_current_vllm_config(vc):
                group.create_metadata_builders(vllm_config=vc, device=torch.device("cpu"), kernel_block_size=None,
                                               num_metadata_builders=1)
            self.builder = group.get_metadata_builder(0)
            self.attn_groups = [[group]]
            self.kv_cache_config = KVCacheConfig(num_blocks=1, kv_cache_tensors=[],
                                                 kv_cache_groups=[KVCacheGroupSpec(list(self.layers), self.spec)])
        max_tokens = max(s["max_num_batched_tokens"], max(sizes))
        self.buffers = InputBuffers(s["max_num_seqs"], max_tokens, torch.device("cpu"))
        # one persistent block table per KV-cache group, as wide as the runner makes it for the group's spec
        specs = [g.kv_cache_spec for g in self.kv_cache_config.kv_cache_groups]
        self.tables = tuple(torch.zeros(s["max_num_seqs"], self.max_blocks if i == 0 else self.table_width(spec),
                                        dtype=torch.int32) for i, spec in enumerate(specs))
        self.table = self.tables[0]
        interleave = vc.parallel_config.cp_kv_cache_interleave_size
        self.block_tables = _BlockTablesStandIn(self.table, s["block_size"], s["dcp"], interleave, tables=self.tables,
                                                block_sizes=[spec.block_size for spec in specs])
        self.model_state = types.SimpleNamespace(max_model_len=s["max_model_len"], supports_mm_inputs=False,
                                                 encoder_cache=None, model_config=vc.model_config)
        from vllm.v1.worker.gpu.model_states.default import DefaultModelState

        self.model_state.prepare_attn = types.MethodType(DefaultModelState.prepare_attn, self.model_state)
        self.graphs = self._graph_manager() if self.mode != CUDAGraphMode.NONE else None
        self.captured: dict = {}

    def table_width(self, spec) -> int:
        """The V2 runner's block-table width: ``max_num_blocks_per_req`` aligned by ``get_block_table_width`` (0.27
        on; 0.34.0 moved it to ``vllm/v1/kv_cache_interface.py``). Before 0.27 the V2 runner aligns inline
        (``model_runner.initialize_kv_cache``: ``cdiv(max_model_len, block_size * dcp)`` rounded up to a multiple of
        ``128 // block_size``, 0.26.0 lines 433-440), the same rule as the release's V1 ``MultiGroupBlockTable``
        constructor, which computes it here (the first generation's ``table_width``; stood in, :data:`STOOD_IN`)."""
        from gpu_impl.engines.vllm.recipes import locate

        try:
            align = locate("get_block_table_width")
        except ImportError:
            return Config.table_width(self, spec)
        return align(spec.max_num_blocks_per_req(self.vc, self.s["max_model_len"]), spec.block_size)

    def _graph_manager(self):
        import torch
        import vllm.v1.worker.gpu.cudagraph_utils as cg

        cg.get_pp_group = lambda: types.SimpleNamespace(is_first_rank=True, is_last_rank=True)
        cg.current_platform.get_global_graph_pool = lambda: None
        cg.prepare_dcp_local_seq_lens = dcp_local_seq_lens
        import inspect

        # decode graphs for one query token per request: a map query length -> requests from 0.34, the one decode
        # query length before (``decode_query_len``, 0.27 .. 0.33)
        params = inspect.signature(cg.CudaGraphManager).parameters
        decode = 1 if "decode_query_len" in params else {1: self.s["max_num_seqs"]}
        manager = cg.CudaGraphManager(self.vc, torch.device("cpu"), self.mode, decode)
        manager._graphs_captured = True  # every descriptor counts as captured; each is captured on first use
        return manager

    # ------------------------------------------------------------------ one step

    def dispatch(self, query_lens, seq_lens=None):
        """vLLM's descriptor for the batch (``CudaGraphManager.dispatch``, as ``execute_model`` asks it)."""
        from vllm.config.compilation import CUDAGraphMode
        from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

        n, t = len(query_lens), sum(query_lens)
        uniform = query_lens[0] if len(set(query_lens)) == 1 else None
        decode = max(query_lens) == 1
        eligible = self._decode_graph_eligible(query_lens, seq_lens)
        if eligible is not None:
            from vllm.v1.worker.utils import get_uniform_decode_token_count

            uniform = get_uniform_decode_token_count(n, t, max(query_lens), eligible)
            decode = decode and eligible
        if self.graphs is None:
            return BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=t, num_reqs=n)
        # the release's own parameters: num_active_loras from 0.24, max_query_len from 0.28 (signature read)
        params = _parameters(self.graphs.dispatch)
        args = (n, t, uniform) + ((0,) if "num_active_loras" in params else ())
        if "max_query_len" in params:
            return self.graphs.dispatch(*args, max_query_len=1 if decode else self._mixed_bound(query_lens))
        return self.graphs.dispatch(*args)

    def _decode_graph_eligible(self, query_lens, seq_lens):
        """Whether the release lets this batch take a decode graph (``decode_graph_eligible``, 0.31.0 on:
        ``gather_batch_req_state`` in ``vllm/v1/worker/gpu/model_runner.py``, 1427-1438 of 0.34.0): no request is
        prefilling, a one-token prefill over an existing context counting as a decode. None where the release asks no
        such question (``get_uniform_decode_token_count`` without ``decode_graph_eligible``) or the lengths are not
        given. A request whose query covers its whole sequence is a fresh prompt, so prefilling. Simplified: a request
        whose query is shorter than its sequence is taken as not prefilling (the scenario has no prompt lengths, so a
        chunked prefill's later chunk reads as a decode or a verify step)."""
        if seq_lens is None:
            return None
        try:
            from vllm.v1.worker.utils import get_uniform_decode_token_count
        except ImportError:
            return None
        if "decode_graph_eligible" not in _parameters(get_uniform_decode_token_count):
            return None
        return not any(int(q) >= int(s) for q, s in zip(query_lens, seq_lens))

    def _mixed_bound(self, query_lens):
        """``max_query_len`` the release's ``execute_model`` hands ``dispatch`` for a batch that is not all one-token
        decodes: the batch's longest query on 0.28.0 .. 0.30.0, None from 0.31.0 (a batch with a prefill: every
        such batch here; releases.json ``v2_runner.dispatch_max_query_len``)."""
        return max(query_lens) if self._release() in _v2_table("dispatch_max_query_len").get("batch", ()) else None

    def _release(self):
        return getattr(self.engine.vllm, "__version__", None)

    def _fill(self, query_lens, seq_lens, num_reqs_padded: int):
        """The runner's input buffers for a real batch (``prepare_inputs`` + its Triton ``prepare_pos_seq_lens``):
        query starts, padded starts = the token count; seq_lens, padded rows 0; the CPU upper bound."""
        import numpy as np
        import torch

        b = self.buffers
        n, t = len(query_lens), sum(query_lens)
        qsl = np.zeros(num_reqs_padded + 1, dtype=np.int32)
        qsl[1:n + 1] = np.cumsum(query_lens)
        qsl[n + 1:] = t
        b.query_start_loc.zero_()
        b.query_start_loc[:num_reqs_padded + 1] = torch.from_numpy(qsl)
        b.query_start_loc[num_reqs_padded + 1:] = t
        b.seq_lens.zero_()
        b.seq_lens[:n] = torch.tensor(seq_lens, dtype=torch.int32)
        upper = np.zeros(num_reqs_padded, dtype=np.int32)
        upper[:n] = seq_lens
        for table in self.tables:
            table[:num_reqs_padded].zero_()
        return qsl, torch.from_numpy(upper)

    def _input_batch(self, desc, query_lens, seq_lens):
        import numpy as np
        from vllm.v1.worker.gpu.input_batch import InputBatch

        n, t = len(query_lens), sum(query_lens)
        n_pad = desc.num_reqs or n
        t_pad = max(t, desc.num_tokens)
        dummy = InputBatch.make_dummy(n_pad, max(t_pad, n_pad), self.buffers)
        qsl, upper = self._fill(query_lens, seq_lens, n_pad)
        computed = np.array([k - q for q, k in zip(query_lens, seq_lens)], dtype=np.int32)
        # the fields the release's InputBatch has (seq_lens_cpu_upper_bound from 0.20, is_prefilling_np from 0.22,
        # num_computed_tokens_np from 0.23, max_query_len from 0.28); a release without one reads it nowhere
        optional = {"num_computed_tokens_np": computed, "is_prefilling_np": np.array([q > 1 for q in query_lens]),
                    "max_query_len": None, "seq_lens_cpu_upper_bound": upper}
        fields = _field_names(dummy)
        return dataclasses.replace(
            dummy, num_reqs=n, num_reqs_after_padding=n_pad,
            num_scheduled_tokens=np.array(query_lens, dtype=np.int32), num_tokens=t, num_tokens_after_padding=t_pad,
            query_start_loc=self.buffers.query_start_loc[:n_pad + 1], query_start_loc_np=qsl,
            seq_lens=self.buffers.seq_lens[:n_pad],
            **{k: v for k, v in optional.items() if k in fields})

    def _capture(self, desc, front) -> list:
        """Capture the FULL graph of ``desc`` (``prepare_inputs_to_capture``, then the layers' forward); the
        calls it made, per layer, as the graph will launch them."""
        from vllm.config.compilation import CUDAGraphMode
        from vllm.v1.worker.gpu.cudagraph_utils import prepare_inputs_to_capture

        # the release's own parameters (signature read): full_cudagraph from 0.27 (skip_attn 0.21 .. 0.26: False for
        # a FULL graph, as the release's capture passes it; neither before), max_query_len from 0.28
        params = _parameters(prepare_inputs_to_capture)
        full = desc.cg_mode == CUDAGraphMode.FULL
        extra = {k: v for k, v in (("full_cudagraph", full), ("skip_attn", not full)) if k in params}
        if "max_query_len" in params:   # the release's own argument (releases.json v2_runner.capture_max_query_len)
            extra["max_query_len"] = getattr(desc, "max_query_len", None)
            if self._release() not in _v2_table("capture_max_query_len").get("descriptor", ()):
                extra["max_query_len"] = extra["max_query_len"] or desc.uniform_token_count
        state = prepare_inputs_to_capture(
            desc.num_reqs or min(desc.num_tokens, self.s["max_num_seqs"]), desc.num_tokens, self.model_state,
            self.buffers, self.block_tables, self.attn_groups, self.kv_cache_config, **extra)
        # an AttentionState from 0.21, an (attention metadata, slot mappings) pair before
        metadata = state.attn_metadata if hasattr(state, "attn_metadata") else state[0]
        front.recording = []
        try:
            self._forward_layers(metadata, desc.num_tokens, lambda md, n: Config.forward(self, md, n))
        finally:
            calls, front.recording = front.recording, None
        return calls

    def step(self, query_lens, seq_lens, front):
        """One batch through the V2 runner's path; (metadata, path label, descriptor)."""
        from vllm.config.compilation import CUDAGraphMode

        desc = self.dispatch(query_lens, seq_lens)
        full = desc.cg_mode == CUDAGraphMode.FULL
        front.metadata_groups = sum(len(groups) for groups in self.attn_groups)  # each builder precomputes
        if full and desc not in self.captured:
            from gpu_impl.engines.vllm.graphs import capture_keeps_persistent_metadata

            with capture_keeps_persistent_metadata([g.get_metadata_builder(0) for gs in self.attn_groups for g in gs],
                                                   front):
                self.captured[desc] = self._capture(desc, front)
            front.capture_events.extend(front.drain())
        ib = self._input_batch(desc, query_lens, seq_lens)
        if self.numerics:
            raise Unsupported("numerics: not driven through the V2 runner (the first generation's numerics only)")
        metadata = self.model_state.prepare_attn(ib, desc.cg_mode,
                                                 tuple(t[:ib.num_reqs_after_padding] for t in self.tables),
                                                 self._slots(ib.num_tokens_after_padding), self.attn_groups,
                                                 self.kv_cache_config)
        md = next(iter(metadata.values()))
        self.steps_built += 1
        if full:
            front.replay(self.captured[desc])
            path = "full"
        else:
            tokens = desc.num_tokens if desc.cg_mode == CUDAGraphMode.PIECEWISE else ib.num_tokens
            self._forward_layers(metadata, tokens, self._forward_tokens)
            path = {CUDAGraphMode.PIECEWISE: "piecewise"}.get(desc.cg_mode, "none")
            if path == "none" and self.mode != CUDAGraphMode.NONE:
                path = ABOVE_GRAPHS
        self.draft_from = len(front.checker.events)  # the calls from here on are the drafter's
        if self.s["draft_tokens"] > 1:
            from gpu_impl.engines.vllm.drafter_v2 import run_drafts

            run_drafts(self, query_lens, seq_lens, front)
        return md, path, desc

    def _slots(self, num_tokens: int):
        import torch

        return torch.full((len(self.tables), num_tokens), -1, dtype=torch.int64)

    def _forward_layers(self, metadata: dict, num_tokens: int, forward) -> None:
        """``forward`` with each layer on its own attention group's metadata (the runner's dict: layer name ->
        metadata; one object for every layer where there is one group)."""
        self.local_md = metadata
        try:
            forward(next(iter(metadata.values())), num_tokens)
        finally:
            self.local_md = {}

    def padded_tokens(self, num_tokens: int) -> int:
        return num_tokens  # the V2 step passes the dispatched token count itself

    def _forward_tokens(self, md, num_tokens: int) -> None:
        Config.forward(self, md, num_tokens)
