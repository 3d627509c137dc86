"""Where FA3's fast-math division can change a split count.

The prepare kernel computes ``blocks_per_sm = ceilf(float(total) * 1.1f * float(H) / float(num_sm))``
(``hopper/flash_prepare_scheduler.cu`` line 156 at 0251105a) and FA3 builds it with ``--use_fast_math``
(``hopper/setup.py``), under which a float32 division is approximate: CUDA's programming guide bounds
``x / y`` under ``-prec-div=false`` by 2 ulp. The products are exact-rounded (no addition to contract into
an FMA), so the division is the only departure from IEEE round-to-nearest that refmodel computes.

A 2-ulp error changes ``ceilf`` only when the IEEE quotient q lies within 2 ulp of an integer k: then the GPU
may use k or k + 1. The split count ``ceil(n_blocks / blocks_per_sm)`` (clamped to [1, S]) changes with it for
some n. This module lists the candidate values and says whether a concrete batch's split counts depend on
which one the GPU picks; the prover treats such inputs as inconclusive (spec.theorems.symbolic `sym_blocks_per_sm_range`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from .cint import f32_to_int_sat
from .fa3_scheduler import F32, PREPARE_MAX_BATCH_ONE_CTA, Schedule
from .prepare import blocks_per_sm, dynamic_split, m_blocks_for, n_blocks_for, total_blocks

__all__ = ["DIV_ULPS", "quotient", "blocks_per_sm_candidates", "fast_math_split_change"]

#: Largest error of a fast-math float32 division, in units in the last place (CUDA programming guide).
DIV_ULPS = 2


def quotient(total: int, num_heads: int, num_sm: int) -> np.float32:
    """The IEEE float32 quotient ``float(total) * 1.1f * float(H) / float(num_sm)`` before ``ceilf``."""
    return F32(F32(F32(total) * F32(1.1)) * F32(num_heads)) / F32(num_sm)


def blocks_per_sm_candidates(total: int, num_heads: int, num_sm: int, ulps: int = DIV_ULPS) -> tuple[int, ...]:
    """Every ``blocks_per_sm`` a division within ``ulps`` of the IEEE quotient can give, ascending."""
    q = quotient(total, num_heads, num_sm)
    lo, hi = q, q
    for _ in range(int(ulps)):
        lo = np.nextafter(lo, F32(-np.inf), dtype=np.float32)
        hi = np.nextafter(hi, F32(np.inf), dtype=np.float32)
    if q == 0:
        lo = hi = q  # 0 / n is exactly 0 for any division
    values = range(f32_to_int_sat(np.ceil(lo)), f32_to_int_sat(np.ceil(hi)) + 1)
    return tuple(values)


def fast_math_split_change(schedule: Schedule, seqused_k: Sequence[int], seqlens_q: Optional[Sequence[int]] = None,
                           ulps: int = DIV_ULPS) -> Optional[dict]:
    """None when the prepare step's split counts are the same for every candidate ``blocks_per_sm``; else the candidates and splits.

    Mirrors refmodel.prepare.prepare_scheduler's split computation (before the sort, which only permutes).
    """
    inp = schedule.inputs
    b = len(seqused_k)
    if b > PREPARE_MAX_BATCH_ONE_CTA or schedule.num_splits == 1:
        return None
    lq = list(seqlens_q) if seqlens_q is not None else [inp.seqlen_q] * b
    m = [m_blocks_for(lq[i], schedule.qhead_per_khead, schedule.pack_gqa, schedule.block_m) for i in range(b)]
    n = [n_blocks_for(int(seqused_k[i]), 0, inp.seqlen_knew, schedule.block_n) for i in range(b)]
    total = total_blocks(m, n)
    cands = blocks_per_sm_candidates(total, schedule.prepare_num_heads, inp.num_sm, ulps)
    splits = {c: [dynamic_split(x, c, schedule.num_splits) for x in n] for c in cands}
    if len({tuple(v) for v in splits.values()}) <= 1:
        return None
    return {"total_blocks": total, "quotient": float(quotient(total, schedule.prepare_num_heads, inp.num_sm)),
            "ieee": blocks_per_sm(total, schedule.prepare_num_heads, inp.num_sm),
            "candidates": list(cands), "splits": {int(k): v for k, v in splits.items()}}
