"""The FA3 build vLLM ships (``vllm.vllm_flash_attn``), behind the same adapter interface as the other FA3 modules.

vLLM compiles FA3 into its own wheel (``vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so``, from vllm-project/flash-attention;
refmodel models it as the build its release is judged under, ``refmodel.fa3_builds.build_for_engine``). The package
is imported as shipped: on a machine without the rest of vLLM, the wheel's ``vllm/vllm_flash_attn/`` folder (its
``__init__.py``, ``flash_attn_interface.py`` and ``_vllm_fa3_C.abi3.so``, unchanged) under a folder on ``sys.path``
imports as ``vllm.vllm_flash_attn`` (``vllm`` is then a namespace package; nothing of it is written by this project).
``scripts/prepare_fa3_builds.py`` lays that folder out from a vLLM wheel.

What differs from upstream's interface, and how the adapter meets it:

* ``get_scheduler_metadata``: vLLM's wrapper (``flash_attn_interface.get_scheduler_metadata``) has no
  ``attention_chunk``; a non-zero one is refused (:class:`~gpu_impl.errors.KernelUnavailable`), never dropped.
* The call: vLLM builds only the varlen kernels (``FLASHATTENTION_VARLEN_ONLY``, docs/fa3-builds.md) and exposes
  ``flash_attn_varlen_func``, which discards the split accumulators. The adapter calls the library's own op
  ``torch.ops._vllm_fa3_C.fwd`` with keyword arguments named by the op's registered schema (read at run time, so
  the argument order is the library's), in the varlen form vLLM itself uses: ``q`` flattened to ``(total_q, h, d)``
  with ``cu_seqlens_q``, KV paged (``page_table``, ``seqused_k``). A contiguous cache ``(b, W, h_k, d)`` is passed
  as ``b`` pages of ``W`` slots (``page_table[i] = [i]``), the same memory. :meth:`effective_call_inputs` describes
  that varlen, paged call, under this build, so refmodel predicts S_c for what really ran.
* The plan check of strict mode models upstream's call (gpu_impl.kernels.tile_plan); for this build it is not run
  (the trace says so). The fidelity stage, this adapter's user, passes no ``scheduler_metadata`` to the call.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from typing import Optional

import torch

from refmodel import fa3_builds
from refmodel.fa3_scheduler import ScheduleInputs

from ..errors import KernelUnavailable
from .base import CallArgs, KernelAdapter, call_schedule_inputs, call_shape

__all__ = ["VllmFA3Kernel", "VLLM_MODULE", "find_vllm_fa3", "varlen_paged_form", "op_kwargs"]

#: The package vLLM imports FA3 from.
VLLM_MODULE = "vllm.vllm_flash_attn"
#: Where ``scripts/prepare_fa3_builds.py`` (and ``scripts/gpu_check.sh``) put unpacked vLLM FA3 folders: one
#: ``vllm-V/`` per release, each holding ``vllm/vllm_flash_attn/``.
BUILDS_DIR_ENV = "FA3VERIFY_VLLM_FA3_DIR"


def find_vllm_fa3(root: Optional[str] = None):
    """``(release, interface module)`` for vLLM's FA3: from ``root`` (a folder holding ``vllm/vllm_flash_attn``,
    named ``vllm-V``), else ``$FA3VERIFY_VLLM_FA3_DIR``, else an installed vLLM. :class:`KernelUnavailable` says why not."""
    root = root or os.environ.get(BUILDS_DIR_ENV) or None
    if root:
        if not os.path.isdir(os.path.join(root, "vllm", "vllm_flash_attn")):
            raise KernelUnavailable(f"{BUILDS_DIR_ENV}: {root} holds no vllm/vllm_flash_attn folder "
                                    f"(scripts/prepare_fa3_builds.py lays one out from a vLLM wheel)")
        if root not in sys.path:
            sys.path.insert(0, root)
    try:
        iface = importlib.import_module(VLLM_MODULE + ".flash_attn_interface")
    except Exception as exc:
        raise KernelUnavailable(f"{VLLM_MODULE}: {type(exc).__name__}: {exc}") from exc
    if not getattr(iface, "FA3_AVAILABLE", False):
        raise KernelUnavailable(f"{VLLM_MODULE}: its FA3 library did not load: "
                                f"{getattr(iface, 'FA3_UNAVAILABLE_REASON', '?')}")
    release = _release_of(root)
    return release, iface


def _release_of(root: Optional[str]) -> Optional[str]:
    """The vLLM release of a laid-out folder (named ``vllm-V``), else of an installed vLLM; None when neither says."""
    base = os.path.basename(os.path.normpath(root)) if root else ""
    if base.startswith("vllm-"):
        return base[len("vllm-"):]
    try:
        from importlib.metadata import version
        return version("vllm")
    except Exception:
        return None


def varlen_paged_form(args: CallArgs) -> CallArgs:
    """The call in the varlen, paged form vLLM's build runs (see the module doc). Needs only shapes: runs on CPU."""
    q, k = args.q, args.k_cache
    cu, max_q = args.cu_seqlens_q, args.max_seqlen_q
    if cu is None:
        b, sq = int(q.shape[0]), int(q.shape[1])
        cu = torch.arange(0, (b + 1) * sq, sq, dtype=torch.int32, device=q.device)
        q = q.reshape(b * sq, *q.shape[2:])
        max_q = sq
    table, seqused = args.page_table, args.cache_seqlens
    if table is None:
        b, width = int(k.shape[0]), int(k.shape[1])
        table = torch.arange(b, dtype=torch.int32, device=k.device).reshape(b, 1)
        if seqused is None:
            seqused = torch.full((b,), width, dtype=torch.int32, device=k.device)
    return args.replace(q=q, cu_seqlens_q=cu, max_seqlen_q=int(max_q), page_table=table, cache_seqlens=seqused)


