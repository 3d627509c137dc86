"""The V2 model runners of vLLM 0.12.0 .. 0.17.1, beside their V1 runner (a case's ``vllm.runner`` = "v2"): 0.17.1
through driver generation v2early (gpu_impl/engines/vllm/driver_v2_early.py: ``CudaGraphManager
.get_cudagraph_runtime_mode``, graphs keyed by token count, ``DefaultModelState.prepare_attn`` without a CUDA-graph
mode) and 0.16.0 through v2first (gpu_impl/engines/vllm/driver_v2_first.py: FULL graphs only, the metadata built by the
runner through ``build_attn_metadata``), each in front of the release's FlashAttention builder and impl.

The unit tests need nothing; those marked ``engine`` run in the cached vllm 0.17.1 / 0.16.0 environments and skip,
naming how to build them, without one. One worker per release for the module (vLLM's import is paid once)."""

import json
from pathlib import Path

import pytest

from engine_releases import vllm_worker
from gpu_impl.engines.vllm import recipes as vllm_recipes

RELEASE = "0.17.1"
SKEWED = [32768] + [100] * 7
CASE = Path(__file__).parent.parent / "corpus_vllm" / "v2-runner-full-graph-replay-fewer-requests-than-captured-0.17.1.json"
#: where a seeded regression of the V2 runner alone goes (the FlashAttention backend is shared with the V1 runner)
V2_MODEL_STATE = Path("v1") / "worker" / "gpu" / "model_states" / "default.py"
#: 0.17.1 with one path regressed: the V2 runner's model state hands the layers metadata whose split bound is half the
#: one its precompute was given (16 vs 32 where the builder bounds the splits for CUDA graphs); the V1 runner, the
#: builder and every call site are the release's own.
V2_CALL_HALF_SPLITS_0_17_1 = (
    (r"\n(        )return attn_metadata\n",
     r"\n\1for md in attn_metadata.values():\n\1    if md.max_num_splits > 1:\n\1        md.max_num_splits //= 2\n"
     r"\1return attn_metadata\n"),
)


def test_releases_pick_the_early_v2_generation_as_data():
    table = json.loads(vllm_recipes.RELEASES_FILE.read_text())["v2_runner"]
    assert vllm_recipes.v2_runner_generation("0.17.1") == "v2early"
    assert vllm_recipes.v2_runner_generation("0.17.0") == "v2early"
    assert vllm_recipes.v2_runner_generation("0.18.0") == "v2"
    assert set(vllm_recipes.V2_RUNNER_CONFIGS) <= set(vllm_recipes.GENERATION_MODULES)
    early = table["generation"]["v2early"]
    assert early and set(early) <= set(table["driven"]) and not set(early) & set(table["not_driven"])
    # what tells the two APIs apart: the early one's module-level functions, the later one's descriptor
    assert "get_cudagraph_sizes" in vllm_recipes.GENERATION_MODULES["v2early"]["vllm.v1.worker.gpu.cudagraph_utils"]
    assert "BatchExecutionDescriptor" in vllm_recipes.GENERATION_MODULES["v2"]["vllm.v1.worker.gpu.cudagraph_utils"]


@pytest.fixture(scope="module")
def worker():
    yield from vllm_worker(RELEASE)


def _pairs(resp, path=None):
    return [e for e in resp["trace"] if "s_c" in e and (path is None or e["path"] == path)]


def _v2(worker, **scenario):
    return worker.run({"tp": 4, "runner": "v2", **scenario})


