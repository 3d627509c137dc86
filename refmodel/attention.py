"""Exact attention with the conventions of FA3's ``flash_attn_with_kvcache`` (the oracle).

Everything here is computed in float64. The module has three layers:

* :func:`visibility_mask` -- which keys a query row may see (causal / local windows, bottom-right aligned);
* :func:`attention_rows` -- the one place the softmax formula lives: rows x keys x mask -> ``(out, lse)``;
* :func:`resolve_attention_call` -- argument checking and the per-batch view of a call (queries, the
  visible keys in order, the mask), shared by :func:`attention` and ``refmodel.splitkv.split_kv``.

Conventions follow ``hopper/flash_attn_interface.py`` (``flash_attn_with_kvcache``), ``hopper/flash_api.cpp``
(``mha_fwd``), ``hopper/seqlen.h`` (``cache_leftpad``), ``hopper/paged_kv.h`` (page lookup) and
``hopper/mask.h`` (masks, ``attention_chunk``). Rotary, appended KV, ``qv``, ``cache_batch_idx`` and FP8
descaling are transformations of a call's inputs (``refmodel.call_inputs``), applied before this model runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from .kv_blocks import resolve_window  # the window resolution, in plain ints

__all__ = [
    "AttentionBatch",
    "AttentionCall",
    "attention",
    "attention_rows",
    "resolve_attention_call",
    "resolve_window",
    "visibility_mask",
]

_INDEX_DTYPE = torch.int32  # FA3 insists on int32 for every index / length tensor


def _fail(argument: str, message: str) -> None:
    raise ValueError(f"{argument}: {message}")


# ----------------------------------------------------------------------------------------------------------
# Masks and the softmax formula
# ----------------------------------------------------------------------------------------------------------


def visibility_mask(
    seqlen_q: int, seqlen_k: int, causal: bool = False, window_size: Sequence[int] = (-1, -1),
    attention_chunk: int = 0,
) -> torch.Tensor:
    """Boolean ``(seqlen_q, seqlen_k)`` mask of the keys each query row sees, bottom-right aligned (``hopper/mask.h``).

    Row ``i`` sees key ``j`` iff ``i + (Lk - Lq) - left <= j <= i + (Lk - Lq) + right`` (unbounded sides
    dropped); causal is ``right = 0`` with an unbounded left side. ``attention_chunk > 0`` also keeps row ``i`` to
    the chunk of its aligned key ``p = i + Lk - Lq``: ``c <= j < c + chunk`` with ``c = floor(p / chunk) * chunk``
    (``hopper/mask.h``, ``flash::round_down``).
    """
    if seqlen_q < 0 or seqlen_k < 0:
        _fail("seqlen", f"lengths must be >= 0, got seqlen_q={seqlen_q}, seqlen_k={seqlen_k}")
    reach_left, reach_right = resolve_window(causal, window_size)
    rows = torch.arange(seqlen_q).unsqueeze(1)
    cols = torch.arange(seqlen_k).unsqueeze(0)
    diagonal = rows + (seqlen_k - seqlen_q)  # the key aligned with row i
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if reach_right is not None:
        visible &= cols <= diagonal + reach_right
    if reach_left is not None:
        visible &= cols >= diagonal - reach_left
    if attention_chunk:
        if attention_chunk < 0:
            _fail("attention_chunk", f"must be >= 0 (0 disables), got {attention_chunk}")
        chunk_start = torch.div(diagonal, attention_chunk, rounding_mode="floor") * attention_chunk
        visible &= (cols >= chunk_start) & (cols < chunk_start + attention_chunk)
    return visible


def attention_rows(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor,
    scale: float,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 softmax attention of query rows against a masked key set, FA3's per-row math (``hopper/softmax.h``).

    Shapes: ``q_rows (..., m, d)``, ``k (..., n, d)``, ``v (..., n, dv)``, ``visible`` broadcastable to
    ``(..., m, n)``. Scores are ``scale * q.k``, then ``softcap * tanh(score / softcap)`` when ``softcap > 0``
    (FA3 folds the scale into the tanh argument the same way). Returns ``out (..., m, dv)`` (normalised) and
    ``lse (..., m)`` (natural log). A row with no visible key gets ``out = 0`` and ``lse = -inf``, as FA3's
    epilogue writes when the row sum is 0.
    """
    q64, k64, v64 = q_rows.double(), k.double(), v.double()
    scores = torch.matmul(q64, k64.transpose(-1, -2)) * float(scale)
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    scores = torch.where(visible.to(torch.bool), scores, -math.inf)  # broadcasts, e.g. a leading split dim
    lse = torch.logsumexp(scores, dim=-1)
    has_keys = torch.isfinite(lse) | torch.isnan(lse)
    probs = torch.exp(scores - torch.where(has_keys, lse, 0.0).unsqueeze(-1))
    probs = torch.where(has_keys.unsqueeze(-1), probs, 0.0)
    return torch.matmul(probs, v64), lse


