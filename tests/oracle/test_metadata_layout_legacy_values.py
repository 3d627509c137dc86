"""Pins of the older vLLM fork's metadata layout ("semaphore-splits": the FA3 of vLLM 0.10.1-0.16.0) and its decoding.

Source: vllm-project/flash-attention ``hopper/flash_api.cpp`` at a8937124. The precompute (624-652) and the call
(994-1028) keep a dynamic split vector when ``params.b <= 992 && num_splits != 1`` and size the tensor
``int(scheduler_needs_semaphore) + int(use_dynamic_split) * params.b`` (no rounding to 4); the semaphore is
``data_ptr<int>()`` (slot 0), the split counts ``data_ptr<int>() + 1`` (slots 1..b); nothing else is stored. Its
tile scheduler (``hopper/tile_scheduler.hpp``@a8937124 453-478) counts each batch's m-blocks as
``ceil_div(seqlen * (PackGQA ? qhead_per_khead : 1), kBlock)`` from the call's own query lengths, and reads a batch's
split count from the dynamic vector when it is there, else ``params.num_splits`` (1 without Split).

Each test writes the expected slots from those formulas and compares slot by slot.
"""

import pytest

from refmodel.fa3_builds import VLLM_FORK_2D3B7508, VLLM_FORK_A8937124
from refmodel.fa3_scheduler import call_inputs, resolve_schedule
from refmodel.metadata_layout import UNWRITTEN, MetadataLayout, decode_values_for_schedule


def _round4(b):
    return (b + 3) // 4 * 4


@pytest.mark.parametrize("b", [1, 3, 5, 256])
@pytest.mark.parametrize("dynamic", [False, True])
def test_the_older_forks_offsets_are_the_semaphore_then_b_split_counts(b, dynamic):
    # sort and swizzle passed True: the older fork stores neither vector whatever the schedule says
    lay = MetadataLayout(batch_size=b, b4=_round4(b), sort=True, swizzle=True, has_semaphore=True,
                         legacy=True, legacy_dynamic_split=dynamic)
    assert lay.num_vectors == int(dynamic)
    assert lay.size == 1 + int(dynamic) * b                      # 1012: not rounded to 4
    assert lay.semaphore_offset == 0                             # data_ptr<int>()
    assert lay.splits_offset == (1 if dynamic else None)         # data_ptr<int>() + 1 (1028)
    assert (lay.m_blocks_offset, lay.batch_idx_offset, lay.nheads_in_l2_offset) == (None, None, None)


def _call(num_splits, pack_gqa=None, build=VLLM_FORK_A8937124):
    # 3 sequences of 100 query rows, h 32 / h_k 8 (qhead_per_khead 4), d 128: the kernel's kBlockM is 128
    s = resolve_schedule(call_inputs(3, 100, 4096, 32, 8, 128, varlen_q=True, total_q=300, num_splits=num_splits,
                                     pack_gqa=pack_gqa, build=build))
    assert s.kernel_block_m == 128 and s.qhead_per_khead == 4 and s.needs_semaphore
    return s


@pytest.mark.parametrize("build", [VLLM_FORK_A8937124, VLLM_FORK_2D3B7508])
def test_the_dynamic_vector_decodes_slot_by_slot(build):
    s = _call(0, build=build)                       # num_splits 0: the heuristic's 4, PackGQA OR-ed with Split
    assert s.legacy_dynamic_split and s.num_splits == 4 and s.kernel_pack_gqa
    values = [7, 2, 3, 4]                           # the semaphore, then batch 0..2's split counts
    d = decode_values_for_schedule(values, s)
    assert d.layout == MetadataLayout.for_schedule(s)
    assert d.semaphore == 7
    assert d.num_splits == [2, 3, 4, UNWRITTEN]     # b4 slots; the fourth is no batch's
    assert d.num_m_blocks == [-(-100 * 4 // 128)] * 4 == [4, 4, 4, 4]   # PackGQA: rows x qhead_per_khead
    assert d.batch_idx is None and d.nheads_in_l2 is None


def test_without_the_dynamic_vector_every_batch_runs_the_calls_split_count_and_its_own_rows():
    s = _call(1, pack_gqa=False)                    # num_splits 1 passed: no vector (624, 994), no PackGQA
    assert not s.legacy_dynamic_split and not s.kernel_pack_gqa and s.metadata_size == 1
    d = decode_values_for_schedule([5], s)
    assert d.semaphore == 5
    assert d.num_splits == [1, 1, 1, 1]             # params.num_splits (tile_scheduler.hpp 476-478)
    assert d.num_m_blocks == [1, 1, 1, 1]           # ceil_div(100, 128): rows not multiplied without PackGQA
    packed = decode_values_for_schedule([5], _call(1, pack_gqa=True))
    assert packed.num_m_blocks == [4, 4, 4, 4]      # ceil_div(100 * 4, 128)


def test_an_unwritten_tensor_decodes_as_unwritten_slots_and_no_semaphore():
    s = _call(0)
    d = decode_values_for_schedule([], s)
    assert d.semaphore is None
    assert d.num_splits == [UNWRITTEN] * 4