@pytest.mark.engine
def test_each_mode_dispatches_as_the_release_runner_does_and_both_sides_agree(worker):
    """Eager and piecewise: FA3's heuristic on both sides; FULL: a graph captured for the batch's padded token count
    (8 requests, one query token each) and replayed with the split bound 32 on both sides; above the largest captured
    size: eager (``get_cudagraph_runtime_mode`` answers no size); FULL_AND_PIECEWISE: a decode graph captured with
    one-token requests, a mixed batch piecewise."""
    assert worker.hello["driver"] == "v1"  # the release's own generation; the V2 runner is a case's choice
    assert any(line.startswith("the V2 runner (driver generation v2early): the graphs CudaGraphManager.capture")
               for line in worker.hello["stood_in"])  # what the V2 runner's generation stands in for, listed
    assert [(p["path"], p["s_p"], p["s_c"]) for p in _pairs(_v2(worker, steps=[{"seq_lens": SKEWED}]))] == [
        ("none", 109, 109)]
    piecewise = _v2(worker, cuda_graph="piecewise", steps=[{"seq_lens": [5000, 300], "query_lens": [1, 30]}])
    assert [(p["path"], p["graph"]["num_tokens"]) for p in _pairs(piecewise)] == [("piecewise", 32)]
    full = _v2(worker, cuda_graph="full", steps=[{"seq_lens": SKEWED}])
    assert [(p["path"], p["s_p"], p["s_c"], p["graph"]["num_reqs"]) for p in _pairs(full)] == [
        ("full: capture", 32, 32, 8), ("full", 32, 32, 8)]
    above = _v2(worker, cuda_graph="full", capture_sizes=[1, 2, 4], steps=[{"seq_lens": SKEWED}])
    assert [(p["path"], p["s_p"], p["s_c"]) for p in _pairs(above)] == [("none: above the captured graphs", 109, 109)]
    fp = _v2(worker, cuda_graph="full_and_piecewise", steps=[{"seq_lens": SKEWED},
                                                             {"seq_lens": [5000, 300], "query_lens": [1, 30]}])
    assert [(p["path"], p["graph"]["uniform_token_count"]) for p in _pairs(fp)] == [
        ("full: capture", 1), ("full", 1), ("piecewise", None)]
    for resp in (piecewise, full, above, fp):
        assert resp["findings"] == [] and resp["shape_errors"] == []


@pytest.mark.engine
def test_a_full_graph_replay_of_fewer_requests_than_captured_is_a_finding(worker):
    """0.17's runner builds a replay's metadata over the real requests (``prepare_attn``: ``input_batch.num_reqs``)
    while the graph was captured for the padded count: 6 decodes replay the graph of 8, and the captured kernel reads
    the metadata in the layout of 8 rows. With 8 requests (the captured count) the same replay agrees."""
    six = _v2(worker, cuda_graph="full_and_piecewise", steps=[{"seq_lens": [900] * 6}])
    (replayed,) = _pairs(six, "full")
    assert replayed["graph"]["num_reqs"] == 8
    found = {f["invariant"] for f in six["findings"] if f["detail"]["path"] == "full"}
    assert found & {"SHAPE", "BATCH_PERMUTATION"}, six["findings"]
    eight = _v2(worker, cuda_graph="full_and_piecewise", steps=[{"seq_lens": [900] * 8}])
    assert eight["findings"] == [] and [p["path"] for p in _pairs(eight)] == ["full: capture", "full"]


@pytest.mark.engine
def test_the_finding_case_file_replays_still_failing(worker):
    from fa3verify.commands.replay import replay
    from gpu_impl.engines.vllm.host import VllmSUT

    sut = VllmSUT(RELEASE)
    sut._worker = worker  # the module's worker: no second import
    summary, seen = replay(str(CASE), sut=sut)
    assert summary.exit_code == 1 and seen.outcome == "violation"
    assert "SHAPE" in {f.invariant for f in seen.findings}


def _found_on_the_v2_runner_only(tmp_path, release: str, patches, module) -> None:
    """A copy of ``release`` with ``patches`` in the V2 runner's ``module``, judged (as any checkout) under the FA3
    build of the release it runs beside: its V2 runner's FULL graph of the skewed batch is SPLIT_BOUND, S_p 32 vs the
    call's 16; the same scenario on the copy's V1 runner passes (the regression is on one path)."""
    from release_copies import vllm_patched_copy

    from gpu_impl.engines.vllm.host import VllmSUT
    from gpu_impl.sut import parse_engine

    root = vllm_patched_copy(release, tmp_path / "seeded", patches, module=module)
    with VllmSUT(spec=parse_engine(f"vllm-src={root}"), progress=lambda line: None) as sut:
        seeded = sut.worker.run({"tp": 4, "runner": "v2", "cuda_graph": "full", "steps": [{"seq_lens": SKEWED}]})
        v1 = sut.worker.run({"tp": 4, "cuda_graph": "full", "steps": [{"seq_lens": SKEWED}]})
    assert ("SPLIT_BOUND", 32, 16) in {(f["invariant"], f["detail"]["s_p"], f["detail"]["s_c"])
                                       for f in seeded["findings"]}
    assert v1["findings"] == []


