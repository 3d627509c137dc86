"""The emulated FA3 kernel: FA3's algorithm (schedule, tiles, split kernel, combine) on any torch device.

A call goes through the steps ``mha_fwd`` takes (``hopper/flash_api.cpp``), using refmodel for every formula:

1. the call's own schedule from its shapes (:func:`~gpu_impl.kernels.base.call_schedule`): S_c, pack-GQA,
   tiles, Sort/Swizzle, the metadata size it expects;
2. a given ``scheduler_metadata`` is checked as FA3 checks it (``CHECK_SHAPE`` and friends ->
   :class:`~gpu_impl.errors.MetadataShapeError`), then trusted: split counts, m-blocks and batch order come
   from it; without one, from the call's own prepare step;
3. the tile walk is checked against the call **before any numerics** (:func:`~gpu_impl.kernels.base.check_plan`):
   split indices past the S_c-row partial buffers (SPLIT_BOUND), batch slots unwritten or out of range
   (BATCH_PERMUTATION), rows no m-block covers (QUERY_COVER), splits past the combine's kMax (COMBINE_CAPACITY);
4. numerics: S_c == 1 -> one pass (``refmodel.attention``; metadata split counts ignored, as FA3 does);
   S_c > 1 -> per-split partials (``refmodel.split_kv`` with the metadata's per-batch split counts, the kernel's
   tiles and the call's own KV lengths) combined by ``refmodel.flash_attn_combine`` with kMax.

Modes: ``strict`` raises :class:`~gpu_impl.errors.OutOfBoundsAccess` at step 3 (no numerics run); ``gpu-like``
returns normally with the damage a GPU would show: batches whose combine reads past the buffers, or that no
tile visits, are NaN; rows no tile covers are NaN (``torch.empty`` garbage modelled as NaN). Batches whose
result is certainly garbage are not computed at all (their KV length is set to 0 for the numerics pass), so a
32768-token faulty batch costs nothing.

The call's features (appended KV with rotary, ``cache_batch_idx``, ``qv``, ``attention_chunk``, FP8 descales
with a bfloat16 output) are checked as ``mha_fwd`` checks them and applied to the numerics' inputs by
:mod:`gpu_impl.kernels.call_features`; :mod:`gpu_impl.kernels.fa3_interface` is FA3's Python interface over
this kernel (docs/emulator.md).

Emulator-only extension: float32/float64 inputs are accepted (scheduled as bfloat16) so tests can compare
at tight tolerances; FA3 itself takes bf16/fp16/fp8 only.
"""

from __future__ import annotations

import copy
import math
from typing import Optional

import torch

from refmodel.attention import attention
from refmodel.combine import flash_attn_combine
from refmodel.fa3_scheduler import Schedule, precompute_inputs, resolve_schedule
from refmodel.metadata import get_scheduler_metadata as ref_get_scheduler_metadata
from refmodel.splitkv import split_kv

from .base import (CallArgs, KernelAdapter, Poison, TilePlan, build_tile_plan, call_schedule, call_shape,
                   check_cache_strides, check_plan, own_metadata_comparison, poison_of, raise_first, schedule_summary)
from .call_features import NumericsView, plain_view, prepare_kvcache_call

__all__ = ["EmulatedKernel", "split_kv_working_set"]


def _accumulators(out_partial, lse_partial, num_splits: int, varlen: bool, device):
    """FA3's ``out_accum`` / ``softmax_lse_accum`` from the split partials, in ``mha_fwd``'s layouts: ``(S_c, b, h,
    sq, dv)`` / ``(S_c, b, h, sq)``, varlen ``(S_c, h, total_q, dv)`` / ``(S_c, h, total_q)``, float32. Splits a
    batch does not use hold ``(0, -inf)`` here where FA3 leaves them unwritten."""
    shape_o = list(out_partial.shape)
    shape_o[0] = num_splits
    oa = torch.zeros(shape_o, dtype=torch.float32)
    la = torch.full(shape_o[:-1], -math.inf, dtype=torch.float32)
    used = min(num_splits, out_partial.shape[0])
    oa[:used], la[:used] = out_partial[:used].cpu(), lse_partial[:used].cpu()
    if varlen:   # (S, total_q, h, dv) -> (S, h, total_q, dv)
        oa, la = oa.transpose(1, 2), la.transpose(1, 2)
    else:        # (S, b, sq, h, dv) -> (S, b, h, sq, dv)
        oa, la = oa.transpose(2, 3), la.transpose(2, 3)
    return oa.contiguous().to(device), la.contiguous().to(device)

_COMBINE_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 16 * 2**30


