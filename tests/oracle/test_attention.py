"""Exact attention oracle (refmodel.attention) against an independent per-row loop, plus FA3's conventions."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refmodel.attention import attention, attention_rows, visibility_mask

I32 = torch.int32


# ----------------------------------------------------------------------------------------------------------
# An independent naive implementation: explicit loops over batch, head, row and key.
# ----------------------------------------------------------------------------------------------------------


def _naive_key_visible(i: int, j: int, lq: int, lk: int, causal: bool, window: tuple[int, int]) -> bool:
    left, right = window
    if causal:
        right = 0
    shift = lk - lq
    if right >= 0 and j > i + shift + right:
        return False
    if left >= 0 and j < i + shift - left:
        return False
    return True


def _naive_cache_row(cache, bi: int, position: int, page_table):
    if page_table is None:
        return cache[bi, position]
    page_size = cache.shape[1]
    return cache[int(page_table[bi, position // page_size]), position % page_size]


def naive_attention(q, k, v, *, seqlens, leftpads, q_rows, page_table, causal, window, softcap, scale):
    """Per (batch, head, row): visible key list by the formula, scores, softmax with math.exp."""
    h, hk = q.shape[-2], k.shape[2]
    out_rows, lse_rows = {}, {}
    for bi, (row_start, lq) in enumerate(q_rows):
        lk = seqlens[bi] - leftpads[bi]
        for head in range(h):
            kv_head = head // (h // hk)
            for i in range(lq):
                qi = q[row_start + i, head] if q.dim() == 3 else q[bi, i, head]
                scores, values = [], []
                for j in range(lk):
                    if not _naive_key_visible(i, j, lq, lk, causal, window):
                        continue
                    key = _naive_cache_row(k, bi, leftpads[bi] + j, page_table)[kv_head]
                    s = float(torch.dot(qi.double(), key.double())) * scale
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    scores.append(s)
                    values.append(_naive_cache_row(v, bi, leftpads[bi] + j, page_table)[kv_head].double())
                if not scores:
                    out_rows[bi, head, i] = torch.zeros(v.shape[-1], dtype=torch.float64)
                    lse_rows[bi, head, i] = -math.inf
                    continue
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                out_rows[bi, head, i] = sum(w * val for w, val in zip(weights, values)) / total
                lse_rows[bi, head, i] = top + math.log(total)
    return out_rows, lse_rows


# ----------------------------------------------------------------------------------------------------------
# Random calls covering causal, windows, GQA, paged, varlen, leftpad and softcap
# ----------------------------------------------------------------------------------------------------------


@st.composite
def attention_calls(draw):
    b = draw(st.integers(1, 3))
    hk = draw(st.integers(1, 2))
    h = hk * draw(st.integers(1, 3))
    d, dv = draw(st.sampled_from([4, 8])), draw(st.sampled_from([3, 4]))
    varlen, paged = draw(st.booleans()), draw(st.booleans())
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if varlen:
        lengths = [draw(st.integers(0, 4)) for _ in range(b)]
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        q = torch.randn(cu[-1], h, d, generator=g, dtype=torch.float64)
        extra = dict(cu_seqlens_q=torch.tensor(cu, dtype=I32), max_seqlen_q=max(lengths) + draw(st.integers(0, 1)))
        q_rows = list(zip(cu[:-1], lengths))
    else:
        sq = draw(st.integers(1, 4))
        q = torch.randn(b, sq, h, d, generator=g, dtype=torch.float64)
        extra, q_rows = {}, [(0, sq)] * b
    if paged:
        page_size, max_pages = draw(st.integers(1, 3)), draw(st.integers(1, 4))
        num_pages = draw(st.integers(1, 6))
        k = torch.randn(num_pages, page_size, hk, d, generator=g, dtype=torch.float64)
        v = torch.randn(num_pages, page_size, hk, dv, generator=g, dtype=torch.float64)
        page_table = torch.randint(0, num_pages, (b, max_pages), generator=g, dtype=I32)
        capacity = max_pages * page_size
        extra["page_table"] = page_table
    else:
        capacity = draw(st.integers(0, 9))
        k = torch.randn(b, capacity, hk, d, generator=g, dtype=torch.float64)
        v = torch.randn(b, capacity, hk, dv, generator=g, dtype=torch.float64)
        page_table = None
    seqlens = [draw(st.integers(0, capacity)) for _ in range(b)]
    leftpads = [draw(st.integers(0, n)) if draw(st.booleans()) else 0 for n in seqlens]
    extra["cache_seqlens"] = torch.tensor(seqlens, dtype=I32)
    if any(leftpads):
        extra["cache_leftpad"] = torch.tensor(leftpads, dtype=I32)
    causal = draw(st.booleans())
    window = (draw(st.integers(-1, 4)), draw(st.integers(-1, 3)))
    softcap = draw(st.sampled_from([0.0, 0.0, 0.7, 3.0]))
    scale = draw(st.sampled_from([None, 0.3]))
    kwargs = dict(extra, causal=causal, window_size=window, softcap=softcap, softmax_scale=scale)
    naive_args = dict(seqlens=seqlens, leftpads=leftpads, q_rows=q_rows, page_table=page_table, causal=causal,
                      window=window, softcap=softcap, scale=scale if scale is not None else d ** -0.5)
    return q, k, v, kwargs, naive_args


def _assert_matches_naive(out, lse, naive_out, naive_lse, q_rows, varlen):
    for (bi, head, i), expected in naive_out.items():
        row = q_rows[bi][0] + i
        got_out = out[row, head] if varlen else out[bi, i, head]
        got_lse = lse[head, row] if varlen else lse[bi, head, i]
        torch.testing.assert_close(got_out, expected, atol=1e-10, rtol=1e-10)
        expected_lse = naive_lse[bi, head, i]
        if math.isinf(expected_lse):
            assert float(got_lse) == expected_lse
        else:
            assert float(got_lse) == pytest.approx(expected_lse, abs=1e-10)


@settings(max_examples=80, deadline=None)
@given(attention_calls())
def test_attention_matches_naive_loop(case):
    q, k, v, kwargs, naive_args = case
    out, lse = attention(q, k, v, **kwargs)
    naive_out, naive_lse = naive_attention(q, k, v, **naive_args)
    varlen = "cu_seqlens_q" in kwargs
    if k.shape[1] == 0:  # FA3's empty-cache call: handled by test_call_without_key_slots
        return
    _assert_matches_naive(out, lse, naive_out, naive_lse, naive_args["q_rows"], varlen)


# ----------------------------------------------------------------------------------------------------------
# FA3 conventions
# ----------------------------------------------------------------------------------------------------------


def test_visibility_mask_matches_fa3_docstring_examples():
    assert visibility_mask(2, 5, causal=True).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert visibility_mask(5, 2, causal=True).int().tolist() == [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]


def test_visibility_mask_window_is_inclusive_band_around_bottom_right_diagonal():
    # Lq=3, Lk=6: row i is aligned with key i+3; window (1, 1) keeps keys i+2..i+4.
    mask = visibility_mask(3, 6, window_size=(1, 1))
    assert mask.int().tolist() == [[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1]]


def test_causal_keeps_left_window():
    assert torch.equal(visibility_mask(3, 6, causal=True, window_size=(1, 5)),
                       visibility_mask(3, 6, window_size=(1, 0)))


def test_rows_without_visible_keys_give_zero_and_neg_inf():
    q = torch.randn(1, 5, 2, 4, dtype=torch.float64)
    k = torch.randn(1, 2, 1, 4, dtype=torch.float64)
    v = torch.randn(1, 2, 1, 3, dtype=torch.float64)
    out, lse = attention(q, k, v, causal=True)  # Lq=5 > Lk=2: rows 0..2 see nothing
    assert torch.equal(out[0, :3], torch.zeros(3, 2, 3, dtype=torch.float64))
    assert torch.isneginf(lse[0, :, :3]).all()
    assert torch.isfinite(lse[0, :, 3:]).all()


def test_sequence_with_zero_cache_length_gives_zero_and_neg_inf():
    q = torch.randn(2, 3, 2, 4, dtype=torch.float64)
    k = torch.randn(2, 5, 2, 4, dtype=torch.float64)
    v = torch.randn(2, 5, 2, 4, dtype=torch.float64)
    out, lse = attention(q, k, v, cache_seqlens=torch.tensor([0, 5], dtype=I32))
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.isneginf(lse[0]).all()
    assert torch.isfinite(lse[1]).all()


def test_call_without_key_slots_gives_zero_and_pos_inf():
    q = torch.randn(2, 3, 4, 8, dtype=torch.bfloat16)
    k = torch.empty(2, 0, 2, 8, dtype=torch.bfloat16)
    out, lse = attention(q, k, k.clone())
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isposinf(lse).all() and lse.shape == (2, 4, 3)


def test_all_zero_lengths_over_nonempty_cache_gives_neg_inf_not_pos_inf():
    # FA3 decides the +inf case on the cache tensor's shape; zero cache_seqlens run the kernel.
    q = torch.randn(2, 1, 2, 4, dtype=torch.float64)
    k = torch.randn(2, 3, 2, 4, dtype=torch.float64)
    out, lse = attention(q, k, k.clone(), cache_seqlens=0)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_output_shapes_and_dtypes_follow_fa3():
    q = torch.randn(2, 3, 4, 8, dtype=torch.bfloat16)
    k = torch.randn(2, 5, 2, 8, dtype=torch.bfloat16)
    v = torch.randn(2, 5, 2, 6, dtype=torch.bfloat16)
    out, lse = attention(q, k, v)
    assert out.shape == (2, 3, 4, 6) and out.dtype == torch.bfloat16
    assert lse.shape == (2, 4, 3) and lse.dtype == torch.float32
    qv = torch.randn(7, 4, 8, dtype=torch.bfloat16)
    out, lse = attention(qv, k, v, cu_seqlens_q=torch.tensor([0, 3, 7], dtype=I32), max_seqlen_q=4)
    assert out.shape == (7, 4, 6) and lse.shape == (4, 7)


def test_default_scale_is_inverse_sqrt_head_dim():
    q, k = torch.randn(1, 2, 1, 16, dtype=torch.float64), torch.randn(1, 4, 1, 16, dtype=torch.float64)
    default = attention(q, k, k)
    explicit = attention(q, k, k, softmax_scale=0.25)
    torch.testing.assert_close(default, explicit, rtol=0, atol=0)


def test_gqa_query_head_reads_kv_head_by_integer_division():
    q = torch.randn(1, 2, 6, 4, dtype=torch.float64)
    k = torch.randn(1, 5, 2, 4, dtype=torch.float64)
    v = torch.randn(1, 5, 2, 3, dtype=torch.float64)
    out, lse = attention(q, k, v)
    expanded = attention(q, k.repeat_interleave(3, dim=2), v.repeat_interleave(3, dim=2))
    torch.testing.assert_close((out, lse), expanded, rtol=0, atol=0)


def test_paged_cache_equals_contiguous_cache():
    g = torch.Generator().manual_seed(3)
    b, capacity, page_size, hk, d = 2, 8, 2, 2, 4
    k = torch.randn(b, capacity, hk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, capacity, hk, d, generator=g, dtype=torch.float64)
    order = torch.randperm(b * capacity // page_size, generator=g)
    k_pages = k.reshape(-1, page_size, hk, d)[order]
    v_pages = v.reshape(-1, page_size, hk, d)[order]
    page_table = torch.argsort(order).reshape(b, -1).to(I32)  # logical page -> its physical slot
    q = torch.randn(b, 3, 4, d, generator=g, dtype=torch.float64)
    kw = dict(cache_seqlens=torch.tensor([7, 5], dtype=I32), cache_leftpad=torch.tensor([2, 0], dtype=I32),
              causal=True)
    torch.testing.assert_close(attention(q, k_pages, v_pages, page_table=page_table, **kw),
                               attention(q, k, v, **kw), rtol=0, atol=0)


def test_leftpad_shifts_the_first_visible_key():
    q = torch.randn(1, 2, 1, 4, dtype=torch.float64)
    k = torch.randn(1, 6, 1, 4, dtype=torch.float64)
    padded = attention(q, k, k, cache_seqlens=6, cache_leftpad=torch.tensor([2], dtype=I32), causal=True)
    trimmed = attention(q, k[:, 2:], k[:, 2:], causal=True)
    torch.testing.assert_close(padded, trimmed, rtol=0, atol=0)


def test_attention_rows_empty_key_set():
    out, lse = attention_rows(torch.randn(3, 4), torch.randn(0, 4), torch.randn(0, 2),
                              torch.ones(3, 0, dtype=torch.bool), 1.0)
    assert torch.equal(out, torch.zeros(3, 2, dtype=torch.float64)) and torch.isneginf(lse).all()


# ----------------------------------------------------------------------------------------------------------
# Input validation: every bad input class raises ValueError naming the argument
# ----------------------------------------------------------------------------------------------------------


def _good_call():
    q = torch.randn(2, 3, 4, 8)
    k = torch.randn(2, 6, 2, 8)
    v = torch.randn(2, 6, 2, 5)
    return dict(q=q, k_cache=k, v_cache=v)


def _paged_call():
    call = _good_call()
    call["k_cache"], call["v_cache"] = torch.randn(5, 2, 2, 8), torch.randn(5, 2, 2, 5)
    call["page_table"] = torch.tensor([[0, 1, 2], [3, 4, 0]], dtype=I32)
    return call


def _varlen_call():
    call = _good_call()
    call["q"] = torch.randn(7, 4, 8)
    call["cu_seqlens_q"] = torch.tensor([0, 3, 7], dtype=I32)
    call["max_seqlen_q"] = 4
    return call


BAD_INPUTS = {
    "kv_dtype_differs": (_good_call, lambda c: c.update(k_cache=c["k_cache"].double()), "k_cache"),
    "v_dtype_differs": (_good_call, lambda c: c.update(v_cache=c["v_cache"].half()), "v_cache"),
    "heads_not_divisible": (_good_call, lambda c: c.update(k_cache=torch.randn(2, 6, 3, 8),
                                                           v_cache=torch.randn(2, 6, 3, 5)), "k_cache"),
    "head_dim_differs": (_good_call, lambda c: c.update(k_cache=torch.randn(2, 6, 2, 4)), "k_cache"),
    "v_shape_differs": (_good_call, lambda c: c.update(v_cache=torch.randn(2, 5, 2, 5)), "v_cache"),
    "kv_batch_differs": (_good_call, lambda c: c.update(k_cache=torch.randn(3, 6, 2, 8),
                                                        v_cache=torch.randn(3, 6, 2, 5)), "k_cache"),
    "q_rank": (_good_call, lambda c: c.update(q=torch.randn(2, 3, 4)), "q"),
    "negative_length": (_good_call, lambda c: c.update(cache_seqlens=torch.tensor([-1, 2], dtype=I32)),
                        "cache_seqlens"),
    "length_beyond_capacity": (_good_call, lambda c: c.update(cache_seqlens=7), "cache_seqlens"),
    "length_dtype": (_good_call, lambda c: c.update(cache_seqlens=torch.tensor([1, 2])), "cache_seqlens"),
    "length_shape": (_good_call, lambda c: c.update(cache_seqlens=torch.tensor([1], dtype=I32)), "cache_seqlens"),
    "leftpad_beyond_length": (_good_call, lambda c: c.update(cache_seqlens=3,
                                                             cache_leftpad=torch.tensor([4, 0], dtype=I32)),
                              "cache_leftpad"),
    "negative_leftpad": (_good_call, lambda c: c.update(cache_leftpad=torch.tensor([-1, 0], dtype=I32)),
                         "cache_leftpad"),
    "page_out_of_range": (_paged_call, lambda c: c["page_table"].__setitem__((1, 0), 5), "page_table"),
    "negative_page": (_paged_call, lambda c: c["page_table"].__setitem__((0, 2), -1), "page_table"),
    "page_table_dtype": (_paged_call, lambda c: c.update(page_table=c["page_table"].long()), "page_table"),
    "page_table_batch": (_paged_call, lambda c: c.update(page_table=c["page_table"][:1]), "page_table"),
    "paged_length_beyond_capacity": (_paged_call, lambda c: c.update(cache_seqlens=7), "cache_seqlens"),
    "cu_seqlens_decreasing": (_varlen_call, lambda c: c.update(cu_seqlens_q=torch.tensor([0, 5, 3, 7], dtype=I32)),
                              "cu_seqlens_q"),
    "cu_seqlens_short_of_total": (_varlen_call, lambda c: c.update(cu_seqlens_q=torch.tensor([0, 3, 6], dtype=I32)),
                                  "cu_seqlens_q"),
    "max_seqlen_missing": (_varlen_call, lambda c: c.update(max_seqlen_q=None), "max_seqlen_q"),
    "max_seqlen_too_small": (_varlen_call, lambda c: c.update(max_seqlen_q=3), "max_seqlen_q"),
    "negative_softcap": (_good_call, lambda c: c.update(softcap=-1.0), "softcap"),
    "window_not_pair": (_good_call, lambda c: c.update(window_size=(1, 2, 3)), "window_size"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_raises_value_error_naming_argument(case):
    make, mutate, argument = BAD_INPUTS[case]
    call = make()
    attention(**call)  # the unmodified call is valid
    mutate(call)
    with pytest.raises(ValueError, match=rf"^{argument}\b"):
        attention(**call)


def test_range_errors_state_the_allowed_range():
    call = _good_call()
    with pytest.raises(ValueError, match=r"\[0, 6\]"):
        attention(**call, cache_seqlens=9)
    paged = _paged_call()
    paged["page_table"][0, 0] = 9
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        attention(**paged)
