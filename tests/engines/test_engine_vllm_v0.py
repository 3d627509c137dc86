"""vLLM 0.8.5 .. 0.10.0 through the driver generation v0 (gpu_impl/engines/vllm/driver_v0.py): the release's own
FlashAttention metadata builder, bound to a model-runner stand-in, and its own impl.

Marked ``engine``: they run in the cached environments of vllm 0.8.5 and 0.8.5.post1 (``fa3verify engine setup
vllm==0.8.5``) and skip, naming how to build them, without one. The finding: 0.8.5's precompute passes no sliding
window (``FlashAttentionMetadataBuilder.build``'s ``schedule``), while the windowed layer's call passes its window,
so the metadata's split counts exceed the call's (qwen3-235b-a22b at tp 4: 16 and 1 heads, one 4353-token
sequence: S_p 30 against S_c 29); 0.8.5.post1 passes the layers' one window to the precompute (its
``aot_sliding_window``): the same scenario passes there, which is the control."""

import pytest

from engine_releases import vllm_worker

SKEWED = [32768] + [100] * 7
WINDOWED = {"num_heads": 64, "num_kv_heads": 4, "tp": 4, "sliding_window": 4096, "cuda_graph": "piecewise",
            "steps": [{"seq_lens": [4353]}]}


@pytest.fixture(scope="module")
def worker_085():
    yield from vllm_worker("0.8.5")


@pytest.fixture(scope="module")
def worker_085_post1():
    yield from vllm_worker("0.8.5.post1")


def _pairs(resp):
    return [e for e in resp["trace"] if "s_c" in e]


@pytest.mark.engine
def test_generation_v0_drives_the_runner_bound_builder_on_the_worked_example(worker_085):
    hello = worker_085.hello
    assert hello["driver"] == "v0" and hello["release"] == "0.8.5"
    assert any("model runner object" in line for line in hello["stood_in"])
    for mode in ("none", "piecewise"):
        resp = worker_085.run({"tp": 4, "cuda_graph": mode, "steps": [{"seq_lens": SKEWED}]})
        (pair,) = _pairs(resp)
        assert (pair["s_p"], pair["s_c"], pair["path"]) == (109, 109, mode)
        assert resp["findings"] == [] and resp["shape_errors"] == []


@pytest.mark.engine
def test_a_mode_the_release_lacks_is_refused_with_the_reason(worker_085):
    from gpu_impl.engines.errors import ScenarioUnsupported

    with pytest.raises(ScenarioUnsupported, match="no full CUDA graph"):
        worker_085.run({"tp": 4, "cuda_graph": "full", "steps": [{"seq_lens": SKEWED}]})
    assert worker_085.validate({"num_heads": 32, "num_kv_heads": 4, "tp": 4, "dcp": 2})["accepted"] is False


@pytest.mark.engine
def test_0_8_5_precomputes_without_the_layers_window_and_overflows_the_split_buffers(worker_085):
    resp = worker_085.run(WINDOWED)
    found = {f["invariant"] for f in resp["findings"]}
    assert {"SPLIT_BOUND", "SHARED_PRECOMPUTE_MATCHES_LAYER"} <= found, found
    (pair,) = _pairs(resp)
    assert (pair["s_p"], pair["s_c"]) == (30, 29)


@pytest.mark.engine
def test_control_0_8_5_post1_passes_the_window_to_the_precompute(worker_085_post1):
    resp = worker_085_post1.run(WINDOWED)
    assert resp["findings"] == [] and resp["shape_errors"] == []
    (pair,) = _pairs(resp)
    assert pair["s_p"] == pair["s_c"] == 29
