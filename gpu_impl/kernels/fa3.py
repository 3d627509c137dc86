"""The real FA3 kernel behind the adapter interface, imported lazily.

Modules tried, first that imports wins (``describe()`` reports which): ``fa3_fwd_interface`` (PyPI
``fa3-fwd`` 0.0.3, a forward-only hopper build), ``flash_attn_interface`` (an FA3 hopper build),
``sgl_kernel.flash_attn``. No CUDA, or none of them importable: :class:`~gpu_impl.errors.KernelUnavailable`
with the reasons.

Paged KV on a build without it (``fa3-fwd`` is built with ``FLASHATTENTION_DISABLE_PAGEDKV``): the adapter
gathers the pages into a contiguous cache ``(b, W, h_k, d)`` with ``W = page_table.size(1) * page_size`` (the
paged call's own ``seqlen_k``, so the split heuristic sees the same KV length) and calls without
``page_table``. FA3 then schedules the call as contiguous: no paged-non-TMA tiles, and a decode call drops
causal (``resolve_masking``). :func:`effective_call_inputs` gives that shape, and this adapter's
``get_scheduler_metadata`` drops ``page_size`` on such a build, so metadata precomputed through the adapter is
computed for the shape the kernel really runs -- the precompute/call hazard stays the one under test.

Modes: ``strict`` checks the metadata against the call with the same model the emulator uses and raises
:class:`~gpu_impl.errors.OutOfBoundsAccess` *before* launching (an illegal memory access would poison the CUDA
context for the rest of the process); ``gpu-like`` launches regardless and returns what the GPU computes.
The trace records the predicted verdicts either way.
"""

from __future__ import annotations

import importlib
from typing import Optional, Sequence

import torch

from refmodel.fa3_scheduler import ScheduleInputs

from ..errors import KernelUnavailable, MetadataShapeError
from .base import (CallArgs, CallShape, KernelAdapter, build_tile_plan, call_schedule, call_schedule_inputs,
                   call_shape, check_plan, raise_first)

__all__ = ["FA3Kernel", "MODULE_CANDIDATES", "find_fa3_module", "gather_paged_kv", "effective_call_inputs",
           "module_supports_paged_kv"]

#: Python modules exposing FA3's ``flash_attn_with_kvcache`` / ``get_scheduler_metadata``, in preference order.
MODULE_CANDIDATES = ("fa3_fwd_interface", "flash_attn_interface", "sgl_kernel.flash_attn")


def find_fa3_module(candidates: Sequence[str] = MODULE_CANDIDATES):
    """``(name, module)`` of the first candidate that imports; :class:`KernelUnavailable` listing every failure."""
    failures = []
    for name in candidates:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # ImportError, or an OSError/RuntimeError from a CUDA extension on a CPU build
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if not hasattr(module, "flash_attn_with_kvcache"):
            failures.append(f"{name}: imported but has no flash_attn_with_kvcache")
            continue
        return name, module
    raise KernelUnavailable("no FA3 module importable (install the fa3-fwd wheel, an FA3 hopper build or sgl-kernel "
                            "on a CUDA machine): " + "; ".join(failures))


def module_supports_paged_kv(name: str) -> bool:
    """Whether the named FA3 module was built with paged KV (``fa3-fwd`` 0.0.3 was not)."""
    if name != "fa3_fwd_interface":
        return True
    try:
        config = importlib.import_module("fa3_fwd_config").CONFIG["build_flags"]
        return not config.get("FLASHATTENTION_DISABLE_PAGEDKV", True)
    except Exception:
        return False


def gather_paged_kv(cache: torch.Tensor, page_table: torch.Tensor) -> torch.Tensor:
    """Paged cache ``(num_pages, page_size, h_k, d)`` + ``page_table (b, P)`` -> contiguous ``(b, P*page_size, h_k, d)``.

    Position ``p`` of sequence ``bb`` is slot ``p % page_size`` of page ``page_table[bb, p // page_size]`` (FA3's
    paged layout, ``hopper/paged_kv.h``). Page-table entries outside ``[0, num_pages)`` (unused tail entries)
    are clamped to 0: they only feed positions past ``cache_seqlens``, which the kernel never reads.
    """
    if cache.dim() != 4:
        raise ValueError(f"cache: must be (num_pages, page_size, h_k, d), got shape {tuple(cache.shape)}")
    if page_table.dim() != 2:
        raise ValueError(f"page_table: must be (b, max_pages_per_seq), got shape {tuple(page_table.shape)}")
    num_pages, page_size = cache.shape[0], cache.shape[1]
    b, pages_per_seq = page_table.shape
    table = page_table.to(device=cache.device, dtype=torch.int64)
    table = torch.where((table >= 0) & (table < num_pages), table, torch.zeros_like(table))
    gathered = cache[table]                                   # (b, P, page_size, h_k, d)
    return gathered.reshape(b, pages_per_seq * page_size, *cache.shape[2:]).contiguous()


