"""An older vLLM release through the first driver generation: vLLM 0.25.1, whose backend lays the KV cache out with a
separate K/V dimension (``get_kv_cache_shape``), whose V1 runner computes the blocks per request inline, whose
``MultiGroupBlockTable`` aligns the block-table width, and whose builder takes the precompute's heads from the model
config. The engine tests run in the cached vllm 0.25.1 environment (``fa3verify engine setup vllm==0.25.1``) and skip,
naming the command, without one (``make test`` does not build it). Numbers: the worked example of docs/facts-fa3.md
section 1 (tp 4: 8 and 1 heads per rank; one 32768-token sequence and seven of 100)."""

import pytest

from engine_releases import vllm_worker

RELEASE = "0.25.1"
SKEWED = [32768] + [100] * 7


@pytest.fixture(scope="module")
def worker():
    yield from vllm_worker(RELEASE)


def _pairs(resp):
    return [e for e in resp["trace"] if "s_c" in e]


def _replayed(resp):
    """The one replayed pair of a one-step FULL-graph run: the V1 driver captures the graph (one capture-time pair, the
    capture's dummy batch) and replays it for the step (graphs.V1Graphs)."""
    pairs = _pairs(resp)
    assert [p["path"] for p in pairs] == ["full: capture", "full"], [p["path"] for p in pairs]
    return pairs[1]


@pytest.mark.engine
def test_the_release_runs_under_the_first_generation_on_its_own_layout(worker):
    assert worker.hello["release"] == RELEASE and worker.hello["driver"] == "v1"
    eager = worker.run({"tp": 4, "steps": [{"seq_lens": SKEWED}]})
    (pair,) = _pairs(eager)
    assert (pair["s_p"], pair["s_c"], pair["max_num_splits"]) == (109, 109, 0) and not eager["findings"]
    full = worker.run({"tp": 4, "cuda_graph": "full", "steps": [{"seq_lens": [32768, 100, 100]}]})
    pair = _replayed(full)
    assert (pair["s_p"], pair["s_c"], pair["max_num_splits"]) == (32, 32, 32) and not full["findings"]


@pytest.mark.engine
def test_numerics_are_refused_on_the_separate_kv_layout(worker):
    with pytest.raises(Exception, match="get_kv_cache_shape"):
        worker.run({"tp": 4, "steps": [{"seq_lens": [100]}]}, numerics=True)


@pytest.mark.engine
def test_a_seeded_split_count_difference_is_caught_on_the_older_release(worker):
    """Negative control: the precompute asked for FA3's heuristic while the full-graph call keeps 32 splits."""
    resp = worker.run({"tp": 4, "cuda_graph": "full", "defect": {"precompute_num_splits": 0},
                       "steps": [{"seq_lens": [32768, 100, 100]}]})
    assert {f["invariant"] for f in resp["findings"]} >= {"SPLIT_BOUND"}
