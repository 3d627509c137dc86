"""Pins of refmodel's default arguments (each function called without them) and of bounds only unusual inputs reach.

Every default below is the value FA3 itself uses where the caller passes nothing:
- ``tile_size_fwd_sm90(headdim, headdim_v, is_causal, is_local, element_size=2, v_colmajor=false,
  paged_kv_non_TMA=false, softcap=false)``: Dao-AILab/flash-attention ``hopper/tile_size.h`` lines 10-12 at 0251105a;
  element size 2 takes the bf16/fp16 branch (line 13), fp8 d <= 128 is ``{128, paged ? 160 : (v_colmajor ||
  (softcap && is_local) ? 192 : 224)}`` (line 47).
- ``num_splits_heuristic(..., max_splits)``: ``flash_api.cpp`` line 469 passes 128; ``heuristics.h`` line 41 caps
  the search at ``min(max_splits, num_SMs, num_n_blocks)``.
- ``resolve_masking``: ``mha_fwd``'s window defaults (-1, -1) and ``attention_chunk`` 0 (flash_api.cpp 579-593):
  with seqlen_q 1 and no window, causal is dropped unless paged with 64 < d <= 128.
- ``max_kvblocks_in_l2``: upstream's ``size_l2 = 8 * 1024 * 1024`` (flash_prepare_scheduler.cu 225); the fork divides
  32 MiB by 1, 2, 4, 8 or 16 for qhpk 1, <= 2, <= 4, <= 8, more (vllm-project/flash-attention@617264c1
  flash_prepare_scheduler.cu 219-224).
- the prepare launch: ``num_ctas = ceil_div(b, 31 * 32)`` (flash_prepare_scheduler.cu 223 at 0251105a); a grid of 0
  blocks is an invalid launch that CHECK_CUDA_KERNEL_LAUNCH turns into exit(1) (flash_api.cpp 659, cuda_check.h 12-21).
"""

import itertools

import numpy as np
import pytest
import torch

from refmodel import ProcessAbort
from refmodel.fa3_scheduler import (call_inputs, kernel_headdims, num_splits_heuristic, precompute_inputs,
                                    resolve_masking, resolve_schedule, tile_size_fwd_sm90)
from refmodel.prepare import L2_SWIZZLE_BYTES, fork_l2_budget, launch_check, max_kvblocks_in_l2
from refmodel.splitkv import split_block_range, split_kv


def test_tile_defaults_are_bf16_tma_no_softcap_row_major_v():
    assert tile_size_fwd_sm90(128, 128, False, False) == (128, 176)                      # bf16, line 31-33
    assert tile_size_fwd_sm90(128, 128, False, False, 1) == (128, 224)                   # fp8 line 47
    assert tile_size_fwd_sm90(128, 128, False, False, 1, v_colmajor=True) == (128, 192)
    assert tile_size_fwd_sm90(128, 128, False, True, 1) == (128, 224)                    # local, no softcap
    assert tile_size_fwd_sm90(128, 128, False, True, 1, softcap=True) == (128, 192)
    assert tile_size_fwd_sm90(128, 128, False, False, 2, True) == (128, 128)             # paged non-TMA


def test_kernel_headdims_default_to_bf16():
    assert kernel_headdims(64, 128) == (64, 256) == kernel_headdims(64, 128, 2)
    assert kernel_headdims(64, 128, 1) != (64, 256)


def test_the_split_heuristic_caps_at_128_splits_by_default():
    # 200 SMs, one m-block, 1000 n-blocks: eff(s) = s / 200 grows to the cap; the first s with eff >= 0.85 * eff(cap)
    # is 109 for the cap 128 (flash_api.cpp 469), 110 for 129
    assert num_splits_heuristic(1, 200, 1000, 1, 0, False) == 109 == num_splits_heuristic(1, 200, 1000, 1, 0, False, 128)
    assert num_splits_heuristic(1, 200, 1000, 1, 0, False, 129) == 110
    # the L2 branch (heuristics.h 34): min(ceil(bytes / 50 MiB), max_splits), here 200 MiB -> 4
    big = 200 * 1024 * 1024
    assert num_splits_heuristic(1000, 132, 1000, 300, big, False) == 4


