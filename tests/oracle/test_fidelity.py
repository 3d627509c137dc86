"""Metadata fidelity (fa3verify.fidelity): the comparison logic, the configuration stream, and the emulated adapter.

The real adapter is exercised by tests/gpu/test_fidelity_gpu.py; here stand-in adapters built on the emulator
show that a deviating implementation -- metadata or split count -- is reported with both values, and that
what FA3 does not promise (the order of tied sort keys, the unwritten slots) is not.
"""

from collections import Counter

import pytest
import torch

from fa3verify.fidelity import (FidelityConfig, FidelityReport, check_config, compare_metadata, head_pairs,
                                observe_num_splits, random_config, random_configs, run_fidelity)
from gpu_impl.kernels import load
from gpu_impl.kernels.emulated import EmulatedKernel
from refmodel.metadata import UNWRITTEN, MetadataLayout, encode_metadata, schedule_and_prepare

SMALL = dict(max_q_elems=1 << 16, max_kv_elems=1 << 20)


def prepared(lens, h=32, hk=4, d=128, causal=True, **kw):
    schedule, result = schedule_and_prepare(len(lens), 1, max(lens), h, hk, d, torch.tensor(lens, dtype=torch.int32),
                                            cu_seqlens_q=list(range(len(lens) + 1)), causal=causal, **kw)
    values = [int(x) for x in encode_metadata(schedule, result).tolist()]
    return schedule, result, values


# -- compare_metadata --------------------------------------------------------------------------------------


def test_identical_metadata_has_no_mismatch():
    schedule, result, values = prepared([32768] + [100] * 7)
    assert compare_metadata(values, schedule, result, [32768] + [100] * 7) == []


def test_unwritten_slots_are_not_compared():
    lens = [900, 5, 300, 77, 1200, 64]                 # b = 6, b4 = 8: slots 6 and 7 of each vector are never written
    schedule, result, values = prepared(lens)
    layout = MetadataLayout.for_schedule(schedule)
    garbage = list(values)
    for vec in range(layout.num_vectors):
        for slot in range(layout.batch_size, layout.b4):
            assert garbage[vec * layout.b4 + slot] == UNWRITTEN
            garbage[vec * layout.b4 + slot] = 123456789 + slot   # what torch.empty may hold on a GPU
    assert compare_metadata(garbage, schedule, result, lens) == []


def test_tied_sort_keys_compare_as_multisets():
    lens = [1000] * 5 + [3000] * 3                     # two runs of equal keys (one split each: key = n-blocks)
    schedule, result, values = prepared(lens, page_size=16, num_splits=1)
    layout = MetadataLayout.for_schedule(schedule)
    assert schedule.sort and schedule.swizzle and result.batch_idx == [5, 6, 7, 0, 1, 2, 3, 4]  # stable, descending
    offsets = [layout.splits_offset, layout.m_blocks_offset, layout.batch_idx_offset, layout.nheads_in_l2_offset]
    # FA3's merge sort may return the tied batches in any order: permute within each run, move tuples together
    fa3 = list(values)
    order = [7, 5, 6, 4, 0, 3, 1, 2]
    for vb, src in enumerate([2, 0, 1, 7, 3, 6, 4, 5]):
        for off in offsets:
            fa3[off + vb] = values[off + src]
    assert [fa3[layout.batch_idx_offset + vb] for vb in range(8)] == order
    assert compare_metadata(fa3, schedule, result, lens) == []
    # ... but moving a batch across runs of different keys is a mismatch
    swapped = list(values)
    for off in offsets:
        swapped[off + 0], swapped[off + 7] = values[off + 7], values[off + 0]
    found = compare_metadata(swapped, schedule, result, lens)
    assert found and all(m["field"] == "sorted_entries" for m in found)


def test_a_wrong_split_count_is_reported_with_both_values():
    lens = [32768] + [100] * 7
    schedule, result, values = prepared(lens, h=8, hk=1, page_size=1)     # docs/facts-fa3.md section 1: the tp=4 precompute
    wrong = list(values)
    wrong[0] = 29                                      # FA3 would have said 29 where refmodel says 86
    found = compare_metadata(wrong, schedule, result, lens)
    assert len(found) == 1
    m = found[0]
    assert m["field"] == "sorted_entries" and m["virtual_batches"] == [0, 1]
    assert m["fa3"][0][0] == 29 and m["refmodel"][0][0] == result.num_splits[0] == 86


