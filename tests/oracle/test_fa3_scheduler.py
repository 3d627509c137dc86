"""Pins refmodel's FA3 scheduler formulas to hand-derived values (docs/facts-fa3.md sections 1-2, FA3 hopper/)."""

import pytest
import torch

from refmodel import (
    UNWRITTEN,
    call_inputs,
    decode_metadata,
    get_scheduler_metadata,
    metadata_size,
    num_splits_heuristic,
    precompute_inputs,
    resolve_masking,
    resolve_schedule,
    schedule_and_prepare,
    tile_size_fwd_sm90,
)
from refmodel.fa3_scheduler import combine_capacity, element_size, kernel_headdims, should_pack_gqa
from refmodel.prepare import blocks_per_sm

WORKED_SEQLENS = [32768] + [100] * 7


def test_heuristic_own_example_48_mblocks_on_108_sms_gives_2_splits():
    # eff(1)=48/108=0.44, eff(2)=0.89, best is eff(9)=1.0; the smallest >= 0.85*1.0 is s=2.
    assert num_splits_heuristic(48, 108, 100, 1, 0, False) == 2


def test_heuristic_short_kv_and_full_machine_use_one_split():
    assert num_splits_heuristic(1, 132, 4, 1, 0, False) == 1          # n_blocks <= 4
    assert num_splits_heuristic(106, 132, 1000, 1, 0, False) == 1     # 106 >= 0.8*132
    # long non-causal KV head beyond 50 MiB with many m-blocks splits by L2 size: ceil(200 MiB / 50 MiB) = 4
    assert num_splits_heuristic(300, 132, 1000, 300, 200 * 2**20, False) == 4
    assert num_splits_heuristic(300, 132, 1000, 300, 200 * 2**20, True) == 1


def test_worked_example_precompute_109_call_29_long_sequence_86():
    seqlens = torch.tensor(WORKED_SEQLENS, dtype=torch.int32)
    # precompute with sglang's heads: 32 // tp(4) = 8 and max(1, 4 // 4) = 1
    sched, prep = schedule_and_prepare(8, 1, 32768, 8, 1, 128, seqlens, page_size=1, causal=True)
    assert sched.num_splits == 109
    assert (sched.block_m, sched.block_n) == (128, 128)
    assert prep.blocks_per_sm == 3          # ceil(263 * 1.1 * 1 / 132)
    assert prep.num_splits[0] == 86         # min(ceil(256 / 3), 109)
    assert prep.num_splits[1:] == [1] * 7
    # the call sees attn_tp_size 1: 32 heads, 4 KV heads
    call = resolve_schedule(call_inputs(8, 1, 32768, 32, 4, 128, page_size=1, causal=True))
    assert call.num_splits == 29


def test_eight_long_sequences_split_15_no_overflow():
    seqlens = torch.full((8,), 32768, dtype=torch.int32)
    _, prep = schedule_and_prepare(8, 1, 32768, 8, 1, 128, seqlens, page_size=1, causal=True)
    assert prep.blocks_per_sm == 18         # ceil(2048 * 1.1 / 132)
    assert set(prep.num_splits) == {15}      # ceil(256 / 18)


def test_metadata_sizes_causal_noncausal_local():
    seq = torch.tensor([500] * 8, dtype=torch.int32)
    # paged causal decode with d=128 keeps causal: Sort + Swizzle -> 4 vectors of b4=8, plus semaphore
    assert get_scheduler_metadata(8, 1, 4096, 8, 1, 128, seq, page_size=1, causal=True).numel() == 33
    # unpaged decode drops causal: Sort only -> 3 vectors of b4=4 for b=3
    assert metadata_size(precompute_inputs(3, 1, 4096, 8, 1, 128, causal=True)) == 13
    # local window: no Sort, Swizzle -> 3 vectors of b4=8 for b=5
    local = precompute_inputs(5, 1, 4096, 8, 1, 128, causal=True, window_size=(64, 0))
    assert resolve_schedule(local).masking.is_local
    assert metadata_size(local) == 25


def test_metadata_layout_and_unwritten_slots():
    seq = torch.tensor([1000, 10, 5000], dtype=torch.int32)
    # n-blocks 8, 1, 40; blocks_per_sm 1; splits capped at 2 -> n per split 4, 1, 20 -> order 2, 0, 1
    md = get_scheduler_metadata(3, 1, 8192, 8, 1, 128, seq, page_size=1, causal=True, num_splits=2)
    dec = decode_metadata(md, 3, sort=True, swizzle=True)
    assert dec.batch_idx[:3] == [2, 0, 1]
    assert dec.num_splits[:3] == [2, 2, 1]
    for vec in (dec.num_splits, dec.num_m_blocks, dec.batch_idx, dec.nheads_in_l2):
        assert vec[3] == UNWRITTEN
    assert dec.semaphore == 0


