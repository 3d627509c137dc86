"""Pins of spec.invariants: each verdict's details and sentence on hand-worked pairs, the call-lengths
forms, and the outcome mapping (evaluate / evaluate_inputs).

The worked example is docs/facts-fa3.md section 1 (sglang PR #30439): the precompute sees 8 q heads on 1 KV head
(109 splits, batch 0 gets min(ceil(256/3), 109) = 86), the call 32 on 4 (29 splits, kMax(29, 128) = 32);
FA3 sources: hopper/flash_api.cpp (out_accum sized by the call's num_splits, CHECK_SHAPE of the metadata),
hopper/flash_fwd_combine_launch_template.h (kMax), hopper/tile_scheduler.hpp (the slots the call reads).
"""

import pytest
import torch

from refmodel import call_inputs, precompute_inputs, resolve_schedule, schedule_and_prepare
from refmodel.metadata import UNWRITTEN
from spec.invariants import (
    INVARIANTS,
    SILENT_INVARIANTS,
    CallLengths,
    Evaluation,
    Violation,
    check_batch_permutation,
    check_query_cover,
    check_shape,
    check_split_bound,
    evaluate,
    evaluate_inputs,
    metadata_for,
    read_metadata,
)

WORKED = [32768] + [100] * 7


def worked_pair():
    P, R = schedule_and_prepare(8, 1, 32768, 8, 1, 128, torch.tensor(WORKED, dtype=torch.int32), page_size=1,
                                causal=True, cu_seqlens_q=list(range(9)))
    C = resolve_schedule(call_inputs(8, 1, 32768, 32, 4, 128, page_size=1, causal=True, varlen_q=True))
    return P, R, C


def test_worked_example_verdicts_in_full():
    P, R, C = worked_pair()
    ev = evaluate(P, R, C, WORKED)
    assert ev.outcome == "violation" and ev.shape == [] and ev.safe is False
    sb, cc = ev.violations
    assert sb.to_dict() == {
        "invariant": "SPLIT_BOUND", "batch": 0,
        "detail": {"virtual_batch": 0, "metadata_splits": 86, "call_splits": 29, "out_of_bounds_splits": [29, 85]},
        "message": "batch 0 (virtual 0) has 86 splits in the metadata but the call's partial buffers hold S_c=29: "
                   "splits 29..85 are written and read out of bounds"}
    assert cc.to_dict() == {
        "invariant": "COMBINE_CAPACITY", "batch": 0,
        "detail": {"virtual_batch": 0, "metadata_splits": 86, "k_max": 32, "call_splits": 29},
        "message": "batch 0 has 86 splits but the combine reads at most kMax=32 (S_c=29, dv=128): splits 32..85 "
                   "are ignored"}
    assert sb.indices == sb.detail
    assert check_split_bound(P, R, C, WORKED) == [sb]


def test_a_split_count_equal_to_the_calls_is_in_bounds():
    # SPLIT_BOUND is s > S_c: force the precompute's batch 0 to exactly S_c = 29 splits
    P, R, C = worked_pair()
    from dataclasses import replace
    R29 = replace(R, num_splits=[29] + R.num_splits[1:])
    assert check_split_bound(P, R29, C, WORKED) == []
    R30 = replace(R, num_splits=[30] + R.num_splits[1:])
    assert [v.detail["out_of_bounds_splits"] for v in check_split_bound(P, R30, C, WORKED)] == [[29, 29]]
    # COMBINE_CAPACITY is s > kMax = 32: 32 is read in full, 33 is not (flash_fwd_combine_kernel.h si < kMax)
    R32 = replace(R, num_splits=[32] + R.num_splits[1:])
    assert [v.invariant for v in evaluate(P, R32, C, WORKED).violations] == ["SPLIT_BOUND"]
    R33 = replace(R, num_splits=[33] + R.num_splits[1:])
    assert [v.invariant for v in evaluate(P, R33, C, WORKED).violations] == ["SPLIT_BOUND", "COMBINE_CAPACITY"]


