"""Real serving engines as systems under test (``gpu_impl.sut``): sglang and vLLM releases and checkouts on CPU.

Each real engine form's row of ``gpu_impl/engine_forms.json`` names its opener here (``open_sglang``,
``open_vllm_release``, ``open_vllm_checkout``), which ``gpu_impl.sut.open_sut`` calls; ``open_engine(spec)`` opens
any of them by its row. An opener checks the spec (a registered release from 0.5.11, or a checkout / wheel),
builds or reuses the release's cached environment (``envs.ensure_env``) and returns the system under test (e.g.
a :class:`~gpu_impl.engines.sglang.host.SglangSUT`) whose worker starts on first use.
Errors are :class:`~gpu_impl.engines.errors.EngineUnavailable` (a ``gpu_impl.sut.EngineSpecError``): unknown
release, release without the precompute (< 0.5.11), a checkout that does not import, a failed set-up.

One folder per engine: ``sglang/`` and ``vllm/`` each hold everything that engine needs (``host``: the system
under test, host side; ``recipes``: releases and environment recipes, data; ``driver`` / ``glue`` / ``rank`` /
``validation`` / ...: run inside the engine environment; the engine's data tables). Shared here: ``envs`` (the one
builder of cached venvs), ``installers`` (uv or pip, pip's configuration translated), ``protocol`` (wire format
and the one worker loop), ``worker_client`` (the host side of that loop), ``checkouts`` (source checkouts and
wheels), ``fakes/`` (stand-ins for ``sgl_kernel`` and ``torchvision``).
"""

from __future__ import annotations

from typing import Callable

from .errors import (CheckoutImportError, DriverError, EngineUnavailable, EnvSetupError, NoPrecompute,
                     UnknownRelease)

__all__ = ["open_engine", "open_sglang", "open_vllm_release", "open_vllm_checkout", "OPENERS", "EngineUnavailable", "UnknownRelease", "NoPrecompute", "EnvSetupError",
           "CheckoutImportError", "DriverError"]


def open_sglang(spec, progress: Callable[[str], None] = print):
    """An sglang release or checkout (rows ``sglang`` and ``sglang-src`` of gpu_impl/engine_forms.json): its
    :class:`~gpu_impl.engines.sglang.host.SglangSUT`, whose worker starts on first use."""
    from .sglang.host import SglangSUT

    return SglangSUT(spec, progress=progress)


def open_vllm_release(spec, progress: Callable[[str], None] = print):
    """A vLLM release (row ``vllm``): an unknown release is refused now, not at the first run."""
    from .envs import check_release
    from .vllm.host import VllmSUT  # lazy: the worker starts on the first run

    check_release(spec.release, engine="vllm")
    return VllmSUT(spec.release)


def open_vllm_checkout(spec, progress: Callable[[str], None] = print):
    """A vLLM checkout or wheel (row ``vllm-src``): a path holding no vLLM is refused now (CheckoutImportError)."""
    from .vllm.host import VllmSUT

    return VllmSUT(spec=spec)


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
