"""FA3's split-KV decomposition: per-split KV block ranges and the per-split partial outputs.

``split_block_range`` and ``kv_block_bounds`` (refmodel.kv_blocks) restate ``hopper/block.h`` (``BlockMN::get_n_block_min_max``);
``split_kv`` produces what FA3's split kernel leaves in its ``out_accum`` / ``softmax_lse_accum`` buffers
(``hopper/epilogue_fwd.hpp``), in the layout ``flash_attn_combine`` consumes. The softmax itself is
``refmodel.attention.attention_rows``: the formula exists once.

Simplifications (documented, deliberate): window sides given as ``-1`` are treated as
unbounded instead of being replaced by ``seqlen - 1`` (the block bounds come out identical for every m-block
that holds a row); appended KV (``k``/``v`` new) is not modelled.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from .attention import AttentionBatch, attention_rows, resolve_attention_call
from .kv_blocks import kv_block_bounds, split_block_range  # the ranges, in plain ints (no torch)

__all__ = ["kv_block_bounds", "split_block_range", "split_kv", "RangeFn"]

RangeFn = Callable[[int, int, int, int], tuple[int, int]]


def _split_counts(num_splits, batch_size: int) -> list[int]:
    if isinstance(num_splits, int) and not isinstance(num_splits, bool):
        if not 1 <= num_splits <= 256:
            raise ValueError(f"num_splits: an int split count must lie in [1, 256] (FA3's limit), got {num_splits}")
        return [num_splits] * batch_size
    counts = [int(c) for c in num_splits]  # a sequence or a 1-D tensor
    if len(counts) != batch_size:
        raise ValueError(f"num_splits: a per-batch vector must have length b={batch_size}, got {len(counts)}")
    if any(c < 1 for c in counts):
        raise ValueError(f"num_splits: per-batch split counts must be >= 1, got {counts}")
    return counts


def _row_m_blocks(num_heads: int, seqlen_q: int, qhpk: int, block_m: int, pack_gqa: bool) -> torch.Tensor:
    """``(h, Lq)`` m-block index of each (query head, row); packed rows are ``row * qhpk + head % qhpk``."""
    rows = torch.arange(seqlen_q).unsqueeze(0)
    if pack_gqa:
        head_in_group = (torch.arange(num_heads) % qhpk).unsqueeze(1)
        return (rows * qhpk + head_in_group) // block_m
    return (rows // block_m).expand(num_heads, seqlen_q)


def _split_key_ranges(
    batch: AttentionBatch, count: int, block_m: int, block_n: int, causal: bool, window_size, qhpk: int,
    pack_gqa: bool, range_fn: RangeFn, attention_chunk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Key range ``[lo, hi)`` split ``s`` gives each m-block: ``(count, num_m_blocks)`` tensors, plus the
    ``(h, Lq)`` m-block index of every (query head, row)."""
    num_heads, lq, lk = batch.q.shape[0], batch.seqlen_q, batch.seqlen_k
    m_blocks = _row_m_blocks(num_heads, lq, qhpk, block_m, pack_gqa)
    num_m_blocks = int(m_blocks.max()) + 1 if m_blocks.numel() else 0
    key_lo = torch.zeros(count, max(num_m_blocks, 1), dtype=torch.int64)
    key_hi = torch.zeros_like(key_lo)
    for m in range(num_m_blocks):
        n_min, n_max = kv_block_bounds(m, lq, lk, block_m, block_n, causal, window_size,
                                       qhpk if pack_gqa else 1, attention_chunk)
        for s in range(count):
            lo, hi = range_fn(n_min, n_max, count, s)
            key_lo[s, m], key_hi[s, m] = lo * block_n, hi * block_n
    return key_lo, key_hi, m_blocks


def _split_partials(batch: AttentionBatch, key_lo, key_hi, m_blocks, scale: float, softcap: float):
    """Yield ``(s, out (h, Lq, dv), lse (h, Lq))`` for each split that sees a key, one split at a time.

    Each split is evaluated on the key span its m-blocks cover only, so memory stays ~``h * Lq * Lk`` in all.
    """
    lk = batch.seqlen_k
    for s in range(key_lo.shape[0]):
        lo_rows, hi_rows = key_lo[s][m_blocks], key_hi[s][m_blocks]  # (h, Lq)
        span_lo = max(int(lo_rows.min()), 0) if lo_rows.numel() else 0
        span_hi = min(int(hi_rows.max()), lk) if hi_rows.numel() else 0
        if span_hi <= span_lo:
            continue  # empty split: stays (0, -inf)
        keys = torch.arange(span_lo, span_hi)
        in_split = (keys >= lo_rows.unsqueeze(-1)) & (keys < hi_rows.unsqueeze(-1))  # (h, Lq, span)
        visible = in_split & batch.visible[:, span_lo:span_hi]
        out_s, lse_s = attention_rows(batch.q, batch.k[:, span_lo:span_hi], batch.v[:, span_lo:span_hi],
                                      visible, scale, softcap)
        yield s, out_s, lse_s


