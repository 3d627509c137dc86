"""Make ``import flash_attn_interface`` give the emulated FA3 (CPU), for a user's own tests: one line.

Use any of::

    import gpu_impl.emulate_fa3                      # in a conftest.py (registers on import)
    pytest -p gpu_impl.emulate_fa3 tests/            # the same, from the command line
    pytest -p fa3verify.pytest_plugin --fa3verify-emulate-fa3 tests/

After it, ``from flash_attn_interface import flash_attn_with_kvcache, flash_attn_varlen_func, ...`` resolves to
:mod:`gpu_impl.kernels.fa3_interface` (FA3's forward entry points over the emulated kernel; docs/emulator.md).
A module already bound by an earlier ``import`` keeps what it bound: register before the code under test
imports FA3.

``sgl_kernel.flash_attn`` is registered too, but only where that is safe: when no real ``sgl_kernel`` is
importable (a stub package whose only member is ``flash_attn``; sgl-kernel's argument order and
``get_scheduler_metadata`` naming, translated by ``gpu_impl.fa3_records``). A real ``sgl_kernel`` is never
shadowed: on a machine that has one, sglang's other kernels come from it and FA3 from it as well.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

__all__ = ["install", "uninstall", "MODULE_NAME", "SGL_MODULE_NAME"]

MODULE_NAME = "flash_attn_interface"
SGL_MODULE_NAME = "sgl_kernel.flash_attn"
_FAKE_SGL_FLASH_ATTN = Path(__file__).resolve().parent / "engines" / "fakes" / "sgl_kernel" / "flash_attn.py"
_INSTALLED: dict = {}


class _SglKernelFA3:
    """sgl-kernel's naming over the emulated interface (what the stub ``sgl_kernel.flash_attn`` routes to)."""

    def get_scheduler_metadata(self, *args, **kwargs):
        from .fa3_records import bind_precompute, translate_precompute
        from .kernels import fa3_interface

        sig, bound = bind_precompute(*args, **kwargs)
        return fa3_interface.get_scheduler_metadata(**translate_precompute(bound, sig, "fa3"))

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, **named):
        from .kernels import fa3_interface

        return fa3_interface.flash_attn_with_kvcache(q, k_cache, v_cache, **named)

    def flash_attn_varlen_func(self, *args, return_softmax_lse=False, sinks=None, **kwargs):
        from .kernels import fa3_interface

        if sinks is not None:
            raise NotImplementedError("flash_attn_varlen_func(sinks=...): attention sinks are not modelled")
        kwargs.setdefault("return_attn_probs", bool(return_softmax_lse))
        return fa3_interface.flash_attn_varlen_func(*args, **kwargs)


def _real_sgl_kernel_importable() -> bool:
    module = sys.modules.get("sgl_kernel")
    if module is not None:
        return not getattr(module, "__fa3verify_emulated__", False)
    try:
        return importlib.util.find_spec("sgl_kernel") is not None
    except (ImportError, ValueError):
        return False


def install(sgl_kernel: bool = True) -> dict:
    """Register the emulated FA3 as ``flash_attn_interface`` (and ``sgl_kernel.flash_attn`` where safe).

    Returns ``{module name: what was registered or why not}``. Idempotent.
    """
    from .kernels import fa3_interface

    if getattr(sys.modules.get(MODULE_NAME), "EMULATED", False) is not True:
        # a module named as FA3's (the sanitizer and other tools find entry points by module name), whose
        # functions are gpu_impl.kernels.fa3_interface's
        facade = types.ModuleType(MODULE_NAME, fa3_interface.__doc__)
        for name in fa3_interface.__all__:
            setattr(facade, name, getattr(fa3_interface, name))
        facade.__file__ = fa3_interface.__file__
        sys.modules[MODULE_NAME] = facade
    _INSTALLED[MODULE_NAME] = "gpu_impl.kernels.fa3_interface"
    if sgl_kernel and SGL_MODULE_NAME not in _INSTALLED:
        if _real_sgl_kernel_importable():
            _INSTALLED[SGL_MODULE_NAME] = "not registered: a real sgl_kernel is importable and is not shadowed"
        else:
            package = types.ModuleType("sgl_kernel", "fa3-verify's emulated sgl_kernel: only flash_attn")
            package.__path__ = []
            package.__fa3verify_emulated__ = True
            spec = importlib.util.spec_from_file_location(SGL_MODULE_NAME, _FAKE_SGL_FLASH_ATTN)
            front = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(front)
            front.install(_SglKernelFA3())
            package.flash_attn = front
            sys.modules["sgl_kernel"] = package
            sys.modules[SGL_MODULE_NAME] = front
            _INSTALLED[SGL_MODULE_NAME] = "stub sgl_kernel package (flash_attn only)"
    return dict(_INSTALLED)


def uninstall() -> None:
    """Remove what :func:`install` registered."""
    if _INSTALLED.pop(MODULE_NAME, None) is not None:
        sys.modules.pop(MODULE_NAME, None)
    state = _INSTALLED.pop(SGL_MODULE_NAME, None)
    if state is not None and state.startswith("stub"):
        sys.modules.pop(SGL_MODULE_NAME, None)
        if getattr(sys.modules.get("sgl_kernel"), "__fa3verify_emulated__", False):
            sys.modules.pop("sgl_kernel", None)


install()
