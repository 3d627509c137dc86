"""spec.invariants on concrete precompute/call pairs: the worked example, fresh metadata, stale batches, shapes,
the freshness corner, and a defective split-range formula (docs/facts-fa3.md sections 1-2)."""

import pytest
import torch

from refmodel import call_inputs, precompute_inputs, resolve_schedule, schedule_and_prepare
from refmodel.fa3_scheduler import CALL_MAX_SPLITS, combine_capacity
from spec.invariants import (
    INVARIANTS,
    SAFE,
    CallLengths,
    check_all,
    check_combine_capacity,
    check_kv_cover,
    evaluate,
    invariant_table_markdown,
    metadata_for,
)

WORKED = [32768] + [100] * 7


def _decode_pair(pre_heads, call_heads, seqlens, call_seqlen_k=None, d=128, num_splits=0, sm=132):
    b = len(seqlens)
    P, R = schedule_and_prepare(b, 1, max(seqlens), *pre_heads, d, torch.tensor(seqlens, dtype=torch.int32),
                                page_size=1, causal=True, cu_seqlens_q=list(range(b + 1)), num_splits=num_splits,
                                num_sm=sm)
    C = resolve_schedule(call_inputs(b, 1, call_seqlen_k or max(seqlens), *call_heads, d, page_size=1, causal=True,
                                     varlen_q=True, num_splits=num_splits, num_sm=sm))
    return P, R, C


def test_worked_example_violates_split_bound_and_combine_capacity():
    P, R, C = _decode_pair((8, 1), (32, 4), WORKED)
    assert (P.num_splits, C.num_splits, R.num_splits[0]) == (109, 29, 86)
    ev = evaluate(P, R, C, {"seqlens_q": [1] * 8, "seqused_k": WORKED})  # gpu_impl's call_lengths format
    assert ev.outcome == "violation" and not ev.safe
    names = {v.invariant for v in ev.violations}
    assert names == {"SPLIT_BOUND", "COMBINE_CAPACITY"}
    sb = next(v for v in ev.violations if v.invariant == "SPLIT_BOUND")
    assert sb.batch == 0 and sb.detail["metadata_splits"] == 86 and sb.detail["call_splits"] == 29
    assert "29..85" in sb.message


def test_fresh_metadata_is_safe_and_stale_lengths_are_benign():
    P, R, C = _decode_pair((32, 4), (32, 4), WORKED)
    assert check_all(P, R, C, WORKED) == []
    # the call's cache lengths changed (tokens appended), same b and static shapes: still SAFE
    assert SAFE(P, R, C, CallLengths(tuple(x + 7 for x in WORKED)))


def test_more_call_batches_than_metadata_reads_unwritten_slots():
    P, R = metadata_for(precompute_inputs(3, 1, 4096, 32, 4, 128, varlen_q=True, page_size=1, causal=True),
                        [4096, 10, 10], seqlens_q=[1, 1, 1])
    C = resolve_schedule(call_inputs(4, 1, 4096, 32, 4, 128, varlen_q=True, page_size=1, causal=True))
    ev = evaluate(P, R, C, [4096, 10, 10, 10])
    assert ev.outcome == "violation"
    assert any(v.invariant == "BATCH_PERMUTATION" and v.detail.get("virtual_batch") == 3 for v in ev.violations)


def test_fewer_call_batches_breaks_the_permutation():
    # the precompute sorts the long sequence (batch 1) first; a call with b=1 reads batch_idx[0] = 1
    P, R = metadata_for(precompute_inputs(2, 1, 8192, 32, 4, 128, varlen_q=True, page_size=1, causal=True),
                        [10, 8192], seqlens_q=[1, 1])
    assert R.batch_idx[0] == 1
    C = resolve_schedule(call_inputs(1, 1, 8192, 32, 4, 128, varlen_q=True, page_size=1, causal=True))
    ev = evaluate(P, R, C, [10])
    assert ev.outcome == "violation"
    perm = [v for v in ev.violations if v.invariant == "BATCH_PERMUTATION"]
    assert perm and perm[0].detail["outside"] == [1]


