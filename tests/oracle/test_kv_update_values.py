"""Pins of ``refmodel.kv_update`` on hand-worked inputs: what FA3 does to a ``flash_attn_with_kvcache`` call's
inputs before attention. Sources, Dao-AILab/flash-attention at 0251105a:

* ``hopper/rotary.h`` 36-37 (interleaved: pairs ``(2i, 2i+1)``) and 70-71 (contiguous: pairs ``(i, i + rotary_dim/2)``),
  ``real = x0 cos - x1 sin``, ``imag = x0 sin + x1 cos`` in float32 (``make_tensor_like<float>``, 28-32, 60-66).
* ``hopper/flash_api.cpp`` 1056 (``rotary_dim = rotary_cos.size(1) * 2``), 703 (interleaved combines 0 & 1, else
  0 & rotary_dim / 2), 694-696 and 1119 (descales are ``(b, h_k)``).
* ``hopper/flash_attn_interface.py`` 985-989 (keys at ``cache_seqlens, cache_seqlens + 1, ...``; queries likewise
  when causal or local, else all at ``cache_seqlens``), 975 and 1023-1024 (k/v written into the cache in place,
  starting at ``cache_seqlens``).
* ``hopper/seqlen.h`` 89 (``seqlen_rotary = seqlens_rotary[b]`` when given, else ``seqlen_k_og + leftpad_k``).
* ``hopper/paged_kv.h`` 145-148 (row ``r`` lives in page ``page_table[b, r // page_size]``, slot ``r % page_size``).
"""

from __future__ import annotations

import pytest
import torch

from refmodel.kv_update import append_kv, dequantize, rotary_positions_k, rotary_positions_q, rotate


def _cos_sin(rows):
    """cos/sin tables ``(seqlen_ro, half)`` with exact small values so every product is exact."""
    c = torch.tensor(rows[0], dtype=torch.float32)
    s = torch.tensor(rows[1], dtype=torch.float32)
    return c, s


# --- rotary positions (flash_attn_interface.py 985-989) ---------------------------------------------------

def test_key_positions_start_at_seqlen_rotary():
    assert rotary_positions_k(5, 3).tolist() == [5, 6, 7]
    assert rotary_positions_k(0, 2).tolist() == [0, 1]
    assert rotary_positions_k(4, 0).tolist() == []
    assert rotary_positions_k(5, 3).dtype == torch.int64


def test_query_positions_causal_or_local_step_by_row():
    p = rotary_positions_q(7, 3, True)
    assert p.tolist() == [7, 8, 9] and p.dtype == torch.int64


def test_query_positions_not_causal_all_at_seqlen_rotary():
    p = rotary_positions_q(7, 3, False)
    assert p.tolist() == [7, 7, 7] and p.dtype == torch.int64
    assert rotary_positions_q(2, 0, False).tolist() == []


# --- rotate (rotary.h 36-37, 70-71) -----------------------------------------------------------------------

# x: 1 row, 1 head, d = 6, rotary_dim = 4 (half = 2), channels 4..5 pass through.
X = [[[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]]
# position 0: cos 1, sin 0 (identity); position 1: cos (0, 0.5), sin (1, 2)
COS = [[1.0, 1.0], [0.0, 0.5]]
SIN = [[0.0, 0.0], [1.0, 2.0]]


def test_rotate_interleaved_pairs_adjacent_channels():
    c, s = _cos_sin((COS, SIN))
    y = rotate(torch.tensor(X), c, s, torch.tensor([1]), True)
    # pair (1, 2) with cos 0, sin 1: (1*0 - 2*1, 1*1 + 2*0) = (-2, 1)
    # pair (3, 4) with cos .5, sin 2: (3*.5 - 4*2, 3*2 + 4*.5) = (-6.5, 8)
    assert y.tolist() == [[[-2.0, 1.0, -6.5, 8.0, 5.0, 6.0]]]
    assert y.dtype == torch.float32


def test_rotate_contiguous_pairs_halves():
    c, s = _cos_sin((COS, SIN))
    y = rotate(torch.tensor(X), c, s, torch.tensor([1]), False)
    # pairs (x0, x2) = (1, 3) with cos 0, sin 1: (1*0 - 3*1, 1*1 + 3*0) = (-3, 1)
    #       (x1, x3) = (2, 4) with cos .5, sin 2: (2*.5 - 4*2, 2*2 + 4*.5) = (-7, 6)
    assert y.tolist() == [[[-3.0, -7.0, 1.0, 6.0, 5.0, 6.0]]]


def test_rotate_each_row_reads_its_own_position_and_heads_share_it():
    c, s = _cos_sin((COS, SIN))
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]],
                      [[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]]])
    y = rotate(x, c, s, torch.tensor([0, 1]), True)
    assert y[0].tolist() == x[0].tolist()                      # position 0 is the identity
    assert y[1].tolist() == [[-2.0, 1.0, -6.5, 8.0], [-1.0, 1.0, -1.5, 2.5]]


