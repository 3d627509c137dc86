"""Fake systems under test for the harness tests: the model playing a release (named as a real engine), and an
engine that reports a violation on every decode step. They need no engine environment and no CUDA."""

from __future__ import annotations

import dataclasses

from gpu_impl.scenario import ScenarioResult, run_scenario
import gpu_impl.sut as sut_mod
from gpu_impl.sut import EngineSpec, SystemUnderTest
from spec.violation import Violation


class ProfileSUT(SystemUnderTest):
    """Our model under a release's profile (or the given heads/guard), presented as ``sglang==release``."""

    def __init__(self, release: str = "0.5.14", heads=None, guard=None, kind: str = "sglang", path=None):
        from spec.model.engine_profiles import profile_for

        self.spec = EngineSpec(kind, release=release if kind == "sglang" else None, path=path)
        prof = profile_for(release)
        self.release = release
        self.heads = heads or prof.precompute_heads
        self.guard_spec = guard or prof.guard_spec
        self.graph_replay_seqlen_k = prof.graph_replay_seqlen_k
        self.runs = 0
        self.closed = False

    def scenario(self, scenario):
        from gpu_impl.guards import load_guard

        return dataclasses.replace(scenario, guard=load_guard(self.guard_spec), guard_spec=self.guard_spec,
                                   metadata_heads=self.heads, defects=frozenset(),
                                   graph_replay_seqlen_k=self.graph_replay_seqlen_k)

    def run(self, scenario, kernel=None, numerics=False, device="cpu"):
        from gpu_impl.model_pairs import model_pairs

        self.runs += 1
        scn = self.scenario(scenario)
        result = run_scenario(scn, kernel=kernel, numerics=False, device=device)
        result.trace = model_pairs(scn, result)
        return result

    def identity(self):
        ident = {"name": str(self.spec), "revision": "fake-rev"}
        ident["release" if self.spec.kind == "sglang" else "path"] = self.spec.release or self.spec.path
        return ident

    def assumption_facts(self):
        """The facts of the release this fake presents as (spec/model/assumption_facts.json)."""
        from spec.model.assumption_facts import facts_for

        return facts_for("sglang", self.release)

    #: the assumptions this fake's validation lets through (none: it rejects all spec assumes away)
    accepts_unenforced = False

    def validate(self, server_config, model_config=None):
        """Accept what spec's domain accepts (a stand-in for the release's own ServerArgs validation, stricter than
        the release's facts); :class:`FactsSUT` accepts what the facts say the release accepts."""
        from spec.model.assumption_facts import not_enforced
        from spec.model.config import MODELS, config_violations

        dropped = not_enforced(self.assumption_facts()) if self.accepts_unenforced else ()

        server_rules = {"ASSUMPTION_POSITIVE_SIZES", "ASSUMPTION_TP_DIVISIBLE", "ASSUMPTION_CP_STRATEGY_KNOWN",
                        "ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY", "ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP",
                        "ASSUMPTION_NUM_SPLITS_RANGE"}
        if model_config is not None:
            found = config_violations(model_config, server_config, dropped)
        else:
            found = [v for v in config_violations(MODELS["llama-3-8b"], server_config, dropped)
                     if v.invariant in server_rules]
        return (not found), (f"{found[0].detail['field']}: {found[0].message}" if found else "")

    def close(self):
        self.closed = True


class FactsSUT(ProfileSUT):
    """A release whose validation accepts what its assumption facts say it accepts (spec/model/assumption_facts.json)."""

    accepts_unenforced = True


class ViolatingSUT(ProfileSUT):
    """A seeded defect: every scenario with a decode step reports SPLIT_BOUND, whatever the configuration."""

    def run(self, scenario, kernel=None, numerics=False, device="cpu"):
        self.runs += 1
        result = ScenarioResult()
        for i, step in enumerate(scenario.steps):
            if step.mode == "decode":
                result.findings.append(Violation.at_step("SPLIT_BOUND", i, 0, "fake engine: 9 splits > S_c=4",
                                                          {"mode": "decode", "path": "eager"}))
        return result


class PermissiveSUT(ProfileSUT):
    """A release whose validation accepts every configuration (so spec's assumptions are not the release's)."""

    def validate(self, server_config, model_config=None):
        return True, ""


class NoGraphSUT(ProfileSUT):
    """A release whose validation rejects every CUDA-graph configuration."""

    def validate(self, server_config, model_config=None):
        if server_config.cuda_graph:
            return False, "cuda_graph: not supported by this release"
        return super().validate(server_config, model_config)


class ScenarioUnsupported(sut_mod.ScenarioUnsupported):
    """The system-under-test interface's error for a scenario its driver does not run."""


class NoMlaSUT(ProfileSUT):
    """A driver that does not run MLA models (raises ScenarioUnsupported, as gpu_impl.engines does)."""

    def run(self, scenario, kernel=None, numerics=False, device="cpu"):
        if scenario.model.is_mla:
            raise ScenarioUnsupported("MLA models are not driven")
        return super().run(scenario, kernel, numerics, device)


def install(monkeypatch, factory):
    """Make ``gpu_impl.sut.open_sut`` return ``factory(spec)`` for real engine specs (the model stays real)."""
    import gpu_impl.sut as sut_mod

    real = sut_mod.open_sut
    opened = []

    def fake_open(spec, **options):  # options: the model's policy (gpu_impl.sut.open_sut)
        if isinstance(spec, str):
            spec = sut_mod.parse_engine(spec)
        if spec.is_model:
            return real(spec, **options)
        s = factory(spec)
        opened.append(s)
        return s

    monkeypatch.setattr(sut_mod, "open_sut", fake_open)
    return opened