def test_size_and_semaphore_mismatches():
    lens = [500, 20, 20]
    schedule, result, values = prepared(lens)
    assert compare_metadata(values[:-1], schedule, result, lens)[0]["field"] == "size"
    bad = list(values)
    bad[-1] = 7
    (m,) = compare_metadata(bad, schedule, result, lens)
    assert m["field"] == "semaphore" and m["fa3"] == 7 and m["refmodel"] == 0


def test_unsorted_layout_compares_element_by_element():
    lens = [700, 300, 40, 9, 1500]
    schedule, result, values = prepared(lens, window_size=(256, 0))   # local attention: no Sort vector
    assert not schedule.sort
    layout = MetadataLayout.for_schedule(schedule)
    bad = list(values)
    bad[layout.m_blocks_offset + 3] += 1
    (m,) = compare_metadata(bad, schedule, result, lens)
    assert m["field"] == "num_m_blocks" and m["virtual_batches"] == [3] and m["fa3"] == [m["refmodel"][0] + 1]


# -- the configuration stream --------------------------------------------------------------------------------


def test_configs_are_seeded_and_chunkable():
    assert random_configs(5, seed=3) == random_configs(5, seed=3)
    assert random_configs(5, seed=3) != random_configs(5, seed=4)
    assert random_configs(3, seed=3, start=2) == random_configs(5, seed=3)[2:]
    cfg = random_config(7, 11)
    assert FidelityConfig.from_dict(cfg.to_dict()) == cfg


def test_configs_cover_the_space():
    cfgs = random_configs(3000, seed=0)
    kinds = Counter(c.kind for c in cfgs)
    assert kinds["decode"] > 1500 and kinds["prefill"] > 500
    assert {c.headdim for c in cfgs} == {64, 128, 256}
    assert min(c.batch_size for c in cfgs) == 1 and max(c.batch_size for c in cfgs) == 64
    assert max(c.max_seqlen_k for c in cfgs) > 100_000 and min(c.max_seqlen_k for c in cfgs) < 16
    assert all(c.max_seqlen_k <= 131072 for c in cfgs)
    assert {c.causal for c in cfgs} == {True, False}
    assert {c.num_splits > 0 for c in cfgs} == {True, False}
    assert any(c.page_size for c in cfgs) and any(c.page_size is None for c in cfgs)
    assert any(c.static_call for c in cfgs) and any(c.varlen_q for c in cfgs)
    ratios = {c.num_heads // c.num_heads_k for c in cfgs}
    assert {1, 2, 4, 8, 16, 48, 71} <= ratios
    for c in cfgs:
        assert len(c.cache_seqlens) == len(c.seqlens_q) == c.batch_size
        assert max(c.seqlens_q) == c.max_seqlen_q and max(c.cache_seqlens) <= c.max_seqlen_k
        assert all(k >= q for k, q in zip(c.cache_seqlens, c.seqlens_q))
        assert c.num_heads % c.num_heads_k == 0
    assert not any(c.page_size for c in random_configs(300, seed=0, paged=False))
    assert all(h % hk == 0 for h, hk, _ in head_pairs())


# -- against adapters -----------------------------------------------------------------------------------------


def test_emulated_adapter_has_zero_mismatches():
    report = run_fidelity(load("emulated"), 16, seed=1, **SMALL)
    assert report.configs == 16 and report.split_checked == 16
    assert report.ok, report.findings
    d = report.to_dict()
    assert d["ok"] and d["metadata_mismatches"] == 0 and d["split_mismatches"] == 0
    merged = FidelityReport.from_dict(d)
    merged.merge(report)
    assert merged.configs == 32


class SkewedMetadata(EmulatedKernel):
    """An implementation whose prepare step gives the first virtual batch one split more."""

    name = "skewed-metadata"

    def get_scheduler_metadata(self, *args, **kwargs):
        md = super().get_scheduler_metadata(*args, **kwargs).clone()
        md[0] += 1
        return md


class _Accumulators:
    """A stand-in FA3 module: runs the emulator, returns (out, lse, out_accum, lse_accum) like fa3_fwd_interface."""

    def __init__(self, adapter, extra):
        self.adapter, self.extra = adapter, extra

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, return_softmax_lse=False, **kw):
        out, lse, *_ = EmulatedKernel.flash_attn_with_kvcache(self.adapter, q, k_cache, v_cache, return_softmax_lse=True, **kw)
        s = self.adapter.last_trace["schedule"]["num_splits"] + self.extra
        accum = torch.zeros(s, 1) if s > 1 else torch.tensor([])
        return out, lse, accum, accum


