"""Prefill context parallel (CP-v2, zigzag) attention numerics: per-rank FA3 varlen calls over gathered KV.

Models the CP branch of ``FlashAttentionBackend.forward_extend`` in sglang's
``python/sglang/srt/layers/attention/flashattention_backend.py`` together with the sharding helpers of
``python/sglang/srt/layers/cp/zigzag.py`` (read, not copied; docs/facts-fa3.md section 3):

1. each CP rank holds its zigzag shard of the batch's extend tokens (``shard_hidden_states``): the prev
   block of every sequence, then the next block of every sequence, zero-padded to the physical length
   every rank sends (``pad_logical_token_to_physical``);
2. K/V of the extend tokens are all-gathered and put back in global order, and written next to the
   cached prefix, so every rank sees the whole causal prefix of every sequence;
3. each rank makes ONE FA3 varlen call: queries = its local tokens, ``cu_seqlens_q`` over its ``2*b``
   blocks, ``cache_seqlens`` = ``kv_len_prev`` (prev blocks) / ``kv_len_next`` (next blocks), causal,
   which FA3 aligns bottom-right, so each block's last query sees exactly its own position;
4. outputs are all-gathered and reordered to global order (``gather_hidden_states``); no LSE merge.

The attention itself is refmodel's float64 oracle with FA3's argument conventions (``refmodel.attention``),
so this module checks the *layout* (which tokens each rank attends), not a kernel.  The exchange steps are
separate functions (:func:`local_shard`, :func:`unshard`) so that the in-process simulation and the
multi-process run (``gpu_impl.distributed``) share every computation and differ only in the transport.

A layout built for another batch (stale CP metadata reused by ``prepare_cp_forward``) is detected before
any tensor is touched and raised as :class:`CPLayoutMismatch`, which the scenario reports as the finding
``CP_LAYOUT_MATCHES_BATCH``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from refmodel.attention import attention

from .zigzag import ZigzagLayout, gather_reorder, rank_token_indices

__all__ = [
    "CPLayoutMismatch",
    "CPRankCall",
    "CPPrefillResult",
    "check_layout_matches_batch",
    "rank_call",
    "extend_rows",
    "join_prefix_and_extend",
    "local_shard",
    "unshard",
    "rank_prefill_attention",
    "cp_prefill_attention",
    "plain_call_args",
    "plain_prefill_attention",
    "prefill_tensors",
]

#: The finding name a stale / mismatched CP layout is reported under.
CP_LAYOUT_MATCHES_BATCH = "CP_LAYOUT_MATCHES_BATCH"


class CPLayoutMismatch(ValueError):
    """The CP layout attached to a batch was built for other lengths (stale CP-v2 metadata).

    ``consequence`` says what sglang would do with it: ``"index_error"`` (token counts or a KV length do
    not fit the batch: sharding/gather index out of range) or ``"wrong_tokens"`` (the split fits, but
    queries attend other tokens than their causal prefix).  ``detail`` is JSON-ready.
    """

    def __init__(self, message: str, consequence: str, detail: dict):
        super().__init__(message)
        self.consequence = consequence
        self.detail = detail


@dataclass(frozen=True)
class CPRankCall:
    """The FA3 varlen call one CP rank makes (flashattention_backend.py, CP branch of forward_extend).

    Entries are per block in local order (prev blocks of every sequence, then next blocks):
    ``seq_index`` is the sequence a block belongs to, ``q_lens`` its query tokens, ``cache_seqlens`` the
    keys it sees.  ``local_tokens`` is the rank's logical token count, ``physical_tokens`` the padded rows
    it exchanges.
    """

    rank: int
    seq_index: tuple[int, ...]
    q_lens: tuple[int, ...]
    cache_seqlens: tuple[int, ...]
    local_tokens: int
    physical_tokens: int

    def to_dict(self) -> dict:
        """JSON-ready form (the per-rank call trace)."""
        return {"rank": self.rank, "seq_index": list(self.seq_index), "q_lens": list(self.q_lens),
                "cache_seqlens": list(self.cache_seqlens), "local_tokens": self.local_tokens,
                "physical_tokens": self.physical_tokens}


@dataclass
class CPPrefillResult:
    """Output of a CP prefill in global token order, the per-rank LSEs and the per-rank calls."""

    out: torch.Tensor
    lse_per_rank: list[torch.Tensor]
    calls: list[CPRankCall]


# ------------------------------------------------------------------------------------------------
# Layout checks and per-rank call description
# ------------------------------------------------------------------------------------------------


def check_layout_matches_batch(layout: ZigzagLayout, seq_lens: Sequence[int], extend_lens: Sequence[int]) -> None:
    """Raise :class:`CPLayoutMismatch` unless ``layout`` was built for these lengths (``prepare_cp_forward``
    reuses whatever metadata is attached, cp/utils.py)."""
    seqs = tuple(int(s) for s in seq_lens)
    ext = tuple(int(e) for e in extend_lens)
    if layout.seq_lens == seqs and layout.extend_lens == ext:
        return
    detail = {"layout_seq_lens": list(layout.seq_lens), "layout_extend_lens": list(layout.extend_lens),
              "batch_seq_lens": list(seqs), "batch_extend_lens": list(ext), "cp_size": layout.cp_size}
    if len(layout.extend_lens) != len(ext) or sum(layout.extend_lens) != sum(ext):
        consequence = "index_error"
        why = (f"the layout splits {sum(layout.extend_lens)} tokens of {len(layout.extend_lens)} sequence(s), "
               f"the batch has {sum(ext)} tokens of {len(ext)}: sharding/gather indices do not fit the batch "
               f"(index error, or tokens left unassigned)")
    elif any(kv > s for r in range(layout.cp_size)
             for kvs in (layout.kv_len_prev[r], layout.kv_len_next[r]) for kv, s in zip(kvs, seqs)):
        consequence = "index_error"
        why = ("a rank's cache_seqlens exceeds the sequence's length: FA3 reads KV slots past the request's "
               "tokens (another request's KV or unwritten memory)")
    else:
        consequence = "wrong_tokens"
        why = ("token counts agree but the blocks differ: queries attend the wrong tokens (silent wrong output)")
    detail["consequence"] = consequence
    raise CPLayoutMismatch(
        f"CP layout built for seq_lens={list(layout.seq_lens)} extend_lens={list(layout.extend_lens)} "
        f"attached to a batch with seq_lens={list(seqs)} extend_lens={list(ext)}: {why}",
        consequence, detail)


def rank_call(layout: ZigzagLayout, rank: int) -> CPRankCall:
    """The varlen call of CP rank ``rank``: 2*b blocks, kv_len_prev then kv_len_next (cp/zigzag.py metadata)."""
    if not 0 <= rank < layout.cp_size:
        raise ValueError(f"rank: must be in [0, {layout.cp_size}), got {rank}")
    b = len(layout.extend_lens)
    return CPRankCall(
        rank=rank,
        seq_index=tuple(range(b)) * 2,
        q_lens=tuple(layout.q_len_prev[rank]) + tuple(layout.q_len_next[rank]),
        cache_seqlens=tuple(layout.kv_len_prev[rank]) + tuple(layout.kv_len_next[rank]),
        local_tokens=layout.rank_tokens[rank],
        physical_tokens=layout.physical_rank_tokens,
    )


# ------------------------------------------------------------------------------------------------
# KV bookkeeping: global KV = per sequence [prefix tokens, extend tokens], concatenated over sequences
# ------------------------------------------------------------------------------------------------


def _seq_starts(seq_lens: Sequence[int]) -> list[int]:
    starts, pos = [], 0
    for s in seq_lens:
        starts.append(pos)
        pos += int(s)
    return starts


def extend_rows(seq_lens: Sequence[int], extend_lens: Sequence[int]) -> torch.Tensor:
    """Row indices of the extend tokens inside the concatenated per-sequence KV (the batch's out_cache_loc)."""
    rows = []
    for start, s, e in zip(_seq_starts(seq_lens), seq_lens, extend_lens):
        rows.extend(range(start + int(s) - int(e), start + int(s)))
    return torch.tensor(rows, dtype=torch.long)


def join_prefix_and_extend(kv: torch.Tensor, extend_kv: torch.Tensor, seq_lens: Sequence[int],
                           extend_lens: Sequence[int]) -> torch.Tensor:
    """Write gathered extend K/V (global order) next to the cached prefix, as set_kv_buffer does (memory_pool.py)."""
    if extend_kv.shape[0] != sum(int(e) for e in extend_lens):
        raise ValueError(f"extend_kv: expected {sum(extend_lens)} rows, got {extend_kv.shape[0]}")
    out = kv.clone()
    out[extend_rows(seq_lens, extend_lens).to(kv.device)] = extend_kv
    return out


def local_shard(layout: ZigzagLayout, rank: int, x: torch.Tensor) -> torch.Tensor:
    """Rank ``rank``'s rows of per-extend-token ``x`` in zigzag order, zero-padded to the physical length
    (``shard_hidden_states`` + ``pad_logical_token_to_physical``, cp/zigzag.py, cp/padding.py)."""
    index = torch.tensor(rank_token_indices(layout.extend_lens, layout.cp_size, rank), dtype=torch.long,
                         device=x.device)
    rows = x.index_select(0, index)
    pad = layout.physical_rank_tokens - rows.shape[0]
    if pad > 0:
        rows = torch.cat([rows, rows.new_zeros((pad,) + tuple(rows.shape[1:]))], dim=0)
    return rows


def unshard(layout: ZigzagLayout, gathered: Sequence[torch.Tensor]) -> torch.Tensor:
    """Every rank's padded local rows back in global token order, padding dropped (``gather_hidden_states``, cp/zigzag.py)."""
    trimmed = [g[: layout.rank_tokens[r]] for r, g in enumerate(gathered)]
    return gather_reorder(trimmed, layout.extend_lens, layout.cp_size)


# ------------------------------------------------------------------------------------------------
# Attention
# ------------------------------------------------------------------------------------------------


def _paged_view(kv: torch.Tensor) -> torch.Tensor:
    """The KV pool with page_size 1 (sglang's token pool): (tokens, 1, h_k, d)."""
    return kv.unsqueeze(1)


def _page_table(seq_starts: Sequence[int], seq_index: Sequence[int], lens: Sequence[int],
                device) -> torch.Tensor:
    width = max([int(n) for n in lens] + [1])
    table = torch.zeros((len(seq_index), width), dtype=torch.int32)
    for row, (s, n) in enumerate(zip(seq_index, lens)):
        table[row, :n] = torch.arange(seq_starts[s], seq_starts[s] + n, dtype=torch.int32)
    return table.to(device)


def _cu(lens: Sequence[int], device) -> torch.Tensor:
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + int(n))
    return torch.tensor(cu, dtype=torch.int32, device=device)


