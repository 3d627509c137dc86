"""FA3's prepare step: per-batch split counts, m-blocks, the batch sort and heads-in-L2.

Models `prepare_varlen_num_blocks_kernel` in FA3's `hopper/flash_prepare_scheduler.cu` (commit 0251105a).
The kernel runs one CTA per 992 batches (32 warps of 31 lanes); batches are sorted only within their CTA.

Integer arithmetic is C++ int (refmodel.cint), as in the kernel: `Lq * qhpk`, `seqlen - leftpad + new`, each
batch's `m_blocks * n_blocks` and their warp/atomic sum wrap past 2^31 - 1 (the sum of wrapped terms is the same
in any order); the float blocks_per_sm converts back to int saturating, as the GPU's cvt does.
A precompute of zero batches launches this kernel on an empty grid: `launch_check` (the process ends).

Under the vLLM fork's build (refmodel.fa3_builds) Sort is off, the first vector holds Lq * (qhpk if PackGQA) per
batch instead of m-blocks, and the heads-in-L2 budget is 32 MiB / qhpk-class (``fork_l2_budget``).

Simplification: FA3 sorts with `cub::BlockMergeSort::Sort`, which does not promise an order for equal keys;
this model breaks ties by ascending batch index (a stable sort). Fidelity checks compare tied entries as sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .cint import c_ceil_div, f32_to_int_sat, to_int32
from .errors import ProcessAbort
from .fa3_builds import metadata_layout_kind
from .fa3_scheduler import F32, L2_SWIZZLE_BYTES, PREPARE_MAX_BATCH_ONE_CTA, Schedule, ceil_div


@dataclass(frozen=True)
class PrepareResult:
    """The prepare step's per-virtual-batch outputs, each of length b (slots >= b are not written)."""

    num_splits: list[int]
    num_m_blocks: list[int]
    batch_idx: Optional[list[int]]      # varlen_batch_idx, only when Sort
    nheads_in_l2: Optional[list[int]]   # only when Swizzle
    blocks_per_sm: Optional[int]        # None when the split computation was skipped
    #: the vLLM fork's first vector: Lq * (qhpk if PackGQA else 1) per batch (its m-blocks are not stored)
    prepare_seqlen_q: Optional[list[int]] = None


def m_blocks_for(seqlen_q: int, qhead_per_khead: int, pack_gqa: bool, block_m: int) -> int:
    """m-tiles of one batch: ceil(Lq * (qhpk if PackGQA else 1) / kBlockM) (flash_prepare_scheduler.cu)."""
    rows = to_int32(seqlen_q * (qhead_per_khead if pack_gqa else 1))
    return c_ceil_div(rows, block_m)


def n_blocks_for(seqused_k: int, leftpad_k: int, seqlen_new: int, block_n: int) -> int:
    """n-tiles of one batch: ceil((seqused_k - leftpad + new KV) / kBlockN) (flash_prepare_scheduler.cu)."""
    return c_ceil_div(to_int32(to_int32(seqused_k - leftpad_k) + seqlen_new), block_n)


def blocks_per_sm(total_blocks: int, num_heads: int, num_sm: int) -> int:
    """ceilf(float(total) * 1.1f * float(heads) / float(num_sm)) in float32 (flash_prepare_scheduler.cu)."""
    value = F32(total_blocks) * F32(1.1) * F32(num_heads) / F32(num_sm)
    return f32_to_int_sat(np.ceil(F32(value)))


def total_blocks(m_blocks: Sequence[int], n_blocks: Sequence[int]) -> int:
    """The prepare kernel's int sum of m_blocks * n_blocks over the batch; wraps past 2^31 - 1 (flash_prepare_scheduler.cu 146-154)."""
    total = 0
    for m, n in zip(m_blocks, n_blocks):
        total = to_int32(total + to_int32(m * n))
    return total


def launch_check(batch_size: int) -> None:
    """The precompute's prepare launch: `ceil_div(b, 992)` CTAs; none is an invalid launch and FA3 calls exit(1).

    flash_prepare_scheduler.cu lines 222-232 size the grid from b; flash_api.cpp line 659 runs
    CHECK_CUDA_KERNEL_LAUNCH(), which cuda_check.h lines 12-21 turn into `exit(1)`.
    """
    if c_ceil_div(batch_size, 31 * 32) <= 0:
        raise ProcessAbort("batch_size", "the prepare kernel is launched with a grid of 0 blocks (invalid configuration "
                           "argument) and CHECK_CUDA_KERNEL_LAUNCH calls exit(1)",
                           "hopper/flash_prepare_scheduler.cu@0251105a:223,232; hopper/flash_api.cpp:659; "
                           "hopper/cuda_check.h:12-21", batch_size)


def dynamic_split(n_blocks: int, bps: int, num_splits_static: int) -> int:
    """Per-batch split count: max(min(ceil(n_blocks / blocks_per_sm), S_static), 1) (flash_prepare_scheduler.cu)."""
    if bps == 0:
        # ceil(0 / 0): FA3 divides by zero here (an all-empty batch). The GPU's integer division by zero
        # yields an unspecified value; the clamp puts any value in [1, max(S_static, 1)]; we return 1 and document it.
        return 1
    # int arithmetic: for bps < 0 (a wrapped total) and a saturated bps the quotient is <= 1, so the split is 1
    return max(min(c_ceil_div(n_blocks, bps), num_splits_static), 1)