class ModuleBacked(EmulatedKernel):
    """Looks like the real adapter to the fidelity check: an FA3 ``module`` whose out_accum says S_c."""

    name = "module-backed"

    def __init__(self, extra=0, **kw):
        super().__init__(**kw)
        self.module = _Accumulators(self, extra)


class TraceObserved(EmulatedKernel):
    """Records ``observed_num_splits`` like the real adapter does (None: FA3 did not split)."""

    name = "trace-observed"

    def __init__(self, extra=0, **kw):
        super().__init__(**kw)
        self.extra = extra

    def _run(self, args):
        result = super()._run(args)
        s = self.last_trace["schedule"]["num_splits"] + self.extra
        self.last_trace["observed_num_splits"] = s if s > 1 else None
        return result


def test_metadata_deviation_is_a_finding_with_both_values():
    report = run_fidelity(SkewedMetadata(), 6, seed=2, probe_split=False)
    assert report.metadata_mismatches == 6 and not report.ok
    f = report.findings[0]
    assert f["kind"] == "metadata" and f["config"]["index"] == 0
    m = f["mismatches"][0]
    assert m["fa3"] != m["refmodel"] and m["fa3"][0][0] == m["refmodel"][0][0] + 1


@pytest.mark.parametrize("adapter_cls", [ModuleBacked, TraceObserved])
def test_split_count_is_observed_like_on_the_real_kernel(adapter_cls):
    faithful = run_fidelity(adapter_cls(extra=0), 6, seed=3, **SMALL)
    assert faithful.ok and faithful.split_checked == 6, faithful.findings
    off = run_fidelity(adapter_cls(extra=2), 6, seed=3, **SMALL)
    assert off.split_mismatches == 6 and off.metadata_mismatches == 0
    f = off.findings[0]
    assert f["kind"] == "split_count" and f["fa3"] == f["refmodel"] + 2
    assert "out_accum" in f["probe"]["how"]


def test_observe_reads_the_emulator_trace():
    kern = load("emulated")
    q = torch.zeros(2, 1, 8, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 4096, 2, 64, dtype=torch.bfloat16)
    s, how = observe_num_splits(kern, q, k, k.clone(), cache_seqlens=torch.ones(2, dtype=torch.int32), causal=True)
    assert s == kern.last_trace["schedule"]["num_splits"] and s > 1 and how == "last_trace schedule"


def test_adapter_errors_are_findings_not_crashes():
    class Rejects(EmulatedKernel):
        name = "rejects"

        def get_scheduler_metadata(self, *a, **kw):
            raise RuntimeError("headdim 256 not compiled")

    report = run_fidelity(Rejects(), 3, seed=0)
    assert report.errors == 3 and not report.ok
    assert "headdim 256 not compiled" in report.findings[0]["error"]


def test_cuda_errors_propagate_to_the_worker_pool():
    class Dies(EmulatedKernel):
        name = "dies"

        def get_scheduler_metadata(self, *a, **kw):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        run_fidelity(Dies(), 2, seed=0)


def test_paged_configs_only_where_the_adapter_runs_paged_kv():
    class NoPaged(EmulatedKernel):
        name = "no-paged"
        paged_kv_supported = False

    seen = []

    class Spy(NoPaged):
        def get_scheduler_metadata(self, *a, **kw):
            seen.append(kw.get("page_size"))
            return super().get_scheduler_metadata(*a, **kw)

    run_fidelity(Spy(), 10, seed=5, probe_split=False)
    assert seen and all(p is None for p in seen)
    cfg = next(c for c in random_configs(50, seed=5) if c.page_size)
    res = check_config(load("emulated"), cfg, **SMALL)
    assert res["metadata"] == [] and res["split"]["paged"]
