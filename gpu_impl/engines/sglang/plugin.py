"""sglang behind the engine interface (:class:`gpu_impl.plugin.EnginePlugin`): a release (``sglang==V``) or a
checkout (``sglang-src=PATH``) runs its own ``FlashAttentionBackend``; conform compares it with the model under
its release's profile."""

from __future__ import annotations

from gpu_impl.plugin import EnginePlugin


class SglangPlugin(EnginePlugin):
    #: its worker protocol's server (the runtime sanitizer's engine worker runs it too)
    driver_module = "gpu_impl.engines.sglang.driver"

    def open(self, spec, policy=None, progress=print):
        from .host import SglangSUT

        return SglangSUT(spec, progress=progress)

    def open_worker(self, spec, worker, worker_env, progress=print, root=None):
        from .host import SglangSUT

        return SglangSUT(spec, progress=progress, root=root, worker=worker, worker_env=worker_env)

    def fa3_build(self, spec) -> str:
        """A release is judged under the build its kernel wheel ships (refmodel/fa3_builds.json); a checkout under
        upstream's, its kernel pin being unknown."""
        from refmodel.fa3_builds import UPSTREAM, build_for_engine

        if not spec.release:
            return UPSTREAM
        try:
            return build_for_engine("sglang", spec.release)
        except ValueError:
            return UPSTREAM

    def releases(self) -> list:
        """Every profiled release (spec/model/engine_profiles.json), each run by its own row."""
        from spec.model.engine_profiles import RELEASES

        return [(r, r) for r in RELEASES]

    def profile_proof(self) -> str:
        return "model-policy"

    def check_setup_release(self, release: str) -> None:
        """A release without a profile is refused with what runs its code instead (``envs.next_step``)."""
        from spec.model.engine_profiles import ProfileError, profile_for

        try:
            profile_for(release)
        except ProfileError as exc:
            from gpu_impl.engines.envs import next_step

            raise ValueError(f"{exc}; {next_step('sglang', release)}") from None

    def release_profile(self, release: str):
        """The release's profile (spec/model/engine_profiles.json): the model plays it with its heads and guard."""
        from spec.model.engine_profiles import profile_for

        return profile_for(release)

    def profiled_releases(self) -> str:
        from spec.model.engine_profiles import RELEASES

        return f"{RELEASES[0]} .. {RELEASES[-1]}"

    def assumption_facts(self, release: str) -> dict:
        from spec.model.assumption_facts import facts_for

        return facts_for("sglang", release)
