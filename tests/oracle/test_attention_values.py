"""Pins of refmodel.attention: every refusal's whole message, and the oracle's conventions at their edges.

Source: `hopper/flash_api.cpp` (mha_fwd's checks; the model is stricter where FA3 would read out of bounds, and
says so in refmodel/attention.py), `hopper/mask.h` (bottom-right aligned masks), `hopper/seqlen.h` (leftpad).
A message names the argument, the allowed range and what was given: the project's rule for bad input.
"""


import pytest
import torch

from refmodel.attention import attention, visibility_mask
from oracle.test_attention import BAD_INPUTS, I32, _good_call, _paged_call, _varlen_call

MORE_BAD_INPUTS = {
 "q_not_tensor": (_good_call, lambda c: c.update(q=[1.0])),
 "k_not_tensor": (_good_call, lambda c: c.update(k_cache=None)),
 "v_not_tensor": (_good_call, lambda c: c.update(v_cache=3)),
 "varlen_q_rank": (_varlen_call, lambda c: c.update(q=torch.randn(7, 4, 8, 1))),
 "k_rank": (_good_call, lambda c: c.update(k_cache=torch.randn(2, 6, 8))),
 "paged_k_rank": (_paged_call, lambda c: c.update(k_cache=torch.randn(5, 2, 8))),
 "v_rank": (_good_call, lambda c: c.update(v_cache=torch.randn(2, 6, 5))),
 "q_int": (_good_call, lambda c: c.update(q=torch.zeros(2, 3, 4, 8, dtype=torch.int32))),
 "no_kv_heads": (_good_call, lambda c: c.update(k_cache=torch.randn(2, 6, 0, 8), v_cache=torch.randn(2, 6, 0, 5))),
 "cu_not_tensor": (_varlen_call, lambda c: c.update(cu_seqlens_q=[0, 3, 7])),
 "cu_2d": (_varlen_call, lambda c: c.update(cu_seqlens_q=torch.tensor([[0, 3, 7]], dtype=I32))),
 "cu_empty": (_varlen_call, lambda c: c.update(cu_seqlens_q=torch.tensor([], dtype=I32))),
 "cu_dtype": (_varlen_call, lambda c: c.update(cu_seqlens_q=torch.tensor([0, 3, 7]))),
 "cu_start": (_varlen_call, lambda c: c.update(cu_seqlens_q=torch.tensor([1, 3, 7], dtype=I32))),
 "page_table_not_tensor": (_paged_call, lambda c: c.update(page_table=[[0, 1]])),
 "page_table_1d": (_paged_call, lambda c: c.update(page_table=torch.tensor([0, 1], dtype=I32))),
 "length_not_tensor": (_good_call, lambda c: c.update(cache_seqlens=[1, 2])),
 "length_bool": (_good_call, lambda c: c.update(cache_seqlens=True)),
 "leftpad_dtype": (_good_call, lambda c: c.update(cache_leftpad=torch.tensor([0, 0]))),
 "softcap_none": (_good_call, lambda c: c.update(softcap=None)),
 "softcap_nan": (_good_call, lambda c: c.update(softcap=float("nan"))),
 "window_single": (_good_call, lambda c: c.update(window_size=(1,))),
}

