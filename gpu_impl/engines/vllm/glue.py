"""CPU glue for vLLM's FlashAttention backend: the few fakes that stand in for CUDA, installed before import.

Invariant: everything vLLM does in Python runs unmodified; only what needs CUDA is replaced, and each
replacement is listed in :data:`FAKED`. vLLM's FA3 fork (``vllm/vllm_flash_attn/flash_attn_interface.py``)
keeps its real Python wrapper: only the compiled ``_vllm_fa3_C`` extension is faked, by registering its two
operators (``get_scheduler_metadata``, ``fwd``; schemas as the released ``_vllm_fa3_C.abi3.so`` declares them)
with torch.library, routed to a front object (the recording/checking shim). So the fork's own argument
marshalling (keyword -> positional C++ order, ``cu_seqlens_k=None``, ``headdim_v`` defaulting) is what we see.

Models nothing; runs inside a vLLM engine environment only (imports vllm).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Optional

__all__ = ["FAKED", "CAPABILITIES_FILE", "install", "front"]

CAPABILITIES_FILE = Path(__file__).resolve().parent / "capabilities.json"

#: What is faked or patched on CPU, and why (reported in the driver's hello and in docs/engines-vllm.md).
FAKED = (
    "vllm.v1.attention.backends.flash_attn_diffkv.triton_reshape_and_cache_flash_diffkv (0.14 .. 0.19, K/V head "
    "sizes that differ): the DiffKV impl's cache write, a Triton kernel, is a no-op (record mode reads no cache "
    "contents; set by the driver when it builds a DiffKV layer)",
    "vllm.vllm_flash_attn._vllm_fa3_C: the compiled FA3 extension (CUDA); its ops get_scheduler_metadata and fwd "
    "are registered with torch.library under the released schemas and routed to the checking shim (fwd's last four "
    "arguments, s_aux and the context-parallel ones, default to none / one rank: the wheels of 0.8.5 .. 0.10.0 "
    "declare fwd without them and their wrappers do not pass them)",
    "vllm.platforms.current_platform: a Platform with the CUDA enum, compute capability (9, 0), float8_e4m3fn as "
    "fp8 dtype, and device type cpu (vLLM's CUDA platform module imports vllm._C, a CUDA build)",
    "vllm.distributed.parallel_state._DCP: a one-process stand-in group (world size, rank, all_gather by "
    "repetition) when a decode-context-parallel world size > 1 is asked for; the DCP LSE combine and merge_attn_states are "
    "shape-only stand-ins; torch.accelerator.empty_cache (called by vLLM's workspace manager) is a no-op on CPU; "
    "torch.cuda.get_device_capability answers (9, 0) on a CPU torch (the fork's FA3 probe in vLLM <= 0.16 asks it "
    "directly, not through the platform)",
    "vllm.__path__ (vllm-src=PATH only): the release's vllm package appended after the checkout's, so what a plain "
    "clone lacks until it is built (vllm_flash_attn/, the compiled extensions) is the release's; every module the "
    "checkout has is its own",
    "torch.ops._C_cache_ops.reshape_and_cache_flash: the KV-cache write of the compiled _C extension (a CUDA build), "
    "which the impl of vLLM <= 0.15 calls in forward: registered as a no-op only where the extension did not load "
    "(record mode reads no cache contents; numerics are refused on those releases' layout)",
    "torch.ops._C capability queries (cutlass_scaled_mm_supports_fp8, _block_fp8, _fp4), asked at import by vLLM's "
    "quantization utilities of its compiled _C extension (a CUDA build): registered only where the extension did "
    "not load, answering as a CUDA build does for sm90 (vllm/capabilities.json); without them every "
    "ModelConfig fails with \"Model architectures failed to be inspected\"",
)

GSM_SCHEMA = ("get_scheduler_metadata(int batch_size, int max_seqlen_q, int max_seqlen_k, int num_heads, "
              "int num_heads_k, int headdim, int headdim_v, ScalarType qkv_dtype, Tensor seqused_k, "
              "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? cu_seqlens_k_new, Tensor? seqused_q, "
              "Tensor? leftpad_k, int? page_size, int max_seqlen_k_new, bool is_causal, int window_size_left, "
              "int window_size_right, bool has_softcap, int num_splits, bool? pack_gqa, int sm_margin) -> Tensor")
FWD_SCHEMA = ("fwd(Tensor(a!) q, Tensor k, Tensor v, Tensor? k_new, Tensor? v_new, Tensor? q_v, Tensor(b!)? out, "
              "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? cu_seqlens_k_new, Tensor? seqused_q, "
              "Tensor? seqused_k, int? max_seqlen_q, int? max_seqlen_k, Tensor? page_table, Tensor? kv_batch_idx, "
              "Tensor? leftpad_k, Tensor? rotary_cos, Tensor? rotary_sin, Tensor? seqlens_rotary, "
              "Tensor? q_descale, Tensor? k_descale, Tensor? v_descale, float softmax_scale, bool is_causal, "
              "int window_size_left, int window_size_right, float softcap, bool is_rotary_interleaved, "
              "Tensor? scheduler_metadata, int num_splits, bool? pack_gqa, int sm_margin, Tensor? s_aux=None, "
              "int cp_world_size=1, int cp_rank=0, Tensor? cp_tot_seqused_k=None) -> Tensor[]")

#: ``fwd`` as the FA3 library of vLLM 0.10.1 .. 0.11.0 declares it (fork 2d3b7508: no context-parallel arguments;
#: they came with 8f468e7d), read from those wheels' ``_vllm_fa3_C.abi3.so`` (``strings``)
FWD_SCHEMA_BEFORE_CP = FWD_SCHEMA.replace(", int cp_world_size=1, int cp_rank=0, Tensor? cp_tot_seqused_k=None", "")


def _interface_passes_cp() -> bool:
    """Whether the release's ``vllm_flash_attn/flash_attn_interface.py`` passes ``cp_world_size`` to ``fwd`` (its
    library then declares it); read as text, without importing the interface."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")   # a top-level package: found without importing it
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / "vllm_flash_attn" / "flash_attn_interface.py"
        if path.is_file():
            return "cp_world_size" in path.read_text(encoding="utf-8")
    return True