def test_masking_defaults_are_no_window_no_chunk_head_dim_128_not_paged():
    # seqlen_q 1, causal, no window: causal dropped unless paged with 64 < d <= 128 (flash_api.cpp 579)
    m = resolve_masking(1, 100, True)
    assert (m.is_causal, m.is_local) == (False, False)
    assert resolve_masking(1, 100, True, paged=True).is_causal is True                  # d defaults to 128
    assert resolve_masking(1, 100, True, headdim=129, paged=True).is_causal is False
    m = resolve_masking(5, 100, False)                                                   # no chunk: not local
    assert (m.is_causal, m.is_local) == (False, False)
    assert resolve_masking(5, 100, False, attention_chunk=1).is_local is True


def test_input_builders_default_to_upstream_bf16_full_h100_shapes():
    for inp in (precompute_inputs(2, 1, 100, 8, 8, 128), call_inputs(2, 1, 100, 8, 8, 128)):
        assert (inp.element_size, inp.window_size, inp.attention_chunk, inp.num_sm, inp.arch, inp.num_splits) == \
            (2, (-1, -1), 0, 132, 90, 0)
        assert inp.headdim_v == 128 and inp.pack_gqa is None and inp.build == "upstream-0251105a"
    assert call_inputs(2, 1, 100, 8, 8, 128).uses_prepare is True       # cache_seqlens passed by default
    assert precompute_inputs(2, 1, 100, 8, 8, 128, qkv_dtype="float8_e4m3fn").element_size == 1


def test_the_upstream_l2_budget_is_8_mib_by_default():
    assert L2_SWIZZLE_BYTES == 8 * 1024 * 1024
    assert max_kvblocks_in_l2(128, 128, 128, 2) == 8 * 1024 * 1024 // (128 * 256 * 2) == 128
    assert max_kvblocks_in_l2(128, 128, 128, 2, 32 * 1024 * 1024) == 512


@pytest.mark.parametrize("qhpk, divisor", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8), (9, 16), (16, 16),
                                           (64, 16)])
def test_the_forks_l2_budget_divisor_on_both_sides_of_each_bound(qhpk, divisor):
    assert fork_l2_budget(qhpk) == (32 * 1024 * 1024) // divisor


@pytest.mark.parametrize("b", [1, 2, 991, 992, 993, 1984, 1985, 100000])
def test_the_prepare_launch_has_a_block_for_every_positive_batch(b):
    launch_check(b)     # ceil_div(b, 992) >= 1: a valid grid


def test_the_prepare_launch_of_zero_batches_is_an_abort_naming_the_batch():
    with pytest.raises(ProcessAbort) as info:
        launch_check(0)
    assert "grid of 0 blocks" in str(info.value) and "batch_size" in str(info.value)


def _tiny_call(seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 3, 2, 16, generator=g)
    k = torch.randn(1, 40, 1, 16, generator=g)
    v = torch.randn(1, 40, 1, 16, generator=g)
    return q, k, v


def test_a_range_function_reaching_below_key_zero_or_past_the_last_key_reads_only_existing_keys():
    # split_kv clips each split's key span to [0, seqlen_k): a range function whose first split starts 2 blocks
    # before block 0 and whose last split ends 2 blocks past the end covers the same keys as FA3's (block.h)
    q, k, v = _tiny_call()

    def wide(n_min, n_max, num_splits, split_idx):
        lo, hi = split_block_range(n_min, n_max, num_splits, split_idx)
        return (lo - 2 if split_idx == 0 else lo), (hi + 2 if split_idx == num_splits - 1 else hi)

    want_o, want_l = split_kv(q, k, v, 3, 8, block_m=4)
    got_o, got_l = split_kv(q, k, v, 3, 8, block_m=4, range_fn=wide)
    assert torch.equal(got_o, want_o) and torch.equal(got_l, want_l)
    # negative control: a range function that drops the first block changes split 0
    def late(n_min, n_max, num_splits, split_idx):
        lo, hi = split_block_range(n_min, n_max, num_splits, split_idx)
        return (lo + 1 if split_idx == 0 else lo), hi
    bad_o, _ = split_kv(q, k, v, 3, 8, block_m=4, range_fn=late)
    assert not torch.equal(bad_o, want_o)


def test_a_left_window_of_zero_is_a_bound_not_unbounded():
    # mha_fwd: a side is bounded when it is >= 0 (flash_api.cpp 588: is_local = window_size_left >= 0 || ...); a left
    # window of 0 lets a row see no key before its diagonal, so block.h raises n_block_min to the row's own block
    from refmodel.kv_blocks import kv_block_bounds, resolve_window
    assert resolve_window(False, (0, -1)) == (0, None) and resolve_window(True, (0, 7)) == (0, 0)
    assert resolve_window(False, (-1, 0)) == (None, 0)
    # Lq = Lk = 16, kBlockM = kBlockN = 4, window (0, 0): m-block 1 (rows 4..7) reads KV block 1 only
    assert kv_block_bounds(1, 16, 16, 4, 4, False, (0, 0)) == (1, 2)
    assert kv_block_bounds(1, 16, 16, 4, 4, False, (-1, 0)) == (0, 2)