MESSAGES = {
    'cu_2d': 'cu_seqlens_q: must be a 1-D torch.int32 tensor of length b + 1 >= 1',
    'cu_dtype': 'cu_seqlens_q: must have dtype torch.int32 (as FA3 requires), got torch.int64',
    'cu_empty': 'cu_seqlens_q: must be a 1-D torch.int32 tensor of length b + 1 >= 1',
    'cu_not_tensor': 'cu_seqlens_q: must be a 1-D torch.int32 tensor of length b + 1 >= 1',
    'cu_seqlens_decreasing': 'cu_seqlens_q: must be non-decreasing (every sequence length >= 0), got [0, 5, 3, 7]',
    'cu_seqlens_short_of_total': 'cu_seqlens_q: must start at 0 and end at total_q=7, got 0..6',
    'cu_start': 'cu_seqlens_q: must start at 0 and end at total_q=7, got 1..7',
    'head_dim_differs': "k_cache: head dim must equal q's head dim 8, got 4",
    'heads_not_divisible': "k_cache: KV head count must be >= 1 and divide q's head count 4, got 3",
    'k_not_tensor': 'k_cache: must be a tensor, got NoneType',
    'k_rank': 'k_cache: must be (b, seqlen_k, h_k, d), got shape (2, 6, 8)',
    'kv_batch_differs': 'k_cache: batch dim must equal the batch size 2, got 3',
    'kv_dtype_differs': "k_cache: dtype must equal q's dtype torch.float32, got torch.float64",
    'leftpad_beyond_length': 'cache_leftpad: every entry must lie in [0, cache_seqlens] = [0, 3], got 4',
    'leftpad_dtype': 'cache_leftpad: must have dtype torch.int32 (as FA3 requires), got torch.int64',
    'length_beyond_capacity': 'cache_seqlens: every length must lie in [0, 6] (the cache capacity), got 7',
    'length_bool': 'cache_seqlens: must be a torch.int32 tensor of shape (2,), got bool',
    'length_dtype': 'cache_seqlens: must have dtype torch.int32 (as FA3 requires), got torch.int64',
    'length_not_tensor': 'cache_seqlens: must be a torch.int32 tensor of shape (2,), got list',
    'length_shape': 'cache_seqlens: must have shape (2,), got (1,)',
    'max_seqlen_missing': 'max_seqlen_q: must be given when cu_seqlens_q is given (FA3 requires it)',
    'max_seqlen_too_small': 'max_seqlen_q: must be >= the longest sequence (4) in [4, inf), got 3',
    'negative_leftpad': 'cache_leftpad: every entry must lie in [0, cache_seqlens] = [0, 6], got -1',
    'negative_length': 'cache_seqlens: every length must lie in [0, 6] (the cache capacity), got -1',
    'negative_page': 'page_table: pages read for batch 0 must lie in [0, 5), got [0, 0, 1, 1, -1, -1]',
    'negative_softcap': 'softcap: must be >= 0 (0 disables), got -1.0',
    'no_kv_heads': "k_cache: KV head count must be >= 1 and divide q's head count 4, got 0",
    'page_out_of_range': 'page_table: pages read for batch 1 must lie in [0, 5), got [5, 5, 4, 4, 0, 0]',
    'page_table_1d': 'page_table: must be a 2-D torch.int32 tensor (b, max_pages_per_seq)',
    'page_table_batch': 'page_table: first dim must equal the batch size 2, got 1',
    'page_table_dtype': 'page_table: must have dtype torch.int32 (as FA3 requires), got torch.int64',
    'page_table_not_tensor': 'page_table: must be a 2-D torch.int32 tensor (b, max_pages_per_seq)',
    'paged_k_rank': 'k_cache: must be (num_pages, page_size, h_k, d), got shape (5, 2, 8)',
    'paged_length_beyond_capacity': 'cache_seqlens: every length must lie in [0, 6] (the cache capacity), got 7',
    'q_int': 'q: must have a floating dtype, got torch.int32',
    'q_not_tensor': 'q: must be a tensor, got list',
    'q_rank': 'q: must be (b, seqlen_q, h, d), got shape (2, 3, 4)',
    'softcap_nan': 'softcap: must be >= 0 (0 disables), got nan',
    'softcap_none': 'softcap: must be >= 0 (0 disables), got None',
    'v_dtype_differs': "v_cache: dtype must equal q's dtype torch.float32, got torch.float16",
    'v_not_tensor': 'v_cache: must be a tensor, got int',
    'v_rank': 'v_cache: must be (b, seqlen_k, h_k, d), got shape (2, 6, 5)',
    'v_shape_differs': "v_cache: leading dims must equal k_cache's (2, 6, 2), got (2, 5, 2)",
    'varlen_q_rank': 'q: must be (total_q, h, d) with cu_seqlens_q, got shape (7, 4, 8, 1)',
    'window_not_pair': 'window_size: must be a pair (left, right), got (1, 2, 3)',
    'window_single': 'window_size: must be a pair (left, right), got (1,)',
}