def test_batch_over_992_uses_one_split_everywhere():
    seq = torch.full((1000,), 65536, dtype=torch.int32)
    sched, prep = schedule_and_prepare(1000, 1, 65536, 8, 1, 128, seq, page_size=1, causal=True, num_splits=8)
    assert sched.num_splits == 8
    assert set(prep.num_splits) == {1}
    assert prep.blocks_per_sm is None
    # each 992-batch CTA sorts only its own batches
    assert sorted(prep.batch_idx[:992]) == list(range(992))


def test_fixed_split_count_is_used_as_is():
    assert resolve_schedule(precompute_inputs(8, 1, 32768, 8, 1, 128, num_splits=7)).num_splits == 7
    # the precompute accepts more than 256 splits (flash_api.cpp 548-550 check only dtype and heads);
    # the call rejects them (flash_api.cpp 1095)
    assert resolve_schedule(precompute_inputs(8, 1, 32768, 8, 1, 128, num_splits=300)).num_splits == 300
    with pytest.raises(ValueError, match="num_splits"):
        resolve_schedule(call_inputs(8, 1, 32768, 8, 1, 128, num_splits=300))


def test_masking_resolution():
    # decode without paging drops causal; paged hdim 128 keeps it; hdim 64 drops it even when paged
    assert not resolve_masking(1, 100, True, headdim=128, paged=False).is_causal
    assert resolve_masking(1, 100, True, headdim=128, paged=True).is_causal
    assert not resolve_masking(1, 100, True, headdim=64, paged=True).is_causal
    # a window covering everything becomes -1
    m = resolve_masking(16, 100, False, (200, 200))
    assert not m.is_local and not m.is_causal
    assert resolve_masking(16, 100, False, (10, 0)).is_local


def test_tile_sizes_sm90():
    assert tile_size_fwd_sm90(128, 128, False, False) == (128, 176)
    assert tile_size_fwd_sm90(128, 128, True, False) == (128, 128)
    assert tile_size_fwd_sm90(64, 64, False, False) == (192, 192)
    assert tile_size_fwd_sm90(64, 256, False, False) == (128, 96)
    assert tile_size_fwd_sm90(96, 96, False, False) == (192, 144)
    assert tile_size_fwd_sm90(192, 128, False, False) == (128, 128)
    assert tile_size_fwd_sm90(256, 256, False, True) == (128, 64)


def test_kernel_tiles_differ_from_host_tiles_for_d64_dv128():
    # host rounds dv to 128 and picks the 192-row tile; the kernel runs the (64, 256) instance with 128 rows
    sched = resolve_schedule(precompute_inputs(2, 300, 1024, 8, 8, 64, headdim_v=128))
    assert kernel_headdims(64, 128) == (64, 256)
    assert sched.block_m == 192 and sched.kernel_block_m == 128


def test_pack_gqa_and_capacity_and_dtype():
    assert should_pack_gqa(True, 1, 8, 128)
    assert not should_pack_gqa(False, 128, 8, 128)
    assert combine_capacity(16, 64) == 16
    assert combine_capacity(16, 128) == 32
    assert combine_capacity(29, 128) == 32
    assert combine_capacity(109, 128) == 128
    assert combine_capacity(200, 64) == 256
    assert element_size("bfloat16") == 2 and element_size(torch.float8_e4m3fn) == 1
    with pytest.raises(ValueError, match="qkv_dtype"):
        element_size("float32")


def test_blocks_per_sm_is_float32():
    assert blocks_per_sm(263, 1, 132) == 3
    assert blocks_per_sm(0, 8, 132) == 0


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="num_heads"):
        resolve_schedule(precompute_inputs(1, 1, 10, 6, 4, 128))
    with pytest.raises(ValueError, match="cache_seqlens"):
        get_scheduler_metadata(2, 1, 10, 8, 1, 128, torch.tensor([1, 2, 3], dtype=torch.int32))
    # a head dim over 256 is the call's rejection (flash_api.cpp 780), not the precompute's
    with pytest.raises(ValueError, match="headdim"):
        resolve_schedule(call_inputs(1, 1, 10, 8, 1, 300))