def split_kv_working_set(counts, num_heads: int, kv_lengths, headdim_v: int) -> int:
    """Bytes of the float64 working set ``refmodel.split_kv`` builds for one batch (an upper estimate).

    ``refmodel.attention.resolve_attention_call`` holds the batch's keys and values as float64 ``(h, Lk, d)``
    and ``(h, Lk, dv)`` (KV heads repeated for GQA); ``split_kv`` then computes one split's key span at a time,
    so scores add at most ``h * Lq * Lk`` more. Three ``h * Lk * dv`` float64 tensors bound it.
    """
    return max((3 * num_heads * int(lk) * headdim_v * 8 for c, lk in zip(counts, kv_lengths) if c > 1),
               default=0)


class EmulatedKernel(KernelAdapter):
    """FA3 emulated with refmodel; ``num_sm`` (default 132, an H200) and ``arch`` (90) drive the heuristics.

    ``max_numerics_bytes`` (default: half of the memory available when the call runs) bounds the numerics'
    working set: a call whose split partials would need more raises ``MemoryError`` up front, naming the
    estimate, instead of exhausting the machine.

    The kernel has no defect switches: a seeded kernel-layer defect is a subclass overriding one step
    (:meth:`_schedule`, :meth:`_numerics`, :meth:`_combine`), applied from outside by :meth:`with_defects`
    (``gpu_impl.defects.seed_kernel``).
    """

    name = "emulated"
    #: seeded kernel-layer defects this adapter carries (gpu_impl.defects); empty: FA3 as upstream builds it
    defects: frozenset = frozenset()

    def __init__(self, mode: str = "strict", device=None, num_sm: int = 132, arch: int = 90,
                 max_numerics_bytes: Optional[int] = None):
        super().__init__(mode=mode, device=device, num_sm=num_sm, arch=arch)
        self.max_numerics_bytes = max_numerics_bytes

    def with_defects(self, defects) -> "EmulatedKernel":
        """A copy of this adapter with the kernel-layer defects ``defects`` seeded (``gpu_impl.defects.seed_kernel``)."""
        from ..defects import seed_kernel

        return seed_kernel(self, defects)

    def with_num_sm(self, num_sm: int) -> "EmulatedKernel":
        """A copy of this adapter emulating a GPU with `num_sm` SMs (the scenario's server decides the device)."""
        twin = copy.copy(self)
        twin.num_sm = int(num_sm)
        return twin

    def describe(self) -> str:
        seeded = f", seeded defects: {', '.join(sorted(self.defects))}" if self.defects else ""
        return (f"emulated FA3 (gpu_impl.kernels.emulated over refmodel; sm{self.arch}, num_sm={self.num_sm}, "
                f"mode={self.mode}, device={self.device or 'of the inputs'}{seeded})")

    # ------------------------------------------------------------------------------------------------------
    def get_scheduler_metadata(self, batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                               cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None,
                               cu_seqlens_k_new=None, cache_leftpad=None, page_size=None, max_seqlen_k_new=0,
                               causal=False, window_size=(-1, -1), attention_chunk=0, has_softcap=False,
                               num_splits=0, pack_gqa=None, sm_margin=0):
        """refmodel's ``get_scheduler_metadata`` (FA3's layout; unwritten slots hold ``UNWRITTEN``)."""
        md = ref_get_scheduler_metadata(
            batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, cache_seqlens,
            qkv_dtype=qkv_dtype, headdim_v=headdim_v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k_new=cu_seqlens_k_new,
            cache_leftpad=cache_leftpad, page_size=page_size, max_seqlen_k_new=max_seqlen_k_new, causal=causal,
            window_size=window_size, attention_chunk=attention_chunk, has_softcap=has_softcap,
            num_splits=num_splits, pack_gqa=pack_gqa, sm_margin=sm_margin, num_sm=self.num_sm, arch=self.arch)
        schedule: Schedule = resolve_schedule(precompute_inputs(
            batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, qkv_dtype=qkv_dtype,
            headdim_v=headdim_v, varlen_q=cu_seqlens_q is not None, has_leftpad=cache_leftpad is not None,
            page_size=page_size, max_seqlen_k_new=max_seqlen_k_new, causal=causal, window_size=window_size,
            attention_chunk=attention_chunk, has_softcap=has_softcap, num_splits=num_splits, pack_gqa=pack_gqa,
            sm_margin=sm_margin, num_sm=self.num_sm, arch=self.arch))
        device = cache_seqlens.device if isinstance(cache_seqlens, torch.Tensor) else self.device
        if device is not None:
            md = md.to(device)
        self.last_metadata_trace = {"adapter": self.name, "schedule": schedule_summary(schedule),
                                    "metadata": [int(x) for x in md.cpu().tolist()]}
        return md

    # ------------------------------------------------------------------------------------------------------
    def flash_attn_with_kvcache(self, q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                                cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                                q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                                window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                                scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                                return_softmax_lse=False, **internal):
        """FA3's ``flash_attn_with_kvcache`` with every argument modelled (gpu_impl.kernels.call_features).

        Returns ``out``, or ``(out, softmax_lse, out_accum, softmax_lse_accum)`` with ``return_softmax_lse``.
        ``internal`` (``total_k``) is for the interface's varlen entry point only.
        """
        check_cache_strides(k_cache, v_cache)
        if softmax_scale is None and isinstance(q, torch.Tensor):
            softmax_scale = (q.shape[-1] + (qv.shape[-1] if isinstance(qv, torch.Tensor) else 0)) ** (-0.5)
        if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool) and isinstance(q, torch.Tensor):
            cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=k_cache.device)
        shape, args = prepare_kvcache_call(
            q, k_cache, v_cache, k=k, v=v, qv=qv, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
            cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
            page_table=page_table, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k_new=cu_seqlens_k_new,
            max_seqlen_q=max_seqlen_q, rotary_seqlens=rotary_seqlens, q_descale=q_descale, k_descale=k_descale,
            v_descale=v_descale, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            attention_chunk=attention_chunk, softcap=softcap, rotary_interleaved=rotary_interleaved,
            scheduler_metadata=scheduler_metadata, num_splits=num_splits, pack_gqa=pack_gqa, sm_margin=sm_margin,
            return_softmax_lse=return_softmax_lse, total_k=internal.pop("total_k", None))
        if internal:
            raise TypeError(f"flash_attn_with_kvcache() got unexpected keyword arguments {sorted(internal)}")
        self.last_accum = (None, None)
        out, lse = self._run(args.replace(shape=shape))
        return (out, lse, *self.last_accum) if return_softmax_lse else out

    def _run(self, args: CallArgs):
        shape = args.shape
        if shape is None:
            shape = call_shape(args.q, args.k_cache, args.v_cache, args.cache_seqlens, args.cache_leftpad,
                               args.page_table, args.cu_seqlens_q, args.max_seqlen_q)
        schedule = self._schedule(shape, args)
        trace = self._trace(shape, None, [], numerics="not started")
        trace["schedule"] = schedule_summary(schedule)
        plan = build_tile_plan(shape, schedule, args.scheduler_metadata, device=args.q.device)
        violations = check_plan(plan)
        trace = self._trace(shape, plan, violations, numerics="skipped",
                            own_metadata=own_metadata_comparison(plan) if shape.kernel_runs else None)
        if violations and self.mode == "strict":
            raise_first(violations)
        poison = poison_of(plan, violations) if violations else Poison()
        out, lse = self._numerics(args, plan, poison)
        trace["numerics"] = "computed" if not poison.any else "computed (poisoned batches skipped)"
        trace["poisoned_batches"] = sorted(poison.batches)
        trace["uncovered_rows"] = dict(poison.uncovered)
        return out, lse

    def _schedule(self, shape, args: CallArgs) -> Schedule:
        """The call's own schedule from its shapes (``mha_fwd``'s split heuristic and tiles)."""
        return call_schedule(shape, args, self.num_sm, self.arch)

    # ------------------------------------------------------------------------------------------------------
    def _view(self, args: CallArgs, plan: TilePlan) -> NumericsView:
        """What the numerics read: the call's own tensors, or the features applied (appended KV written now)."""
        return args.numerics(plan.schedule) if args.numerics is not None else plain_view(args, plan.shape)

    def _numerics(self, args: CallArgs, plan: TilePlan, poison: Poison):
        shape = plan.shape
        b = shape.batch_size
        view = self._view(args, plan)
        cache_seqlens, cache_leftpad = view.cache_seqlens, view.cache_leftpad
        if poison.batches:
            # Garbage is certain for these batches: give them no keys, so the numerics pass costs nothing.
            lens = list(view.kv_lengths)
            pads = list(shape.cache_leftpad) if shape.cache_leftpad is not None else None
            for bb in poison.batches:
                lens[bb] = 0
                if pads is not None:
                    pads[bb] = 0
            cache_seqlens = torch.tensor(lens, dtype=torch.int32, device=args.q.device)
            if pads is not None:
                cache_leftpad = torch.tensor(pads, dtype=torch.int32, device=args.q.device)
        common = dict(cache_seqlens=cache_seqlens, cu_seqlens_q=view.cu_seqlens_q, max_seqlen_q=view.max_seqlen_q,
                      page_table=view.page_table, causal=args.causal, window_size=args.window_size,
                      softcap=args.softcap, softmax_scale=view.softmax_scale, cache_leftpad=cache_leftpad,
                      attention_chunk=args.attention_chunk)
        schedule = plan.schedule
        out_dtype = view.out_dtype
        if not plan.split or not shape.kernel_runs:
            out, lse = attention(view.q, view.k_cache, view.v_cache, **common)
            out, lse = out.to(out_dtype), lse.float()
        else:
            counts = [1] * b
            for vb in range(b):
                bb = plan.valid_batch(vb)
                if bb is not None and bb not in poison.batches:
                    counts[bb] = max(1, int(plan.num_splits[vb]))
            kv_lengths = [k - (shape.cache_leftpad[i] if shape.cache_leftpad else 0)
                          for i, k in enumerate(view.kv_lengths)]
            need = split_kv_working_set(counts, shape.num_heads, kv_lengths, shape.headdim_v)
            limit = self.max_numerics_bytes if self.max_numerics_bytes is not None else _available_memory_bytes() // 2
            if need > limit:
                raise MemoryError(
                    f"emulated numerics: refmodel.split_kv would build a {need / 2**30:.1f} GiB float64 intermediate "
                    f"(splits x heads x keys x dv x 8 bytes for the largest batch), above the {limit / 2**30:.1f} GiB "
                    f"limit; the metadata was checked and is consistent (no fault), only the numerics are too large")
            out_partial, lse_partial = split_kv(
                view.q, view.k_cache, view.v_cache, counts, schedule.kernel_block_n, **common,
                block_m=schedule.kernel_block_m, pack_gqa=schedule.kernel_pack_gqa)
            batch_of_row = None
            if shape.varlen_q:
                batch_of_row = torch.repeat_interleave(torch.arange(b), torch.tensor(shape.seqlens_q, dtype=torch.int64))
            combine_dtype = out_dtype if out_dtype in _COMBINE_OUT_DTYPES else torch.float32
            out, lse = self._combine(out_partial, lse_partial, out_dtype=combine_dtype, num_splits_per_batch=counts,
                                     capacity=plan.capacity, batch_of_row=batch_of_row)
            # combine returns lse as (b, sq, h) / (total_q, h); FA3 returns (b, h, sq) / (h, total_q)
            lse = lse.transpose(1, 2) if not shape.varlen_q else lse.transpose(0, 1)
            out, lse = out.to(out_dtype).contiguous(), lse.float().contiguous()
            self.last_accum = _accumulators(out_partial, lse_partial, schedule.num_splits, shape.varlen_q, args.q.device)
        if poison.any:
            out, lse = out.clone(), lse.clone()
            self._apply_poison(out, lse, plan, poison)
        return out.to(args.q.device), lse.to(args.q.device)

    def _combine(self, out_partial, lse_partial, **options):
        """The split-KV combine (``hopper/flash_fwd_combine_kernel.h``: with the M == -inf -> 0 guard)."""
        return flash_attn_combine(out_partial, lse_partial, **options)

    @staticmethod
    def _apply_poison(out: torch.Tensor, lse: torch.Tensor, plan: TilePlan, poison: Poison) -> None:
        """Write NaN where a GPU would leave garbage: whole poisoned batches, and rows no m-block covers."""
        shape = plan.shape
        starts = [0]
        for n in shape.seqlens_q:
            starts.append(starts[-1] + n)

        def rows(bb: int):
            return slice(starts[bb], starts[bb + 1])

        for bb in poison.batches:
            if shape.varlen_q:
                out[rows(bb)] = math.nan
                lse[:, rows(bb)] = math.nan
            else:
                out[bb] = math.nan
                lse[bb] = math.nan
        qhpk = shape.qhead_per_khead
        for bb, first in poison.uncovered.items():
            lq = shape.seqlens_q[bb]
            row = torch.arange(lq).unsqueeze(0)                         # (1, Lq)
            head = torch.arange(shape.num_heads).unsqueeze(1)           # (h, 1)
            index = row * qhpk + head % qhpk if plan.schedule.kernel_pack_gqa else row.expand(shape.num_heads, lq)
            lost = (index >= first)                                     # (h, Lq)
            if not bool(lost.any()):
                continue
            lost_rows_first = lost.t().to(out.device)                   # (Lq, h)
            if shape.varlen_q:
                out[rows(bb)] = out[rows(bb)].masked_fill(lost_rows_first.unsqueeze(-1), math.nan)
                lse[:, rows(bb)] = lse[:, rows(bb)].masked_fill(lost.to(lse.device), math.nan)
            else:
                out[bb] = out[bb].masked_fill(lost_rows_first.unsqueeze(-1), math.nan)
                lse[bb] = lse[bb].masked_fill(lost.to(lse.device), math.nan)
