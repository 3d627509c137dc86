"""Pins of refmodel.fastmath: the candidate ``blocks_per_sm`` band of a <= 2-ulp division, by hand.

Source: `hopper/flash_prepare_scheduler.cu` line 156 at 0251105a:
``blocks_per_sm = ceilf(float(total) * 1.1f * float(num_head) / float(num_sm))``, built with ``--use_fast_math``
(hopper/setup.py), whose float32 division CUDA bounds by 2 ulp. Values below were computed in float32 by hand
(``np.float32``) and checked against the band's definition: every ceiling within ``ulps`` ulp of the quotient.
"""

import numpy as np
import pytest
import torch

from refmodel.fastmath import DIV_ULPS, blocks_per_sm_candidates, fast_math_split_change, quotient
from refmodel.metadata import schedule_and_prepare


def test_the_bound_is_cuda_s_two_ulp():
    assert DIV_ULPS == 2


def test_the_quotient_is_float32_products_then_the_division():
    # 1.1f = 1.10000002384...; 121 * 1.1f = 133.1 (rounded to f32), / 132 = 1.00833333...
    q = quotient(121, 1, 132)
    assert q.dtype == np.float32 and q == np.float32(np.float32(np.float32(121) * np.float32(1.1)) / np.float32(132))
    assert float(quotient(1000, 8, 78)) == pytest.approx(112.820511, abs=1e-5)
    assert float(quotient(120, 1, 132)) == 1.0      # 120 * 1.1f rounds to exactly 132.0 in float32


@pytest.mark.parametrize("ulps, band", [(0, (1,)), (1, (1, 2)), (2, (1, 2)), (3, (1, 2))])
def test_an_exact_integer_quotient_widens_upward_from_one_ulp(ulps, band):
    # q == 1.0 exactly: ceil(q) == 1; one ulp up, 1.0000001, ceils to 2; below 1 still ceils to 1
    assert blocks_per_sm_candidates(120, 1, 132, ulps=ulps) == band


def test_a_quotient_two_ulp_above_an_integer_needs_the_second_ulp():
    # q = 4104.001 (f32): 1 ulp at 4104 is 2^-11 = 0.000488; q - 2 ulp <= 4104 < q - 1 ulp, so ceil 4104 joins only at 2
    assert float(quotient(41573, 7, 78)) == pytest.approx(4104.001, abs=5e-4)
    assert blocks_per_sm_candidates(41573, 7, 78, ulps=1) == (4105,)
    assert blocks_per_sm_candidates(41573, 7, 78, ulps=2) == (4104, 4105)
    assert blocks_per_sm_candidates(41573, 7, 78) == (4104, 4105)     # default: DIV_ULPS


def test_zero_blocks_divide_exactly():
    assert blocks_per_sm_candidates(0, 8, 132) == (0,)
    assert blocks_per_sm_candidates(0, 1, 78, ulps=5) == (0,)


def _example(lens, b=2):
    cu = list(range(b + 1))
    return schedule_and_prepare(b, 1, 100000, 8, 1, 128, torch.tensor(lens, dtype=torch.int32), cu_seqlens_q=cu,
                                page_size=1, causal=True)[0]


def test_the_split_change_reports_every_field():
    # docs/facts-fa3.md's worked example: 119 + 1 = 120 n-blocks, 1 prepare head (PackGQA), 132 SMs: q = 1.0, ceil 1 or 2
    lens = [119 * 128, 128]
    sched = _example(lens)
    change = fast_math_split_change(sched, lens)              # seqlens_q defaults to the call's seqlen_q (1)
    assert change == {"total_blocks": 120, "quotient": 1.0, "ieee": 1, "candidates": [1, 2],
                      "splits": {1: [109, 1], 2: [60, 1]}}
    assert fast_math_split_change(sched, lens, [1, 1]) == change
    assert fast_math_split_change(sched, lens, ulps=0) is None    # one candidate: nothing depends on the division


def test_no_change_past_one_cta_or_with_one_split():
    # line 148: batches over kNumBatchPerWarp * 31 = 992 run the multi-CTA path without the dynamic split
    # 1080 n-blocks in both: q = 1080 * 1.1f / 132 = 9.0 exactly, so blocks_per_sm may be 9 or 10 and the long
    # sequence's split count ceil(n / bps) moves (ceil(89 / 9) = 10 vs 9); at 993 batches FA3 does not split dynamically
    lens = [89 * 128] + [128] * 991
    change = fast_math_split_change(_example(lens, b=992), lens)
    assert change["total_blocks"] == 1080 and change["candidates"] == [9, 10]
    assert change["splits"][9][0] == 10 and change["splits"][10][0] == 9
    lens = [88 * 128] + [128] * 992
    assert fast_math_split_change(_example(lens, b=993), lens) is None
    sched = schedule_and_prepare(2, 1, 100000, 8, 1, 128, torch.tensor([119 * 128, 128], dtype=torch.int32),
                                 cu_seqlens_q=[0, 1, 2], page_size=1, causal=True, num_splits=1)[0]
    assert sched.num_splits == 1 and fast_math_split_change(sched, [119 * 128, 128]) is None


def test_the_per_batch_blocks_are_the_prepare_kernels():
    # lines 92-94 and 118-120: m-blocks count packed rows (PackGQA: rows * qhead_per_khead), n-blocks the cache length
    # with leftpad 0 and the new-KV term. Both sides feed total = sum m_i * n_i, so each term moves the band.
    # 17 query rows of 8 heads packed: ceil(136 / 128) = 2 m-blocks a batch; n = (10, 50): total 2 * 60 = 120 -> q = 1.0
    lens = [10 * 128, 50 * 128]
    sched = schedule_and_prepare(2, 100, 100000, 8, 1, 128, torch.tensor(lens, dtype=torch.int32),
                                 cu_seqlens_q=[0, 17, 34], page_size=1, causal=True)[0]
    assert sched.pack_gqa and sched.num_splits == 17
    change = fast_math_split_change(sched, lens, [17, 17])
    assert change["total_blocks"] == 120 and change["splits"] == {1: [10, 17], 2: [5, 17]}
    # without per-batch lengths the static max_seqlen_q (100 rows: 7 m-blocks) is used: total 420, one candidate
    assert fast_math_split_change(sched, lens) is None
    # a cache length one past a block boundary is one more n-block: 118 * 128 + 1 -> 119, total 120 again
    lens = [118 * 128 + 1, 128]
    assert fast_math_split_change(_example(lens), lens)["total_blocks"] == 120


def test_a_static_split_count_of_two_still_moves():
    # num_splits = 2: n = (2, 118), total 120; bps 1 gives ceil(2 / 1) = 2, bps 2 gives 1 (clamped to [1, 2])
    lens = [2 * 128, 118 * 128]
    sched = schedule_and_prepare(2, 1, 100000, 8, 1, 128, torch.tensor(lens, dtype=torch.int32), cu_seqlens_q=[0, 1, 2],
                                 page_size=1, causal=True, num_splits=2)[0]
    assert sched.num_splits == 2
    assert fast_math_split_change(sched, lens)["splits"] == {1: [2, 2], 2: [1, 2]}