def test_one_split_calls_ignore_the_metadatas_split_counts():
    # a call with S_c == 1 runs no split kernel: md's counts are not read (SPLIT_BOUND, COMBINE_CAPACITY quiet)
    P, R, _ = worked_pair()
    C1 = resolve_schedule(call_inputs(8, 1, 32768, 32, 4, 128, page_size=1, causal=True, varlen_q=True,
                                      num_splits=1))
    P1, R1 = schedule_and_prepare(8, 1, 32768, 8, 1, 128, torch.tensor(WORKED, dtype=torch.int32), page_size=1,
                                  causal=True, cu_seqlens_q=list(range(9)), num_splits=1)
    assert evaluate(P1, R1, C1, WORKED).outcome == "pass"


def test_more_call_batches_name_every_unwritten_slot():
    # precompute b = 3 (b4 = 4), call b = 4: virtual batch 3 reads slot 3 of every vector, never written
    P, R = metadata_for(precompute_inputs(3, 1, 4096, 32, 4, 128, varlen_q=True, page_size=1, causal=True),
                        [4096, 10, 10], seqlens_q=[1, 1, 1])
    C = resolve_schedule(call_inputs(4, 1, 4096, 32, 4, 128, varlen_q=True, page_size=1, causal=True))
    assert C.num_splits > 1 and C.sort and C.swizzle
    perm = check_batch_permutation(P, R, C, [4096, 10, 10, 10])
    slots = [(v.detail["virtual_batch"], v.detail["vector"]) for v in perm if "vector" in v.detail]
    assert slots == [(3, "num_splits"), (3, "num_m_blocks"), (3, "batch_idx"), (3, "nheads_in_l2")]
    assert perm[0].batch is None
    assert perm[0].message == ("the call reads num_splits[3], a slot the precompute never wrote "
                               "(precompute b=3, call b=4)")
    order = perm[-1]
    assert order.detail == {"batch_idx": [0, 1, 2, UNWRITTEN], "outside": [], "missing": [3], "duplicated": []}
    assert order.batch == 3
    assert order.message == ("varlen_batch_idx[0:4] = [0, 1, 2, -2147483648] is not a permutation of 0..3: "
                             "batches [3] are never computed, indices [] read past the call's batch")


def test_a_duplicated_batch_index_breaks_the_permutation():
    P, R = metadata_for(precompute_inputs(3, 1, 4096, 32, 4, 128, varlen_q=True, page_size=1, causal=True),
                        [4096, 10, 10], seqlens_q=[1, 1, 1])
    from dataclasses import replace
    Rdup = replace(R, batch_idx=[0, 1, 1])
    C = resolve_schedule(call_inputs(3, 1, 4096, 32, 4, 128, varlen_q=True, page_size=1, causal=True))
    perm = check_batch_permutation(P, Rdup, C, [4096, 10, 10])
    assert [v.detail for v in perm] == [{"batch_idx": [0, 1, 1], "outside": [], "missing": [2], "duplicated": [1]}]
    assert check_batch_permutation(P, R, C, [4096, 10, 10]) == []


def test_query_cover_uses_the_kernels_tile_and_packed_rows():
    # d 64, dv 128: host tile 192 rows, kernel tile 128 (the <64, 256> instance); 150 rows need 2 kernel tiles
    inp = precompute_inputs(1, 150, 1000, 8, 8, 64, headdim_v=128, varlen_q=True, num_splits=1)
    P, R = metadata_for(inp, [1000], seqlens_q=[150])
    C = resolve_schedule(call_inputs(1, 150, 1000, 8, 8, 64, headdim_v=128, varlen_q=True, num_splits=1))
    (v,) = check_query_cover(P, R, C, {"seqused_k": [1000], "seqlens_q": [150]})
    assert v.batch == 0 and v.detail == {"virtual_batch": 0, "metadata_m_blocks": 1, "kernel_block_m": 128,
                                         "rows": 150, "uncovered_rows": [128, 149]}
    assert v.message == ("batch 0: md gives 1 m-blocks of 128 rows but the call has 150 (packed) query rows: "
                         "rows 128..149 are never computed")
    # 128 rows fit exactly in one kernel tile
    assert check_query_cover(P, R, C, {"seqused_k": [1000], "seqlens_q": [128]}) == []


