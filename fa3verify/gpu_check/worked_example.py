"""gpu-check's ``worked_example`` stage: docs/facts-fa3.md's worked example through the backend, in a worker.

Qwen3-30B-A3B (H=32, Hk=4, d=128, bf16), tp=4, attn_cp=4; one 32768-token and seven 100-token sequences;
num_splits=0. Invariant: with the pre-fix guard the precompute uses h_k=1 and the call overflows its split
buffers, so the outcome is NaN, an illegal memory access (a recorded crash) or a wrong result; with the fixed
guard the output agrees with the float64 oracle under FA3's tolerance (``hopper/flash_api.cpp``,
``hopper/flash_fwd_combine_kernel.h``; the modelled backend's ``flashattention_backend.py`` before and after PR #30439).
:func:`child_main` runs the same task in this process, for compute-sanitizer.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any, Optional

from spec.finding import DeviceOutcome, StageStatus

from .plan import WORKED_LONG, WORKED_MODEL, WORKED_SHORT, WORKED_SHORT_COUNT
from .tasks import task_kernel, sync

if TYPE_CHECKING:
    from .runner import GpuCheck, Stage


def run(check: GpuCheck, stage: Stage) -> None:
    import functools

    p = check.plan
    stage.expectation = ("pre-fix guard: NaN, an illegal memory access (crash) or a wrong result; "
                         "fixed guard: agrees with the float64 oracle")
    stage.numbers["shapes"] = {"model": WORKED_MODEL, "tp_size": 4, "attn_cp_size": 4,
                               "seq_lens": [p.worked_long] + [WORKED_SHORT] * WORKED_SHORT_COUNT,
                               "num_splits": 0, "num_sm": p.worked_num_sm or check.num_sm or "the GPU's",
                               "scaled_for_cpu": p.dry_run}
    outcomes = {}
    for guard in ("pre-fix", "fixed"):
        limit = check.budget(p.worked_timeout_s, reserve=30)
        if limit < 5:
            outcomes[guard] = {"outcome": DeviceOutcome.NOT_RUN, "reason": "no time left"}
            continue
        task = functools.partial(worked_example_task, p.adapter, guard, p.worked_long, p.worked_num_sm, p.seed)
        res = check.pool.run(task, timeout_s=limit)
        if res.ok:
            value = dict(res.value)
        else:
            value = {"outcome": DeviceOutcome.CRASH if res.crashed else DeviceOutcome.ERROR, "kind": res.kind,
                     "exitcode": res.exitcode,
                     "error": res.error_text[-3000:], "seconds": round(res.elapsed, 2)}
        outcomes[guard] = value
        expected = worked_expected(guard, value)
        if guard == "pre-fix" and value["outcome"] in (DeviceOutcome.NAN, DeviceOutcome.CRASH, DeviceOutcome.MISMATCH):
            path = check.save_case("worked_example", "pre-fix", {"guard": guard, "shapes": stage.numbers["shapes"],
                                                                 "result": value})
            check.finding("worked_example", f"pre-fix:{value['outcome']}",
                         f"pre-fix guard, worked example: {value['outcome']}"
                         + (f" ({res.summary()})" if not res.ok else ""), case_file=path)
        elif not expected:
            path = check.save_case("worked_example", guard, {"guard": guard, "shapes": stage.numbers["shapes"],
                                                            "result": value})
            check.finding("worked_example", f"{guard}:unexpected:{value['outcome']}",
                         f"{guard} guard, worked example: unexpected outcome {value['outcome']}", case_file=path)
    stage.numbers["pre_fix"] = outcomes.get("pre-fix")
    stage.numbers["fixed"] = outcomes.get("fixed")
    stage.numbers["pre_fix_outcome"] = (outcomes.get("pre-fix") or {}).get("outcome")
    stage.numbers["fixed_outcome"] = (outcomes.get("fixed") or {}).get("outcome")
    verdicts = [worked_expected(g, outcomes[g]) if outcomes.get(g, {}).get("outcome") != DeviceOutcome.NOT_RUN else None
                for g in ("pre-fix", "fixed")]
    if any(v is False for v in verdicts):
        stage.status = StageStatus.FAIL
    elif any(v is None for v in verdicts) or any(o.get("outcome") == DeviceOutcome.ERROR for o in outcomes.values()):
        stage.status = StageStatus.INCONCLUSIVE
    else:
        stage.status = StageStatus.PASS
    stage.message = (f"pre-fix -> {stage.numbers['pre_fix_outcome']}, fixed -> {stage.numbers['fixed_outcome']}")


def worked_expected(guard: str, value: dict) -> Optional[bool]:
    outcome = value.get("outcome")
    if outcome in (DeviceOutcome.NOT_RUN,):
        return None
    if guard == "pre-fix":
        if outcome == DeviceOutcome.ERROR:
            return None
        return outcome in (DeviceOutcome.NAN, DeviceOutcome.CRASH, DeviceOutcome.MISMATCH)
    if outcome in (DeviceOutcome.ERROR, DeviceOutcome.CRASH):
        return False if outcome == DeviceOutcome.CRASH else None
    return outcome == DeviceOutcome.AGREES


def worked_example_task(adapter: dict, guard: str, long_len: int = WORKED_LONG, num_sm: Optional[int] = None,
                        seed: int = 0) -> dict:
    """docs/facts-fa3.md's worked example through the backend with ``guard``; the kernel in gpu-like mode (it launches).

    Returns ``{"outcome": "nan" | "agrees" | "mismatch", ...}`` with the split counts the kernel read, S_c,
    refmodel's S_p, the predicted violations and (when no NaN) the error against the oracle. An illegal memory
    access raises here and the worker pool records the crash.
    """
    import torch

    from gpu_impl.backend import FlashAttentionBackend
    from gpu_impl.config import ServerConfig, get_model
    from gpu_impl.guards import load_guard
    from gpu_impl.scenario import decode_tensors
    from refmodel.metadata import schedule_and_prepare
    from gpu_impl.oracle_check import closeness, nan_rows as output_nan_rows
    from refmodel.tolerance import reference_outputs

    from ..fidelity import adapter_supports_paged

    t0 = time.perf_counter()
    options = {"num_sm": num_sm} if num_sm else {}
    kernel = task_kernel(adapter, "gpu-like", **options)
    device = adapter.get("device") or "cpu"
    server = ServerConfig(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag", page_size=1,
                          num_sm=int(kernel.num_sm))
    model = get_model(WORKED_MODEL)
    backend = FlashAttentionBackend(server, model, load_guard(guard))
    lens = [int(long_len)] + [WORKED_SHORT] * WORKED_SHORT_COUNT
    call = backend.decode_calls([lens])[0]
    out_info: dict[str, Any] = {"guard": guard, "precomputed": call.precomputed, "skip_reason": call.skip_reason,
                                "precompute_heads": call.precompute_heads, "call_heads": call.call_heads,
                                "describe": kernel.describe()}
    if call.precomputed:
        h, hk = call.precompute_heads
        sched, result = schedule_and_prepare(
            len(lens), 1, max(lens), h, hk, model.head_dim, torch.tensor(lens, dtype=torch.int32),
            cu_seqlens_q=list(range(len(lens) + 1)), page_size=1 if adapter_supports_paged(kernel) else None,
            causal=True, num_sm=int(kernel.num_sm), arch=int(kernel.arch))
        out_info["refmodel_s_p"] = sched.num_splits
        out_info["refmodel_metadata_splits"] = list(result.num_splits)
    q, k_cache, v_cache, table = decode_tensors(backend, call, seed=seed, device=device)
    out, lse = backend.forward_decode(kernel, call, q, k_cache, v_cache, table)
    sync(device)
    trace = kernel.last_trace or {}
    out_info["s_c"] = (trace.get("schedule") or {}).get("num_splits")
    out_info["observed_num_splits"] = trace.get("observed_num_splits")
    out_info["metadata_splits_read"] = ((trace.get("metadata") or {}).get("num_splits"))
    out_info["predicted_violations"] = sorted({v["invariant"] for v in trace.get("verdicts", [])})
    nan_rows = output_nan_rows(out)
    out_info["nan_batches"] = nan_rows
    out_info["kernel_seconds"] = round(time.perf_counter() - t0, 2)
    if nan_rows:
        out_info["outcome"] = DeviceOutcome.NAN
        out_info["oracle"] = "skipped: the output has NaN; the oracle is finite (every row has keys)"
    else:
        cs = torch.tensor(lens, dtype=torch.int32)
        cu = torch.arange(len(lens) + 1, dtype=torch.int32)
        exact, lowp = reference_outputs(q.cpu(), k_cache.cpu(), v_cache.cpu(), cache_seqlens=cs, cu_seqlens_q=cu,
                                        max_seqlen_q=1, page_table=table.cpu(), causal=True)
        ok, err, bound = closeness(out.cpu(), exact, lowp)
        out_info.update(outcome=DeviceOutcome.AGREES if ok else DeviceOutcome.MISMATCH, max_error=err, bound=bound)
    out_info["seconds"] = round(time.perf_counter() - t0, 2)
    return out_info


def child_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fa3verify.commands.gpu_check",
                                description="run one worked example in this process (used under compute-sanitizer)")
    p.add_argument("--child-worked-example", choices=("pre-fix", "fixed"), required=True)
    p.add_argument("--adapter", default="fa3", choices=("fa3", "emulated"))
    p.add_argument("--device", default=None)
    p.add_argument("--long", type=int, default=WORKED_LONG)
    p.add_argument("--num-sm", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    device = a.device or ("cuda" if a.adapter == "fa3" else "cpu")
    result = worked_example_task({"name": a.adapter, "device": device}, a.child_worked_example, a.long, a.num_sm,
                                 a.seed)
    print("WORKED_EXAMPLE_RESULT " + json.dumps(result, default=str), flush=True)
    return 0