def test_rotate_positions_index_rows_of_the_table_not_the_row_number():
    c, s = _cos_sin((COS, SIN))
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]], [[1.0, 2.0, 3.0, 4.0]]])
    y = rotate(x, c, s, torch.tensor([1, 0]), False)
    assert y.tolist() == [[[-3.0, -7.0, 1.0, 6.0]], [[1.0, 2.0, 3.0, 4.0]]]
    # int32 positions (cache_seqlens are int32) index the same rows
    assert rotate(x, c, s, torch.tensor([1, 0], dtype=torch.int32), False).tolist() == y.tolist()


def test_rotate_rounds_once_to_bfloat16_after_float32_math():
    c, s = _cos_sin(([[0.5]], [[0.25]]))
    x = torch.tensor([[[3.0, 5.0]]], dtype=torch.bfloat16)
    y = rotate(x, c, s, torch.tensor([0]), True)
    # (3*.5 - 5*.25, 3*.25 + 5*.5) = (0.25, 3.25), both exact in bfloat16
    assert y.dtype == torch.bfloat16 and y.tolist() == [[[0.25, 3.25]]]
    assert x.tolist() == [[[3.0, 5.0]]]                        # the input is not rotated in place


def test_rotate_float32_input_uses_float32_products():
    # x0 = cos = 1 + 2^-12: the float32 product 1 + 2^-11 + 2^-24 ties to 1 + 2^-11, so x0 cos - x1 sin with
    # x1 = sin = 1 is 2^-11 in float32 (FA3's registers) but 2^-11 + 2^-24 if computed in float64 and rounded.
    e = 1.0 + 2.0 ** -12
    c = torch.tensor([[e]], dtype=torch.float32)
    s = torch.tensor([[1.0]], dtype=torch.float32)
    x = torch.tensor([[[e, 1.0]]], dtype=torch.float32)
    y = rotate(x, c, s, torch.tensor([0]), True)
    assert y[0, 0, 0].item() == 2.0 ** -11


def test_rotate_float64_input_keeps_float64_precision():
    e = 1.0 + 2.0 ** -40
    c = torch.tensor([[1.0]], dtype=torch.float64)
    s = torch.tensor([[0.0]], dtype=torch.float64)
    x = torch.tensor([[[e, 1.0]]], dtype=torch.float64)
    y = rotate(x, c, s, torch.tensor([0]), False)
    assert y.dtype == torch.float64 and y[0, 0, 0].item() == e


def test_rotate_with_no_rotary_channels_returns_a_copy():
    c = torch.zeros((3, 0))
    x = torch.tensor([[[1.0, 2.0]]])
    y = rotate(x, c, c, torch.tensor([2]), True)
    assert y.tolist() == x.tolist() and y is not x
    y[0, 0, 0] = 9.0
    assert x[0, 0, 0].item() == 1.0


def test_rotate_with_no_rows_returns_an_empty_copy():
    c, s = _cos_sin((COS, SIN))
    x = torch.zeros((0, 1, 4), dtype=torch.bfloat16)
    y = rotate(x, c, s, torch.tensor([], dtype=torch.int64), True)
    assert y.shape == (0, 1, 4) and y.dtype == torch.bfloat16 and y is not x