def test_query_cover_counts_packed_rows_with_the_kernels_packgqa():
    # GQA 32/8 with splits: the kernel packs (forced for Split), rows = Lq * 4
    P, R = metadata_for(precompute_inputs(1, 1, 8192, 32, 8, 128, varlen_q=True), [8192], seqlens_q=[1])
    C = resolve_schedule(call_inputs(1, 40, 8192, 32, 8, 128, varlen_q=True))
    assert C.kernel_pack_gqa and C.kernel_block_m == 128 and C.num_splits > 1
    # md says 1 m-block (1 row * 4 = 4 rows); the call has 33 rows * 4 = 132 > 128
    (v,) = check_query_cover(P, R, C, {"seqused_k": [8192], "seqlens_q": [33]})
    assert v.detail["rows"] == 132 and v.detail["uncovered_rows"] == [128, 131]
    assert check_query_cover(P, R, C, {"seqused_k": [8192], "seqlens_q": [32]}) == []


def test_a_zero_split_count_leaves_the_batch_without_tiles():
    # tile_scheduler.hpp: a batch gets m_blocks * num_splits tiles; 0 splits -> 0 tiles -> rows uncovered
    P, R = metadata_for(precompute_inputs(1, 1, 8192, 32, 8, 128, varlen_q=True), [8192], seqlens_q=[1])
    C = resolve_schedule(call_inputs(1, 1, 8192, 32, 8, 128, varlen_q=True))
    from dataclasses import replace
    (v,) = check_query_cover(P, replace(R, num_splits=[0]), C, [8192])
    assert v.detail["metadata_m_blocks"] == 0 and v.detail["uncovered_rows"] == [0, 3]
    assert v.message.endswith("(packed) query rows: rows 0..3 are never computed")


def test_call_lengths_forms():
    assert CallLengths.coerce([5, 6], 2, 3) == CallLengths((5, 6), (3, 3))
    assert CallLengths.coerce({"cache_seqlens": torch.tensor([5, 6])}, 2, 1) == CallLengths((5, 6), (1, 1))
    assert CallLengths.coerce({"seqused_k": [5, 6], "seqlens_q": [2, 9]}, 2, 1) == CallLengths((5, 6), (2, 9))
    given = CallLengths((5,), (4,))
    assert CallLengths.coerce(given, 1, 1) is given
    with pytest.raises(ValueError, match="^call_lengths: mapping needs 'seqused_k' \\(or 'cache_seqlens'\\)$"):
        CallLengths.coerce({"seqlens_q": [1]}, 1, 1)
    with pytest.raises(ValueError, match=r"call_lengths.seqused_k: expected 2 entries \(the call's batch\), got 1"):
        CallLengths.coerce([5], 2, 1)
    with pytest.raises(ValueError, match=r"call_lengths.seqlens_q: expected 2 entries, got 1"):
        CallLengths.coerce({"seqused_k": [5, 6], "seqlens_q": [1]}, 2, 1)


def test_shape_check_and_a_call_that_reads_no_metadata():
    # a non-varlen call with 1 split and no causal reads no metadata (metadata_size 0): nothing to check
    P, R = metadata_for(precompute_inputs(2, 1, 4096, 8, 8, 128), [4096, 4096])
    C0 = resolve_schedule(call_inputs(2, 1, 4096, 8, 8, 128, has_cache_seqlens=False, num_splits=1))
    assert C0.metadata_size == 0
    assert check_shape(P, R, C0) == [] and evaluate(P, R, C0, [4096, 4096]) == Evaluation("pass", [], [])
    # a varlen call of 5 batches against metadata for 2: b4 4 vs 8, 3 vectors (Sort, no Swizzle) + semaphore
    C = resolve_schedule(call_inputs(5, 1, 4096, 8, 8, 128))
    (v,) = check_shape(P, R, C)
    assert v.invariant == "SHAPE" and v.batch is None
    assert v.detail == {"produced": P.metadata_size, "expected": C.metadata_size}
    assert (P.metadata_size, C.metadata_size) == (13, 25)          # 3 * 4 + 1 and 3 * 8 + 1
    assert v.message == ("metadata has 13 int32 values but the call expects 25 (nvec*b4 + semaphore): FA3 raises, "
                         "a loud and safe error")
    ev = evaluate(P, R, C, [1] * 5)
    assert ev.outcome == "shape_error" and ev.shape == [v] and ev.safe
    # reading a too-short tensor with the call's layout pads with UNWRITTEN instead of raising: the call's
    # batch_idx vector (offset 2 * 8 = 16) lies wholly past the 13 values produced
    md = read_metadata(P, R, C)
    assert md.batch_idx == [UNWRITTEN] * 8 and md.num_splits[:2] == R.num_splits
    assert md.semaphore is None                                       # padded to the vectors only


