"""Models whose attention layers differ from their config, and K/V head sizes that differ, driven through vLLM's own
code (gpu_impl/engines/vllm/heterolayers.py, the DiffKV backend).

- The scenario field ``layer_kv_heads`` and the case option of the same name are range-checked naming the field; the
  families ``vllm-layers`` and ``vllm-diffkv`` draw what they say; the paths table gives a reason on the releases
  that do not drive them (the release's own refusal, with its file and line, on 0.8.5 .. 0.10.2).
- Engine (each needs its release's cached environment and skips, naming the setup command, without one): on 0.28.0
  the builder precomputes with ``ModelConfig.get_num_kv_heads`` (the first block's heads, vLLM's own method on the
  model stand-in) while the second layer calls with its own (S_p 109 vs S_c 15: SPLIT_BOUND); 0.33.0 passes the
  same model (the builder reads its group's KV-cache spec); the corpus case replays STILL FAILS on 0.28.0 and PASSES
  NOW on 0.29.0.
- The DiffKV precompute passes no ``headdim_v``: on 0.33.0 with blocks of 128 its split count exceeds the call's
  (S_p 10 vs S_c 7, SPLIT_BOUND); with blocks of 16 they agree; a copy passing V's size has no finding.
- Negative control: a copy of 0.33.0 whose builder reads the model config's heads again
  (release_copies.MODEL_CONFIG_KV_HEADS_0_33_0) is found by a ``vllm-layers`` campaign within the gate's default fuzz
  budget on 5 seeds of 5; the clean release passes that campaign.
"""

from __future__ import annotations

import inspect
import random
from pathlib import Path

import pytest

from engine_releases import need_vllm, vllm_worker

CASE = Path(__file__).parent.parent / "corpus_vllm" / "vllm-0.28.0-heterogeneous-layers-precompute-model-config-kv-heads.json"
DIFFKV_CASE = Path(__file__).parent.parent / "corpus_vllm" / "vllm-0.33.0-diffkv-precompute-without-headdim-v-block-256.json"
#: a Nemotron-NAS model: 32 query heads, its first layer 1 KV head, its second 8; one skewed decode step
HETERO = {"num_heads": 32, "num_kv_heads": 1, "num_layers": 2, "layer_kv_heads": [1, 8],
          "steps": [{"seq_lens": [32768] + [100] * 7}]}
SPLIT_FINDINGS = {"SPLIT_BOUND", "COMBINE_CAPACITY", "SHARED_PRECOMPUTE_MATCHES_LAYER"}
#: K 192 / V 128 (vLLM's DiffKV backend), 16 query heads on 1 KV head, one step of 64 new tokens over 1000
DIFFKV = {"num_heads": 16, "num_kv_heads": 1, "head_dim": 192, "head_dim_v": 128,
          "steps": [{"seq_lens": [1000], "query_lens": [64]}]}


def _needs(release: str) -> None:
    need_vllm(release)


# ---------------------------------------------------------------- schema, families, paths (no engine)


def test_the_driver_refuses_bad_layer_kv_heads_naming_the_field():
    from gpu_impl.engines.vllm.scenario import check_scenario

    assert check_scenario(dict(HETERO))["layer_kv_heads"] == [1, 8]
    for bad in ([1], [1, 3], [0, 8], "8", [1, True]):
        with pytest.raises(ValueError, match="layer_kv_heads"):
            check_scenario({**HETERO, "layer_kv_heads": bad})
    with pytest.raises(ValueError, match="common_prefix"):
        check_scenario({**HETERO, "common_prefix": 256})
    with pytest.raises(ValueError, match="lifecycle_defect"):
        check_scenario({**HETERO, "lifecycle_defect": "shared-precompute-heterogeneous-heads"})


def test_the_case_option_is_checked_naming_the_field():
    from spec.model.case_bounds import CaseFormatError
    from gpu_impl.engines.vllm.options import check_vllm_options

    assert check_vllm_options({"num_layers": 2, "layer_kv_heads": [1, 8]}, {})["layer_kv_heads"] == [1, 8]
    with pytest.raises(CaseFormatError, match="vllm.layer_kv_heads"):
        check_vllm_options({"num_layers": 3, "layer_kv_heads": [1, 8]}, {})
    with pytest.raises(CaseFormatError, match="vllm.common_prefix"):
        check_vllm_options({"num_layers": 2, "layer_kv_heads": [1, 8], "common_prefix": 256}, {})


