"""Real serving engines as systems under test (``gpu_impl.sut``): sglang and vLLM releases and checkouts on CPU.

Each real engine form's row of ``gpu_impl/engine_forms.json`` names its opener here (``open_sglang``,
``open_vllm_release``, ``open_vllm_checkout``), which ``gpu_impl.sut.open_sut`` calls; ``open_engine(spec)`` opens
any of them by its row. An opener checks the spec (a registered release from 0.5.11, or a checkout / wheel),
builds or reuses the release's cached environment (``envs.ensure_env``) and returns the system under test (e.g.
a :class:`~gpu_impl.engines.sglang.SglangSUT`) whose worker starts on first use.
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

__all__ = ["open_engine", "open_sglang", "open_vllm_release", "open_vllm_checkout", "OPENERS", "EngineUnavailable", "UnknownRelease", "NoPrecompute", "EnvSetupError",
           "CheckoutImportError", "DriverError"]


def open_sglang(spec, progress: Callable[[str], None] = print):
    """An sglang release or checkout (rows ``sglang`` and ``sglang-src`` of gpu_impl/engine_forms.json): its
    :class:`~gpu_impl.engines.sglang.SglangSUT`, whose worker starts on first use."""
    from .sglang import SglangSUT

    return SglangSUT(spec, progress=progress)


def open_vllm_release(spec, progress: Callable[[str], None] = print):
    """A vLLM release (row ``vllm``): an unknown release is refused now, not at the first run."""
    from .envs import check_release
    from .vllm import VllmSUT  # lazy: the worker starts on the first run

    check_release(spec.release, engine="vllm")
    return VllmSUT(spec.release)


def open_vllm_checkout(spec, progress: Callable[[str], None] = print):
    """A vLLM checkout or wheel (row ``vllm-src``): a path holding no vLLM is refused now (CheckoutImportError)."""
    from .vllm import VllmSUT

    return VllmSUT(spec=spec)


def sglang_releases() -> list:
    """Row ``sglang``'s releases for the engine matrix: every profiled release (spec/model/engine_profiles.json),
    each run by its own row."""
    from spec.model.engine_profiles import RELEASES

    return [(r, r) for r in RELEASES]


def vllm_releases() -> list:
    """Row ``vllm``'s releases for the engine matrix: every registered row (``vllm_recipes.RECIPES``), every
    release that shares a row (``SHARES_ROW``, when the survey names some) and every surveyed release marked
    unavailable (``UNAVAILABLE``: runs as None, its open says why), oldest first."""
    from . import vllm_recipes

    shares = dict(getattr(vllm_recipes, "SHARES_ROW", {}) or {})
    unavailable = dict(getattr(vllm_recipes, "UNAVAILABLE", {}) or {})
    out = {r: r for r in vllm_recipes.RELEASES}
    out.update({r: row for r, row in shares.items() if r not in out})
    out.update({r: None for r in unavailable if r not in out})
    return sorted(out.items(), key=lambda item: vllm_recipes.version_key(item[0]))


#: The openers of this package, by the name a registry row's ``factory`` gives (``gpu_impl.engines:NAME``).
OPENERS = {"open_sglang": open_sglang, "open_vllm_release": open_vllm_release,
           "open_vllm_checkout": open_vllm_checkout}


def open_engine(spec, progress: Callable[[str], None] = print):
    """The system under test a real engine spec names, opened by the factory its registry row names (one of
    :data:`OPENERS`); a spec whose row names none of them is :class:`EngineUnavailable`."""
    from ..sut import parse_engine

    if isinstance(spec, str):
        spec = parse_engine(spec)
    module, _, name = spec.form["factory"].partition(":")
    opener = OPENERS.get(name) if module == __name__ else None
    if opener is None:
        raise EngineUnavailable(f"engine {spec}: no real engine of kind {spec.kind!r} (allowed: sglang==V, "
                                f"sglang-src=PATH, vllm==V, vllm-src=PATH)")
    return opener(spec, progress=progress)
