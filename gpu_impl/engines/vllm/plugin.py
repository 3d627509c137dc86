"""vLLM behind the engine interface (:class:`gpu_impl.plugin.EnginePlugin`): a release (``vllm==V``) or a checkout
(``vllm-src=PATH``) runs its FlashAttention metadata builder and impl; it runs a case's vLLM options and seeded
defects, its gate adds the flow theorem under its release's profile, conform checks that profile's claims, and a
release is judged under the FA3 build it ships (refmodel.fa3_builds)."""

from __future__ import annotations

from gpu_impl.plugin import EnginePlugin


class VllmPlugin(EnginePlugin):
    options_key = "vllm"

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