# ----------------------------------------------------------------------------------------------------------
# Call resolution (argument checks + per-batch view)
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionBatch:
    """One sequence of a call as ``hopper/seqlen.h`` delimits it: query rows, visible keys, row offset.

    ``q`` is ``(h, Lq, d)``, ``k`` ``(h, Lk, d)`` and ``v`` ``(h, Lk, dv)`` (KV heads already repeated for GQA),
    all float64; ``visible`` is the ``(Lq, Lk)`` mask. Key ``j`` here is cache position ``leftpad + j``.
    ``row_start`` is the first row of this batch in the varlen layout (0 otherwise).
    """

    index: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    visible: torch.Tensor
    row_start: int

    @property
    def seqlen_q(self) -> int:
        return self.q.shape[1]

    @property
    def seqlen_k(self) -> int:
        return self.k.shape[1]


@dataclass(frozen=True)
class AttentionCall:
    """A validated ``flash_attn_with_kvcache`` call (``hopper/flash_api.cpp``): layout + per-sequence views."""

    batches: tuple[AttentionBatch, ...]
    varlen: bool
    batch_size: int
    seqlen_q: int  # padded q length (non-varlen) or max_seqlen_q (varlen)
    total_q: int
    num_heads: int
    num_heads_k: int
    head_dim: int
    head_dim_v: int
    scale: float
    softcap: float
    causal: bool
    window_size: tuple[int, int]
    q_dtype: torch.dtype
    no_keys_in_call: bool  # FA3's total_k == 0 case: out 0, lse +inf
    attention_chunk: int = 0

    @property
    def qhead_per_khead(self) -> int:
        return self.num_heads // self.num_heads_k


def _as_int_vector(value, name: str, length: int) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        _fail(name, f"must be a torch.int32 tensor of shape ({length},), got {type(value).__name__}")
    if value.dtype != _INDEX_DTYPE:
        _fail(name, f"must have dtype torch.int32 (as FA3 requires), got {value.dtype}")
    if tuple(value.shape) != (length,):
        _fail(name, f"must have shape ({length},), got {tuple(value.shape)}")
    return value.to(torch.int64).cpu()


def _check_tensors(q, k_cache, v_cache, varlen: bool, paged: bool) -> None:
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            _fail(name, f"must be a tensor, got {type(t).__name__}")
    if q.dim() != (3 if varlen else 4):
        layout = "(total_q, h, d) with cu_seqlens_q" if varlen else "(b, seqlen_q, h, d)"
        _fail("q", f"must be {layout}, got shape {tuple(q.shape)}")
    cache_layout = "(num_pages, page_size, h_k, d)" if paged else "(b, seqlen_k, h_k, d)"
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            _fail(name, f"must be {cache_layout}, got shape {tuple(t.shape)}")
    if not q.dtype.is_floating_point:
        _fail("q", f"must have a floating dtype, got {q.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            _fail(name, f"dtype must equal q's dtype {q.dtype}, got {t.dtype}")
    if k_cache.shape[-1] != q.shape[-1]:
        _fail("k_cache", f"head dim must equal q's head dim {q.shape[-1]}, got {k_cache.shape[-1]}")
    if tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):
        _fail("v_cache",
              f"leading dims must equal k_cache's {tuple(k_cache.shape[:3])}, got {tuple(v_cache.shape[:3])}")
    num_heads, num_heads_k = q.shape[-2], k_cache.shape[2]
    if num_heads_k < 1 or num_heads % num_heads_k != 0:
        _fail("k_cache", f"KV head count must be >= 1 and divide q's head count {num_heads}, got {num_heads_k}")


