"""The model backend's decode steps as a metadata lifecycle: layers x steps over one shared, persistent metadata.

``gpu_impl.backend`` judges each decode step's precompute against its call (one pair). Here the same steps, with
the scenario's seeded defects applied (``gpu_impl.scenario.prepare_run``), run through
refmodel.metadata_lifecycle's engine model: per attention DP rank, every decode step precomputes once (the backend's
heads, split policy, head dims, dtype, page size and SM count) and every layer launches over that metadata; under
CUDA graph the first step of each graph batch size captures the graph (page table of the whole context) and every
step replays it over the persistent buffer (``buf[:n] = md; buf[n:] = 0``, as sglang 0.5.23 does). The judge is
spec.lifecycle_invariants.

Simplified: the model's layers share one shape (``LAYERS`` of them); a backend that skips the precompute (its guard)
has no metadata to follow, so its steps make no launches here; extend, mixed and idle steps do not touch the decode
metadata and are left out; a seeded ``precompute_rows`` (the padding defect) becomes a precompute over the real rows.
"""

from __future__ import annotations

from typing import Optional

from refmodel.metadata_lifecycle import EngineModel, LayerShape, Step, Trace, run_sequence
from spec.lifecycle_invariants import check_trace

from .backend import CUDA_GRAPH_BATCH_SIZES
from .scenario import Scenario, distribute_over_dp, prepare_run

__all__ = ["LAYERS", "lifecycle_sequences", "run_lifecycle"]

#: layers per step the lifecycle runs (every layer shares the precompute; two show reuse across layers)
LAYERS = 2


def lifecycle_sequences(scn: Scenario) -> list:
    """Per DP rank that precomputes: (dp_rank, EngineModel, [Step, ...]); empty when the backend never precomputes."""
    scn, backend, _ = prepare_run(scn, None)
    server, model = scn.server, scn.model
    per_rank: dict = {}
    captured: dict = {}
    for step in scn.steps:
        if step.mode != "decode":
            continue
        for call in backend.decode_calls(distribute_over_dp(step.seq_lens, server.attn_dp_size)):
            if not call.precomputed:
                continue
            h, hk = call.call_heads
            if call.dp_rank not in per_rank:
                engine = EngineModel(
                    layers=(LayerShape(h, hk, model.head_dim, model.head_dim_v),) * LAYERS,
                    context_len=server.context_length, page_size=server.page_size, num_sm=server.num_sm,
                    precompute_num_splits=call.num_splits, call_num_splits=call.launch_num_splits,
                    precompute_heads=tuple(call.precompute_heads),
                    precompute_padded_batch=call.precompute_rows is None,
                    replay_max_seqlen_k=call.precompute_seqlen_k if call.path == "cuda_graph" else None,
                    max_graph_batch=CUDA_GRAPH_BATCH_SIZES[-1], qkv_dtype=model.dtype)
                per_rank[call.dp_rank] = (engine, [])
            steps = per_rank[call.dp_rank][1]
            if call.path == "cuda_graph":
                bs = len(call.seq_lens)
                if bs not in captured.setdefault(call.dp_rank, set()):
                    captured[call.dp_rank].add(bs)
                    steps.append(Step("capture", (1,) * bs))
                steps.append(Step("replay", tuple(call.seq_lens), real_batch=call.real_rows))
            else:
                steps.append(Step("eager", tuple(call.seq_lens)))
    return [(rank, engine, steps) for rank, (engine, steps) in sorted(per_rank.items())]


def run_lifecycle(scn: Scenario) -> tuple:
    """Run a scenario's decode steps as lifecycle sequences: ([(dp_rank, Trace)], violations with dp_rank set)."""
    traces, found = [], []
    for rank, engine, steps in lifecycle_sequences(scn):
        trace: Optional[Trace] = run_sequence(engine, steps)
        traces.append((rank, trace))
        for v in check_trace(trace):
            found.append(type(v).at_step(v.invariant, v.step, rank, v.message, v.detail))
    return traces, found
