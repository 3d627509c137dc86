"""Pins of refmodel.splitkv: block ranges and per-split partials on hand-worked cases, and refusals.

Source: Dao-AILab/flash-attention `hopper/block.h` at 0251105a, `get_n_block_min_max` (lines 14-59): n_block_max
= ceil(Lk / kBlockN) clipped by `ceil((m_idx_max + Lk - Lq [+ right]) / kBlockN)` under causal/local (23-34),
n_block_min = max(0, (m_idx_min + Lk - Lq - left) / kBlockN) under local (35-45), PackGQA dividing the row span
by qhead_per_khead (27, 38), and the split's share ceil((max - min) / S) (52-54).
"""

import math

import pytest
import torch

from refmodel.splitkv import kv_block_bounds, split_block_range, split_kv


def test_split_ranges_of_ten_blocks_in_three():
    # P = ceil(10 / 3) = 4: [0, 4), [4, 8), [8, 10) (block.h 52-54)
    assert [split_block_range(0, 10, 3, s) for s in range(3)] == [(0, 4), (4, 8), (8, 10)]
    assert [split_block_range(2, 3, 4, s) for s in range(4)] == [(2, 3), (3, 3), (4, 3), (5, 3)]
    assert split_block_range(5, 5, 2, 1) == (5, 5)          # empty range: P = 0
    assert split_block_range(7, 3, 2, 1) == (7, 3)          # max <= min: P = 0
    with pytest.raises(ValueError, match=r"^num_splits: must be >= 1, got 0$"):
        split_block_range(0, 4, 0, 0)
    with pytest.raises(ValueError, match=r"^split_idx: must lie in \[0, 2\), got 2$"):
        split_block_range(0, 4, 2, 2)
    with pytest.raises(ValueError, match=r"^split_idx: must lie in \[0, 2\), got -1$"):
        split_block_range(0, 4, 2, -1)


def test_causal_and_local_block_bounds():
    # no mask: [0, ceil(1000/128) = 8)
    assert kv_block_bounds(3, 1000, 1000, 128, 128) == (0, 8)
    # causal, Lq = Lk = 1000: m-block 0 reaches row 128 -> ceil(128/128) = 1; m-block 1 -> 2
    assert kv_block_bounds(0, 1000, 1000, 128, 128, causal=True) == (0, 1)
    assert kv_block_bounds(1, 1000, 1000, 128, 128, causal=True) == (0, 2)
    # causal decode-like, Lq 100 < Lk 1000: 128 + 900 = 1028 -> 9, clipped to 8
    assert kv_block_bounds(0, 100, 1000, 128, 128, causal=True) == (0, 8)
    # local (100, 20), m-block 2: right 384 + 20 = 404 -> 4; left 256 - 100 = 156 -> 156 / 128 = 1
    assert kv_block_bounds(2, 1000, 1000, 128, 128, window_size=(100, 20)) == (1, 4)
    # a left window alone (right unbounded) only raises n_min
    assert kv_block_bounds(2, 1000, 1000, 128, 128, window_size=(100, -1)) == (1, 8)
    # causal with a left window is local: right 0
    assert kv_block_bounds(2, 1000, 1000, 128, 128, causal=True, window_size=(100, -1)) == (1, 3)
    # the left edge truncates toward zero in C: 0 - 100 = -100 -> -100 / 128 = 0
    assert kv_block_bounds(0, 1000, 1000, 128, 128, window_size=(100, 0)) == (0, 1)


def test_packgqa_divides_the_row_span():
    # qhpk 4, causal, Lq = Lk = 1000: m-block 3 rows up to 512 -> (512 - 1) / 4 + 1 = 128 -> 1 block;
    # m-block 4: (640 - 1) / 4 + 1 = 160 -> 2 blocks (block.h 27)
    assert kv_block_bounds(3, 1000, 1000, 128, 128, causal=True, qhead_per_khead=4) == (0, 1)
    assert kv_block_bounds(4, 1000, 1000, 128, 128, causal=True, qhead_per_khead=4) == (0, 2)
    # local left edge: 4 * 128 / 4 = 128 - 20 = 108 -> 0; m-block 12: 1536 / 4 = 384 - 20 = 364 -> 2 (block.h 38)
    assert kv_block_bounds(4, 1000, 1000, 128, 128, window_size=(20, 0), qhead_per_khead=4)[0] == 0
    assert kv_block_bounds(12, 1000, 1000, 128, 128, window_size=(20, 0), qhead_per_khead=4)[0] == 2
    with pytest.raises(ValueError, match=r"^block_m/block_n/qhead_per_khead: must be >= 1, got 0, 128, 1$"):
        kv_block_bounds(0, 10, 10, 0, 128)
    with pytest.raises(ValueError, match=r"got 128, 0, 1$"):
        kv_block_bounds(0, 10, 10, 128, 0)
    with pytest.raises(ValueError, match=r"got 128, 128, 0$"):
        kv_block_bounds(0, 10, 10, 128, 128, qhead_per_khead=0)