# --- append_kv, contiguous cache (flash_attn_interface.py 975, 1023-1024) -------------------------------

def _cache(b, s, h=1, d=2, dtype=torch.float32):
    return torch.zeros((b, s, h, d), dtype=dtype), torch.zeros((b, s, h, d), dtype=dtype)


def _rows(vals, h=1, d=2, dtype=torch.float32):
    return torch.tensor(vals, dtype=dtype).reshape(len(vals), 1, 1).expand(len(vals), h, d).clone()


def test_append_contiguous_writes_at_cache_seqlens_in_cache_row():
    kc, vc = _cache(3, 4)
    k = [_rows([1.0, 2.0]), _rows([]), _rows([7.0])]
    v = [_rows([10.0, 20.0]), _rows([]), _rows([70.0])]
    # batch 0 -> cache row 2 at 1..2; batch 1 appends nothing; batch 2 -> cache row 0 at 3 (last slot)
    append_kv(kc, vc, k, v, [1, 0, 3], [2, 1, 0])
    assert kc[:, :, 0, 0].tolist() == [[0, 0, 0, 7], [0, 0, 0, 0], [0, 1, 2, 0]]
    assert vc[:, :, 0, 1].tolist() == [[0, 0, 0, 70], [0, 0, 0, 0], [0, 10, 20, 0]]


def test_append_contiguous_continues_after_an_empty_batch():
    kc, vc = _cache(2, 2)
    append_kv(kc, vc, [_rows([]), _rows([5.0])], [_rows([]), _rows([6.0])], [0, 1], [0, 1])
    assert kc[:, :, 0, 0].tolist() == [[0, 0], [0, 5]]
    assert vc[:, :, 0, 0].tolist() == [[0, 0], [0, 6]]


def test_append_contiguous_single_key_is_written():
    kc, vc = _cache(1, 3)
    append_kv(kc, vc, [_rows([4.0])], [_rows([8.0])], [0], [0])
    assert kc[0, :, 0, 0].tolist() == [4, 0, 0] and vc[0, :, 0, 0].tolist() == [8, 0, 0]


def test_append_contiguous_converts_to_the_cache_dtype():
    kc, vc = _cache(1, 2, dtype=torch.bfloat16)
    k = [_rows([1.0 + 2.0 ** -10])]                          # rounds to 1.0 in bfloat16 (8 bits)
    v = [_rows([3.0])]
    append_kv(kc, vc, k, v, [1], [0])
    assert kc.dtype == torch.bfloat16 and kc[0, :, 0, 0].tolist() == [0.0, 1.0]
    assert vc[0, :, 0, 0].tolist() == [0.0, 3.0]


def test_append_contiguous_exactly_full_is_accepted():
    kc, vc = _cache(1, 3)
    append_kv(kc, vc, [_rows([1.0, 2.0])], [_rows([3.0, 4.0])], [1], [0])
    assert kc[0, :, 0, 0].tolist() == [0, 1, 2]


def test_append_contiguous_one_past_capacity_is_refused_whole_message():
    kc, vc = _cache(2, 3)
    with pytest.raises(ValueError) as err:
        append_kv(kc, vc, [_rows([]), _rows([1.0, 2.0])], [_rows([]), _rows([3.0, 4.0])], [0, 2], [0, 1])
    assert str(err.value) == ("cache_seqlens: batch 1 appends 2 keys at 2, past the cache's 3 slots; "
                              "allowed range is [0, 1]")
    assert kc.abs().sum().item() == 0                         # nothing written before the refusal


# --- append_kv, paged cache (paged_kv.h 145-148) ----------------------------------------------------------

def _paged(num_pages, page_size, dtype=torch.float32):
    return (torch.zeros((num_pages, page_size, 1, 2), dtype=dtype),
            torch.zeros((num_pages, page_size, 1, 2), dtype=dtype))


