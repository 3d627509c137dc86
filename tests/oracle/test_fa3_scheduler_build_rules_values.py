"""Pins of refmodel.fa3_scheduler's build-keyed host rules, each value written from the FA3 source it models.

Sources: vllm-project/flash-attention ``hopper/flash_api.cpp`` at a8937124 (the FA3 of vLLM 0.11.1-0.16.0): the
precompute's ``params.pack_gqa = pack_gqa_.has_value() ? pack_gqa_.value() : get_pack_gqa(params);
params.pack_gqa |= params.num_splits > 1;`` (629-631) and the call's (1001-1003); the metadata tensor
``int(scheduler_needs_semaphore) + int(use_dynamic_split) * params.b`` long (1012, not rounded to 4).
Dao-AILab/flash-attention ``hopper/flash_api.cpp`` at 0251105a: the call's ``scheduler_needs_semaphore`` on sm90,
``((is_causal || is_local) && num_splits == 1) || is_varlen`` (990-992), and ``get_pagedkv_tma``'s
``params.seqlen_q * (params.h / params.h_k) > kBlockM``, a C++ int product (32-bit, wraps); its pack_gqa is the
caller's value or ``get_pack_gqa`` with no OR (985).
"""

import pytest

from refmodel.fa3_builds import UPSTREAM, VLLM_FORK_A8937124
from refmodel.fa3_scheduler import call_inputs, precompute_inputs, resolve_schedule


@pytest.mark.parametrize("pack_gqa, num_splits, expected", [
    (False, 2, True),    # the caller's False OR-ed with Split (1003)
    (True, 1, True),     # the caller's True kept without Split
    (False, 1, False),   # neither
])
def test_the_older_fork_ors_the_callers_pack_gqa_with_split(pack_gqa, num_splits, expected):
    call = resolve_schedule(call_inputs(3, 1, 4096, 32, 8, 128, varlen_q=True, total_q=3, num_splits=num_splits,
                                        pack_gqa=pack_gqa, build=VLLM_FORK_A8937124))
    assert call.num_splits == num_splits and call.pack_gqa is expected
    pre = resolve_schedule(precompute_inputs(3, 1, 4096, 32, 8, 128, num_splits=num_splits, pack_gqa=pack_gqa,
                                             build=VLLM_FORK_A8937124))
    assert pre.pack_gqa is expected   # the precompute's same rule (631)


def test_upstream_keeps_the_callers_pack_gqa_false_under_split():
    # negative control for the rule above: 0251105a's host code does not OR the caller's value with Split
    call = resolve_schedule(call_inputs(3, 1, 4096, 32, 8, 128, varlen_q=True, total_q=3, num_splits=2,
                                        pack_gqa=False, build=UPSTREAM))
    assert call.pack_gqa is False


@pytest.mark.parametrize("b, expected", [(3, 1 + 3), (5, 1 + 5), (256, 1 + 256)])
def test_the_older_forks_metadata_is_one_plus_b_ints_not_rounded_to_four(b, expected):
    call = resolve_schedule(call_inputs(b, 1, 4096, 32, 8, 128, varlen_q=True, total_q=b, num_splits=0,
                                        build=VLLM_FORK_A8937124))
    assert call.legacy_dynamic_split and call.needs_semaphore
    assert call.metadata_size == expected


def test_a_local_fixed_length_call_with_one_split_needs_the_semaphore():
    # not varlen (no cache_seqlens), local, one split: ((causal || local) && num_splits == 1) on sm90 (990-992)
    s = resolve_schedule(call_inputs(2, 64, 4096, 8, 8, 128, has_cache_seqlens=False, window_size=(64, 0),
                                     num_splits=1))
    assert not s.inputs.uses_prepare and s.masking.is_local and not s.masking.is_causal
    assert s.needs_semaphore
    # and without local (nor causal) the same call needs none
    plain = resolve_schedule(call_inputs(2, 64, 4096, 8, 8, 128, has_cache_seqlens=False, num_splits=1))
    assert not plain.needs_semaphore


def test_paged_tma_reads_the_wrapped_int_product_of_seqlen_q_and_heads_per_kv_head():
    # seqlen_q 2081573175 x h/h_k 8388615 wraps to exactly 129 as a C++ int: 129 > kBlockM 128, so TMA
    sq, h = 2081573175, 8388615
    assert ((sq * h + 2**31) % 2**32) - 2**31 == 129
    assert int(sq * float(h)) % 2**32 == 128           # the same product in floating point rounds to 128
    s = resolve_schedule(call_inputs(1, sq, 4096, h, 1, 128, page_size=176))
    assert (s.block_m, s.block_n) == (128, 176) and s.pagedkv_tma


def test_the_sglang_kernels_total_q_bound_counts_one_row_as_one_row():
    # sglang-kernel 0.4.5's compiled get_num_splits: rows = params.total_q when > 0, else b * seqlen_q (read from the
    # wheel, docs/fa3-builds.md). One sequence of one row under max_seqlen_q 64, h 32 / h_k 1, d 64: 1 row x 32 heads
    # is one m-block per KV head, as a call of max_seqlen_q 1; 64 rows are 16 m-blocks, fewer splits
    from refmodel.fa3_builds import SGLANG_KERNEL_045

    def splits(sq, total_q):
        return resolve_schedule(call_inputs(1, sq, 32768, 32, 1, 64, varlen_q=True, total_q=total_q,
                                            build=SGLANG_KERNEL_045)).num_splits

    assert splits(64, 1) == splits(1, 1) == 109
    assert splits(64, None) == splits(64, 64) == 11   # total_q unknown (0): b * max_seqlen_q rows


def test_get_num_splits_takes_the_paged_tma_choice_it_is_given():
    # FA3's get_num_splits reads params.pagedkv_tma (the tile lookup's `page_table && !pagedkv_tma`), so a vector that
    # sets it (a wheel's compiled function) decides the tile: page 16 is not a multiple of kBlockN, so the host itself
    # chooses no TMA (kBlockN 128, 28 splits); given TMA, the same call takes the TMA tile and another split count
    from refmodel.fa3_scheduler import get_num_splits_resolved

    inp = call_inputs(2, 16, 4096, 16, 1, 128, page_size=16)
    s = resolve_schedule(inp)
    assert not s.pagedkv_tma and s.num_splits == 28
    assert get_num_splits_resolved(inp, s.masking, False) == 28
    assert get_num_splits_resolved(inp, s.masking, True) == 21


def test_a_call_s_total_q_is_its_query_rows_fixed_length_or_the_given_rows_varlen():
    # mha_fwd (hopper/flash_api.cpp@0251105a): params.total_q is b * seqlen_q for a fixed-length q and q.size(0) when
    # varlen; the model fills the fixed-length one itself and keeps what a varlen caller gives (None: not given)
    assert call_inputs(4, 16, 512, 8, 2, 128).total_q == 64
    assert call_inputs(4, 16, 512, 8, 2, 128, total_q=64).total_q == 64
    assert call_inputs(4, 16, 512, 8, 2, 128, varlen_q=True).total_q is None
    assert call_inputs(4, 16, 512, 8, 2, 128, varlen_q=True, total_q=37).total_q == 37
