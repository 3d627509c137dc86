"""Host overhead of the sanitizer per checked call, measured side by side (docs/performance.md).

Invariant measured: the wrapper's added host time per ``flash_attn_with_kvcache`` call that passes metadata
(median over many calls), against an empty function with the same arguments and against the emulated FA3 call.
The call is a paged decode like the modelled backend's (8 sequences of 1024 and 16 tokens, H=32, Hk=4, d=128, bf16, page 16),
metadata from a recorded precompute. Each mode runs the same call; ``follow_copies`` is on as installed, and the
cause check (``report_causes``) as the sanitizer runs it; the ``cause`` figures give the same call a precompute
with the pre-fix head counts (8, 1), which the sanitizer reports.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

__all__ = ["measure_overhead"]


def _median_us(fn: Callable[[], object], calls: int) -> float:
    for _ in range(min(200, calls)):
        fn()
    samples = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return statistics.median(samples) / 1000.0


def _decode(lens, heads=(32, 4), d=128, page=16):
    gen = torch.Generator().manual_seed(0)
    b = len(lens)
    width = -(-max(lens) // page)
    k = torch.randn(b * width, page, heads[1], d, generator=gen).to(torch.bfloat16)
    v = torch.randn(b * width, page, heads[1], d, generator=gen).to(torch.bfloat16)
    pt = torch.arange(b * width, dtype=torch.int32).reshape(b, width)
    q = torch.randn(b, heads[0], d, generator=gen).to(torch.bfloat16)
    return q, k, v, pt, torch.tensor(lens, dtype=torch.int32), torch.arange(b + 1, dtype=torch.int32)


def measure_overhead(calls: int = 2000, emulated_calls: int = 20) -> dict:
    """Median microseconds per call: empty function, wrapped empty function (quick: a repeated layer call, and
    the first call of a new shape/precompute pair; deep), emulated FA3 call, and the precompute wrapper;
    overheads are wrapped minus empty."""
    from gpu_impl.fa3_calls import CheckingFA3
    from gpu_impl.kernels.emulated import EmulatedKernel

    from .targets import make_wrapper

    lens = [1024] + [16] * 7
    q, k, v, pt, cs, cu = _decode(lens)
    kernel = EmulatedKernel()

    def empty(*args, **kwargs):
        return None

    out = {"shape": {"batch": len(lens), "lens": lens, "heads": [32, 4], "headdim": 128, "page_size": 16}}
    for deep in (False, True):
        checker = CheckingFA3(None, mode="record", deep=deep, max_events=100, report_causes=True)  # as installed
        pre_wrapper = make_wrapper(kernel.get_scheduler_metadata, "precompute", checker)
        md = pre_wrapper(batch_size=8, max_seqlen_q=1, max_seqlen_k=max(lens), num_heads_q=32, num_heads_kv=4,
                         headdim=128, cache_seqlens=cs, cu_seqlens_q=cu, page_size=16, causal=True)
        call_wrapper = make_wrapper(empty, "call", checker)
        kw = dict(q=q, k_cache=k, v_cache=v, page_table=pt, cache_seqlens=cs, cu_seqlens_q=cu, max_seqlen_q=1,
                  causal=True, scheduler_metadata=md, num_splits=0)
        name = "deep" if deep else "quick"
        out[f"wrapped_empty_{name}_us"] = _median_us(lambda: call_wrapper(**kw), calls if not deep else calls // 4)
        assert not checker.violations(), checker.violations()[:1]
        out.update(_lifecycle_costs(checker, call_wrapper, kw, name, calls if not deep else calls // 4))
        if not deep:
            def first_call():
                checker._calls.clear()     # a new layer shape / a new precompute: record and check afresh
                checker._memo.clear()
                return call_wrapper(**kw)

            out["wrapped_empty_quick_first_us"] = _median_us(first_call, calls // 2)
            out["empty_us"] = _median_us(lambda: empty(**kw), calls)
            out["emulated_call_us"] = _median_us(lambda: kernel.flash_attn_with_kvcache(**kw), emulated_calls)
            empty_pre = make_wrapper(lambda *a, **k: md, "precompute", checker)
            pkw = dict(batch_size=8, max_seqlen_q=1, max_seqlen_k=max(lens), num_heads_q=32, num_heads_kv=4,
                       headdim=128, cache_seqlens=cs, cu_seqlens_q=cu, page_size=16, causal=True)
            out["wrapped_empty_precompute_us"] = _median_us(lambda: empty_pre(**pkw), calls)
            out["emulated_precompute_us"] = _median_us(lambda: kernel.get_scheduler_metadata(**pkw), emulated_calls)
    out.update(_cause_costs(kernel, empty, q, k, v, pt, cs, cu, lens, calls))
    out["overhead_quick_us"] = out["wrapped_empty_quick_us"] - out["empty_us"]
    out["overhead_cause_us"] = out["wrapped_empty_cause_us"] - out["empty_us"]
    out["overhead_cause_first_us"] = out["wrapped_empty_cause_first_us"] - out["empty_us"]
    out["overhead_quick_first_us"] = out["wrapped_empty_quick_first_us"] - out["empty_us"]
    out["overhead_deep_us"] = out["wrapped_empty_deep_us"] - out["empty_us"]
    out["overhead_precompute_us"] = out["wrapped_empty_precompute_us"] - out["empty_us"]
    out["overhead_vs_emulated_call"] = out["overhead_quick_us"] / out["emulated_call_us"]
    for name in ("quick", "deep"):
        out[f"overhead_{name}_lifecycle_us"] = out[f"wrapped_empty_{name}_lifecycle_us"] - out["empty_us"]
    return out


def _lifecycle_costs(checker, call_wrapper, kw: dict, name: str, calls: int) -> dict:
    """The same wrapped call with the lifecycle checks on: the sanitizer's watch (gpu_impl.lifecycle_checks; the
    semaphore read with deep, as ``watch_lifecycle`` installs it) and, per launch, the engine drivers' judge of all six
    lifecycle invariants (gpu_impl.engines.lifecycle_judge: before and after the launch, on the call's record)."""
    from gpu_impl.engines.lifecycle_judge import LifecycleJudge
    from gpu_impl.lifecycle_checks import LifecycleWatch

    watch = LifecycleWatch(checker, semaphore=name == "deep", graph_cls=None).install()
    try:
        wrapped = _median_us(lambda: call_wrapper(**kw), calls)
    finally:
        watch.uninstall()
    assert not checker.violations(), checker.violations()[:1]
    pre, call, _ = checker.events[-1]
    md = kw["scheduler_metadata"]
    judge = LifecycleJudge()
    judge.note_precompute(pre, (0, 0))

    def judged():
        assert not judge.before(pre, call, md, (0, 0), "eager")
        judge.after(call, md, "eager")

    return {f"wrapped_empty_{name}_lifecycle_us": wrapped, f"engine_lifecycle_judge_{name}_us": _median_us(judged, calls)}


def _cause_costs(kernel, empty, q, k, v, pt, cs, cu, lens, calls: int) -> dict:
    """The same call given metadata precomputed with the pre-fix head counts (8, 1): the cause is reported
    (PRECOMPUTE_ARGUMENTS, record mode). Repeated (memoised verdict), first call of the pair (the worst-case scan
    cached: the same arguments seen before), and the scan itself once (``gpu_impl.fa3_arguments``, uncached)."""
    from gpu_impl.fa3_arguments import forget_worst_cases
    from gpu_impl.fa3_calls import CheckingFA3

    from .targets import make_wrapper

    checker = CheckingFA3(None, mode="record", max_events=100, report_causes=True)
    md = make_wrapper(kernel.get_scheduler_metadata, "precompute", checker)(
        batch_size=8, max_seqlen_q=1, max_seqlen_k=max(lens), num_heads_q=8, num_heads_kv=1, headdim=128,
        cache_seqlens=cs, cu_seqlens_q=cu, page_size=16, causal=True)
    call_wrapper = make_wrapper(empty, "call", checker)
    kw = dict(q=q, k_cache=k, v_cache=v, page_table=pt, cache_seqlens=cs, cu_seqlens_q=cu, max_seqlen_q=1,
              causal=True, scheduler_metadata=md, num_splits=0)
    forget_worst_cases()
    t0 = time.perf_counter_ns()
    call_wrapper(**kw)
    scan_ms = (time.perf_counter_ns() - t0) / 1e6
    assert [v.invariant for v in checker.violations()[-1][2]] == ["PRECOMPUTE_ARGUMENTS"], checker.violations()[-1]

    def first_call():
        checker._calls.clear()
        checker._memo.clear()
        return call_wrapper(**kw)

    return {"wrapped_empty_cause_us": _median_us(lambda: call_wrapper(**kw), calls),
            "wrapped_empty_cause_first_us": _median_us(first_call, calls // 2),
            "cause_first_seen_ms": scan_ms}
