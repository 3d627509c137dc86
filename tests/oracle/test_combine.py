"""FA3's split combine (refmodel.combine): semantics, FA3's own sweep, capacity, merges, negative controls."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refmodel.attention import attention_rows
from refmodel.combine import combine_capacity, flash_attn_combine, merge_states

NEG_INF = -math.inf


def logsumexp_combine(out_partial, lse_partial):
    """Plain reference (as FA3's test suite writes it): logsumexp, weights, non-finite weights zeroed."""
    lse = torch.logsumexp(lse_partial, dim=0)
    scale = torch.exp(lse_partial - lse)
    scale = torch.where(torch.isinf(scale) | torch.isnan(scale), 0.0, scale)
    return (scale.unsqueeze(-1) * out_partial).sum(0), lse


def _random_partials(num_splits, b=3, sq=2, h=2, dv=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(num_splits, b, sq, h, dv, generator=g), torch.randn(num_splits, b, sq, h, generator=g))


def _assert_lse_close(lse, ref):
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref))
    finite = torch.isfinite(ref)
    torch.testing.assert_close(lse[finite].double(), ref[finite].double(), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------------------------
# Any partition of the keys (empty splits included) recombines to exact attention
# ----------------------------------------------------------------------------------------------------------


@st.composite
def partitioned_rows(draw):
    rows, keys, dv = draw(st.integers(1, 6)), draw(st.integers(0, 12)), draw(st.sampled_from([2, 5]))
    num_splits = draw(st.integers(1, 9))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = torch.randn(rows, 4, generator=g, dtype=torch.float64) * 2
    k = torch.randn(keys, 4, generator=g, dtype=torch.float64)
    v = torch.randn(keys, dv, generator=g, dtype=torch.float64)
    visible = torch.rand(rows, keys, generator=g) < draw(st.sampled_from([0.3, 0.8, 1.0]))
    owner = torch.tensor([draw(st.integers(0, num_splits - 1)) for _ in range(keys)], dtype=torch.int64)
    return q, k, v, visible, owner, num_splits


def _partials_of_partition(q, k, v, visible, owner, num_splits):
    outs, lses = [], []
    for s in range(num_splits):
        out_s, lse_s = attention_rows(q, k, v, visible & (owner == s), 0.5)
        outs.append(out_s.float())
        lses.append(lse_s.float())
    # Layout (S, b=1, sq=rows, h=1, dv).
    return torch.stack(outs)[:, None, :, None, :], torch.stack(lses)[:, None, :, None]


@settings(max_examples=150, deadline=None)
@given(partitioned_rows())
def test_any_partition_recombines_to_exact_attention(case):
    q, k, v, visible, owner, num_splits = case
    out_partial, lse_partial = _partials_of_partition(q, k, v, visible, owner, num_splits)
    out, lse = flash_attn_combine(out_partial, lse_partial)
    ref_out, ref_lse = attention_rows(q, k, v, visible, 0.5)
    torch.testing.assert_close(out[0, :, 0].double(), ref_out, atol=1e-5, rtol=1e-5)
    _assert_lse_close(lse[0, :, 0], ref_lse)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 20), st.sampled_from([0.0, math.nan, math.inf]), st.integers(0, 999))