GSM_NAMES = ("batch_size", "max_seqlen_q", "max_seqlen_k", "num_heads", "num_heads_k", "headdim", "headdim_v",
             "qkv_dtype", "seqused_k", "cu_seqlens_q", "cu_seqlens_k", "cu_seqlens_k_new", "seqused_q", "leftpad_k",
             "page_size", "max_seqlen_k_new", "is_causal", "window_size_left", "window_size_right", "has_softcap",
             "num_splits", "pack_gqa", "sm_margin")
FWD_NAMES = ("q", "k", "v", "k_new", "v_new", "q_v", "out", "cu_seqlens_q", "cu_seqlens_k", "cu_seqlens_k_new",
             "seqused_q", "seqused_k", "max_seqlen_q", "max_seqlen_k", "page_table", "kv_batch_idx", "leftpad_k",
             "rotary_cos", "rotary_sin", "seqlens_rotary", "q_descale", "k_descale", "v_descale", "softmax_scale",
             "is_causal", "window_size_left", "window_size_right", "softcap", "is_rotary_interleaved",
             "scheduler_metadata", "num_splits", "pack_gqa", "sm_margin", "s_aux", "cp_world_size", "cp_rank",
             "cp_tot_seqused_k")


class _Route:
    """Where the faked C++ ops go: ``target`` has ``c_get_scheduler_metadata(**named)`` and ``c_fwd(**named)``."""

    target = None


front = _Route()
_installed = False
_lib = None


def _gsm(*args):
    return front.target.c_get_scheduler_metadata(**dict(zip(GSM_NAMES, args)))


#: fwd's trailing arguments that the wheels of 0.8.5 .. 0.10.0 do not declare (their defaults in FWD_SCHEMA)
FWD_DEFAULTS = {"s_aux": None, "cp_world_size": 1, "cp_rank": 0, "cp_tot_seqused_k": None}


def _fwd(*args):
    return front.target.c_fwd(**{**FWD_DEFAULTS, **dict(zip(FWD_NAMES, args))})


def _install_fa3_ops() -> None:
    global _lib
    import torch

    sys.modules.setdefault("vllm.vllm_flash_attn._vllm_fa3_C", types.ModuleType("vllm.vllm_flash_attn._vllm_fa3_C"))
    _lib = torch.library.Library("_vllm_fa3_C", "DEF")
    _lib.define(GSM_SCHEMA)
    _lib.define(FWD_SCHEMA if _interface_passes_cp() else FWD_SCHEMA_BEFORE_CP)
    for name, fn in (("get_scheduler_metadata", _gsm), ("fwd", _fwd)):
        _lib.impl(name, fn, "CompositeExplicitAutograd")


def _install_platform() -> None:
    import torch
    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class HopperOnCPU(Platform):
        """vLLM's view of an sm90 CUDA device whose tensors live on the CPU (a fake; see FAKED)."""

        _enum = PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cpu"
        dispatch_key = "CPU"

        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(9, 0)

        @classmethod
        def fp8_dtype(cls):
            return torch.float8_e4m3fn

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "NVIDIA H200 (faked on CPU)"

    platforms.current_platform = HopperOnCPU()