def rank_prefill_attention(layout: ZigzagLayout, rank: int, q_local: torch.Tensor, k: torch.Tensor,
                           v: torch.Tensor, softmax_scale: Optional[float] = None,
                           attention_fn: Callable = attention):
    """One CP rank's FA3 varlen call over the gathered KV (CP branch of forward_extend, flashattention_backend.py).

    ``q_local`` holds the rank's (possibly padded) local queries; ``k``/``v`` the full per-sequence KV
    (prefix + gathered extend, sequences concatenated).  Returns ``(out, lse, call)``: ``out`` padded with
    zero rows to ``q_local``'s length, ``lse`` ``(h, local_tokens)``.
    """
    call = rank_call(layout, rank)
    n = call.local_tokens
    if q_local.shape[0] < n:
        raise ValueError(f"q_local: rank {rank} needs {n} rows, got {q_local.shape[0]}")
    device = q_local.device
    table = _page_table(_seq_starts(layout.seq_lens), call.seq_index, call.cache_seqlens, device)
    out, lse = attention_fn(
        q_local[:n], _paged_view(k), _paged_view(v),
        cache_seqlens=torch.tensor(call.cache_seqlens, dtype=torch.int32, device=device),
        cu_seqlens_q=_cu(call.q_lens, device), max_seqlen_q=max(call.q_lens, default=0),
        page_table=table, causal=True, softmax_scale=softmax_scale)
    pad = q_local.shape[0] - n
    if pad > 0:
        out = torch.cat([out, out.new_zeros((pad,) + tuple(out.shape[1:]))], dim=0)
    return out, lse, call


