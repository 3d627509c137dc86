"""An sglang-like FA3 attention backend: the decode-metadata flow and the per-layer kernel calls.

Models `FlashAttentionBackend` in sglang's `python/sglang/srt/layers/attention/flashattention_backend.py`
(docs/facts-fa3.md section 3): metadata is precomputed only for plain decode on non-MLA models, with sglang's
arguments (batch_size=bs, max_seqlen_q=1, max_seqlen_k=max(seq_lens), cache_seqlens=seq_lens,
cu_seqlens_q=arange(bs+1), heads H//tp_size and max(1, Hk//tp_size), causal=True, num_splits=backend's),
unless the guard disables the precompute; it is consumed only by non-sliding-window layers' decode calls,
whose page table is as wide as the longest sequence (eager) or the context length (CUDA graph).

Two ways to run a decode step: `check_decode` compares the precompute with the call at the metadata level
(spec's invariants, no tensors: what the fuzzer runs at scale), and `forward_decode` runs a kernel adapter
on real tensors (the emulator or real FA3) and returns outputs for the oracle comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from refmodel import fa3_builds
from refmodel.fa3_scheduler import call_inputs, ceil_div, resolve_schedule
from refmodel.metadata import schedule_and_prepare

from .config import ModelConfig, ServerConfig
from .guards import evaluate_guard, server_args_namespace

#: CUDA-graph batch sizes the model captures (sglang captures small sizes densely, then steps of 8).
CUDA_GRAPH_BATCH_SIZES = (1, 2, 4, 8) + tuple(range(16, 257, 8))


def cuda_graph_batch_size(bs: int) -> int:
    """Smallest captured CUDA-graph batch size >= bs (sglang pads a replay batch up to a captured size)."""
    for size in CUDA_GRAPH_BATCH_SIZES:
        if size >= bs:
            return size
    raise ValueError(f"batch size {bs}: larger than the largest captured CUDA-graph batch {CUDA_GRAPH_BATCH_SIZES[-1]}")


@dataclass
class DecodeCall:
    """One decode step on one attention rank: what the precompute saw and what the call sees."""

    dp_rank: int
    path: str                          # "eager" | "cuda_graph"
    seq_lens: list[int]                # per row, padded rows included
    real_rows: int                     # rows that belong to real requests
    precompute_heads: Optional[tuple[int, int]]
    call_heads: tuple[int, int]
    call_seqlen_k: int                 # page_table.size(1) * page_size
    num_splits: int
    precomputed: bool
    skip_reason: str = ""
    #: split count the call launches with when it differs from ``num_splits`` (set from outside, e.g. by the
    #: seeded defect ``graph-split-count-from-capture``: frozen at CUDA-graph capture); None: the call passes
    #: ``num_splits``
    call_num_splits: Optional[int] = None
    #: rows the precompute sees when fewer than ``seq_lens`` (set from outside, e.g. by the seeded defect
    #: ``graph-metadata-before-padding``)
    precompute_rows: Optional[int] = None
    #: ``max_seqlen_k`` the precompute passes when it is not the rows' longest length: a CUDA-graph replay of a
    #: release that recomputes with its ``max_context_len`` bound (``GRAPH_REPLAY_SEQLEN_K``); None: max(lens)
    precompute_seqlen_k: Optional[int] = None
    #: ``max_seqlen_q`` the precompute passes (sglang: 1; another value set from outside, e.g. by the seeded
    #: defect ``precompute-max-seqlen-q-two``); the call's rows stay one per sequence
    precompute_max_seqlen_q: int = 1

    def precompute_max_seqlen_k(self, lens) -> int:
        """The precompute's ``max_seqlen_k``: the fixed bound when one is set, else the longest row (at least 1)."""
        if self.precompute_seqlen_k is not None:
            return self.precompute_seqlen_k
        return max(max(lens, default=1), 1)

    @property
    def launch_num_splits(self) -> int:
        """The ``num_splits`` argument of the layer's call (``num_splits`` unless ``call_num_splits`` froze another)."""
        return self.num_splits if self.call_num_splits is None else self.call_num_splits


