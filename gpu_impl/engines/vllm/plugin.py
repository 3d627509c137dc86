"""vLLM behind the engine interface (:class:`gpu_impl.plugin.EnginePlugin`): a release (``vllm==V``) or a checkout
(``vllm-src=PATH``) runs its FlashAttention metadata builder and impl; it runs a case's vLLM options and seeded
defects, its gate adds the flow theorem under its release's profile, conform checks that profile's claims, and a
release is judged under the FA3 build it ships (refmodel.fa3_builds). What the harness needs of vLLM is here:
its case options' schema (:mod:`.options`), its strategy families (:mod:`.strategies`), its release profiles
(:mod:`.profiles`) and its conformance (:mod:`.conformance`)."""

from __future__ import annotations

from gpu_impl.plugin import EnginePlugin, OwnProfileRefused

from .options import OPTIONS_KEY


class VllmPlugin(EnginePlugin):
    options_key = OPTIONS_KEY

    def check_options(self, value, server: dict, path: str) -> dict:
        from .options import check_vllm_options

        return check_vllm_options(value, server, path)

    def assumptions_not_required(self) -> tuple:
        """Under vLLM ``server.attn_cp_size`` is decode context parallel, which needs no prefill CP
        (:data:`.strategies.NOT_ASSUMED_BY_VLLM`, from the vLLM releases' facts)."""
        from .strategies import NOT_ASSUMED_BY_VLLM

        return NOT_ASSUMED_BY_VLLM

    def strategy_families(self) -> dict:
        from .strategies import FAMILIES

        return dict(FAMILIES)

    def release_profile(self, release: str):
        from .profiles import vllm_profile_for

        return vllm_profile_for(release)

    def profiled_releases(self) -> str:
        from .profiles import VLLM_RELEASES

        return ", ".join(VLLM_RELEASES)

    def own_profile(self, spec, text, release):
        """The vLLM profile ``--engine-profile vllm==V`` names, else the one of ``release`` (the release ``--engine``
        names, or a checkout's nearest)."""
        from spec.model.engine_profiles import ProfileError, release_named

        option = "--engine-profile" if text else "--engine"
        text = text or f"vllm=={release}"
        if release_named(text, "vllm") is None:
            raise OwnProfileRefused("--engine-profile", f"{spec} runs vLLM's code; want vllm==V, got {text!r}")
        try:
            return self.release_profile(release_named(text, "vllm"))
        except ProfileError as exc:
            raise OwnProfileRefused(option, str(exc)) from None

    def check_own_profile(self, sut, profile):
        from .conformance import conform_vllm

        return conform_vllm(sut, profile)
    flow_profiles_file = "gpu_impl/engines/vllm/profiles.json"

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

    def flow_results(self, profile, timeout_s: float = 10.0, cases_dir=None) -> list:
        """``vllm-flow`` under ``profile`` (a refutation's counterexample replays on ``vllm==V``:
        ``theorems.write_vllm_case``)."""
        from .theorems import run_vllm_theorems

        return list(run_vllm_theorems(profile, timeout_s=timeout_s, cases_dir=cases_dir))

    def flow_ran_on(self, profile) -> str:
        return f"the model of vllm=={profile.release}'s flow"
