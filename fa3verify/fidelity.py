"""Metadata fidelity: does refmodel predict what an FA3 implementation computes?

For N seeded random configurations (decode and small prefill shapes; head dims 64/128/256; per-rank head
counts of real models under attention TP 1/2/4/8; batch 1..64; lengths up to 128k; causal or not; the split
heuristic or a fixed split count; paged KV where the adapter supports it) two things are compared:

1. **The metadata tensor.** The adapter's ``get_scheduler_metadata(...)`` against refmodel's
   (:func:`refmodel.metadata.schedule_and_prepare` + :func:`~refmodel.metadata.encode_metadata`, with the
   adapter's SM count and arch), element by element on the slots FA3 writes: ``[0, b)`` of each per-batch
   vector and the semaphore. Slots ``[b, b4)`` are never written by FA3 (``torch.empty`` garbage; refmodel
   fills them with ``UNWRITTEN``) and are not compared. FA3 sorts batches with cub's merge sort, which
   promises no order for equal keys, while refmodel sorts stably, so within each run of equal sort keys
   (refmodel's keys, in refmodel's order) the *multisets* of ``(splits, m_blocks, batch_idx, heads_in_l2)``
   tuples are compared, not their order.
2. **The split count the call chooses** (``S_c``, which sizes the partial buffers): observed on the real
   kernel from the accumulators FA3 returns with ``return_softmax_lse=True`` (``(out, lse, out_accum,
   lse_accum)``: ``out_accum.size(0)`` is S_c, an empty tensor means 1; the real adapter records it as
   ``last_trace["observed_num_splits"]``), on the emulator from ``last_trace["schedule"]``; predicted by
   refmodel's :func:`~refmodel.fa3_scheduler.get_num_splits` on the shapes the kernel receives
   (``adapter.effective_call_inputs``: the real adapter gathers paged KV into a contiguous cache on a build
   without paged KV). The probe call reads one key per batch (``cache_seqlens = 1``: S_c depends on static
   shapes only), and runs fewer batches when the tensors would be large (a varlen call's S_c does not depend
   on the batch size; a static call's prediction uses the batch size that ran).

Mismatches are findings with both values. The same code runs against the emulated adapter on CPU (zero
mismatches expected: it *is* refmodel) and against the real FA3 adapter on a GPU (a drop-in: nothing here
depends on which adapter it is, except how the split count is observed).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

# the configurations are the strategy family ``fidelity`` (the one strategy source); re-exported here
from .strategies.fidelity_configs import (ATTN_TP_SIZES, FIXED_SPLITS, HEAD_DIMS, MAX_PREFILL_Q,  # noqa: F401
                                          MAX_SEQLEN_K, PAGE_SIZES, FidelityConfig, head_pairs, random_config,
                                          random_configs)

__all__ = ["FidelityConfig", "FidelityReport", "random_config", "random_configs", "head_pairs",
           "compare_metadata", "check_config", "adapter_build", "observe_num_splits", "run_fidelity", "fidelity_task",
           "load_adapter"]

#: Fields of one sorted entry, in tuple order.
TUPLE_FIELDS = ("num_splits", "num_m_blocks", "batch_idx", "nheads_in_l2")


# ----------------------------------------------------------------------------------------------------------
# Comparing metadata tensors
# ----------------------------------------------------------------------------------------------------------


def _sort_keys(schedule, result, seqused: list[int]) -> list[int]:
    """refmodel's sort key of each virtual batch (n-blocks per split; causal: minus the m-rows), in its order."""
    from refmodel.fa3_scheduler import ceil_div
    from refmodel.prepare import n_blocks_for, sort_key

    keys = []
    for vb, bb in enumerate(result.batch_idx):
        n = n_blocks_for(int(seqused[bb]), 0, schedule.inputs.seqlen_knew, schedule.block_n)
        per_split = ceil_div(n, max(1, result.num_splits[vb]))
        keys.append(sort_key(schedule, per_split, result.num_m_blocks[vb]))
    return keys


