"""Pins of refmodel.fa3_scheduler's build-dependent decisions on both sides of each boundary.

Source: vllm-project/flash-attention ``hopper/flash_api.cpp`` at 617264c1: the call's
``if (use_prepare_varlen && params.b > PREPARE_VARLEN_MAX_BATCHES_1CTA) { params.num_splits = 1; }`` (line 1070,
``PREPARE_VARLEN_MAX_BATCHES_1CTA`` 992 at line 39), which the precompute does not have (its dynamic vector is only
dropped, line 677); the call's semaphore ``arch >= 90 ? (((is_causal || is_local) && num_splits == 1) || is_varlen)
: ...`` (1075-1077); the vectors ``(use_prepare_varlen ? 1 : 0) + dynamic split + Swizzle`` (1083-1089) and the tensor
``int(scheduler_needs_semaphore) + b_rounded * vectors`` (1091), present when either is needed (1081).
"""

import pytest

from refmodel.fa3_builds import UPSTREAM, VLLM_FORK
from refmodel.fa3_scheduler import call_inputs, precompute_inputs, resolve_schedule


@pytest.mark.parametrize("b, call_splits, call_size, pre_size", [
    (992, 4, 2 * 992 + 1, 2 * 992 + 1),     # prepare_seqlen_q + dynamic splits + semaphore
    (993, 1, 996 + 1, 996 + 1),             # over 992: the call runs one split; the precompute drops the vector
])
def test_the_forks_varlen_batch_cap_on_both_sides(b, call_splits, call_size, pre_size):
    call = resolve_schedule(call_inputs(b, 1, 65536, 8, 1, 128, num_splits=4, build=VLLM_FORK))
    pre = resolve_schedule(precompute_inputs(b, 1, 65536, 8, 1, 128, num_splits=4, build=VLLM_FORK))
    assert (call.num_splits, pre.num_splits) == (call_splits, 4)
    assert (call.metadata_size, pre.metadata_size) == (call_size, pre_size)
    plain = resolve_schedule(call_inputs(b, 1, 65536, 8, 1, 128, num_splits=4, has_cache_seqlens=False,
                                         build=VLLM_FORK))
    assert plain.num_splits == 4      # no prepare step: the cap does not apply
    assert resolve_schedule(call_inputs(b, 1, 65536, 8, 1, 128, num_splits=4)).num_splits == 4   # upstream


@pytest.mark.parametrize("causal, splits, fork_size, upstream_size", [
    (True, 1, 1 + 4, 1 + 2 * 4),   # semaphore: causal with one split; fork: heads-in-L2 only; upstream: Sort + Swizzle
    (True, 2, 0, 0),               # Split, not varlen: no persistent scheduler, no metadata
    (False, 1, 0, 0),
])
def test_a_call_without_the_prepare_step_needs_the_semaphore_only_for_causal_without_split(causal, splits, fork_size,
                                                                                          upstream_size):
    sizes = []
    for name in (VLLM_FORK, UPSTREAM):
        s = resolve_schedule(call_inputs(4, 8, 65536, 8, 1, 128, num_splits=splits, causal=causal,
                                         has_cache_seqlens=False, build=name))
        assert s.needs_semaphore is (causal and splits == 1)
        sizes.append(s.metadata_size)
    assert sizes == [fork_size, upstream_size]
