"""gpu-check's fuzz call: one case (strategy family ``gpu-decode``) through the backend in a worker, every decode
call launched on the real kernel and checked against the float64 oracle.

Invariant: a case passes only when no call gives NaN, a predicted out-of-bounds access or an output outside
FA3's tolerance (``refmodel.tolerance``); the cases themselves come from ``fa3verify.strategies``.
"""

from __future__ import annotations

import json
import random
from typing import Any

from spec.finding import DeviceOutcome

from .tasks import task_kernel, sync


def task_case(case, index: int) -> dict:
    """A generated case (a ``fa3verify.strategies.FuzzCase`` with one decode step) as a worker task's plain dict."""
    return {"index": index, "model": case.model.name, "server": case.server.to_dict(),
            "seq_lens": list(case.steps[0]["seq_lens"]), "seed": case.seed}


def random_fuzz_case(seed: int, index: int, num_sm: int, max_len: int, contexts: tuple) -> dict:
    """Case ``index`` of stream ``seed`` from the strategy family ``gpu-decode`` (``fa3verify.strategies``): a
    valid backend configuration of a real model and a decode batch, as a worker task's dict."""
    from ..strategies import gpu_decode_case

    rng = random.Random(f"fa3verify.gpu_fuzz:{seed}:{index}")
    return task_case(gpu_decode_case(rng, num_sm, max_len, contexts), index)


def fuzz_case_task(adapter: dict, case: dict, guard: str = "fixed") -> dict:
    """Worker task: one fuzz case through the backend with ``guard``, every decode call launched and checked.

    ``adapter["defects"]`` (optional) names seeded defects (``gpu_impl.defects``) applied from outside: the backend
    becomes its seeded copy, and kernel-layer ones seed the kernel (the emulator; a negative control)."""
    import hashlib

    from gpu_impl.backend import FlashAttentionBackend
    from gpu_impl.config import ServerConfig, get_model
    from gpu_impl.defects import defects_in_layer, seed_backend
    from gpu_impl.guards import load_guard
    from gpu_impl.scenario import distribute_over_dp

    defects = frozenset(adapter.get("defects") or ())
    kernel = task_kernel(adapter, "gpu-like")
    if defects_in_layer(defects, "kernel"):
        kernel = kernel.with_defects(defects_in_layer(defects, "kernel"))
    device = adapter.get("device") or "cpu"
    server = ServerConfig.from_dict(case["server"])
    model = get_model(case["model"])
    backend = seed_backend(FlashAttentionBackend(server, model, load_guard(guard)), defects)
    records = []
    for call in backend.decode_calls(distribute_over_dp(case["seq_lens"], server.attn_dp_size)):
        digest = hashlib.sha256(json.dumps([case["seed"], call.dp_rank]).encode()).digest()
        records.append(_fuzz_call(backend, kernel, call, int.from_bytes(digest[:4], "little"), device))
    bad = [r["outcome"] for r in records if r["outcome"] != DeviceOutcome.PASS]
    return {"outcome": bad[0] if bad else DeviceOutcome.PASS, "calls": records}


def _fuzz_call(backend, kernel, call, seed: int, device: str) -> dict:
    import torch

    from gpu_impl.errors import MetadataShapeError, OutOfBoundsAccess
    from gpu_impl.scenario import decode_tensors
    from gpu_impl.oracle_check import closeness, mismatch_message, nan_message, nan_rows, ROWS_KEPT
    from refmodel.tolerance import reference_outputs

    rec: dict[str, Any] = {"dp_rank": call.dp_rank, "path": call.path, "precomputed": call.precomputed,
                           "rows": len(call.seq_lens), "real_rows": call.real_rows, "max_len": max(call.seq_lens),
                           "call_seqlen_k": call.call_seqlen_k, "outcome": DeviceOutcome.PASS}
    tensors = decode_tensors(backend, call, seed=seed, device=device)
    q, k_cache, v_cache, table = tensors
    exact = lowp = None
    layers = [False] + ([True] if backend.model.has_sliding_window_layers else [])
    for sliding in layers:
        try:
            out, _ = backend.forward_decode(kernel, call, *tensors, sliding_window=sliding)
            sync(device)
        except MetadataShapeError as exc:
            rec.update(outcome=DeviceOutcome.SHAPE_ERROR, message=str(exc)[:500])
            return rec
        except OutOfBoundsAccess as exc:
            rec.update(outcome=DeviceOutcome.PREDICTED_OOB, message=str(exc)[:500], invariants=[exc.invariant])
            return rec
        trace = kernel.last_trace or {}
        rec["s_c"] = (trace.get("schedule") or {}).get("num_splits")
        verdicts = sorted({v["invariant"] for v in trace.get("verdicts", [])})
        bad = nan_rows(out[: call.real_rows])
        if bad:
            rec.update(outcome=DeviceOutcome.NAN, message=f"{nan_message(bad)} (sliding_window={sliding}); "
                                                          f"predicted violations {verdicts}", nan_rows=bad[:ROWS_KEPT])
            return rec
        if verdicts:
            rec.update(outcome=DeviceOutcome.PREDICTED_OOB, message=f"the model predicts {verdicts} for this call "
                                                        f"(sliding_window={sliding}), though the output has no NaN",
                       invariants=verdicts)
            return rec
        if exact is None:
            cs = torch.tensor(call.seq_lens, dtype=torch.int32)
            cu = torch.arange(len(call.seq_lens) + 1, dtype=torch.int32)
            exact, lowp = reference_outputs(q.cpu(), k_cache.cpu(), v_cache.cpu(), cache_seqlens=cs, cu_seqlens_q=cu,
                                            max_seqlen_q=1, page_table=table.cpu(), causal=True)
        ok, err, bound = closeness(out[: call.real_rows].cpu(), exact[: call.real_rows], lowp[: call.real_rows])
        rec["max_error"], rec["bound"] = err, bound
        if not ok:
            rec.update(outcome=DeviceOutcome.MISMATCH,
                       message=f"{mismatch_message(err, bound)} (sliding_window={sliding})")
            return rec
    return rec