def compare_metadata(md_values: list[int], schedule, result, seqused: list[int], max_items: int = 8) -> list[dict]:
    """Mismatches between an implementation's metadata (``md_values``, a flat int list) and refmodel's.

    Only written slots are compared; with Sort, tied sort keys compare as multisets of per-batch tuples.
    Each mismatch: ``{"field", "slots" or "virtual_batches", "fa3", "refmodel"}``.
    """
    from refmodel.metadata import MetadataLayout, encode_metadata

    expected = [int(x) for x in encode_metadata(schedule, result).tolist()]
    if len(md_values) != len(expected):
        return [{"field": "size", "fa3": len(md_values), "refmodel": len(expected),
                 "detail": "metadata length differs (nvec * b4 + semaphore)"}]
    layout = MetadataLayout.for_schedule(schedule)
    b = layout.batch_size
    offsets = {"num_splits": layout.splits_offset, "num_m_blocks": layout.m_blocks_offset,
               "batch_idx": layout.batch_idx_offset, "nheads_in_l2": layout.nheads_in_l2_offset}
    present = [f for f in TUPLE_FIELDS if offsets[f] is not None]

    def entry(values, vb):
        return tuple(values[offsets[f] + vb] for f in present)

    out: list[dict] = []
    if layout.sort:
        keys = _sort_keys(schedule, result, seqused)
        start = 0
        while start < b:
            end = start + 1
            while end < b and keys[end] == keys[start]:
                end += 1
            got = Counter(entry(md_values, vb) for vb in range(start, end))
            want = Counter(entry(expected, vb) for vb in range(start, end))
            if got != want:
                out.append({"field": "sorted_entries", "fields": present, "virtual_batches": [start, end],
                            "sort_key": keys[start],
                            "fa3": [list(t) for t in sorted(got.elements())][:max_items],
                            "refmodel": [list(t) for t in sorted(want.elements())][:max_items]})
            start = end
    else:
        for name in present:
            off = offsets[name]
            bad = [vb for vb in range(b) if md_values[off + vb] != expected[off + vb]]
            if bad:
                out.append({"field": name, "virtual_batches": bad[:max_items],
                            "fa3": [md_values[off + vb] for vb in bad[:max_items]],
                            "refmodel": [expected[off + vb] for vb in bad[:max_items]]})
    if layout.has_semaphore and md_values[layout.semaphore_offset] != expected[layout.semaphore_offset]:
        out.append({"field": "semaphore", "slots": [layout.semaphore_offset],
                    "fa3": md_values[layout.semaphore_offset], "refmodel": expected[layout.semaphore_offset]})
    return out


# ----------------------------------------------------------------------------------------------------------
# One configuration against one adapter
# ----------------------------------------------------------------------------------------------------------


def _device(adapter):
    import torch

    return adapter.device if getattr(adapter, "device", None) is not None else torch.device("cpu")


def adapter_supports_paged(adapter) -> bool:
    """Whether the adapter runs paged KV natively (the real ``fa3-fwd`` build does not: no paged configs then)."""
    return bool(getattr(adapter, "paged_kv_supported", True))


def adapter_build(adapter) -> str:
    """The refmodel build an adapter's FA3 is judged as (``adapter.build``; upstream's when it names none)."""
    from refmodel import fa3_builds

    return fa3_builds.check_build_name(getattr(adapter, "build", None))


def observe_num_splits(adapter, q, k_cache, v_cache, **call) -> tuple[int, str]:
    """(S_c, how it was observed) for one ``flash_attn_with_kvcache`` call on ``adapter``.

    The call goes through the adapter with ``return_softmax_lse=True``. The real FA3 adapter records the
    leading dim of the ``out_accum`` FA3 returned as ``last_trace["observed_num_splits"]`` (None: an empty
    accumulator, FA3 did not split, S_c = 1). An adapter object that exposes an FA3 ``module`` but records no
    observation is bypassed: the module is called directly and ``out_accum.size(0)`` read. Otherwise (the
    emulator) S_c is the schedule the adapter ran, ``last_trace["schedule"]["num_splits"]``.
    """
    import torch

    module = getattr(adapter, "module", None)
    adapter.flash_attn_with_kvcache(q, k_cache, v_cache, return_softmax_lse=True, **call)
    if q.is_cuda:
        torch.cuda.synchronize()
    trace = getattr(adapter, "last_trace", None) or {}
    if "observed_num_splits" in trace:
        observed = trace["observed_num_splits"]
        return (1 if observed is None else int(observed)), "out_accum.size(0) via the adapter"
    if module is not None and hasattr(module, "flash_attn_with_kvcache"):
        result = module.flash_attn_with_kvcache(q, k_cache, v_cache, return_softmax_lse=True, **call)
        if q.is_cuda:
            torch.cuda.synchronize()
        if not isinstance(result, (tuple, list)) or len(result) < 3 or result[2] is None:
            raise RuntimeError(f"{getattr(adapter, 'module_name', 'module')}.flash_attn_with_kvcache returned no "
                               f"accumulators with return_softmax_lse=True")
        accum = result[2]
        return (int(accum.shape[0]) if accum.dim() >= 1 and accum.numel() > 0 else 1), "out_accum.size(0)"
    return int(trace["schedule"]["num_splits"]), "last_trace schedule"