def _query_row_ranges(q, cu_seqlens_q, max_seqlen_q, varlen: bool) -> tuple[list[tuple[int, int]], int]:
    """Return per-batch (row_start, seqlen_q) and the padded/max q length."""
    if not varlen:
        b, sq = q.shape[0], q.shape[1]
        return [(0, sq)] * b, sq
    if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dim() != 1 or cu_seqlens_q.numel() < 1:
        _fail("cu_seqlens_q", "must be a 1-D torch.int32 tensor of length b + 1 >= 1")
    if cu_seqlens_q.dtype != _INDEX_DTYPE:
        _fail("cu_seqlens_q", f"must have dtype torch.int32 (as FA3 requires), got {cu_seqlens_q.dtype}")
    cu = [int(x) for x in cu_seqlens_q.cpu().tolist()]
    total_q = q.shape[0]
    if cu[0] != 0 or cu[-1] != total_q:
        _fail("cu_seqlens_q", f"must start at 0 and end at total_q={total_q}, got {cu[0]}..{cu[-1]}")
    lengths = [hi - lo for lo, hi in zip(cu[:-1], cu[1:])]
    if any(n < 0 for n in lengths):
        _fail("cu_seqlens_q", f"must be non-decreasing (every sequence length >= 0), got {cu}")
    if max_seqlen_q is None:
        _fail("max_seqlen_q", "must be given when cu_seqlens_q is given (FA3 requires it)")
    longest = max(lengths, default=0)
    if int(max_seqlen_q) < longest:
        _fail("max_seqlen_q", f"must be >= the longest sequence ({longest}) in [{longest}, inf), got {max_seqlen_q}")
    return list(zip(cu[:-1], lengths)), int(max_seqlen_q)


def _kv_geometry(k_cache, page_table, batch_size: int, paged: bool) -> tuple[int, int]:
    """Return (capacity = keys addressable per sequence, page_size)."""
    if not paged:
        if k_cache.shape[0] != batch_size:
            _fail("k_cache", f"batch dim must equal the batch size {batch_size}, got {k_cache.shape[0]}")
        return k_cache.shape[1], 1
    if not isinstance(page_table, torch.Tensor) or page_table.dim() != 2:
        _fail("page_table", "must be a 2-D torch.int32 tensor (b, max_pages_per_seq)")
    if page_table.dtype != _INDEX_DTYPE:
        _fail("page_table", f"must have dtype torch.int32 (as FA3 requires), got {page_table.dtype}")
    if page_table.shape[0] != batch_size:
        _fail("page_table", f"first dim must equal the batch size {batch_size}, got {page_table.shape[0]}")
    page_size = k_cache.shape[1]
    return page_table.shape[1] * page_size, page_size


def _key_ranges(cache_seqlens, cache_leftpad, batch_size: int, capacity: int) -> list[tuple[int, int]]:
    """Return per-batch (leftpad, end): visible keys are cache positions [leftpad, end)."""
    if cache_seqlens is None:
        ends = [capacity] * batch_size
    elif isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        ends = [cache_seqlens] * batch_size
    else:
        ends = _as_int_vector(cache_seqlens, "cache_seqlens", batch_size).tolist()
    for end in ends:
        if not 0 <= end <= capacity:
            _fail("cache_seqlens", f"every length must lie in [0, {capacity}] (the cache capacity), got {end}")
    if cache_leftpad is None:
        starts = [0] * batch_size
    else:
        starts = _as_int_vector(cache_leftpad, "cache_leftpad", batch_size).tolist()
    for start, end in zip(starts, ends):
        if not 0 <= start <= end:
            _fail("cache_leftpad", f"every entry must lie in [0, cache_seqlens] = [0, {end}], got {start}")
    return list(zip(starts, ends))