def test_the_families_draw_layers_that_differ_and_kv_head_sizes_that_differ():
    from gpu_impl.engines.vllm.strategies import DIFF_KV_HEAD_DIMS, FAMILIES, vllm_diffkv_case, vllm_layers_case

    assert FAMILIES["vllm-layers"] is vllm_layers_case and FAMILIES["vllm-diffkv"] is vllm_diffkv_case
    layers = [vllm_layers_case(random.Random(seed)) for seed in range(300)]
    for c in layers:
        kv = c.options["vllm"]["layer_kv_heads"]
        assert len(kv) == c.options["vllm"]["num_layers"] >= 2 and len(set(kv)) >= 2
        assert all(c.model.num_heads % x == 0 for x in kv) and not c.server.cuda_graph
    assert 150 < sum(max(st["seq_lens"]) >= 4097 for c in layers for st in c.steps[:1]) < 300
    diffkv = [vllm_diffkv_case(random.Random(seed)) for seed in range(50)]
    assert all((c.model.head_dim, c.model.head_dim_v) == DIFF_KV_HEAD_DIMS for c in diffkv)


def test_the_gate_families_draw_both_as_a_share_and_other_cases_keep_their_draws(monkeypatch):
    """The gate's families (``vllm-paths``, ``vllm-paths-both``, ``vllm-v2``) redraw a share of their eager and
    piecewise cases as ``vllm-layers`` / ``vllm-diffkv`` cases (layers that differ: on the V1 runner under
    ``vllm-paths``, on either runner under ``vllm-paths-both``, and under ``vllm-v2``, whose attention groups are the
    release's own, from full-graph cases too); every case not redrawn is the one drawn without it."""
    from gpu_impl.engines.vllm import strategies

    def draw(name):
        rng = random.Random(0)
        return [strategies.FAMILIES[name](rng) for _ in range(1000)]

    for name in ("vllm-paths", "vllm-paths-both", "vllm-v2"):
        cases = draw(name)
        layers = [c for c in cases if c.options["vllm"].get("layer_kv_heads")]
        diffkv = [c for c in cases if (c.model.head_dim, c.model.head_dim_v) == strategies.DIFF_KV_HEAD_DIMS]
        assert 30 < len(diffkv) < 150 and all(not c.server.cuda_graph for c in diffkv), name
        assert 30 < len(layers) < 150, (name, len(layers))
        graphs = [c for c in layers if c.server.cuda_graph]
        assert (len(graphs) > 5) if name == "vllm-v2" else not graphs, (name, len(graphs))
        on_v2 = [c for c in layers if c.options["vllm"].get("runner") == "v2"]
        assert {"vllm-paths": not on_v2, "vllm-paths-both": 10 < len(on_v2) < len(layers) - 10,
                "vllm-v2": not on_v2}[name], (name, len(on_v2))
        assert all(len(set(c.options["vllm"]["layer_kv_heads"])) >= 2 for c in layers)
        with monkeypatch.context() as m:
            m.setattr(strategies, "LAYERS_SHARE", 0.0)
            m.setattr(strategies, "DIFFKV_SHARE", 0.0)
            before = draw(name)
        redrawn = {id(c) for c in layers + diffkv}
        assert all(c == b for c, b in zip(cases, before) if id(c) not in redrawn), name
        assert sum(c != b for c, b in zip(cases, before)) == len(redrawn), name


def test_the_host_hands_both_to_the_driver():
    import dataclasses

    from gpu_impl.engines.vllm.host import scenario_to_vllm
    from gpu_impl.engines.vllm.strategies import vllm_diffkv_case, vllm_layers_case
    from gpu_impl.scenario import Scenario, Step

    def wire(case):
        return scenario_to_vllm(Scenario(server=case.server, model=case.model, guard=None, seed=case.seed,
                                         steps=[Step(**s) for s in case.steps], options=dict(case.options)))

    layers, diffkv = vllm_layers_case(random.Random(1)), vllm_diffkv_case(random.Random(1))
    assert wire(layers)["layer_kv_heads"] == layers.options["vllm"]["layer_kv_heads"]
    assert (wire(diffkv)["head_dim"], wire(diffkv)["head_dim_v"]) == (192, 128)
    assert "head_dim_v" not in wire(dataclasses.replace(diffkv, model=layers.model))


