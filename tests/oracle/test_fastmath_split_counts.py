"""Class 6: FA3's fast-math division of blocks_per_sm, and where its <= 2 ulp change a split count.

FA3 (hopper/ at 0251105a): flash_prepare_scheduler.cu:156 computes
ceilf(float(total) * 1.1f * float(num_head) / float(num_sm)); hopper/setup.py:668 builds with --use_fast_math,
so the division is approximate (CUDA bounds it by 2 ulp). Where the IEEE quotient is within 2 ulp of an integer,
the GPU may use either neighbouring ceiling; the split count ceil(n / blocks_per_sm) (line 158) moves with it.
"""

import random

import numpy as np
import pytest
import torch
import z3

from fa3verify.fidelity import FidelityConfig, check_config
from gpu_impl.kernels import load
from refmodel.fastmath import DIV_ULPS, blocks_per_sm_candidates, fast_math_split_change, quotient
from refmodel.metadata import encode_metadata, schedule_and_prepare
from refmodel.prepare import blocks_per_sm, prepare_scheduler
from spec.theorems import metadata as tm
from spec.theorems.symbolic import BV, evaluate_term, sym_blocks_per_sm_range


def _example():
    # decode, 8 query heads on 1 KV head (PackGQA: H = 1), paged causal d=128 (kBlockN 128): 119 + 1 = 120 blocks
    lens = [119 * 128, 128]
    sched, prep = schedule_and_prepare(2, 1, 100000, 8, 1, 128, torch.tensor(lens, dtype=torch.int32),
                                       cu_seqlens_q=[0, 1, 2], page_size=1, causal=True)
    return sched, prep, lens


def test_an_exact_integer_quotient_is_where_fast_math_decides():
    assert float(quotient(120, 1, 132)) == 1.0 and blocks_per_sm(120, 1, 132) == 1
    assert blocks_per_sm_candidates(120, 1, 132) == (1, 2)
    assert blocks_per_sm_candidates(121, 1, 132) == (2,)   # negative control: away from an integer
    assert blocks_per_sm_candidates(0, 8, 132) == (0,)     # 0 / n is exact
    sched, prep, lens = _example()
    assert sched.num_splits == 109 and prep.blocks_per_sm == 1 and prep.num_splits == [109, 1]
    change = fast_math_split_change(sched, lens, [1, 1])
    assert change["candidates"] == [1, 2] and change["splits"] == {1: [109, 1], 2: [60, 1]}
    assert fast_math_split_change(sched, [119 * 128 + 128, 128], [1, 1]) is None


def test_how_often_an_integer_quotient_occurs():
    # every multiple of 120 blocks with one prepare head on 132 SMs; about 3% of totals for H in 1..8
    hits = sum(len(blocks_per_sm_candidates(t, h, 132)) > 1 for h in (1, 2, 4, 8) for t in range(1, 20000))
    assert 2000 < hits < 3000


def test_symbolic_band_agrees_with_refmodel_on_random_and_exhaustive_inputs():
    T, H, N = (z3.BitVec(n, BV) for n in ("T", "H", "N"))
    lo, hi = sym_blocks_per_sm_range(T, H, N, DIV_ULPS)
    rng = random.Random(16)
    points = [(t, h, 132) for t in range(0, 400) for h in (1, 2, 8)]
    points += [(rng.randrange(0, 2**20), rng.choice((1, 2, 4, 8, 16, 32, 64)), rng.choice((78, 108, 114, 132)))
               for _ in range(9000)]
    assert len(points) >= 10000
    for t, h, n in points:
        cands = blocks_per_sm_candidates(t, h, n)
        got = (evaluate_term(lo, {T: t, H: h, N: n}), evaluate_term(hi, {T: t, H: h, N: n}))
        assert got == (cands[0], cands[-1]), (t, h, n)


def test_stage_2_calls_a_violation_that_needs_fast_math_inconclusive(monkeypatch):
    # negative control of the inconclusive path: with a band whose ends never meet, so every witness depends on it, stage 2
    # must not report a witness; with the real band it finds the worked example's overflow as before
    # docs/facts-fa3.md's worked example: precompute with (8, 1) heads, call with (32, 4), paged causal decode, d = 128
    g = tm.Group(P=tm.side_params(tm.precompute_inputs(1, 1, 0, 8, 1, 128, varlen_q=True, page_size=1, causal=True)),
                 C=tm.side_params(tm.call_inputs(1, 1, 0, 32, 4, 128, varlen_q=True, page_size=1, causal=True)),
                 sharded_cp=0, page_size=1, fixed=False)
    # the solver budget is a ceiling, not a speed goal: generous, so that a loaded machine cannot turn the
    # positive control's "sat" into a timeout's "unknown"
    budget = tm.Budget(600.0, cache={})
    r, w = tm._stage2(g, budget, 2, eager=True)
    assert r == "sat" and max(w["splits"]) > w["S_c"]

    def wide(total, heads, num_sm, ulps=2):
        # a band whose two ends never meet: every witness depends on which value the division gives
        lo, hi = sym_blocks_per_sm_range(total, heads, num_sm, ulps=ulps)
        return lo, hi + 1

    monkeypatch.setattr(tm, "sym_blocks_per_sm_range", wide)
    budget = tm.Budget(600.0, cache={})
    r, w = tm._stage2(g, budget, 2, eager=True)
    assert r == "unknown" and w is None
    assert any("fast-math" in u for u in budget.unknowns)


class _FastMathGPU:
    """A stand-in for the real FA3 adapter whose prepare kernel picked the other candidate blocks_per_sm."""

    num_sm, arch = 132, 90

    def __init__(self, bps):
        self.bps = bps

    def get_scheduler_metadata(self, b, sq, sk, h, hk, d, seqused, **kw):
        sched, _ = schedule_and_prepare(b, sq, sk, h, hk, d, seqused, qkv_dtype="bfloat16",
                                        headdim_v=kw.get("headdim_v"), cu_seqlens_q=kw.get("cu_seqlens_q"),
                                        page_size=kw.get("page_size"), causal=kw.get("causal"),
                                        num_splits=kw.get("num_splits", 0))
        lens = [int(x) for x in seqused.tolist()]
        return encode_metadata(sched, prepare_scheduler(sched, lens, seqlens_q=[1] * b, blocks_per_sm_value=self.bps))


def test_fidelity_accepts_the_other_fast_math_candidate_and_nothing_else():
    cfg = FidelityConfig(index=0, model="test", batch_size=2, max_seqlen_q=1, max_seqlen_k=100000, num_heads=8,
                         num_heads_k=1, headdim=128, headdim_v=128, causal=True, num_splits=0, page_size=1,
                         varlen_q=True, cache_seqlens=(119 * 128, 128), seqlens_q=(1, 1))
    res = check_config(_FastMathGPU(2), cfg, probe_split=False)
    assert res["metadata"] == [] and res["fast_math"] == {"blocks_per_sm": 2, "ieee": 1, "candidates": [1, 2]}
    assert check_config(load("emulated"), cfg, probe_split=False)["fast_math"] is None
    # negative control: a value no <= 2-ulp division can give is still a mismatch
    assert check_config(_FastMathGPU(3), cfg, probe_split=False)["metadata"]