def test_append_paged_writes_exact_pages_and_slots():
    kc, vc = _paged(4, 2)
    table = torch.tensor([[3, 0], [1, 2]], dtype=torch.int32)
    # batch 0 uses table row 1 (pages 1, 2): positions 1, 2, 3 -> page 1 slot 1, page 2 slots 0, 1
    # batch 1 uses table row 0 (pages 3, 0): position 0 -> page 3 slot 0
    k = [_rows([1.0, 2.0, 3.0]), _rows([9.0])]
    v = [_rows([10.0, 20.0, 30.0]), _rows([90.0])]
    append_kv(kc, vc, k, v, [1, 0], [1, 0], table)
    assert kc[:, :, 0, 0].tolist() == [[0, 0], [0, 1], [2, 3], [9, 0]]
    assert vc[:, :, 0, 1].tolist() == [[0, 0], [0, 10], [20, 30], [90, 0]]


def test_append_paged_continues_after_an_empty_batch_and_single_key():
    kc, vc = _paged(2, 2)
    table = torch.tensor([[0], [1]], dtype=torch.int32)
    append_kv(kc, vc, [_rows([]), _rows([5.0])], [_rows([]), _rows([6.0])], [0, 1], [0, 1], table)
    assert kc[:, :, 0, 0].tolist() == [[0, 0], [0, 5]]
    assert vc[:, :, 0, 0].tolist() == [[0, 0], [0, 6]]


def test_append_paged_converts_to_the_cache_dtype():
    kc, vc = _paged(1, 2, dtype=torch.bfloat16)
    table = torch.tensor([[0]], dtype=torch.int32)
    append_kv(kc, vc, [_rows([1.0 + 2.0 ** -10])], [_rows([3.0])], [0], [0], table)
    assert kc.dtype == torch.bfloat16 and kc[0, :, 0, 0].tolist() == [1.0, 0.0]
    assert vc[0, :, 0, 0].tolist() == [3.0, 0.0]


def test_append_paged_exactly_full_is_accepted():
    kc, vc = _paged(2, 2)
    table = torch.tensor([[1, 0]], dtype=torch.int32)
    append_kv(kc, vc, [_rows([1.0, 2.0])], [_rows([3.0, 4.0])], [2], [0], table)
    assert kc[:, :, 0, 0].tolist() == [[1, 2], [0, 0]]


def test_append_paged_one_past_capacity_is_refused_whole_message():
    kc, vc = _paged(4, 2)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(ValueError) as err:
        append_kv(kc, vc, [_rows([]), _rows([1.0, 2.0])], [_rows([]), _rows([3.0, 4.0])], [0, 3], [0, 1], table)
    assert str(err.value) == ("cache_seqlens: batch 1 appends 2 keys at 3, past its 4 paged slots; "
                              "allowed range is [0, 2]")


def test_append_paged_page_zero_and_last_page_are_accepted():
    kc, vc = _paged(3, 1)
    table = torch.tensor([[0, 2]], dtype=torch.int32)
    append_kv(kc, vc, [_rows([1.0, 2.0])], [_rows([3.0, 4.0])], [0], [0], table)
    assert kc[:, 0, 0, 0].tolist() == [1, 0, 2]


def test_append_paged_page_past_the_last_is_refused_whole_message():
    kc, vc = _paged(3, 1)
    table = torch.tensor([[0, 3]], dtype=torch.int32)
    with pytest.raises(ValueError) as err:
        append_kv(kc, vc, [_rows([1.0, 2.0])], [_rows([3.0, 4.0])], [0], [0], table)
    assert str(err.value) == "page_table: pages written for batch 0 must lie in [0, 3), got [0, 3]"
    assert kc.abs().sum().item() == 0


def test_append_paged_negative_page_is_refused_whole_message():
    kc, vc = _paged(3, 2)
    table = torch.tensor([[1, -1]], dtype=torch.int32)
    with pytest.raises(ValueError) as err:
        append_kv(kc, vc, [_rows([1.0, 2.0])], [_rows([3.0, 4.0])], [1], [0], table)
    assert str(err.value) == "page_table: pages written for batch 0 must lie in [0, 3), got [1, -1]"