def test_step_labels_and_paths_name_both():
    from gpu_impl.engines.vllm.paths import release_paths, step_labels
    from gpu_impl.engines.vllm.scenario import check_scenario

    s = check_scenario({**HETERO, "head_dim": 192, "head_dim_v": 128})
    assert step_labels(s, [1], [5], None, "v1") == ["eager", "K/V head sizes differ", "layers differ from the config"]
    assert release_paths("0.13.0")["K/V head sizes differ"].startswith("not in this release")
    assert release_paths("0.14.0")["K/V head sizes differ"] is None
    assert release_paths("0.28.0")["layers differ from the config"] is None
    assert "kv_cache_utils.py:963" in release_paths("0.9.2")["layers differ from the config"]
    assert "kv_cache_utils.py:1118" in release_paths("0.10.1")["layers differ from the config"]
    assert release_paths("0.11.0")["layers differ from the config"] is None
    assert release_paths("0.34.0")["layers differ from the config"] is None  # the V2 runner's attention groups


# ---------------------------------------------------------------- engine


@pytest.fixture(scope="module")
def worker_0_28_0():
    yield from vllm_worker("0.28.0")


@pytest.mark.engine
def test_0_28_0_precomputes_with_the_model_configs_heads_and_overflows(worker_0_28_0):
    resp = worker_0_28_0.run(dict(HETERO))
    pairs = [e for e in resp["trace"] if "s_c" in e]
    # vLLM's own ModelConfig.get_num_kv_heads on the Nemotron-NAS config: the first block's 1 KV head, both groups
    assert [p["precompute"]["num_heads_k"] for p in pairs] == [1, 1]
    assert [p["call"]["num_heads_k"] for p in pairs] == [1, 8]
    assert [(p["s_p"], p["s_c"]) for p in pairs] == [(109, 109), (109, 15)]
    assert {f["invariant"] for f in resp["findings"]} == SPLIT_FINDINGS
    assert "layers differ from the config" in pairs[1]["reached"]


@pytest.mark.engine
def test_0_33_0_precomputes_each_groups_own_heads_and_passes(engine_sut):
    _needs("0.33.0")
    resp = engine_sut("vllm==0.33.0").worker.run(dict(HETERO))  # the test process's shared worker (engine_pool.py)
    pairs = [e for e in resp["trace"] if "s_c" in e]
    assert [p["precompute"]["num_heads_k"] for p in pairs] == [1, 8] and not resp["findings"]
    assert resp["kv_cache_grouping"] == "vllm.v1.core.kv_cache_planning.get_kv_cache_groups"


@pytest.mark.engine
def test_0_33_0_diffkv_precompute_without_headdim_v_overflows_from_block_size_128(tmp_path, engine_sut):
    """0.33.0's builder precomputes without ``headdim_v`` (FA3's wrapper then takes V = K = 192). With blocks of 16
    the paged KV cache is read without TMA for both V sizes (kBlockN 96 either way): the split counts agree and only
    the input mismatch is found. With blocks of 128 the call (V 128) reads it through TMA with kBlockN 128 while the
    precompute (V 192) keeps 96: S_p 10 vs S_c 7, SPLIT_BOUND. A copy passing V's size
    (release_copies.ALIGNED_DIFFKV_HEADDIM_V) has no finding, and the corpus case found by ``vllm-diffkv`` passes on it."""
    _needs("0.33.0")
    from fa3verify.commands.replay import replay
    from gpu_impl.engines.vllm.host import VllmSUT
    from gpu_impl.sut import parse_engine
    from release_copies import ALIGNED_DIFFKV_HEADDIM_V, vllm_patched_copy

    def run(worker, block):
        resp = worker.run({**DIFFKV, "block_size": block})
        return ([(p["precompute"]["headdim_v"], p["call"]["headdim_v"], p["s_p"], p["s_c"])
                 for p in resp["trace"] if "s_c" in p], {f["invariant"] for f in resp["findings"]})

    w = engine_sut("vllm==0.33.0").worker  # the test process's shared worker (engine_pool.py)
    assert run(w, 16) == ([(192, 128, 10, 10)], {"SHARED_PRECOMPUTE_MATCHES_LAYER"})
    assert run(w, 128) == ([(192, 128, 10, 7)], {"SHARED_PRECOMPUTE_MATCHES_LAYER", "SPLIT_BOUND"})
    aligned = vllm_patched_copy("0.33.0", tmp_path / "aligned", ALIGNED_DIFFKV_HEADDIM_V)
    with VllmSUT(spec=parse_engine(f"vllm-src={aligned}"), progress=lambda m: None) as sut:
        sut.launch()
        sut.start()
        assert run(sut.worker, 128) == ([(128, 128, 7, 7)], set())
        _, seen = replay(str(DIFFKV_CASE), sut=sut)  # STILL FAILS on the release: test_vllm_finding_cases.py
        assert seen.verdict == "PASSES NOW" and not seen.findings


