"""Tests of gpu_impl.zigzag: upstream's unit cases by hand, and properties of the zigzag split."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_impl.zigzag import (
    block_bounds,
    cp_v2_active,
    gather_reorder,
    kv_lens,
    pad_last_sequence,
    physical_rank_len,
    rank_blocks,
    rank_query_lens,
    rank_token_counts,
    rank_token_indices,
    shard_for_rank,
    zigzag_blocks,
    zigzag_layout,
)

# ---------------------------------------------------------------------------------------------
# Cases of sglang test/registered/cp/test_cp_strategy_unit.py
# (TestCPZigzagStrategy.test_zigzag_metadata_for_batched_sequences), derived by hand here.
# ---------------------------------------------------------------------------------------------


def test_upstream_case_cp4_two_sequences():
    # cp = 4 -> 2cp = 8 blocks.  seq_lens [11, 13], extend [9, 10] -> prefixes 2 and 3.
    # seq0: 9 = 8*1 + 1 -> base 1, rem 1 -> blocks [2,1,1,1,1,1,1,1], token ranges
    #       b0 [0,2) b1 [2,3) b2 [3,4) b3 [4,5) b4 [5,6) b5 [6,7) b6 [7,8) b7 [8,9).
    # seq1: 10 = 8*1 + 2 -> base 1, rem 2 -> blocks [2,2,1,1,1,1,1,1]; in batch coordinates
    #       (offset 9) b0 [9,11) b1 [11,13) b2 [13,14) b3 [14,15) b4 [15,16) b5 [16,17)
    #       b6 [17,18) b7 [18,19).
    assert zigzag_blocks(9, 4) == [2, 1, 1, 1, 1, 1, 1, 1]
    assert zigzag_blocks(10, 4) == [2, 2, 1, 1, 1, 1, 1, 1]
    # rank r owns blocks (r, 7 - r).
    assert [rank_blocks(r, 4) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    # kv_len_prev = prefix + sum(blocks[:r+1]);  kv_len_next = prefix + sum(blocks[:8-r]).
    #   seq0 (prefix 2): prefix sums of blocks 2,3,4,5,6,7,8,9
    #     r0: 2+2=4,  2+9=11 | r1: 2+3=5, 2+8=10 | r2: 2+4=6, 2+7=9 | r3: 2+5=7, 2+6=8
    #   seq1 (prefix 3): prefix sums 2,4,5,6,7,8,9,10
    #     r0: 3+2=5,  3+10=13 | r1: 3+4=7, 3+9=12 | r2: 3+5=8, 3+8=11 | r3: 3+6=9, 3+7=10
    expected_kv = {
        0: [(4, 11), (5, 13)],
        1: [(5, 10), (7, 12)],
        2: [(6, 9), (8, 11)],
        3: [(7, 8), (9, 10)],
    }
    for r, kv in expected_kv.items():
        assert [kv_lens(11, 9, 4, r), kv_lens(13, 10, 4, r)] == kv
    # Query lengths (prev, next): seq0 r0 (2,1) else (1,1); seq1 r0 (2,1), r1 (2,1), else (1,1).
    assert [rank_query_lens(9, 4, r) for r in range(4)] == [(2, 1), (1, 1), (1, 1), (1, 1)]
    assert [rank_query_lens(10, 4, r) for r in range(4)] == [(2, 1), (2, 1), (1, 1), (1, 1)]
    # Local token order: prev blocks of every sequence, then next blocks of every sequence.
    assert rank_token_indices([9, 10], 4, 0) == [0, 1, 9, 10, 8, 18]
    assert rank_token_indices([9, 10], 4, 1) == [2, 11, 12, 7, 17]
    assert rank_token_indices([9, 10], 4, 2) == [3, 13, 6, 16]
    assert rank_token_indices([9, 10], 4, 3) == [4, 14, 5, 15]
    # per_rank_actual_token 6,5,4,4 (sum 19); physical rows: ceil(6/8)*8 = 8.
    assert rank_token_counts([9, 10], 4) == [6, 5, 4, 4]
    layout = zigzag_layout([11, 13], [9, 10], 4)
    assert layout.physical_rank_tokens == 8
    assert layout.prefix_lens == (2, 3)
    assert layout.kv_len_prev == ((4, 5), (5, 7), (6, 8), (7, 9))
    assert layout.kv_len_next == ((11, 13), (10, 12), (9, 11), (8, 10))


def test_upstream_case_cp2_one_sequence():
    # cp = 2 -> 4 blocks of an 8-token sequence without prefix: base 2, rem 0 -> [2,2,2,2].
    # rank 0 owns blocks 0 and 3: tokens [0,1] and [6,7]; kv prev 2, kv next 8.
    # rank 1 owns blocks 1 and 2: tokens [2,3] and [4,5]; kv prev 4, kv next 6.
    # (upstream's dispatch test: rank 0's first FA call gets q[:2], the second q[2:].)
    assert zigzag_blocks(8, 2) == [2, 2, 2, 2]
    assert rank_token_indices([8], 2, 0) == [0, 1, 6, 7]
    assert rank_token_indices([8], 2, 1) == [2, 3, 4, 5]
    assert kv_lens(8, 8, 2, 0) == (2, 8)
    assert kv_lens(8, 8, 2, 1) == (4, 6)
    assert rank_query_lens(8, 2, 0) == (2, 2)


@pytest.mark.parametrize("seq_lens,extend_lens,bases,prefixes", [
    # 100000/8 = 12500, 200000/8 = 25000, 64/8 = 8, all remainders 0; prefixes 0, 0, 16.
    ([100000, 200000, 80], [100000, 200000, 64], [12500, 25000, 8], [0, 0, 16]),
    # 100000, 200000 and 16 split evenly (12500, 25000, 2); prefixes 5, 11, 9.
    ([100005, 200011, 25], [100000, 200000, 16], [12500, 25000, 2], [5, 11, 9]),
])
def test_upstream_large_cases(seq_lens, extend_lens, bases, prefixes):
    # Even splits: kv_prev(r) = prefix + (r+1)*base, kv_next(r) = prefix + (8-r)*base.
    for r in range(4):
        for s, e, b, p in zip(seq_lens, extend_lens, bases, prefixes):
            assert kv_lens(s, e, 4, r) == (p + (r + 1) * b, p + (8 - r) * b)


def test_cp_v2_active_gate():
    # Upstream test_enable_cp_v2_and_is_cp_v2_active: cp 4, 8 tokens active, 7 not.
    assert cp_v2_active("EXTEND", "zigzag", 4, [8])
    assert not cp_v2_active("EXTEND", "zigzag", 4, [7])
    assert not cp_v2_active("EXTEND", "zigzag", 4, [8, 7])  # every extend length >= 2cp
    assert not cp_v2_active("EXTEND", "zigzag", 4, [8], num_tokens=7)
    assert not cp_v2_active("MIXED", "zigzag", 4, [8])  # PR #30439: never MIXED
    assert cp_v2_active("MIXED", "zigzag", 4, [8], allow_mixed=True)  # pre-fix gate
    assert not cp_v2_active("DECODE", "zigzag", 4, [8])
    assert not cp_v2_active("EXTEND", None, 4, [8])
    assert not cp_v2_active("EXTEND", "zigzag", 1, [8])
    assert not cp_v2_active("EXTEND", "zigzag", 4, None)


def test_padding_rules():
    # build_metadata: the surplus of num_tokens goes to the last sequence (extend and seq).
    assert pad_last_sequence([9, 10], [11, 13], 24) == ([9, 15], [11, 18])
    assert pad_last_sequence([9, 10], [11], 24) == ([9, 15], [11])  # seq lens not per-sequence
    assert pad_last_sequence([9, 10], [11, 13], 19) == ([9, 10], [11, 13])
    assert zigzag_layout([11, 13], [9, 10], 4, num_tokens=24).extend_lens == (9, 15)
    # pad_logical_token_to_physical (upstream test_zigzag_padding_aligns_local_tensors):
    # cp 2, logical [7, 6] -> align 4 -> physical 8.
    assert physical_rank_len([7, 6], 2) == 8
    assert physical_rank_len([8, 8], 2) == 8


def test_gather_accepts_tensors_with_padding_rows():
    extend = [9, 10]
    x = torch.arange(19 * 2).view(19, 2)
    layout = zigzag_layout([11, 13], extend, 4)
    shards = []
    for r in range(4):
        local = x[rank_token_indices(extend, 4, r)]
        pad = layout.physical_rank_tokens - local.shape[0]
        shards.append(torch.cat([local, torch.full((pad, 2), -1)]))
    assert torch.equal(gather_reorder(shards, extend, 4), x)
    with pytest.raises(ValueError, match="expected 4 per-rank outputs"):
        gather_reorder(shards[:3], extend, 4)


def test_input_errors():
    with pytest.raises(ValueError, match="cp_size"):
        zigzag_blocks(8, 0)
    with pytest.raises(ValueError, match="rank"):
        rank_blocks(2, 2)
    with pytest.raises(ValueError, match="length"):
        zigzag_blocks(-1, 2)
    with pytest.raises(ValueError, match="exceeds seq length"):
        zigzag_layout([4], [5], 2)


# ---------------------------------------------------------------------------------------------
# Properties.
# ---------------------------------------------------------------------------------------------

cps = st.integers(1, 8)
lengths = st.integers(0, 300)
batches = st.lists(st.integers(1, 200), min_size=1, max_size=5)


@given(lengths, cps)
def test_blocks_partition_the_sequence(length, cp):
    blocks = zigzag_blocks(length, cp)
    base = length // (2 * cp)
    assert len(blocks) == 2 * cp and sum(blocks) == length
    assert set(blocks) <= {base, base + 1}
    assert blocks == sorted(blocks, reverse=True)
    bounds = block_bounds(length, cp)
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


@given(lengths, cps)
def test_per_sequence_rank_counts_differ_by_at_most_one(length, cp):
    # Rank r holds blocks r (< cp) and 2cp-1-r (>= cp); with rem = L mod 2cp, block i has an
    # extra token iff i < rem.  If rem <= cp the late block never has one, so rank r holds
    # 2*base + [r < rem]: counts in {2b, 2b+1}.  If rem > cp the early block always has one and
    # the late block has one iff r >= 2cp - rem: counts in {2b+1, 2b+2}.  Either way <= 1 apart.
    base, rem = divmod(length, 2 * cp)
    counts = [sum(rank_query_lens(length, cp, r)) for r in range(cp)]
    allowed = {2 * base, 2 * base + 1} if rem <= cp else {2 * base + 1, 2 * base + 2}
    assert set(counts) <= allowed
    assert max(counts) - min(counts) <= 1
    assert sum(counts) == length


@given(batches, cps)
def test_batch_rank_counts_differ_by_at_most_the_batch_size(extend, cp):
    # Summing per-sequence differences of at most 1 gives at most len(batch); not at most 1.
    counts = rank_token_counts(extend, cp)
    assert sum(counts) == sum(extend)
    assert max(counts) - min(counts) <= len(extend)


def test_batch_rank_count_bound_is_tight():
    # Every sequence has rem = 1, so rank 0 gets the one extra token of each: difference = n.
    extend = [9, 17, 25]  # each = 1 mod 8 for cp = 4
    counts = rank_token_counts(extend, 4)
    assert max(counts) - min(counts) == len(extend)


@given(batches, cps)
def test_ranks_cover_every_token_exactly_once_and_gather_inverts_shard(extend, cp):
    total = sum(extend)
    seen = sorted(i for r in range(cp) for i in rank_token_indices(extend, cp, r))
    assert seen == list(range(total))
    items = [("tok", i) for i in range(total)]
    shards = [shard_for_rank(items, extend, cp, r) + ["PAD"] * (r % 3) for r in range(cp)]
    assert gather_reorder(shards, extend, cp) == items


@settings(max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 120)), min_size=1, max_size=4),
       cps)
def test_each_query_sees_exactly_its_causal_prefix(seqs, cp):
    # FA3 aligns causal attention bottom-right: local query j of a half with q_len queries and
    # cache_seqlens kv attends keys [0, kv - q_len + j].  That must be the token's absolute
    # position (prefix + offset in the extend), so no key is missed or leaked.
    seq_lens = [p + e for p, e in seqs]
    extend = [e for _, e in seqs]
    layout = zigzag_layout(seq_lens, extend, cp)
    for r in range(cp):
        prev, nxt = rank_blocks(r, cp)
        for i, (prefix, e) in enumerate(seqs):
            bounds = block_bounds(e, cp)
            for which, kv, q in ((prev, layout.kv_len_prev[r][i], layout.q_len_prev[r][i]),
                                 (nxt, layout.kv_len_next[r][i], layout.q_len_next[r][i])):
                lo, hi = bounds[which]
                assert q == hi - lo
                for j in range(q):
                    assert kv - q + j == prefix + lo + j
                assert kv <= seq_lens[i]
    assert all(layout.kv_len_next[0][i] == seq_lens[i] for i in range(len(seqs)))


@given(st.lists(st.integers(0, 500), min_size=1, max_size=8), cps)
def test_physical_rows_are_aligned_and_minimal(counts, cp):
    rows = physical_rank_len(counts, cp)
    assert rows % (2 * cp) == 0 and max(counts) <= rows < max(counts) + 2 * cp


@given(st.lists(st.integers(1, 50), min_size=1, max_size=4), st.integers(0, 40))
def test_padding_goes_to_the_last_sequence(extend, surplus):
    seqs = [e + 3 for e in extend]
    new_extend, new_seqs = pad_last_sequence(extend, seqs, sum(extend) + surplus)
    assert new_extend[:-1] == extend[:-1] and new_extend[-1] == extend[-1] + surplus
    assert new_seqs[:-1] == seqs[:-1] and new_seqs[-1] == seqs[-1] + surplus
