"""Pins of refmodel.prepare: values derived by hand from FA3's prepare kernel, each killing mutants.

Source: Dao-AILab/flash-attention `hopper/flash_prepare_scheduler.cu` at 0251105a (line numbers cited per test).
Every expected value is worked out in the comment next to it from those lines; the model only has to agree.
"""

import pytest

from refmodel import ProcessAbort, precompute_inputs, resolve_schedule
from refmodel.prepare import (
    blocks_per_sm,
    launch_check,
    m_blocks_for,
    max_kvblocks_in_l2,
    n_blocks_for,
    nheads_in_l2,
    prepare_scheduler,
)

CU = "flash_prepare_scheduler.cu"


def schedule(b, sq, sk, h, hk, d=128, **kw):
    return resolve_schedule(precompute_inputs(b, sq, sk, h, hk, d, **kw))


def test_m_blocks_multiply_by_qhead_per_khead_only_with_packgqa():
    # lines 92-94: if (packgqa) seqlen *= qhead_per_khead; ceil(seqlen / kBlockM)
    assert m_blocks_for(100, 4, False, 64) == 2      # ceil(100 / 64)
    assert m_blocks_for(100, 4, True, 64) == 7       # ceil(400 / 64)


def test_n_blocks_subtract_leftpad_and_add_new_kv():
    # line 118: seqlen = seqlen - leftpad_k + seqlen_new; line 120: ceil(seqlen / kBlockN)
    assert n_blocks_for(1000, 100, 50, 128) == 8     # ceil(950 / 128)
    assert n_blocks_for(1000, 0, 0, 128) == 8        # ceil(1000 / 128)
    assert n_blocks_for(129, 1, 0, 128) == 1         # 128 / 128
    assert n_blocks_for(100, 0, 50, 128) == 2        # ceil(150 / 128)


def test_blocks_per_sm_multiplies_by_heads():
    # line 156: ceilf(float(total) * 1.1f * float(num_head) / float(num_sm))
    assert blocks_per_sm(100, 4, 132) == 4           # ceil(440 / 132) = ceil(3.33)
    assert blocks_per_sm(745, 1, 132) == 7           # ceil(819.5 / 132) = ceil(6.21)


def test_max_kvblocks_in_l2_is_an_int_quotient_of_8_mib():
    # lines 225-229: 8 MiB / (blockN * (d + dv) * element_size), int division
    value = max_kvblocks_in_l2(176, 128, 128, 2)     # 8388608 / 90112 = 93.09
    assert value == 93 and isinstance(value, int)
    assert max_kvblocks_in_l2(128, 128, 128, 1) == 256   # 8388608 / 32768


@pytest.mark.parametrize("n, budget, qhpk, pack, heads, expected", [
    (5, 80, 1, True, 64, 16),     # 5*16 = 80 <= 80 (line 131, inclusive)
    (10, 80, 1, True, 64, 8),     # 160 > 80, 10*8 = 80 <= 80 (line 132)
    (20, 80, 1, True, 64, 4),     # 320, 160 > 80, 20*4 = 80 (line 133)
    (40, 80, 1, True, 64, 2),     # 40*2 = 80 (line 134)
    (100, 80, 1, True, 64, 1),    # 200 > 80: 1 (line 135)
    (10, 80, 4, False, 64, 32),   # 8, times qhpk 4 without PackGQA (line 136)
    (10, 80, 4, True, 64, 8),     # PackGQA: no multiply
    (10, 80, 4, False, 16, 16),   # min(32, num_head) (line 137)
])
def test_heads_in_l2_ladder(n, budget, qhpk, pack, heads, expected):
    assert nheads_in_l2(n, budget, qhpk, pack, heads) == expected