@pytest.mark.parametrize("kw", [
    dict(seqlen_q=1, causal=True, page_size=16),                    # decode: causal kept (paged, d 128), flash_api 579
    dict(seqlen_q=1, causal=True, page_size=16, headdim=192),       # d 192: causal dropped
    dict(seqlen_q=1, causal=True, page_size=352, num_heads=256),    # decode kept causal: kBlockN 128, no paged TMA,
                                                                    # where not causal 352 % 176 == 0 takes TMA
    dict(seqlen_q=64, window_size=(3000, 0)),                       # local until the window covers every key
    dict(seqlen_q=64, window_size=(3000, 0), headdim=192),          # d 192: causal 128 x 112 up to 3001 keys, then
                                                                    # local 128 x 96: each flag pair has its tiles
    dict(seqlen_q=64, attention_chunk=512),                         # a chunk: local
])
def test_the_one_pass_split_table_is_get_num_splits_at_every_length(kw):
    # num_splits_over_lengths reuses tiles per (causal, local) pair: each length's masking must still read the
    # window, the chunk, the head dim and paging, as get_num_splits does at that length
    import dataclasses

    from refmodel.fa3_scheduler import get_num_splits, num_splits_over_lengths
    kw = dict(kw)
    heads = kw.pop("num_heads", 32)
    inp = precompute_inputs(1, kw.pop("seqlen_q"), 0, heads, 4 if heads == 32 else 1, kw.pop("headdim", 128),
                            varlen_q=True, **kw)
    lengths = [1, 100, 3001, 3002, 5000, 65536, 400000]
    want = tuple(get_num_splits(dataclasses.replace(inp, seqlen_k=L)) for L in lengths)
    assert num_splits_over_lengths(inp, lengths) == want
    assert len(set(want)) > 1


def test_kblockm_never_depends_on_paged_non_tma_in_either_builds_table():
    # tile_size.h (0251105a lines 13-58; the fork's 10-93): paged-non-TMA changes kBlockN only; get_pack_gqa reads
    # kBlockM of a tile computed with it
    from refmodel.fa3_builds import UPSTREAM, VLLM_FORK, tile_size_fwd_sm90_build
    checked = 0
    for build in (UPSTREAM, VLLM_FORK):
        for elem in (1, 2):
            for d in (64, 96, 128, 192, 256):
                for dv in (64, 128, 256, 512):
                    for causal, local, softcap, wg in itertools.product((False, True), repeat=4):
                        a = tile_size_fwd_sm90_build(build, d, dv, causal, local, elem, False, softcap, False, wg)
                        b = tile_size_fwd_sm90_build(build, d, dv, causal, local, elem, True, softcap, False, wg)
                        assert a[0] == b[0], (build, elem, d, dv, causal, local, softcap, wg)
                        checked += a[1] != b[1]
    assert checked > 0     # control: paged-non-TMA does change kBlockN somewhere


def test_the_one_pass_table_of_a_positive_split_argument_is_that_argument_at_every_length():
    from refmodel.fa3_scheduler import num_splits_over_lengths
    inp = precompute_inputs(1, 1, 0, 32, 4, 128, num_splits=5)
    assert num_splits_over_lengths(inp, [1, 1000, 100000]) == (5, 5, 5)


def test_the_forks_pack_keeps_a_pack_the_caller_asked_for():
    # fork flash_api.cpp 670-674: pack = pack_gqa_ argument (or get_pack_gqa), then |= Split, |= d == dv; with
    # d 192 != dv 128 and one split only the argument can make it true
    from refmodel.fa3_builds import VLLM_FORK
    kw = dict(headdim_v=128, varlen_q=True, num_splits=1, build=VLLM_FORK)
    assert resolve_schedule(precompute_inputs(2, 4, 4096, 16, 2, 192, pack_gqa=True, **kw)).pack_gqa is True
    assert resolve_schedule(precompute_inputs(2, 4, 4096, 16, 2, 192, pack_gqa=False, **kw)).pack_gqa is False


