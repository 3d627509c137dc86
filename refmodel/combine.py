"""FA3's split-KV combine: merge per-split ``(O_partial, LSE_partial)`` into the final output and LSE.

Semantics follow ``hopper/flash_fwd_combine_kernel.h`` (the per-row math), the split capacity ``kMax`` follows
``hopper/flash_fwd_combine_launch_template.h`` and ``hopper/flash_api.cpp`` (``run_mha_fwd_combine``), and the
Python-facing signature and shapes follow ``mha_combine`` / ``flash_attn_combine``
(``hopper/flash_attn_interface.py``). All arithmetic is float32, as in the kernel. FA3 is built with fast math,
so agreement is in semantics and tolerance, not bits.

Per row, with ``n`` = the row's split count (``num_splits_per_batch`` or all ``S``) and ``kMax`` the capacity:

* ``lse_s`` is read for ``s < min(n, kMax)``; every other slot is ``-inf``;
* ``M = max_s lse_s`` ignoring NaN (``fmaxf``), NaN only if every one of the ``kMax`` slots is NaN (simplified
  here to a NaN-propagating max: a read NaN ``lse_s`` makes ``Z`` and ``LSE`` NaN and every scale NaN whichever
  max is taken, so the two are indistinguishable in ``O`` and ``LSE``);
* ``Mc = 0 if M == -inf else M`` (the ``-inf`` guard); ``w_s = exp(lse_s - Mc)``; ``Z = sum_s w_s``;
* ``LSE = log(Z) + M``; ``inv = 0 if Z == 0 or Z is NaN else 1/Z``; ``c_s = w_s * inv``;
* ``O = sum_s c_s * O_partial_s`` ascending in float32, skipping splits with ``not (c_s > 0)`` -- so zero and
  NaN scales are skipped, and an unwritten (garbage) ``O_partial`` behind an ``-inf`` LSE is never read.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .fa3_scheduler import CALL_MAX_SPLITS as _MAX_SPLITS
from .fa3_scheduler import combine_capacity  # one source for kMax (flash_fwd_combine_launch_template.h)

__all__ = ["combine_capacity", "flash_attn_combine", "merge_states"]

_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)



def _fail(argument: str, message: str) -> None:
    raise ValueError(f"{argument}: {message}")


# Two ways to compute the same sum, chosen by size for speed only: below the thresholds one broadcast multiply makes
# every product at once; above them (where that (S, N, dv) temporary outgrows the caches) each split's products are
# made in turn. Both round the same way (each product to float32, then each ascending add to float32, from +0), so
# the oracle's bits do not depend on the path (tests/oracle/test_combine_paths.py runs both on one input).
_LOOP_MIN_ROW_ELEMS = 1 << 15
_LOOP_MIN_TOTAL_ELEMS = 1 << 21


def _accumulate(scales: torch.Tensor, out_partial: torch.Tensor, per_split: bool | None = None) -> torch.Tensor:
    """``sum_s scales[s] * out_partial[s]`` over splits in ascending order, float32 (flash_fwd_combine_kernel.h 669-693).

    Each product is rounded to float32 and added to the float32 accumulator (started at +0) in split order; the
    kernel's ``tOrO += scale * rOpartial`` is contracted into one fused multiply-add by nvcc (one rounding where
    this has two; within the combine's tolerance, FA3 being built with fast math). ``per_split`` picks the path
    (``None``: by size); the result is the same bits either way.
    """
    num_splits, rows, dv = out_partial.shape
    if per_split is None:
        per_split = rows * dv >= _LOOP_MIN_ROW_ELEMS and num_splits * rows * dv >= _LOOP_MIN_TOTAL_ELEMS
    out = torch.zeros(rows, dv, dtype=torch.float32, device=out_partial.device)
    if per_split:
        product = torch.empty_like(out)
        for s in range(num_splits):
            out.add_(torch.mul(scales[s].unsqueeze(-1), out_partial[s], out=product))
        return out
    products = scales.unsqueeze(-1) * out_partial  # small: one broadcast multiply instead of S
    for s in range(num_splits):
        out.add_(products[s])
    return out


def _combine_rows(
    lse: torch.Tensor,
    out_partial: torch.Tensor,
    reads: torch.Tensor | None,
    guard_neg_inf: bool,
    skip_nonpositive: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine ``lse (S, N)`` / ``out_partial (S, N, dv)`` float32 rows (the kernel's steps 1-6).

    ``reads[r]`` is how many splits row ``r`` reads (``None``: all ``S``, which requires ``S <= kMax``); the
    kernel's LSE slots past ``reads[r]`` hold ``-inf``.
    """
    read = None
    if reads is not None:
        read = torch.arange(lse.shape[0], device=lse.device).unsqueeze(1) < reads.unsqueeze(0)
        lse = lse.masked_fill(~read, -math.inf)
    # amax propagates NaN where the kernel's fmaxf ignores it. Which max is used is unobservable: a read NaN lse_s
    # makes Z NaN, so LSE is NaN; every scale is then NaN (skipped, or on the no-skip path NaN * O_partial), so
    # the row's output is 0 (skip) or NaN (no skip) whichever max is used.
    lse_max = lse.amax(dim=0)
    shift = lse_max.nan_to_num(nan=math.nan, posinf=math.inf, neginf=0.0) if guard_neg_inf else lse_max
    weights = torch.exp(lse - shift)
    total = weights.sum(dim=0)
    lse_out = torch.log(total) + lse_max
    if skip_nonpositive:
        # 1/Z is inf when Z == 0 and NaN when Z is NaN; either way w * (1/Z) is NaN exactly where FA3's guarded
        # inverse yields a scale that is not > 0, so zeroing NaN scales is the kernel's skip (0-scales add 0).
        scales = (weights * total.reciprocal()).nan_to_num_(nan=0.0, posinf=math.inf, neginf=-math.inf)
    else:
        inv_total = total.reciprocal().masked_fill((total == 0) | torch.isnan(total), 0.0)
        scales = weights * inv_total
        if read is not None:
            scales = scales.masked_fill(~read, 0.0)
    out = _accumulate(scales, out_partial)
    if not math.isfinite(float(out.sum())):  # one cheap reduction; any NaN/inf element makes the sum non-finite
        if skip_nonpositive:
            used = scales > 0
        else:
            used = read if read is not None else torch.ones_like(scales, dtype=torch.bool)
        _redo_rows_with_garbage(out, out_partial, scales, used)
    return out, lse_out


