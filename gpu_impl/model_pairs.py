"""What our model passes to FA3, per decode event, in the normalised form a real engine's trace uses.

Invariant: for every decode call the model makes (``gpu_impl.backend.DecodeCall`` in a ``run_scenario`` trace),
:func:`model_pairs` yields one dict shaped like ``gpu_impl.fa3_calls.pair_summary`` -- ``{"step", "dp_rank",
"mode", "path": "eager"|"capture"|"replay", "precomputed", "precompute": {...}|None, "call": {...}, "s_p",
"s_c"}`` -- holding exactly the arguments sglang's ``flashattention_backend.py`` passes to
``get_scheduler_metadata`` and ``flash_attn_with_kvcache`` in that configuration (docs/facts-fa3.md section 3), so
``fa3verify conform`` can compare the model with real engine code field by field.

CUDA graphs: a real engine precomputes and calls once at capture (rows of length 1, ``max_seqlen_k`` 1) and
again at each replay (the replayed batch's lengths into the same buffer; the call's split count and buffers
are fixed at capture from a page table as wide as the context). The model checks only the replayed call;
here each graph step also gets the capture event it implies (``path == "capture"``), derived from the same
``DecodeCall``. Simplification: the capture is placed at the step of the replay that uses that graph batch
size, on that DP rank (a real runner captures every size once at start-up; only the pairs are compared).
"""

from __future__ import annotations

from typing import Optional

__all__ = ["model_pairs", "decode_call_pair", "PAIR_KEYS"]

#: Keys of one event (those of pair_summary plus where it happened).
PAIR_KEYS = ("step", "dp_rank", "mode", "path", "precomputed", "precompute", "call", "s_p", "s_c")


_TORCH_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float8_e4m3": "float8_e4m3fn"}


def _torch_dtype(name: str):
    import torch

    return getattr(torch, _TORCH_DTYPES.get(name, name))


def decode_call_pair(backend, call, step: int, path: str) -> dict:
    """The normalised pair of one model DecodeCall (``path`` "eager" | "capture" | "replay"): the arguments
    the model's backend passes, recorded by ``gpu_impl.fa3_records`` (shape-only meta tensors) and summarised
    by ``gpu_impl.fa3_calls.pair_summary``, the function real engine traces go through."""
    import torch

    from .fa3_calls import pair_summary
    from .fa3_records import record_call, record_precompute

    model, server = backend.model, backend.server
    num_sm = server.num_sm
    dtype = _torch_dtype(model.dtype)
    page = server.page_size
    bs = len(call.seq_lens)
    pre = None
    if call.precomputed:
        h, hk = call.precompute_heads
        rows = bs if call.precompute_rows is None else call.precompute_rows
        lens = call.seq_lens[:rows]
        # flashattention_backend.py: sglang's arguments; headdim_v is never passed (FA3 then takes headdim)
        pre = record_precompute(
            batch_size=rows, max_seqlen_q=call.precompute_max_seqlen_q, max_seqlen_k=call.precompute_max_seqlen_k(lens), num_heads=h,
            num_heads_k=hk, headdim=model.head_dim, cache_seqlens=torch.tensor(lens, dtype=torch.int32),
            qkv_dtype=dtype, headdim_v=None if model.head_dim_v == model.head_dim else model.head_dim_v,
            cu_seqlens_q=torch.arange(rows + 1, dtype=torch.int32), page_size=page, causal=True,
            window_size=(-1, -1), has_softcap=False, num_splits=call.num_splits, num_sm=num_sm,
            build=backend.fa3_build)
    h, hk = call.call_heads
    meta = torch.device("meta")
    width = call.call_seqlen_k // page
    rec = record_call(
        torch.empty((bs, h, model.head_dim), dtype=dtype, device=meta),
        torch.empty((1, page, hk, model.head_dim), dtype=dtype, device=meta),
        torch.empty((1, page, hk, model.head_dim_v), dtype=dtype, device=meta),
        cache_seqlens=torch.tensor(call.seq_lens, dtype=torch.int32),
        page_table=torch.empty((bs, width), dtype=torch.int32, device=meta),
        cu_seqlens_q=torch.arange(bs + 1, dtype=torch.int32), max_seqlen_q=1, causal=True, window_size=(-1, -1),
        softcap=0.0, scheduler_metadata=torch.empty(1, dtype=torch.int32, device=meta) if call.precomputed else None,
        num_splits=call.launch_num_splits, num_sm=num_sm, build=backend.fa3_build)
    return {"step": step, "dp_rank": call.dp_rank, "mode": "decode", "path": path, **pair_summary(pre, rec)}


def model_pairs(scenario, result) -> list:
    """The normalised FA3 events of a model run: one per decode call in ``result.trace`` (plus the capture
    event of each CUDA-graph batch size a DP rank first uses), in trace order."""
    from .backend import DecodeCall, FlashAttentionBackend

    backend = FlashAttentionBackend(scenario.server, scenario.model, scenario.guard, scenario.metadata_heads,
                                    graph_replay_seqlen_k=scenario.graph_replay_seqlen_k,
                                    fa3_build=scenario.fa3_build)
    out, captured = [], set()
    for entry in result.trace:
        if entry.get("mode") != "decode" or "call_heads" not in entry:
            continue
        call = DecodeCall(dp_rank=entry["dp_rank"], path=entry["path"], seq_lens=list(entry["seq_lens"]),
                          real_rows=entry["real_rows"],
                          precompute_heads=tuple(entry["precompute_heads"]) if entry["precompute_heads"] else None,
                          call_heads=tuple(entry["call_heads"]), call_seqlen_k=entry["call_seqlen_k"],
                          num_splits=entry["num_splits_arg"], precomputed=entry["precomputed"],
                          skip_reason=entry.get("skip_reason", ""), call_num_splits=entry.get("launch_num_splits"),
                          precompute_rows=entry.get("precompute_rows"),
                          precompute_seqlen_k=entry.get("precompute_seqlen_k"),
                          precompute_max_seqlen_q=entry.get("precompute_max_seqlen_q", 1))
        if call.path == "cuda_graph":
            key = (call.dp_rank, len(call.seq_lens))
            if key not in captured:
                captured.add(key)
                capture = DecodeCall(**{**call.__dict__, "seq_lens": [1] * len(call.seq_lens),
                                        "precompute_rows": None, "precompute_seqlen_k": None})
                out.append(decode_call_pair(backend, capture, entry["step"], "capture"))
            out.append(decode_call_pair(backend, call, entry["step"], "replay"))
        else:
            out.append(decode_call_pair(backend, call, entry["step"], "eager"))
    return out
