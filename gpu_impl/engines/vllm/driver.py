"""The vLLM engine worker: runs decode/prefill batches through vLLM's own FlashAttention metadata builder and
attention implementation and reports every FA3 metadata precompute and every kernel call that consumed it.

Invariant: what is checked is what vLLM's code passed to FA3. ``FlashAttentionMetadataBuilder.build`` and
``FlashAttentionImpl.forward`` (``vllm/v1/attention/backends/flash_attn.py``) run unmodified, through the fork's
real Python wrapper (``vllm/vllm_flash_attn/flash_attn_interface.py``); only the compiled ``_vllm_fa3_C`` ops are
faked (``vllm_glue``), and they hand both sides to ``gpu_impl.fa3_calls.CheckingFA3`` (record mode, deep checks)
over a shape-only FA3 whose metadata comes from refmodel.

Two driver generations share this worker: ``v1`` (here: the V1 model runner's conventions -- padding, block-table
width, one ``build`` per step -- written from vLLM <= 0.33.0's ``gpu_model_runner.py``) and ``v2``
(``vllm_driver_v2``: the V2 runner's own dispatch, capture and metadata code, vLLM 0.34.0 on); the client names
which (``vllm_recipes.DRIVER_GENERATIONS``, environment variable ``FA3VERIFY_VLLM_DRIVER``), and a release that lacks
what its generation drives is refused at start with the list (``vllm_recipes.missing_for_generation``).

Run as ``python -m gpu_impl.engines.vllm.driver`` inside the vLLM engine environment (``envs``, recipe
``vllm_recipes``), project root and fakes on PYTHONPATH; the loop is ``protocol.serve``: one JSON request per stdin
line, one JSON response per stdout line. Requests:
``{"op": "hello"}``, ``{"op": "run", "scenario": {...}}`` (fields: :func:`scenario_defaults`), ``{"op": "quit"}``.
Every response has ``ok``; failures carry ``error`` and ``kind`` ("import", "unsupported", "bad_request", "crash").

Simplifications (also in docs/engines-vllm.md): the model is a stand-in object with the fields the builder reads
(vLLM's ``ModelConfig`` inspects the model class, which needs the model code and weights); the attention layers
are ``Attention`` objects built without ``Attention.__init__`` (which selects a backend through the CUDA
platform), each holding a real ``FlashAttentionImpl``; per-rank heads are ``H // tp`` and ``max(1, Hk // tp)`` as
vLLM's model layers compute them; the KV cache is one block that every block-table entry points to (no numerics
read it); a full-CUDA-graph batch is padded to its capture size as ``gpu_model_runner`` pads it (extra rows: one
query token, seq_len 0, null block), and the captured call is the one the Python forward makes for that padded
batch (capture and replay differ only in lengths there: the block table is the persistent full-width one).
Both sides are judged under the FA3 build refmodel/fa3_builds.json records for vLLM 0.33.0 (``vllm-fork-617264c1``:
the fork's tiles, decode tile choice, PackGQA rules, its call's ``seqlen_k = max_seqlen_k`` and its metadata
layout, Sort off with the split vector only when S > 1). With numerics on, the emulator computes the outputs;
it models upstream's kernel, so a numerics run is judged under upstream's build (each response names the build).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import time

from gpu_impl.engines.protocol import Unsupported, serve
from gpu_impl.engines.vllm.invariance import set_batch_invariance
from gpu_impl.engines.vllm.layers import attention_layer, layer_heads
from gpu_impl.engines.vllm.standins import DCPGroupStandIn, ModelStandIn, cumsum  # noqa: F401 - re-exported
from gpu_impl.engines.vllm.scenario import (  # noqa: F401 - re-exported (tests, clients)
    CUDA_GRAPH_MODES, DEFECT_FIELDS, GENERATION_VARIABLE, KV_CACHE_DTYPES, check_scenario, scenario_defaults)
from gpu_impl.engines.vllm.front import VLLM_BUILD, FrontFA3, ShapeOnlyFA3, seed_defect  # noqa: F401 - re-exported (tests, clients)

_PROTOCOL_OUT = sys.stdout


# ------------------------------------------------------------------------------------------------------------
# vLLM objects for one configuration
# ------------------------------------------------------------------------------------------------------------


class Config:
    """vLLM's config objects, the layers and the metadata builder for one scenario."""

    #: the model runner this configuration imitates (``ConfigV2``: "v2", whose attention groups are the release's own)
    RUNNER = "v1"

    def __init__(self, engine, s: dict, numerics: bool = False):
        import torch
        from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
        from vllm.config.compilation import CUDAGraphMode
        from gpu_impl.engines.vllm.recipes import locate

        Attention = locate("Attention")  # noqa: N806 - vLLM's class (moved in 0.16: GENERATION_MODULES)
        from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

        fa = engine.fa
        self.s = s
        self.numerics = numerics
        set_batch_invariance(s["batch_invariant"])
        dtype = getattr(torch, s["dtype"])
        vc = VllmConfig(compilation_config=CompilationConfig(max_cudagraph_capture_size=max(s["capture_sizes"])))
        mode = {"none": CUDAGraphMode.NONE, "piecewise": CUDAGraphMode.PIECEWISE, "full": CUDAGraphMode.FULL,
                "full_and_piecewise": CUDAGraphMode.FULL_AND_PIECEWISE}
        vc.compilation_config.cudagraph_mode = mode[s["cuda_graph"]]
        vc.compilation_config.cudagraph_capture_sizes = list(s["capture_sizes"])
        vc.compilation_config.max_cudagraph_capture_size = max(s["capture_sizes"])
        if hasattr(vc.compilation_config, "max_capture_size"):   # its name up to 0.11.0, where the builder reads it
            vc.compilation_config.max_capture_size = max(s["capture_sizes"])
        vc.scheduler_config.max_num_seqs = s["max_num_seqs"]
        vc.parallel_config.tensor_parallel_size = s["tp"]
        vc.parallel_config.decode_context_parallel_size = s["dcp"]
        vc.cache_config.cache_dtype = s["kv_cache_dtype"]
        vc.cache_config.block_size = s["block_size"]
        if hasattr(vc, "attention_config"):
            vc.attention_config.flash_attn_max_num_splits_for_cuda_graph = s["max_num_splits_for_cuda_graph"]
        else:  # up to 0.12 the builder reads the bound from vLLM's environment variable
            os.environ["VLLM_FLASH_ATTN_MAX_NUM_SPLITS_FOR_CUDA_GRAPH"] = str(s["max_num_splits_for_cuda_graph"])
        object.__setattr__(vc, "model_config", ModelStandIn(s, dtype))
        self.vc = vc
        #: the V1 runner's capture and replay (gpu_impl.engines.vllm.graphs); None: eager steps (numerics runs too)
        self.v1_graphs = None
        v1_graphs = engine.generation == "v1" and s["cuda_graph"] != "none" and not numerics
        if v1_graphs:
            from gpu_impl.engines.vllm.graphs import resolve_capture_sizes

            resolve_capture_sizes(vc, s)
        self.h = s["num_heads"] // s["tp"]
        self.hk = max(1, s["num_kv_heads"] // s["tp"])
        hetero = bool(s["layer_kv_heads"])
        if hetero:
            from gpu_impl.engines.vllm.heterolayers import check_driven, layer_kv_heads

            self.hk = check_driven(s, numerics, self.RUNNER) and layer_kv_heads(s, 0, s["tp"])
        self.dtype = dtype
        import vllm.distributed.parallel_state as ps

        ps._DCP = DCPGroupStandIn(s["dcp"]) if s["dcp"] > 1 else None
        if s["dcp"] > 1:
            try:
                from vllm.v1.worker import workspace
            except ImportError:   # releases before the workspace manager (0.11.x) need none
                workspace = None
            if workspace is not None and getattr(workspace, "_manager", None) is None:
                workspace.init_workspace_manager(torch.device("cpu"))
        windows = s["sliding_window"] or [None] * s["num_layers"]
        self.layers = {}
        # V's head size other than K's: vLLM's DiffKV backend (flash_attn_diffkv.py), the same metadata builder
        self.dv = s["head_dim_v"] or s["head_dim"]
        self.backend, impl_class = fa.FlashAttentionBackend, fa.FlashAttentionImpl
        if self.dv != s["head_dim"]:
            try:
                import vllm.v1.attention.backends.flash_attn_diffkv as diffkv
            except ImportError as exc:  # before 0.14.0 the release has no backend for it
                raise Unsupported(f"head_dim_v: this release has no backend whose V head size differs from K's "
                                  f"(vllm/v1/attention/backends/flash_attn_diffkv.py: {exc})") from exc

            self.backend, impl_class = diffkv.FlashAttentionDiffKVBackend, diffkv.FlashAttentionDiffKVImpl
            self.backend.set_head_size_v(self.dv)
            if hasattr(diffkv, "triton_reshape_and_cache_flash_diffkv"):
                # 0.14 .. 0.19: the impl writes the new K/V into the cache with a Triton kernel (CUDA); no FA3
                # argument reads the cache's contents in record mode (vllm_glue.FAKED lists it)
                if numerics:
                    raise Unsupported("head_dim_v: numerics with this release's DiffKV backend, whose cache write is "
                                      "a Triton kernel (triton_reshape_and_cache_flash_diffkv), not run on CPU")
                diffkv.triton_reshape_and_cache_flash_diffkv = lambda *args, **kwargs: None
        v_size = {"head_size_v": self.dv} if self.dv != s["head_dim"] else {}
        chunks = s["attention_chunk_size"] or [None] * s["num_layers"]
        if any(chunks) and self.dv != s["head_dim"]:
            raise Unsupported("attention_chunk_size: chunked local layers over the DiffKV backend are not driven")
        if any(chunks) and hetero:
            raise Unsupported("attention_chunk_size: chunked local layers with layer_kv_heads are not driven")
        with set_current_vllm_config(vc):
            for i, w in enumerate(windows):
                layer_impl = impl_class
                if chunks[i] is not None:  # the release's wrapped backend's impl (gpu_impl.engines.vllm.local)
                    from gpu_impl.engines.vllm.local import chunked_backend

                    layer_impl = chunked_backend(self.backend, chunks[i], s["block_size"]).get_impl_cls()
                hk = layer_kv_heads(s, i, s["tp"]) if hetero else self.hk
                impl = layer_impl(num_heads=layer_heads(s, i, len(windows), self.h, hk), head_size=s["head_dim"],
                                  scale=s["head_dim"] ** -0.5, num_kv_heads=hk, alibi_slopes=None,
                                  sliding_window=w, kv_cache_dtype=s["kv_cache_dtype"],
                                  logits_soft_cap=s["logits_soft_cap"] or None)
                layer = attention_layer(Attention, impl, i)
                vc.compilation_config.static_forward_context[layer.layer_name] = layer
                self.layers[layer.layer_name] = layer
            kv_dtype = torch.uint8 if s["kv_cache_dtype"] == "fp8" else dtype
            w0 = windows[0]
            # 0.10.1 .. 0.10.2's AttentionSpec has a required use_mla field (no MLA is driven here)
            mla = {"use_mla": False} if "use_mla" in {f.name for f in dataclasses.fields(FullAttentionSpec)} else {}
            windowed = any(w is not None for w in windows)
            if v_size and windowed and "head_size_v" not in {f.name for f in dataclasses.fields(SlidingWindowSpec)}:
                # 0.14 .. 0.19: the DiffKV backend exists, but the sliding-window KV-cache spec has no V head size
                raise Unsupported("head_dim_v: with a sliding window, this release's SlidingWindowSpec "
                                  "(vllm/v1/kv_cache_interface.py) has no head_size_v field: not driven")
            if w0 is not None and len(set(windows)) == 1:
                spec = SlidingWindowSpec(block_size=s["block_size"], num_kv_heads=self.hk, head_size=s["head_dim"],
                                         dtype=kv_dtype, sliding_window=w0, **v_size, **mla)
            else:
                spec = FullAttentionSpec(block_size=s["block_size"], num_kv_heads=self.hk, head_size=s["head_dim"],
                                         dtype=kv_dtype, **v_size, **mla)
            impl = next(iter(self.layers.values())).impl
            if s["kv_cache_dtype"] == "fp8" and not getattr(impl, "supports_quant_query_input", getattr(
                    self.backend, "supports_quant_query_input", False)) and \
                    "scaled_fp8_quant" in inspect.getsource(type(impl).forward):
                # 0.10.1 .. 0.10.2 (as 0.8.5 .. 0.10.0): the impl quantizes the query itself with a compiled CUDA op
                raise Unsupported(f"kv_cache_dtype: fp8 in this release's FlashAttentionImpl.forward quantizes the "
                                  f"query with the compiled _C op scaled_fp8_quant (CUDA), not faked")
            groups = [(spec, list(self.layers))]
            #: how the layers' KV-cache groups were made (layers that differ: vLLM's grouping, or why stood in)
            self.grouping: list = []
            #: the release's own KV-cache groups of layers that differ (the V2 runner's attention groups' input)
            self.kv_groups_raw: list = []
            if hetero:  # each layer's own spec, grouped by the release's KV-cache grouping
                from gpu_impl.engines.vllm.heterolayers import layer_groups

                groups = layer_groups(vc, self.layers, windows, dict(block_size=s["block_size"],
                                      head_size=s["head_dim"], dtype=kv_dtype, **v_size, **mla), self.grouping,
                                      raw=self.kv_groups_raw)
                spec = groups[0][0]
            try:
                if hetero:
                    builders = [(fa.FlashAttentionMetadataBuilder(g_spec, names, vc, torch.device("cpu")), names)
                                for g_spec, names in groups]
                else:
                    # the full-attention layers' group (every layer where none is chunked: a builder is always there)
                    main = [n for n, c in zip(self.layers, chunks) if c is None] or list(self.layers)
                    builders = [(fa.FlashAttentionMetadataBuilder(spec, main, vc, torch.device("cpu")), main)]
            except AssertionError as exc:   # the release's own check of its layers (0.34.0: one num_heads per group)
                raise Unsupported(f"vLLM's metadata builder refuses these layers: {exc}") from exc
            from gpu_impl.engines.vllm.heterolayers import GroupedBuilder

            self.builder = GroupedBuilder(builders) if hetero else builders[0][0]
            #: each layer's KV-cache spec (its attention group's)
            self.layer_specs = {name: g_spec for g_spec, names in groups for name in names}
            #: the chunked local layers' attention groups (None: no chunked layer), over the same KV-cache group
            self.local = None
            if any(chunks) and self.RUNNER == "v1":  # the V2 runner's: driver_v2 (the release's init_attn_backend)
                from gpu_impl.engines.vllm.local import LocalGroups

                names = list(self.layers)
                self.local = LocalGroups(vc, s, self.backend, spec, {names[i]: c for i, c in enumerate(chunks)
                                                                     if c is not None}, torch.device("cpu"))
            self.local_md: dict = {}
        # the KV cache as the release's backend lays it out (``get_kv_cache_shape``: K and V packed in the last
        # dimension from 0.26, a separate K/V dimension before); the packed layout where the backend does not say
        get_shape = getattr(self.backend, "get_kv_cache_shape", None)

        def cache_shape(hk: int, block_size: int) -> tuple:
            packed = (1, hk, block_size, s["head_dim"] + self.dv)
            if get_shape is not None:  # the DiffKV backend lays K and V out with their own head sizes
                try:
                    args = (1, block_size, hk, s["head_dim"], s["kv_cache_dtype"])
                    # 0.10.1 .. 0.10.2 take no cache dtype (four parameters)
                    return tuple(get_shape(*args[:len(inspect.signature(get_shape).parameters)])), packed
                except NotImplementedError:
                    pass
            return packed, packed

        shape, packed = cache_shape(self.hk, s["block_size"])
        if numerics and shape != packed:
            raise Unsupported(f"numerics: the emulator's KV cache is the packed layout {packed}; this release's "
                              f"backend lays it out as {shape} (get_kv_cache_shape)")
        self.kv_cache = torch.zeros(shape, dtype=kv_dtype)
        #: a layer whose attention group's spec differs from the first: its own cache, at its group's heads and
        #: block size (the release's grouping may grow a group's block size to unify page sizes)
        self.kv_caches = {}
        for name, g_spec in self.layer_specs.items():
            if g_spec is not spec:
                self.kv_caches[name] = torch.zeros(cache_shape(g_spec.num_kv_heads, g_spec.block_size)[0],
                                                   dtype=kv_dtype)
        self.spec = spec
        self.max_blocks = self.table_width(spec)
        self.steps_built = 0
        if v1_graphs:
            from gpu_impl.engines.vllm.graphs import V1Graphs

            self.v1_graphs = V1Graphs(self, getattr(engine.vllm, "__version__", None))

    def table_width(self, spec) -> int:
        """The model runner's per-rank block-table width (gpu_model_runner -> BlockTable): the spec's blocks per
        request (under DCP a sharded cache holds max_model_len / dcp tokens per rank), aligned as the release aligns
        it: by ``get_block_table_width`` (0.27 on), else by the release's own ``MultiGroupBlockTable``, built here as
        the runner builds it for one KV-cache group (before 0.27 the alignment lives in its constructor)."""
        import vllm.v1.worker.block_table as bt

        blocks = self._blocks_per_request(spec)
        if hasattr(bt, "get_block_table_width"):
            return bt.get_block_table_width(blocks, self.s["block_size"])
        import inspect

        import torch

        given = {"max_num_reqs": self.s["max_num_seqs"], "max_num_batched_tokens": self.s["max_num_batched_tokens"],
                 "pin_memory": False, "device": torch.device("cpu"), "block_sizes": [self.s["block_size"]],
                 "kernel_block_sizes": [self.s["block_size"]], "max_num_blocks": [blocks],
                 "max_model_len": self.s["max_model_len"]}
        params = inspect.signature(bt.MultiGroupBlockTable).parameters
        table = bt.MultiGroupBlockTable(**{k: v for k, v in given.items() if k in params})
        return table.block_tables[0].max_num_blocks_per_req

    def _blocks_per_request(self, spec) -> int:
        """KV-cache blocks per request before alignment: the KV-cache spec's ``max_num_blocks_per_req`` (0.26 on);
        before, the V1 runner's own inline rule (``gpu_model_runner.may_reinitialize_input_batch``, e.g. 0.25.1 line
        7039): ``cdiv(max_model_len, block_size * total CP world size)``, the world size from vLLM's
        ``get_total_cp_world_size`` where the release has it (DCP x PCP), else DCP's (releases whose
        ``MultiGroupBlockTable`` takes ``max_model_len`` compute it themselves and ignore this number)."""
        if hasattr(spec, "max_num_blocks_per_req"):
            return spec.max_num_blocks_per_req(self.vc, self.s["max_model_len"])
        try:
            from vllm.v1.worker.cp_utils import get_total_cp_world_size
        except ImportError:
            world = self.s["dcp"]
        else:
            world = get_total_cp_world_size()
        return -(-self.s["max_model_len"] // (self.s["block_size"] * world))

    def batch(self, query_lens, seq_lens, pad: bool = True):
        """vLLM's CommonAttentionMetadata for one batch (padded to a capture size under full CUDA graph unless
        ``pad`` is false: a cascade step, which the V1 runner never dispatches to a FULL graph)."""
        import torch
        from gpu_impl.engines.vllm.recipes import locate

        CommonAttentionMetadata = locate("CommonAttentionMetadata")  # noqa: N806 - vLLM's class

        s = self.s
        q, k = list(query_lens), list(seq_lens)
        if pad and s["cuda_graph"] == "full" and sum(q) <= max(s["capture_sizes"]) and max(q) == 1:
            pad = next(x for x in s["capture_sizes"] if x >= len(q)) - len(q)
            q, k = q + [1] * pad, k + [0] * pad
        qsl = torch.tensor([0] + list(cumsum(q)), dtype=torch.int32)
        n = len(k)
        table = torch.zeros(n, self.max_blocks, dtype=torch.int32)
        if self.numerics:
            from gpu_impl.engines.vllm.numerics import numerics_kv

            self.kv_cache, table = numerics_kv(self.hk, s["block_size"], s["head_dim"], self.dtype, k,
                                               self.max_blocks, seed=s["seed"] + 7919 * self.steps_built)
        self.steps_built += 1
        import dataclasses

        seq_lens = torch.tensor(k, dtype=torch.int32)
        given = dict(query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens,
                     num_reqs=n, num_actual_tokens=int(sum(q)), max_query_len=max(q), max_seq_len=max(k),
                     block_table_tensor=table, slot_mapping=torch.zeros(int(sum(q)), dtype=torch.int64), causal=True,
                     # the CPU copies the V1 runner hands over (fields of the release's dataclass, by release:
                     # seq_lens_cpu / num_computed_tokens_cpu up to 0.12, seq_lens_cpu_upper_bound from 0.20)
                     seq_lens_cpu=seq_lens.clone(), seq_lens_cpu_upper_bound=seq_lens.clone(),
                     num_computed_tokens_cpu=seq_lens - torch.tensor(q, dtype=torch.int32))
        fields = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
        return CommonAttentionMetadata(**{name: v for name, v in given.items() if name in fields})

    def step(self, query_lens, seq_lens, front):
        """One batch the first generation's way: (metadata, path label, None)."""
        from gpu_impl.engines.vllm.paths import cascade_prefix_len

        prefix = cascade_prefix_len(self, query_lens, seq_lens)  # the release's rule; 0: no cascade
        if self.v1_graphs is not None and prefix == 0:
            return self._drafts(query_lens, seq_lens, front, self.v1_graphs.step(query_lens, seq_lens, front))
        # a cascade step runs without a FULL graph (the V1 runner's dispatch takes no full graph for cascade)
        if self.s["cuda_graph"] == "full_and_piecewise" and self.v1_graphs is None:
            raise Unsupported("cuda_graph: full_and_piecewise: the V1 runner's dispatch is not imitated with numerics "
                              "(graphs.V1Graphs runs record mode only)")
        cam = self.batch(query_lens, seq_lens, pad=prefix == 0)
        md = self.build(prefix, cam)
        self.forward(md, cam.num_actual_tokens)
        return self._drafts(query_lens, seq_lens, front, (md, self.s["cuda_graph"], None))

    def build(self, prefix: int, cam):
        """The step's metadata: the full-attention layers' builder's, and each chunked local group's own
        (``self.local_md``: layer name -> metadata; the release's wrapped builders, ``gpu_impl.engines.vllm.local``)."""
        md = self.builder.build(prefix, cam)
        if self.local is not None:
            self.local_md = self.local.build(prefix, cam)
        return md

    def _drafts(self, query_lens, seq_lens, front, result):
        """After a step: the drafter's metadata for each draft step (the builder's ``build_for_drafting``, eager), its
        calls marked from ``draft_from`` on; ``result``, the step's own (metadata, path label, summary)."""
        from gpu_impl.engines.vllm.paths import draft_steps

        self.draft_from = len(front.checker.events)  # the calls from here on are the drafter's
        for index, (dq, dk) in enumerate(draft_steps(self, query_lens, seq_lens)):
            dcam = self.batch(dq, dk, pad=False)
            self.forward(self.builder.build_for_drafting(common_attn_metadata=dcam, draft_index=index),
                         dcam.num_actual_tokens)
        return result

    def padded_tokens(self, num_tokens: int) -> int:
        """The tokens the layers see: under piecewise CUDA graphs the hidden states are padded to the capture size
        (``gpu_model_runner``: ``num_tokens_padded``) while the attention metadata is not (``pad_attn`` only under
        FULL), so the attention runs eagerly on ``query[:num_actual_tokens]``; otherwise the batch's own count."""
        s = self.s
        if getattr(self, "v1_graphs", None) is not None:
            return num_tokens  # the V1 runner's dispatcher padded the count already (graphs.V1Graphs.step)
        if s["cuda_graph"] == "piecewise" and num_tokens <= max(s["capture_sizes"]):
            return next(x for x in s["capture_sizes"] if x >= num_tokens)
        return num_tokens

    def forward(self, md, num_tokens: int) -> None:
        import torch
        from vllm.config import set_current_vllm_config

        s = self.s
        num_tokens = self.padded_tokens(num_tokens)
        with set_current_vllm_config(self.vc):
            for layer in self.layers.values():
                # the flag sits on the impl, or on the backend class up to 0.11.0
                quant_q = getattr(layer.impl, "supports_quant_query_input",
                                  getattr(self.backend, "supports_quant_query_input", False))
                qd = torch.float8_e4m3fn if (s["kv_cache_dtype"] == "fp8" and quant_q) else self.dtype
                h = layer.impl.num_heads
                if self.numerics:
                    gen = torch.Generator().manual_seed(s["seed"] + 104729 * self.steps_built)
                    query = torch.randn(num_tokens, h, s["head_dim"], generator=gen).to(qd)
                else:
                    query = torch.zeros(num_tokens, h, s["head_dim"], dtype=qd)
                hk = layer.impl.num_kv_heads
                key = torch.zeros(num_tokens, hk, s["head_dim"], dtype=self.dtype)
                value = torch.zeros(num_tokens, hk, self.dv, dtype=self.dtype)
                out = torch.zeros(num_tokens, h, self.dv, dtype=self.dtype)
                own = getattr(self.builder, "metadata_for", None)  # several attention groups: the layer's own
                layer_md = self.local_md.get(layer.layer_name)
                if layer_md is None:
                    layer_md = own(layer.layer_name, md) if own else md
                layer.impl.forward(layer, query, key, value, self.kv_caches.get(layer.layer_name, self.kv_cache),
                                   layer_md, out)


class Engine:
    """vLLM imported once, with the CPU glue; runs scenarios."""

    #: the requests ``protocol.serve`` dispatches to methods (besides hello and quit)
    OPS = ("run", "validate")

    def __init__(self):
        t = time.monotonic()
        from gpu_impl.engines.vllm import glue as vllm_glue

        vllm_glue.install()
        import torch

        torch.set_num_threads(1)
        import vllm
        import vllm.v1.attention.backends.flash_attn as fa

        self.vllm, self.fa, self.glue = vllm, fa, vllm_glue
        self.generation = os.environ.get(GENERATION_VARIABLE) or "v1"
        from gpu_impl.engines.vllm.recipes import GENERATION_MODULES, locate, missing_for_generation

        if self.generation in GENERATION_MODULES:
            missing = missing_for_generation(self.generation, os.environ.get("FA3VERIFY_VLLM_SOURCE"))
            if missing:
                raise ImportError(f"vllm {getattr(vllm, '__version__', '?')} lacks what driver generation "
                                  f"{self.generation} drives: {'; '.join(missing)}")
        if self.generation == "v2":
            from gpu_impl.engines.vllm.driver_v2 import ConfigV2

            self.config_class = ConfigV2
        elif self.generation == "v1":
            self.config_class = Config
        elif self.generation == "v0":  # the runner-bound builder of 0.8.5 .. 0.10.0 (driver_v0)
            from gpu_impl.engines.vllm.driver_v0 import ConfigV0

            self.config_class = ConfigV0
        else:
            raise ValueError(f"{GENERATION_VARIABLE}: v0, v1 or v2, got {self.generation!r}")
        self.fa_version = locate("get_flash_attn_version")()  # fa_utils moved in 0.14 (COMMON_MODULES)
        self.import_s = time.monotonic() - t
        self._patch_dcp_combine()

    def _patch_dcp_combine(self) -> None:
        """The DCP LSE all-gather/reduce is communication: a shape-only stand-in (listed in vllm_glue.FAKED)."""
        def combine(out, lse, group, *args, **kwargs):
            heads = out.shape[1] // group.world_size  # the rank's own heads after the reduce-scatter
            return out[:, :heads].contiguous(), lse[:, :heads].contiguous()

        def merge(output, *args, **kwargs):
            return None  # merges two partial outputs into ``output``: numerics only, none in record mode

        self.fa.cp_lse_ag_out_rs = combine
        self.fa.dcp_a2a_lse_reduce = combine
        self.fa.merge_attn_states = merge

    def hello(self) -> dict:
        return {"release": getattr(self.vllm, "__version__", None), "path": os.path.dirname(self.vllm.__file__),
                "import_s": round(self.import_s, 2), "fa_version": self.fa_version,
                "faked": list(self.glue.FAKED) + list(self._faked_local()),
                "driver": self.generation, "stood_in": list(self._stood_in())}

    def _faked_local(self) -> tuple:
        """What the chunked local path fakes (the first and second generations; gpu_impl.engines.vllm.local)."""
        if self.generation not in ("v1", "v2"):
            return ()
        from gpu_impl.engines.vllm.local import FAKED_LOCAL

        return FAKED_LOCAL

    def _stood_in(self) -> tuple:
        """What the driver generation itself stands in for (the second generation's runner pieces)."""
        if self.generation == "v0":
            from gpu_impl.engines.vllm.driver_v0 import STOOD_IN

            return STOOD_IN
        if self.generation != "v2":
            from gpu_impl.engines.vllm.graphs import STOOD_IN_V1
            from gpu_impl.engines.vllm.heterolayers import STOOD_IN as LAYERS_STOOD_IN
            from gpu_impl.engines.vllm.paths import STOOD_IN as PATHS_STOOD_IN

            return tuple(PATHS_STOOD_IN) + tuple(STOOD_IN_V1) + tuple(LAYERS_STOOD_IN) + self._v2_runner_stood_in()
        from gpu_impl.engines.vllm.drafter_graphs import STOOD_IN as DRAFT_GRAPHS_STOOD_IN
        from gpu_impl.engines.vllm.drafter_v2 import STOOD_IN as DRAFTER_STOOD_IN
        from gpu_impl.engines.vllm.driver_v2 import STOOD_IN
        from gpu_impl.engines.vllm.heterolayers import STOOD_IN as LAYERS_STOOD_IN, STOOD_IN_V2

        return (tuple(STOOD_IN) + tuple(DRAFTER_STOOD_IN) + tuple(DRAFT_GRAPHS_STOOD_IN) + tuple(LAYERS_STOOD_IN)
                + tuple(STOOD_IN_V2))

    def _v2_runner_stood_in(self) -> tuple:
        """What the V2 runner's generation stands in for on a release whose V2 runner a case may ask for (releases.json
        ``v2_runner.driven``), each line naming that generation."""
        import importlib

        from gpu_impl.engines.vllm import recipes

        release = getattr(self.vllm, "__version__", None)
        if release not in recipes.v2_runner_table("driven"):
            return ()
        generation = recipes.v2_runner_generation(release)
        module = importlib.import_module(recipes.V2_RUNNER_CONFIGS[generation].split(":")[0])
        return tuple(f"the V2 runner (driver generation {generation}): {line}" for line in module.STOOD_IN)

    def _runner(self, asked):
        """(runner, config class) for a scenario's ``runner``: the worker's own generation, or the V2 runner of a
        release the first generation drives and that ships both (refused, naming what it lacks, where it cannot)."""
        runner = asked or self.generation
        if runner == self.generation:
            return runner, self.config_class
        if runner == "v1":
            raise Unsupported("runner: v1 is not driven on a release driven through its V2 runner (driver v2)")
        from gpu_impl.engines.vllm.recipes import missing_for_generation, v2_runner_config, v2_runner_generation

        # releases.json v2_runner.generation: v2, or v2first / v2early for 0.12.0 .. 0.17.1's earlier runner APIs
        generation = v2_runner_generation(getattr(self.vllm, "__version__", None))
        if getattr(self, "_v2_missing", None) is None:
            self._v2_missing = missing_for_generation(generation, os.environ.get("FA3VERIFY_VLLM_SOURCE"))
        if self._v2_missing:
            raise Unsupported(f"runner: v2 (driver generation {generation}) needs what this release lacks: "
                              f"{'; '.join(self._v2_missing)}")
        return runner, v2_runner_config(generation)

    def validate(self, scenario: dict) -> dict:
        """vLLM's own config validation of a scenario's configuration (``vllm_validation``)."""
        from gpu_impl.engines.vllm.validation import validate_vllm_config

        return validate_vllm_config(check_scenario(scenario))

    def run(self, scenario: dict, numerics: bool = False) -> dict:
        """One scenario through vLLM's builder and impl; ``numerics``: every call on the emulator, outputs judged
        against the oracle (``vllm_numerics``; off by default: record mode)."""
        from gpu_impl.engines.vllm.paths import step_labels
        from gpu_impl.fa3_calls import pair_summary

        s = check_scenario(dict(scenario))
        if numerics:
            from gpu_impl.engines.vllm.numerics import check_numerics_scenario

            check_numerics_scenario(s)
        if self.fa_version != 3:
            raise Unsupported(f"vLLM chose FlashAttention {self.fa_version}, not 3: nothing precomputes metadata")
        runner, config_class = self._runner(s["runner"])
        front = seed_defect(FrontFA3(s["num_sm"], numerics=bool(numerics), lifecycle_defect=s["lifecycle_defect"]),
                            s["defect"])
        self.glue.front.target = front
        t = time.monotonic()
        cfg = config_class(self, s, numerics=bool(numerics))
        out = {"findings": [], "shape_errors": [], "trace": [], "setup_s": round(time.monotonic() - t, 3),
               "fa3_build": front.build}
        out["unchecked_calls"] = 0
        if getattr(cfg, "grouping", None):
            out["kv_cache_grouping"] = cfg.grouping[-1]
        for index, st in enumerate(s["steps"]):
            t = time.monotonic()
            front.where, front.real_rows = (index, 0), len(st["seq_lens"])
            md, path, desc = cfg.step(st["query_lens"], st["seq_lens"], front)
            captured, front.capture_events = front.capture_events, []
            drained = front.drain()
            sources = front.drain_sources() if hasattr(front, "drain_sources") else []
            pairs = ([("capture", e, None) for e in captured]
                     + [(None, e, sources[i] if i < len(sources) else None) for i, e in enumerate(drained)])
            draft_from = len(captured) + getattr(cfg, "draft_from", len(drained))
            for number, (origin, (pre, call, violations), source) in enumerate(pairs):
                summary = pair_summary(pre, call)
                drafter = number >= draft_from
                entry = {"step": index, "mode": "decode" if max(st["query_lens"]) == 1 else "mixed",
                         "path": f"{path}: capture" if origin else path, "max_num_splits": getattr(md, "max_num_splits", 0),
                         "aot": (pre is not None) if drafter else md.scheduler_metadata is not None, **summary,
                         "reached": step_labels(s, st["query_lens"], st["seq_lens"], None if drafter else md,
                                                runner, drafter=drafter)}
                graphed = getattr(cfg, "draft_graph", {}).get(number - len(captured)) if drafter else None
                if graphed:  # a draft call inside the V2 speculator's FULL draft-decode graph (drafter_graphs)
                    from gpu_impl.engines.vllm.drafter_graphs import PATH as DRAFT_GRAPH

                    entry["path"] = f"full: draft {graphed}"
                    entry["reached"].append(DRAFT_GRAPH)
                if source is not None and any(source.values()):
                    entry["source"] = source
                if desc is not None:
                    entry["graph"] = {"num_tokens": desc.num_tokens, "num_reqs": desc.num_reqs,
                                      "max_query_len": getattr(desc, "max_query_len", None),  # 0.28 on
                                      "uniform_token_count": desc.uniform_token_count}
                out["trace"].append(entry)
                for v in violations:
                    d = v.to_dict() if hasattr(v, "to_dict") else {"invariant": v.invariant, "message": str(v)}
                    finding = {"invariant": d.get("invariant", v.invariant), "step": index, "dp_rank": None,
                               "message": d.get("message", str(v)),
                               "detail": {"s_p": summary["s_p"], "s_c": summary["s_c"], "mode": entry["mode"],
                                          "path": entry["path"], **({"drafter": True} if drafter else {}),
                                          "seq_lens": list(st["seq_lens"]), **d}}
                    if finding["invariant"] == "SHAPE" and desc is not None and origin is None and (
                            path == "full" and not drafter or graphed == "replay"):
                        finding["message"] = ("at a CUDA-graph replay FA3 checks nothing, so the captured kernel reads "
                                              "the recompute at the captured layout (a silent layout mismatch): "
                                              + finding["message"].replace(": FA3 raises, a loud and safe error",
                                                                           ""))
                        finding["detail"]["replay"] = True
                        out["findings"].append(finding)
                        continue
                    (out["shape_errors"] if finding["invariant"] == "SHAPE" else out["findings"]).append(finding)
            mode = "decode" if max(st["query_lens"]) == 1 else "mixed"
            for invariant, message, detail in front.drain_outputs():
                out["findings"].append({"invariant": invariant, "step": index, "dp_rank": None, "message": message,
                                        "detail": {"mode": mode, "path": s["cuda_graph"],
                                                   "seq_lens": list(st["seq_lens"]), **detail}})
            out["trace"].append({"step": index, "seconds": round(time.monotonic() - t, 3),
                                 # the step's paths, whether or not a call on them consumed metadata
                                 "reached": step_labels(s, st["query_lens"], st["seq_lens"], md, runner),
                                 **({"numerics": "emulator"} if numerics else {})})
        out["unchecked_calls"] = front.unchecked_calls
        return out


if __name__ == "__main__":
    sys.stdout = sys.stderr  # nothing but responses on the protocol stream
    from gpu_impl.engines.protocol import exit_worker

    exit_worker(serve(Engine, sys.stdin, _PROTOCOL_OUT))
