"""Class 5: the metadata a call computes for itself, and comparisons against it.

FA3 (hopper/ at 0251105a): without scheduler_metadata a varlen call runs the prepare step inside run_flash_fwd
with the kernel template's tiles and PackGQA (flash_fwd_launch_template.h:40-43, 148-165; flash_api.cpp:377
forces PackGQA for Split and paged non-TMA), where the precompute uses the host tiles and the unforced pack
decision (flash_api.cpp:609-612, 652-658).
"""

import random

import pytest
import torch

from gpu_impl.kernels import load
from refmodel import call_inputs, precompute_inputs, resolve_schedule
from refmodel.metadata import call_own_metadata, call_own_schedule, schedule_and_prepare
from spec.invariants import CallLengths, evaluate


def _corner_call(num_splits=2):
    # d = 64 with dv = 128: the kernel runs the <64, 256> instance (flash_api.cpp:265-266), kBlockM 128, while
    # the host's tile_size_fwd_sm90(64, 128) says 192 (tile_size.h:13-25)
    return resolve_schedule(call_inputs(1, 400, 401, 16, 1, 64, headdim_v=128, varlen_q=True, num_splits=num_splits))


def test_the_calls_own_prepare_uses_the_kernels_tiles_and_pack():
    C = _corner_call()
    own = call_own_schedule(C)
    assert (C.block_m, C.kernel_block_m) == (192, 128)
    assert (own.block_m, own.block_n, own.pack_gqa) == (C.kernel_block_m, C.kernel_block_n, C.kernel_pack_gqa)
    with pytest.raises(ValueError, match="precompute"):
        call_own_schedule(resolve_schedule(precompute_inputs(1, 1, 64, 8, 1, 128)))
    with pytest.raises(ValueError, match="not varlen"):
        call_own_metadata(resolve_schedule(call_inputs(1, 1, 64, 8, 1, 128, has_cache_seqlens=False)), [64])


def test_at_fa3s_tile_corner_a_fresh_precompute_is_unsafe_but_the_calls_own_metadata_is_safe():
    C = _corner_call()
    lengths = CallLengths((401,), (400,))
    P, R = schedule_and_prepare(1, 400, 401, 16, 1, 64, [401], headdim_v=128, cu_seqlens_q=[0, 400], num_splits=2)
    assert evaluate(P, R, C, lengths).outcome == "violation"            # QUERY_COVER (theorem 1's corner)
    own_sched, own_result = call_own_metadata(C, [401], seqlens_q=[400])
    assert evaluate(own_sched, own_result, C, lengths).outcome == "pass"  # negative control: the call's own


def test_the_calls_own_metadata_is_safe_for_the_call_on_random_inputs():
    rng = random.Random(16)
    for _ in range(300):
        hk = rng.choice((1, 2, 4, 8))
        h = hk * rng.choice((1, 2, 4, 8, 16))
        d, dv = rng.choice(((64, 64), (128, 128), (256, 256), (64, 128), (192, 128), (96, 96)))
        b = rng.randint(1, 12)
        lq = [rng.randint(1, 300) for _ in range(b)]
        lk = [rng.randint(1, 40000) for _ in range(b)]
        C = resolve_schedule(call_inputs(b, max(lq), max(lk), h, hk, d, headdim_v=dv, varlen_q=True,
                                         causal=rng.random() < 0.5, num_splits=rng.choice((0, 0, 1, 3, 16)),
                                         page_size=rng.choice((None, 1, 16))))
        own_sched, own_result = call_own_metadata(C, lk, seqlens_q=lq)
        ev = evaluate(own_sched, own_result, C, CallLengths(tuple(lk), tuple(lq)))
        assert ev.outcome == "pass", (b, h, hk, d, dv, lq, lk, ev.violations[:1])


def test_the_emulator_compares_given_metadata_with_the_calls_own():
    k = load("emulated")
    lens = torch.tensor([3000, 50], dtype=torch.int32)
    q = torch.randn(2, 1, 8, 128)
    kv = torch.randn(2, 3072, 1, 128)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    fresh = k.get_scheduler_metadata(2, 1, 3072, 8, 1, 128, lens, cu_seqlens_q=cu)
    k.flash_attn_with_kvcache(q.reshape(2, 8, 128), kv, kv, cache_seqlens=lens, cu_seqlens_q=cu, max_seqlen_q=1,
                              scheduler_metadata=fresh)
    own = k.last_trace["own_metadata"]
    assert own["differs"] == [] and own["own_num_splits"] == own["given_num_splits"]
    # metadata from other lengths (harmless drift, docs/facts-fa3.md section 2) differs from what the call would compute
    stale = k.get_scheduler_metadata(2, 1, 3072, 8, 1, 128, torch.tensor([50, 3000], dtype=torch.int32),
                                     cu_seqlens_q=cu)
    k.flash_attn_with_kvcache(q.reshape(2, 8, 128), kv, kv, cache_seqlens=lens, cu_seqlens_q=cu, max_seqlen_q=1,
                              scheduler_metadata=stale)
    assert k.last_trace["own_metadata"]["differs"] == [0, 1] and k.last_trace["ok"]
    # without metadata there is nothing to compare
    k.flash_attn_with_kvcache(q.reshape(2, 8, 128), kv, kv, cache_seqlens=lens, cu_seqlens_q=cu, max_seqlen_q=1)
    assert k.last_trace["own_metadata"] is None