@dataclass
class DecodeVerdict:
    """What spec's invariants say about one decode call (empty `violations` = SAFE)."""

    call: DecodeCall
    s_p: Optional[int]
    s_c: int
    split_counts: Optional[list[int]]
    shape_error: Optional[str]
    violations: list = field(default_factory=list)

    def to_dict(self) -> dict:
        c = self.call
        return {"dp_rank": c.dp_rank, "path": c.path, "seq_lens": c.seq_lens, "real_rows": c.real_rows,
                "precomputed": c.precomputed, "skip_reason": c.skip_reason,
                "precompute_heads": c.precompute_heads, "call_heads": c.call_heads,
                "call_seqlen_k": c.call_seqlen_k, "num_splits_arg": c.num_splits, "s_p": self.s_p, "s_c": self.s_c,
                **({"launch_num_splits": c.call_num_splits} if c.call_num_splits is not None else {}),
                **({"precompute_rows": c.precompute_rows} if c.precompute_rows is not None else {}),
                **({"precompute_seqlen_k": c.precompute_seqlen_k} if c.precompute_seqlen_k is not None else {}),
                **({"precompute_max_seqlen_q": c.precompute_max_seqlen_q} if c.precompute_max_seqlen_q != 1 else {}),
                "split_counts": self.split_counts, "shape_error": self.shape_error,
                "violations": [v.to_dict() if hasattr(v, "to_dict") else dict(v) for v in self.violations]}


#: What a CUDA-graph replay passes as the precompute's ``max_seqlen_k``: "max_seq_len" (the replayed rows' longest
#: length, from the runner's CPU mirror) or "context_length" (the backend's ``max_context_len`` bound, when the
#: graph runner hands the backend no CPU lengths, e.g. 0.5.23's sync-free replay, ``needs_cpu_seq_lens = False``).
#: Which release does which: ``graph_replay_seqlen_k`` in spec/model/engine_profiles.json.
GRAPH_REPLAY_SEQLEN_K = ("max_seq_len", "context_length")


