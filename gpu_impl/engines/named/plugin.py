"""A named system under test (``sut=MODULE:CLASS[@ARG]``) behind the engine interface: its own code decides, a
case found on it replays on it only when ``--engine`` names it, conform compares it with the profile it names."""

from __future__ import annotations

from gpu_impl.plugin import EnginePlugin


class NamedSutPlugin(EnginePlugin):
    def open(self, spec, policy=None):
        from gpu_impl.sut import open_named_sut

        return open_named_sut(spec)