@pytest.mark.parametrize("case", sorted(MESSAGES))
def test_each_refusal_says_the_argument_the_range_and_the_value(case):
    make, mutate = (BAD_INPUTS[case][:2] if case in BAD_INPUTS else MORE_BAD_INPUTS[case])
    call = make()
    attention(**call)  # the unmodified call is valid
    mutate(call)
    with pytest.raises(ValueError) as info:
        attention(**call)
    assert str(info.value) == MESSAGES[case]


def test_mask_lengths_must_be_non_negative():
    with pytest.raises(ValueError) as info:
        visibility_mask(-1, 2)
    assert str(info.value) == "seqlen: lengths must be >= 0, got seqlen_q=-1, seqlen_k=2"
    with pytest.raises(ValueError) as info:
        visibility_mask(2, -1)
    assert str(info.value) == "seqlen: lengths must be >= 0, got seqlen_q=2, seqlen_k=-1"
    assert visibility_mask(0, 0).shape == (0, 0)


def test_the_defaults_are_fa3_s_no_mask_no_softcap():
    # flash_attn_with_kvcache's defaults: causal=False, softcap=0.0 (hopper/flash_attn_interface.py)
    from refmodel.attention import attention_rows, resolve_attention_call
    call = _good_call()
    out, lse = attention(**call)
    out_explicit, lse_explicit = attention(**call, causal=False, softcap=0.0)
    assert torch.equal(out, out_explicit) and torch.equal(lse, lse_explicit)
    assert not torch.equal(out, attention(**call, causal=True)[0])       # the mask matters for this call (sq 3)
    resolved = resolve_attention_call(call["q"], call["k_cache"], call["v_cache"])
    assert resolved.causal is False and resolved.softcap == 0.0
    q, k, v = torch.randn(2, 4), torch.randn(3, 4) * 20, torch.randn(3, 2)
    visible = torch.ones(2, 3, dtype=torch.bool)
    assert torch.equal(attention_rows(q, k, v, visible, 1.0)[0], attention_rows(q, k, v, visible, 1.0, softcap=0.0)[0])
    assert not torch.equal(attention_rows(q, k, v, visible, 1.0)[0], attention_rows(q, k, v, visible, 1.0, softcap=1.0)[0])


def test_the_resolved_call_carries_the_call_s_layout():
    from refmodel.attention import resolve_attention_call
    call = _good_call()                       # q (2, 3, 4, 8), k (2, 6, 2, 8), v (2, 6, 2, 5)
    r = resolve_attention_call(call["q"], call["k_cache"], call["v_cache"], causal=True, window_size=(4, -1))
    assert (r.varlen, r.batch_size, r.seqlen_q, r.total_q) == (False, 2, 3, 6)
    assert (r.num_heads, r.num_heads_k, r.head_dim, r.head_dim_v, r.qhead_per_khead) == (4, 2, 8, 5, 2)
    assert (r.causal, r.window_size, r.q_dtype, r.no_keys_in_call) == (True, (4, -1), torch.float32, False)
    assert [b.row_start for b in r.batches] == [0, 0] and [b.index for b in r.batches] == [0, 1]
    v = _varlen_call()
    r = resolve_attention_call(v["q"], v["k_cache"], v["v_cache"], cu_seqlens_q=v["cu_seqlens_q"], max_seqlen_q=4)
    assert (r.varlen, r.total_q, r.seqlen_q, [b.row_start for b in r.batches]) == (True, 7, 4, [0, 3])


def test_a_varlen_call_with_no_sequence_is_empty():
    # cu_seqlens_q = [0]: b = 0, and max_seqlen_q = 0 covers the (absent) longest sequence
    q = torch.randn(0, 4, 8)
    k, v = torch.randn(0, 6, 2, 8), torch.randn(0, 6, 2, 5)
    out, lse = attention(q, k, v, cu_seqlens_q=torch.tensor([0], dtype=I32), max_seqlen_q=0)
    assert out.shape == (0, 4, 5) and lse.shape == (4, 0)


def test_the_varlen_head_count_is_q_s_second_to_last_dim():
    # varlen q (total_q, h, d) = (7, 6, 8) over 4 KV heads: 6 % 4 != 0 is refused (8 % 4 == 0 would not be)
    v = _varlen_call()
    v.update(q=torch.randn(7, 6, 8), k_cache=torch.randn(2, 6, 4, 8), v_cache=torch.randn(2, 6, 4, 5))
    with pytest.raises(ValueError) as info:
        attention(**v)
    assert str(info.value) == "k_cache: KV head count must be >= 1 and divide q's head count 6, got 4"