def _redo_rows_with_garbage(out, out_partial, scales, used) -> None:
    """Rows made non-finite may owe it to ``0 * inf``/``0 * NaN`` from a split the kernel never reads: redo exactly.

    ``used`` (S, N) marks the splits that contribute to each row.
    """
    rows = torch.nonzero(~torch.isfinite(out).all(dim=-1)).squeeze(-1)
    exact = torch.zeros(rows.numel(), out.shape[-1], dtype=torch.float32, device=out.device)
    for s in range(out_partial.shape[0]):
        term = scales[s, rows].unsqueeze(-1) * out_partial[s, rows]
        exact += torch.where(used[s, rows].unsqueeze(-1), term, 0.0)
    out[rows] = exact


def _row_split_counts(
    num_splits_per_batch, batch_of_row, varlen: bool, lse_shape: torch.Size, device: torch.device
) -> torch.Tensor | None:
    """Split count of every flattened row ``(b, sq, h)`` / ``(total_q, h)``; ``None`` when not given (all ``S``)."""
    if num_splits_per_batch is None:
        if batch_of_row is not None:
            _fail("batch_of_row", "is only meaningful together with num_splits_per_batch")
        return None
    counts = torch.as_tensor(num_splits_per_batch).to(torch.int64).cpu().reshape(-1)
    if counts.numel() and int(counts.min()) < 0:
        _fail("num_splits_per_batch", f"entries must be >= 0, got {counts.tolist()}")
    heads = lse_shape[-1]
    if not varlen:
        if batch_of_row is not None:
            _fail("batch_of_row", "is only for the varlen layout (S, total_q, h); the batched layout implies it")
        if counts.numel() != lse_shape[1]:
            _fail("num_splits_per_batch", f"must have length b={lse_shape[1]}, got {counts.numel()}")
        return counts.repeat_interleave(lse_shape[2] * heads).to(device)
    if batch_of_row is None:
        _fail("batch_of_row", "is required with num_splits_per_batch in the varlen layout (S, total_q, h)")
    owner = torch.as_tensor(batch_of_row).to(torch.int64).cpu().reshape(-1)
    if owner.numel() != lse_shape[1]:
        _fail("batch_of_row", f"must have length total_q={lse_shape[1]}, got {owner.numel()}")
    if owner.numel() and (int(owner.min()) < 0 or int(owner.max()) >= counts.numel()):
        _fail("batch_of_row", f"entries must lie in [0, {counts.numel()}), got {owner.tolist()}")
    return counts[owner].repeat_interleave(heads).to(device)


