"""Pins of refmodel.prepare under the vLLM fork's build: the prepare_seqlen_q vector and the fork's L2 budget.

Source: vllm-project/flash-attention ``hopper/flash_prepare_scheduler.cu`` at 617264c1: line 203
``prepare_seqlen_q_ptr[batch_idx] = seqlen_q * (packgqa ? qhead_per_khead : 1)``, line 205 heads-in-L2 from
``max(num_n_blocks, 1)`` only when the pointer is set (Swizzle), lines 219-229 ``size_l2 = 32 MiB / divisor``
(divisor 1, 2, 4, 8, 16 by qhpk) and ``max_kvblocks_in_l2 = size_l2 / (blockN * (d + dv) * element_size)``; Sort is
off (flash_api.cpp 689), so nothing is reordered and no batch order is stored. Upstream (0251105a, line 225) budgets
8 MiB: the control below shows the values differ.
"""

from refmodel.fa3_builds import VLLM_FORK
from refmodel.fa3_scheduler import precompute_inputs, resolve_schedule
from refmodel.prepare import fork_l2_budget, prepare_scheduler


def _fork(**kw):
    return resolve_schedule(precompute_inputs(3, 5, 30000, 16, 2, 192, varlen_q=True, page_size=16, build=VLLM_FORK,
                                              **kw))


def test_prepare_seqlen_q_is_the_query_rows_times_heads_per_kv_head_with_pack():
    packed = _fork(num_splits=1, headdim_v=128)
    assert packed.pack_gqa and packed.qhead_per_khead == 8 and not packed.sort and not packed.swizzle
    res = prepare_scheduler(packed, [30000, 100, 5000], seqlens_q=[5, 1, 3])
    assert res.prepare_seqlen_q == [40, 8, 24]                 # 5 * 8, 1 * 8, 3 * 8
    assert res.batch_idx is None and res.nheads_in_l2 is None  # no Sort; no Swizzle (not causal, not local)


def test_prepare_seqlen_q_without_pack_is_the_query_rows():
    plain = _fork(num_splits=1, headdim_v=128, pack_gqa=False)   # d 192 != dv 128, no split: PACKGQA_ONLY keeps it off
    assert plain.pack_gqa is False
    assert prepare_scheduler(plain, [30000, 100, 5000], seqlens_q=[5, 1, 3]).prepare_seqlen_q == [5, 1, 3]


def test_the_forks_heads_in_l2_use_its_32_mib_budget_in_batch_order():
    # causal decode, h = h_k = 16 (qhpk 1: 32 MiB), d = dv = 128, bf16, kBlockN 128: 32 MiB / (128 * 256 * 2) = 512
    # blocks. n-blocks 40, 1, 235; total 276; blocks_per_sm = ceil(276 * 1.1 * 16 / 132) = 37; splits 2, 1, 7;
    # n per split 20, 1, 34: 20 * 16 = 320 <= 512 -> 16; 1 -> 16; 34 * 16 = 544 > 512, 34 * 8 = 272 -> 8.
    # Upstream's 8 MiB (128 blocks) would give 4, 16, 2.
    s = resolve_schedule(precompute_inputs(3, 1, 30000, 16, 16, 128, varlen_q=True, page_size=16, causal=True,
                                           build=VLLM_FORK))
    assert (s.block_n, s.num_splits, s.pack_gqa, s.swizzle, s.sort) == (128, 8, True, True, False)
    res = prepare_scheduler(s, [5120, 100, 30000])
    assert res.blocks_per_sm == 37 and res.num_splits == [2, 1, 7]
    assert res.nheads_in_l2 == [16, 16, 8]
    assert res.prepare_seqlen_q == [1, 1, 1] and res.batch_idx is None and res.num_m_blocks == [1, 1, 1]


def test_control_upstream_budgets_8_mib_and_sorts_the_same_batch():
    # the same causal batch under upstream (0251105a, line 225: 8 MiB = 128 blocks of 128 x 256 x 2 bytes): n per
    # split 20 -> 4 (20 * 8 = 160 > 128), 1 -> 16, 34 -> 2 (34 * 4 = 136 > 128); Sort (descending n * kBlockN -
    # m * kBlockM: 34, 20, 1) puts batch 2 first
    s = resolve_schedule(precompute_inputs(3, 1, 30000, 16, 16, 128, varlen_q=True, page_size=16, causal=True))
    res = prepare_scheduler(s, [5120, 100, 30000])
    assert res.batch_idx == [2, 0, 1] and res.num_splits == [7, 2, 1] and res.nheads_in_l2 == [2, 4, 16]
    assert res.prepare_seqlen_q is None


def test_upstream_without_sort_stores_no_seqlen_vector():
    # local (Sort off upstream, flash_api.cpp: varlen_sort_batches = !is_local): m-blocks, heads-in-L2, no seqlen_q.
    # One split (S 1): n per split = n-blocks 40, 1, 235 (the prepare step does not clip by the window); 8 MiB = 128
    # blocks: 40 * 2 = 80 -> 2, 1 -> 16, 235 * 2 > 128 -> 1; h == h_k, so no PackGQA and qhpk 1
    s = resolve_schedule(precompute_inputs(3, 4, 30000, 16, 16, 128, varlen_q=True, window_size=(100, 0)))
    assert s.sort is False and s.swizzle is True
    res = prepare_scheduler(s, [5120, 100, 30000])
    assert res.prepare_seqlen_q is None and res.batch_idx is None and res.nheads_in_l2 == [2, 16, 1]


def test_the_forks_l2_budget_is_a_cpp_int():
    for qhpk in (1, 2, 3, 8, 9, 32):
        assert type(fork_l2_budget(qhpk)) is int