def test_evaluate_inputs_maps_rejections_and_aborts():
    ok = precompute_inputs(2, 1, 4096, 8, 8, 128)
    call = call_inputs(2, 1, 4096, 8, 8, 128)
    assert evaluate_inputs(ok, call, [4096, 4096], [4096, 4096]).outcome == "pass"
    bad_call = call_inputs(2, 1, 4096, 8, 8, 128, num_splits=300)       # mha_fwd: num_splits > 256
    ev = evaluate_inputs(ok, bad_call, [4096, 4096], [4096, 4096])
    assert ev.outcome == "rejected" and ev.safe and ev.message
    empty = precompute_inputs(0, 1, 4096, 8, 8, 128)
    ev = evaluate_inputs(empty, call, [], [4096, 4096])
    assert ev.outcome == "process_abort" and ev.safe is False and "exit(1)" in ev.message
    # seqlens_q reach the precompute's prepare step: 300 query rows -> 3 m-blocks of 128
    ev = evaluate_inputs(precompute_inputs(1, 300, 4096, 8, 8, 128, varlen_q=True), call_inputs(1, 300, 4096, 8, 8, 128,
                         varlen_q=True), [4096], {"seqused_k": [4096], "seqlens_q": [300]}, seqlens_q=[300])
    assert ev.outcome == "pass"
    ev = evaluate_inputs(precompute_inputs(1, 300, 4096, 8, 8, 128, varlen_q=True), call_inputs(1, 300, 4096, 8, 8, 128,
                         varlen_q=True), [4096], {"seqused_k": [4096], "seqlens_q": [300]}, seqlens_q=[100])
    assert [v.invariant for v in ev.violations] == ["QUERY_COVER"]


def test_registry_flags():
    assert SILENT_INVARIANTS == ("SPLIT_BOUND", "COMBINE_CAPACITY", "BATCH_PERMUTATION", "QUERY_COVER", "KV_COVER")
    assert INVARIANTS["SHAPE"].silent is False
    assert Violation("X", 1).to_dict() == {"invariant": "X", "batch": 1, "detail": {}, "message": ""}


def floor_range(n_min, n_max, s, i):
    """Seeded defect: each split's share rounded down instead of up (block.h 52 uses ceil_div)."""
    per = 0 if n_max <= n_min else (n_max - n_min) // s
    lo = n_min + i * per
    return lo, min(lo + per, n_max)


def fresh_pair(lengths):
    b = len(lengths)
    P, R = schedule_and_prepare(b, 1, max(lengths), 32, 4, 128, torch.tensor(lengths, dtype=torch.int32),
                                page_size=1, causal=True, cu_seqlens_q=list(range(b + 1)))
    C = resolve_schedule(call_inputs(b, 1, max(lengths), 32, 4, 128, page_size=1, causal=True, varlen_q=True))
    return P, R, C


def test_the_range_formula_reaches_every_entry_point():
    from spec.invariants import SAFE, check_all, check_kv_cover
    lengths = [1000, 70000, 5]
    P, R, C = fresh_pair(lengths)
    assert SAFE(P, R, C, lengths) is True
    assert SAFE(P, R, C, lengths, range_fn=floor_range) is False
    assert check_all(P, R, C, lengths, range_fn=floor_range)[0].invariant == "KV_COVER"
    assert check_kv_cover(P, R, C, lengths, range_fn=floor_range)
    pre = precompute_inputs(3, 1, 70000, 32, 4, 128, page_size=1, causal=True, varlen_q=True)
    call = call_inputs(3, 1, 70000, 32, 4, 128, page_size=1, causal=True, varlen_q=True)
    assert evaluate_inputs(pre, call, lengths, lengths).outcome == "pass"
    ev = evaluate_inputs(pre, call, lengths, lengths, range_fn=floor_range)
    assert ev.outcome == "violation" and {v.invariant for v in ev.violations} == {"KV_COVER"}


def test_refusals_and_aborts_carry_no_violations():
    ok = precompute_inputs(2, 1, 4096, 8, 8, 128)
    ev = evaluate_inputs(ok, call_inputs(2, 1, 4096, 8, 8, 128, num_splits=300), [4096] * 2, [4096] * 2)
    assert (ev.outcome, ev.violations, ev.shape) == ("rejected", [], [])
    ev = evaluate_inputs(precompute_inputs(0, 1, 4096, 8, 8, 128), call_inputs(2, 1, 4096, 8, 8, 128), [],
                         [4096] * 2)
    assert (ev.outcome, ev.violations, ev.shape) == ("process_abort", [], [])


