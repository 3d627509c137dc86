"""Real sglang 0.5.23 (gpu_impl.engines, on CPU) over a multi-step CUDA-graph sequence: every replay reads metadata
recomputed for its own step (READS_OWN_STEP_METADATA); negative control: a source copy of 0.5.23 whose replay-time
recompute is disabled is caught at the second step's replay.

Marked ``engine``: needs the 0.5.23 environment (built once, cached; tests/engine_pool.py shares its worker).
"""

from __future__ import annotations

import pytest

from gpu_impl.config import ServerConfig, get_model
from gpu_impl.scenario import Scenario, Step
from gpu_impl.sut import open_sut
from release_copies import patched_copy

QWEN = get_model("qwen3-30b-a3b")
STEPS = ([3000, 100], [200, 300], [1000, 50])

#: 0.5.23 with its CUDA-graph replay-time metadata recompute switched off (the buffer keeps the capture's)
NO_REPLAY_RECOMPUTE_0_5_23 = (
    (r"# Recompute scheduler_metadata into pre-allocated buffer\n(\s+)if \(\n",
     r"# Recompute scheduler_metadata into pre-allocated buffer\n\1if False and (\n"),
)


def graph_scenario() -> Scenario:
    server = ServerConfig(tp_size=1, cuda_graph=True, context_length=4096)
    return Scenario(server=server, model=QWEN, guard=None, steps=[Step("decode", list(b)) for b in STEPS])


def own_step_findings(result) -> list:
    return [f for f in result.findings if f.invariant == "READS_OWN_STEP_METADATA"]


@pytest.mark.engine
def test_every_replay_of_0_5_23_reads_its_own_steps_metadata(engine_sut):
    result = engine_sut("sglang==0.5.23").run(graph_scenario())
    replays = [e for e in result.trace if e.get("path") == "replay"]
    assert len({e["step"] for e in replays}) == len(STEPS)
    assert own_step_findings(result) == [] and result.ok


@pytest.mark.engine
def test_a_replay_without_the_recompute_is_caught_on_the_release_code(engine_sut, tmp_path):
    engine_sut("sglang==0.5.23")     # the environment exists (built by the shared worker)
    root = patched_copy("0.5.23", tmp_path, NO_REPLAY_RECOMPUTE_0_5_23)
    sut = open_sut(f"sglang-src={root}")
    try:
        sut.start()
        result = sut.run(graph_scenario())
    finally:
        sut.close()
    found = own_step_findings(result)
    assert found and {f.step for f in found} == {1, 2}
    assert found[0].detail["detail"]["made_at"][0] == 0 and "precomputed at step 0" in found[0].message