def test_shape_mismatch_is_a_loud_safe_error_not_a_violation():
    # d=64 decode drops causal (no Swizzle vector) at the precompute; the same call with 2 query rows keeps it
    P, R = metadata_for(precompute_inputs(4, 1, 4096, 8, 1, 64, varlen_q=True, page_size=1, causal=True),
                        [4096] * 4, seqlens_q=[1] * 4)
    C = resolve_schedule(call_inputs(4, 2, 4096, 8, 1, 64, varlen_q=True, page_size=1, causal=True))
    assert P.metadata_size != C.metadata_size
    ev = evaluate(P, R, C, {"seqused_k": [4096] * 4, "seqlens_q": [2] * 4})
    assert ev.outcome == "shape_error" and ev.safe and ev.violations == []
    assert ev.shape[0].invariant == "SHAPE" and check_all(P, R, C, [4096] * 4) == []


def test_freshness_corner_query_cover():
    # d=64, dv=128: the host schedules 192-row tiles, the kernel (the <64, 256> instance) runs 128-row tiles
    inp = precompute_inputs(1, 150, 1000, 8, 8, 64, headdim_v=128, varlen_q=True, num_splits=1)
    P, R = metadata_for(inp, [1000], seqlens_q=[150])
    C = resolve_schedule(call_inputs(1, 150, 1000, 8, 8, 64, headdim_v=128, varlen_q=True, num_splits=1))
    assert (P.block_m, C.kernel_block_m) == (192, 128)
    ev = evaluate(P, R, C, {"seqused_k": [1000], "seqlens_q": [150]})
    assert [v.invariant for v in ev.violations] == ["QUERY_COVER"]
    assert ev.violations[0].detail["uncovered_rows"] == [128, 149]


def test_kv_cover_holds_and_catches_an_off_by_one_range():
    P, R, C = _decode_pair((32, 4), (32, 4), [1000, 70000, 5])
    assert check_kv_cover(P, R, C, [1000, 70000, 5]) == []

    def floor_range(n_min, n_max, s, i):  # seeded defect: per-split size rounded down
        per = 0 if n_max <= n_min else (n_max - n_min) // s
        lo = n_min + i * per
        return lo, min(lo + per, n_max)

    bad = check_kv_cover(P, R, C, [1000, 70000, 5], range_fn=floor_range)
    assert bad and bad[0].invariant == "KV_COVER" and bad[0].detail["uncovered_blocks"]


def test_combine_capacity_bound_is_inclusive_and_implied_by_split_bound():
    # kMax(S_c, dv) >= S_c for every S_c: SPLIT_BOUND implies COMBINE_CAPACITY; a count of exactly kMax is read fully
    for s in range(1, CALL_MAX_SPLITS + 1):
        for dv in (64, 128, 256, 512):
            assert combine_capacity(s, dv) >= s
    P, R, C = _decode_pair((8, 1), (32, 4), WORKED)
    assert check_combine_capacity(P, R, C, WORKED)[0].detail["k_max"] == 32


def test_registry_is_documented():
    assert set(INVARIANTS) == {"SHAPE", "SPLIT_BOUND", "COMBINE_CAPACITY", "BATCH_PERMUTATION", "QUERY_COVER",
                               "KV_COVER"}
    for info in INVARIANTS.values():
        assert info.statement.endswith(".") and "hopper/" in info.fa3_source
        assert info.function.__doc__ and info.name in info.function.__doc__
    assert "| `SPLIT_BOUND` |" in invariant_table_markdown()


def test_call_lengths_errors_name_the_field():
    P, R, C = _decode_pair((32, 4), (32, 4), [10, 20])
    with pytest.raises(ValueError, match="seqused_k"):
        check_all(P, R, C, [10])
    with pytest.raises(ValueError, match="seqlens_q"):
        check_all(P, R, C, {"seqused_k": [10, 20], "seqlens_q": [1]})
