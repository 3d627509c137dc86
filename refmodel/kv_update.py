"""FA3's input-side transformations of a ``flash_attn_with_kvcache`` call: rotary embedding, appended KV, FP8 descales.

These run before the attention itself (``refmodel.attention`` is the one softmax): FA3 rotates the new keys and
writes them into the cache, rotates the queries, and scales scores and outputs by the FP8 descales. Read in
``hopper/seqlen.h`` (``seqlen_k_og``, ``seqlen_rotary``), ``hopper/rotary.h`` (interleaved / contiguous pairs),
``hopper/paged_kv.h`` (page lookup), ``hopper/flash_api.cpp`` (``mha_fwd``: descale shapes ``(b, h_k)``) and the
interface's docstring (``hopper/flash_attn_interface.py``); nothing copied.

* Appended KV: batch ``bb``'s new key ``i`` is written at cache position ``cache_seqlens[bb] + i`` (FA3's
  ``seqlen_k_og + leftpad_k``: ``cache_seqlens`` counts the left padding), in row ``cache_batch_idx[bb]`` of the
  cache (or of the page table when paged); afterwards the sequence has ``cache_seqlens[bb] + new[bb]`` slots.
* Rotary: ``rotary_dim = 2 * rotary_cos.size(1)`` leading channels are rotated, pairs ``(2j, 2j+1)`` when
  interleaved, ``(j, j + rotary_dim/2)`` otherwise: ``(x0 cos - x1 sin, x0 sin + x1 cos)``, computed in float32
  and rounded to the tensor's dtype (FA3 rotates in registers in float and stores the element type). Key ``i``
  sits at position ``seqlen_rotary[bb] + i``; query row ``i`` at ``seqlen_rotary[bb] + i`` when the kernel is
  causal or local, else at ``seqlen_rotary[bb]`` for every row. ``seqlen_rotary`` is ``rotary_seqlens`` when
  given, else ``cache_seqlens`` (``seqlen_k_og + leftpad_k``).
* FP8 descales ``(b, h_k)`` multiply q, k and v of batch ``bb`` and KV head ``hk`` (query heads of a group share
  their KV head's ``q_descale``); a missing descale is 1. Applied to float64 copies, so the attention stays exact.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

__all__ = ["rotate", "rotary_positions_q", "rotary_positions_k", "append_kv", "dequantize"]


def _float_type(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
           interleaved: bool) -> torch.Tensor:
    """Rotary embedding of ``x (rows, h, d)`` whose row ``r`` sits at ``positions[r]`` (``hopper/rotary.h``).

    ``cos``/``sin`` are ``(seqlen_ro, rotary_dim / 2)``; channels past ``rotary_dim`` pass unchanged. The result
    has ``x``'s dtype (rotated in float32, float64 for float64 inputs).
    """
    half = cos.shape[1]
    rotary_dim = 2 * half
    if rotary_dim == 0 or x.shape[0] == 0:
        return x.clone()
    ftype = _float_type(x.dtype)
    pos = positions.to(device=cos.device, dtype=torch.int64)
    c = cos.to(ftype)[pos].unsqueeze(1).to(x.device)      # (rows, 1, half)
    s = sin.to(ftype)[pos].unsqueeze(1).to(x.device)
    xf = x.to(ftype)
    rot = xf[..., :rotary_dim]
    if interleaved:
        x0, x1 = rot[..., 0::2], rot[..., 1::2]
        y = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    else:
        x0, x1 = rot[..., :half], rot[..., half:]
        y = torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    return torch.cat((y, xf[..., rotary_dim:]), dim=-1).to(x.dtype)


def rotary_positions_k(seqlen_rotary: int, count: int) -> torch.Tensor:
    """Positions of a batch's ``count`` new keys: ``seqlen_rotary + i``."""
    return torch.arange(count, dtype=torch.int64) + int(seqlen_rotary)


def rotary_positions_q(seqlen_rotary: int, rows: int, causal_or_local: bool) -> torch.Tensor:
    """Positions of a batch's query rows: ``seqlen_rotary + i`` (causal/local kernel) or ``seqlen_rotary``."""
    if causal_or_local:
        return torch.arange(rows, dtype=torch.int64) + int(seqlen_rotary)
    return torch.full((rows,), int(seqlen_rotary), dtype=torch.int64)


def append_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k_rows: Sequence[torch.Tensor],
              v_rows: Sequence[torch.Tensor], cache_seqlens: Sequence[int], cache_rows: Sequence[int],
              page_table: Optional[torch.Tensor] = None) -> None:
    """Write batch ``bb``'s new keys/values ``k_rows[bb] (n, h_k, d)`` at positions ``cache_seqlens[bb] + i`` of
    cache row ``cache_rows[bb]`` (a page-table row when paged), in place, as FA3 does.

    Raises ``ValueError`` naming ``cache_seqlens`` when a position falls outside the cache (FA3 would write out of
    bounds) and ``page_table`` when a page read is outside ``[0, num_pages)``.
    """
    for bb, (kn, vn) in enumerate(zip(k_rows, v_rows)):
        n = kn.shape[0]
        if n == 0:
            continue
        start, row = int(cache_seqlens[bb]), int(cache_rows[bb])
        positions = torch.arange(start, start + n)
        if page_table is None:
            capacity = k_cache.shape[1]
            if start + n > capacity:
                raise ValueError(f"cache_seqlens: batch {bb} appends {n} keys at {start}, past the cache's "
                                 f"{capacity} slots; allowed range is [0, {capacity - n}]")
            k_cache[row, start:start + n] = kn.to(k_cache.dtype)
            v_cache[row, start:start + n] = vn.to(v_cache.dtype)
            continue
        page_size, num_pages = k_cache.shape[1], k_cache.shape[0]
        capacity = page_table.shape[1] * page_size
        if start + n > capacity:
            raise ValueError(f"cache_seqlens: batch {bb} appends {n} keys at {start}, past its "
                             f"{capacity} paged slots; allowed range is [0, {capacity - n}]")
        pages = page_table[row].to(torch.int64).cpu()[positions // page_size]
        if int(pages.min()) < 0 or int(pages.max()) >= num_pages:
            raise ValueError(f"page_table: pages written for batch {bb} must lie in [0, {num_pages}), "
                             f"got {pages.tolist()}")
        slots = positions % page_size
        k_cache[pages.to(k_cache.device), slots.to(k_cache.device)] = kn.to(k_cache.dtype)
        v_cache[pages.to(v_cache.device), slots.to(v_cache.device)] = vn.to(v_cache.dtype)


def dequantize(x: torch.Tensor, descale: Optional[torch.Tensor], batch_of_row: torch.Tensor,
               group: int) -> torch.Tensor:
    """``x (rows, heads, d)`` as float64 times ``descale[batch_of_row[r], head // group]`` (1 when None)."""
    x64 = x.to(torch.float64)
    if descale is None:
        return x64
    heads = torch.arange(x.shape[1]) // group
    scale = descale.to(torch.float64).cpu()[batch_of_row.to(torch.int64).unsqueeze(1), heads.unsqueeze(0)]
    return x64 * scale.unsqueeze(-1).to(x64.device)
