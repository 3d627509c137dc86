"""Pins of refmodel.metadata_layout: each build's metadata layout written from FA3's own offsets, encoded and decoded.

Sources. Upstream (Dao-AILab/flash-attention ``hopper/flash_api.cpp`` at 0251105a, ``mha_fwd_get_scheduler_metadata``):
``b_rounded = round_multiple(b, 4)``, vectors ``num_splits_dynamic`` at 0, ``num_m_blocks`` at b4,
``varlen_batch_idx`` at 2*b4 (Sort), ``num_nheads_in_l2`` at ``b4 * (Sort ? 3 : 2)`` (Swizzle), the semaphore last.
The vLLM fork (vllm-project/flash-attention ``hopper/flash_api.cpp`` at 617264c1): precompute lines 686-707, call
lines 1075-1111: ``num_prepare_batch_vectors = 1 (+1 dynamic split) (+1 Sort, never: line 689/1079) (+1 Swizzle)``,
``prepare_seqlen_q`` at 0 (703/1107), ``num_splits_dynamic`` at ``b_rounded`` (704/1108),
``num_nheads_in_l2`` at ``b_rounded * (num_prepare_batch_vectors - 1)`` (698/1088, 707/1111), the semaphore at
``b_rounded * num_prepare_batch_vectors`` (699/1089), the tensor ``int(scheduler_needs_semaphore) + that offset``
long (701/1091); its tile scheduler reads m-blocks as ``ceil_div(prepare_seqlen_q[b], kBlockM)`` and split counts
from the dynamic vector only under Split (``hopper/tile_scheduler.hpp`` 477-478, 501-505).

Each test writes the expected slots from those formulas, not from the model, and compares slot by slot.
"""

import dataclasses
import itertools

import pytest

from refmodel.fa3_builds import UPSTREAM, VLLM_FORK
from refmodel.fa3_scheduler import call_inputs, precompute_inputs, resolve_schedule
from refmodel.metadata_layout import (UNWRITTEN, DecodedMetadata, MetadataLayout, call_own_metadata,
                                      call_own_schedule, decode_metadata_values, decode_values_for_schedule,
                                      encode_metadata_values)
from refmodel.prepare import PrepareResult


def _round4(b):
    return (b + 3) // 4 * 4


def _fork_offsets(b, dynamic, swizzle, semaphore):
    """The fork's offsets as flash_api.cpp@617264c1 692-701 computes them."""
    b4 = _round4(b)
    vectors = 1 + int(dynamic) + int(swizzle)
    return {"seqlen_q": 0, "splits": b4 if dynamic else None, "l2": b4 * (vectors - 1) if swizzle else None,
            "semaphore": b4 * vectors, "size": int(semaphore) + b4 * vectors, "vectors": vectors}


def _upstream_offsets(b, sort, swizzle, semaphore):
    """Upstream's offsets as flash_api.cpp@0251105a computes them."""
    b4 = _round4(b)
    vectors = 2 + int(sort) + int(swizzle)
    return {"splits": 0, "m_blocks": b4, "batch_idx": 2 * b4 if sort else None,
            "l2": b4 * (3 if sort else 2) if swizzle else None, "semaphore": b4 * vectors,
            "size": int(semaphore) + b4 * vectors, "vectors": vectors}


@pytest.mark.parametrize("b, dynamic, swizzle, semaphore",
                         list(itertools.product((1, 4, 5, 9), (False, True), (False, True), (False, True))))
def test_the_fork_layout_is_the_forks_offsets(b, dynamic, swizzle, semaphore):
    want = _fork_offsets(b, dynamic, swizzle, semaphore)
    lay = MetadataLayout(batch_size=b, b4=_round4(b), sort=False, swizzle=swizzle, has_semaphore=semaphore,
                         fork=True, fork_dynamic_split=dynamic)
    got = {"seqlen_q": lay.seqlen_q_offset, "splits": lay.splits_offset, "l2": lay.nheads_in_l2_offset,
           "semaphore": lay.semaphore_offset, "size": lay.size, "vectors": lay.num_vectors}
    assert got == want
    assert lay.m_blocks_offset is None and lay.batch_idx_offset is None   # the fork stores no m-blocks, no order


@pytest.mark.parametrize("b, sort, swizzle, semaphore",
                         list(itertools.product((1, 4, 5, 9), (False, True), (False, True), (False, True))))