def nheads_in_l2(n_blocks: int, max_kvblocks_in_l2: int, qhead_per_khead: int, pack_gqa: bool, num_heads: int) -> int:
    """Largest k in {16,8,4,2,1} with n*k <= L2 budget, times qhpk without PackGQA, capped at heads."""
    for k in (16, 8, 4, 2):
        if to_int32(n_blocks * k) <= max_kvblocks_in_l2:
            chosen = k
            break
    else:
        chosen = 1
    if not pack_gqa:
        chosen *= qhead_per_khead
    return min(chosen, num_heads)


def max_kvblocks_in_l2(block_n: int, headdim: int, headdim_v: int, element_size: int,
                       size_l2: int = L2_SWIZZLE_BYTES) -> int:
    """The L2 budget (8 MiB upstream) divided by the bytes of one KV block, kBlockN * (d + dv) * elem (flash_prepare_scheduler.cu)."""
    return size_l2 // (block_n * (headdim + headdim_v) * element_size)


def fork_l2_budget(qhead_per_khead: int) -> int:
    """The vLLM fork's L2 budget: 32 MiB over 1/2/4/8/16 for qhpk 1, <=2, <=4, <=8, more.

    vllm-project/flash-attention@617264c1 hopper/flash_prepare_scheduler.cu 220-225.
    """
    for bound, divisor in ((1, 1), (2, 2), (4, 4), (8, 8)):
        if qhead_per_khead <= bound:
            return (32 * 1024 * 1024) // divisor
    return (32 * 1024 * 1024) // 16


def prepare_scheduler(schedule: Schedule, seqused_k: Sequence[int], seqlens_q: Optional[Sequence[int]] = None,
                      leftpad_k: Optional[Sequence[int]] = None, seqlens_new: Optional[Sequence[int]] = None,
                      blocks_per_sm_value: Optional[int] = None) -> PrepareResult:
    """Run FA3's prepare step for one schedule over concrete per-batch lengths (flash_prepare_scheduler.cu).

    `seqlens_q` defaults to the static seqlen_q for every batch; `seqlens_new` to the static new-KV length.
    `blocks_per_sm_value` replaces the IEEE blocks_per_sm by another value a fast-math division can give
    (refmodel.fastmath `blocks_per_sm_candidates`); None computes it.
    """
    inp = schedule.inputs
    fork = metadata_layout_kind(inp.build) == "fork"   # the fork's prepare kernel (refmodel.fa3_builds)
    b = inp.batch_size
    if len(seqused_k) != b:
        raise ValueError(f"cache_seqlens: expected {b} entries (batch_size), got {len(seqused_k)}")
    lq = list(seqlens_q) if seqlens_q is not None else [inp.seqlen_q] * b
    lp = list(leftpad_k) if leftpad_k is not None else [0] * b
    ln = list(seqlens_new) if seqlens_new is not None else [inp.seqlen_knew] * b
    qhpk = schedule.qhead_per_khead
    heads = schedule.prepare_num_heads
    m_blocks = [m_blocks_for(lq[i], qhpk, schedule.pack_gqa, schedule.block_m) for i in range(b)]
    n_blocks = [n_blocks_for(int(seqused_k[i]), lp[i], ln[i], schedule.block_n) for i in range(b)]

    multi_cta = b > PREPARE_MAX_BATCH_ONE_CTA
    if multi_cta or schedule.num_splits == 1:
        splits = [1] * b
        n_per_split = list(n_blocks)
        bps = None
    else:
        bps = blocks_per_sm(total_blocks(m_blocks, n_blocks), heads, inp.num_sm) if blocks_per_sm_value is None \
            else int(blocks_per_sm_value)
        splits = [dynamic_split(n, bps, schedule.num_splits) for n in n_blocks]
        n_per_split = [c_ceil_div(n, s) for n, s in zip(n_blocks, splits)]

    l2_budget = max_kvblocks_in_l2(schedule.block_n, inp.headdim, inp.headdim_v, inp.element_size,
                                   fork_l2_budget(qhpk) if fork else L2_SWIZZLE_BYTES)

    def l2_heads(n: int) -> int:
        return nheads_in_l2(max(n, 1), l2_budget, qhpk, schedule.pack_gqa, heads)

    # the fork (Sort always off) stores Lq * (qhpk if pack) per batch (flash_prepare_scheduler.cu@617264c1 93, 203)
    seqlen_vector = [to_int32(lq[i] * (qhpk if schedule.pack_gqa else 1)) for i in range(b)] if fork else None
    if not schedule.sort:
        return PrepareResult(
            num_splits=splits, num_m_blocks=m_blocks, batch_idx=None,
            nheads_in_l2=[l2_heads(n) for n in n_per_split] if schedule.swizzle else None, blocks_per_sm=bps,
            prepare_seqlen_q=seqlen_vector)

    order: list[int] = []
    for start in range(0, b, PREPARE_MAX_BATCH_ONE_CTA):
        chunk = range(start, min(b, start + PREPARE_MAX_BATCH_ONE_CTA))
        order.extend(sorted(chunk, key=lambda i: -sort_key(schedule, n_per_split[i], m_blocks[i])))
    return PrepareResult(
        num_splits=[splits[i] for i in order],
        num_m_blocks=[m_blocks[i] for i in order],
        batch_idx=order,
        nheads_in_l2=[l2_heads(n_per_split[i]) for i in order] if schedule.swizzle else None,
        blocks_per_sm=bps)


def sort_key(schedule: Schedule, n_per_split: int, m_blocks: int) -> int:
    """Descending sort key: n-blocks per split, or for causal n*kBlockN - m*kBlockM (flash_prepare_scheduler.cu)."""
    if schedule.masking.is_causal:
        return to_int32(to_int32(n_per_split * schedule.block_n) - to_int32(m_blocks * schedule.block_m))
    return n_per_split
