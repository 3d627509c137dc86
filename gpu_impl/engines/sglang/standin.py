"""Our own minimal stand-in for sglang's attention test kit, for the releases that predate it (0.5.11, 0.5.12):
a model runner, a decode forward batch and the CUDA-graph capture/replay metadata calls, built from what those
releases' ``FlashAttentionBackend`` reads (``python/sglang/srt/layers/attention/flashattention_backend.py``,
``__init__``, ``init_forward_metadata``, ``forward_decode``, ``init_cuda_graph_state``,
``init_forward_metadata_capture_cuda_graph`` / ``..._replay_cuda_graph``).

Invariant: everything the backend consumes that carries behaviour is the release's own class -- ``ServerArgs``
(its dataclass defaults, then the layout), ``ReqToTokenPool``, ``MHATokenToKVPool``, ``ForwardBatch`` (which in
these releases carries the pools), ``ForwardMode``, ``RadixAttention``, the ``fa3`` entry of
``ATTENTION_BACKENDS`` -- and the graph calls pass what those releases' ``cuda_graph_runner.py`` passes
(capture: rows of the fill length 1, ``num_tokens == bs``; replay: the padded batch with ``seq_lens_cpu``).
Written from reading those files; nothing of sglang's later test kit or backend is copied.

What is ours (a stand-in, listed): the runner object (only the attributes the backend reads), the model
config (the attention shapes of ``spec.model.config.ModelConfig``; no softcap field), and ``ServerArgs`` built
without its ``__post_init__`` (which resolves a model from disk and probes the device). It exposes the names
``sglang_rank.RankBackend`` reads from a kit (``DenseAttentionCase``, ``TinyModelConfig``, ``MockModelRunner``,
``MHATokenToKVPool``, ``_make_forward_batch``, ``ATTENTION_BACKENDS``, ``RadixAttention``, ``ForwardMode``) plus
the two graph calls (``legacy_capture_metadata``, ``_init_cuda_graph_replay_metadata``). Runs inside an engine
environment; :func:`load` imports sglang.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace

#: Bound by :func:`load` to the release's own classes (module globals, so the driver can cap the KV pool).
ForwardMode = MHATokenToKVPool = ReqToTokenPool = ForwardBatch = RadixAttention = ATTENTION_BACKENDS = None
_AttentionArch = None
_loaded = False


def load() -> dict:
    """Import the release's classes this stand-in builds on; returns the kit view ``{"dense", "graph"}``."""
    global ForwardMode, MHATokenToKVPool, ReqToTokenPool, ForwardBatch, RadixAttention, ATTENTION_BACKENDS
    global _AttentionArch, _loaded
    if not _loaded:
        from sglang.srt.configs.model_config import AttentionArch
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS as registry
        from sglang.srt.layers.radix_attention import RadixAttention as radix
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool as kv_pool
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool as req_pool
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch as batch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode as mode

        ForwardMode, MHATokenToKVPool, ReqToTokenPool, ForwardBatch = mode, kv_pool, req_pool, batch
        RadixAttention, ATTENTION_BACKENDS, _AttentionArch = radix, registry, AttentionArch
        _loaded = True
    import sys

    me = sys.modules[__name__]
    return {"dense": me, "graph": me}


@dataclass(frozen=True)
class DenseAttentionCase:
    """One decode batch's shape: rows with ``prefix_lens[i]`` cached tokens plus the token being decoded."""

    name: str
    backend: str
    forward_mode: object
    num_heads: int
    num_kv_heads: int
    page_size: int
    prefix_lens: tuple

    @property
    def batch_size(self) -> int:
        return len(self.prefix_lens)

    @property
    def seq_lens(self) -> tuple:
        return tuple(int(p) + 1 for p in self.prefix_lens)


class TinyModelConfig:
    """The model config fields the backend reads: attention shapes, context length, architecture flags."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, hidden_size: int, context_len: int):
        self.num_attention_heads = num_heads
        self.num_key_value_heads = num_kv_heads
        self.head_dim = head_dim
        self.v_head_dim = head_dim
        self.hidden_size = hidden_size
        self.context_len = context_len
        # no attn_logit_softcapping field: has_softcap is False, as for the models the driver runs
        self.hf_text_config = SimpleNamespace(num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                                              hidden_size=hidden_size, head_dim=head_dim)
        self.hf_config = self.hf_text_config
        self.attention_arch = _AttentionArch.MHA
        self.is_encoder_decoder = False
        self.is_local_attention_model = False
        self.is_multimodal = False

    def get_num_kv_heads(self, tp_size: int) -> int:
        return max(1, self.num_key_value_heads // tp_size)


def _server_args(**fields):
    """The release's ``ServerArgs`` with its dataclass defaults (no ``__post_init__``), then ``fields``."""
    from sglang.srt.server_args import ServerArgs

    from gpu_impl.engines.sglang.glue import set_field

    args = object.__new__(ServerArgs)
    for f in dataclasses.fields(ServerArgs):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None
        object.__setattr__(args, f.name, value)
    for name, value in fields.items():
        set_field(args, name, value)
    return args


