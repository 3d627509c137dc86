"""Negative controls of the vLLM gate on copies of released code (tests/release_copies.py: the release's installed
package as links, one module patched, driven as ``vllm-src=COPY``).

- A passing release (0.33.0 with its full-graph replay precompute aligned to the captured call, ``ALIGNED_REPLAY_0_33_0``:
  the clean release carries 0.34.0's replay finding, which its V1 runner's capture and replay reach) with a one-path
  regression -- on the full-CUDA-graph path only, the call passes half the split bound its precompute was given -- is
  found within the gate's default fuzz budget on 5 seeds of 5 (the gate's fuzz stage is this campaign; each seed stops
  at its first failure). Paired: the aligned copy's gate passes (tests/engines/test_vllm_checkout.py).
- A passing release with cascade attention (0.20.0) with a one-path regression on cascade -- both cascade calls pass
  half the split bound of their precomputes -- is found within the gate's default fuzz budget on 5 seeds of 5.
- The gate's family draws models whose layers differ from their config and K/V head sizes that differ (a share of its
  eager and piecewise cases): on the passing 0.33.0 copy, the builder taking its KV heads from the model config
  (``MODEL_CONFIG_KV_HEADS_0_33_0``, as 0.11.0 .. 0.28.0 do) and the release's own DiffKV precompute without
  ``headdim_v`` (``ALIGNED_REPLAY_ONLY_0_33_0``) are each found within the gate's default fuzz budget on 5 seeds of 5.
- A failing release (0.34.0: its full-graph replay finding, docs/engines-vllm.md) with its replay's precompute
  aligned to the captured call gates PASS, and the release's finding case file PASSES NOW on it (on the release
  itself it STILL FAILS: tests/engines/test_engine_vllm_v2.py).

Engine-marked: each needs its release's cached environment and skips, naming the setup command, without one.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from engine_releases import need_vllm


SEEDS = range(5)


def _needs(release: str) -> None:
    need_vllm(release)


def _copy_sut(root):
    from gpu_impl.engines.vllm.host import VllmSUT
    from gpu_impl.sut import parse_engine

    return VllmSUT(spec=parse_engine(f"vllm-src={root}"), progress=lambda line: None)


def _started_as_the_gate_starts_it(sut):
    """Launched and started as ``gate`` does (``fa3verify.commands.gate``: the worker's import and its warm-up of vLLM's
    config validation come before the fuzz stage, whose budget they are not part of)."""
    sut.launch()
    sut.start()
    return sut


def _first_failure(sut, seed: int, budget_s=None, max_cases=None):
    """(invariant, cases run, seconds to it) of the first failure of the gate's fuzz campaign on ``sut`` with
    ``seed``, or None."""
    from fa3verify.commands.fuzz import run_campaign
    from fa3verify.policy import load_policy
    from gpu_impl.kernels import load

    domain = sut.domain()
    domain.reset_counts()
    camp = run_campaign(load_policy(), load("emulated", mode="strict"), seed=seed, budget_s=budget_s,
                        max_cases=max_cases, sut=sut, domain=domain, stop_at_first_failure=True)
    first = min(camp.failures.values(), key=lambda f: f.found_at_s, default=None)
    return None if first is None else (first.invariant, camp.cases, round(first.found_at_s, 2))


@pytest.mark.engine
def test_a_passing_release_with_a_one_path_split_regression_is_found_within_the_gate_budget_on_five_seeds(tmp_path):
    _needs("0.33.0")
    from fa3verify.commands.gate import gate
    from release_copies import CALL_HALF_SPLITS_0_33_0, vllm_patched_copy

    budget = inspect.signature(gate).parameters["budget_s"].default  # the gate's default fuzz budget
    seeded = vllm_patched_copy("0.33.0", tmp_path / "seeded", CALL_HALF_SPLITS_0_33_0)
    with _started_as_the_gate_starts_it(_copy_sut(seeded)) as sut:
        found = {seed: _first_failure(sut, seed, budget_s=budget) for seed in SEEDS}
    assert all(f is not None and f[0] in ("SPLIT_BOUND", "COMBINE_CAPACITY") for f in found.values()), found


@pytest.mark.engine
def test_a_passing_release_with_a_cascade_split_regression_is_found_within_the_gate_budget_on_five_seeds(tmp_path,
                                                                                                       monkeypatch):
    """0.20.0 (its V1 runner passes its campaign; cascade attention is the V1 runner's) with both cascade calls passing
    half the split bound of their precomputes (release_copies.CASCADE_HALF_SPLITS): the V1 runner's campaign (family
    vllm-paths) finds it on every seed, a split finding on the cascade path. (0.20.0's V2 runner is driven too since,
    and fails with its own findings -- docs/engines-vllm.md, "The V2 runner on more releases" --, so the campaign here
    is the V1 runner's, the passing one.)"""
    _needs("0.20.0")
    from gpu_impl.engines.vllm import paths

    monkeypatch.setattr(paths, "both_runners", lambda release: False)
    from fa3verify.commands.gate import gate
    from release_copies import CASCADE_HALF_SPLITS_0_20_0, vllm_patched_copy

    budget = inspect.signature(gate).parameters["budget_s"].default
    seeded = vllm_patched_copy("0.20.0", tmp_path / "seeded", CASCADE_HALF_SPLITS_0_20_0)
    with _started_as_the_gate_starts_it(_copy_sut(seeded)) as sut:
        assert sut.domain().family == "vllm-paths"
        found = {seed: _first_failure(sut, seed, budget_s=budget) for seed in SEEDS}
    assert all(f is not None and f[0] in ("SPLIT_BOUND", "COMBINE_CAPACITY") for f in found.values()), found


#: what a precompute with another layer's KV heads gives (the heterogeneous-layers finding of 0.11.0 .. 0.28.0)
LAYERS_FINDINGS = {"SPLIT_BOUND", "COMBINE_CAPACITY", "SHARED_PRECOMPUTE_MATCHES_LAYER", "QUERY_COVER"}


@pytest.mark.engine
def test_the_gate_family_finds_a_builder_reading_the_model_configs_kv_heads_on_five_seeds(tmp_path):
    """The passing 0.33.0 copy whose builder precomputes with ``ModelConfig.get_num_kv_heads`` (the first attention
    block's count) instead of its group's KV-cache spec: the gate's own family (its share of layers that differ) finds
    it on every seed, on a case whose layers have their own KV heads."""
    _needs("0.33.0")
    from fa3verify.commands.gate import gate
    from release_copies import ALIGNED_REPLAY_0_33_0, MODEL_CONFIG_KV_HEADS_0_33_0, vllm_patched_copy

    budget = inspect.signature(gate).parameters["budget_s"].default
    seeded = vllm_patched_copy("0.33.0", tmp_path / "seeded", ALIGNED_REPLAY_0_33_0 + MODEL_CONFIG_KV_HEADS_0_33_0)
    with _started_as_the_gate_starts_it(_copy_sut(seeded)) as sut:
        found = {seed: _first_failure(sut, seed, budget_s=budget) for seed in SEEDS}
    assert all(f is not None and f[0] in LAYERS_FINDINGS for f in found.values()), found


@pytest.mark.engine
def test_the_gate_family_finds_the_diffkv_precompute_without_headdim_v_on_five_seeds(tmp_path):
    """0.33.0 with its replay aligned but its own DiffKV precompute (no ``headdim_v``: FA3 schedules for V 192 while
    the call has V 128): the gate's own family (its share of K/V head sizes that differ) finds it on every seed; the
    copy that passes V's size (``ALIGNED_REPLAY_0_33_0``) gates PASS (tests/engines/test_vllm_checkout.py)."""
    _needs("0.33.0")
    from fa3verify.commands.gate import gate
    from release_copies import ALIGNED_REPLAY_ONLY_0_33_0, vllm_patched_copy

    budget = inspect.signature(gate).parameters["budget_s"].default
    seeded = vllm_patched_copy("0.33.0", tmp_path / "seeded", ALIGNED_REPLAY_ONLY_0_33_0)
    with _started_as_the_gate_starts_it(_copy_sut(seeded)) as sut:
        found = {seed: _first_failure(sut, seed, budget_s=budget) for seed in SEEDS}
    assert all(f is not None and f[0] == "SHARED_PRECOMPUTE_MATCHES_LAYER" for f in found.values()), found


@pytest.mark.engine
def test_a_failing_release_with_its_replay_precompute_aligned_to_the_captured_call_passes(tmp_path):
    _needs("0.34.0")
    from fa3verify.commands.gate import gate
    from fa3verify.commands.replay import replay
    from release_copies import ALIGNED_REPLAY_0_34_0, vllm_patched_copy

    case = Path(__file__).parent.parent / "corpus_vllm" / "full-graph-replay-window-dropped-at-recompute.json"
    aligned = vllm_patched_copy("0.34.0", tmp_path / "aligned", ALIGNED_REPLAY_0_34_0)
    with _copy_sut(aligned) as sut:
        summary = gate(sut, max_cases=300, seed=0, cases_dir=str(tmp_path / "cases"), show_progress=False)
        assert summary.exit_code == 0, [(f.invariant, f.message[:200]) for f in summary.findings]
        assert summary.cases > 250 and sum((summary.domain or {}).get("reach", {}).get(k, 0)
                                           for k in ("full", "full: capture")) > 0
        _, seen = replay(str(case), sut=sut)
        assert seen.verdict == "PASSES NOW" and not seen.findings


def _drafter_findings_only(sut):
    """``sut`` whose runs report only the findings on draft calls (the driver's ``detail.drafter``) of models whose K
    and V head sizes agree, other than SHAPE: the campaign's first failure is then the first split finding on the
    drafter path, whatever the release's own findings (its DiffKV precompute without ``headdim_v``, finding 11, reaches
    its draft calls too: the draft metadata goes through the same ``_get_scheduler_metadata``; 0.28.0 .. 0.31.0's
    FULL draft-decode graph layout, finding 15, is a SHAPE)."""
    run = sut.run

    def drafter_only(scenario, *args, **kwargs):
        result = run(scenario, *args, **kwargs)
        same = scenario.model.head_dim_v in (None, scenario.model.head_dim)
        result.findings = [f for f in result.findings if f.detail.get("drafter") and same and f.invariant != "SHAPE"]
        return result

    sut.run = drafter_only
    return sut


def _draft_regression_found_on_every_seed(tmp_path, release: str, patches, family: str, invariants: tuple) -> None:
    """A copy of ``release`` with ``patches``, started as the gate starts it (its family ``family``), counting only
    findings on draft calls: the gate's own campaign within its default budget finds one of ``invariants`` first on
    every seed of :data:`SEEDS`."""
    _needs(release)
    from fa3verify.commands.gate import gate
    from release_copies import vllm_patched_copy

    budget = inspect.signature(gate).parameters["budget_s"].default
    seeded = vllm_patched_copy(release, tmp_path / "seeded", patches)
    with _started_as_the_gate_starts_it(_copy_sut(seeded)) as sut:
        assert sut.domain().family == family
        _drafter_findings_only(sut)
        found = {seed: _first_failure(sut, seed, budget_s=budget) for seed in SEEDS}
    assert all(f is not None and f[0] in invariants for f in found.values()), found


@pytest.mark.engine
def test_the_gate_family_finds_a_v2_draft_update_split_regression_on_0_31_0_on_five_seeds(tmp_path):
    """0.31.0 (both runners; its V2 runner's drafter driven, family ``vllm-paths-both-drafts``) with the fused
    draft-decode update asking a split bound of 128 where the draft call passes 0 (``DRAFT_UPDATE_SPLITS_0_31_0``):
    the gate's own campaign, within its default budget, finds a split finding on a draft call on every seed. The
    release fails its gate with findings of its own (docs/engines-vllm.md), so only draft-call findings count here;
    the release itself has none on the same scenarios (tests/engines/test_vllm_paths.py)."""
    from release_copies import DRAFT_UPDATE_SPLITS_0_31_0

    _draft_regression_found_on_every_seed(tmp_path, "0.31.0", DRAFT_UPDATE_SPLITS_0_31_0, "vllm-paths-both-drafts",
                                          ("SPLIT_BOUND", "COMBINE_CAPACITY"))


@pytest.mark.engine
def test_the_gate_family_finds_a_v2_draft_graph_split_regression_on_0_34_0_on_five_seeds(tmp_path):
    """0.34.0 (family ``vllm-v2``: a third of its cases draft, in every graph mode) with the fused draft-decode update
    under a full-graph mode asking twice the split bound its draft call passes (``DRAFT_GRAPH_UPDATE_SPLITS_0_34_0``:
    the FULL draft-decode graph's in-graph recompute): the gate's own campaign, within its default budget, finds a
    split finding on a draft call on every seed (only draft-call findings count: the release fails its gate with
    findings of its own; it has none on draft calls, tests/engines/test_engine_vllm_v2.py)."""
    from release_copies import DRAFT_GRAPH_UPDATE_SPLITS_0_34_0

    _draft_regression_found_on_every_seed(tmp_path, "0.34.0", DRAFT_GRAPH_UPDATE_SPLITS_0_34_0, "vllm-v2",
                                          ("SPLIT_BOUND", "COMBINE_CAPACITY", "CAPTURE_COVERS_REPLAY"))