def _check_partials(out_partial, lse_partial) -> bool:
    """Validate shapes/dtypes like ``mha_combine``; return whether the layout is varlen."""
    for name, t in (("out_partial", out_partial), ("lse_partial", lse_partial)):
        if not isinstance(t, torch.Tensor):
            _fail(name, f"must be a tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            _fail(name, f"must be float32 (FA3's combine only supports fp32 partials), got {t.dtype}")
    if out_partial.dim() not in (4, 5):
        _fail("out_partial", f"must be (S, b, sq, h, dv) or varlen (S, total_q, h, dv), got {tuple(out_partial.shape)}")
    if tuple(lse_partial.shape) != tuple(out_partial.shape[:-1]):
        _fail("lse_partial", f"shape must be out_partial's without dv, {tuple(out_partial.shape[:-1])}, "
              f"got {tuple(lse_partial.shape)}")
    num_splits = out_partial.shape[0]
    if not 1 <= num_splits <= _MAX_SPLITS:
        _fail("out_partial", f"split count (dim 0) must lie in [1, {_MAX_SPLITS}], got {num_splits}")
    return out_partial.dim() == 4


def _resolve_out_dtype(out, out_dtype, default: torch.dtype) -> torch.dtype:
    dtype = out_dtype if out_dtype is not None else default
    if dtype not in _OUT_DTYPES:
        _fail("out_dtype", f"must be one of float32, float16, bfloat16, got {dtype}")
    if out is not None and out.dtype != dtype:
        _fail("out", f"dtype must be the output dtype {dtype}, got {out.dtype}")
    return dtype


def flash_attn_combine(
    out_partial: torch.Tensor,
    lse_partial: torch.Tensor,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    num_splits_per_batch: Sequence[int] | torch.Tensor | None = None,
    capacity: int | None = None,
    batch_of_row: Sequence[int] | torch.Tensor | None = None,
    *,
    guard_neg_inf: bool = True,
    skip_nonpositive: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FA3's split-KV combine with ``flash_attn_combine``'s signature (``flash_fwd_combine_kernel.h``, ``mha_combine``).

    Shapes: ``out_partial (S, b, sq, h, dv)``, ``lse_partial (S, b, sq, h)`` float32 -> ``out (b, sq, h, dv)`` and
    ``lse (b, sq, h)`` (float32, a transposed view of ``(b, h, sq)`` storage, as ``mha_combine`` returns it).
    Also accepted (not by upstream's standalone combine, which is 5-D only; ``mha_fwd`` combines varlen
    internally): varlen ``(S, total_q, h, dv)``/``(S, total_q, h)`` -> ``(total_q, h, dv)``/``(total_q, h)``.
    ``out_dtype`` defaults to the partials' dtype (float32), as in ``mha_combine``; ``out``, when given, must
    have the output shape and dtype and is written in place (upstream skips that write-back when dv % 4 != 0;
    not modelled).

    Extensions that model the combine ``mha_fwd`` launches with scheduler metadata:
    ``num_splits_per_batch`` (b,) is the metadata's per-batch split count (indexed by real batch; map virtual
    batches first), with ``batch_of_row (total_q,)`` giving each varlen row's batch. ``capacity`` is ``kMax``
    (default ``combine_capacity(S, dv)``): splits at index ``>= kMax`` are never read. A row reads
    ``min(count, kMax)`` splits; that must not exceed ``S`` (FA3 would read past the buffer: a ``ValueError`` here).

    Rows whose count is ``<= 1`` (and every row when ``S == 1``): FA3's combine writes nothing there (the main
    kernel wrote the output directly); this model writes split 0 through (``out = out_partial[0]``,
    ``lse = lse_partial[0]``) so the result is defined.

    Negative-control switches: ``guard_neg_inf=False`` drops the ``M == -inf -> 0`` guard (all ``-inf`` rows then
    give NaN); ``skip_nonpositive=False`` accumulates every read split, even zero/NaN-weighted ones.
    Vectorised over rows; the only Python loop is over splits (the kernel's ascending float32 accumulation).
    """
    varlen = _check_partials(out_partial, lse_partial)
    num_splits, dv = out_partial.shape[0], out_partial.shape[-1]
    dtype = _resolve_out_dtype(out, out_dtype, out_partial.dtype)
    slots = combine_capacity(num_splits, dv) if capacity is None else int(capacity)
    if slots < 1:
        _fail("capacity", f"must be >= 1, got {capacity}")
    row_shape = tuple(lse_partial.shape[1:])
    if out is not None and tuple(out.shape) != row_shape + (dv,):
        _fail("out", f"shape must be {row_shape + (dv,)}, got {tuple(out.shape)}")

    counts = _row_split_counts(num_splits_per_batch, batch_of_row, varlen, lse_partial.shape, out_partial.device)
    reads = None  # every row reads all S splits
    if counts is not None:
        reads = torch.clamp(counts, max=slots)
        if reads.numel() and int(reads.max()) > num_splits:
            _fail("num_splits_per_batch", f"rows would read {int(reads.max())} splits (min(count, capacity={slots})); "
                  f"allowed range is [0, {num_splits}], the partial buffers' split count")
    elif slots < num_splits:
        reads = torch.full((math.prod(row_shape),), slots, dtype=torch.int64, device=out_partial.device)

    lse_rows = lse_partial.reshape(num_splits, -1)
    out_rows = out_partial.reshape(num_splits, -1, dv)
    if counts is None and num_splits <= 1:
        combined_out, combined_lse = out_rows[0].clone(), lse_rows[0].clone()
    else:
        combined_out, combined_lse = _combine_rows(lse_rows, out_rows, reads, guard_neg_inf, skip_nonpositive)
    if counts is not None:
        passthrough = counts <= 1
        if bool(passthrough.any()):
            combined_out = torch.where(passthrough.unsqueeze(-1), out_rows[0], combined_out)
            combined_lse = torch.where(passthrough, lse_rows[0], combined_lse)
    return _shape_outputs(combined_out, combined_lse, row_shape, dtype, out, varlen)


def _shape_outputs(combined_out, combined_lse, row_shape, dtype, out, varlen):
    """Lay the flat results out as ``mha_combine`` returns them (lse as a transposed ``(b, h, sq)`` buffer)."""
    dv = combined_out.shape[-1]
    result = combined_out.reshape(row_shape + (dv,)).to(dtype)
    if out is not None:
        out.copy_(result)
        result = out
    if varlen:
        return result, combined_lse.reshape(row_shape)
    b, sq, h = row_shape
    lse_out = torch.empty(b, h, sq, dtype=torch.float32, device=combined_lse.device).transpose(1, 2)
    lse_out.copy_(combined_lse.reshape(row_shape))
    return result, lse_out


def merge_states(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    *,
    guard_neg_inf: bool = True,
    skip_nonpositive: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two-way merge of softmax states ``(out, lse)``: FA3's combine of two splits (``flash_fwd_combine_kernel.h``).

    Same float32 semantics as :func:`flash_attn_combine` (no capacity limit, no pass-through), so
    ``merge_states((o, -inf), s) == s`` and merging is associative up to float32 rounding.
    """
    (out_a, lse_a), (out_b, lse_b) = a, b
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or tuple(out_a.shape[:-1]) != tuple(lse_a.shape):
        _fail("a/b", f"states must agree: out {tuple(out_a.shape)} vs {tuple(out_b.shape)}, "
              f"lse {tuple(lse_a.shape)} vs {tuple(lse_b.shape)}")
    dv = out_a.shape[-1]
    lse = torch.stack([lse_a, lse_b]).float().reshape(2, -1)
    out_partial = torch.stack([out_a, out_b]).float().reshape(2, lse.shape[1], dv)
    out, lse_out = _combine_rows(lse, out_partial, None, guard_neg_inf, skip_nonpositive)
    return out.reshape(out_a.shape), lse_out.reshape(lse_a.shape)
