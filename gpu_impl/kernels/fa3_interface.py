"""FA3's Python interface (``flash_attn_interface``, FA3 hopper at 0251105a) over the emulated kernel, on CPU.

A drop-in for ``hopper/flash_attn_interface.py``'s forward entry points, with FA3's names, defaults, return
shapes and dtypes: :func:`flash_attn_func`, :func:`flash_attn_varlen_func` (the function vLLM calls),
:func:`flash_attn_with_kvcache`, :func:`get_scheduler_metadata` and :func:`flash_attn_combine`. Every call goes
through ``gpu_impl.kernels.emulated.EmulatedKernel`` (FA3's schedule, its checks with FA3's messages, the tile
plan, then refmodel's exact attention / split-KV / combine); nothing here computes attention.

Module state: one kernel, ``configure(mode=..., num_sm=...)`` replaces it. ``mode="strict"`` (the default) raises
:class:`~gpu_impl.errors.OutOfBoundsAccess` where the real kernel would read or write out of bounds (a
mismatched ``scheduler_metadata``); ``"gpu-like"`` returns the NaNs a GPU would show instead. ``num_sm`` (132, an
H200) drives FA3's split heuristic. ``kernel()`` is the adapter, with its ``last_trace``.

Differences from the real interface, by design or not modelled (docs/emulator.md):

* forward only: no backward (FA3's autograd functions are not reproduced; outputs carry no gradient);
* the failed ``TORCH_CHECK`` s of ``mha_fwd`` raise :class:`~gpu_impl.kernels.call_features.FA3CheckFailed`
  (a ``RuntimeError``, FA3's message in it), the interface's asserts ``AssertionError`` with FA3's message;
* rows FA3 leaves unwritten (``seqused_q`` tails of :func:`flash_attn_varlen_func`) are 0 (LSE ``-inf``) here;
* :func:`flash_attn_combine` with one split returns split 0 (FA3's combine kernel exits early there and the
  output tensor keeps what ``torch.empty`` gave it);
* float32/float64 inputs are accepted (the emulator's tight-tolerance extension); FA3 takes fp16/bf16/fp8.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from refmodel.combine import flash_attn_combine as _ref_combine
from refmodel.errors import FA3Rejected

from .call_features import FA3CheckFailed
from .emulated import EmulatedKernel

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "get_scheduler_metadata",
           "flash_attn_combine", "configure", "kernel", "EMULATED"]

#: marks this module as the emulated interface (``fa3verify`` and users can tell it from a real build)
EMULATED = True

_STATE = {"kernel": EmulatedKernel(mode="strict")}


def configure(mode: str = "strict", num_sm: int = 132) -> EmulatedKernel:
    """Replace the module's kernel: ``mode`` "strict" | "gpu-like", ``num_sm`` the emulated GPU's SM count."""
    _STATE["kernel"] = EmulatedKernel(mode=mode, num_sm=num_sm)
    return _STATE["kernel"]


def kernel() -> EmulatedKernel:
    """The emulated kernel behind this module (``last_trace``: the most recent call's schedule and verdicts)."""
    return _STATE["kernel"]


def _fa3_errors(fn):
    """FA3's ``TORCH_CHECK`` failures found by refmodel's schedule check become :class:`FA3CheckFailed`."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except FA3CheckFailed:
            raise
        except FA3Rejected as exc:
            raise FA3CheckFailed(exc.field, exc.fa3_message, exc.source) from None
    return wrapper


def _maybe_contiguous(x):
    return x.contiguous() if x is not None and x.stride(-1) != 1 else x


@_fa3_errors
def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                            cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                            scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                            return_softmax_lse=False):
    """FA3's ``flash_attn_with_kvcache``: ``out``, or ``(out, softmax_lse, out_accum, softmax_lse_accum)``.

    ``k``/``v`` are written into ``k_cache``/``v_cache`` in place (rotated when ``rotary_cos`` is given), as FA3
    does. ``out_accum``/``softmax_lse_accum`` are ``None`` when the call does not split.
    """
    return _STATE["kernel"].flash_attn_with_kvcache(
        q, k_cache, v_cache, k=_maybe_contiguous(k), v=_maybe_contiguous(v), qv=qv, rotary_cos=rotary_cos,
        rotary_sin=rotary_sin, cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad, page_table=page_table, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k_new=cu_seqlens_k_new, max_seqlen_q=max_seqlen_q, rotary_seqlens=rotary_seqlens,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, attention_chunk=attention_chunk, softcap=softcap,
        rotary_interleaved=rotary_interleaved, scheduler_metadata=scheduler_metadata, num_splits=num_splits,
        pack_gqa=pack_gqa, sm_margin=sm_margin, return_softmax_lse=return_softmax_lse)


@_fa3_errors
def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                           cache_seqlens: torch.Tensor, qkv_dtype=torch.bfloat16, headdim_v=None,
                           cu_seqlens_q: Optional[torch.Tensor] = None,
                           cu_seqlens_k_new: Optional[torch.Tensor] = None,
                           cache_leftpad: Optional[torch.Tensor] = None, page_size: Optional[int] = None,
                           max_seqlen_k_new=0, causal=False, window_size=(-1, -1), attention_chunk=0,
                           has_softcap=False, num_splits=0, pack_gqa=None, sm_margin=0):
    """FA3's ``get_scheduler_metadata``: the int32 metadata tensor (refmodel's ``mha_fwd_get_scheduler_metadata``)."""
    return _STATE["kernel"].get_scheduler_metadata(
        batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, _maybe_contiguous(cache_seqlens),
        qkv_dtype=qkv_dtype, headdim_v=headdim if headdim_v is None else headdim_v, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k_new=cu_seqlens_k_new, cache_leftpad=cache_leftpad, page_size=page_size,
        max_seqlen_k_new=max_seqlen_k_new, causal=causal, window_size=window_size, attention_chunk=attention_chunk,
        has_softcap=has_softcap, num_splits=num_splits, pack_gqa=pack_gqa, sm_margin=sm_margin)


@_fa3_errors
def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                    pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
    """FA3's ``flash_attn_func`` (forward): ``out`` ``(b, sq, h, dv)``, or ``(out, softmax_lse (b, h, sq))``.

    ``mha_fwd`` without ``cache_seqlens``: the call is not varlen and runs no prepare step. ``deterministic``
    concerns the backward pass only.
    """
    q, k = _maybe_contiguous(q), _maybe_contiguous(k)
    v = _maybe_contiguous(v)
    out, lse, *_ = _STATE["kernel"].flash_attn_with_kvcache(
        q, k, v, qv=qv, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, softmax_scale=softmax_scale,
        causal=causal, window_size=window_size, attention_chunk=attention_chunk, softcap=softcap,
        num_splits=num_splits, pack_gqa=pack_gqa, sm_margin=sm_margin, return_softmax_lse=True)
    return (out, lse) if return_attn_probs else out


def _varlen_lengths(cu: torch.Tensor, name: str) -> list[int]:
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name}: must be a 1-D torch.int32 tensor of length b + 1")
    if cu.dtype != torch.int32:
        raise FA3CheckFailed(name, f"{name} must have dtype torch.int32", "hopper/flash_api.cpp@0251105a:748")
    return [int(x) for x in cu.cpu().tolist()]


def _used(seqused, name: str, b: int, full: list[int]) -> list[int]:
    if seqused is None:
        return full
    if seqused.dtype != torch.int32:
        raise FA3CheckFailed(name, f"{name} must have dtype int32", "hopper/flash_api.cpp@0251105a:816")
    if tuple(seqused.shape) != (b,):
        raise FA3CheckFailed(name, f"{name} must have shape ({b})", "hopper/flash_api.cpp@0251105a:818")
    used = [int(x) for x in seqused.cpu().tolist()]
    bad = [i for i, (u, f) in enumerate(zip(used, full)) if not 0 <= u <= f]
    if bad:
        raise ValueError(f"{name}: every entry must lie in [0, the sequence's length in cu_seqlens], got {used} "
                         f"for lengths {full}")
    return used


@_fa3_errors
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                           seqused_k=None, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                           v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
    """FA3's ``flash_attn_varlen_func`` (forward): packed ``q (total_q, h, d)``, ``k``/``v (total_k, h_k, d/dv)``.

    Returns ``out (total_q, h, dv)``, or ``(out, softmax_lse (h, total_q))``. Sequence ``bb`` holds query rows
    ``cu_seqlens_q[bb] ..`` (the first ``seqused_q[bb]`` of them when given) and keys ``cu_seqlens_k[bb] ..`` (the
    first ``seqused_k[bb]``). The emulator lays K out per sequence (``(b, max_seqlen_k, h_k, d)`` with the lengths
    as ``cache_seqlens``), which is how FA3 schedules it too: varlen, the prepare step over these lengths,
    ``seqlen_k = max_seqlen_k``.
    """
    q, k, v = _maybe_contiguous(q), _maybe_contiguous(k), _maybe_contiguous(v)
    if max_seqlen_q is None:
        raise FA3CheckFailed("max_seqlen_q", "max_seqlen_q must be provided if cu_seqlens_q is provided",
                             "hopper/flash_api.cpp@0251105a:741")
    if max_seqlen_k is None:
        raise FA3CheckFailed("max_seqlen_k", "max_seqlen_k must be provided if cu_seqlens_k is provided",
                             "hopper/flash_api.cpp@0251105a:749")
    cu_q, cu_k = _varlen_lengths(cu_seqlens_q, "cu_seqlens_q"), _varlen_lengths(cu_seqlens_k, "cu_seqlens_k")
    b = len(cu_q) - 1
    if len(cu_k) != b + 1:
        raise FA3CheckFailed("cu_seqlens_k", f"cu_seqlens_k must have shape ({b + 1})", "hopper/flash_api.cpp@0251105a:806")
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name}: must be packed (total_k, h_k, d) with cu_seqlens_k, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    q_len = [hi - lo for lo, hi in zip(cu_q[:-1], cu_q[1:])]
    k_len = [hi - lo for lo, hi in zip(cu_k[:-1], cu_k[1:])]
    used_q, used_k = _used(seqused_q, "seqused_q", b, q_len), _used(seqused_k, "seqused_k", b, k_len)
    if any(n > int(max_seqlen_k) for n in used_k):
        raise ValueError(f"max_seqlen_k: must be >= every sequence's key count {max(used_k)}, got {max_seqlen_k}")
    hk, d, dv = k.shape[1], k.shape[2], v.shape[2]
    k_pad = torch.zeros(b, int(max_seqlen_k), hk, d, dtype=k.dtype, device=k.device)
    v_pad = torch.zeros(b, int(max_seqlen_k), hk, dv, dtype=v.dtype, device=v.device)
    for bb in range(b):
        k_pad[bb, :used_k[bb]] = k[cu_k[bb]:cu_k[bb] + used_k[bb]]
        v_pad[bb, :used_k[bb]] = v[cu_k[bb]:cu_k[bb] + used_k[bb]]
    rows = torch.cat([torch.arange(cu_q[bb], cu_q[bb] + used_q[bb]) for bb in range(b)]) if b else \
        torch.zeros(0, dtype=torch.int64)
    compact = seqused_q is not None
    q_eff = q[rows.to(q.device)] if compact else q
    qv_eff = qv[rows.to(qv.device)] if compact and qv is not None else qv
    cu_eff = torch.tensor([0] + list(torch.tensor(used_q).cumsum(0).tolist()), dtype=torch.int32,
                          device=cu_seqlens_q.device) if compact else cu_seqlens_q
    out, lse, *_ = _STATE["kernel"].flash_attn_with_kvcache(
        q_eff, k_pad, v_pad, qv=qv_eff, cache_seqlens=torch.tensor(used_k, dtype=torch.int32, device=k.device),
        cu_seqlens_q=cu_eff, max_seqlen_q=max_seqlen_q, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        attention_chunk=attention_chunk, softcap=softcap, num_splits=num_splits, pack_gqa=pack_gqa,
        sm_margin=sm_margin, return_softmax_lse=True, total_k=k.shape[0])
    if compact:
        full_out = torch.zeros((q.shape[0],) + tuple(out.shape[1:]), dtype=out.dtype, device=out.device)
        full_lse = torch.full((lse.shape[0], q.shape[0]), float("-inf"), dtype=lse.dtype, device=lse.device)
        full_out[rows.to(out.device)] = out
        full_lse[:, rows.to(lse.device)] = lse
        out, lse = full_out, full_lse
    return (out, lse) if return_attn_probs else out


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """FA3's ``flash_attn_combine``: ``out_partial (S, b, sq, h, dv)``, ``lse_partial (S, b, sq, h)`` float32 ->
    ``(out (b, sq, h, dv), lse (b, sq, h))`` (refmodel's combine; one split: split 0 passed through)."""
    return _ref_combine(out_partial, lse_partial, out=out, out_dtype=out_dtype)