def decode_inputs(lk=4):
    # one batch, one query row, one head, d 2; q = 0 so every visible key scores 0
    q = torch.zeros(1, 1, 1, 2)
    k = torch.randn(1, lk, 1, 2)
    v = torch.arange(lk, dtype=torch.float32).reshape(1, lk, 1, 1).repeat(1, 1, 1, 2)
    return q, k, v


def test_two_splits_are_softmaxes_over_their_own_blocks():
    q, k, v = decode_inputs()
    out, lse = split_kv(q, k, v, 2, block_n=2)
    assert out.shape == (2, 1, 1, 1, 2) and lse.shape == (2, 1, 1, 1)
    # split 0 sees keys 0, 1 (values 0, 1): mean 0.5, lse ln 2; split 1 keys 2, 3: 2.5, ln 2
    assert out[:, 0, 0, 0, 0].tolist() == pytest.approx([0.5, 2.5])
    assert lse.reshape(-1).tolist() == pytest.approx([math.log(2)] * 2)
    # cache_seqlens 3: split 1 sees key 2 only
    out, lse = split_kv(q, k, v, 2, block_n=2, cache_seqlens=torch.tensor([3], dtype=torch.int32))
    assert out[:, 0, 0, 0, 0].tolist() == pytest.approx([0.5, 2.0]) and float(lse[1]) == pytest.approx(0.0)
    # 3 splits of 2 blocks: P = 1, the third split is empty: (0, -inf)
    out, lse = split_kv(q, k, v, 3, block_n=2)
    assert out[2].abs().sum() == 0 and float(lse[2]) == -math.inf
    # per-batch counts: a count of 1 puts everything in split 0
    out, lse = split_kv(q, k, v, [1], block_n=2)
    assert out.shape[0] == 1 and float(out[0, 0, 0, 0, 0]) == pytest.approx(1.5)
    assert float(lse[0]) == pytest.approx(math.log(4))


def test_lse_partial_has_a_unit_seqlen_stride():
    q = torch.zeros(2, 3, 4, 8)
    k = torch.randn(2, 16, 2, 8)
    _, lse = split_kv(q, k, k.clone(), 2, block_n=4)
    assert lse.shape == (2, 2, 3, 4) and lse.stride(2) == 1


def test_varlen_partials_follow_cu_seqlens():
    # two sequences of 1 and 2 query rows against caches of 4 keys: layout (S, total_q = 3, h, dv)
    q = torch.zeros(3, 1, 2)
    k = torch.randn(2, 4, 1, 2)
    v = torch.arange(4, dtype=torch.float32).reshape(1, 4, 1, 1).repeat(2, 1, 1, 2)
    out, lse = split_kv(q, k, v, 2, block_n=2, cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32),
                        max_seqlen_q=2, cache_seqlens=torch.tensor([4, 2], dtype=torch.int32))
    assert out.shape == (2, 3, 1, 2) and lse.shape == (2, 3, 1)
    assert out[:, 0, 0, 0].tolist() == pytest.approx([0.5, 2.5])      # batch 0: both splits
    assert out[0, 1:, 0, 0].tolist() == pytest.approx([0.5, 0.5])     # batch 1: 2 keys, all in split 0
    assert lse[1, 1:, 0].tolist() == [-math.inf, -math.inf]


def test_causal_partials_hide_future_keys():
    # Lq 2 = Lk 2, causal, block_m 1: row 0 sees key 0 only, row 1 keys 0, 1
    q = torch.zeros(1, 2, 1, 2)
    k = torch.randn(1, 2, 1, 2)
    v = torch.tensor([0.0, 1.0]).reshape(1, 2, 1, 1).repeat(1, 1, 1, 2)
    out, lse = split_kv(q, k, v, 1, block_n=1, causal=True, block_m=1, pack_gqa=False)
    assert out[0, 0, :, 0, 0].tolist() == pytest.approx([0.0, 0.5])
    assert lse[0, 0, :, 0].tolist() == pytest.approx([0.0, math.log(2)])


@pytest.mark.parametrize("num_splits, message", [
    (0, "num_splits: an int split count must lie in [1, 256] (FA3's limit), got 0"),
    (257, "num_splits: an int split count must lie in [1, 256] (FA3's limit), got 257"),
    ([1, 2], "num_splits: a per-batch vector must have length b=1, got 2"),
    ([0], "num_splits: per-batch split counts must be >= 1, got [0]"),
])
def test_split_count_refusals(num_splits, message):
    q, k, v = decode_inputs()
    with pytest.raises(ValueError) as info:
        split_kv(q, k, v, num_splits, block_n=2)
    assert str(info.value) == message
    assert split_kv(q, k, v, 256, block_n=2)[0].shape[0] == 256