def split_kv(
    q,
    k_cache,
    v_cache,
    num_splits,
    block_n: int,
    cache_seqlens=None,
    cu_seqlens_q=None,
    max_seqlen_q=None,
    page_table=None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    softmax_scale: float | None = None,
    cache_leftpad=None,
    attention_chunk: int = 0,
    *,
    block_m: int = 128,
    pack_gqa: bool = True,
    range_fn: RangeFn = split_block_range,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-split partial outputs and LSEs as FA3's split kernel leaves them (``hopper/block.h``, ``epilogue_fwd.hpp``).

    Arguments after ``block_n`` are those of ``refmodel.attention.attention``. ``num_splits`` is an int in
    [1, 256] or a per-batch sequence (the metadata's ``num_splits_dynamic``); batch ``bb`` divides each m-block's
    KV block range ``kv_block_bounds(...)`` into ``num_splits[bb]`` pieces with ``range_fn`` (default
    :func:`split_block_range`; tests inject defective ones). ``block_m``/``block_n`` are the kernel's tiles;
    ``pack_gqa`` (FA3 forces it on for split kernels) decides how rows map to m-blocks.

    Returns ``(out_partial, lse_partial)`` in float32, shaped for ``flash_attn_combine``: ``(S, b, sq, h, dv)`` and
    ``(S, b, sq, h)``, or varlen ``(S, total_q, h, dv)`` and ``(S, total_q, h)``, with ``S = max(num_splits)``.
    ``lse_partial`` is a transposed view whose seqlen dim has stride 1, as FA3's ``mha_combine`` requires.
    Each split's partial is the normalised softmax over its visible keys with LSE = natural log-sum-exp.
    A split with no visible key for a row (empty range, masked keys, or ``s >= num_splits[bb]``) gets
    ``lse = -inf`` and ``out = 0``; FA3 writes the -inf but leaves its O_partial unwritten -- we write 0 so the
    tensor is deterministic, and the combine never weights such a split. A call whose cache tensor has no key
    slots (``attention``'s ``+inf`` case) launches no split kernel in FA3; here every split is then ``(0, -inf)``.
    """
    call = resolve_attention_call(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
        page_table=page_table, causal=causal, window_size=window_size, softcap=softcap,
        softmax_scale=softmax_scale, cache_leftpad=cache_leftpad, attention_chunk=attention_chunk,
    )
    if block_n < 1 or block_m < 1:
        raise ValueError(f"block_n/block_m: tile sizes must be >= 1, got block_n={block_n}, block_m={block_m}")
    counts = _split_counts(num_splits, call.batch_size)
    total_splits = max(counts, default=num_splits if isinstance(num_splits, int) else 1)
    h, dv = call.num_heads, call.head_dim_v
    if call.varlen:
        out = torch.zeros(total_splits, call.total_q, h, dv, dtype=torch.float32)
        lse = torch.full((total_splits, h, call.total_q), -math.inf, dtype=torch.float32)
    else:
        out = torch.zeros(total_splits, call.batch_size, call.seqlen_q, h, dv, dtype=torch.float32)
        lse = torch.full((total_splits, call.batch_size, h, call.seqlen_q), -math.inf, dtype=torch.float32)
    if not call.no_keys_in_call:
        for batch, count in zip(call.batches, counts):
            ranges = _split_key_ranges(batch, count, block_m, block_n, call.causal, call.window_size,
                                       call.qhead_per_khead, pack_gqa, range_fn, call.attention_chunk)
            rows = slice(batch.row_start, batch.row_start + batch.seqlen_q)
            for s, out_s, lse_s in _split_partials(batch, *ranges, call.scale, call.softcap):
                out_s = out_s.float().permute(1, 0, 2)  # (Lq, h, dv)
                if call.varlen:
                    out[s, rows], lse[s, :, rows] = out_s, lse_s.float()
                else:
                    out[s, batch.index], lse[s, batch.index] = out_s, lse_s.float()
    device = q.device
    if call.varlen:
        return out.to(device), lse.transpose(1, 2).to(device)
    return out.to(device), lse.transpose(2, 3).to(device)
