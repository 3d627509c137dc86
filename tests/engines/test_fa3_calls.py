"""gpu_impl.fa3_calls: recording both sides of the metadata hand-off, and checking them.

Every check has a negative control (a seeded stale precompute it must catch) and a positive control (the fresh
precompute for the same call, which must pass). The worked example is docs/facts-fa3.md section 1: Qwen3-30B-A3B decode
(H=32, Hk=4, d=128, bf16, page size 1) on 132 SMs, one 32768-token sequence and seven of 100; the stale
precompute sees heads (32//4, max(1, 4//4)) = (8, 1) -> S_p = 109, the call (32, 4) -> S_c = 29, and the long
sequence gets 86 splits. Tensors the checks never read are on the meta device (shapes only).
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch

from gpu_impl.fa3_calls import (CheckingFA3, MetadataMismatch, PrecomputeRecord, CallRecord, deep_check,
                                pair_summary, precompute_schedule, quick_check, record_call, record_precompute,
                                record_varlen_call, call_schedule_of)
from gpu_impl.errors import OutOfBoundsAccess
from gpu_impl.kernels.emulated import EmulatedKernel

LONG = [32768] + [100] * 7
BF16 = torch.bfloat16


def lens_tensors(lens):
    return torch.tensor(lens, dtype=torch.int32), torch.arange(len(lens) + 1, dtype=torch.int32)


def precompute(lens, heads, page_size=1, max_seqlen_q=1, headdim=128, **extra):
    cs, cu = lens_tensors(lens)
    return record_precompute(len(lens), max_seqlen_q, max(lens), num_heads=heads[0], num_heads_k=heads[1],
                             headdim=headdim, cache_seqlens=cs, qkv_dtype=BF16, cu_seqlens_q=cu,
                             page_size=page_size, causal=True, **extra)


def decode_call(lens, heads=(32, 4), page_size=1, width=None, md=torch.zeros(33, dtype=torch.int32), headdim=128,
                read=True, device="meta"):
    b = len(lens)
    cs, cu = lens_tensors(lens)
    width = width or -(-max(lens) // page_size)
    q = torch.empty(b, heads[0], headdim, device=device, dtype=BF16)
    k = torch.empty(b * width + 1, page_size, heads[1], headdim, device=device, dtype=BF16)
    pt = torch.empty(b, width, device=device, dtype=torch.int32)
    return record_call(q, k, k, cache_seqlens=cs, page_table=pt, cu_seqlens_q=cu, max_seqlen_q=1, causal=True,
                       scheduler_metadata=md, read_tensors=read)


def names(violations):
    return [v.invariant for v in violations]


# ----------------------------------------------------------------------------------------------------------
# The worked example
# ----------------------------------------------------------------------------------------------------------


def test_worked_example_numbers():
    stale, call = precompute(LONG, (8, 1)), decode_call(LONG)
    summary = pair_summary(stale, call)
    assert (summary["s_p"], summary["s_c"]) == (109, 29)
    assert summary["precompute"]["num_heads"] == 8 and summary["precompute"]["num_heads_k"] == 1
    assert summary["call"]["num_heads"] == 32 and summary["call"]["num_heads_k"] == 4
    assert summary["call"]["seqlen_k"] == 32768 and summary["precomputed"] is True


def test_worked_example_caught_by_quick_check():
    found = quick_check(precompute(LONG, (8, 1)), decode_call(LONG, read=False))
    assert names(found) == ["SPLIT_BOUND"]
    assert found[0].detail["s_p"] == 109 and found[0].detail["s_c"] == 29


def test_worked_example_caught_by_deep_check_recomputed_and_given():
    stale, call = precompute(LONG, (8, 1)), decode_call(LONG)
    md = EmulatedKernel().get_scheduler_metadata(8, 1, 32768, 8, 1, 128, lens_tensors(LONG)[0],
                                                 cu_seqlens_q=lens_tensors(LONG)[1], page_size=1, causal=True)
    for found in (deep_check(stale, call), deep_check(stale, call, md), deep_check(stale, call, md.tolist())):
        assert names(found) == ["SPLIT_BOUND", "COMBINE_CAPACITY"]
        assert found[0].batch == 0 and found[0].detail["metadata_splits"] == 86
        assert found[0].detail["out_of_bounds_splits"] == [29, 85]


def test_fresh_precompute_passes_both_checks():
    fresh, call = precompute(LONG, (32, 4)), decode_call(LONG)
    assert quick_check(fresh, call) == []
    assert deep_check(fresh, call) == []


def test_quick_check_is_sufficient_not_necessary():
    # eight long sequences: S_p > S_c, but every split count is 15 <= 29 (docs/facts-fa3.md section 1): only quick flags it
    lens = [32768] * 8
    stale, call = precompute(lens, (8, 1)), decode_call(lens)
    assert names(quick_check(stale, call)) == ["SPLIT_BOUND"]
    assert deep_check(stale, call) == []


def test_split_count_one_is_safe():
    # num_splits=1 on both sides (deterministic inference): S_c == 1, md's split counts are ignored
    stale = precompute(LONG, (8, 1), num_splits=1)
    cs, cu = lens_tensors(LONG)
    q = torch.empty(8, 32, 128, device="meta", dtype=BF16)
    k = torch.empty(40000, 1, 4, 128, device="meta", dtype=BF16)
    pt = torch.empty(8, 32768, device="meta", dtype=torch.int32)
    call = record_call(q, k, k, cache_seqlens=cs, page_table=pt, cu_seqlens_q=cu, max_seqlen_q=1, causal=True,
                       scheduler_metadata=torch.zeros(33, dtype=torch.int32), num_splits=1, read_tensors=True)
    assert quick_check(stale, call) == [] and deep_check(stale, call) == []


# ----------------------------------------------------------------------------------------------------------
# SHAPE, batch size, QUERY_COVER: negative and positive controls
# ----------------------------------------------------------------------------------------------------------


def test_shape_mismatch_reported_and_fresh_passes():
    lens12 = [100] * 12
    call = decode_call(lens12, md=torch.zeros(49, dtype=torch.int32))
    stale = precompute([100] * 8, (32, 4))
    assert names(quick_check(stale, call)) == ["SHAPE"]
    assert quick_check(stale, call)[0].detail["produced"] == 33
    assert names(deep_check(stale, call)) == ["SHAPE"]
    fresh = precompute(lens12, (32, 4))
    assert quick_check(fresh, call) == [] and deep_check(fresh, call) == []


def test_batch_size_mismatch_within_one_b4_caught_and_fresh_passes():
    lens = [3000, 100, 100, 100, 100, 100, 100, 100]
    call = decode_call(lens)
    stale = precompute(lens[:6], (32, 4))   # b4 = 8 on both sides: the shape check passes
    assert "BATCH_PERMUTATION" in names(quick_check(stale, call))
    assert "BATCH_PERMUTATION" in names(deep_check(stale, call))
    fresh = precompute(lens, (32, 4))
    assert quick_check(fresh, call) == [] and deep_check(fresh, call) == []


def spec_decode_call(lens, q_len, heads=(32, 4), read=True, md_size=33):
    """A multi-token decode call (q of q_len rows per sequence, not varlen)."""
    b = len(lens)
    cs = torch.tensor(lens, dtype=torch.int32)
    q = torch.empty(b, q_len, heads[0], 128, device="meta", dtype=BF16)
    k = torch.empty(b * max(lens) + 1, 1, heads[1], 128, device="meta", dtype=BF16)
    pt = torch.empty(b, max(lens), device="meta", dtype=torch.int32)
    return record_call(q, k, k, cache_seqlens=cs, page_table=pt, causal=True,
                       scheduler_metadata=torch.zeros(md_size, dtype=torch.int32), read_tensors=read)


def test_query_cover_caught_from_scalars_and_fresh_passes():
    lens = [500] * 8
    call = spec_decode_call(lens, q_len=32)        # 32 rows x qhpk 8 = 256 packed rows: 2 m-blocks of 128
    stale = precompute(lens, (32, 4), max_seqlen_q=1)   # md: 1 m-block per batch
    found = quick_check(stale, call)
    assert names(found) == ["QUERY_COVER"]
    assert found[0].detail["metadata_m_blocks"] == 1 and found[0].detail["m_blocks_needed"] == 2
    assert "QUERY_COVER" in names(deep_check(dataclasses.replace(stale, cu_seqlens_q=None, has_cu_seqlens_q=False),
                                             call))
    cs = torch.tensor(lens, dtype=torch.int32)
    fresh = record_precompute(8, 32, 500, num_heads=32, num_heads_k=4, headdim=128, cache_seqlens=cs, page_size=1,
                              causal=True)
    assert quick_check(fresh, call) == [] and deep_check(fresh, call) == []


def test_query_cover_with_lengths_on_neither_side_checks_every_length():
    lens = [500] * 8
    stale = dataclasses.replace(precompute(lens, (32, 4), max_seqlen_q=1), cu_seqlens_q=None)
    cs, _ = lens_tensors(lens)
    q = torch.empty(8 * 32, 32, 128, device="meta", dtype=BF16)
    k = torch.empty(4001, 1, 4, 128, device="meta", dtype=BF16)
    pt = torch.empty(8, 500, device="meta", dtype=torch.int32)
    cu = torch.arange(0, 8 * 32 + 1, 32, dtype=torch.int32)
    call = record_call(q, k, k, cache_seqlens=cs, page_table=pt, cu_seqlens_q=cu, max_seqlen_q=32, causal=True,
                       scheduler_metadata=torch.zeros(33, dtype=torch.int32), read_tensors=False)
    assert call.cu_seqlens_q is None and stale.cu_seqlens_q is None
    # same cu_seqlens_q on both sides assumed: m_blocks from the same lengths, same tiles and pack -> covered
    assert quick_check(stale, call) == []
    # a precompute without PackGQA (pack_gqa=False forced) under-counts rows of a packed call
    unpacked = dataclasses.replace(stale, pack_gqa=False)
    found = quick_check(unpacked, call)
    assert names(found) == ["QUERY_COVER"] and found[0].detail["assumed_lengths"] is True


def test_metadata_of_unknown_origin_is_reported():
    call = decode_call(LONG)
    assert names(quick_check(None, call)) == ["METADATA_ORIGIN"]
    assert names(deep_check(None, call)) == ["METADATA_ORIGIN"]


def test_calls_without_metadata_need_no_check():
    call = decode_call(LONG, md=None)
    assert not call.metadata_passed
    assert quick_check(None, call) == [] and deep_check(None, call) == []
    assert pair_summary(None, call)["precomputed"] is False and pair_summary(None, call)["s_p"] is None


# ----------------------------------------------------------------------------------------------------------
# Binding both signatures; records as JSON
# ----------------------------------------------------------------------------------------------------------


def test_both_precompute_signatures_bind_to_the_same_record():
    cs, cu = lens_tensors(LONG)
    sgl = record_precompute(8, 1, 32768, num_heads=8, num_heads_k=1, headdim=128, cache_seqlens=cs,
                            cu_seqlens_q=cu, leftpad_k=None, page_size=1, causal=True)
    fa3 = record_precompute(8, 1, 32768, num_heads_q=8, num_heads_kv=1, headdim=128, cache_seqlens=cs,
                            cu_seqlens_q=cu, cache_leftpad=None, page_size=1, causal=True)
    positional_sgl = record_precompute(8, 1, 32768, 8, 1, 128, cs, BF16, None, cu, None, None, None, None, 1, 0,
                                       True, signature="sgl_kernel")
    positional_fa3 = record_precompute(8, 1, 32768, 8, 1, 128, cs, BF16, None, cu, None, None, 1, 0, True,
                                       signature="fa3")
    assert sgl.signature == "sgl_kernel" and fa3.signature == "fa3"
    strip = lambda r: dataclasses.replace(r, signature="")
    assert strip(sgl) == strip(fa3) == strip(positional_sgl) == strip(positional_fa3)
    assert precompute_schedule(sgl).num_splits == 109


def test_leftpad_binds_under_both_names():
    cs, _ = lens_tensors([100] * 4)
    pad = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    a = record_precompute(4, 1, 100, num_heads=8, num_heads_k=8, headdim=64, cache_seqlens=cs, leftpad_k=pad)
    b = record_precompute(4, 1, 100, num_heads_q=8, num_heads_kv=8, headdim=64, cache_seqlens=cs, cache_leftpad=pad)
    assert a.leftpad_k == b.leftpad_k == (1, 2, 3, 4) and a.has_leftpad and b.has_leftpad


def test_binding_errors_name_the_problem():
    cs, _ = lens_tensors([100] * 4)
    with pytest.raises(TypeError, match="mixes sgl_kernel names"):
        record_precompute(4, 1, 100, num_heads=8, num_heads_kv=8, headdim=64, cache_seqlens=cs)
    with pytest.raises(TypeError, match="signature='sgl_kernel' or 'fa3'"):
        record_precompute(4, 1, 100, 8, 8, 64, cs, BF16, None, None, None)
    with pytest.raises(TypeError, match="missing required argument"):
        record_precompute(4, 1, 100, num_heads=8, headdim=64, cache_seqlens=cs)
    with pytest.raises(TypeError, match="multiple values"):
        record_precompute(4, 1, 100, 8, num_heads=8, num_heads_k=8, headdim=64, cache_seqlens=cs, batch_size=4)
    with pytest.raises(ValueError, match="signature"):
        record_precompute(4, 1, 100, 8, 8, 64, cs, signature="vllm2")


def test_records_round_trip_through_json():
    pre, call = precompute(LONG, (8, 1)), decode_call(LONG)
    assert PrecomputeRecord.from_dict(json.loads(json.dumps(pre.to_dict()))) == pre
    assert CallRecord.from_dict(json.loads(json.dumps(call.to_dict()))) == call
    assert pre.to_dict()["qkv_dtype"] == "bfloat16" and pre.to_dict()["cache_seqlens"] == LONG
    with pytest.raises(ValueError, match="unknown field"):
        PrecomputeRecord.from_dict({**pre.to_dict(), "bogus": 1})


def test_call_records_shapes_without_reading_tensors():
    call = decode_call(LONG, read=False)
    assert call.cache_seqlens is None and call.cu_seqlens_q is None and call.has_cache_seqlens
    assert call.page_table_shape == (8, 32768) and call.seqlen_k == 32768 and call.page_size == 1
    assert call.q_shape == (8, 32, 128) and call.dtype == "bfloat16" and call.metadata_numel == 33
    with pytest.raises(ValueError, match="read_tensors=True"):
        deep_check(precompute(LONG, (8, 1)), call)


def test_vllm_varlen_call_maps_to_fa3_names():
    cs, cu = lens_tensors(LONG)
    q = torch.empty(8, 32, 128, device="meta", dtype=BF16)
    k = torch.empty(40000, 1, 4, 128, device="meta", dtype=BF16)
    bt = torch.empty(8, 32768, device="meta", dtype=torch.int32)
    varlen = record_varlen_call(q, k, k, 1, cu, 32768, seqused_k=cs, causal=True, block_table=bt,
                                scheduler_metadata=torch.zeros(33, dtype=torch.int32), num_splits=0,
                                fa_version=3, read_tensors=True)
    kvcache = decode_call(LONG)
    assert varlen.function == "flash_attn_varlen_func"
    assert call_schedule_of(varlen) == call_schedule_of(kvcache)
    assert names(quick_check(precompute(LONG, (8, 1)), varlen)) == ["SPLIT_BOUND"]


# ----------------------------------------------------------------------------------------------------------
# CheckingFA3 over the emulator
# ----------------------------------------------------------------------------------------------------------

SMALL = [300, 20, 20, 20]


def small_call_args(lens, heads=(8, 2), page_size=16, d=64):
    gen = torch.Generator().manual_seed(0)
    b = len(lens)
    width = -(-max(lens) // page_size)
    k = torch.randn(b * width, page_size, heads[1], d, generator=gen).to(BF16)
    v = torch.randn(b * width, page_size, heads[1], d, generator=gen).to(BF16)
    pt = torch.arange(b * width, dtype=torch.int32).reshape(b, width)
    q = torch.randn(b, heads[0], d, generator=gen).to(BF16)
    cs, cu = lens_tensors(lens)
    return q, k, v, dict(cache_seqlens=cs, page_table=pt, cu_seqlens_q=cu, max_seqlen_q=1, causal=True)


def small_precompute(fa3, lens, heads, page_size=16, d=64):
    cs, cu = lens_tensors(lens)
    return fa3.get_scheduler_metadata(len(lens), 1, max(lens), heads[0], heads[1], d, cs, cu_seqlens_q=cu,
                                      page_size=page_size, causal=True)


def test_checking_front_passes_fresh_metadata_and_runs_the_call():
    fa3 = CheckingFA3(EmulatedKernel(), mode="raise")
    q, k, v, kw = small_call_args(SMALL)
    md = small_precompute(fa3, SMALL, (8, 2))
    out = fa3.flash_attn_with_kvcache(q, k, v, scheduler_metadata=md, **kw)
    assert out.shape == q.shape and torch.isfinite(out.float()).all()
    assert fa3.checked_calls == 1 and fa3.violations() == []
    pre, call, found = fa3.events[0]
    assert pre.num_heads_k == 2 and call.num_heads_k == 2 and found == []


def worked_example_args():
    cs, cu = lens_tensors(LONG)
    q = torch.empty(8, 32, 128, dtype=BF16)
    k = torch.empty(8 * 32768 // 8 + 8, 8, 4, 128, dtype=BF16)   # page size 8 keeps the cache small
    pt = torch.zeros(8, 32768 // 8, dtype=torch.int32)
    return q, k, dict(cache_seqlens=cs, page_table=pt, cu_seqlens_q=cu, max_seqlen_q=1, causal=True)


def test_checking_front_raises_on_the_worked_example_before_the_kernel_runs():
    seen = []
    fa3 = CheckingFA3(EmulatedKernel(), mode="raise", on_violation=seen.append)
    q, k, kw = worked_example_args()
    md = fa3.get_scheduler_metadata(8, 1, 32768, num_heads=8, num_heads_k=1, headdim=128,
                                    cache_seqlens=kw["cache_seqlens"], cu_seqlens_q=kw["cu_seqlens_q"], page_size=8,
                                    causal=True)
    with pytest.raises(MetadataMismatch, match="SPLIT_BOUND") as info:
        fa3.flash_attn_with_kvcache(q, k, k, scheduler_metadata=md, **kw)
    assert info.value.precompute.num_heads_k == 1 and info.value.call.num_heads_k == 4
    assert "S_p=109 S_c=29" in str(info.value)
    assert len(seen) == 1 and names(seen[0][2]) == ["SPLIT_BOUND"]


def test_checking_front_deep_mode_names_the_batch():
    fa3 = CheckingFA3(EmulatedKernel(), mode="raise", deep=True)
    q, k, kw = worked_example_args()
    md = fa3.get_scheduler_metadata(8, 1, 32768, 8, 1, 128, kw["cache_seqlens"], cu_seqlens_q=kw["cu_seqlens_q"],
                                    page_size=8, causal=True)
    with pytest.raises(MetadataMismatch) as info:
        fa3.flash_attn_with_kvcache(q, k, k, scheduler_metadata=md, **kw)
    assert info.value.violations[0].batch == 0 and info.value.violations[0].detail["metadata_splits"] == 86


def test_unknown_metadata_is_reported_never_passed_silently():
    fa3 = CheckingFA3(EmulatedKernel(), mode="raise")
    q, k, v, kw = small_call_args(SMALL)
    md = small_precompute(EmulatedKernel(), SMALL, (8, 2))   # produced outside the checking front
    with pytest.raises(MetadataMismatch, match="METADATA_ORIGIN"):
        fa3.flash_attn_with_kvcache(q, k, v, scheduler_metadata=md, **kw)


def test_persistent_buffer_follows_copies_and_catches_a_stale_one():
    fa3 = CheckingFA3(EmulatedKernel(), mode="record")
    buffer = torch.empty(64, dtype=torch.int32)       # a CUDA-graph style persistent metadata buffer
    three = SMALL[:3]
    q3, k3, v3, kw3 = small_call_args(three)
    md3 = small_precompute(fa3, three, (8, 2))
    view = buffer[:md3.numel()]
    view.copy_(md3)
    fa3.note_copy(view, md3)
    fa3.flash_attn_with_kvcache(q3, k3, v3, scheduler_metadata=buffer[:md3.numel()], **kw3)
    assert fa3.events[-1][2] == [] and fa3.events[-1][0].batch_size == 3
    # the next batch has 4 sequences (same b4): recomputed, but the copy into the buffer was missed
    q, k, v, kw = small_call_args(SMALL)
    md4 = small_precompute(fa3, SMALL, (8, 2))
    assert md4.numel() == md3.numel()
    with pytest.raises(OutOfBoundsAccess):   # record mode delegates; the strict emulator then refuses
        fa3.flash_attn_with_kvcache(q, k, v, scheduler_metadata=buffer[:md4.numel()], **kw)
    assert "BATCH_PERMUTATION" in names(fa3.events[-1][2])
    # the copy done and noted: the same buffer now passes
    view.copy_(md4)
    fa3.note_copy(view, md4)
    fa3.flash_attn_with_kvcache(q, k, v, scheduler_metadata=buffer[:md4.numel()], **kw)
    assert fa3.events[-1][2] == [] and fa3.events[-1][0].batch_size == 4
    # a copy from a tensor nobody recorded makes the buffer's origin unknown
    fa3.note_copy(view, torch.zeros_like(md4))
    fa3.flash_attn_with_kvcache(q, k, v, scheduler_metadata=buffer[:md4.numel()], **kw)
    assert names(fa3.events[-1][2]) == ["METADATA_ORIGIN"]


def test_registry_drops_entries_of_dead_tensors():
    fa3 = CheckingFA3(EmulatedKernel(), mode="record")
    md = small_precompute(fa3, SMALL, (8, 2))
    assert len(fa3.registry) == 1
    del md
    assert fa3.registry._entries == {}      # dropped by the weak reference's callback, without a lookup
    assert len(fa3.registry) == 0


def test_warn_mode_warns_once_per_signature_and_runs_the_call():
    fa3 = CheckingFA3(EmulatedKernel(mode="gpu-like"), mode="warn")
    q, k, v, kw = small_call_args(SMALL)
    md = small_precompute(EmulatedKernel(), SMALL, (8, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            out = fa3.flash_attn_with_kvcache(q, k, v, scheduler_metadata=md, **kw)
    assert out.shape == q.shape
    assert len([w for w in caught if "METADATA_ORIGIN" in str(w.message)]) == 1
    assert len(fa3.violations()) == 3


def test_record_mode_keeps_bounded_events_and_other_functions_pass_through():
    fa3 = CheckingFA3(EmulatedKernel(), mode="record", max_events=2, record_all=True)
    q, k, v, kw = small_call_args(SMALL)
    for _ in range(3):
        fa3.flash_attn_with_kvcache(q, k, v, **kw)
    assert len(fa3.events) == 2 and fa3.checked_calls == 0
    assert fa3.describe().startswith("emulated FA3")
    with pytest.raises(ValueError, match="mode"):
        CheckingFA3(EmulatedKernel(), mode="loud")