def test_tile_refusals():
    q, k, v = decode_inputs()
    with pytest.raises(ValueError, match=r"^block_n/block_m: tile sizes must be >= 1, got block_n=0, block_m=128$"):
        split_kv(q, k, v, 1, block_n=0)
    with pytest.raises(ValueError, match=r"got block_n=2, block_m=0$"):
        split_kv(q, k, v, 1, block_n=2, block_m=0)


def test_packgqa_with_two_heads_per_kv_head_divides_too():
    # qhpk 2, causal, Lq = Lk = 100, kBlockM 64, kBlockN 16: m-block 0's packed rows 0..63 are sequence rows
    # (64 - 1) / 2 + 1 = 32 -> ceil(32 / 16) = 2 blocks (block.h 27); unpacked it would be ceil(64 / 16) = 4
    assert kv_block_bounds(0, 100, 100, 64, 16, causal=True, qhead_per_khead=2) == (0, 2)
    assert kv_block_bounds(0, 100, 100, 64, 16, causal=True, qhead_per_khead=1) == (0, 4)


def _prefill(lq, lk, heads=1, kv_heads=1):
    # q = 0: every visible key scores 0, so a split's partial is the mean of its visible keys' values (key index)
    q = torch.zeros(1, lq, heads, 8)
    k = torch.zeros(1, lk, kv_heads, 8)
    v = torch.arange(lk, dtype=torch.float32).reshape(1, lk, 1, 1).expand(1, lk, kv_heads, 8).clone()
    return q, k, v


def test_causal_clips_each_m_blocks_range_before_splitting():
    # Lq = Lk = 4, causal, kBlockM 2, kBlockN 1, 2 splits. m-block 1 (rows 2, 3) reaches block 4 under causal:
    # [0, 4) halves into [0, 2) and [2, 4), so row 3's split 1 holds keys 2, 3 (mean 2.5, lse ln 2). Unclipped
    # would be the same here; m-block 0 (rows 0, 1) is clipped to [0, 2): P = 1, split 1 = key 1 only, so row 1's
    # split 1 is key 1 (mean 1, lse 0) -- unclipped ([0, 4), P = 2) row 1 would see nothing in split 1.
    q, k, v = _prefill(4, 4)
    out, lse = split_kv(q, k, v, 2, block_n=1, causal=True, block_m=2, pack_gqa=False)
    assert float(out[1, 0, 1, 0, 0]) == 1.0 and float(lse[1, 0, 1, 0]) == 0.0
    assert float(out[0, 0, 1, 0, 0]) == 0.0 and float(lse[0, 0, 1, 0]) == 0.0     # split 0: key 0
    assert float(out[1, 0, 3, 0, 0]) == pytest.approx(2.5) and float(lse[1, 0, 3, 0]) == pytest.approx(math.log(2))


def test_packgqa_maps_packed_rows_to_m_blocks():
    # 2 query heads on 1 KV head, Lq = Lk = 4, causal, kBlockM 2, kBlockN 1, 3 splits.
    # Packed (the default, as FA3 forces for split kernels): packed row 2r + h is in m-block r, so m-block 2 spans
    # sequence row 2 only: (6 - 1) / 2 + 1 = 3 -> [0, 3), P = 1: row 2's split 1 is key 1 (value 1, lse 0).
    # Unpacked, rows 2 and 3 share m-block 1: [0, 4), P = ceil(4 / 3) = 2: row 2's split 1 is keys 2, 3, of which
    # it sees key 2 (value 2, lse 0).
    q, k, v = _prefill(4, 4, heads=2)
    out, lse = split_kv(q, k, v, 3, block_n=1, causal=True, block_m=2)
    assert out[1, 0, 2, :, 0].tolist() == [1.0, 1.0] and lse[1, 0, 2].tolist() == [0.0, 0.0]
    out, lse = split_kv(q, k, v, 3, block_n=1, causal=True, block_m=2, pack_gqa=False)
    assert out[1, 0, 2, :, 0].tolist() == [2.0, 2.0] and lse[1, 0, 2].tolist() == [0.0, 0.0]


def test_an_explicit_softmax_scale_reaches_the_partials():
    # one key scores q.k * scale: q = k = e0 * 2 (q.k = 4); scale 0.5 -> the lse of a one-key split is 2
    q = torch.zeros(1, 1, 1, 8)
    q[..., 0] = 2.0
    k = q.clone()
    out, lse = split_kv(q, k, k.clone(), 1, block_n=1, softmax_scale=0.5)
    assert float(lse[0, 0, 0, 0]) == pytest.approx(2.0)


