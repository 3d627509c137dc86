"""Kernel adapters: one interface (FA3's Python entry points) over several FA3 implementations.

``load(name, mode="strict", device=None, **options)`` returns an adapter (see
:class:`gpu_impl.kernels.base.KernelAdapter`):

* ``"emulated"`` -- FA3's algorithm over refmodel, on any torch device (:mod:`gpu_impl.kernels.emulated`);
* ``"fa3"`` -- the real kernel from the first importable FA3 module (:mod:`gpu_impl.kernels.fa3`); raises
  :class:`~gpu_impl.errors.KernelUnavailable` without CUDA or a module;
* ``"fa3-vllm"`` -- the FA3 build vLLM ships, ``vllm.vllm_flash_attn`` (:mod:`gpu_impl.kernels.fa3_vllm`).

``register(name, factory)`` adds an adapter: ``factory(mode=..., device=..., **options)`` returns a
``KernelAdapter``. Adapters are constructed on demand, so importing this package never imports CUDA code.
"""

from __future__ import annotations

from typing import Callable

from ..errors import KernelUnavailable, MetadataShapeError, OutOfBoundsAccess
from .base import INVARIANTS, MODES, KernelAdapter, Violation

__all__ = ["load", "register", "available", "laid_out_build", "KernelAdapter", "Violation", "INVARIANTS", "MODES",
           "OutOfBoundsAccess", "KernelUnavailable", "MetadataShapeError"]

_REGISTRY: dict[str, Callable[..., KernelAdapter]] = {}


def register(name: str, factory: Callable[..., KernelAdapter], replace: bool = False) -> None:
    """Register an adapter factory under ``name`` (``replace=True`` to override an existing one)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: must be a non-empty string, got {name!r}")
    if name in _REGISTRY and not replace:
        raise ValueError(f"name: an adapter named {name!r} is already registered (pass replace=True)")
    _REGISTRY[name] = factory


def available() -> list[str]:
    """Registered adapter names (registered, not necessarily runnable here)."""
    return sorted(_REGISTRY)


def load(name: str, mode: str = "strict", device=None, **options) -> KernelAdapter:
    """Construct the adapter registered as ``name`` with ``mode`` ("strict" | "gpu-like") and ``device``."""
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"name: unknown kernel adapter {name!r}; registered: {', '.join(available())}") from None
    return factory(mode=mode, device=device, **options)


def laid_out_build(path: str) -> dict:
    """The adapter spec (``{"name", "device", "options"}``) of an FA3 build laid out in folder ``path`` by
    ``scripts/prepare_fa3_builds.py``; ValueError naming what the folder should hold. Today's layout: an engine's own
    FA3 package as its wheel ships it (vLLM's ``vllm/vllm_flash_attn``, adapter ``fa3-vllm``)."""
    import os

    if os.path.isdir(os.path.join(path, "vllm", "vllm_flash_attn")):
        return {"name": "fa3-vllm", "device": "cuda", "options": {"root": os.path.abspath(path)}}
    raise ValueError(f"{path} holds no laid-out FA3 build (vllm/vllm_flash_attn; scripts/prepare_fa3_builds.py lays "
                     f"one out from a wheel)")


def _emulated(**kw) -> KernelAdapter:
    from .emulated import EmulatedKernel
    return EmulatedKernel(**kw)


def _fa3(**kw) -> KernelAdapter:
    from .fa3 import FA3Kernel
    return FA3Kernel(**kw)


def _fa3_vllm(**kw) -> KernelAdapter:
    from .fa3_vllm import VllmFA3Kernel
    return VllmFA3Kernel(**kw)


register("emulated", _emulated)
register("fa3", _fa3)
register("fa3-vllm", _fa3_vllm)