def test_launch_check_names_the_batch_and_cites_fa3():
    # lines 223 and 232: ceil_div(b, 31 * 32) CTAs; zero is an invalid launch, CHECK_CUDA_KERNEL_LAUNCH -> exit(1)
    launch_check(1)
    launch_check(992)
    with pytest.raises(ProcessAbort) as info:
        launch_check(0)
    exc = info.value
    assert exc.field == "batch_size" and exc.got == 0
    assert "invalid configuration argument" in exc.reason
    assert "CHECK_CUDA_KERNEL_LAUNCH calls exit(1)" in exc.reason
    assert exc.source == ("hopper/flash_prepare_scheduler.cu@0251105a:223,232; hopper/flash_api.cpp:659; "
                          "hopper/cuda_check.h:12-21")


def test_causal_sort_key_is_n_times_block_n_minus_m_times_block_m():
    # line 168: key = n * kBlockN - m * kBlockM, sorted descending (lines 24-40, 179). d 128 causal: 128 x 128.
    s = schedule(2, 300, 512, 1, 1, causal=True, num_splits=1)
    assert (s.block_m, s.block_n, s.sort) == (128, 128, True)
    # batch 0: m = ceil(300/128) = 3, n = 512/128 = 4: key 512 - 384 = 128
    # batch 1: m = 1, n = 3: key 384 - 128 = 256 -> batch 1 first (n alone, or n + m, would put batch 0 first)
    r = prepare_scheduler(s, [512, 384], seqlens_q=[300, 100])
    assert r.batch_idx == [1, 0]
    assert r.num_m_blocks == [1, 3]
    # heads in L2: budget 8 MiB / (128 * 256 * 2) = 128; n*16 <= 128 -> 16, times qhpk 1, min(16, h 1) = 1
    assert r.nheads_in_l2 == [1, 1]


def test_non_causal_sort_is_by_n_blocks_and_writes_no_heads_in_l2():
    # Sort without Swizzle (neither causal nor local): num_nheads_in_l2_ptr is not given (line 200)
    s = schedule(3, 1, 1024, 1, 1, num_splits=1)
    assert (s.sort, s.swizzle, s.block_n) == (True, False, 176)
    r = prepare_scheduler(s, [176, 1000, 500])     # n = 1, 6, 3
    assert r.batch_idx == [1, 2, 0]
    assert r.nheads_in_l2 is None


def test_leftpad_new_kv_and_per_batch_query_lengths_reach_the_blocks():
    s = schedule(2, 200, 1024, 1, 1, num_splits=1, has_leftpad=True)
    assert (s.block_m, s.block_n) == (128, 176)
    # batch 0: 177 - 1 + 0 = 176 -> n 1, m ceil(1/128) = 1; batch 1: 177 - 0 + 50 = 227 -> n 2, m ceil(200/128) = 2
    r = prepare_scheduler(s, [177, 177], seqlens_q=[1, 200], leftpad_k=[1, 0], seqlens_new=[0, 50])
    assert r.batch_idx == [1, 0] and r.num_m_blocks == [2, 1]
    # without leftpad or new KV both batches have n = ceil(177/176) = 2 and m = ceil(200/128) = 2: a tie
    r = prepare_scheduler(s, [177, 175])
    assert r.batch_idx == [0, 1] and r.num_m_blocks == [2, 2]
    r = prepare_scheduler(s, [175, 177])             # n = 1, 2: batch 1 first
    assert r.batch_idx == [1, 0]