@pytest.mark.engine
def test_a_copy_whose_v2_runner_halves_the_call_split_bound_is_found(worker, tmp_path):
    """Negative control (:data:`V2_CALL_HALF_SPLITS_0_17_1`, seeded in the V2 runner's model state only): a FULL
    graph of 8 requests, which the release replays with both sides at 32 (above), is found: SPLIT_BOUND, S_p 32 vs the
    call's 16; the same scenario on the V1 runner of the copy passes (the regression is on one path)."""
    _found_on_the_v2_runner_only(tmp_path, RELEASE, V2_CALL_HALF_SPLITS_0_17_1, V2_MODEL_STATE)



def _seeded_v2_split_findings(root, seeds=range(5)) -> dict:
    """seed -> the SPLIT_BOUND / COMBINE_CAPACITY signatures found on V2-runner cases by the gate's fuzz campaign
    (its domain, its default budget; the release's own failures do not stop it) on the copy at ``root``."""
    import inspect

    from fa3verify.commands.fuzz import run_campaign
    from fa3verify.commands.gate import gate
    from fa3verify.policy import load_policy
    from gpu_impl.engines.vllm.host import VllmSUT
    from gpu_impl.kernels import load
    from gpu_impl.sut import parse_engine

    budget = inspect.signature(gate).parameters["budget_s"].default
    found = {}
    with VllmSUT(spec=parse_engine(f"vllm-src={root}"), progress=lambda line: None) as sut:
        sut.launch()
        sut.start()  # as the gate starts it: the import and the warm-up are not part of the fuzz budget
        for seed in seeds:
            domain = sut.domain()
            domain.reset_counts()
            camp = run_campaign(load_policy(), load("emulated", mode="strict"), seed=seed, budget_s=budget, sut=sut,
                                domain=domain)
            found[seed] = sorted(f.signature for f in camp.failures.values()
                                 if f.invariant in ("SPLIT_BOUND", "COMBINE_CAPACITY")
                                 and (f.case.options.get("vllm") or {}).get("runner") == "v2")
    return found


@pytest.mark.slow
@pytest.mark.engine
def test_the_seeded_v2_runner_regression_is_found_within_the_gate_budget_on_five_seeds(worker, tmp_path):
    """The copy of :func:`test_a_copy_whose_v2_runner_halves_the_call_split_bound_is_found` (which pins the same
    detection on one scenario, fast) under the gate's fuzz campaign: a split finding on a V2-runner case on every one of
    5 seeds within the default budget (the release's own findings, finding 14 among them, are found beside it)."""
    from release_copies import vllm_patched_copy

    root = vllm_patched_copy(RELEASE, tmp_path / "seeded", V2_CALL_HALF_SPLITS_0_17_1, module=V2_MODEL_STATE)
    found = _seeded_v2_split_findings(root)
    assert all(found.values()), found

# ---------------------------------------------------------------------------------------------------------------------
# 0.16.0 through driver generation v2first (gpu_impl/engines/vllm/driver_v2_first.py): FULL graphs only, the metadata
# built by the runner through attn_utils.build_attn_metadata

FIRST = "0.16.0"
#: where 0.12.0 .. 0.16.0's V2 runner builds its metadata (a module of the V2 runner alone)
V2_ATTN_UTILS = Path("v1") / "worker" / "gpu" / "attn_utils.py"
#: 0.16.0 with one path regressed: the V2 runner's build_attn_metadata hands the layers metadata whose split bound is
#: half the one its precompute was given; the V1 runner, the builder and the call sites are the release's own.
V2_CALL_HALF_SPLITS_0_16_0 = (
    (r"\n(        )for layer_name in kv_cache_spec\.layer_names:\n",
     r"\n\1if metadata.max_num_splits > 1:\n\1    metadata.max_num_splits //= 2\n"
     r"\1for layer_name in kv_cache_spec.layer_names:\n"),
)