def test_append_paged_only_pages_written_are_checked():
    # the table's unused entry 7 is out of range, but FA3 reads only the pages the new keys land in
    kc, vc = _paged(2, 2)
    table = torch.tensor([[1, 7]], dtype=torch.int32)
    append_kv(kc, vc, [_rows([4.0])], [_rows([5.0])], [1], [0], table)
    assert kc[:, :, 0, 0].tolist() == [[0, 0], [0, 4]]


# --- dequantize (flash_api.cpp 694-696, 1119: descales are (b, h_k)) -----------------------------------

def test_dequantize_without_descale_is_float64_copy():
    x = torch.tensor([[[1.5, -2.0]]], dtype=torch.bfloat16)
    y = dequantize(x, None, torch.tensor([0]), 1)
    assert y.dtype == torch.float64 and y.tolist() == [[[1.5, -2.0]]]


def test_dequantize_scales_per_batch_and_kv_head_with_groups():
    # 4 query heads, group 2 -> KV heads 0, 0, 1, 1; rows of batches 1 and 0
    x = torch.ones((2, 4, 1), dtype=torch.float32)
    descale = torch.tensor([[2.0, 3.0], [5.0, 7.0]], dtype=torch.float32)
    y = dequantize(x, descale, torch.tensor([1, 0]), 2)
    assert y.dtype == torch.float64
    assert y[:, :, 0].tolist() == [[5.0, 5.0, 7.0, 7.0], [2.0, 2.0, 3.0, 3.0]]


def test_dequantize_group_one_and_float8_input():
    x = torch.tensor([[[2.0, 0.5], [4.0, 1.0]]], dtype=torch.float32).to(torch.float8_e4m3fn)
    descale = torch.tensor([[0.5, 3.0]], dtype=torch.float32)
    y = dequantize(x, descale, torch.tensor([0]), 1)
    assert y.tolist() == [[[1.0, 0.25], [12.0, 3.0]]]


def test_dequantize_multiplies_in_float64():
    # 1 + 2^-20 times descale 1 + 2^-20: exact in float64, not in float32
    e = 1.0 + 2.0 ** -20
    x = torch.tensor([[[e]]], dtype=torch.float32)
    y = dequantize(x, torch.tensor([[e]], dtype=torch.float32), torch.tensor([0]), 1)
    assert y.item() == e * e


def test_rotate_bfloat16_tables_are_widened_to_float32_before_the_math():
    # FA3 requires cos/sin in q's dtype (flash_api.cpp 1064) and widens both to float32 (rotary.h 28-32):
    # x0 = 1 + 2^-7, cos = 1 + 2^-6, x1 = sin = 1: x0 cos - x1 sin = 3 * 2^-7 + 2^-13 in float32, which bfloat16
    # holds exactly; the same products rounded to bfloat16 first would give 3 * 2^-7.
    c = torch.tensor([[1.0 + 2.0 ** -6]], dtype=torch.bfloat16)
    s = torch.tensor([[1.0]], dtype=torch.bfloat16)
    x = torch.tensor([[[1.0 + 2.0 ** -7, 1.0]]], dtype=torch.bfloat16)
    y = rotate(x, c, s, torch.tensor([0]), True)
    assert y.dtype == torch.bfloat16 and y[0, 0, 0].item() == 3 * 2.0 ** -7 + 2.0 ** -13


def test_rotate_float8_query_and_tables_are_widened_to_float32():
    # FP8 e4m3 is one of FA3's q types (flash_api.cpp 548-549) and cos/sin share q's dtype (1064); both are widened
    # to float32 (rotary.h 28-32): (1 * .5 - 2 * .25, 1 * .25 + 2 * .5) = (0, 1.25), exact in e4m3.
    f8 = torch.float8_e4m3fn
    c = torch.tensor([[0.5]]).to(f8)
    s = torch.tensor([[0.25]]).to(f8)
    x = torch.tensor([[[1.0, 2.0, 3.0]]]).to(f8)
    for interleaved in (True, False):
        y = rotate(x, c, s, torch.tensor([0]), interleaved)
        assert y.dtype == f8 and y.float().tolist() == [[[0.0, 1.25, 3.0]]]