def test_metadata_for_passes_the_query_lengths():
    # 300 query rows of a varlen precompute: ceil(300 / 128) = 3 m-blocks (the static 1 would give 1)
    inp = precompute_inputs(1, 1, 4096, 8, 8, 128, varlen_q=True)
    assert metadata_for(inp, [4096], seqlens_q=[300])[1].num_m_blocks == [3]
    assert metadata_for(inp, [4096])[1].num_m_blocks == [1]


def test_the_invariant_table_markdown():
    from spec.invariants import invariant_table_markdown
    lines = invariant_table_markdown().split("\n")
    assert lines[:2] == ["| invariant | statement | FA3 source |", "|---|---|---|"]
    assert len(lines) == 2 + len(INVARIANTS)
    assert lines[2] == f"| `SHAPE` | {INVARIANTS['SHAPE'].statement} | {INVARIANTS['SHAPE'].fa3_source} |"


def drop_last(n_min, n_max, s, i):
    """Seeded defect: each split stops one block short."""
    from refmodel.splitkv import split_block_range
    lo, hi = split_block_range(n_min, n_max, s, i)
    return lo, max(lo, hi - 1)


def kv_case(splits, causal=True, window=(-1, -1), call_splits=4, seqlen=600):
    """One batch of `seqlen` query rows over as many keys, GQA 32/8, d 128 (kernel tile 128 x 128 when causal or
    local), the metadata's split count pinned to `splits`."""
    from dataclasses import replace
    pre = precompute_inputs(1, seqlen, seqlen, 32, 8, 128, varlen_q=True, causal=causal, window_size=window,
                            num_splits=4)
    P, R = metadata_for(pre, [seqlen], seqlens_q=[seqlen])
    C = resolve_schedule(call_inputs(1, seqlen, seqlen, 32, 8, 128, varlen_q=True, causal=causal, window_size=window,
                                     num_splits=call_splits))
    return P, replace(R, num_splits=list(splits)), C, {"seqused_k": [seqlen], "seqlens_q": [seqlen]}


def test_kv_cover_walks_the_packed_m_blocks_of_a_causal_call():
    from spec.invariants import check_kv_cover
    P, R, C, lengths = kv_case([4])
    assert C.kernel_pack_gqa and (C.kernel_block_m, C.kernel_block_n) == (128, 128)
    # 600 rows * qhpk 4 = 2400 packed rows: 19 m-blocks. block.h 25-33 with PackGQA: m-block k reaches sequence
    # row (128 (k + 1) - 1) / 4 + 1 = 32 (k + 1), so n_max = ceil(32 (k + 1) / 128): 1 for k 0-3, 2 for 4-7, ...,
    # 5 for 16-18. floor_range with 4 splits covers 4 * floor(n / 4) blocks: n 1, 2, 3 lose all, n 5 loses block 4.
    got = [(v.detail["m_block"], v.detail["n_block_range"], v.detail["uncovered_blocks"])
           for v in check_kv_cover(P, R, C, lengths, range_fn=floor_range)]
    assert got == [(0, [0, 1], [0]), (4, [0, 2], [0, 1]), (8, [0, 3], [0, 1, 2]), (16, [0, 5], [4])]
    v = check_kv_cover(P, R, C, lengths, range_fn=floor_range)[0]
    assert v.batch == 0 and v.detail["splits"] == 4 and v.detail["virtual_batch"] == 0
    assert v.message == "batch 0, m-block 0: 4 splits leave KV blocks [0] of [0, 1) uncovered"
    assert check_kv_cover(P, R, C, lengths) == []