def cp_prefill_attention(layout: ZigzagLayout, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         seq_lens: Optional[Sequence[int]] = None, extend_lens: Optional[Sequence[int]] = None,
                         softmax_scale: Optional[float] = None) -> CPPrefillResult:
    """CP-v2 zigzag prefill of one batch over all CP ranks, in one process (forward_extend CP branch,
    flashattention_backend.py, with cp/zigzag.py's shard / all-gather / reorder).

    ``q``: ``(sum(extend_lens), h, d)`` extend tokens in global order; ``k``/``v``: ``(sum(seq_lens), h_k, d)``
    per sequence ``[prefix, extend]``.  ``seq_lens``/``extend_lens`` are the *batch's* lengths (default: the
    layout's); a layout built for other lengths raises :class:`CPLayoutMismatch`.
    """
    seq_lens = layout.seq_lens if seq_lens is None else tuple(int(s) for s in seq_lens)
    extend_lens = layout.extend_lens if extend_lens is None else tuple(int(e) for e in extend_lens)
    check_layout_matches_batch(layout, seq_lens, extend_lens)
    if q.shape[0] != sum(extend_lens):
        raise ValueError(f"q: expected {sum(extend_lens)} rows (sum of extend_lens), got {q.shape[0]}")
    if k.shape[0] != sum(seq_lens) or v.shape[0] != sum(seq_lens):
        raise ValueError(f"k/v: expected {sum(seq_lens)} rows (sum of seq_lens), got {k.shape[0]}/{v.shape[0]}")
    cp = layout.cp_size
    rows = extend_rows(seq_lens, extend_lens).to(k.device)
    # Each rank computes K/V of its local tokens only; the all-gather + reorder rebuilds the extend KV.
    k_gathered = unshard(layout, [local_shard(layout, r, k.index_select(0, rows)) for r in range(cp)])
    v_gathered = unshard(layout, [local_shard(layout, r, v.index_select(0, rows)) for r in range(cp)])
    k_full = join_prefix_and_extend(k, k_gathered, seq_lens, extend_lens)
    v_full = join_prefix_and_extend(v, v_gathered, seq_lens, extend_lens)
    outs, lses, calls = [], [], []
    for r in range(cp):
        out, lse, call = rank_prefill_attention(layout, r, local_shard(layout, r, q), k_full, v_full, softmax_scale)
        outs.append(out)
        lses.append(lse)
        calls.append(call)
    return CPPrefillResult(out=unshard(layout, outs), lse_per_rank=lses, calls=calls)