def op_kwargs(schema_args, values: dict) -> dict:
    """Keyword arguments for an op with registered arguments ``schema_args`` (``[(name, has_default)]``): every
    argument named in ``values``, and ``None`` for each optional one without a default that ``values`` leaves out.
    An argument ``values`` names that the op lacks is a :class:`KernelUnavailable` (this build cannot take it)."""
    names = {n for n, _ in schema_args}
    unknown = sorted(set(values) - names)
    if unknown:
        raise KernelUnavailable(f"_vllm_fa3_C.fwd has no argument(s) {', '.join(unknown)}")
    kw = dict(values)
    for name, has_default in schema_args:
        if name not in kw and not has_default:
            kw[name] = None
    return kw


class VllmFA3Kernel(KernelAdapter):
    """vLLM's FA3 build (CUDA). ``root``: a folder holding ``vllm/vllm_flash_attn`` (default ``$FA3VERIFY_VLLM_FA3_DIR``);
    ``build``: the refmodel build it is judged under (default: the one its release ships, fa3_builds.json)."""

    name = "fa3-vllm"
    paged_kv_supported = True

    def __init__(self, mode: str = "strict", device=None, root: Optional[str] = None, build: Optional[str] = None):
        if not torch.cuda.is_available():
            raise KernelUnavailable(f"CUDA is not available (torch {torch.__version__}): vLLM's FA3 build needs an "
                                    f"sm90 GPU")
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        props = torch.cuda.get_device_properties(dev)
        super().__init__(mode=mode, device=dev, num_sm=props.multi_processor_count,
                         arch=props.major * 10 + props.minor)
        if props.major != 9:
            raise KernelUnavailable(f"FA3 (hopper) needs an sm90 GPU, {dev} is {props.name} (sm{self.arch})")
        self.release, self.module = find_vllm_fa3(root)
        self.module_name = VLLM_MODULE
        if build is None:
            if self.release is None:
                raise KernelUnavailable("build: the vLLM release of this FA3 library is unknown; name the build")
            build = fa3_builds.build_for_engine("vllm", self.release)
        self.build = fa3_builds.check_build_name(build)
        self.op = torch.ops._vllm_fa3_C.fwd
        schema = self.op.default._schema
        self.schema_args = [(a.name, a.has_default_value()) for a in schema.arguments]
        self.gpu_name = props.name

    def describe(self) -> str:
        where = getattr(self.module, "__file__", "?")
        return (f"vLLM {self.release}'s FA3 ({self.module_name}, {where}) judged as {self.build}; {self.gpu_name}, "
                f"sm{self.arch}, {self.num_sm} SMs; varlen paged calls; mode={self.mode}")

    def get_scheduler_metadata(self, batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                               cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None,
                               cu_seqlens_k_new=None, cache_leftpad=None, page_size=None, max_seqlen_k_new=0,
                               causal=False, window_size=(-1, -1), attention_chunk=0, has_softcap=False,
                               num_splits=0, pack_gqa=None, sm_margin=0):
        from refmodel.prepare import launch_check

        if attention_chunk:
            raise KernelUnavailable(f"attention_chunk: vLLM's get_scheduler_metadata takes none, got {attention_chunk}")
        launch_check(int(batch_size))
        md = self.module.get_scheduler_metadata(
            batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, cache_seqlens,
            qkv_dtype=qkv_dtype, headdim_v=headdim_v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k_new=cu_seqlens_k_new,
            cache_leftpad=cache_leftpad, page_size=page_size, max_seqlen_k_new=max_seqlen_k_new, causal=causal,
            window_size=window_size, has_softcap=has_softcap, num_splits=num_splits, pack_gqa=pack_gqa,
            sm_margin=sm_margin)
        self.last_metadata_trace = {"adapter": self.name, "module": self.module_name, "build": self.build,
                                    "page_size": page_size, "size": int(md.numel())}
        return md

    def effective_call_inputs(self, q, k_cache, v_cache, cache_seqlens=None, cache_leftpad=None, page_table=None,
                              cu_seqlens_q=None, max_seqlen_q=None, causal=False, window_size=(-1, -1), softcap=0.0,
                              num_splits=0, pack_gqa=None, sm_margin=0) -> ScheduleInputs:
        args = varlen_paged_form(CallArgs(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                                          cache_leftpad=cache_leftpad, page_table=page_table,
                                          cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q))
        shape = call_shape(args.q, args.k_cache, args.v_cache, args.cache_seqlens, args.cache_leftpad,
                           args.page_table, args.cu_seqlens_q, args.max_seqlen_q)
        inputs = call_schedule_inputs(shape, causal, window_size, softcap, num_splits, pack_gqa, sm_margin,
                                      self.num_sm, self.arch)
        # FA3's params.total_q: the call's query rows (read by builds that bound a varlen call's splits by it)
        return dataclasses.replace(inputs, build=self.build, total_q=int(args.q.shape[0]))

    def _run(self, args: CallArgs):
        q_shape = tuple(args.q.shape)
        args = varlen_paged_form(args)
        shape = call_shape(args.q, args.k_cache, args.v_cache, args.cache_seqlens, args.cache_leftpad,
                           args.page_table, args.cu_seqlens_q, args.max_seqlen_q)
        trace = self._trace(shape, None, [], launched=False, build=self.build,
                            plan_check=f"not run: the plan check models upstream's call, not {self.build}")
        scale = args.softmax_scale if args.softmax_scale is not None else float(args.q.shape[-1]) ** -0.5
        values = dict(q=args.q, k=args.k_cache, v=args.v_cache, cu_seqlens_q=args.cu_seqlens_q,
                      seqused_k=args.cache_seqlens, max_seqlen_q=args.max_seqlen_q,
                      max_seqlen_k=int(args.page_table.shape[1]) * int(args.k_cache.shape[1]),
                      page_table=args.page_table, leftpad_k=args.cache_leftpad, softmax_scale=scale,
                      is_causal=args.causal, window_size_left=args.window_size[0],
                      window_size_right=args.window_size[1], softcap=args.softcap, is_rotary_interleaved=False,
                      scheduler_metadata=args.scheduler_metadata, num_splits=args.num_splits,
                      pack_gqa=args.pack_gqa, sm_margin=args.sm_margin)
        names = {n for n, _ in self.schema_args}
        values.update({k: v for k, v in (("cp_world_size", 1), ("cp_rank", 0)) if k in names})
        result = self.op(**op_kwargs(self.schema_args, values))
        trace["launched"] = True
        out, lse = result[0], result[1]
        accum = result[2] if len(result) > 2 else None
        if len(result) > 3:
            self.last_accum = (result[2], result[3])
        trace["observed_num_splits"] = (int(accum.shape[0]) if isinstance(accum, torch.Tensor) and accum.dim() > 0
                                        and accum.numel() > 0 else None)
        if len(q_shape) == 4:  # back to the batch layout the caller passed: out (b, sq, h, dv), lse (b, h, sq)
            b, sq, h = q_shape[0], q_shape[1], q_shape[2]
            out = out.reshape(b, sq, h, out.shape[-1])
            lse = lse.reshape(h, b, sq).permute(1, 0, 2)
        return out, lse
