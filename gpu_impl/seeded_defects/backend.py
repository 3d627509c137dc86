"""Backend-side seeded defects: mixins over ``gpu_impl.backend.FlashAttentionBackend``, one per defect.

Each mixin overrides the one step of the backend (sglang's ``flashattention_backend.py`` as modelled) that its
defect changes and calls the unseeded step for everything else. Invariant: a backend without these mixins is the
fixed sglang flow; each mixin re-creates its defect and nothing more.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from refmodel.fa3_scheduler import ceil_div, resolve_schedule

from ..backend import CUDA_GRAPH_BATCH_SIZES, DecodeCall, DecodeVerdict
from ..defects import GRAPH_CAPTURE_SEQLEN_K

__all__ = ["BACKEND_SEEDS", "GraphSplitCountFromCapture", "GraphMetadataBeforePadding", "GraphMetadataNewBuffer",
           "CallNotVarlen", "KernelUsesHostTilesInCheck", "PrecomputeMaxSeqlenQTwo"]


class GraphSplitCountFromCapture:
    """``graph-split-count-from-capture`` (vLLM PR #20301): under CUDA graph the call's S_c is frozen at capture.

    The heuristic split count (``num_splits <= 0``) is resolved on the capture-time KV extent
    (:data:`gpu_impl.defects.GRAPH_CAPTURE_SEQLEN_K` tokens, at most the call's own), while the metadata is
    recomputed at replay on the run-time ``max_seqlen_k``.
    """

    def decode_calls(self, dp_batches):
        calls = super().decode_calls(dp_batches)
        for call in calls:
            if call.path == "cuda_graph" and call.num_splits <= 0:
                page = self.server.page_size
                extent = min(call.call_seqlen_k, ceil_div(GRAPH_CAPTURE_SEQLEN_K, page) * page)
                captured = DecodeCall(**{**call.__dict__, "call_seqlen_k": extent})
                call.call_num_splits = resolve_schedule(self.call_inputs(captured)).num_splits
        return calls


class GraphMetadataBeforePadding:
    """``graph-metadata-before-padding`` (vllm-project/flash-attention PR #82): under CUDA graph the precompute sees
    the real rows only, while the captured call runs with the batch padded to the graph size."""

    def decode_calls(self, dp_batches):
        calls = super().decode_calls(dp_batches)
        for call in calls:
            if call.path == "cuda_graph":
                call.precompute_rows = call.real_rows
        return calls


class PrecomputeMaxSeqlenQTwo:
    """``precompute-max-seqlen-q-two`` (a hazard control): the decode precompute passes ``max_seqlen_q`` 2 while
    each sequence has one query row. Under sglang-kernel-0.4.5 the precompute's get_num_splits then bounds by
    ``2 * b`` rows and the call's by its ``b`` real rows (theorem ``total-q-drift``); the prepare step still
    counts the real rows (``cu_seqlens_q``)."""

    def decode_calls(self, dp_batches):
        calls = super().decode_calls(dp_batches)
        for call in calls:
            call.precompute_max_seqlen_q = 2
        return calls


class GraphMetadataNewBuffer:
    """``graph-metadata-new-buffer`` (sglang PR #27664): at replay the new metadata goes into a fresh tensor, so the
    graph reads what the last capture left in the buffer it captured (both in the metadata-level check and in the
    tensors handed to the kernel)."""

    def check_decode(self, call: DecodeCall) -> DecodeVerdict:
        if call.precomputed and call.path == "cuda_graph":
            return self._check_stale_buffer(call, self._call_schedule(call))
        return super().check_decode(call)

    def decode_metadata(self, kernel, call: DecodeCall, q: torch.Tensor, cache_seqlens: torch.Tensor,
                        cu_seqlens_q: torch.Tensor, sliding_window: bool = False) -> Optional[torch.Tensor]:
        metadata = super().decode_metadata(kernel, call, q, cache_seqlens, cu_seqlens_q, sliding_window)
        if metadata is not None and call.path == "cuda_graph":
            metadata = self.captured_metadata_buffer(call).to(q.device)  # the fresh tensor is never read
        return metadata

    def captured_metadata_buffer(self, call: DecodeCall) -> torch.Tensor:
        """What the graph's metadata buffer holds when replays never write it.

        sglang captures the graphs largest batch first (cuda_graph_runner.py ``reversed(self.capture_bs)``) and
        each capture writes ``buf[:n] = md; buf[n:] = 0`` (flashattention_backend.py); the last capture is the
        smallest graph batch, with the capture batch's lengths (1). The call reads ``buf[:size]`` for its own size.
        """
        from refmodel.metadata import encode_metadata

        first = CUDA_GRAPH_BATCH_SIZES[0]
        capture = DecodeCall(**{**call.__dict__, "seq_lens": [1] * first, "real_rows": first,
                                "call_num_splits": None, "precompute_rows": None,
                                "precompute_seqlen_k": None})
        md = encode_metadata(*self.precompute(capture))
        size = resolve_schedule(self.call_inputs(call)).metadata_size
        buf = torch.zeros(max(size, md.numel()), dtype=torch.int32)
        buf[:md.numel()] = md
        return buf[:size].clone()

    def _check_stale_buffer(self, call: DecodeCall, call_sched) -> DecodeVerdict:
        """The call against the captured buffer's stale content, through the kernel model's tile plan."""
        from spec.violation import Violation

        from ..errors import MetadataShapeError
        from ..kernels.base import CallShape, build_tile_plan, check_plan

        md = self.captured_metadata_buffer(call)
        h, hk = call.call_heads
        b = len(call.seq_lens)
        shape = CallShape(batch_size=b, seqlen_q=1, seqlen_k=call.call_seqlen_k, total_q=b, num_heads=h,
                          num_heads_k=hk, headdim=self.model.head_dim, headdim_v=self.model.head_dim_v,
                          dtype=torch.bfloat16, page_size=self.server.page_size, varlen_q=True,
                          seqlens_q=(1,) * b, cache_seqlens=tuple(call.seq_lens), cache_leftpad=None,
                          cache_slots=self.server.page_size)
        try:
            plan = build_tile_plan(shape, call_sched, md)
        except MetadataShapeError as exc:
            return DecodeVerdict(call, None, call_sched.num_splits, None, str(exc))
        stale = (f"[graph metadata buffer left by the batch-{CUDA_GRAPH_BATCH_SIZES[0]} capture, read for graph "
                 f"batch {b}] ")
        found = [Violation(v.invariant, v.batch, dict(v.detail), stale + v.message) for v in check_plan(plan)]
        return DecodeVerdict(call, None, call_sched.num_splits, list(plan.num_splits), None, found)


class CallNotVarlen:
    """``call-not-varlen`` (vllm-project/flash-attention PR #161/#162): metadata is precomputed as varlen while the
    layer's call passes neither ``cu_seqlens_q`` nor ``cache_seqlens``; such calls are checked at the metadata
    level only (the numerics of a non-varlen call are not modelled)."""

    call_varlen = False
    metadata_only = "not modelled: the seeded non-varlen call (metadata level only)"


class KernelUsesHostTilesInCheck:
    """``fa3-kernel-uses-host-tiles`` as the metadata-level check sees it: the call's schedule uses the host's tiles
    (``block_m``, ``block_n``) as the kernel's, so the check agrees with the seeded kernel (:mod:`.kernel`)."""

    def _call_schedule(self, call: DecodeCall):
        sched = super()._call_schedule(call)
        return dataclasses.replace(sched, kernel_block_m=sched.block_m, kernel_block_n=sched.block_n)


#: defect name -> the backend mixin that re-creates it
BACKEND_SEEDS = {
    "graph-split-count-from-capture": GraphSplitCountFromCapture,
    "graph-metadata-before-padding": GraphMetadataBeforePadding,
    "graph-metadata-new-buffer": GraphMetadataNewBuffer,
    "call-not-varlen": CallNotVarlen,
    "fa3-kernel-uses-host-tiles": KernelUsesHostTilesInCheck,
    "precompute-max-seqlen-q-two": PrecomputeMaxSeqlenQTwo,
}