def test_appending_neg_inf_splits_changes_nothing(num_splits, extra, garbage, seed):
    out_partial, lse_partial = _random_partials(num_splits, seed=seed)
    lse_partial[: num_splits // 2, :1] = NEG_INF
    padded_out = torch.cat([out_partial, torch.full((extra,) + out_partial.shape[1:], garbage)])
    padded_lse = torch.cat([lse_partial, torch.full((extra,) + lse_partial.shape[1:], NEG_INF)])
    combine = flash_attn_combine if num_splits > 1 else logsumexp_combine  # S == 1 is written through
    base = combine(out_partial, lse_partial)
    out, lse = flash_attn_combine(padded_out, padded_lse)
    torch.testing.assert_close(out, base[0], atol=1e-6, rtol=1e-6)
    _assert_lse_close(lse, base[1])


def test_all_neg_inf_rows_give_zero_and_neg_inf():
    out_partial, lse_partial = _random_partials(4)
    lse_partial[:, 1] = NEG_INF
    out, lse = flash_attn_combine(out_partial, lse_partial)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.isneginf(lse[1]).all()
    assert torch.isfinite(lse[0]).all() and torch.isfinite(lse[2]).all()


def test_nan_lse_gives_nan_lse_and_zero_output_like_the_kernel():
    out_partial, lse_partial = _random_partials(3)
    lse_partial[1, 0, 0, 0] = math.nan
    out, lse = flash_attn_combine(out_partial, lse_partial)
    assert math.isnan(lse[0, 0, 0]) and torch.equal(out[0, 0, 0], torch.zeros(4))
    assert torch.isfinite(lse[1:]).all()


# ----------------------------------------------------------------------------------------------------------
# FA3's own combine sweep (hopper/test_flash_attn.py::test_flash_attn_combine), scaled down
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dv", [64, 128])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 5, 17, 32, 55, 97, 133])
def test_fa3_combine_sweep_matches_logsumexp_reference(num_splits, dv):
    g = torch.Generator().manual_seed(1)
    b, h, sq = 6, 4, 3
    # Non-contiguous inputs, as upstream's sweep uses.
    out_partial = torch.randn(num_splits * 2, b, h, sq, dv, generator=g).transpose(2, 3)[:num_splits]
    lse_partial = torch.randn(num_splits, b, h * 2, sq, generator=g).transpose(-1, -2)[:, :, :, :h]
    lse_partial[num_splits // 2:, : b // 3] = NEG_INF  # upper half of the splits empty for the first third
    out, lse = flash_attn_combine(out_partial, lse_partial)
    ref_out, ref_lse = logsumexp_combine(out_partial, lse_partial)
    if num_splits == 1:
        # FA3's kernel returns early for S <= 1 (upstream's sweep then reads torch.empty); the model writes the
        # split through, so all -inf rows keep their partial instead of the reference's zeros.
        ref_out = out_partial[0]
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    assert lse.shape == (b, sq, h) and lse.stride() == (h * sq, 1, sq)  # mha_combine's transposed (b, h, sq)


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
def test_out_dtype_rounds_the_float32_result(out_dtype):
    out_partial, lse_partial = _random_partials(5)
    out, _ = flash_attn_combine(out_partial, lse_partial, out_dtype=out_dtype)
    full, _ = flash_attn_combine(out_partial, lse_partial)
    assert out.dtype == out_dtype and torch.equal(out, full.to(out_dtype))


def test_out_argument_is_written_in_place():
    out_partial, lse_partial = _random_partials(3)
    buffer = torch.empty(3, 2, 2, 4)
    out, _ = flash_attn_combine(out_partial, lse_partial, out=buffer)
    assert out is buffer and torch.equal(buffer, flash_attn_combine(out_partial, lse_partial)[0])


def test_varlen_layout_matches_batched_layout():
    out_partial, lse_partial = _random_partials(4, b=1, sq=5)
    out, lse = flash_attn_combine(out_partial, lse_partial)
    out_v, lse_v = flash_attn_combine(out_partial[:, 0], lse_partial[:, 0])
    assert torch.equal(out_v, out[0]) and torch.equal(lse_v, lse[0])


def test_single_split_is_written_through():
    out_partial, lse_partial = _random_partials(1)
    out, lse = flash_attn_combine(out_partial, lse_partial)
    assert torch.equal(out, out_partial[0]) and torch.equal(lse, lse_partial[0])


# ----------------------------------------------------------------------------------------------------------
# Per-batch split counts and the combine capacity kMax
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_splits_call, dv, expected", [
    (1, 64, 16), (16, 64, 16), (17, 64, 32), (2, 128, 32), (16, 65, 32), (32, 128, 32), (33, 128, 64),
    (64, 256, 64), (65, 64, 128), (128, 128, 128), (129, 128, 256), (256, 512, 256),
])
def test_combine_capacity_follows_launch_template(num_splits_call, dv, expected):
    assert combine_capacity(num_splits_call, dv) == expected


