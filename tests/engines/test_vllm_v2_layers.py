"""Chunked local layers and layers with their own KV heads on the V2 model runner (driver generation v2): the
release's own ``init_attn_backend`` (``vllm/v1/worker/gpu/attn_utils.py``) makes the attention groups, each with its
own metadata builder (gpu_impl/engines/vllm/heterolayers.py ``runner_attention_groups``), and over chunked local
layers the release resolves the CUDA-graph mode (gpu_impl/engines/vllm/local.py ``runner_v2_mode``).

- No engine: the paths table drives both on generation v2 and names why FULL graphs over chunked local layers are not
  driven where the V2 runner does not resolve the mode; the families put both on the V2 runner.
- Engine (each needs its release's cached environment and skips, naming the setup command, without one): on 0.34.0
  the chunked layers precompute over the release's virtual batches (the same numbers as the first generation's),
  FULL is refused with vLLM's own text, FULL_AND_PIECEWISE runs PIECEWISE as vLLM resolves it; layers that differ pass
  eager and under FULL graphs, each group's captured and replayed call with its own KV heads; on 0.28.0 the V2 runner
  reaches the layers finding (SPLIT_BOUND eager; SHARED_PRECOMPUTE_MATCHES_LAYER under FULL graphs) and its case
  replays STILL FAILS there and PASSES NOW on 0.29.0; 0.18.0's V2 runner (no mode resolution) is refused naming why.
- Negative controls: copies of 0.34.0 (replay aligned: release_copies.ALIGNED_REPLAY_0_34_0) with the local builder's
  precompute over the un-virtualised batch (LOCAL_UNVIRTUALISED_PRECOMPUTE) and with the builder's KV heads from the
  model config (MODEL_CONFIG_KV_HEADS_0_33_0, the same line in 0.34.0) are caught on one step, and (slow) within the
  gate's default fuzz budget on 5 seeds of 5 (family vllm-v2, the gate's).
"""

from __future__ import annotations

import inspect
import random
from pathlib import Path

import pytest

from engine_releases import need_vllm, vllm_worker

#: Llama 4 Scout's attention at tp 8 (as tests/engines/test_vllm_local_attention.py): three chunked local layers and a
#: global one; one long decode and a chunked prefill
LOCAL = {"num_heads": 40, "num_kv_heads": 8, "head_dim": 128, "tp": 8, "num_layers": 4,
         "attention_chunk_size": [1024, 1024, 1024, None]}
DECODE = {"seq_lens": [32768]}
PREFILL = {"seq_lens": [9000, 100], "query_lens": [2000, 1]}
#: a Nemotron-NAS model: 32 query heads, layers of 1, 8 and 4 KV heads; one skewed decode step
LAYERS = {"num_heads": 32, "num_kv_heads": 1, "num_layers": 3, "layer_kv_heads": [1, 8, 4],
          "steps": [{"seq_lens": [32768] + [100] * 7}]}
CASE = Path(__file__).parent.parent / "corpus_vllm" / "v2-runner-layers-precompute-model-config-kv-heads-0.28.0.json"


def _needs(release: str) -> None:
    need_vllm(release)


def _pairs(resp):
    return [e for e in resp["trace"] if "s_c" in e]


# ---------------------------------------------------------------- paths and families (no engine)


def test_the_paths_drive_both_on_the_v2_runner_and_name_what_is_not_driven():
    from gpu_impl.engines.vllm.paths import local_not_driven, release_paths

    for release in ("0.34.0", "0.28.0", "0.18.0"):
        table = release_paths(release, "v2")
        assert table["local attention"] is None and table["layers differ from the config"] is None, release
    reason = local_not_driven("v2 full graph@no-resolve")
    assert "resolve_cudagraph_mode_and_sizes" in reason and "make_local_attention_virtual_batches" in reason
    from gpu_impl.engines.vllm.paths import not_covered_reason

    assert "one block table" in not_covered_reason("layers differ from the config@v2 drafter")


def test_the_v2_families_put_chunked_local_layers_and_layers_that_differ_on_the_v2_runner():
    from gpu_impl.engines.vllm.strategies import vllm_paths_both_case, vllm_v2_case

    v2 = [vllm_v2_case(random.Random(seed)) for seed in range(400)]
    local = [c for c in v2 if c.options["vllm"].get("attention_chunk_size")]
    assert len(local) > 5 and any(c.server.cuda_graph for c in local)
    assert all("full_and_piecewise" in c.options["vllm"] for c in local if c.server.cuda_graph)
    assert any(c.server.cuda_graph and c.options["vllm"].get("layer_kv_heads") for c in v2)
    both = [vllm_paths_both_case(random.Random(seed)) for seed in range(400)]
    on_v2 = [c.options["vllm"] for c in both if c.options["vllm"].get("runner") == "v2"]
    assert any(o.get("attention_chunk_size") for o in on_v2) and any(o.get("layer_kv_heads") for o in on_v2)