class FlashAttentionBackend:
    """sglang's FA3 backend for one model and server configuration, with a pluggable precompute guard.

    `metadata_heads` selects the precompute's head counts: "tp" (H // tp_size, as sglang) or "attn_tp"
    (H // attn_tp_size, the root-cause fix). The backend has no defect switches: a seeded defect is a subclass
    that overrides one of its steps, applied from outside (``gpu_impl.defects.seed_backend``); ``defects`` names
    the ones a seeded backend carries (none here).
    """

    #: seeded defects this backend carries (names of ``gpu_impl.defects``); set by a seeded subclass only
    defects: frozenset = frozenset()
    #: the layer's call passes ``cu_seqlens_q`` and ``cache_seqlens`` (varlen), as sglang's does
    call_varlen: bool = True
    #: why this backend's calls are checked at the metadata level only (None: numerics are modelled too)
    metadata_only: Optional[str] = None

    def __init__(self, server: ServerConfig, model: ModelConfig, guard: Callable[[Any], Any],
                 metadata_heads: str = "tp", graph_replay_seqlen_k: str = "max_seq_len",
                 fa3_build: str = fa3_builds.UPSTREAM):
        if metadata_heads not in ("tp", "attn_tp"):
            raise ValueError(f"metadata_heads: must be 'tp' or 'attn_tp', got {metadata_heads!r}")
        if graph_replay_seqlen_k not in GRAPH_REPLAY_SEQLEN_K:
            raise ValueError(f"graph_replay_seqlen_k: must be one of {', '.join(GRAPH_REPLAY_SEQLEN_K)}, "
                             f"got {graph_replay_seqlen_k!r}")
        self.graph_replay_seqlen_k = graph_replay_seqlen_k
        #: the FA3 build (refmodel.fa3_builds) both sides are scheduled under: the release's kernel build
        self.fa3_build = fa3_builds.check_build_name(fa3_build)
        self.server = server
        self.model = model
        self.guard = guard
        self.metadata_heads = metadata_heads
        self.disable_precompute = bool(evaluate_guard(guard, server_args_namespace(server)))

    # -- what the backend decides -------------------------------------------------------------

    def precompute_heads(self) -> tuple[int, int]:
        """Heads passed to get_scheduler_metadata under this backend's `metadata_heads` choice."""
        if self.metadata_heads == "tp":
            return self.server.precompute_heads(self.model)
        return self.server.layer_heads(self.model)

    def precompute_skip_reason(self) -> str:
        """Why no metadata is precomputed ('' when it is): guard, MLA (flashattention_backend.py)."""
        if self.model.is_mla:
            return "MLA model: no FA3 scheduler metadata"
        if self.disable_precompute:
            return "guard disables the precompute"
        return ""

    def decode_calls(self, dp_batches: Sequence[Sequence[int]]) -> list[DecodeCall]:
        """The decode call each attention DP rank makes for its share of a decode batch.

        Under CUDA graph every rank replays the graph for the largest rank's batch (padded rows have
        seq_len 1) with a page table as wide as the context; eager ranks with no rows run IDLE (no call).
        """
        server, page = self.server, self.server.page_size
        calls = []
        graph_bs = cuda_graph_batch_size(max((len(b) for b in dp_batches), default=0) or 1) if server.cuda_graph else 0
        reason = self.precompute_skip_reason()
        bound = server.context_length if self.graph_replay_seqlen_k == "context_length" else None
        for rank, rows in enumerate(dp_batches):
            rows = [int(x) for x in rows]
            if server.cuda_graph:
                seq_lens = rows + [1] * (graph_bs - len(rows))
                width = ceil_div(server.context_length, page) * page
                path = "cuda_graph"
            else:
                if not rows:
                    continue
                seq_lens = rows
                width = ceil_div(max(rows), page) * page
                path = "eager"
            calls.append(DecodeCall(dp_rank=rank, path=path, seq_lens=seq_lens, real_rows=len(rows),
                                    precompute_heads=None if reason else self.precompute_heads(),
                                    call_heads=self.server.layer_heads(self.model), call_seqlen_k=width,
                                    num_splits=server.backend_num_splits, precomputed=not reason,
                                    skip_reason=reason, precompute_seqlen_k=bound if server.cuda_graph else None))
        return calls

    def _call_schedule(self, call: DecodeCall):
        """The call's resolved schedule (a seeded kernel counterfactual may change its tiles)."""
        return resolve_schedule(self.call_inputs(call))

    # -- metadata-level check (no tensors) ----------------------------------------------------

    def check_decode(self, call: DecodeCall) -> DecodeVerdict:
        """Compare the precompute with the call through spec's invariants, without running any kernel."""
        from spec.invariants import check_all

        call_sched = self._call_schedule(call)
        if not call.precomputed:
            return DecodeVerdict(call, None, call_sched.num_splits, None, None, [])
        pre_sched, pre_result = self.precompute(call)
        # FA3 reads (and checks) the metadata only when the call needs a semaphore or the prepare step
        # (flash_api.cpp mha_fwd); otherwise the tensor is ignored.
        if call_sched.metadata_size and pre_sched.metadata_size != call_sched.metadata_size:
            return DecodeVerdict(call, pre_sched.num_splits, call_sched.num_splits, list(pre_result.num_splits),
                                 f"metadata size {pre_sched.metadata_size} != expected {call_sched.metadata_size}")
        violations = check_all(pre_sched, pre_result, call_sched, self.call_lengths(call))
        return DecodeVerdict(call, pre_sched.num_splits, call_sched.num_splits, list(pre_result.num_splits), None,
                             list(violations))

    def precompute(self, call: DecodeCall):
        """Schedule and prepare result of sglang's get_scheduler_metadata call for this decode step."""
        h, hk = call.precompute_heads
        lens = call.seq_lens if call.precompute_rows is None else call.seq_lens[:call.precompute_rows]
        bs = len(lens)
        return schedule_and_prepare(
            bs, call.precompute_max_seqlen_q, call.precompute_max_seqlen_k(lens), h, hk, self.model.head_dim,
            torch.tensor(lens, dtype=torch.int32), qkv_dtype=self.model.dtype,
            headdim_v=self.model.head_dim_v, cu_seqlens_q=list(range(bs + 1)), page_size=self.server.page_size,
            causal=True, num_splits=call.num_splits, num_sm=self.server.num_sm, build=self.fa3_build)

    def call_inputs(self, call: DecodeCall):
        """ScheduleInputs of the layer's flash_attn_with_kvcache call for this decode step, under the backend's
        FA3 build; its ``total_q`` (FA3's ``params.total_q``) is q's rows, one per sequence, varlen or not."""
        h, hk = call.call_heads
        varlen = self.call_varlen
        return call_inputs(len(call.seq_lens), 1, call.call_seqlen_k, h, hk, self.model.head_dim,
                           headdim_v=self.model.head_dim_v, qkv_dtype=self.model.dtype, varlen_q=varlen,
                           has_cache_seqlens=varlen, page_size=self.server.page_size, causal=True,
                           num_splits=call.launch_num_splits, num_sm=self.server.num_sm, build=self.fa3_build,
                           total_q=len(call.seq_lens))

    @staticmethod
    def call_lengths(call: DecodeCall) -> dict:
        """Per-batch lengths the call uses: one query row each, the cache lengths as keys."""
        return {"seqlens_q": [1] * len(call.seq_lens), "seqused_k": list(call.seq_lens)}

    # -- running a kernel on tensors ----------------------------------------------------------

    def forward_decode(self, kernel, call: DecodeCall, q: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, page_table: torch.Tensor, sliding_window: bool = False,
                       softmax_scale: Optional[float] = None):
        """One layer's decode attention as sglang's forward_decode calls FA3 (metadata only on full layers)."""
        bs = len(call.seq_lens)
        cache_seqlens = torch.tensor(call.seq_lens, dtype=torch.int32, device=q.device)
        cu_seqlens_q = torch.arange(bs + 1, dtype=torch.int32, device=q.device)
        metadata = self.decode_metadata(kernel, call, q, cache_seqlens, cu_seqlens_q, sliding_window)
        out, lse, *_ = kernel.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table, cu_seqlens_q=cu_seqlens_q,
            max_seqlen_q=1, softmax_scale=softmax_scale, causal=True, scheduler_metadata=metadata,
            num_splits=call.launch_num_splits, return_softmax_lse=True)
        return out, lse

    def decode_metadata(self, kernel, call: DecodeCall, q: torch.Tensor, cache_seqlens: torch.Tensor,
                        cu_seqlens_q: torch.Tensor, sliding_window: bool = False) -> Optional[torch.Tensor]:
        """The ``scheduler_metadata`` the layer's call gets: the precompute's, on full layers only (else None)."""
        if not call.precomputed or sliding_window:
            return None
        h, hk = call.precompute_heads
        bs = len(call.seq_lens)
        rows = bs if call.precompute_rows is None else call.precompute_rows
        return kernel.get_scheduler_metadata(
            rows, call.precompute_max_seqlen_q, call.precompute_max_seqlen_k(call.seq_lens[:rows]), h, hk,
            self.model.head_dim,
            cache_seqlens[:rows], qkv_dtype=q.dtype, headdim_v=self.model.head_dim_v,
            cu_seqlens_q=cu_seqlens_q[:rows + 1], page_size=self.server.page_size, causal=True,
            num_splits=call.num_splits)
