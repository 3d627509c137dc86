"""FA3's split-KV decomposition (refmodel.splitkv): block ranges, bounds, and partials that recombine exactly."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refmodel.attention import attention, visibility_mask
from refmodel.combine import flash_attn_combine
from refmodel.splitkv import kv_block_bounds, split_block_range, split_kv

I32 = torch.int32


# ----------------------------------------------------------------------------------------------------------
# split_block_range
# ----------------------------------------------------------------------------------------------------------


def _ranges(n_min, n_max, num_splits, range_fn=split_block_range):
    return [range_fn(n_min, n_max, num_splits, s) for s in range(num_splits)]


def test_split_block_range_examples():
    assert _ranges(0, 10, 3) == [(0, 4), (4, 8), (8, 10)]
    assert _ranges(0, 2, 4) == [(0, 1), (1, 2), (2, 2), (3, 2)]  # trailing splits are empty (hi <= lo)
    assert _ranges(5, 5, 3) == [(5, 5)] * 3  # empty range: P = 0
    assert _ranges(3, 9, 1) == [(3, 9)]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 30), st.integers(-3, 60), st.integers(1, 20))
def test_split_block_ranges_partition_the_block_range(n_min, length, num_splits):
    n_max = n_min + length
    covered = []
    per_split = max(hi - lo for lo, hi in _ranges(n_min, n_max, num_splits))
    for lo, hi in _ranges(n_min, n_max, num_splits):
        covered.extend(range(lo, hi))
        assert hi - lo <= per_split
    assert covered == list(range(n_min, n_max))  # disjoint, ascending, complete


def test_split_block_range_rejects_bad_split_arguments():
    with pytest.raises(ValueError, match="^num_splits"):
        split_block_range(0, 4, 0, 0)
    with pytest.raises(ValueError, match="^split_idx"):
        split_block_range(0, 4, 2, 2)


# ----------------------------------------------------------------------------------------------------------
# kv_block_bounds
# ----------------------------------------------------------------------------------------------------------


def test_kv_block_bounds_without_mask_cover_all_key_blocks():
    assert kv_block_bounds(0, 4, 10, 2, 4) == (0, 3)
    assert kv_block_bounds(7, 40, 0, 4, 4) == (0, 0)


def test_kv_block_bounds_causal_clip_and_local_raise():
    # Lq=4, Lk=16, kBM=2, kBN=4: m-block 0 holds rows 0,1 whose last visible key is 1 + 12 = 13.
    assert kv_block_bounds(0, 4, 16, 2, 4, causal=True) == (0, 4)
    # Lq=16, Lk=16: m-block 0 (rows 0..1) sees keys <= 1 -> block 0 only.
    assert kv_block_bounds(0, 16, 16, 2, 4, causal=True) == (0, 1)
    # window left 2: m-block 3 (rows 6, 7) sees keys >= 4 -> starts at block 1.
    assert kv_block_bounds(3, 16, 16, 2, 4, window_size=(2, 0)) == (1, 2)


def test_kv_block_bounds_pack_gqa_divides_row_span():
    # qhpk = 4, kBM = 8: packed m-block 1 holds packed rows 8..15 = sequence rows 2..3.
    assert kv_block_bounds(1, 16, 16, 8, 2, causal=True, qhead_per_khead=4) == (0, 2)
    assert kv_block_bounds(1, 16, 16, 8, 2, causal=True, qhead_per_khead=1) == (0, 8)


def test_kv_block_bounds_use_c_truncating_division():
    # Far-below-diagonal block: row_end + Lk - Lq = 64 + 10 - 1000 = -926; C: (-926 + 15) / 16 = -56 (not -57).
    assert kv_block_bounds(0, 1000, 10, 64, 16, causal=True) == (0, -56)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(0, 20), st.integers(1, 5), st.integers(1, 5), st.integers(1, 3),
       st.booleans(), st.integers(-1, 5), st.integers(-1, 4))
def test_kv_block_bounds_never_exclude_a_visible_key(lq, lk, block_m, block_n, qhpk, causal, left, right):
    visible = visibility_mask(lq, lk, causal, (left, right))
    packed_rows = lq * qhpk
    for m_block in range(math.ceil(packed_rows / block_m)):
        n_min, n_max = kv_block_bounds(m_block, lq, lk, block_m, block_n, causal, (left, right), qhpk)
        rows = {p // qhpk for p in range(m_block * block_m, min((m_block + 1) * block_m, packed_rows))}
        for row in rows:
            keys = visible[row].nonzero().flatten().tolist()
            assert all(n_min * block_n <= j < n_max * block_n for j in keys)


# ----------------------------------------------------------------------------------------------------------
# split_kv + combine == exact attention
# ----------------------------------------------------------------------------------------------------------


@st.composite
def split_calls(draw):
    b, hk = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    h, d, dv = hk * draw(st.integers(1, 3)), 4, draw(st.sampled_from([3, 4]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    kwargs = {}
    if draw(st.booleans()):  # varlen
        lengths = [draw(st.integers(0, 5)) for _ in range(b)]
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        q = torch.randn(cu[-1], h, d, generator=g, dtype=torch.float64)
        kwargs.update(cu_seqlens_q=torch.tensor(cu, dtype=I32), max_seqlen_q=max(lengths))
    else:
        q = torch.randn(b, draw(st.integers(1, 5)), h, d, generator=g, dtype=torch.float64)
    if draw(st.booleans()):  # paged
        page_size, max_pages, num_pages = draw(st.integers(1, 3)), draw(st.integers(1, 5)), 6
        k = torch.randn(num_pages, page_size, hk, d, generator=g, dtype=torch.float64)
        v = torch.randn(num_pages, page_size, hk, dv, generator=g, dtype=torch.float64)
        kwargs["page_table"] = torch.randint(0, num_pages, (b, max_pages), generator=g, dtype=I32)
        capacity = page_size * max_pages
    else:
        capacity = draw(st.integers(1, 14))
        k = torch.randn(b, capacity, hk, d, generator=g, dtype=torch.float64)
        v = torch.randn(b, capacity, hk, dv, generator=g, dtype=torch.float64)
    seqlens = [draw(st.integers(0, capacity)) for _ in range(b)]
    kwargs["cache_seqlens"] = torch.tensor(seqlens, dtype=I32)
    if draw(st.booleans()):
        kwargs["cache_leftpad"] = torch.tensor([draw(st.integers(0, n)) for n in seqlens], dtype=I32)
    kwargs.update(causal=draw(st.booleans()), window_size=(draw(st.integers(-1, 4)), draw(st.integers(-1, 3))),
                  softcap=draw(st.sampled_from([0.0, 1.5])))
    tiling = dict(block_n=draw(st.integers(1, 4)), block_m=draw(st.integers(1, 8)), pack_gqa=draw(st.booleans()))
    return q, k, v, kwargs, tiling


def _combined_vs_oracle(out_partial, lse_partial, q, k, v, kwargs, **combine_kwargs):
    out, lse = flash_attn_combine(out_partial, lse_partial, **combine_kwargs)
    ref_out, ref_lse = attention(q, k, v, **kwargs)
    ref_lse = ref_lse.transpose(0, 1) if "cu_seqlens_q" in kwargs else ref_lse.transpose(1, 2)
    return out.double(), lse.double(), ref_out, ref_lse


def _assert_close_to_oracle(out, lse, ref_out, ref_lse):
    torch.testing.assert_close(out, ref_out, atol=2e-5, rtol=1e-5)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=2e-5, rtol=1e-5)


@settings(max_examples=120, deadline=None)
@given(split_calls(), st.integers(1, 7))
def test_split_kv_then_combine_equals_exact_attention(case, num_splits):
    q, k, v, kwargs, tiling = case
    out_partial, lse_partial = split_kv(q, k, v, num_splits, **tiling, **kwargs)
    _assert_close_to_oracle(*_combined_vs_oracle(out_partial, lse_partial, q, k, v, kwargs))


@settings(max_examples=40, deadline=None)
@given(split_calls(), st.data())
def test_per_batch_split_counts_recombine_exactly(case, data):
    q, k, v, kwargs, tiling = case
    b = kwargs["cache_seqlens"].numel()
    counts = [data.draw(st.integers(1, 5)) for _ in range(b)]
    out_partial, lse_partial = split_kv(q, k, v, counts, **tiling, **kwargs)
    assert out_partial.shape[0] == max(counts)
    combine_kwargs = dict(num_splits_per_batch=counts)
    if "cu_seqlens_q" in kwargs:
        cu = kwargs["cu_seqlens_q"].long()
        combine_kwargs["batch_of_row"] = torch.repeat_interleave(torch.arange(b), cu[1:] - cu[:-1])
    _assert_close_to_oracle(*_combined_vs_oracle(out_partial, lse_partial, q, k, v, kwargs, **combine_kwargs))


def test_splits_beyond_a_batch_count_are_neg_inf_and_zero():
    q = torch.randn(2, 3, 2, 4, dtype=torch.float64)
    k = torch.randn(2, 8, 1, 4, dtype=torch.float64)
    out_partial, lse_partial = split_kv(q, k, k, [3, 1], block_n=1)  # 8 blocks: P = 3 for batch 0
    assert torch.isneginf(lse_partial[1:, 1]).all() and torch.equal(out_partial[1:, 1], torch.zeros(2, 3, 2, 4))
    assert torch.isfinite(lse_partial[:, 0]).all()


def test_empty_splits_write_neg_inf_and_zero():
    q = torch.randn(1, 2, 1, 4, dtype=torch.float64)
    k = torch.randn(1, 3, 1, 4, dtype=torch.float64)
    out_partial, lse_partial = split_kv(q, k, k, 5, block_n=1)  # 3 key blocks, 5 splits: P = 1
    assert torch.isfinite(lse_partial[:3]).all()
    assert torch.isneginf(lse_partial[3:]).all() and torch.equal(out_partial[3:], torch.zeros(2, 1, 2, 1, 4))


def test_each_split_sees_exactly_its_block_range():
    q = torch.randn(1, 1, 1, 4, dtype=torch.float64)
    k = torch.randn(1, 10, 1, 4, dtype=torch.float64)
    v = torch.randn(1, 10, 1, 2, dtype=torch.float64)
    out_partial, lse_partial = split_kv(q, k, v, 3, block_n=2)  # 5 blocks, P = 2: keys [0,4), [4,8), [8,10)
    for s, (lo, hi) in enumerate([(0, 4), (4, 8), (8, 10)]):
        ref_out, ref_lse = attention(q, k[:, lo:hi], v[:, lo:hi], softmax_scale=0.5)
        torch.testing.assert_close(out_partial[s].double(), ref_out, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(lse_partial[s, 0, 0, 0].double(), ref_lse[0, 0, 0], atol=1e-6, rtol=1e-6)


def test_partial_shapes_match_what_combine_consumes():
    q = torch.randn(2, 3, 4, 8)
    k = torch.randn(2, 6, 2, 8)
    v = torch.randn(2, 6, 2, 5)
    out_partial, lse_partial = split_kv(q, k, v, 3, block_n=2)
    assert out_partial.shape == (3, 2, 3, 4, 5) and lse_partial.shape == (3, 2, 3, 4)
    assert out_partial.dtype == lse_partial.dtype == torch.float32
    assert lse_partial.stride(-2) == 1  # FA3's mha_combine requires a unit-stride seqlen dim
    qv = torch.randn(7, 4, 8)
    out_partial, lse_partial = split_kv(qv, k, v, 2, block_n=2, cu_seqlens_q=torch.tensor([0, 3, 7], dtype=I32),
                                        max_seqlen_q=4)
    assert out_partial.shape == (2, 7, 4, 5) and lse_partial.shape == (2, 7, 4)


@pytest.mark.parametrize("num_splits", [0, 257, [2], [2, 0]])
def test_bad_split_counts_raise(num_splits):
    q, k = torch.randn(2, 1, 2, 4), torch.randn(2, 4, 1, 4)
    with pytest.raises(ValueError, match="^num_splits"):
        split_kv(q, k, k, num_splits, block_n=2)


def test_bad_tile_sizes_raise():
    q, k = torch.randn(1, 1, 1, 4), torch.randn(1, 4, 1, 4)
    with pytest.raises(ValueError, match="^block_n"):
        split_kv(q, k, k, 2, block_n=0)


# ----------------------------------------------------------------------------------------------------------
# Negative controls: a defective range function must be caught by the recombination check
# ----------------------------------------------------------------------------------------------------------


def _drops_last_block(n_min, n_max, num_splits, split_idx):
    lo, hi = split_block_range(n_min, n_max, num_splits, split_idx)
    return lo, hi - 1 if hi > lo else hi


def _overlaps_next_split(n_min, n_max, num_splits, split_idx):
    lo, hi = split_block_range(n_min, n_max, num_splits, split_idx)
    return lo, min(hi + 1, n_max) if hi > lo else hi


def _ignores_n_min(n_min, n_max, num_splits, split_idx):
    return split_block_range(0, n_max - n_min, num_splits, split_idx)


@pytest.mark.parametrize("defect", [_drops_last_block, _overlaps_next_split, _ignores_n_min])
def test_off_by_one_range_function_is_caught(defect):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 2, 4, generator=g, dtype=torch.float64)
    k = torch.randn(1, 24, 2, 4, generator=g, dtype=torch.float64)
    v = torch.randn(1, 24, 2, 3, generator=g, dtype=torch.float64)
    kwargs = dict(window_size=(9, 0))  # local: n_min > 0 for later m-blocks
    tiling = dict(block_n=2, block_m=2, pack_gqa=False)
    good = _combined_vs_oracle(*split_kv(q, k, v, 3, **tiling, **kwargs), q, k, v, kwargs)
    _assert_close_to_oracle(*good)
    bad = _combined_vs_oracle(*split_kv(q, k, v, 3, **tiling, range_fn=defect, **kwargs), q, k, v, kwargs)
    with pytest.raises(AssertionError):
        _assert_close_to_oracle(*bad)