def _contiguous_shape(shape: CallShape) -> CallShape:
    """The shape of the gathered call: same everything, ``page_size`` None, ``cache_slots`` = W."""
    import dataclasses
    return dataclasses.replace(shape, page_size=None, cache_slots=shape.seqlen_k)


def effective_call_inputs(q, k_cache, v_cache, cache_seqlens=None, cache_leftpad=None, page_table=None,
                          cu_seqlens_q=None, max_seqlen_q=None, causal=False, window_size=(-1, -1), softcap=0.0,
                          num_splits=0, pack_gqa=None, sm_margin=0, num_sm: int = 132, arch: int = 90,
                          paged_kv_supported: bool = False) -> ScheduleInputs:
    """refmodel ``ScheduleInputs`` the real kernel schedules this call from.

    With ``paged_kv_supported=False`` (``fa3-fwd``) a paged call is run contiguously (see the module doc): the
    result has ``page_size=None`` and the same ``seqlen_k`` (= ``page_table.size(1) * page_size``). Needs only
    shapes, so it runs on CPU.
    """
    shape = call_shape(q, k_cache, v_cache, cache_seqlens, cache_leftpad, page_table, cu_seqlens_q, max_seqlen_q)
    if shape.page_size is not None and not paged_kv_supported:
        shape = _contiguous_shape(shape)
    return call_schedule_inputs(shape, causal, window_size, softcap, num_splits, pack_gqa, sm_margin, num_sm, arch)


