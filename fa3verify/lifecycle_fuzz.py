"""A fuzz property over metadata lifecycles: the campaign (fa3verify.campaign) over the model backend's sequences.

Each drawn scenario (a strategy family of fa3verify.strategies) runs on the model backend under a policy, its decode
steps become lifecycle sequences (gpu_impl.lifecycle: layers x eager/capture/replay steps over one shared metadata
and its persistent buffer), and spec.lifecycle_invariants judges every launch. A case whose backend never
precomputes has no metadata to follow: the campaign counts it as unsupported, never as a pass.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from spec.finding import Outcome

from .campaign import Budget, Campaign, Observation, run_campaign
from .commands.fuzz import scenario_for
from .policy import Policy
from .strategies import family as strategy_family

__all__ = ["LifecycleTarget", "lifecycle_campaign"]


class LifecycleTarget:
    """``observe(case)``: the case's lifecycle sequences on the model backend, judged by the lifecycle invariants."""

    parallel = 1

    def __init__(self, policy: Policy, defects=frozenset()):
        self.policy = policy
        self.defects = frozenset(defects)

    def observe(self, case) -> Optional[Observation]:
        from gpu_impl.lifecycle import run_lifecycle

        traces, found = run_lifecycle(scenario_for(case, self.policy, self.defects))
        modes = sorted({f"lifecycle-{r.mode}" for _, t in traces for r in t.launches})
        if not modes:
            return None
        findings = [replace(v, signature_key=f"lifecycle:{v.invariant}:{v.detail.get('mode', '')}") for v in found]
        return Observation(Outcome.of(findings), sorted({v.invariant for v in found}),
                           [v.message for v in found[:3]], findings, reached=tuple(modes))


def lifecycle_campaign(policy: Policy, budget: Budget, seed: int = 0, family: str = "scenario",
                       defects=frozenset()) -> Campaign:
    """Run the lifecycle property over ``family``'s cases on the model backend; returns the campaign."""
    return run_campaign(LifecycleTarget(policy, defects), strategy_family(family), budget=budget, seed=seed)