def _gather_keys(cache, batch: int, start: int, end: int, page_table, page_size: int, num_pages: int) -> torch.Tensor:
    """Rows of ``cache`` holding cache positions [start, end) of ``batch`` -> (end - start, h_k, dim)."""
    if page_table is None:
        return cache[batch, start:end]
    positions = torch.arange(start, end)
    pages = page_table[batch].to(torch.int64).cpu()[positions // page_size]
    if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= num_pages):
        _fail("page_table", f"pages read for batch {batch} must lie in [0, {num_pages}), got {pages.tolist()}")
    return cache[pages.to(cache.device), (positions % page_size).to(cache.device)]


def resolve_attention_call(
    q,
    k_cache,
    v_cache,
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
) -> AttentionCall:
    """Validate a ``flash_attn_with_kvcache`` call and cut it into per-sequence float64 views (``flash_api.cpp``).

    Raises ``ValueError`` whose message starts with the offending argument's name and states the allowed range.
    Only the page-table entries actually read (pages holding positions ``[leftpad, cache_seqlens)``) are
    range-checked, as only those are dereferenced by FA3.
    """
    varlen = cu_seqlens_q is not None
    paged = page_table is not None
    _check_tensors(q, k_cache, v_cache, varlen, paged)
    if softcap is None or not softcap >= 0:
        _fail("softcap", f"must be >= 0 (0 disables), got {softcap}")
    resolve_window(causal, window_size)  # validates window_size
    rows, seqlen_q = _query_row_ranges(q, cu_seqlens_q, max_seqlen_q, varlen)
    batch_size = len(rows)
    capacity, page_size = _kv_geometry(k_cache, page_table, batch_size, paged)
    keys = _key_ranges(cache_seqlens, cache_leftpad, batch_size, capacity)
    num_heads, head_dim = q.shape[-2], q.shape[-1]
    num_heads_k, head_dim_v = k_cache.shape[2], v_cache.shape[-1]
    qhpk = num_heads // num_heads_k
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)

    batches = []
    for bi, ((row_start, lq), (start, end)) in enumerate(zip(rows, keys)):
        q_b = q[row_start:row_start + lq] if varlen else q[bi]
        k_b = _gather_keys(k_cache, bi, start, end, page_table, page_size, k_cache.shape[0])
        v_b = _gather_keys(v_cache, bi, start, end, page_table, page_size, v_cache.shape[0])
        batches.append(AttentionBatch(
            index=bi,
            q=q_b.double().permute(1, 0, 2).cpu(),
            k=k_b.double().permute(1, 0, 2).repeat_interleave(qhpk, dim=0).cpu(),
            v=v_b.double().permute(1, 0, 2).repeat_interleave(qhpk, dim=0).cpu(),
            visible=visibility_mask(lq, end - start, causal, window_size, int(attention_chunk)),
            row_start=row_start,
        ))
    total_q = q.shape[0] if varlen else batch_size * seqlen_q
    return AttentionCall(
        batches=tuple(batches), varlen=varlen, batch_size=batch_size, seqlen_q=seqlen_q, total_q=total_q,
        num_heads=num_heads, num_heads_k=num_heads_k, head_dim=head_dim, head_dim_v=head_dim_v,
        scale=scale, softcap=float(softcap), causal=bool(causal), window_size=tuple(int(w) for w in window_size),
        q_dtype=q.dtype, attention_chunk=int(attention_chunk),
        # mha_fwd tests total_k = b * k.size(1) (the cache tensor, not cache_seqlens) before launching.
        no_keys_in_call=batch_size * k_cache.shape[1] == 0,
    )


# ----------------------------------------------------------------------------------------------------------
# The oracle
# ----------------------------------------------------------------------------------------------------------


