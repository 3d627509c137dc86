"""The lifecycle fuzz property: the campaign over the model backend's decode steps as metadata lifecycles.

The fixed policy passes on every family that reaches the precompute; each negative control (the pre-fix guard,
two seeded backend defects) is found, by the lifecycle invariant of its class.
"""

import pytest

from fa3verify.campaign import Budget
from fa3verify.lifecycle_fuzz import lifecycle_campaign
from fa3verify.policy import load_policy

CASES = Budget(cases=60)


@pytest.mark.parametrize("family, path", [("graph-tp", "lifecycle-replay"), ("eager-tp", "lifecycle-eager"),
                                          ("graph-padding", "lifecycle-replay")])
def test_the_fixed_policy_keeps_every_lifecycle_invariant(family, path):
    camp = lifecycle_campaign(load_policy("fixed"), CASES, seed=3, family=family)
    assert camp.cases >= 50 and camp.reach[path] >= 50      # not vacuous: the sequences ran launches
    assert camp.failures == {}, [f.message for f in camp.failures.values()][:2]


def test_the_pre_fix_guard_is_found_as_a_precompute_shared_across_other_heads():
    camp = lifecycle_campaign(load_policy("pre-fix"), Budget(cases=100), seed=1, family="scenario")
    found = {f.invariant for f in camp.failures.values()}
    assert "SHARED_PRECOMPUTE_MATCHES_LAYER" in found
    assert lifecycle_campaign(load_policy("fixed"), Budget(cases=100), seed=1, family="scenario").failures == {}


@pytest.mark.parametrize("defect, family, invariant", [
    ("graph-metadata-before-padding", "graph-padding", "PADDED_ROWS_READ_DEFINED"),
    ("graph-split-count-from-capture", "graph-tp", "CAPTURE_COVERS_REPLAY"),
])
def test_seeded_backend_defects_are_found_by_their_lifecycle_invariant(defect, family, invariant):
    camp = lifecycle_campaign(load_policy("fixed"), CASES, seed=3, family=family, defects={defect})
    assert invariant in {f.invariant for f in camp.failures.values()}


def test_a_case_without_a_precompute_is_unsupported_not_a_pass():
    camp = lifecycle_campaign(load_policy("fixed"), Budget(cases=30), seed=1, family="dp-attention-graph")
    assert camp.cases == 0 and camp.unsupported == 30


def test_a_release_that_replays_with_the_context_bound_is_followed():
    """sglang 0.5.16+ recompute at replay with max_seqlen_k = the context length (no host lengths): the lifecycle
    takes the backend's bound, and the fixed policy still keeps every invariant."""
    policy = load_policy("fixed", graph_replay_seqlen_k="context_length")
    camp = lifecycle_campaign(policy, CASES, seed=3, family="graph-tp")
    assert camp.cases >= 50 and camp.failures == {}
    from fa3verify.commands.fuzz import scenario_for
    from fa3verify.strategies import family
    import random

    from gpu_impl.lifecycle import lifecycle_sequences
    case = next(c for c in (family("graph-tp")(random.Random(i)) for i in range(20)) if c is not None)
    (_, engine, _), = lifecycle_sequences(scenario_for(case, policy))
    assert engine.replay_max_seqlen_k == case.server.context_length