def test_per_batch_counts_hide_splits_beyond_each_count():
    out_partial, lse_partial = _random_partials(6)
    out, lse = flash_attn_combine(out_partial, lse_partial, num_splits_per_batch=[6, 3, 2])
    for bi, count in enumerate([6, 3, 2]):
        ref_out, ref_lse = logsumexp_combine(out_partial[:count, bi], lse_partial[:count, bi])
        torch.testing.assert_close(out[bi], ref_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[bi], ref_lse, atol=1e-5, rtol=1e-5)


def test_per_batch_count_of_one_is_written_through():
    out_partial, lse_partial = _random_partials(4)
    out, lse = flash_attn_combine(out_partial, lse_partial, num_splits_per_batch=[4, 1, 4])
    assert torch.equal(out[1], out_partial[0, 1]) and torch.equal(lse[1], lse_partial[0, 1])


def test_varlen_per_batch_counts_use_batch_of_row():
    out_partial, lse_partial = _random_partials(5, b=1, sq=4)
    rows_out, rows_lse = out_partial[:, 0], lse_partial[:, 0]  # (S, total_q=4, h, dv)
    out, lse = flash_attn_combine(rows_out, rows_lse, num_splits_per_batch=[5, 2], batch_of_row=[0, 0, 1, 1])
    ref_out, ref_lse = logsumexp_combine(rows_out[:2, 2:], rows_lse[:2, 2:])
    torch.testing.assert_close(out[2:], ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse[2:], ref_lse, atol=1e-5, rtol=1e-5)


def test_split_count_beyond_capacity_is_detected_as_a_wrong_result():
    # Metadata says 40 splits, but the call's S_c = 20 gives kMax = 32: splits 32..39 are never read.
    out_partial, lse_partial = _random_partials(40, dv=128)
    capacity = combine_capacity(20, 128)
    out, lse = flash_attn_combine(out_partial, lse_partial, num_splits_per_batch=[40, 40, 40], capacity=capacity)
    ref_out, ref_lse = logsumexp_combine(out_partial, lse_partial)
    assert not torch.allclose(lse, ref_lse, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, ref_out, atol=1e-5, rtol=1e-5)
    first_32 = logsumexp_combine(out_partial[:32], lse_partial[:32])
    torch.testing.assert_close((out, lse), first_32, atol=1e-5, rtol=1e-5)