def test_each_split_is_evaluated_even_after_an_empty_one():
    # an injected range function (negative controls use this hook) that leaves split 0 empty and gives split 1
    # every block: split 1 must still be computed
    q, k, v = decode_inputs()

    def last_split_takes_all(n_min, n_max, count, s):
        return (n_min, n_max) if s == count - 1 else (n_min, n_min)

    out, lse = split_kv(q, k, v, 2, block_n=2, range_fn=last_split_takes_all)
    assert float(lse[0]) == -math.inf and float(lse[1]) == pytest.approx(math.log(4))
    assert float(out[1, 0, 0, 0, 0]) == pytest.approx(1.5)


def test_an_empty_batch_has_the_given_split_count():
    # b = 0: no sequence, so S comes from the int count (or is 1 for an empty per-batch vector)
    q = torch.zeros(0, 1, 1, 8)
    k = torch.zeros(0, 4, 1, 8)
    out, lse = split_kv(q, k, k.clone(), 3, block_n=2)
    assert out.shape == (3, 0, 1, 1, 8) and lse.shape == (3, 0, 1, 1)
    out, lse = split_kv(q, k, k.clone(), [], block_n=2)
    assert out.shape == (1, 0, 1, 1, 8) and lse.shape == (1, 0, 1, 1)


@pytest.mark.parametrize("m_block, seqlen_k, block_n, window, expected", [
    # chunk 256 alone, Lq 1024, kBlockM 128: n_idx = the m-block's edge row + Lk - Lq; the right edge is
    # round_up(n_idx, 256) (flash::round_up on the floor quotient of n_idx - 1), the left round_down(n_idx, 256)
    (2, 1024, 64, (-1, -1), (4, 8)),      # rows 256..383: keys [256, 512)
    (3, 1024, 64, (-1, -1), (4, 8)),      # rows 384..511: the left edge 384 rounds down to 256
    (1, 1024, 64, (-1, -1), (0, 4)),      # right edge exactly 256: round_up(256) is 256, not 512
    (1, 1025, 64, (-1, -1), (0, 8)),      # right edge 257: round_up is 512
    # a window and a chunk: the tighter of the two on each side (block.h: min on the right, max on the left)
    (3, 1024, 32, (84, 0), (9, 16)),      # left 384 - 84 = 300 beats the chunk's 256; right 512 both
    (2, 1024, 32, (100, 0), (8, 12)),     # right 384 (window) beats the chunk's 512; left 256 (chunk) beats 156
    (3, 1024, 32, (200, 0), (8, 16)),
])
def test_a_chunk_clips_each_end_to_the_aligned_keys_chunk(m_block, seqlen_k, block_n, window, expected):
    # hopper/block.h get_n_block_min_max with attention_chunk (0251105a): n_idx_right = min(n_idx + window_right,
    # round_up(chunk, n_idx)); n_idx_left = max(n_idx - window_left, round_down(chunk, n_idx))
    assert kv_block_bounds(m_block, 1024, seqlen_k, 128, block_n, window_size=window, attention_chunk=256) == expected


def test_a_negative_chunk_is_refused_naming_the_argument():
    with pytest.raises(ValueError) as info:
        kv_block_bounds(0, 1, 1, 128, 64, attention_chunk=-1)
    assert str(info.value) == "attention_chunk: must be >= 0 (0 disables), got -1"


def test_a_chunked_decode_splits_only_the_blocks_of_its_chunk():
    # one query row aligned with key 255, chunk 64: it sees keys [192, 256) (hopper/mask.h), so the split kernel's
    # range is blocks 6..7 of 32 keys (block.h with the chunk) and two splits take one block each: each split's LSE is
    # the logsumexp of its own 32 keys' scores (q.k / sqrt(64)). Without the chunk the two splits would halve all
    # 8 blocks instead.
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 1, 1, 64), torch.randn(1, 256, 1, 64), torch.randn(1, 256, 1, 64)
    lens = torch.tensor([256], dtype=torch.int32)
    out, lse = split_kv(q, k, v, 2, 32, cache_seqlens=lens, attention_chunk=64)
    scores = (q[0, 0, 0].double() @ k[0, :, 0].double().T) / 8
    want = [torch.logsumexp(scores[192:224], 0), torch.logsumexp(scores[224:256], 0)]
    assert torch.allclose(lse.flatten().double(), torch.stack(want), rtol=0, atol=1e-5)
    _, unchunked = split_kv(q, k, v, 2, 32, cache_seqlens=lens)
    assert torch.allclose(unchunked.flatten().double(),
                          torch.stack([torch.logsumexp(scores[:128], 0), torch.logsumexp(scores[128:], 0)]), atol=1e-5)