@pytest.mark.engine
def test_0_9_2_refuses_the_model_in_its_own_kv_cache_config():
    _needs("0.9.2")
    from gpu_impl.engines.vllm.host import VllmWorker
    from gpu_impl.sut import ScenarioUnsupported

    w = VllmWorker("0.9.2", progress=lambda m: None)
    try:
        with pytest.raises(ScenarioUnsupported, match=r"NotImplementedError .*kv_cache_utils\.py:963"):
            w.run(dict(HETERO))
    finally:
        w.close()


@pytest.mark.engine
def test_the_corpus_case_still_fails_on_0_28_0_and_passes_on_0_29_0(worker_0_28_0):
    _needs("0.29.0")
    from fa3verify.commands.replay import replay
    from gpu_impl.engines.vllm.host import VllmSUT

    for release, verdict in (("0.28.0", "STILL FAILS"), ("0.29.0", "PASSES NOW")):
        with VllmSUT(release, progress=lambda m: None) as sut:
            _, seen = replay(str(CASE), sut=sut)
        assert seen.verdict == verdict, (release, seen.verdict)
        if release == "0.28.0":
            assert "SPLIT_BOUND" in seen.invariants


def _layers_campaign(sut, seed: int, budget_s):
    """(first failure's invariant or None, cases) of a ``vllm-layers`` campaign on ``sut`` (as the gate's fuzz
    stage runs one: vLLM's validation decides each drawn case, stop at the first failure)."""
    from fa3verify.commands.fuzz import run_campaign
    from fa3verify.policy import load_policy
    from gpu_impl.domain import ConfigDomain
    from gpu_impl.kernels import load

    sut.domain()  # the release's own domain first: its cache of vLLM's validation verdicts
    domain = ConfigDomain(str(sut.spec), family="vllm-layers", check=sut.check_case)
    camp = run_campaign(load_policy(), load("emulated", mode="strict"), seed=seed, budget_s=budget_s, sut=sut,
                        domain=domain, stop_at_first_failure=True)
    first = min(camp.failures.values(), key=lambda f: f.found_at_s, default=None)
    return (None if first is None else first.invariant), camp.cases


@pytest.mark.engine
def test_negative_control_a_0_33_0_copy_reading_the_model_configs_heads_is_found_on_five_seeds(tmp_path, engine_sut):
    _needs("0.33.0")
    from fa3verify.commands.gate import gate
    from gpu_impl.engines.vllm.host import VllmSUT
    from gpu_impl.sut import parse_engine
    from release_copies import MODEL_CONFIG_KV_HEADS_0_33_0, vllm_patched_copy

    budget = inspect.signature(gate).parameters["budget_s"].default  # the gate's default fuzz budget
    seeded = vllm_patched_copy("0.33.0", tmp_path / "seeded", MODEL_CONFIG_KV_HEADS_0_33_0)
    with VllmSUT(spec=parse_engine(f"vllm-src={seeded}"), progress=lambda line: None) as sut:
        sut.launch()
        sut.start()
        found = {seed: _layers_campaign(sut, seed, budget) for seed in range(5)}
    assert all(f[0] in SPLIT_FINDINGS for f in found.values()), found
    clean = engine_sut("vllm==0.33.0")  # the release on the test process's shared worker (engine_pool.py)
    try:
        clean.start()
        invariant, cases = _layers_campaign(clean, 0, budget)
    finally:
        clean.close()
    assert invariant is None and cases > 5, (invariant, cases)