def test_the_upstream_layout_is_upstreams_offsets(b, sort, swizzle, semaphore):
    want = _upstream_offsets(b, sort, swizzle, semaphore)
    lay = MetadataLayout(batch_size=b, b4=_round4(b), sort=sort, swizzle=swizzle, has_semaphore=semaphore)
    got = {"splits": lay.splits_offset, "m_blocks": lay.m_blocks_offset, "batch_idx": lay.batch_idx_offset,
           "l2": lay.nheads_in_l2_offset, "semaphore": lay.semaphore_offset, "size": lay.size,
           "vectors": lay.num_vectors}
    assert got == want and lay.seqlen_q_offset is None


def test_the_layout_defaults_to_upstream_with_a_semaphore():
    lay = MetadataLayout(batch_size=5, b4=8, sort=True, swizzle=True)
    assert lay.has_semaphore is True and lay.fork is False and lay.fork_dynamic_split is False
    assert lay.size == 4 * 8 + 1


@pytest.mark.parametrize("cls, kwargs", [
    (MetadataLayout, dict(batch_size=1, b4=4, sort=True, swizzle=False)),
    (DecodedMetadata, dict(layout=None, num_splits=[1], num_m_blocks=[1], batch_idx=None, nheads_in_l2=None,
                           semaphore=0)),
])
def test_layouts_and_decoded_metadata_are_frozen(cls, kwargs):
    obj = cls(**kwargs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        obj.semaphore = 1 if cls is DecodedMetadata else None
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, "layout" if cls is DecodedMetadata else "b4", 8)


def _fork_schedule(b, causal, splits):
    """A fork precompute: varlen, paged; causal gives Swizzle; ``splits`` > 1 gives the dynamic vector."""
    return resolve_schedule(precompute_inputs(b, 1, 30000, 8, 1, 128, varlen_q=True, page_size=16, causal=causal,
                                              num_splits=splits, build=VLLM_FORK))


def _marked_result(b, with_l2, upstream_sort=False):
    """Per vector a distinct marker per batch, so a slice at a wrong offset or of a wrong length is seen."""
    return PrepareResult(num_splits=[100 + i for i in range(b)], num_m_blocks=[200 + i for i in range(b)],
                         batch_idx=list(reversed(range(b))) if upstream_sort else None,
                         nheads_in_l2=[300 + i for i in range(b)] if with_l2 else None, blocks_per_sm=1,
                         prepare_seqlen_q=[400 + i for i in range(b)])