def plain_call_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: Sequence[int],
                    extend_lens: Sequence[int]) -> dict:
    """Keyword arguments of the non-CP varlen extend call (queries = extend tokens, keys = prefix + extend)."""
    device = q.device
    b = len(seq_lens)
    return dict(
        q=q, k_cache=_paged_view(k), v_cache=_paged_view(v),
        cache_seqlens=torch.tensor([int(s) for s in seq_lens], dtype=torch.int32, device=device),
        cu_seqlens_q=_cu(extend_lens, device), max_seqlen_q=max([int(e) for e in extend_lens], default=0),
        page_table=_page_table(_seq_starts(seq_lens), list(range(b)), seq_lens, device), causal=True)


def plain_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: Sequence[int],
                            extend_lens: Sequence[int], softmax_scale: Optional[float] = None):
    """Non-CP extend: one causal varlen call, extend queries against prefix + extend keys
    (forward_extend, flashattention_backend.py).  Returns ``(out, lse)``."""
    return attention(**plain_call_args(q, k, v, seq_lens, extend_lens), softmax_scale=softmax_scale)


def prefill_tensors(seq_lens: Sequence[int], extend_lens: Sequence[int], num_heads: int, num_kv_heads: int,
                    head_dim: int, head_dim_v: int, seed: int, dtype=torch.bfloat16, device: str = "cpu"):
    """Seeded ``q (sum(extend), h, d)``, ``k (sum(seq), h_k, d)``, ``v (sum(seq), h_k, dv)`` for one extend batch
    (the layer's per-rank head counts, as qwen3_moe.py's attention module holds them)."""
    gen = torch.Generator().manual_seed(int(seed))
    total_q, total_k = sum(int(e) for e in extend_lens), sum(int(s) for s in seq_lens)
    q = torch.randn((total_q, num_heads, head_dim), generator=gen).to(dtype)
    k = torch.randn((total_k, num_kv_heads, head_dim), generator=gen).to(dtype)
    v = torch.randn((total_k, num_kv_heads, head_dim_v), generator=gen).to(dtype)
    return q.to(device), k.to(device), v.to(device)
