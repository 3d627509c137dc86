"""FA3's own edges on the real FA3 (skipped without CUDA and an FA3 module; see conftest.py).

* a zero-batch precompute is refused by the adapter (FA3 itself would exit(1): hopper/flash_api.cpp:659 at 0251105a);
* the int L2 branch: a non-causal call just inside the band is rejected by FA3 (heuristics.h:34, flash_api.cpp:371)
  and one token below it runs;
* fast math: where the IEEE quotient of blocks_per_sm is an integer, the real split counts are one of refmodel's
  candidates (flash_prepare_scheduler.cu:156), and the test says which one this GPU took.
"""

from __future__ import annotations

import pytest
import torch

from gpu_impl.errors import ProcessAbort
from refmodel.fastmath import blocks_per_sm_candidates, fast_math_split_change
from refmodel.metadata import decode_metadata, schedule_and_prepare
from refmodel.l2_split_edges import int32_split_band, replay_rows

pytestmark = pytest.mark.gpu


def test_zero_batch_precompute_is_refused_not_run(fa3_strict):
    with pytest.raises(ProcessAbort):
        fa3_strict.get_scheduler_metadata(0, 1, 1024, 8, 1, 128, torch.zeros(0, dtype=torch.int32, device="cuda"))


def test_int32_band_is_rejected_by_real_fa3(fa3_strict):
    lo, _ = int32_split_band(512)
    rows = replay_rows(fa3_strict.num_sm)
    q = torch.randn(1, rows // 32, 32, 128, device="cuda", dtype=torch.bfloat16)
    for length, rejected in ((lo, True), (lo - 1, False)):
        k = torch.randn(1, length, 1, 128, device="cuda", dtype=torch.bfloat16)
        if rejected:
            with pytest.raises(RuntimeError, match="num_splits >= 1"):
                fa3_strict.module.flash_attn_with_kvcache(q, k, k, causal=False)
        else:
            fa3_strict.module.flash_attn_with_kvcache(q, k, k, causal=False)
        del k
        torch.cuda.empty_cache()


def test_fast_math_blocks_per_sm_is_one_of_the_candidates(fa3_strict, record_property):
    sm = fa3_strict.num_sm
    total = next(t for t in range(2, 5000) if len(blocks_per_sm_candidates(t, 1, sm)) > 1)
    block_n = 176  # d = 128 non-causal decode without paging (tile_size.h: kBlockN 176)
    lens = [(total - 1) * block_n, block_n]
    cs = torch.tensor(lens, dtype=torch.int32)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    sched, _ = schedule_and_prepare(2, 1, max(lens), 8, 1, 128, cs, cu_seqlens_q=cu, num_sm=sm)
    assert sched.block_n == block_n
    change = fast_math_split_change(sched, lens, [1, 1])
    if change is None:
        pytest.skip(f"no split count moves at total {total} on {sm} SMs")
    md = fa3_strict.get_scheduler_metadata(2, 1, max(lens), 8, 1, 128, cs.cuda(), cu_seqlens_q=cu.cuda())
    dec = decode_metadata(md.cpu(), 2, sched.sort, sched.swizzle)
    real = {dec.batch_idx[vb]: dec.num_splits[vb] for vb in range(2)}
    real_splits = [real[0], real[1]]
    picked = [bps for bps, splits in change["splits"].items() if splits == real_splits]
    record_property("fast_math", {"total": total, "candidates": change["candidates"], "real_splits": real_splits,
                                  "picked_blocks_per_sm": picked, "ieee": change["ieee"]})
    assert picked, (real_splits, change)
