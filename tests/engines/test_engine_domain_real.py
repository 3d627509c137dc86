"""The engine's own domain on real sglang 0.5.23 (marked ``engine``): the release's own validation decides what
runs, and the negative control -- a copy of 0.5.23 whose CUDA-graph replay recompute alone takes its heads from
tp_size (tests/release_copies.py) -- is found by the gate's fuzz stage within its default budget, while the
release itself passes the same draw."""

from __future__ import annotations

import pytest

from gpu_impl.config import MODELS, ServerConfig
from gpu_impl.scenario import Scenario, Step
from gpu_impl.sut import open_sut
from release_copies import replay_only_regression

pytestmark = pytest.mark.engine

#: the gate's default fuzz budget (fa3verify/commands/gate.py)
GATE_BUDGET_S = 20.0


@pytest.fixture(scope="module")
def regressed(tmp_path_factory):
    from gpu_impl.engines import envs

    if not (envs.env_dir("0.5.23") / "bin" / "python").exists():
        envs.ensure_env("0.5.23")
    root = replay_only_regression(tmp_path_factory.mktemp("sglang-0.5.23-replay-regressed"))
    sut = open_sut(f"sglang-src={root}")
    sut.start()
    yield sut
    sut.close()


def test_the_release_rejects_with_its_own_message_a_bare_assert_by_its_source_line(regressed):
    ok, message = regressed.validate(ServerConfig(tp_size=4, dp_size=3, enable_dp_attention=True),
                                     MODELS["qwen3-30b-a3b"])
    assert ok is False and "assert" in message and "line" in message, message
    # what the prover assumes away, the release accepts: attn_cp 4 without prefill CP
    assert regressed.validate(ServerConfig(tp_size=4, attn_cp_size=4), MODELS["qwen3-30b-a3b"])[0] is True


def test_the_one_path_regression_shows_on_the_replay_only(regressed):
    server = ServerConfig(tp_size=4, attn_cp_size=4, context_length=40960)
    batch = [Step("decode", [32768] + [100] * 7)]
    eager = regressed.run(Scenario(server=server, model=MODELS["qwen3-30b-a3b"], guard=None, steps=batch))
    assert not eager.findings  # the eager path is the release's own
    graph = regressed.run(Scenario(server=ServerConfig(tp_size=4, attn_cp_size=4, context_length=40960,
                                                       cuda_graph=True),
                                   model=MODELS["qwen3-30b-a3b"], guard=None, steps=batch))
    paths = {f.detail.get("path") for f in graph.findings if f.invariant == "SPLIT_BOUND"}
    assert paths == {"replay"}, [(f.invariant, f.detail.get("path")) for f in graph.findings]


def test_the_gates_fuzz_stage_finds_the_replay_only_regression_within_its_default_budget(regressed, tmp_path):
    from fa3verify.commands.fuzz import fuzz

    summary = fuzz(sut=regressed, seed=0, budget_s=GATE_BUDGET_S, out_dir=str(tmp_path),
                   show_progress=False)
    assert summary.exit_code == 1 and any(f.invariant == "SPLIT_BOUND" for f in summary.findings)
    reach = summary.domain["reach"]
    assert reach["eager"] > 0 and reach["capture"] > 0 and reach["replay"] > 0
    # 0.5.23's guard turns the precompute off under DP attention: no idle DP rank consumes metadata
    assert reach["dp-idle"] == 0 and "dp-idle" in summary.domain["not_covered"]
    assert summary.domain["rejected"] and summary.domain["accepted"] >= summary.cases
