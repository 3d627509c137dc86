"""Class 1: FA3 computes in C++ int, and so does refmodel (wraps, truncating division, saturation).

Upstream read: Dao-AILab/flash-attention hopper/ at 0251105a (heuristics.h, flash_api.cpp,
flash_prepare_scheduler.cu). Every test names the lines it pins.
"""

import random

import pytest
import torch
import z3

from refmodel import call_inputs, get_num_splits, precompute_inputs, resolve_schedule, schedule_and_prepare
from refmodel.cint import INT32_MAX, c_ceil_div, c_div, f32_to_int_sat, to_int32
from refmodel.errors import FA3Rejected
from refmodel.fa3_scheduler import L2_SPLIT_BYTES, num_splits_heuristic
from refmodel.prepare import blocks_per_sm, dynamic_split, total_blocks
from spec.theorems.symbolic import BV, evaluate_term, sym_l2_split_count
from spec.theorems.edges import int32_split_band, replay_rows, run_edge_theorems

ROWS = replay_rows(132)  # enough query rows for 2 x 132 m-blocks (heuristics.h:33)


def _splits(seqlen_k, d=128, dtype="bfloat16", causal=False):
    return get_num_splits(call_inputs(1, ROWS, seqlen_k, 1, 1, d, qkv_dtype=dtype, causal=causal))


def test_c_int_helpers_match_cpp():
    assert to_int32(2**31) == -(2**31) and to_int32(-(2**31) - 1) == INT32_MAX
    assert c_div(-7, 2) == -3 and c_div(7, -2) == -3 and c_div(-7, -2) == 3  # truncation, not floor
    assert c_ceil_div(INT32_MAX, 2) == c_div(to_int32(INT32_MAX + 1), 2) == -(2**30)  # the sum wraps first
    assert f32_to_int_sat(3.0e9) == INT32_MAX and f32_to_int_sat(float("nan")) == 0  # PTX cvt saturates


def test_l2_branch_wraps_to_a_negative_split_count_around_four_million_tokens():
    # heuristics.h:29-34: (size_one_kv_head + size_l2 - 1) / size_l2 in int; flash_api.cpp:463 size in int
    lo, hi = int32_split_band((128 + 128) * 2)
    assert (lo, hi) == (4091905, 4194303)
    assert _splits(lo - 1) == 40                     # size + 50 MiB - 1 == INT_MAX exactly: no wrap yet
    assert _splits(lo) == -40 and _splits(hi) == -39  # the sum wraps: negative quotient (truncated)
    assert _splits(hi + 1) == 1                       # the size itself wraps negative: "fits in L2", 1 split
    assert _splits(lo, causal=True) == 1              # the branch is skipped for causal (heuristics.h:33)
    # head dim 256 reaches the band at two million tokens
    assert int32_split_band(1024) == (2045953, 2097151) and _splits(2045953, d=256) < 1


def test_the_call_rejects_the_negative_count_and_the_precompute_clamps_it():
    # flash_api.cpp:983 then run_mha_fwd line 371: TORCH_CHECK(params.num_splits >= 1)
    with pytest.raises(FA3Rejected, match="num_splits >= 1") as err:
        resolve_schedule(call_inputs(1, ROWS, 4150000, 1, 1, 128))
    assert err.value.field == "num_splits" and "371" in err.value.source
    # mha_fwd_get_scheduler_metadata checks nothing of the kind (flash_api.cpp:548-550, 610); the prepare kernel
    # clamps each split with max(min(., S), 1) (flash_prepare_scheduler.cu:158)
    sched, prep = schedule_and_prepare(2, ROWS, 4150000, 1, 1, 128, torch.tensor([4150000, 1000], dtype=torch.int32))
    assert sched.num_splits == -40 and prep.num_splits == [1, 1]
    # a call without queries never launches (flash_api.cpp:1167), so nothing rejects it
    resolve_schedule(call_inputs(0, ROWS, 4150000, 1, 1, 128))