def _probe_tensors(adapter, cfg: FidelityConfig, max_q_elems: int, max_kv_elems: int):
    """q/k/v and call arguments for the split-count probe (see the module doc), plus the batch size used."""
    import torch

    dev = _device(adapter)
    h, hk, d, dv = cfg.num_heads, cfg.num_heads_k, cfg.headdim, cfg.headdim_v
    paged = cfg.page_size is not None and adapter_supports_paged(adapter)
    per_q = max(cfg.seqlens_q) * h * d
    per_kv = 0 if paged else cfg.max_seqlen_k * hk * max(d, dv)
    b = cfg.batch_size
    b = max(1, min(b, max_q_elems // max(per_q, 1)))
    if per_kv:
        b = max(1, min(b, max_kv_elems // per_kv))
    dtype = torch.bfloat16
    call: dict[str, Any] = dict(causal=cfg.causal, num_splits=cfg.num_splits, sm_margin=cfg.sm_margin)
    lq = list(cfg.seqlens_q[:b])
    if cfg.varlen_q:
        q = torch.zeros(sum(lq), h, d, dtype=dtype, device=dev)
        cu = [0]
        for n in lq:
            cu.append(cu[-1] + n)
        call["cu_seqlens_q"] = torch.tensor(cu, dtype=torch.int32, device=dev)
        call["max_seqlen_q"] = cfg.max_seqlen_q
    else:
        q = torch.zeros(b, cfg.max_seqlen_q, h, d, dtype=dtype, device=dev)
    if paged:
        pages = -(-cfg.max_seqlen_k // cfg.page_size)
        k = torch.zeros(1, cfg.page_size, hk, d, dtype=dtype, device=dev)
        v = torch.zeros(1, cfg.page_size, hk, dv, dtype=dtype, device=dev)
        call["page_table"] = torch.zeros(b, pages, dtype=torch.int32, device=dev)
    elif cfg.static_call:
        k = torch.zeros(b, cfg.max_seqlen_k, hk, d, dtype=dtype, device=dev)
        v = torch.zeros(b, cfg.max_seqlen_k, hk, dv, dtype=dtype, device=dev)
    else:
        # Only the first key of each batch is read (cache_seqlens = 1): leave the rest uninitialised.
        k = torch.empty(b, cfg.max_seqlen_k, hk, d, dtype=dtype, device=dev)
        v = torch.empty(b, cfg.max_seqlen_k, hk, dv, dtype=dtype, device=dev)
        k[:, :1].zero_()
        v[:, :1].zero_()
    if not cfg.static_call:
        call["cache_seqlens"] = torch.ones(b, dtype=torch.int32, device=dev)
    return q, k, v, call, b


def check_config(adapter, cfg: FidelityConfig, probe_split: bool = True, max_q_elems: int = 1 << 24,
                 max_kv_elems: int = 1 << 28) -> dict:
    """Compare one configuration on ``adapter``; returns ``{"index", "metadata": [...], "split": {...} | None}``.

    ``metadata`` lists mismatches (empty: faithful); ``split`` holds ``observed``, ``predicted``, ``how`` and
    the probe's ``batch_size``. Exceptions from the adapter propagate (the caller records them).
    """
    import torch

    from refmodel.fa3_scheduler import get_num_splits
    from refmodel.metadata import schedule_and_prepare

    dev = _device(adapter)
    build = adapter_build(adapter)
    page_size = cfg.page_size if adapter_supports_paged(adapter) else None
    seqused = torch.tensor(cfg.cache_seqlens, dtype=torch.int32)
    cu = None
    if cfg.varlen_q:
        acc = [0]
        for n in cfg.seqlens_q:
            acc.append(acc[-1] + n)
        cu = torch.tensor(acc, dtype=torch.int32)
    md = adapter.get_scheduler_metadata(
        cfg.batch_size, cfg.max_seqlen_q, cfg.max_seqlen_k, cfg.num_heads, cfg.num_heads_k, cfg.headdim,
        seqused.to(dev), qkv_dtype=torch.bfloat16, headdim_v=cfg.headdim_v,
        cu_seqlens_q=None if cu is None else cu.to(dev), page_size=page_size, causal=cfg.causal,
        num_splits=cfg.num_splits, sm_margin=cfg.sm_margin)
    md_values = [int(x) for x in md.detach().to("cpu").reshape(-1).tolist()]
    schedule, result = schedule_and_prepare(
        cfg.batch_size, cfg.max_seqlen_q, cfg.max_seqlen_k, cfg.num_heads, cfg.num_heads_k, cfg.headdim, seqused,
        qkv_dtype="bfloat16", headdim_v=cfg.headdim_v, cu_seqlens_q=cu, page_size=page_size, causal=cfg.causal,
        num_splits=cfg.num_splits, sm_margin=cfg.sm_margin, num_sm=int(getattr(adapter, "num_sm", 132)),
        arch=int(getattr(adapter, "arch", 90)), build=build)
    mismatches = compare_metadata(md_values, schedule, result, list(cfg.cache_seqlens))
    fast_math = None
    if mismatches:
        # FA3's prepare kernel divides with fast math (refmodel.fastmath): where the <= 2-ulp error can move
        # blocks_per_sm, the GPU's value is one of the candidates, not necessarily IEEE's
        from refmodel.fastmath import fast_math_split_change
        from refmodel.prepare import prepare_scheduler

        seqlens_q = list(cfg.seqlens_q) if cfg.varlen_q else None
        change = fast_math_split_change(schedule, list(cfg.cache_seqlens), seqlens_q)
        for bps in (change or {}).get("candidates", []):
            alt = prepare_scheduler(schedule, list(cfg.cache_seqlens), seqlens_q=seqlens_q, blocks_per_sm_value=bps)
            if not compare_metadata(md_values, schedule, alt, list(cfg.cache_seqlens)):
                mismatches, fast_math = [], {"blocks_per_sm": bps, "ieee": change["ieee"],
                                             "candidates": change["candidates"]}
                break
    out = {"index": cfg.index, "metadata": mismatches, "split": None, "fast_math": fast_math}
    if probe_split:
        q, k, v, call, b = _probe_tensors(adapter, cfg, max_q_elems, max_kv_elems)
        effective = adapter.effective_call_inputs(q, k, v, **call)
        predicted = get_num_splits(effective)
        observed, how = observe_num_splits(adapter, q, k, v, **call)
        out["split"] = {"observed": observed, "predicted": predicted, "how": how, "batch_size": b,
                        "static_call": cfg.static_call, "seqlen_k": effective.seqlen_k,
                        "paged": effective.page_size is not None}
        del q, k, v
    return out


# ----------------------------------------------------------------------------------------------------------
# Many configurations
# ----------------------------------------------------------------------------------------------------------


@dataclass
class FidelityReport:
    """Counts and the first findings of a fidelity run (``ok``: no mismatch and no error)."""

    adapter: str = ""
    build: str = ""                  # the refmodel build the adapter's FA3 is judged as
    seed: int = 0
    configs: int = 0
    metadata_mismatches: int = 0     # configurations whose metadata differs on a written slot
    split_checked: int = 0
    split_mismatches: int = 0        # configurations whose observed S_c differs from refmodel's
    errors: int = 0                  # configurations the adapter raised on
    seconds: float = 0.0
    findings: list = field(default_factory=list)
    kinds: dict = field(default_factory=dict)  # decode/prefill/paged/static/causal counts, for coverage

    @property
    def ok(self) -> bool:
        return self.configs > 0 and not (self.metadata_mismatches or self.split_mismatches or self.errors)

    def merge(self, other: "FidelityReport", max_findings: int = 50) -> None:
        self.adapter = self.adapter or other.adapter
        self.build = self.build or other.build
        self.configs += other.configs
        self.metadata_mismatches += other.metadata_mismatches
        self.split_checked += other.split_checked
        self.split_mismatches += other.split_mismatches
        self.errors += other.errors
        self.seconds += other.seconds
        self.findings.extend(other.findings[:max(0, max_findings - len(self.findings))])
        for k, v in other.kinds.items():
            self.kinds[k] = self.kinds.get(k, 0) + v

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        d["configs_per_s"] = round(self.configs / self.seconds, 1) if self.seconds > 0 else 0.0
        d["seconds"] = round(self.seconds, 3)
        return d

    @classmethod
    def from_dict(cls, data: dict) -> "FidelityReport":
        d = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**d)


def _count_kinds(report: FidelityReport, cfg: FidelityConfig) -> None:
    for tag, on in (("decode", cfg.kind == "decode"), ("prefill", cfg.kind == "prefill"),
                    ("paged", cfg.page_size is not None), ("causal", cfg.causal),
                    ("fixed_splits", cfg.num_splits > 0), ("static_call", cfg.static_call),
                    ("varlen_q", cfg.varlen_q), ("long_128k", cfg.max_seqlen_k > 65536),
                    (f"d{cfg.headdim}", True)):
        if on:
            report.kinds[tag] = report.kinds.get(tag, 0) + 1


def run_fidelity(adapter, n: int, seed: int = 0, start: int = 0, probe_split: bool = True,
                 max_findings: int = 50, deadline: Optional[float] = None, max_q_elems: int = 1 << 24,
                 max_kv_elems: int = 1 << 28) -> FidelityReport:
    """Check configurations ``start .. start+n-1`` of stream ``seed`` on ``adapter``.

    ``deadline`` (a ``time.perf_counter()`` value) stops early; ``configs`` says how many ran.
    """
    report = FidelityReport(adapter=getattr(adapter, "name", type(adapter).__name__), build=adapter_build(adapter),
                            seed=seed)
    t0 = time.perf_counter()
    paged = adapter_supports_paged(adapter)
    for cfg in random_configs(n, seed, paged=paged, start=start):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        report.configs += 1
        _count_kinds(report, cfg)
        try:
            res = check_config(adapter, cfg, probe_split, max_q_elems, max_kv_elems)
        except Exception as exc:  # noqa: BLE001 - a configuration the adapter rejects is a finding
            from .workers import is_cuda_error

            if is_cuda_error(str(exc)):
                raise  # the context is gone: let the worker pool record the crash
            report.errors += 1
            _add(report, max_findings, {"kind": "error", "config": cfg.to_dict(),
                                        "error": f"{type(exc).__name__}: {exc}"[:2000]})
            continue
        if res["metadata"]:
            report.metadata_mismatches += 1
            _add(report, max_findings, {"kind": "metadata", "config": cfg.to_dict(), "mismatches": res["metadata"]})
        split = res["split"]
        if split is not None:
            report.split_checked += 1
            if split["observed"] != split["predicted"]:
                report.split_mismatches += 1
                _add(report, max_findings, {"kind": "split_count", "config": cfg.to_dict(),
                                            "fa3": split["observed"], "refmodel": split["predicted"],
                                            "probe": split})
    report.seconds = time.perf_counter() - t0
    return report


def _add(report: FidelityReport, limit: int, finding: dict) -> None:
    if len(report.findings) < limit:
        report.findings.append(finding)


# ----------------------------------------------------------------------------------------------------------
# Worker entry points
# ----------------------------------------------------------------------------------------------------------


def load_adapter(name: str, mode: str = "strict", device: Optional[str] = None, **options):
    """The adapter ``gpu_impl.kernels.load(name, mode, device, **options)``, cached per process (worker state)."""
    from gpu_impl.kernels import load

    from .workers import worker_state

    cache = worker_state().setdefault("adapters", {})
    key = (name, mode, device, tuple(sorted(options.items())))
    if key not in cache:
        cache[key] = load(name, mode=mode, device=device, **options)
    return cache[key]


def fidelity_task(adapter_name: str, device: Optional[str], seed: int, start: int, count: int,
                  budget_s: Optional[float] = None, options: Optional[dict] = None, max_q_elems: int = 1 << 24,
                  max_kv_elems: int = 1 << 28) -> dict:
    """Worker task: one chunk of configurations; returns ``FidelityReport.to_dict()`` plus ``describe``."""
    adapter = load_adapter(adapter_name, "strict", device, **(options or {}))
    deadline = None if budget_s is None else time.perf_counter() + budget_s
    report = run_fidelity(adapter, count, seed=seed, start=start, deadline=deadline, max_q_elems=max_q_elems,
                          max_kv_elems=max_kv_elems)
    d = report.to_dict()
    d["describe"] = adapter.describe()
    if device is not None and str(device).startswith("cuda"):
        import torch

        torch.cuda.empty_cache()  # the probes' large caches: give the memory back to the next stage
    return d