def _lse_dtype(q_dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if q_dtype == torch.float64 else torch.float32


def attention(
    q,
    k_cache,
    v_cache,
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact float64 attention with FA3 ``flash_attn_with_kvcache``'s conventions (``hopper/flash_attn_interface.py``).

    Inputs:
      * ``q``: ``(b, sq, h, d)``, or ``(total_q, h, d)`` with ``cu_seqlens_q`` (int32, ``b + 1``, from 0 to
        total_q, non-decreasing) and ``max_seqlen_q`` (>= the longest sequence; required, as in FA3).
      * ``k_cache``/``v_cache``: ``(b, sk, h_k, d)``/``(b, sk, h_k, dv)``, or paged ``(num_pages, page_size,
        h_k, d/dv)`` with ``page_table (b, max_pages)`` int32; cache position ``p`` of sequence ``bb`` is slot
        ``p % page_size`` of page ``page_table[bb, p // page_size]``. Same dtype as ``q``.
      * GQA: ``h_k`` divides ``h``; query head ``i`` reads KV head ``i // (h // h_k)``.
      * ``cache_seqlens`` (int, or int32 ``(b,)``; default: the capacity ``sk`` or ``max_pages * page_size``)
        and ``cache_leftpad`` (int32 ``(b,)``, default 0): the visible keys of a sequence are cache positions
        ``[leftpad, cache_seqlens)``, i.e. ``Lk = cache_seqlens - leftpad`` keys whose key index 0 is position
        ``leftpad`` (``hopper/seqlen.h``: ``seqlen_k = seqused_k - leftpad_k``, K offset by ``leftpad_k``).
      * Masks are bottom-right aligned per sequence (``hopper/mask.h``): row ``i`` of ``Lq`` sees key ``j`` of
        ``Lk`` iff ``i + Lk - Lq - left <= j <= i + Lk - Lq + right``; any negative window side is unbounded;
        ``causal`` sets ``right = 0`` and keeps a given ``left``; ``attention_chunk > 0`` keeps each row to its
        chunk (:func:`visibility_mask`).
      * ``softcap > 0``: scores become ``softcap * tanh(scale * q.k / softcap)``. ``softmax_scale`` defaults to
        ``1 / sqrt(d)``.

    Outputs: ``out`` shaped like ``q`` with last dim ``dv`` in ``q``'s dtype; ``lse`` (natural log) ``(b, h, sq)``,
    or ``(h, total_q)`` for varlen, float32 (float64 when ``q`` is float64, so the oracle stays exact).

    Edge conventions (FA3's): a row with no visible key has ``out = 0`` and ``lse = -inf``. A call whose cache
    tensor holds no key slots at all (``b * k_cache.shape[1] == 0``; ``mha_fwd``'s ``total_k == 0``) returns
    ``out = 0`` and ``lse = +inf`` for every row. Note this is decided by the tensor's shape: a call whose
    ``cache_seqlens`` are all 0 over a non-empty cache runs the kernel and gets ``(0, -inf)`` rows.

    Stricter than FA3 (which would leave rows unwritten or read out of bounds): ``cu_seqlens_q`` must cover
    ``q`` exactly, ``max_seqlen_q`` must cover every sequence, negative ``softcap`` is rejected, and lengths,
    pages and leftpads must be in range. Every violation raises ``ValueError`` naming the argument.
    """
    call = resolve_attention_call(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
        page_table=page_table, causal=causal, window_size=window_size, softcap=softcap,
        softmax_scale=softmax_scale, cache_leftpad=cache_leftpad, attention_chunk=attention_chunk,
    )
    h, dv = call.num_heads, call.head_dim_v
    if call.varlen:
        out = torch.zeros(call.total_q, h, dv, dtype=torch.float64)
        lse = torch.full((h, call.total_q), -math.inf, dtype=torch.float64)
    else:
        out = torch.zeros(call.batch_size, call.seqlen_q, h, dv, dtype=torch.float64)
        lse = torch.full((call.batch_size, h, call.seqlen_q), -math.inf, dtype=torch.float64)
    if call.no_keys_in_call:
        lse.fill_(math.inf)
    else:
        for batch in call.batches:
            out_b, lse_b = attention_rows(batch.q, batch.k, batch.v, batch.visible, call.scale, call.softcap)
            rows = slice(batch.row_start, batch.row_start + batch.seqlen_q)
            if call.varlen:
                out[rows] = out_b.permute(1, 0, 2)
                lse[:, rows] = lse_b
            else:
                out[batch.index] = out_b.permute(1, 0, 2)
                lse[batch.index] = lse_b
    return out.to(device=q.device, dtype=q.dtype), lse.to(device=q.device, dtype=_lse_dtype(q.dtype))
