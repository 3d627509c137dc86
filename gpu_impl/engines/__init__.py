"""Real serving engines as systems under test (``gpu_impl.sut``): sglang and vLLM releases and checkouts on CPU.

``open_engine(spec)`` is what ``gpu_impl.sut.open_sut`` calls for a non-model spec. It checks the spec (a
registered release from 0.5.11, or a checkout / wheel), builds or reuses the release's cached environment
(``envs.ensure_env``) and returns a :class:`~gpu_impl.engines.sglang.SglangSUT` whose worker starts on first use.
Errors are :class:`~gpu_impl.engines.errors.EngineUnavailable` (a ``gpu_impl.sut.EngineSpecError``): unknown
release, release without the precompute (< 0.5.11), a checkout that does not import, a failed set-up.

Modules: ``recipes`` / ``vllm_recipes`` (releases and environment recipes, data), ``envs`` (the one builder of
cached venvs), ``installers`` (uv or pip, pip's configuration translated), ``protocol`` (wire format and the one
worker loop), ``sglang`` / ``vllm`` (the SUTs, host side), ``sglang_driver`` / ``sglang_rank`` / ``sglang_glue`` /
``validation`` / ``vllm_driver`` / ``vllm_glue`` (run inside the engine environment), ``fakes/`` (stand-ins for
``sgl_kernel`` and ``torchvision``).
"""

from __future__ import annotations

from typing import Callable

from .errors import (CheckoutImportError, DriverError, EngineUnavailable, EnvSetupError, NoPrecompute,
                     UnknownRelease)

__all__ = ["open_engine", "EngineUnavailable", "UnknownRelease", "NoPrecompute", "EnvSetupError",
           "CheckoutImportError", "DriverError"]


def open_engine(spec, progress: Callable[[str], None] = print):
    """The system under test a real engine spec names: sglang or vLLM, a release or a checkout."""
    from ..sut import parse_engine

    if isinstance(spec, str):
        spec = parse_engine(spec)
    if spec.kind == "vllm":
        from .envs import check_release
        from .vllm import VllmSUT  # lazy: the worker starts on the first run

        check_release(spec.release, engine="vllm")  # an unknown release is refused now, not at the first run
        return VllmSUT(spec.release)
    if spec.kind == "vllm-src":
        from .vllm import VllmSUT

        return VllmSUT(spec=spec)  # a path holding no vLLM is refused now (CheckoutImportError)
    if spec.kind not in ("sglang", "sglang-src"):
        raise EngineUnavailable(f"engine {spec}: no real engine of kind {spec.kind!r} (allowed: sglang==V, "
                                f"sglang-src=PATH, vllm==V, vllm-src=PATH)")
    from .sglang import SglangSUT

    return SglangSUT(spec, progress=progress)
