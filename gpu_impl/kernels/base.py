"""The kernel-adapter interface, and the FA3 call model both adapters share.

An adapter is an object with FA3's two Python entry points, ``get_scheduler_metadata(...)`` and
``flash_attn_with_kvcache(...)`` (argument names of ``hopper/flash_attn_interface.py``), plus ``name``,
``mode``, ``describe()``, ``effective_call_inputs(...)`` and ``last_trace`` (see :class:`KernelAdapter`).

The shared call model (read in ``hopper/flash_api.cpp`` ``mha_fwd``, ``hopper/tile_scheduler.hpp``
``VarlenDynamicPersistentTileScheduler``, ``hopper/flash_fwd_launch_template.h``,
``hopper/epilogue_fwd.hpp`` and ``hopper/flash_fwd_combine_kernel.h``; nothing copied):

1. :func:`call_shape` reads the call's static sizes from its tensors, as ``mha_fwd`` does: ``seqlen_k`` is
   ``k_cache.size(1)``, or ``page_table.size(1) * page_size`` when paged; an int ``cache_seqlens`` becomes a
   per-batch tensor (so the call is varlen and runs the prepare step).
2. :func:`call_schedule` resolves the call's own schedule with refmodel (``call_inputs`` +
   ``resolve_schedule``): the split count ``S_c`` that sizes the partial buffers, pack-GQA, tiles, Sort/Swizzle
   and the metadata size the call expects.
3. :func:`build_tile_plan` decides what the kernels will read: FA3's ``CHECK_SHAPE`` on a given metadata
   tensor (:class:`~gpu_impl.errors.MetadataShapeError`), then the per-virtual-batch split counts, m-block
   counts and batch order -- from the metadata when one is given, from the call's own prepare step otherwise
   (run, as ``flash_fwd_launch_template.h`` runs it, with the kernel's tiles and forced pack-GQA), or from the
   static shapes when the call is not varlen.
4. :func:`check_plan` names every access the plan makes out of bounds (:class:`Violation`), before any
   numerics.

The verdicts come from ``spec.invariants.check_all`` (the project's one statement of the invariants),
bridged from a metadata *tensor* to spec's (precompute, call) vocabulary by :func:`spec_verdicts`.

Modules: steps 1-2 are :mod:`.call_model`, step 3 :mod:`.tile_plan`, step 4 :mod:`.plan_checks`; this one holds
the adapter interface (:class:`KernelAdapter`) and re-exports the shared call model.
"""

from __future__ import annotations

import abc
from typing import Optional, Sequence

import torch

from refmodel.fa3_scheduler import ScheduleInputs

from .call_model import (UNSUPPORTED_ARGUMENTS, CallArgs, CallShape, call_schedule, call_schedule_inputs, call_shape,
                         reject_unsupported, schedule_dtype, schedule_summary)
from .plan_checks import INVARIANTS, Poison, Violation, check_plan, poison_of, raise_first, spec_verdicts
from .tile_plan import TilePlan, build_tile_plan, own_metadata_comparison

__all__ = [
    "INVARIANTS", "KernelAdapter", "CallArgs", "CallShape", "TilePlan", "Violation", "Poison",
    "UNSUPPORTED_ARGUMENTS", "call_shape", "call_schedule", "build_tile_plan", "check_plan",
    "spec_verdicts", "own_metadata_comparison",
    "poison_of", "raise_first", "schedule_summary", "reject_unsupported", "call_schedule_inputs", "schedule_dtype",
    "check_cache_strides",
]


