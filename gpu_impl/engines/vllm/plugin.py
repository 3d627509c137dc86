"""vLLM behind the engine interface (:class:`gpu_impl.plugin.EnginePlugin`): a release (``vllm==V``) or a checkout
(``vllm-src=PATH``) runs its FlashAttention metadata builder and impl; it runs a case's vLLM options and seeded
defects, its gate adds the flow theorem under its release's profile, conform checks that profile's claims, and a
release is judged under the FA3 build it ships (refmodel.fa3_builds)."""

from __future__ import annotations

from gpu_impl.plugin import EnginePlugin


class VllmPlugin(EnginePlugin):
    options_key = "vllm"
    flow_profiles_file = "spec/model/engine_profiles_vllm.json"

    #: ``theorems.THEOREM``, written here so that the plugin stays light (it loads for ``--help``; a test pins the
    #: two together)
    flow_theorem = "vllm-flow"

    def open(self, spec, policy=None, progress=print):
        from .host import VllmSUT

        if spec.release is not None:  # an unknown release is refused now, not at the first run
            from gpu_impl.engines.envs import check_release

            check_release(spec.release, engine="vllm")
            return VllmSUT(spec.release)
        return VllmSUT(spec=spec)

    def applies_defects(self, spec) -> bool:
        return True

    def fa3_build(self, spec) -> str:
        from refmodel.fa3_builds import UPSTREAM, build_for_engine

        if not spec.release:
            return UPSTREAM
        try:
            return build_for_engine("vllm", spec.release)
        except ValueError:
            return UPSTREAM

    def releases(self) -> list:
        """Every registered row (``recipes.RECIPES``), every release sharing a row (``SHARES_ROW``) and every
        surveyed release marked unavailable (``UNAVAILABLE``: runs as None, its open says why), oldest first."""
        from . import recipes

        out = {r: r for r in recipes.RELEASES}
        out.update({r: row for r, row in recipes.SHARES_ROW.items() if r not in out})
        out.update({r: None for r in recipes.UNAVAILABLE if r not in out})
        return sorted(out.items(), key=lambda item: recipes.version_key(item[0]))

    def proof_stages(self, spec) -> tuple:
        return ("witnesses", "flow-theorem")

    def conformance(self, spec):
        return "own-profile"

    def profile_proof(self) -> str:
        return "flow-theorem"

    def assumption_facts(self, release: str) -> dict:
        from spec.model.assumption_facts import facts_for

        return facts_for("vllm", release)

    def release_profile(self, release: str):
        """The release's vLLM profile (spec/model/engine_profiles_vllm.json; VllmProfileError is a ValueError)."""
        from spec.model import engine_profiles_vllm

        return engine_profiles_vllm.vllm_profile_for(release)

    def flow_results(self, profile, timeout_s: float = 10.0, cases_dir=None) -> list:
        """``vllm-flow`` under ``profile`` (a refutation's counterexample replays on ``vllm==V``:
        ``theorems.write_vllm_case``)."""
        from .theorems import run_vllm_theorems

        return list(run_vllm_theorems(profile, timeout_s=timeout_s, cases_dir=cases_dir))

    def flow_ran_on(self, profile) -> str:
        return f"the model of vllm=={profile.release}'s flow"
