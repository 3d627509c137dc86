"""sglang behind the engine interface (:class:`gpu_impl.plugin.EnginePlugin`): a release (``sglang==V``) or a
checkout (``sglang-src=PATH``) runs its own ``FlashAttentionBackend``; conform compares it with the model under
its release's profile."""

from __future__ import annotations

from gpu_impl.plugin import EnginePlugin


class SglangPlugin(EnginePlugin):
    def open(self, spec, policy=None, progress=print):
        from .host import SglangSUT

        return SglangSUT(spec, progress=progress)
