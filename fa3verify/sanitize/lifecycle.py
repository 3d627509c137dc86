"""The runtime lifecycle checks (gpu_impl.lifecycle_checks) on a sanitizer: the semaphore before a launch, a
persistent metadata buffer's freshness before a CUDA-graph replay.

Opt-in, after the sanitizer is installed::

    from fa3verify import sanitize
    from fa3verify.sanitize.lifecycle import watch_lifecycle
    sanitize.install(mode="raise", deep=True)
    watch = watch_lifecycle()          # the semaphore is read only with deep=True (a device sync per call)

``watch.uninstall()`` restores what it wrapped. Violations go through the sanitizer's own path (raise, warn or
record; its log and case files).
"""

from __future__ import annotations

from typing import Optional

__all__ = ["watch_lifecycle", "measure_overhead"]


def watch_lifecycle(sanitizer=None, semaphore: Optional[bool] = None, graph_cls=None):
    """Install :class:`gpu_impl.lifecycle_checks.LifecycleWatch` on ``sanitizer``'s checker (default: the current
    one); ``semaphore`` defaults to the sanitizer's deep mode. ValueError when no sanitizer is installed."""
    from gpu_impl.lifecycle_checks import LifecycleWatch

    from . import current

    sanitizer = sanitizer if sanitizer is not None else current()
    if sanitizer is None:
        raise ValueError("sanitizer: none is installed (fa3verify.sanitize.install first)")
    deep = bool(sanitizer.deep) if semaphore is None else bool(semaphore)
    return LifecycleWatch(sanitizer.checker, semaphore=deep, graph_cls=graph_cls).install()


class _HostGraph:
    """torch.cuda.CUDAGraph's capture and replay methods on the host (what the measurement wraps)."""

    capturing = False

    def capture_begin(self):
        _HostGraph.capturing = True

    def capture_end(self):
        _HostGraph.capturing = False

    def replay(self):
        return None


def _median_us(fn, calls: int) -> float:
    import statistics
    import time

    for _ in range(min(200, calls)):
        fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1000.0


def _decode_tensors(lens, heads=(32, 4), d=128, page=16):
    """A serving backend's paged decode tensors (the values are never read: the call is an empty function)."""
    import torch

    b, width = len(lens), -(-max(lens) // page)
    k = torch.zeros(b * width, page, heads[1], d, dtype=torch.bfloat16)
    pt = torch.arange(b * width, dtype=torch.int32).reshape(b, width)
    q = torch.zeros(b, heads[0], d, dtype=torch.bfloat16)
    return q, k, k.clone(), pt, torch.tensor(lens, dtype=torch.int32), torch.arange(b + 1, dtype=torch.int32)


def measure_overhead(calls: int = 2000) -> dict:
    """Median microseconds on the host: a wrapped call (quick and deep) with and without the semaphore read, and a
    recompute-and-replay step (copy noted, graph replayed) with and without the watch, with and without the read.

    The call is the paged decode fa3verify.sanitize.overhead measures (8 sequences, H=32, Hk=4, d=128, bf16, page 16) over an
    empty function; the graph is a host stand-in for torch.cuda.CUDAGraph (no GPU: the read is a host read here).
    """
    import torch

    from gpu_impl.fa3_calls import CheckingFA3
    from gpu_impl.kernels.emulated import EmulatedKernel
    from gpu_impl.lifecycle_checks import LifecycleWatch

    from .targets import make_wrapper

    lens = [1024] + [16] * 7
    q, k, v, pt, cs, cu = _decode_tensors(lens)
    out = {}
    for deep in (False, True):
        checker = CheckingFA3(None, mode="record", deep=deep, max_events=100, capturing=lambda: _HostGraph.capturing)
        pre = make_wrapper(EmulatedKernel().get_scheduler_metadata, "precompute", checker)
        pkw = dict(batch_size=8, max_seqlen_q=1, max_seqlen_k=max(lens), num_heads_q=32, num_heads_kv=4, headdim=128,
                   cache_seqlens=cs, cu_seqlens_q=cu, page_size=16, causal=True)
        md = pre(**pkw)
        call = make_wrapper(lambda *a, **kw: None, "call", checker)
        kw = dict(q=q, k_cache=k, v_cache=v, page_table=pt, cache_seqlens=cs, cu_seqlens_q=cu, max_seqlen_q=1,
                  causal=True, num_splits=0)
        name, n = ("deep", calls // 4) if deep else ("quick", calls)
        out[f"call_{name}_us"] = _median_us(lambda: call(scheduler_metadata=md, **kw), n)
        watch = LifecycleWatch(checker, semaphore=True, graph_cls=_HostGraph).install()
        out[f"call_{name}_with_semaphore_read_us"] = _median_us(lambda: call(scheduler_metadata=md, **kw), n)
        watch.uninstall()
        if deep:
            continue
        buffer = torch.zeros(1 + 8 * 4, dtype=torch.int32)
        view = buffer[:md.numel()]
        view.copy_(md)
        checker.note_copy(view, md)
        graph = _HostGraph()
        for semaphore in (None, False, True):
            watch = LifecycleWatch(checker, semaphore=bool(semaphore), graph_cls=_HostGraph).install() \
                if semaphore is not None else None
            graph.capture_begin()
            call(scheduler_metadata=view, **kw)
            graph.capture_end()

            def step():
                view.copy_(md)
                checker.note_copy(view, md)
                graph.replay()
            key = {None: "replay_step_us", False: "replay_step_watched_us", True: "replay_step_watched_semaphore_us"}
            out[key[semaphore]] = _median_us(step, calls)
            if watch is not None:
                watch.uninstall()
        assert not checker.violations(), checker.violations()[:1]
    out["semaphore_read_quick_us"] = out["call_quick_with_semaphore_read_us"] - out["call_quick_us"]
    out["semaphore_read_deep_us"] = out["call_deep_with_semaphore_read_us"] - out["call_deep_us"]
    out["replay_watch_us"] = out["replay_step_watched_us"] - out["replay_step_us"]
    out["replay_watch_semaphore_us"] = out["replay_step_watched_semaphore_us"] - out["replay_step_us"]
    return out