def test_capacity_below_buffer_split_count_truncates_every_row():
    out_partial, lse_partial = _random_partials(20)
    out, lse = flash_attn_combine(out_partial, lse_partial, capacity=16)
    torch.testing.assert_close((out, lse), logsumexp_combine(out_partial[:16], lse_partial[:16]), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------------------------
# Negative controls: disabling a guard must produce the defect the guard exists for
# ----------------------------------------------------------------------------------------------------------


def test_without_neg_inf_guard_all_neg_inf_rows_turn_nan():
    out_partial, lse_partial = _random_partials(4)
    lse_partial[:, 1] = NEG_INF
    _, lse = flash_attn_combine(out_partial, lse_partial, guard_neg_inf=False)
    assert torch.isnan(lse[1]).all()  # the defect is visible
    assert torch.isfinite(lse[0]).all()


def test_without_skip_garbage_behind_neg_inf_splits_leaks_nan():
    out_partial, lse_partial = _random_partials(4)
    lse_partial[2:, 0] = NEG_INF
    out_partial[2:, 0] = math.nan  # FA3 never writes O_partial for an empty split
    good, _ = flash_attn_combine(out_partial, lse_partial)
    assert torch.isfinite(good).all()
    torch.testing.assert_close(good[0], logsumexp_combine(out_partial[:2, 0], lse_partial[:2, 0])[0])
    bad, _ = flash_attn_combine(out_partial, lse_partial, skip_nonpositive=False)
    assert torch.isnan(bad[0]).all()  # the defect is visible
    torch.testing.assert_close(bad[1:], good[1:])


# ----------------------------------------------------------------------------------------------------------
# merge_states
# ----------------------------------------------------------------------------------------------------------


@st.composite
def softmax_states(draw, rows=5, dv=3):
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    lse = torch.randn(rows, generator=g) * 3
    lse[torch.rand(rows, generator=g) < draw(st.sampled_from([0.0, 0.4]))] = NEG_INF
    out = torch.where(torch.isneginf(lse).unsqueeze(-1), 0.0, torch.randn(rows, dv, generator=g))
    return out, lse


@settings(max_examples=100, deadline=None)
@given(softmax_states(), softmax_states(), softmax_states())
def test_merge_states_is_associative_and_agrees_with_combine(a, b, c):
    left = merge_states(merge_states(a, b), c)
    right = merge_states(a, merge_states(b, c))
    torch.testing.assert_close(left[0], right[0], atol=1e-5, rtol=1e-5)
    _assert_lse_close(left[1], right[1])
    stacked_out = torch.stack([a[0], b[0], c[0]])[:, None, :, None]
    stacked_lse = torch.stack([a[1], b[1], c[1]])[:, None, :, None]
    out, lse = flash_attn_combine(stacked_out, stacked_lse)
    torch.testing.assert_close(out[0, :, 0], left[0], atol=1e-5, rtol=1e-5)
    _assert_lse_close(lse[0, :, 0], left[1])


@settings(max_examples=40, deadline=None)
@given(softmax_states())
def test_merging_an_empty_state_is_identity(state):
    empty = (torch.full_like(state[0], math.nan), torch.full_like(state[1], NEG_INF))
    out, lse = merge_states(state, empty)
    torch.testing.assert_close(out, state[0], atol=1e-6, rtol=1e-6)
    _assert_lse_close(lse, state[1])


def test_merge_states_is_commutative():
    a, b = (torch.randn(4, 3), torch.randn(4)), (torch.randn(4, 3), torch.randn(4))
    torch.testing.assert_close(merge_states(a, b), merge_states(b, a), atol=1e-6, rtol=1e-6)


# ----------------------------------------------------------------------------------------------------------
# Input validation
# ----------------------------------------------------------------------------------------------------------


BAD_COMBINES = {
    "partial_not_float32": (lambda o, l: (o.double(), l), {}, "out_partial"),
    "lse_not_float32": (lambda o, l: (o, l.half()), {}, "lse_partial"),
    "lse_shape": (lambda o, l: (o, l[:, :2]), {}, "lse_partial"),
    "rank": (lambda o, l: (o[0, 0], l[0, 0]), {}, "out_partial"),
    "too_many_splits": (lambda o, l: (o[:1].expand(257, -1, -1, -1, -1), l[:1].expand(257, -1, -1, -1)), {},
                        "out_partial"),
    "bad_out_dtype": (lambda o, l: (o, l), {"out_dtype": torch.float64}, "out_dtype"),
    "out_dtype_mismatch": (lambda o, l: (o, l), {"out": torch.empty(3, 2, 2, 4, dtype=torch.half)}, "out"),
    "out_shape": (lambda o, l: (o, l), {"out": torch.empty(3, 2, 2, 5)}, "out"),
    "counts_length": (lambda o, l: (o, l), {"num_splits_per_batch": [2, 2]}, "num_splits_per_batch"),
    "counts_past_buffer": (lambda o, l: (o, l), {"num_splits_per_batch": [2, 9, 2]}, "num_splits_per_batch"),
    "negative_count": (lambda o, l: (o, l), {"num_splits_per_batch": [2, -1, 2]}, "num_splits_per_batch"),
    "batch_of_row_without_counts": (lambda o, l: (o, l), {"batch_of_row": [0, 0, 1]}, "batch_of_row"),
    "varlen_counts_without_rows": (lambda o, l: (o[:, 0], l[:, 0]), {"num_splits_per_batch": [1]}, "batch_of_row"),
    "capacity": (lambda o, l: (o, l), {"capacity": 0}, "capacity"),
}


@pytest.mark.parametrize("case", sorted(BAD_COMBINES))
def test_bad_combine_input_raises_value_error_naming_argument(case):
    reshape, kwargs, argument = BAD_COMBINES[case]
    out_partial, lse_partial = _random_partials(2)
    flash_attn_combine(out_partial, lse_partial)
    with pytest.raises(ValueError, match=rf"^{argument}\b"):
        flash_attn_combine(*reshape(out_partial, lse_partial), **kwargs)