def test_num_splits_argument_is_int64_then_narrowed_to_int():
    # flash_api.cpp:610/983: `num_splits <= 0` is tested on int64_t, then stored in an int
    assert resolve_schedule(call_inputs(1, 1, 1000, 8, 1, 128, num_splits=2**32 + 3)).num_splits == 3
    assert resolve_schedule(precompute_inputs(1, 1, 1000, 8, 1, 128, num_splits=2**32)).num_splits == 0
    with pytest.raises(FA3Rejected, match="num_splits >= 1"):
        resolve_schedule(call_inputs(1, 1, 1000, 8, 1, 128, num_splits=2**32))


def test_prepare_total_blocks_wraps_and_splits_stay_in_range():
    # flash_prepare_scheduler.cu:146-156: int total of m*n (warp sum, atomicAdd), then the float blocks_per_sm
    assert total_blocks([131072], [16384]) == -(2**31)
    assert total_blocks([65536] * 4, [8192] * 4) == -(2**31)
    assert total_blocks([2**16] * 2, [2**16] * 2) == 0  # 2^33 wraps to 0: blocks_per_sm 0
    bps = blocks_per_sm(-(2**31), 8, 132)
    assert bps < 0 and dynamic_split(1000, bps, 64) == 1
    assert dynamic_split(10, INT32_MAX, 64) == 1 and dynamic_split(2**30, 2, 64) == 64
    assert dynamic_split(INT32_MAX, 2, 64) == 1  # (n + bps - 1) wraps negative first (line 158)


def test_symbolic_l2_branch_agrees_with_refmodel_on_random_and_edge_lengths():
    rng = random.Random(16)
    L = z3.BitVec("L", BV)
    cases = []
    for bpt in (256, 384, 512, 640, 768, 1024, 1280):
        lo, hi = int32_split_band(bpt)
        cases += [lo - 2, lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, hi + 2]
        cases += [(bpt, rng.randrange(1, 2**31 - 1)) for _ in range(1450)]
        cases = [c if isinstance(c, tuple) else (bpt, c) for c in cases]
    for bpt in (512, 1024):  # exhaustive windows around both edges of the first band
        lo, hi = int32_split_band(bpt)
        cases += [(bpt, x) for x in range(lo - 150, lo + 150)] + [(bpt, x) for x in range(hi - 150, hi + 150)]
    assert len(cases) >= 10000
    for bpt, length in cases:
        taken, count = sym_l2_split_count(L, bpt)
        size = to_int32(length * bpt)
        model = num_splits_heuristic(132, 132, 10**6, 264, size, False)  # total >= 0.8 SMs, m >= 2 SMs
        sym_taken = evaluate_term(taken, {L: length})
        assert sym_taken == (size > L2_SPLIT_BYTES), (bpt, length)
        if sym_taken:
            assert evaluate_term(count, {L: length}) == model, (bpt, length)
        else:
            assert model == 1


def test_theorem_8_finds_the_wrap_for_every_instance_and_not_with_64_bit_sizes():
    result = run_edge_theorems()[0]
    assert result.verdict == "expected-refutation" and not result.failed and result.expected
    assert len(result.details["witnesses"]) == result.details["instances"] == 15
    for w in result.details["witnesses"].values():
        assert w["split_count"] < 1 and w["call"].startswith("rejected")
    # negative control: the counterfactual FA3 with 64-bit sizes has no such length
    assert run_edge_theorems(int_bits=64)[0].verdict == "proved"


def test_hazard_map_shows_where_real_models_hit_the_band():
    from fa3verify.commands.hazard_map import int32_split_hazard
    from gpu_impl.config import MODELS

    # gemma-2-9b (d 256) at two million tokens, Qwen3-30B-A3B (d 128) at four million; heuristics.h:29-34
    g = int32_split_hazard(MODELS["gemma-2-9b"], 132, (16, 8))
    assert g["kv_tokens"] == [2045953, 2097151] and g["split_count"] < 1 and g["checked_by_refmodel"]
    q = int32_split_hazard(MODELS["qwen3-30b-a3b"], 132, (32, 4))
    assert q["kv_tokens"] == [4091905, 4194303] and q["min_query_tokens"] == 4209 and q["checked_by_refmodel"]
    # negative control: one query token fewer, or causal, and the branch is not taken (checked inside)
    assert _splits(4150000, causal=True) == 1