@pytest.mark.parametrize("b, causal, splits", list(itertools.product((1, 3, 5, 8), (False, True), (1, 3))))
def test_the_fork_encoding_slot_by_slot_and_its_decoding(b, causal, splits):
    sched = _fork_schedule(b, causal, splits)
    dynamic = splits > 1
    assert sched.swizzle is causal and sched.sort is False and sched.needs_semaphore is True  # 686: arch >= 90
    off = _fork_offsets(b, dynamic, causal, True)
    res = _marked_result(b, with_l2=causal)
    values = encode_metadata_values(sched, res)
    b4 = _round4(b)
    want = [UNWRITTEN] * off["size"]
    want[0:b] = res.prepare_seqlen_q
    if dynamic:
        want[b4:b4 + b] = res.num_splits
    if causal:
        want[off["l2"]:off["l2"] + b] = res.nheads_in_l2
    want[off["semaphore"]] = 0
    assert values == want and len(values) == sched.metadata_size

    dec = decode_values_for_schedule(values, sched)
    kbm = sched.kernel_block_m
    assert dec.prepare_seqlen_q == want[0:b4]
    assert dec.num_m_blocks == [-(-v // kbm) for v in res.prepare_seqlen_q] + [UNWRITTEN] * (b4 - b)
    assert dec.num_splits == (want[b4:2 * b4] if dynamic else [1] * b4)   # tile_scheduler.hpp 501-505
    assert dec.nheads_in_l2 == (want[off["l2"]:off["l2"] + b4] if causal else None)
    assert dec.batch_idx is None and dec.semaphore == 0
    assert dec.layout == MetadataLayout(batch_size=b, b4=b4, sort=False, swizzle=causal, has_semaphore=True,
                                        fork=True, fork_dynamic_split=dynamic)


@pytest.mark.parametrize("b, causal, window", [(1, True, (-1, -1)), (5, True, (-1, -1)), (6, False, (-1, -1)),
                                              (3, False, (100, 0))])
def test_the_upstream_encoding_slot_by_slot_and_its_decoding(b, causal, window):
    sched = resolve_schedule(precompute_inputs(b, 1, 30000, 8, 1, 128, varlen_q=True, page_size=16, causal=causal,
                                               window_size=window))
    off = _upstream_offsets(b, sched.sort, sched.swizzle, True)
    res = _marked_result(b, with_l2=sched.swizzle, upstream_sort=sched.sort)
    values = encode_metadata_values(sched, res)
    want = [UNWRITTEN] * off["size"]
    want[0:b] = res.num_splits
    want[off["m_blocks"]:off["m_blocks"] + b] = res.num_m_blocks
    if sched.sort:
        want[off["batch_idx"]:off["batch_idx"] + b] = res.batch_idx
    if sched.swizzle:
        want[off["l2"]:off["l2"] + b] = res.nheads_in_l2
    want[off["semaphore"]] = 0
    assert values == want
    b4 = _round4(b)
    for dec in (decode_values_for_schedule(values, sched), decode_metadata_values(values, b, sched.sort, sched.swizzle)):
        assert dec.num_splits == want[0:b4] and dec.num_m_blocks == want[b4:2 * b4]
        assert dec.batch_idx == (want[2 * b4:3 * b4] if sched.sort else None)
        assert dec.nheads_in_l2 == (want[off["l2"]:off["l2"] + b4] if sched.swizzle else None)
        assert dec.semaphore == 0 and dec.prepare_seqlen_q is None
        assert dec.layout == MetadataLayout(batch_size=b, b4=b4, sort=sched.sort, swizzle=sched.swizzle)
        assert dec.to_dict() == {"num_splits": dec.num_splits, "num_m_blocks": dec.num_m_blocks,
                                 "batch_idx": dec.batch_idx, "nheads_in_l2": dec.nheads_in_l2, "semaphore": 0}


def test_without_the_semaphore_nothing_is_written_past_the_vectors_and_decoding_reads_none():
    sched = _fork_schedule(3, True, 3)
    no_sem = dataclasses.replace(sched, needs_semaphore=False)
    assert MetadataLayout.for_schedule(no_sem).has_semaphore is False
    values = encode_metadata_values(no_sem, _marked_result(3, with_l2=True))
    assert len(values) == 3 * 4 and 0 not in values      # no semaphore slot, no zero written
    assert decode_values_for_schedule(values, no_sem).semaphore is None
    up = resolve_schedule(precompute_inputs(3, 1, 30000, 8, 1, 128, varlen_q=True, page_size=16, causal=True))
    up_values = encode_metadata_values(up, _marked_result(3, with_l2=True, upstream_sort=True))
    assert decode_metadata_values(up_values[:-1], 3, True, True).semaphore is None
    assert decode_metadata_values(up_values, 3, True, True).semaphore == 0


def test_the_semaphore_is_zeroed_and_not_the_slot_before_it():
    sched = _fork_schedule(4, False, 1)        # one vector (prepare_seqlen_q), then the semaphore at 4
    values = encode_metadata_values(sched, _marked_result(4, with_l2=False))
    assert values == [400, 401, 402, 403, 0]


@pytest.mark.parametrize("field", ["num_splits", "num_m_blocks", "nheads_in_l2", "batch_idx"])
def test_a_vector_of_the_wrong_length_is_refused_upstream(field):
    sched = resolve_schedule(precompute_inputs(5, 1, 30000, 8, 1, 128, varlen_q=True, page_size=16, causal=True))
    assert sched.sort and sched.swizzle
    res = _marked_result(5, with_l2=True, upstream_sort=True)
    for n in (4, 6):
        bad = dataclasses.replace(res, **{field: list(range(n))})
        with pytest.raises(ValueError) as info:
            encode_metadata_values(sched, bad)
        assert str(info.value) == f"result: a vector of {n} entries for a batch of 5"


def test_a_fork_seqlen_vector_of_the_wrong_length_is_refused():
    sched = _fork_schedule(5, True, 3)
    bad = dataclasses.replace(_marked_result(5, with_l2=True), prepare_seqlen_q=[1, 2, 3, 4])
    with pytest.raises(ValueError, match="result: a vector of 4 entries for a batch of 5"):
        encode_metadata_values(sched, bad)


def test_decoding_checks_the_length_against_the_vectors_not_the_semaphore():
    # upstream b 5 (b4 8), Sort and Swizzle: 4 vectors = 32 values needed, the semaphore optional
    good = list(range(33))
    assert decode_metadata_values(good[:32], 5, True, True).semaphore is None
    with pytest.raises(ValueError) as info:
        decode_metadata_values(good[:31], 5, True, True)
    assert str(info.value) == ("metadata: expected at least 32 int32 values for batch_size=5, sort=True, "
                               "swizzle=True; got 31")
    sched = _fork_schedule(5, True, 3)       # fork: 3 vectors of 8 = 24
    values = encode_metadata_values(sched, _marked_result(5, with_l2=True))
    assert decode_values_for_schedule(values[:24], sched).semaphore is None
    with pytest.raises(ValueError) as info:
        decode_values_for_schedule(values[:23], sched)
    assert str(info.value) == ("metadata: expected at least 24 int32 values for the fork's layout (batch_size=5); "
                               "got 23")


def test_decoding_converts_every_value_to_int():
    sched = _fork_schedule(1, False, 1)
    dec = decode_values_for_schedule([7.0, 0.0, 0.0, 0.0, 0.0], sched)
    assert dec.prepare_seqlen_q == [7, 0, 0, 0] and all(type(v) is int for v in dec.prepare_seqlen_q)
    assert type(dec.semaphore) is int
    dec = decode_metadata_values([1.0] * 13, 1, False, True)
    assert all(type(v) is int for v in dec.num_splits + dec.num_m_blocks + dec.nheads_in_l2)


def test_the_layout_of_an_upstream_schedule_never_takes_the_forks_fields():
    sched = resolve_schedule(precompute_inputs(3, 1, 30000, 8, 1, 128, varlen_q=True, page_size=16, causal=True,
                                               num_splits=3))
    assert MetadataLayout.for_schedule(sched) == MetadataLayout(batch_size=3, b4=4, sort=True, swizzle=True,
                                                                has_semaphore=True, fork=False,
                                                                fork_dynamic_split=False)


def test_the_forks_dynamic_vector_needs_the_prepare_step_and_a_split():
    # flash_api.cpp@617264c1 677/1068: use_dynamic_split = use_prepare_varlen && b <= 992 && num_splits > 1
    assert MetadataLayout.for_schedule(_fork_schedule(3, True, 3)).fork_dynamic_split is True
    assert MetadataLayout.for_schedule(_fork_schedule(3, True, 1)).fork_dynamic_split is False
    plain = resolve_schedule(call_inputs(3, 1, 30000, 8, 1, 128, causal=True, num_splits=3,
                                         has_cache_seqlens=False, build=VLLM_FORK))
    assert plain.inputs.uses_prepare is False and MetadataLayout.for_schedule(plain).fork_dynamic_split is False


def test_call_own_schedule_takes_the_kernels_tiles_and_pack_and_refuses_a_precompute():
    # d 64, dv 128: the host tiles from (64, 128), the kernel runs the (64, 256) instance (flash_api.cpp
    # run_mha_fwd); pack_gqa=False passed, paged non-TMA: the kernel forces PackGQA (flash_api.cpp 377)
    call = resolve_schedule(call_inputs(4, 1, 8192, 32, 4, 64, headdim_v=128, has_cache_seqlens=True,
                                        pack_gqa=False, page_size=16))
    assert (call.block_m, call.block_n, call.pack_gqa) == (192, 128, False)
    own = call_own_schedule(call)
    assert (own.block_m, own.block_n, own.pack_gqa) == (128, 96, True) == (call.kernel_block_m, call.kernel_block_n,
                                                                           call.kernel_pack_gqa)
    assert dataclasses.replace(own, block_m=call.block_m, block_n=call.block_n, pack_gqa=call.pack_gqa) == call
    pre = resolve_schedule(precompute_inputs(4, 1, 8192, 32, 4, 128))
    with pytest.raises(ValueError) as info:
        call_own_schedule(pre)
    assert str(info.value) == "call_schedule: must be a call's schedule (inputs.precompute False), got a precompute's"


def test_call_own_metadata_passes_every_length_and_refuses_a_call_without_the_prepare_step():
    call = resolve_schedule(call_inputs(2, 300, 30000, 32, 4, 128, varlen_q=True, has_cache_seqlens=True))
    lengths = dict(seqlens_q=[300, 1], leftpad_k=[0, 9000], seqlens_new=[0, 20000])
    own, res = call_own_metadata(call, [10000, 10000], **lengths)
    from refmodel.prepare import prepare_scheduler
    assert own == call_own_schedule(call)
    assert res == prepare_scheduler(own, [10000, 10000], **lengths)
    for dropped in lengths:      # each length reaches the prepare step: without it the result differs
        rest = {k: v for k, v in lengths.items() if k != dropped}
        assert res != prepare_scheduler(own, [10000, 10000], **rest), dropped
    plain = resolve_schedule(call_inputs(2, 3, 8192, 32, 4, 128, has_cache_seqlens=False))
    with pytest.raises(ValueError) as info:
        call_own_metadata(plain, [10000, 10000])
    assert str(info.value) == ("call_schedule: the call is not varlen (no cache_seqlens/cu_seqlens_q/leftpad), so "
                               "FA3 runs no prepare step and reads no per-batch metadata")
