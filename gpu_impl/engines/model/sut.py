"""The model as a system under test: :class:`ModelSUT`, our model of sglang's backend (``gpu_impl.backend``) driven by
``gpu_impl.scenario.run_scenario`` under the policy it is constructed with."""

from __future__ import annotations

from typing import Optional

from gpu_impl.sut import EngineSpec, SystemUnderTest

__all__ = ["ModelSUT"]


class ModelSUT(SystemUnderTest):
    """Our model of sglang's backend (``gpu_impl.backend``), driven by ``gpu_impl.scenario.run_scenario``, under
    the policy it is constructed with (``policy``: guard, metadata heads, runner hygiene; ``defects``: seeded
    defects, ``gpu_impl.defects``), which fuzz and the gate read from it and which runs (:meth:`under_policy`);
    without one, a scenario's own policy fields run."""

    spec = EngineSpec("model")

    def proof_plan(self) -> tuple:
        """Every theorem (spec.theorems) under its policy."""
        return ("theorems",)

    def run(self, scenario, kernel=None, numerics: bool = False, device: str = "cpu"):
        from gpu_impl.scenario import run_scenario

        for key in getattr(scenario, "options", None) or {}:
            from gpu_impl.plugin import options_owner

            raise ValueError(f"{key}: the options of another engine's configuration are not modelled by the model of "
                             f"sglang's backend; run it on {options_owner(key)}")
        return run_scenario(self.under_policy(scenario), kernel=kernel, numerics=numerics, device=device)

    def under_policy(self, scenario):
        """``scenario`` with this model's policy (guard, metadata heads, runner hygiene, the graph replay's
        ``max_seqlen_k``) and its seeded defects in force; unchanged when it was constructed with neither."""
        import dataclasses

        if self.policy is None and not self.defects:
            return scenario
        changes = {"defects": frozenset(scenario.defects) | self.defects}
        policy = self.policy
        if policy is not None:
            changes.update(guard=policy.guard, guard_spec=policy.guard_spec, metadata_heads=policy.metadata_heads,
                           clear_stale_cp_metadata=policy.clear_stale_cp_metadata,
                           graph_replay_seqlen_k=policy.graph_replay_seqlen_k, fa3_build=policy.fa3_build)
        return dataclasses.replace(scenario, **changes)

    def __init__(self, spec: Optional[EngineSpec] = None, policy=None, defects=frozenset()):
        self.spec = spec or EngineSpec("model")
        self.policy, self.defects = policy, frozenset(defects)

    def identity(self) -> dict:
        return {"name": "model"}