def check_cache_strides(k_cache, v_cache) -> None:
    """The interface's own asserts (``hopper/flash_attn_interface.py`` ``flash_attn_with_kvcache``, before ``mha_fwd``)."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if isinstance(t, torch.Tensor):
            if t.stride(-1) != 1:   # FA3's `assert` (raised explicitly: it must hold under python -O too)
                raise AssertionError(f"{name} must have contiguous last dimension")


# ----------------------------------------------------------------------------------------------------------
# The adapter interface
# ----------------------------------------------------------------------------------------------------------

MODES = ("strict", "gpu-like")


class KernelAdapter(abc.ABC):
    """One FA3 implementation behind FA3's Python entry points.

    * ``name``: registry name; ``mode``: ``"strict"`` (faults raise :class:`~gpu_impl.errors.OutOfBoundsAccess`)
      or ``"gpu-like"`` (faults poison the result as on a GPU);
    * ``get_scheduler_metadata(...)`` / ``flash_attn_with_kvcache(...)``: FA3's signatures
      (``hopper/flash_attn_interface.py``); the real-kernel adapter refuses the arguments in
      :data:`UNSUPPORTED_ARGUMENTS` with ``NotImplementedError`` naming the argument (the emulated one models
      them); ``return_softmax_lse=True`` returns FA3's ``(out, softmax_lse, out_accum, softmax_lse_accum)``
      (the accumulators ``None`` when the call does not split), as the interface at 0251105a does;
    * ``effective_call_inputs(...)``: the refmodel ``ScheduleInputs`` the kernel will schedule this call from
      (differs from the call's own when the adapter reshapes the call, e.g. gathers paged KV);
    * ``describe()``: which implementation/build runs;
    * ``last_trace``: a dict about the most recent ``flash_attn_with_kvcache`` call (call schedule, metadata
      vectors used, verdicts); ``last_metadata_trace``: the same for the most recent precompute.
    """

    name: str = "abstract"

    def __init__(self, mode: str = "strict", device=None, num_sm: int = 132, arch: int = 90):
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.device = None if device is None else torch.device(device)
        self.num_sm = int(num_sm)
        self.arch = int(arch)
        self.last_trace: Optional[dict] = None
        self.last_metadata_trace: Optional[dict] = None
        #: (out_accum, softmax_lse_accum) of the most recent call: FA3's split buffers, None when it did not split
        self.last_accum: tuple = (None, None)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"

    @abc.abstractmethod
    def describe(self) -> str:
        """Which implementation and build this adapter runs."""

    @abc.abstractmethod
    def get_scheduler_metadata(self, batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                               cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None,
                               cu_seqlens_k_new=None, cache_leftpad=None, page_size=None, max_seqlen_k_new=0,
                               causal=False, window_size=(-1, -1), attention_chunk=0, has_softcap=False,
                               num_splits=0, pack_gqa=None, sm_margin=0):
        """FA3's ``get_scheduler_metadata``: the int32 metadata tensor for these precompute inputs."""

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                                cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                                q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                                window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                                scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                                return_softmax_lse=False):
        """FA3's ``flash_attn_with_kvcache``; returns ``out`` or ``(out, softmax_lse, out_accum, softmax_lse_accum)``."""
        check_cache_strides(k_cache, v_cache)
        reject_unsupported(self.name, dict(k=k, v=v, qv=qv, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                           cache_batch_idx=cache_batch_idx, cu_seqlens_k_new=cu_seqlens_k_new,
                                           q_descale=q_descale, k_descale=k_descale,
                                           v_descale=v_descale, attention_chunk=attention_chunk))
        if len(tuple(window_size)) != 2:
            raise ValueError(f"window_size: must be a pair (left, right), got {window_size!r}")
        args = CallArgs(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                        cache_leftpad=cache_leftpad, page_table=page_table, cu_seqlens_q=cu_seqlens_q,
                        max_seqlen_q=max_seqlen_q, softmax_scale=softmax_scale, causal=bool(causal),
                        window_size=(int(window_size[0]), int(window_size[1])), softcap=float(softcap or 0.0),
                        scheduler_metadata=scheduler_metadata, num_splits=int(num_splits), pack_gqa=pack_gqa,
                        sm_margin=int(sm_margin), return_softmax_lse=bool(return_softmax_lse))
        self.last_accum = (None, None)
        out, lse = self._run(args)
        return (out, lse, *self.last_accum) if return_softmax_lse else out

    @abc.abstractmethod
    def _run(self, args: CallArgs) -> tuple[torch.Tensor, torch.Tensor]:
        """Execute one call; return (out, lse) in FA3's layouts (and set ``last_accum`` when it splits)."""

    def effective_call_inputs(self, q, k_cache, v_cache, cache_seqlens=None, cache_leftpad=None, page_table=None,
                              cu_seqlens_q=None, max_seqlen_q=None, causal=False, window_size=(-1, -1), softcap=0.0,
                              num_splits=0, pack_gqa=None, sm_margin=0) -> ScheduleInputs:
        """The ``ScheduleInputs`` this adapter's kernel schedules the call from (here: the call's own)."""
        shape = call_shape(q, k_cache, v_cache, cache_seqlens, cache_leftpad, page_table, cu_seqlens_q, max_seqlen_q)
        return call_schedule_inputs(shape, causal, window_size, softcap, num_splits, pack_gqa, sm_margin,
                                    self.num_sm, self.arch)

    def _trace(self, shape: CallShape, plan: Optional[TilePlan], violations: Sequence[Violation], **extra) -> dict:
        trace = {
            "adapter": self.name, "mode": self.mode, "describe": self.describe(),
            "call": {"batch_size": shape.batch_size, "seqlen_q": shape.seqlen_q, "seqlen_k": shape.seqlen_k,
                     "num_heads": shape.num_heads, "num_heads_k": shape.num_heads_k, "headdim": shape.headdim,
                     "headdim_v": shape.headdim_v, "page_size": shape.page_size, "varlen_q": shape.varlen_q,
                     "cache_seqlens": None if shape.cache_seqlens is None else list(shape.cache_seqlens)},
            "schedule": None if plan is None else schedule_summary(plan.schedule),
            "metadata": None if plan is None else {"status": plan.metadata_status, "source": plan.source,
                                                   **plan.vectors()},
            "combine_capacity": None if plan is None else plan.capacity,
            "verdicts": [v.to_dict() for v in violations],
            "ok": not violations,
        }
        trace.update(extra)
        self.last_trace = trace
        return trace
