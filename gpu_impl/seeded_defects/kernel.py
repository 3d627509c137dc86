"""Kernel-side seeded defects: mixins over ``gpu_impl.kernels.emulated.EmulatedKernel``, one per defect.

Each mixin overrides the one step of the emulated FA3 call it changes (``_schedule``: the split heuristic and
tiles of ``mha_fwd``, ``hopper/flash_api.cpp``; ``_numerics``; ``_combine``: ``hopper/flash_fwd_combine_kernel.h``)
and calls the unseeded step for everything else. Invariant: an emulated kernel without these mixins is FA3 as
upstream builds it; each mixin re-creates its defect (or, for a counterfactual fix, removes FA3's own) and nothing
more.
"""

from __future__ import annotations

import dataclasses
import math

import torch

__all__ = ["KERNEL_SEEDS", "HeuristicZeroDivision", "KernelUsesHostTiles", "FiniteMaskSentinel",
           "CombineNoNegInfGuard"]


class HeuristicZeroDivision:
    """``heuristic-zero-division`` (flash-attention 484b9813): the unguarded split heuristic runs before the call's
    own schedule and raises ZeroDivisionError on an empty workload (:func:`_unguarded_split_heuristic`)."""

    def _schedule(self, shape, args):
        _unguarded_split_heuristic(shape, args, self.num_sm, self.arch)
        return super()._schedule(shape, args)


class KernelUsesHostTiles:
    """``fa3-kernel-uses-host-tiles`` (counterfactual fix): the kernel uses the host's tiles (``block_m``,
    ``block_n``) instead of the <64, 256> template FA3 picks for d <= 64 with 64 < dv <= 192."""

    def _schedule(self, shape, args):
        schedule = super()._schedule(shape, args)
        return dataclasses.replace(schedule, kernel_block_m=schedule.block_m, kernel_block_n=schedule.block_n)


class FiniteMaskSentinel:
    """``finite-mask-sentinel`` (FlashInfer PR #4401): rows whose visible raw logits all lie at or below the finite
    sentinel come back as zeros with a finite LSE (:func:`_finite_sentinel_rows`)."""

    def _numerics(self, args, plan, poison):
        out, lse = super()._numerics(args, plan, poison)
        return _finite_sentinel_rows(args, out, lse)


class CombineNoNegInfGuard:
    """``combine-no-neg-inf-guard`` (FlashInfer issue #4051): the combine shifts by the row max without the
    M == -inf -> 0 guard (``refmodel.combine.flash_attn_combine(guard_neg_inf=False)``)."""

    def _combine(self, out_partial, lse_partial, **options):
        return super()._combine(out_partial, lse_partial, **{**options, "guard_neg_inf": False})


#: defect name -> the kernel mixin that re-creates it
KERNEL_SEEDS = {
    "heuristic-zero-division": HeuristicZeroDivision,
    "fa3-kernel-uses-host-tiles": KernelUsesHostTiles,
    "finite-mask-sentinel": FiniteMaskSentinel,
    "combine-no-neg-inf-guard": CombineNoNegInfGuard,
}



def _unguarded_split_heuristic(shape, args, num_sm: int, arch: int) -> None:
    """Seeded ``heuristic-zero-division``: the split heuristic of flash_attn/cute/interface.py before 484b9813.

    That heuristic returns 1 for at most 4 n-blocks, else ``min(num_SMs // total_mblocks, ...)`` with no guard and
    no empty-Q early exit, so an empty workload (batch 0, or seqlen_q 0) divides by zero. Only the heuristic path
    (``num_splits <= 0``) reaches it. Raises ZeroDivisionError exactly where that code would.
    """
    from refmodel.fa3_scheduler import ceil_div, resolve_schedule

    from ..kernels.base import call_schedule_inputs

    if args.num_splits > 0:
        return
    inputs = call_schedule_inputs(shape, args.causal, args.window_size, args.softcap, 1, args.pack_gqa,
                                  args.sm_margin, num_sm, arch)
    sched = resolve_schedule(inputs)
    m_blocks = ceil_div(inputs.seqlen_q * sched.qhead_per_khead, sched.block_m)
    total_mblocks = (1 if inputs.uses_prepare else inputs.batch_size) * inputs.num_heads_k * m_blocks
    n_blocks = ceil_div(inputs.seqlen_k, sched.block_n)
    if n_blocks <= 4:
        return
    _ = inputs.num_sm // total_mblocks  # the unguarded division


def _finite_sentinel_rows(args, out: torch.Tensor, lse: torch.Tensor):
    """Seeded ``finite-mask-sentinel``: FlashInfer's FA2 masking before PR #4401, applied to FA3's rows.

    The running max starts at a finite sentinel in the raw q.k domain and masked logits are set to it, so a row
    whose largest visible raw logit is at or below the sentinel (every fully masked row, and rows whose logits all
    lie below it) never raises the max: the row is treated as empty, its output is 0 and its LSE stays at the
    sentinel (finite). Leakage of masked keys into rows whose max sits just above the sentinel is not modelled.
    """
    from refmodel.attention import resolve_attention_call

    from ..defects import FINITE_MASK_SENTINEL

    call = resolve_attention_call(args.q, args.k_cache, args.v_cache, cache_seqlens=args.cache_seqlens,
                                  cu_seqlens_q=args.cu_seqlens_q, max_seqlen_q=args.max_seqlen_q,
                                  page_table=args.page_table, causal=args.causal, window_size=args.window_size,
                                  softcap=args.softcap, softmax_scale=args.softmax_scale,
                                  cache_leftpad=args.cache_leftpad)
    if call.no_keys_in_call:
        return out, lse
    out, lse = out.clone(), lse.clone()
    pinned = FINITE_MASK_SENTINEL * call.scale
    for b in call.batches:
        raw = torch.matmul(b.q, b.k.transpose(-1, -2)).masked_fill(~b.visible, -math.inf)   # (h, Lq, Lk)
        row_max = raw.amax(dim=-1) if raw.shape[-1] else torch.full(raw.shape[:2], -math.inf, dtype=raw.dtype)
        empty = (row_max <= FINITE_MASK_SENTINEL)                                              # (h, Lq)
        if not bool(empty.any()):
            continue
        rows = empty.t().to(out.device)                                                        # (Lq, h)
        if call.varlen:
            sl = slice(b.row_start, b.row_start + b.seqlen_q)
            out[sl] = out[sl].masked_fill(rows.unsqueeze(-1), 0.0)
            lse[:, sl] = lse[:, sl].masked_fill(empty.to(lse.device), pinned)
        else:
            out[b.index, :b.seqlen_q] = out[b.index, :b.seqlen_q].masked_fill(rows.unsqueeze(-1), 0.0)
            lse[b.index, :, :b.seqlen_q] = lse[b.index, :, :b.seqlen_q].masked_fill(empty.to(lse.device), pinned)
    return out, lse
