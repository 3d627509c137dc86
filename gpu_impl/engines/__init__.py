"""Real serving engines as systems under test (``gpu_impl.sut``): sglang and vLLM releases and checkouts on CPU.

Each engine form's row of ``gpu_impl/engine_forms.json`` names its engine's plugin (``gpu_impl.plugin``), whose
``open`` ``gpu_impl.sut.open_sut`` calls; ``open_engine(spec)`` opens a real engine the same way. A plugin's opener checks the spec (a registered release from 0.5.11, or a checkout / wheel),
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

__all__ = ["open_engine", "real_engine_plugins", "EngineUnavailable", "UnknownRelease", "NoPrecompute", "EnvSetupError",
           "CheckoutImportError", "DriverError"]


def open_engine(spec, progress: Callable[[str], None] = print):
    """The system under test a real engine spec names, opened by its engine's plugin (``gpu_impl.plugin``); a spec
    whose plugin is no engine folder of this package with a host side (the model, a named SUT) is
    :class:`EngineUnavailable`."""
    from ..sut import ENGINE_REGISTRY, parse_engine

    if isinstance(spec, str):
        spec = parse_engine(spec)
    if spec.form["plugin"] not in real_engine_plugins():
        real = ", ".join(row["example"].replace("0.5.23", "V").replace("0.33.0", "V")
                         for row in ENGINE_REGISTRY.values() if row["plugin"] in real_engine_plugins())
        raise EngineUnavailable(f"engine {spec}: no real engine of kind {spec.kind!r} (allowed: {real})")
    return spec.plugin.open(spec, progress=progress)


def real_engine_plugins() -> set:
    """The plugins (registry ``plugin`` values) of the engine folders here that run a real engine's own code in its
    environment: those whose folder has a ``host`` module."""
    from importlib.util import find_spec

    from ..sut import ENGINE_REGISTRY

    out = set()
    for row in ENGINE_REGISTRY.values():
        module = row["plugin"].partition(":")[0]
        package = module.rpartition(".")[0]
        if package.startswith(__name__ + ".") and find_spec(package + ".host") is not None:
            out.add(row["plugin"])
    return out