class MockModelRunner:
    """The model runner fields ``FlashAttentionBackend.__init__`` reads in 0.5.11 / 0.5.12 (one layer, no SWA,
    no speculative decoding), with the release's own pools; the parallel layout is written by
    ``sglang_glue.apply_runner_layout`` afterwards (``tp_size``, ``attn_cp_size``, server-args fields)."""

    def __init__(self, *, case, model_config, dtype, device: str, max_context_len: int, head_dim: int,
                 disable_cuda_graph: bool = True, runner_batch_size=None):
        pool_bs = runner_batch_size or case.batch_size
        self.device, self.dtype, self.kv_cache_dtype = device, dtype, dtype
        self.gpu_id = 0
        self.page_size = case.page_size
        self.model_config = model_config
        self.tp_size = self.dp_size = self.pp_size = self.attn_cp_size = 1
        self.sliding_window_size = None
        self.attention_chunk_size = None
        self.is_hybrid_swa = False
        self.use_mla_backend = False
        self.is_draft_worker = False
        self.server_args = _server_args(
            attention_backend="fa3", decode_attention_backend=None, prefill_attention_backend=None,
            kv_cache_dtype="auto", disable_cuda_graph=disable_cuda_graph, enable_deterministic_inference=False,
            is_embedding=False, chunked_prefill_size=-1, disable_radix_cache=False, speculative_algorithm=None,
            speculative_eagle_topk=None, speculative_num_draft_tokens=None, speculative_num_steps=None,
            tp_size=1, dp_size=1, enable_dp_attention=False, page_size=case.page_size)
        try:
            from sglang.srt.server_args import set_global_server_args_for_scheduler
        except ImportError:
            pass
        else:
            set_global_server_args_for_scheduler(self.server_args)
        self.req_to_token_pool = ReqToTokenPool(size=pool_bs, max_context_len=max_context_len, device=device,
                                                enable_memory_saver=False)
        size = case.page_size + pool_bs * max_context_len
        self.token_to_kv_pool = MHATokenToKVPool(size=size + case.page_size, page_size=case.page_size,
                                                 dtype=dtype, head_num=case.num_kv_heads, head_dim=head_dim,
                                                 layer_num=1, device=device, enable_memory_saver=False,
                                                 enable_alt_stream=False)
        #: the pools a forward batch carries (the driver may swap ``req_to_token_pool`` while building one)
        self.pools = (self.req_to_token_pool, self.token_to_kv_pool)


def _make_forward_batch(case, runner, *, max_context_len: int, device: str, loc_fn):
    """A decode ``ForwardBatch`` of the release carrying the runner's pools (as ``ForwardBatch.init_new`` does
    in 0.5.11 / 0.5.12): int64 lengths and pool indices (``schedule_batch.py``), the lengths' CPU mirror, each
    row's write location for the decoded token. The token table itself is written by the caller."""
    import torch

    seq_lens = list(case.seq_lens)
    bs = len(seq_lens)
    req_pool, kv_pool = runner.pools
    fb = ForwardBatch(forward_mode=case.forward_mode, batch_size=bs,
                      input_ids=torch.zeros(bs, dtype=torch.int64, device=device),
                      req_pool_indices=torch.arange(bs, dtype=torch.int64, device=device),
                      seq_lens=torch.tensor(seq_lens, dtype=torch.int64, device=device),
                      out_cache_loc=torch.tensor([loc_fn(i, n - 1) for i, n in enumerate(seq_lens)],
                                                 dtype=torch.int64, device=device),
                      seq_lens_sum=sum(seq_lens),
                      seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
                      positions=torch.tensor([n - 1 for n in seq_lens], dtype=torch.int64, device=device))
    fb.req_to_token_pool, fb.token_to_kv_pool = req_pool, kv_pool
    return fb


def legacy_capture_metadata(backend, bs: int, batch) -> None:
    """What 0.5.11 / 0.5.12's ``CudaGraphRunner.capture_one_batch_size`` calls for a decode graph of ``bs`` rows:
    ``init_forward_metadata_capture_cuda_graph(bs, num_tokens=bs, req_pool_indices, seq_lens, None, DECODE,
    None)`` with every row at the fill length."""
    backend.init_forward_metadata_capture_cuda_graph(bs, bs, batch.req_pool_indices[:bs], batch.seq_lens[:bs],
                                                     None, batch.forward_mode, None)


def _init_cuda_graph_replay_metadata(backend, bs: int, batch) -> None:
    """What 0.5.11 / 0.5.12's ``CudaGraphRunner.replay_prepare`` calls: the padded batch's pool indices and
    lengths, their sum, and ``seq_lens_cpu`` (the runner's CPU buffer, always passed in these releases)."""
    backend.init_forward_metadata_replay_cuda_graph(bs, batch.req_pool_indices[:bs], batch.seq_lens[:bs],
                                                    int(batch.seq_lens_sum), None, batch.forward_mode, None,
                                                    seq_lens_cpu=batch.seq_lens_cpu[:bs])