def test_local_window_has_no_sort_and_splits_by_blocks_per_sm():
    # local (window (64, 0)): no Sort, Swizzle; forced 4 splits; PackGQA (splits > 1) so heads = h_k = 8
    s = schedule(1, 1, 20480, 32, 8, window_size=(64, 0), num_splits=4)
    assert (s.sort, s.swizzle, s.pack_gqa, s.num_splits, s.block_n) == (False, True, True, 4, 128)
    r = prepare_scheduler(s, [20480])
    # m = ceil(1*4/128) = 1, n = 160; bps = ceil(160 * 1.1 * 8 / 132) = ceil(10.67) = 11
    # split = max(min(ceil(160/11) = 15, 4), 1) = 4 (line 158); n per split = 40 (line 160)
    assert r.blocks_per_sm == 11 and r.num_splits == [4] and r.num_m_blocks == [1] and r.batch_idx is None
    # heads in L2 (line 208): budget 8 MiB / (128*256*2) = 128: 40*2 = 80 <= 128 -> 2; PackGQA: min(2, 8) = 2
    assert r.nheads_in_l2 == [2]
    # a fast-math blocks_per_sm of 80 instead: ceil(160/80) = 2 splits
    r = prepare_scheduler(s, [20480], blocks_per_sm_value=80)
    assert r.blocks_per_sm == 80 and r.num_splits == [2] and r.nheads_in_l2 == [1]   # 80 per split: 160 > 128 -> 1


def test_an_empty_batch_counts_as_one_block_for_heads_in_l2():
    # line 200: get_nheads_in_l2(max(n, 1)); with d = dv = 1024 (the precompute accepts it; tiles of d 256: 128 x 80
    # causal) the budget is 8 MiB / (80 * 2048 * 2) = 25: one block -> 16 (16 <= 25), two would give 8.
    s = schedule(1, 128, 1024, 16, 16, d=1024, causal=True, num_splits=1)
    assert s.block_n == 80
    assert prepare_scheduler(s, [0]).nheads_in_l2 == [16]


def test_992_batches_are_one_cta_and_993_are_not():
    # line 141: gridDim.x > 1 (b > 992, line 223) sets every split to 1
    # d 128 non-causal, q 1, k 131072: the precompute's heuristic gives 109 splits (0.85 * 128/132 -> s >= 109)
    seqused = [131072] + [0] * 991
    s = schedule(992, 1, 131072, 1, 1)
    assert s.num_splits == 109
    r = prepare_scheduler(s, seqused)
    # total = 745 (n = ceil(131072/176)); bps = ceil(745 * 1.1 / 132) = 7; split = min(ceil(745/7) = 107, 109)
    assert r.blocks_per_sm == 7 and r.batch_idx[0] == 0 and r.num_splits[0] == 107
    assert r.num_splits[1:] == [1] * 991
    s = schedule(993, 1, 131072, 1, 1)
    r = prepare_scheduler(s, seqused + [0])
    assert r.num_splits == [1] * 993 and r.blocks_per_sm is None


def test_batches_sort_within_their_own_cta():
    # line 124: each CTA takes 992 batches and sorts only those (line 179); writes back at offset + threadIdx.x (197)
    b = 1000
    s = schedule(b, 1, 176 * 1000, 1, 1)
    r = prepare_scheduler(s, [176 * i for i in range(b)])     # n blocks = i
    assert r.batch_idx == list(range(991, -1, -1)) + list(range(999, 991, -1))
    assert r.num_splits == [1] * b


def test_a_wrong_length_names_cache_seqlens():
    s = schedule(2, 1, 1024, 1, 1)
    with pytest.raises(ValueError, match=r"cache_seqlens: expected 2 entries \(batch_size\), got 1"):
        prepare_scheduler(s, [5])


def test_new_kv_lengths_and_packgqa_rows_per_batch():
    # line 118: each batch's own seqlen_new (cu_seqlens_k_new) is added: n = (176 + 0, 150 + 50) / 176 = (1, 2)
    s = schedule(2, 1, 1024, 1, 1, num_splits=1)
    assert prepare_scheduler(s, [176, 150], seqlens_new=[0, 50]).batch_idx == [1, 0]
    assert prepare_scheduler(s, [176, 150]).batch_idx == [0, 1]            # static new-KV length 0: a tie
    # line 92: PackGQA multiplies the rows by qhpk 4: 100 * 4 / 128 -> 4 m-blocks (2 splits force PackGQA)
    s = schedule(1, 100, 4096, 32, 8, num_splits=2)
    assert s.pack_gqa is True and s.block_m == 128
    assert prepare_scheduler(s, [4096]).num_m_blocks == [4]