def test_releases_before_0_17_pick_the_first_v2_generation_as_data():
    assert {vllm_recipes.v2_runner_generation(r) for r in ("0.12.0", "0.14.1", "0.16.0")} == {"v2first"}
    assert "get_cudagraph_size" in vllm_recipes.GENERATION_MODULES["v2first"]["vllm.v1.worker.gpu.cudagraph_utils"]
    assert vllm_recipes.v2_runner_generation("0.35.0") == "v2"  # a release the table does not list: generation v2
    names = {g: vllm_recipes.v2_runner_config(g).__name__ for g in vllm_recipes.V2_RUNNER_CONFIGS}
    assert names == {"v2": "ConfigV2", "v2early": "ConfigV2Early", "v2first": "ConfigV2First"}


@pytest.fixture(scope="module")
def first_worker():
    yield from vllm_worker(FIRST)


@pytest.mark.engine
def test_the_first_v2_runner_replays_full_graphs_and_runs_the_rest_eagerly(first_worker):
    """FULL: a graph per padded token count, both sides 32; FULL_AND_PIECEWISE: a mixed batch runs eagerly (no
    piecewise graphs in this runner, and 0.16.0 keeps mixed batches out of its FULL graphs) with the builder's CUDA-graph
    bound on both sides; piecewise: refused, naming why; a FULL replay over fewer requests than captured is judged
    harmless under the build 0.16.0 ships (no finding)."""
    assert any(line.startswith("the V2 runner (driver generation v2first): ") for line in first_worker.hello["stood_in"])
    full = first_worker.run({"tp": 4, "runner": "v2", "cuda_graph": "full", "steps": [{"seq_lens": SKEWED}]})
    assert [(p["path"], p["s_p"], p["s_c"]) for p in _pairs(full)] == [("full: capture", 32, 32), ("full", 32, 32)]
    mixed = first_worker.run({"tp": 4, "runner": "v2", "cuda_graph": "full_and_piecewise",
                              "steps": [{"seq_lens": [5000, 300], "query_lens": [1, 30]}]})
    assert [(p["path"], p["s_p"], p["s_c"]) for p in _pairs(mixed)] == [("none", 32, 32)]
    six = first_worker.run({"tp": 4, "runner": "v2", "cuda_graph": "full", "steps": [{"seq_lens": [900] * 6}]})
    assert [p["graph"]["num_reqs"] for p in _pairs(six, "full")] == [8]
    for resp in (full, mixed, six):
        assert resp["findings"] == [] and resp["shape_errors"] == []
    with pytest.raises(ValueError, match="no piecewise CUDA graphs"):
        first_worker.run({"tp": 4, "runner": "v2", "cuda_graph": "piecewise", "steps": [{"seq_lens": SKEWED}]})


@pytest.mark.engine
def test_a_0_16_0_copy_whose_v2_runner_halves_the_call_split_bound_is_found(first_worker, tmp_path):
    """Negative control (:data:`V2_CALL_HALF_SPLITS_0_16_0`, seeded in the V2 runner's build_attn_metadata only): the
    FULL graph scenario the release passes (above) is found, SPLIT_BOUND 32 vs 16; the copy's V1 runner passes it."""
    _found_on_the_v2_runner_only(tmp_path, FIRST, V2_CALL_HALF_SPLITS_0_16_0, V2_ATTN_UTILS)


@pytest.mark.slow
@pytest.mark.engine
def test_the_seeded_0_16_0_v2_runner_regression_is_found_within_the_gate_budget_on_five_seeds(first_worker, tmp_path):
    """:data:`V2_CALL_HALF_SPLITS_0_16_0` under the gate's fuzz campaign: a split finding on a V2-runner case on each of
    5 seeds within the default budget (the one-scenario test above pins the same detection, fast)."""
    from release_copies import vllm_patched_copy

    root = vllm_patched_copy(FIRST, tmp_path / "seeded", V2_CALL_HALF_SPLITS_0_16_0, module=V2_ATTN_UTILS)
    found = _seeded_v2_split_findings(root)
    assert all(found.values()), found
