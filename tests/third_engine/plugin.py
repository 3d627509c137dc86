"""The recorded engine behind the engine interface (``gpu_impl.plugin.EnginePlugin``): ``--engine recorded=LOG``
answers from the recorded FA3 event log LOG (:class:`recorded_sut.RecordedSUT`). With ``engine_forms.json`` beside
it, this folder is the whole engine: registering that file (``$FA3VERIFY_ENGINE_FORMS`` or
``gpu_impl.sut.register_forms``) is the only step; no file of the harness, of gpu_impl or of spec names it.
Every other question (its own code decides, a case found on it replays on it only when named, conform compares it
with the profile it names) is the interface's default answer."""

from __future__ import annotations

from gpu_impl.plugin import EnginePlugin


class RecordedPlugin(EnginePlugin):
    def open(self, spec, policy=None, progress=print):
        from third_engine.recorded_sut import RecordedSUT

        sut = RecordedSUT(spec.path)
        sut.spec = spec
        return sut