# ---------------------------------------------------------------- engine


@pytest.fixture(scope="module")
def worker(engine_sut):
    yield from vllm_worker("0.34.0", engine_sut)  # the test process's shared worker (tests/engine_pool.py)


@pytest.mark.engine
def test_chunked_layers_on_the_v2_runner_precompute_over_the_release_s_virtual_batches(worker):
    resp = worker.run({**LOCAL, "steps": [DECODE, PREFILL]})
    assert resp["findings"] == [] and resp["shape_errors"] == []
    pairs = _pairs(resp)
    assert len(pairs) == 8 and all({"local attention", "V2 runner"} <= set(e["reached"]) for e in pairs)
    assert [e["precompute"]["max_seqlen_k"] for e in pairs[:4]] == [1024, 1024, 1024, 32768]
    assert [e["precompute"]["batch_size"] for e in pairs[4:]] == [4, 4, 4, 2]
    assert all(e["call"]["batch_size"] == e["precompute"]["batch_size"] and e["s_p"] == e["s_c"] for e in pairs)


@pytest.mark.engine
def test_the_release_resolves_the_cuda_graph_mode_over_chunked_layers(worker):
    from gpu_impl.engines.errors import ScenarioUnsupported

    with pytest.raises(ScenarioUnsupported, match="CUDAGraphMode.FULL is not supported with ChunkedLocalAttention"):
        worker.run({**LOCAL, "cuda_graph": "full", "steps": [DECODE]})
    # FULL_AND_PIECEWISE: its decode graphs are FULL, which the wrapped builder (NEVER) cannot take: vLLM runs PIECEWISE
    resp = worker.run({**LOCAL, "cuda_graph": "full_and_piecewise", "steps": [DECODE]})
    pairs = _pairs(resp)
    assert resp["findings"] == [] and len(pairs) == 4
    assert all(e["path"] == "piecewise" and "piecewise" in e["reached"] for e in pairs)


@pytest.mark.engine
@pytest.mark.parametrize("graph", ["none", "full"])
def test_layers_that_differ_on_the_v2_runner_precompute_with_their_own_heads(worker, graph):
    resp = worker.run({**LAYERS, "cuda_graph": graph})
    assert resp["findings"] == [] and resp["shape_errors"] == []
    pairs = _pairs(resp)
    # eager: one call per layer; FULL: the capture's and the replay's, per layer
    assert len(pairs) == (3 if graph == "none" else 6)
    assert all("layers differ from the config" in e["reached"] for e in pairs)
    assert [(e["precompute"]["num_heads_k"], e["call"]["num_heads_k"]) for e in pairs[-3:]] == [(1, 1), (8, 8), (4, 4)]
    if graph == "full":
        assert [e["path"] for e in pairs] == ["full: capture"] * 3 + ["full"] * 3


@pytest.fixture(scope="module")
def worker_0_28_0():
    yield from vllm_worker("0.28.0")


@pytest.mark.engine
def test_the_v2_runner_of_0_28_0_reaches_the_layers_finding(worker_0_28_0):
    eager = worker_0_28_0.run({**LAYERS, "runner": "v2"})
    bound = [f for f in eager["findings"] if f["invariant"] == "SPLIT_BOUND"]
    assert bound and {(f["detail"]["s_p"], f["detail"]["s_c"]) for f in bound} == {(109, 15), (109, 29)}
    full = worker_0_28_0.run({**LAYERS, "runner": "v2", "cuda_graph": "full_and_piecewise"})
    assert {f["invariant"] for f in full["findings"]} == {"SHARED_PRECOMPUTE_MATCHES_LAYER"}
    assert all(f["detail"]["s_p"] == f["detail"]["s_c"] == 32 for f in full["findings"])


@pytest.mark.engine
def test_the_v2_runner_without_mode_resolution_is_refused_naming_why(engine_sut):
    _needs("0.18.0")
    from gpu_impl.engines.errors import ScenarioUnsupported

    worker = engine_sut("vllm==0.18.0").worker
    with pytest.raises(ScenarioUnsupported, match="no resolve_cudagraph_mode_and_sizes"):
        worker.run({**LOCAL, "runner": "v2", "cuda_graph": "full_and_piecewise", "steps": [DECODE]})
    with pytest.raises(ScenarioUnsupported, match="one block table"):  # layers that differ with the V2 drafter
        worker.run({**LAYERS, "runner": "v2", "draft_tokens": 2})
    piecewise = worker.run({**LOCAL, "runner": "v2", "cuda_graph": "piecewise", "steps": [DECODE]})
    assert piecewise["findings"] == [] and all("V2 runner" in e["reached"] for e in _pairs(piecewise))


