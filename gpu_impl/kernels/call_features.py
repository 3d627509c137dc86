"""The FA3 call's features beyond a plain KV-cache read: FA3's checks on them, and what the numerics then read.

Invariant: a ``flash_attn_with_kvcache`` call with appended KV (``k``/``v``, varlen ``cu_seqlens_k_new``),
rotary (``rotary_cos``/``rotary_sin``/``rotary_seqlens``, interleaved or not), ``cache_batch_idx``, ``qv``,
``attention_chunk`` or FP8 descales is checked as ``mha_fwd`` checks it (``hopper/flash_api.cpp`` at 0251105a;
FA3's messages, raised as :class:`FA3CheckFailed`, a ``RuntimeError`` as ``TORCH_CHECK`` raises), and is then
run by the emulator as the plain call refmodel computes: the scheduler sees the call's own shapes (with the
new-KV lengths), the numerics see the transformed inputs (:class:`NumericsView`, built by
``refmodel.kv_update``): new keys rotated and written into the cache **in place** (as FA3 does), queries
rotated, the cache rows picked by ``cache_batch_idx``, ``qv`` folded into the scores as ``[q, qv] . [k, v]``
(FA3's ``S = Q K^T + Qv V^T``), FP8 inputs dequantized by their descales into float64 and the output in bfloat16
(``mha_fwd``'s ``out_type``). The attention itself is refmodel's (one softmax).

What FA3 ignores is ignored here: ``rotary_seqlens`` (and ``rotary_interleaved``) without ``rotary_cos``, the
descales of a non-FP8 call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from refmodel.errors import FA3Rejected
from refmodel.fa3_scheduler import resolve_masking
from refmodel.kv_update import append_kv, dequantize, rotary_positions_k, rotary_positions_q, rotate
from refmodel.validation import SRC

from .call_model import CallArgs, CallShape, call_shape

__all__ = ["FA3CheckFailed", "NumericsView", "FP8", "prepare_kvcache_call", "out_dtype_for", "plain_view"]

FP8 = getattr(torch, "float8_e4m3fn", None)
_FA3_DTYPES = tuple(t for t in (torch.float16, torch.bfloat16, FP8) if t is not None)
_EMULATOR_DTYPES = (torch.float32, torch.float64)   # the emulator's extension (tight-tolerance tests)


class FA3CheckFailed(FA3Rejected, RuntimeError):
    """A ``TORCH_CHECK`` of ``mha_fwd`` fails: FA3 raises ``RuntimeError`` with this message (also a ``ValueError``,
    the project's bad-input class, through :class:`~refmodel.errors.FA3Rejected`)."""


def _check(ok: bool, field: str, message: str, line) -> None:
    if not ok:
        raise FA3CheckFailed(field, message, f"{SRC}:{line}")


def out_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """``mha_fwd``'s ``out_type``: bfloat16 for FP8 input, else the input's dtype."""
    return torch.bfloat16 if FP8 is not None and dtype == FP8 else dtype


@dataclass
class NumericsView:
    """The tensors the numerics read (refmodel's plain ``flash_attn_with_kvcache`` arguments)."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_seqlens: Optional[torch.Tensor]
    cache_leftpad: Optional[torch.Tensor]
    page_table: Optional[torch.Tensor]
    cu_seqlens_q: Optional[torch.Tensor]
    max_seqlen_q: Optional[int]
    softmax_scale: Optional[float]
    out_dtype: torch.dtype
    kv_lengths: list       # per batch: the KV slots the numerics see (cache_seqlens + new keys), before leftpad


def plain_view(args: CallArgs, shape: CallShape) -> NumericsView:
    """The call's own tensors (no feature transforms)."""
    lens = list(shape.seqused_k)
    return NumericsView(q=args.q, k_cache=args.k_cache, v_cache=args.v_cache, cache_seqlens=args.cache_seqlens,
                        cache_leftpad=args.cache_leftpad, page_table=args.page_table, cu_seqlens_q=args.cu_seqlens_q,
                        max_seqlen_q=args.max_seqlen_q, softmax_scale=args.softmax_scale,
                        out_dtype=out_dtype_for(args.q.dtype), kv_lengths=lens)


def _int32_vector(x, name: str, n: int, line) -> None:
    _check(x.dtype == torch.int32, name, f"{name} must have dtype torch.int32", line)
    _check(x.is_contiguous(), name, f"{name} must be contiguous", line)
    _check(tuple(x.shape) == (n,), name, f"{name} must have shape ({n})", line)


def _lengths(cu: torch.Tensor) -> list[int]:
    values = [int(x) for x in cu.cpu().tolist()]
    return [hi - lo for lo, hi in zip(values[:-1], values[1:])]


def _check_inputs(q, k_cache, v_cache) -> None:
    """``mha_fwd``'s first checks (dtype, same dtype, contiguous last dim), flash_api.cpp 712-725."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: must be a tensor, got {type(t).__name__}")
    _check(q.dtype in _FA3_DTYPES + _EMULATOR_DTYPES, "q",
           "FlashAttention only supports fp16, bf16, and fp8_e4m3 data type", 713)
    _check(k_cache.dtype == q.dtype, "k_cache", "query and key must have the same dtype", 719)
    _check(v_cache.dtype == q.dtype, "v_cache", "query and value must have the same dtype", 720)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check(t.stride(-1) == 1, name, "Input tensor must have contiguous last dimension", 724)


def prepare_kvcache_call(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                         cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                         cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                         q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                         window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                         scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                         return_softmax_lse=False, total_k=None) -> tuple[CallShape, CallArgs]:
    """Check a full ``flash_attn_with_kvcache`` call as FA3 does and return its shape and arguments.

    ``args.numerics`` is a callable ``(schedule) -> NumericsView`` that applies the features (writing appended KV
    into the cache in place); the emulator calls it only once the call's plan has passed, just before its numerics.
    ``total_k`` overrides ``mha_fwd``'s ``total_k`` (a packed varlen K).
    """
    if len(tuple(window_size)) != 2:
        raise ValueError(f"window_size: must be a pair (left, right), got {window_size!r}")
    _check_inputs(q, k_cache, v_cache)
    if int(attention_chunk) < 0:
        raise ValueError(f"attention_chunk: must be >= 0 (0 disables), got {attention_chunk}")
    shape = call_shape(q, k_cache, v_cache, cache_seqlens, cache_leftpad, page_table, cu_seqlens_q, max_seqlen_q,
                       kv_batch_idx=cache_batch_idx)
    b, hk, d, dv = shape.batch_size, shape.num_heads_k, shape.headdim, shape.headdim_v
    is_fp8 = FP8 is not None and q.dtype == FP8

    new_lengths = None
    if k is not None:
        _check(v is not None, "v", "If k_new is supplied, v_new must also be passed in", 929)
        for name, t in (("k", k), ("v", v)):
            _check(t.dtype == q.dtype, name, f"{name[0]}_new must have the same dtype as query", 941)
            _check(t.stride(-1) == 1, name, f"{name[0]}_new tensor must have contiguous last dimension", 945)
        if cu_seqlens_k_new is not None:
            _int32_vector(cu_seqlens_k_new, "cu_seqlens_k_new", b + 1, 937)
            _check(k.dim() == 3 and tuple(k.shape[1:]) == (hk, d), "k", f"k must have shape (total_k_new, {hk}, {d})",
                   958)
            _check(tuple(v.shape) == (k.shape[0], hk, dv), "v", f"v must have shape ({k.shape[0]}, {hk}, {dv})", 959)
            new_lengths = _lengths(cu_seqlens_k_new)
            seqlen_knew, total_knew = 0, k.shape[0]
        else:
            _check(k.dim() == 4 and tuple(k.shape[:1] + k.shape[2:]) == (b, hk, d), "k",
                   f"k must have shape ({b}, seqlen_new, {hk}, {d})", 954)
            _check(tuple(v.shape) == (b, k.shape[1], hk, dv), "v", f"v must have shape ({b}, {k.shape[1]}, {hk}, {dv})",
                   955)
            new_lengths = [k.shape[1]] * b
            seqlen_knew, total_knew = k.shape[1], b * k.shape[1]
        base_total = b * shape.cache_slots if total_k is None else total_k
        shape = dataclasses.replace(shape, seqlen_knew=seqlen_knew, has_k_new=True, seqlens_new=tuple(new_lengths),
                                    total_k=base_total + total_knew)
    elif total_k is not None:
        shape = dataclasses.replace(shape, total_k=total_k)

    if qv is not None:
        _check(d <= 64, "qv", "q_v is only supported for head_size <= 64", 1032)
        _check(dv >= 256, "qv", "q_v is only supported for hdim_v >= 256.", 1033)
        _check(q.dtype in (torch.float16, torch.bfloat16) + _EMULATOR_DTYPES, "qv",
               "q_v is only supported for fp16 and bf16 data type", 1034)
        _check(qv.dtype == q.dtype, "qv", "q_v must have the same dtype as query", 1038)
        _check(qv.stride(-1) == 1, "qv", "q_v tensor must have contiguous last dimension", 1040)
        _check(tuple(qv.shape) == tuple(q.shape[:-1]) + (dv,), "qv",
               f"q_v must have shape {tuple(q.shape[:-1]) + (dv,)}", 1042)

    rotary = rotary_cos is not None
    if rotary:
        _check(k is not None, "rotary_cos", "If rotary cos/sin are provided, new key / value to be appended to KV "
               "cache must also be provided", 1056)
        rotary_dim = rotary_cos.shape[1] * 2
        _check(rotary_dim <= d, "rotary_cos", "rotary_dim must be <= headdim", 1060)
        _check(rotary_dim % 16 == 0, "rotary_cos", "Only rotary dimensions divisible by 16 are currently supported",
               1061)
        seqlen_ro = rotary_cos.shape[0]
        if shape.page_size is not None:
            _check(seqlen_ro >= shape.seqlen_k, "rotary_cos", "cos/sin seqlen must be at least the seqlen of KV cache",
                   1064)
        _check(rotary_cos.dtype == q.dtype, "rotary_cos", "rotary_cos must have the same dtype as query", 1067)
        _check(rotary_sin is not None, "rotary_sin", "If rotary cos is provided, rotary sin must also be provided",
               1069)
        _check(tuple(rotary_sin.shape) == tuple(rotary_cos.shape), "rotary_sin",
               f"rotary_sin must have shape {tuple(rotary_cos.shape)}", 1072)
        _check(rotary_sin.dtype == q.dtype, "rotary_sin", "rotary_cos must have the same dtype as query", 1073)
        if rotary_seqlens is not None:
            _int32_vector(rotary_seqlens, "seqlens_rotary", b, 1081)

    if cache_batch_idx is not None:
        _check(cache_batch_idx.dtype == torch.int32, "cache_batch_idx", "kv_batch_idx must have dtype int32", 1091)
        rows = [int(x) for x in cache_batch_idx.cpu().tolist()]
        limit = page_table.shape[0] if page_table is not None else k_cache.shape[0]
        if len(rows) < b or any(not 0 <= r < limit for r in rows[:b]):
            raise ValueError(f"cache_batch_idx: needs {b} entries in [0, {limit}) (rows of "
                             f"{'page_table' if page_table is not None else 'k_cache'}), got {rows}")

    if is_fp8:
        for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
            if t is not None:
                _check(tuple(t.shape) == (b, hk), name, f"{name} must have shape ({b}, {hk})", 1122)

    args = CallArgs(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens, cache_leftpad=cache_leftpad,
                    page_table=page_table, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                    softmax_scale=softmax_scale, causal=bool(causal),
                    window_size=(int(window_size[0]), int(window_size[1])), softcap=float(softcap or 0.0),
                    scheduler_metadata=scheduler_metadata, num_splits=int(num_splits), pack_gqa=pack_gqa,
                    sm_margin=int(sm_margin), return_softmax_lse=bool(return_softmax_lse),
                    attention_chunk=int(attention_chunk))
    features = dict(k=k, v=v, qv=qv, rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_seqlens=rotary_seqlens,
                    rotary_interleaved=bool(rotary_interleaved), cache_batch_idx=cache_batch_idx,
                    cu_seqlens_k_new=cu_seqlens_k_new, new_lengths=new_lengths,
                    descales=(q_descale, k_descale, v_descale) if is_fp8 else None)
    if all(features[n] is None for n in ("k", "qv", "cache_batch_idx", "descales")) and not is_fp8:
        return shape, args
    return shape, args.replace(numerics=_Features(args, shape, features))


class _Features:
    """Applies the features when the emulator's numerics start (callable: ``(schedule) -> NumericsView``)."""

    def __init__(self, args: CallArgs, shape: CallShape, features: dict):
        self.args, self.shape, self.f = args, shape, features

    def __call__(self, schedule) -> NumericsView:
        args, shape, f = self.args, self.shape, self.f
        b = shape.batch_size
        q, k_cache, v_cache, page_table = args.q, args.k_cache, args.v_cache, args.page_table
        cache_lens = list(shape.seqused_k)
        starts = [0]
        for n in shape.seqlens_q:
            starts.append(starts[-1] + n)
        rows_of = (lambda bb: slice(starts[bb], starts[bb + 1])) if shape.varlen_q else (lambda bb: bb)
        idx = f["cache_batch_idx"]
        cache_rows = [int(x) for x in idx.cpu().tolist()[:b]] if idx is not None else list(range(b))
        seqlen_rotary = cache_lens
        if f["rotary_seqlens"] is not None and f["rotary_cos"] is not None:
            seqlen_rotary = [int(x) for x in f["rotary_seqlens"].cpu().tolist()]
        kv_lengths = list(cache_lens)
        if f["k"] is not None:
            k_new, v_new = f["k"], f["v"]
            if f["cu_seqlens_k_new"] is not None:
                cu = [int(x) for x in f["cu_seqlens_k_new"].cpu().tolist()]
                k_rows = [k_new[cu[bb]:cu[bb + 1]] for bb in range(b)]
                v_rows = [v_new[cu[bb]:cu[bb + 1]] for bb in range(b)]
            else:
                k_rows, v_rows = [k_new[bb] for bb in range(b)], [v_new[bb] for bb in range(b)]
            if f["rotary_cos"] is not None:
                k_rows = [self._rotate(kr, rotary_positions_k(seqlen_rotary[bb], kr.shape[0]), "k")
                          for bb, kr in enumerate(k_rows)]
            append_kv(k_cache, v_cache, k_rows, v_rows, cache_lens, cache_rows, page_table)
            kv_lengths = [c + n for c, n in zip(cache_lens, f["new_lengths"])]
        if idx is not None:
            if page_table is None:
                pick = torch.tensor(cache_rows, dtype=torch.int64, device=k_cache.device)
                k_cache, v_cache = k_cache[pick], v_cache[pick]
            else:
                page_table = page_table[torch.tensor(cache_rows, dtype=torch.int64, device=page_table.device)]
        if f["rotary_cos"] is not None:
            local = schedule.masking.is_causal or schedule.masking.is_local
            q = q.clone()
            for bb in range(b):
                rows = q[rows_of(bb)]            # (Lq, h, d)
                q[rows_of(bb)] = self._rotate(rows, rotary_positions_q(seqlen_rotary[bb], rows.shape[0], local), "q")
        out_dtype = out_dtype_for(args.q.dtype)
        if f["descales"] is not None:
            q, k_cache, v_cache, page_table = self._dequantize(q, k_cache, v_cache, page_table, rows_of)
        if f["qv"] is not None:
            q = torch.cat((q, f["qv"].to(q.dtype)), dim=-1)
            k_cache = torch.cat((k_cache, v_cache), dim=-1)
        device = args.q.device
        lens_tensor = None
        if args.cache_seqlens is not None or f["k"] is not None:
            lens_tensor = torch.tensor(kv_lengths, dtype=torch.int32, device=device)
        return NumericsView(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=lens_tensor,
                            cache_leftpad=args.cache_leftpad, page_table=page_table, cu_seqlens_q=args.cu_seqlens_q,
                            max_seqlen_q=args.max_seqlen_q, softmax_scale=args.softmax_scale, out_dtype=out_dtype,
                            kv_lengths=kv_lengths)

    def _rotate(self, x, positions, which: str):
        cos, sin = self.f["rotary_cos"], self.f["rotary_sin"]
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= cos.shape[0]):
            raise ValueError(f"rotary_cos: rotating {which} reads positions {int(positions.min())}.."
                             f"{int(positions.max())}, past its {cos.shape[0]} rows (FA3 would read out of bounds); "
                             f"allowed range is [0, {cos.shape[0]})")
        return rotate(x, cos, sin, positions, self.f["rotary_interleaved"])

    def _dequantize(self, q, k_cache, v_cache, page_table, rows_of: Callable):
        """FP8: q, k, v as float64 times their ``(b, h_k)`` descales; a paged cache is gathered per batch first."""
        from .fa3 import gather_paged_kv

        shape = self.shape
        q_descale, k_descale, v_descale = self.f["descales"]
        b, group = shape.batch_size, shape.qhead_per_khead
        if page_table is not None:
            k_cache, v_cache = gather_paged_kv(k_cache, page_table), gather_paged_kv(v_cache, page_table)
            page_table = None
        q64 = torch.empty(q.shape, dtype=torch.float64, device=q.device)
        for bb in range(b):
            rows = q[rows_of(bb)]
            flat = rows.reshape(-1, *rows.shape[-2:])
            q64[rows_of(bb)] = dequantize(flat, q_descale, torch.full((flat.shape[0],), bb), group).reshape(rows.shape)
        k64 = torch.stack([dequantize(k_cache[bb], k_descale, torch.full((k_cache.shape[1],), bb), 1)
                           for bb in range(b)]) if b else k_cache.to(torch.float64)
        v64 = torch.stack([dequantize(v_cache[bb], v_descale, torch.full((v_cache.shape[1],), bb), 1)
                           for bb in range(b)]) if b else v_cache.to(torch.float64)
        return q64, k64, v64, page_table