class FA3Kernel(KernelAdapter):
    """The real FA3 kernel (CUDA). ``module`` names one of :data:`MODULE_CANDIDATES` to force it."""

    name = "fa3"

    def __init__(self, mode: str = "strict", device=None, module: Optional[str] = None,
                 candidates: Sequence[str] = MODULE_CANDIDATES):
        if not torch.cuda.is_available():
            raise KernelUnavailable(
                f"CUDA is not available (torch {torch.__version__}, built for CUDA {torch.version.cuda}): the real "
                f"FA3 kernel needs an sm90 GPU; use the 'emulated' kernel on this machine")
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        if dev.type != "cuda":
            raise KernelUnavailable(f"device: the real FA3 kernel runs on a CUDA device, got {dev}")
        props = torch.cuda.get_device_properties(dev)
        super().__init__(mode=mode, device=dev, num_sm=props.multi_processor_count,
                         arch=props.major * 10 + props.minor)
        if props.major != 9:
            raise KernelUnavailable(f"FA3 (hopper) needs an sm90 GPU, {dev} is {props.name} (sm{self.arch})")
        self.module_name, self.module = find_fa3_module([module] if module else candidates)
        self.paged_kv_supported = module_supports_paged_kv(self.module_name)
        self.gpu_name = props.name

    def describe(self) -> str:
        where = getattr(self.module, "__file__", "?")
        paged = "native paged KV" if self.paged_kv_supported else "no paged KV: pages gathered to a contiguous cache"
        return (f"real FA3 via {self.module_name} ({where}); {self.gpu_name}, sm{self.arch}, {self.num_sm} SMs; "
                f"{paged}; mode={self.mode}")

    def get_scheduler_metadata(self, batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                               cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None,
                               cu_seqlens_k_new=None, cache_leftpad=None, page_size=None, max_seqlen_k_new=0,
                               causal=False, window_size=(-1, -1), attention_chunk=0, has_softcap=False,
                               num_splits=0, pack_gqa=None, sm_margin=0):
        """The module's ``get_scheduler_metadata``; ``page_size`` is dropped on a build without paged KV.

        A batch of 0 is not passed on: FA3 would end this process (refmodel.prepare ``launch_check``); the adapter
        raises :class:`~gpu_impl.errors.ProcessAbort` instead, so the harness survives to report it.
        """
        from refmodel.prepare import launch_check

        fn = getattr(self.module, "get_scheduler_metadata", None)
        if fn is None:
            raise KernelUnavailable(f"{self.module_name} has no get_scheduler_metadata")
        launch_check(int(batch_size))
        effective_page_size = page_size if self.paged_kv_supported else None
        md = fn(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, cache_seqlens,
                qkv_dtype=qkv_dtype, headdim_v=headdim_v, cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_k_new=cu_seqlens_k_new, cache_leftpad=cache_leftpad, page_size=effective_page_size,
                max_seqlen_k_new=max_seqlen_k_new, causal=causal, window_size=window_size,
                attention_chunk=attention_chunk, has_softcap=has_softcap, num_splits=num_splits, pack_gqa=pack_gqa,
                sm_margin=sm_margin)
        self.last_metadata_trace = {"adapter": self.name, "module": self.module_name, "page_size": page_size,
                                    "effective_page_size": effective_page_size, "size": int(md.numel())}
        return md

    def effective_call_inputs(self, q, k_cache, v_cache, cache_seqlens=None, cache_leftpad=None, page_table=None,
                              cu_seqlens_q=None, max_seqlen_q=None, causal=False, window_size=(-1, -1), softcap=0.0,
                              num_splits=0, pack_gqa=None, sm_margin=0) -> ScheduleInputs:
        return effective_call_inputs(q, k_cache, v_cache, cache_seqlens, cache_leftpad, page_table, cu_seqlens_q,
                                     max_seqlen_q, causal, window_size, softcap, num_splits, pack_gqa, sm_margin,
                                     self.num_sm, self.arch, self.paged_kv_supported)

    def _run(self, args: CallArgs):
        shape = call_shape(args.q, args.k_cache, args.v_cache, args.cache_seqlens, args.cache_leftpad,
                           args.page_table, args.cu_seqlens_q, args.max_seqlen_q)
        gathered = shape.page_size is not None and not self.paged_kv_supported
        if gathered:
            shape = _contiguous_shape(shape)
            args = args.replace(k_cache=gather_paged_kv(args.k_cache, args.page_table),
                                v_cache=gather_paged_kv(args.v_cache, args.page_table), page_table=None)
        schedule = call_schedule(shape, args, self.num_sm, self.arch)
        plan = violations = None
        try:
            plan = build_tile_plan(shape, schedule, args.scheduler_metadata, device=args.q.device)
            violations = check_plan(plan)
        except MetadataShapeError:
            if self.mode == "strict":
                self._trace(shape, None, [], gathered_paged_kv=gathered, launched=False)
                raise
        trace = self._trace(shape, plan, violations or [], gathered_paged_kv=gathered, launched=False)
        if violations and self.mode == "strict":
            raise_first(violations)
        kwargs = dict(cache_seqlens=args.cache_seqlens, cache_leftpad=args.cache_leftpad, page_table=args.page_table,
                      cu_seqlens_q=args.cu_seqlens_q, max_seqlen_q=args.max_seqlen_q,
                      softmax_scale=args.softmax_scale, causal=args.causal, window_size=args.window_size,
                      softcap=args.softcap, scheduler_metadata=args.scheduler_metadata, num_splits=args.num_splits,
                      pack_gqa=args.pack_gqa, sm_margin=args.sm_margin, return_softmax_lse=True)
        try:
            result = self.module.flash_attn_with_kvcache(args.q, args.k_cache, args.v_cache, **kwargs)
        except RuntimeError as exc:
            if args.scheduler_metadata is not None and "scheduler_metadata" in str(exc):
                raise MetadataShapeError(f"scheduler_metadata: rejected by {self.module_name}: {exc}") from exc
            raise
        trace["launched"] = True
        out, lse = result[0], result[1]
        # mha_fwd also returns out_accum (S_c, ...) when it split: the observed S_c, to compare with refmodel's
        accum = result[2] if isinstance(result, (tuple, list)) and len(result) > 2 else None
        if isinstance(result, (tuple, list)) and len(result) > 3:
            self.last_accum = (result[2], result[3])
        trace["observed_num_splits"] = (int(accum.shape[0]) if isinstance(accum, torch.Tensor) and accum.dim() > 0
                                        and accum.numel() > 0 else None)
        return out, lse