@pytest.mark.engine
@pytest.mark.slow
def test_the_v2_layers_case_replays_still_fails_and_passes_on_the_fix_release(cli_on_engine_pool):
    """(slow: two releases' workers; the finding itself is pinned by the 0.28.0 worker test above)"""
    _needs("0.28.0")
    _needs("0.29.0")
    from fa3verify.cli import main

    assert main(["replay", str(CASE)]) == 1
    assert main(["replay", str(CASE), "--engine", "vllm==0.29.0"]) == 0


# ---------------------------------------------------------------- negative controls on copies of 0.34.0


def _copy_sut(root):
    from gpu_impl.engines.vllm.host import VllmSUT
    from gpu_impl.sut import parse_engine

    return VllmSUT(spec=parse_engine(f"vllm-src={root}"), progress=lambda line: None)


def _local_copy(dest):
    from release_copies import ALIGNED_REPLAY_0_34_0, vllm_local_regression_copy

    return vllm_local_regression_copy(dest, release="0.34.0", aligned=ALIGNED_REPLAY_0_34_0)


def _layers_copy(dest, more=None):
    from release_copies import ALIGNED_REPLAY_0_34_0, MODEL_CONFIG_KV_HEADS_0_33_0, vllm_patched_copy

    return vllm_patched_copy("0.34.0", dest, ALIGNED_REPLAY_0_34_0 + MODEL_CONFIG_KV_HEADS_0_33_0, more=more)


@pytest.mark.engine
def test_seeded_local_and_layers_regressions_on_the_v2_runner_are_caught_on_one_step(tmp_path):
    """One copy with both regressions (one worker start); each scenario reaches only its own path's."""
    _needs("0.34.0")
    from release_copies import LOCAL_UNVIRTUALISED_PRECOMPUTE, VLLM_CHUNKED_LOCAL

    root = _layers_copy(tmp_path / "both", more={VLLM_CHUNKED_LOCAL: LOCAL_UNVIRTUALISED_PRECOMPUTE})
    with _copy_sut(root) as sut:
        local = sut.worker.run({**LOCAL, "steps": [DECODE]})
        layers = sut.worker.run({**LAYERS, "cuda_graph": "full"})
    assert {"SPLIT_BOUND", "COMBINE_CAPACITY"} <= {f["invariant"] for f in local["findings"]}, local["findings"][:3]
    assert {f["invariant"] for f in layers["findings"]} == {"SHARED_PRECOMPUTE_MATCHES_LAYER"}


@pytest.mark.engine
@pytest.mark.slow
# the local regression's precompute covers the requests as scheduled, the call its virtual batches: more splits than
# the call holds (SPLIT_BOUND, COMBINE_CAPACITY), or a call over more batches than the precompute wrote metadata for,
# whose slots past the write it reads (BATCH_PERMUTATION), as the first generation's control counts it
@pytest.mark.parametrize("copy, found", [(_local_copy, ("SPLIT_BOUND", "COMBINE_CAPACITY", "BATCH_PERMUTATION")),
                                         (_layers_copy, ("SPLIT_BOUND", "COMBINE_CAPACITY",
                                                         "SHARED_PRECOMPUTE_MATCHES_LAYER"))])
def test_v2_local_and_layers_regressions_are_found_within_the_gate_budget_on_five_seeds(tmp_path, copy, found):
    """The gate's campaign on 0.34.0 (family vllm-v2) on each copy finds its regression on every seed within the
    gate's default fuzz budget (the one-step test above pins the same defects)."""
    _needs("0.34.0")
    from fa3verify.commands.gate import gate
    from engines.test_vllm_release_copies import SEEDS, _first_failure, _started_as_the_gate_starts_it

    budget = inspect.signature(gate).parameters["budget_s"].default
    with _started_as_the_gate_starts_it(_copy_sut(copy(tmp_path / "seeded"))) as sut:
        assert sut.domain().family == "vllm-v2"
        first = {seed: _first_failure(sut, seed, budget_s=budget) for seed in SEEDS}
    print(copy.__name__, first)  # per seed: (first invariant, cases run, seconds to it)
    assert all(f is not None and f[0] in found for f in first.values()), first
