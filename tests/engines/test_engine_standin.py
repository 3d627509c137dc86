"""sglang 0.5.11 and 0.5.12 (before the attention test kit) driven through our kit stand-in
(``gpu_impl/engines/sglang/standin.py``): their real ``FlashAttentionBackend`` runs eager decode and CUDA-graph
capture/replay, and reproduces docs/facts-engines.md section 1 -- 0.5.11 has no guard (prefill CP and DP attention both
overflow), 0.5.12's guard disables the precompute under DP attention only.

Marked ``engine``; each test skips unless that release is selected (tests/engine_releases.py: the Makefile's
ENGINE_RELEASES, or FA3VERIFY_ALL_RELEASES=1) and its environment exists (CI builds only 0.5.13 and 0.5.23:
``fa3verify engine setup sglang==0.5.11`` / ``==0.5.12`` builds them).
"""

from __future__ import annotations

import pytest

from engine_releases import need_sglang
from gpu_impl.config import ServerConfig, get_model
from gpu_impl.scenario import Scenario, Step

pytestmark = pytest.mark.engine

QWEN = get_model("qwen3-30b-a3b")
SKEWED = [32768] + [100] * 7
PREFILL_CP = dict(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag", context_length=40960)
DP_ATTENTION = dict(tp_size=4, dp_size=2, enable_dp_attention=True, context_length=40960)


def _scenario(server: ServerConfig, *batches) -> Scenario:
    return Scenario(server=server, model=QWEN, guard=None, steps=[Step("decode", list(b)) for b in batches])


def _open(release: str):
    from gpu_impl.sut import open_sut

    need_sglang(release)
    sut = open_sut(f"sglang=={release}")
    hello = sut.start()
    assert hello["kit"] == "stand-in" and hello["version"] == release
    return sut


@pytest.fixture(scope="module", params=["0.5.11", "0.5.12"])
def pre_kit(request):
    sut = _open(request.param)
    yield request.param, sut
    sut.close()


def test_the_worked_example_fails_under_prefill_cp(pre_kit):
    _, sut = pre_kit
    result = sut.run(_scenario(ServerConfig(**PREFILL_CP), SKEWED))
    bound = [f for f in result.findings if f.invariant == "SPLIT_BOUND"]
    assert bound, result.findings
    d = bound[0].detail
    assert (d["s_p"], d["s_c"], d["path"], d["split_counts"][0]) == (109, 29, "eager", 86)
    (entry,) = result.trace
    assert (entry["precompute"]["num_heads"], entry["precompute"]["num_heads_k"]) == (8, 1)
    assert (entry["call"]["num_heads"], entry["call"]["num_heads_k"]) == (32, 4)


def test_cuda_graph_capture_then_replays_with_the_host_lengths(pre_kit):
    _, sut = pre_kit
    result = sut.run(_scenario(ServerConfig(**PREFILL_CP, cuda_graph=True), SKEWED, [300, 200, 100]))
    assert [(e["step"], e["path"]) for e in result.trace] == [(0, "capture"), (0, "replay"), (1, "capture"),
                                                              (1, "replay")]
    cap, rep = result.trace[0], result.trace[1]
    # 0.5.11 / 0.5.12 replay with the runner's CPU lengths: max_seqlen_k is the longest replayed row
    assert cap["precompute"]["max_seqlen_k"] == 1 and rep["precompute"]["max_seqlen_k"] == 32768
    assert rep["call"]["seqlen_k"] == 40960
    assert {(f.invariant, f.detail["path"]) for f in result.findings} >= {("SPLIT_BOUND", "replay")}
    assert all(f.step == 0 for f in result.findings)


def test_dp_attention_overflows_without_a_guard_and_passes_with_0_5_12s(pre_kit):
    release, sut = pre_kit
    result = sut.run(_scenario(ServerConfig(**DP_ATTENTION), SKEWED))
    if release == "0.5.11":  # no guard: the DP rank holding the long row precomputes with H // tp_size heads
        assert "SPLIT_BOUND" in {f.invariant for f in result.findings}
        assert {e["precomputed"] for e in result.trace} == {True}
    else:  # getattr(server_args, "enable_dp_attention") disables the precompute
        assert result.ok and {e["precomputed"] for e in result.trace} == {False}


def test_tensor_parallel_only_is_safe(pre_kit):
    _, sut = pre_kit
    result = sut.run(_scenario(ServerConfig(tp_size=2, context_length=8192), [100, 200, 300, 400]))
    assert result.ok and [e["precomputed"] for e in result.trace] == [True]
    assert result.trace[0]["precompute"]["num_heads"] == result.trace[0]["call"]["num_heads"] == 16