def test_kv_cover_of_a_local_window_raises_n_min():
    from spec.invariants import check_kv_cover
    # window (100, 0): local (tile 128 x 128). m-block k: right edge 32 (k + 1) -> ceil(32 (k + 1) / 128);
    # left edge 128 k / 4 - 100 = 32 k - 100 -> max(0, (32 k - 100) / 128) (block.h 36-44)
    P, R, C, lengths = kv_case([4], causal=False, window=(100, 0))
    assert C.masking.is_local
    got = [(v.detail["m_block"], v.detail["n_block_range"], v.detail["uncovered_blocks"])
           for v in check_kv_cover(P, R, C, lengths, range_fn=drop_last)]
    # k 0: [0, 1); k 4: 128 - 100 = 28 -> 0, ceil(160 / 128) = 2; k 8: 156 / 128 = 1, ceil(288 / 128) = 3;
    # k 12: 284 -> 2, 4; k 16: 412 -> 3, 5 (other m-blocks repeat a range). drop_last: 4 one-block splits, each
    # empty after dropping its last block
    assert got == [(0, [0, 1], [0]), (4, [0, 2], [0, 1]), (8, [1, 3], [1, 2]), (12, [2, 4], [2, 3]),
                   (16, [3, 5], [3, 4])]


def test_kv_cover_with_one_split_ignores_the_metadatas_count():
    from spec.invariants import check_kv_cover
    # S_c == 1: the call runs no Split kernel, each m-block is one range (block.h 47: Split is false)
    P, R, C1, lengths = kv_case([4], call_splits=1)
    assert C1.num_splits == 1
    assert check_kv_cover(P, R, C1, lengths, range_fn=floor_range) == []
    # a range formula defective even for one split is caught there too
    assert check_kv_cover(P, R, C1, lengths, range_fn=drop_last)
    # a split count of 0 gives the batch no tiles: QUERY_COVER reports it, KV_COVER has nothing to cover
    P, R0, C, lengths = kv_case([0])
    assert check_kv_cover(P, R0, C, lengths, range_fn=floor_range) == []


def test_kv_cover_goes_on_past_a_skipped_batch():
    from dataclasses import replace
    from spec.invariants import check_kv_cover
    pre = precompute_inputs(2, 600, 600, 32, 8, 128, varlen_q=True, causal=True, num_splits=4)
    P, R = metadata_for(pre, [600, 600], seqlens_q=[600, 600])
    C = resolve_schedule(call_inputs(2, 600, 600, 32, 8, 128, varlen_q=True, causal=True, num_splits=4))
    lengths = {"seqused_k": [600, 600], "seqlens_q": [600, 600]}
    # virtual batch 0 has 0 splits (skipped), virtual batch 1 still checked
    bad = check_kv_cover(P, replace(R, num_splits=[0, 4], batch_idx=[0, 1]), C, lengths, range_fn=floor_range)
    assert bad and {v.detail["virtual_batch"] for v in bad} == {1}
    # virtual batch 0 points outside the call's batch (skipped), virtual batch 1 still checked
    bad = check_kv_cover(P, replace(R, num_splits=[4, 4], batch_idx=[5, 1]), C, lengths, range_fn=floor_range)
    assert bad and {v.detail["virtual_batch"] for v in bad} == {1}


def test_query_cover_counts_sequence_rows_without_packgqa():
    # GQA 32/8, 128 query rows, 1 split: no PackGQA (128/128 = 1.0, heuristics.h 16), so the kernel's rows are
    # the 128 sequence rows: 1 m-block of 128 covers them (with PackGQA it would be 512 rows)
    P, R = metadata_for(precompute_inputs(1, 128, 4096, 32, 8, 128, num_splits=1), [4096])
    C = resolve_schedule(call_inputs(1, 128, 4096, 32, 8, 128, num_splits=1))
    assert C.kernel_pack_gqa is False and R.num_m_blocks == [1]
    assert check_query_cover(P, R, C, [4096]) == []


def test_kv_cover_lists_at_most_16_blocks_and_names_8():
    from spec.invariants import check_kv_cover
    # non-causal d 128: kBlockN 176; 3520 keys = 20 blocks; a range formula that covers nothing misses all 20
    P, R, C, lengths = kv_case([4], causal=False, seqlen=3520)
    (v,) = check_kv_cover(P, R, C, lengths, range_fn=lambda lo, hi, s, i: (lo, lo))
    assert v.detail == {"virtual_batch": 0, "m_block": 0, "n_block_range": [0, 20], "splits": 4,
                        "uncovered_blocks": list(range(16))}
    assert v.message == ("batch 0, m-block 0: 4 splits leave KV blocks [0, 1, 2, 3, 4, 5, 6, 7] of [0, 20) "
                         "uncovered")