def capability_answer(name: str, capability: int) -> bool:
    """What the faked ``torch.ops._C.<name>(capability)`` answers (vllm/capabilities.json)."""
    spec = json.loads(CAPABILITIES_FILE.read_text())["queries"][name]
    return int(capability) >= int(spec["min_capability"])


_cap_lib = None


def _install_capability_queries() -> list[str]:
    """Register the capability queries the compiled ``_C`` extension would answer, where it did not load;
    returns the names registered (none when the real extension is there)."""
    global _cap_lib
    import torch

    try:  # the real extension answers where it loads (a CUDA machine); registering over it would clash
        import vllm._C_stable_libtorch  # noqa: F401
    except (ImportError, OSError):
        pass
    data = json.loads(CAPABILITIES_FILE.read_text())
    missing = [n for n in data["queries"] if not hasattr(torch.ops._C, n)]
    if not missing:
        return []
    _cap_lib = torch.library.Library("_C", "FRAGMENT")
    for name in missing:
        _cap_lib.define(data["schema"].format(name=name))
        _cap_lib.impl(name, (lambda n: lambda cap: capability_answer(n, cap))(name), "CompositeExplicitAutograd")
    return missing


_cache_lib = None


def _install_cache_write() -> None:
    """Register ``_C_cache_ops.reshape_and_cache_flash`` (the KV-cache write of vLLM's compiled ``_C`` extension,
    a CUDA build) as a no-op where the extension did not load: the impl of vLLM <= 0.15 calls it inside ``forward``
    before the attention; nothing the checks read depends on the cache's contents (numerics, which would, are
    refused on that releases' KV-cache layout)."""
    global _cache_lib
    import torch

    if hasattr(torch.ops._C_cache_ops, "reshape_and_cache_flash"):
        return
    _cache_lib = torch.library.Library("_C_cache_ops", "FRAGMENT")
    _cache_lib.define("reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
                      "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()")
    _cache_lib.impl("reshape_and_cache_flash", lambda *args: None, "CompositeExplicitAutograd")


def _install_accelerator_stub() -> None:
    import torch

    if not torch.cuda.is_available():
        torch.accelerator.empty_cache = lambda: None
        # the fork's FA3 probe of vLLM <= 0.16 (``flash_attn_interface._is_fa3_supported``) asks torch.cuda directly
        # rather than vLLM's platform; on a CPU torch it raises and vLLM falls back to no FlashAttention at all
        torch.cuda.get_device_capability = lambda device=None: (9, 0)


def _install_build_fallback() -> Optional[str]:
    """On a checkout (``$FA3VERIFY_VLLM_SOURCE``, put first on the path): the release's ``vllm`` package is appended
    to ``vllm.__path__``, so a module the checkout has is the checkout's and only what it lacks (the build outputs:
    ``vllm_flash_attn/``, compiled extensions, ``_version.py``) is the release's. Returns that directory."""
    import os
    import sysconfig

    source = os.environ.get("FA3VERIFY_VLLM_SOURCE")
    if not source:
        return None
    import vllm

    release_pkg = str(Path(sysconfig.get_paths()["purelib"]) / "vllm")
    if release_pkg not in vllm.__path__ and os.path.isdir(release_pkg):
        vllm.__path__.append(release_pkg)
    return release_pkg


def _triton_driver_releases() -> list:
    """releases.json ``v2_runner.triton_active_driver``: the releases whose V2 runner needs the real triton module."""
    data = json.loads((Path(__file__).resolve().parent / "releases.json").read_text())
    return list(data.get("v2_runner", {}).get("triton_active_driver", {}).get("releases", ()))


def _install_triton_driver_query() -> bool:
    """Answer triton's active-driver query as a CUDA host does (see :data:`FAKED`), before vLLM's
    ``triton_utils`` asks it, on the releases that need it; whether it was installed. Read without importing vllm
    (the installed distribution's version)."""
    import importlib.metadata
    import importlib.util

    import torch

    if torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        return False
    try:
        release = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    if release not in _triton_driver_releases():
        return False
    from triton.backends import backends

    nvidia = backends.get("nvidia")
    if nvidia is None or nvidia.driver is None:
        return False
    nvidia.driver.is_active = staticmethod(lambda: True)
    return True


def install() -> None:
    """Install the fakes (idempotent); call before importing ``vllm.v1.attention.backends.flash_attn``."""
    global _installed
    if _installed:
        return
    _install_triton_driver_query()
    _install_build_fallback()
    _install_fa3_ops()
    _install_platform()
    _install_capability_queries()
    _install_cache_write()
    _install_accelerator_stub()
    _installed = True