def test_with_inputs_names_unknown_fields_and_defers_to_replace_when_a_post_init_exists(monkeypatch):
    import dataclasses

    from refmodel.fa3_scheduler import ScheduleInputs, with_inputs
    inp = precompute_inputs(1, 1, 100, 32, 8, 128)
    with pytest.raises(TypeError) as info:
        with_inputs(inp, nope=1, also_not=2)
    assert str(info.value) == "with_inputs: ScheduleInputs has no field(s) ['also_not', 'nope']"
    real_replace, calls = dataclasses.replace, []

    def spy(obj, **changes):
        calls.append(changes)
        return real_replace(obj, **changes)

    assert with_inputs(inp, seqlen_k=4) == real_replace(inp, seqlen_k=4)
    monkeypatch.setattr(dataclasses, "replace", spy)
    with_inputs(inp, seqlen_k=4)
    assert calls == []                       # the fast copy: ScheduleInputs has no __post_init__
    monkeypatch.setattr(ScheduleInputs, "__post_init__", lambda self: None, raising=False)
    out = with_inputs(inp, seqlen_k=5)
    assert calls == [{"seqlen_k": 5}] and out == real_replace(inp, seqlen_k=5)


def test_a_call_appending_one_key_passes_k_new():
    # call_inputs: has_k_new defaults to seqlen_knew > 0 (k_new is passed whenever there is new KV)
    assert call_inputs(2, 1, 100, 8, 8, 128, seqlen_knew=1).has_k_new is True
    assert call_inputs(2, 1, 100, 8, 8, 128, seqlen_knew=0).has_k_new is False


def test_a_split_argument_of_one_is_used_as_is_by_the_one_pass_table():
    # flash_api.cpp 470: num_splits <= 0 means the heuristic; 1 is a positive argument (the heuristic would give 29)
    import dataclasses

    from refmodel.fa3_scheduler import get_num_splits, num_splits_over_lengths
    inp = precompute_inputs(1, 1, 0, 32, 4, 128, num_splits=1)
    assert num_splits_over_lengths(inp, [1, 100000]) == (1, 1)
    assert get_num_splits(dataclasses.replace(inp, seqlen_k=100000, num_splits=0)) == 29


def test_the_forks_decode_tile_is_not_taken_for_local_attention():
    # fork heuristics.h 10-14: use_one_mma_wg needs !is_local; a local decode (window (100, 0)) keeps 128 x 128
    from refmodel.fa3_builds import VLLM_FORK
    local = resolve_schedule(call_inputs(2, 1, 8192, 8, 1, 128, window_size=(100, 0), build=VLLM_FORK))
    assert local.masking.is_local and (local.block_m, local.block_n) == (128, 128)
    plain = resolve_schedule(call_inputs(2, 1, 8192, 8, 1, 128, build=VLLM_FORK))
    assert plain.block_m == 64          # the one-MMA-WG tile without the window


def test_a_split_heuristic_with_no_m_blocks_falls_through_to_one_split():
    # heuristics.h num_splits_heuristic with total_mblocks 0 (an empty batch, or seqlen_q 0): 0 >= 0.8 * SMs is false
    # and 100 n-blocks pass the <= 4 test; every eff = 0 / ceil(0) is NaN, max_efficiency stays 0.f, no NaN is
    # >= 0.85 * 0, so neither loop returns and the function's last line, ``return 1;``, does (0 / 0 is the NaN the
    # C++ float division gives; numpy's warning about it is silenced here)
    with np.errstate(invalid="ignore"):
        assert num_splits_heuristic(0, 132, 100, 0, 0, False) == 1
        assert num_splits_heuristic(0, 132, 100, 0, 0, False, 7) == 1
    assert num_splits_heuristic(1, 132, 100, 1, 0, False) > 1          # one m-block already splits


def test_the_prepare_step_counts_query_heads_without_packgqa_and_kv_heads_with_it():
    # flash_prepare_scheduler.cu prepare_varlen_num_blocks launches the kernel with num_head =
    # ``!packgqa ? params.h : params.h_k``; its blocks_per_sm multiplies the block total by it
    c = resolve_schedule(call_inputs(4, 128, 8192, 32, 8, 128, has_cache_seqlens=False, num_splits=1))
    assert c.pack_gqa is False and c.prepare_num_heads == 32
    c = resolve_schedule(call_inputs(4, 128, 8192, 32, 8, 128, has_cache_seqlens=False, num_splits=1, pack_gqa=True))
    assert c.pack_gqa is True and c.prepare_num_heads == 8