def test_query_cover_goes_on_past_a_batch_outside_the_call():
    from dataclasses import replace
    P, R = metadata_for(precompute_inputs(2, 1, 8192, 32, 8, 128, varlen_q=True), [8192, 8192], seqlens_q=[1, 1])
    C = resolve_schedule(call_inputs(2, 40, 8192, 32, 8, 128, varlen_q=True))
    bad = check_query_cover(P, replace(R, batch_idx=[7, 1]), C, {"seqused_k": [8192] * 2, "seqlens_q": [33, 33]})
    assert [v.detail["virtual_batch"] for v in bad] == [1]


def test_a_call_that_reads_no_metadata_is_never_checked():
    # C reads no metadata (non-varlen, 1 split, no mask): even metadata for fewer batches is irrelevant
    P, R = metadata_for(precompute_inputs(1, 1, 4096, 8, 8, 128), [4096])
    C0 = resolve_schedule(call_inputs(2, 1, 4096, 8, 8, 128, has_cache_seqlens=False, num_splits=1))
    assert C0.metadata_size == 0
    assert evaluate(P, R, C0, [4096, 4096]) == Evaluation("pass", [], [])


def test_padded_metadata_keeps_int32_values_exact():
    # d 64, dv 512: kBlockM 64 (tile_size.h 19); 1073741888 query rows = (2^24 + 1) * 64 -> 2^24 + 1 m-blocks,
    # a value float32 cannot hold. A call of 5 batches reads past the 13 values (SHAPE fails): the padding
    # must keep the tensor int32.
    P, R = metadata_for(precompute_inputs(1, 1073741888, 4096, 8, 8, 64, headdim_v=512, num_splits=1), [4096])
    assert R.num_m_blocks == [2**24 + 1]
    C = resolve_schedule(call_inputs(5, 1, 4096, 8, 8, 64, headdim_v=512))
    md = read_metadata(P, R, C)
    # P's m-blocks vector starts at P's b4 = 4, which the call's layout (b4 = 8) reads as num_splits[4]
    assert md.num_splits[0] == 1 and md.num_splits[4] == 2**24 + 1


def test_kv_cover_of_a_local_call_without_packgqa():
    from spec.invariants import check_kv_cover
    # GQA 32/8, 600 rows, window (100, 0), 1 split: no PackGQA (600/640 = 0.94 is not < 0.9 * 2400/2432), so the
    # kernel's m-blocks are the 5 sequence-row blocks. m-block k: n_max = min(5, k + 1); n_min = (128 k - 100) / 128
    # truncated: 0, 0, 1, 2, 3 (block.h 25-44 without PackGQA). A range formula dropping the last block loses
    # block k of each.
    P, R = metadata_for(precompute_inputs(1, 600, 600, 32, 8, 128, window_size=(100, 0), num_splits=1), [600],
                        seqlens_q=[600])
    C = resolve_schedule(call_inputs(1, 600, 600, 32, 8, 128, window_size=(100, 0), num_splits=1))
    assert C.kernel_pack_gqa is False and C.masking.is_local and C.num_splits == 1
    got = [(v.detail["m_block"], v.detail["n_block_range"], v.detail["uncovered_blocks"])
           for v in check_kv_cover(P, R, C, {"seqused_k": [600], "seqlens_q": [600]}, range_fn=drop_last)]
    assert got == [(0, [0, 1], [0]), (1, [0, 2], [1]), (2, [1, 3], [2]), (3, [2, 4], [3]), (4, [3, 5], [4])]



def test_the_older_fork_stores_no_heads_in_l2_and_a_swizzled_call_reads_none_of_it():
    # the FA3 of vLLM 0.11.1-0.16.0 (flash_api.cpp@a8937124 1008-1028): the semaphore and b split counts only; a
    # causal call runs the Swizzle path, but there is no heads-in-L2 vector to read, so nothing is named for it
    from refmodel.fa3_builds import VLLM_FORK_A8937124
    P, R = metadata_for(precompute_inputs(3, 2, 4096, 32, 8, 128, causal=True, num_splits=4, build=VLLM_FORK_A8937124),
                        [4096, 10, 10], seqlens_q=[2, 2, 2])
    C = resolve_schedule(call_inputs(3, 2, 4096, 32, 8, 128, varlen_q=True, total_q=6, causal=True, num_splits=4,
                                     build=VLLM_FORK_A8937124))
    assert C.swizzle and C.legacy_dynamic_split
    assert check_batch_permutation(P, R, C, [4096, 10, 10]) == []
