"""sglang's FA3 stand-in can judge under the build read from its release's kernel wheel (refmodel/fa3_builds.json).

The worker judges under the build its SUT names (``FA3VERIFY_FA3_BUILD``, from ``EnginePlugin.fa3_build``), so the
reports' build and the judging build are one. Runs without an engine environment: the stand-in's FA3 front
(``EngineFA3``), the worker's build choice, and the call records it makes.
"""

import torch

from gpu_impl.engines.sglang.driver import EngineFA3
from gpu_impl.fa3_records import call_schedule_of, record_call, record_precompute, precompute_schedule
from refmodel.fa3_builds import SGLANG_KERNEL_042, SGLANG_KERNEL_045, UPSTREAM, build_for_engine


def test_the_front_records_and_checks_under_the_build_it_is_given():
    front = EngineFA3(132, numerics=False, build=build_for_engine("sglang", "0.5.23"))
    assert front.build == front.checker.build == SGLANG_KERNEL_045
    # numerics run on the emulator, which models upstream's kernel: judged under upstream's build
    assert EngineFA3(132, numerics=True, build=SGLANG_KERNEL_045).build == UPSTREAM


def test_the_worker_judges_under_the_build_its_sut_names(monkeypatch):
    import pytest

    from gpu_impl.engines.sglang.driver import Engine
    from gpu_impl.sut import parse_engine

    for release in ("0.5.13", "0.5.23"):
        spec = parse_engine(f"sglang=={release}")
        monkeypatch.setenv("FA3VERIFY_FA3_BUILD", spec.plugin.fa3_build(spec))
        assert Engine.fa3_build(None) == spec.plugin.fa3_build(spec)
    monkeypatch.setenv("FA3VERIFY_FA3_BUILD", SGLANG_KERNEL_045)
    assert Engine.fa3_build(None) == SGLANG_KERNEL_045
    monkeypatch.delenv("FA3VERIFY_FA3_BUILD")
    assert Engine.fa3_build(None) == UPSTREAM
    monkeypatch.setenv("FA3VERIFY_FA3_BUILD", "nope")
    with pytest.raises(ValueError, match="build: must be one of"):
        Engine.fa3_build(None)


def _decode_call(batch: int, build: str):
    # varlen decode as sglang makes it: q (b, 1, h, d) rows through cu_seqlens_q, paged KV, 32 query / 4 KV heads
    q = torch.zeros(batch, 32, 128, dtype=torch.bfloat16)
    kc = torch.zeros(64, 1, 4, 128, dtype=torch.bfloat16)
    return record_call(q, kc, kc, cache_seqlens=torch.full((batch,), 32768, dtype=torch.int32),
                       page_table=torch.zeros(batch, 40960, dtype=torch.int32),
                       cu_seqlens_q=torch.arange(batch + 1, dtype=torch.int32), max_seqlen_q=1, causal=True,
                       read_tensors=True, build=build)


def test_a_call_record_carries_its_real_rows_under_a_build_that_reads_them():
    # the worked example's call side at batch 64: 0.4.5 counts 64 rows (S_c 4), 0.4.2 and upstream one sequence (29)
    assert call_schedule_of(_decode_call(64, SGLANG_KERNEL_045)).num_splits == 4
    assert call_schedule_of(_decode_call(64, SGLANG_KERNEL_042)).num_splits == 29
    assert call_schedule_of(_decode_call(64, UPSTREAM)).num_splits == 29
    # the key holds total_q only where it is read (violation signatures stay length-free elsewhere)
    assert _decode_call(64, SGLANG_KERNEL_045).schedule_key()[-1] == 64
    assert _decode_call(64, SGLANG_KERNEL_042).schedule_key()[-1] is None


def test_the_precompute_bounds_by_batch_times_max_seqlen_q():
    pre = record_precompute(64, 1, 40960, 8, 1, 128, torch.full((64,), 32768, dtype=torch.int32), page_size=1,
                            causal=True, build=SGLANG_KERNEL_045, read_tensors=True)
    assert precompute_schedule(pre).num_splits == 15


def _total_q_bound_case(build: str):
    # same heads on both sides (h 16 / h_k 2, d 64, paged, causal); the precompute's bound is b * max_seqlen_q =
    # 16 * 64 rows, the call's its real 772 rows (15 x 48 + 52); one 4096-key sequence, fifteen of 100
    import itertools

    from refmodel.metadata import schedule_and_prepare
    from spec.invariants import check_split_bound

    lq = [48] * 15 + [52]
    lk = [4096] + [100] * 15
    cu = torch.tensor([0] + list(itertools.accumulate(lq)), dtype=torch.int32)
    P, R = schedule_and_prepare(16, 64, 4096, 16, 2, 64, torch.tensor(lk, dtype=torch.int32), cu_seqlens_q=cu,
                                page_size=1, causal=True, build=build)
    from refmodel.fa3_scheduler import call_inputs, resolve_schedule

    C = resolve_schedule(call_inputs(16, 64, 4096, 16, 2, 64, page_size=1, causal=True, varlen_q=True,
                                     total_q=sum(lq), build=build))
    return P, R, C, check_split_bound(P, R, C, {"seqused_k": lk, "seqlens_q": lq})


def test_the_varlen_total_q_bound_can_overflow_the_call_s_split_buffers():
    # the split heuristic is not monotone in m-blocks: the precompute's 16 m-blocks per KV head give S_p 3, the
    # call's 13 give S_c 2, and the long sequence's 3 splits overflow the call's 2 partial buffers (SPLIT_BOUND)
    P, R, C, violations = _total_q_bound_case(SGLANG_KERNEL_045)
    assert (P.num_splits, C.num_splits, R.num_splits[0]) == (3, 2, 3)
    assert [v.invariant for v in violations] == ["SPLIT_BOUND"]
    # negative control: the builds that bound a varlen call by one sequence schedule both sides alike
    for build in (SGLANG_KERNEL_042, UPSTREAM):
        P, R, C, violations = _total_q_bound_case(build)
        assert P.num_splits == C.num_splits and violations == []