def test_each_batch_s_lengths_are_its_query_rows_and_visible_keys():
    # hopper/seqlen.h: a batch's key count is seqused_k - leftpad_k (here cache_seqlens, no leftpad); its query rows
    # are the padded q length (non-varlen). q (2, 3, 4, 8), k (2, 6, 2, 8): d = 8 differs from every length
    from refmodel.attention import resolve_attention_call
    call = _good_call()
    r = resolve_attention_call(call["q"], call["k_cache"], call["v_cache"],
                               cache_seqlens=torch.tensor([2, 5], dtype=I32))
    assert [b.seqlen_q for b in r.batches] == [3, 3] and [b.seqlen_k for b in r.batches] == [2, 5]
    # qhead_per_khead is C++ int division (flash_api.cpp: params.h / params.h_k), an int
    assert r.qhead_per_khead == 2 and type(r.qhead_per_khead) is int


# Chunked local attention (hopper/mask.h, flash::round_down): row i keeps only keys of the chunk that holds its
# aligned key p = i + Lk - Lq, c <= j < c + chunk with c = floor(p / chunk) * chunk; the chunk restricts the window
# and causal masks further (an and), and attention_chunk = 0 disables it (FA3's default).
T, F = True, False


def test_the_chunk_keeps_each_row_to_the_chunk_of_its_aligned_key():
    # Lq 4, Lk 6: aligned keys 2, 3, 4, 5; chunk 4: chunks [0, 4) and [4, 8)
    assert visibility_mask(4, 6, attention_chunk=4).tolist() == [
        [T, T, T, T, F, F], [T, T, T, T, F, F], [F, F, F, F, T, T], [F, F, F, F, T, T]]
    # with causal: also j <= p
    assert visibility_mask(4, 6, causal=True, attention_chunk=4).tolist() == [
        [T, T, T, F, F, F], [T, T, T, T, F, F], [F, F, F, F, T, F], [F, F, F, F, T, T]]
    assert torch.equal(visibility_mask(4, 6, attention_chunk=0), visibility_mask(4, 6))


def test_the_chunk_start_rounds_down_for_rows_before_the_first_key():
    # Lq 3, Lk 1: aligned keys -2, -1, 0; chunk 2: floor(-1 / 2) = -1, so row 1's chunk is [-2, 0) (no key), not
    # [0, 2) as truncation would give
    assert visibility_mask(3, 1, attention_chunk=2).tolist() == [[F], [F], [T]]


def test_a_negative_chunk_is_refused_naming_the_argument():
    with pytest.raises(ValueError) as e:
        visibility_mask(2, 2, attention_chunk=-1)
    assert str(e.value) == "attention_chunk: must be >= 0 (0 disables), got -1"


def test_the_resolved_call_and_its_masks_carry_the_chunk():
    from refmodel.attention import resolve_attention_call
    call = _good_call()                       # q (2, 3, 4, 8), k (2, 6, 2, 8)
    plain = resolve_attention_call(call["q"], call["k_cache"], call["v_cache"])
    assert plain.attention_chunk == 0 and all(bool(b.visible.all()) for b in plain.batches)
    r = resolve_attention_call(call["q"], call["k_cache"], call["v_cache"], attention_chunk=2)
    assert r.attention_chunk == 2 and type(r.attention_chunk) is int
    assert all(torch.equal(b.visible, visibility_mask(3, 6, attention_chunk=2)) for b in r.batches)


def test_attention_applies_the_chunk():
    # one query row over 6 keys, chunk 4: the row keeps keys 4 and 5, the same mask as a left window of 1
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 1, 4, 8), torch.randn(2, 6, 2, 8), torch.randn(2, 6, 2, 5)
    chunked = attention(q, k, v, attention_chunk=4)
    window = attention(q, k, v, window_size=(1, -1))
    assert torch.equal(chunked[0], window[0]) and torch.equal(chunked[1], window[1])
    assert not torch.allclose(chunked[0], attention(q, k, v)[0])
