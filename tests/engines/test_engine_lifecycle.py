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


# ---- every lifecycle check on the real paths: clean sequences hold, each seeded defect of the driven sequence is
# caught by its check (gpu_impl.engines.lifecycle_judge; sequences of gpu_impl.engines.lifecycle_runs)

#: seeded defect -> (sglang sequence it is driven on, the invariant that must catch it)
SGLANG_CONTROLS = {
    "no-semaphore-reset-after-reuse": ("eager-3-steps", "SEMAPHORE_STARTS_AT_ZERO"),
    "capture-width-of-capture-batch": ("graph-capture-replay-padded", "CAPTURE_COVERS_REPLAY"),
    "precompute-over-real-rows": ("graph-capture-replay-padded", "PADDED_ROWS_READ_DEFINED"),
    "shared-precompute-heterogeneous-heads": ("eager-3-steps", "SHARED_PRECOMPUTE_MATCHES_LAYER"),
}


def _invariants(result) -> set:
    return {f.invariant for f in list(result.findings) + list(result.shape_errors)}


@pytest.mark.engine
@pytest.mark.parametrize("name", ["eager-3-steps", "graph-capture-replay-padded"])
def test_0_5_23_two_layer_sequences_hold_every_lifecycle_invariant(engine_sut, name):
    from gpu_impl.engines.lifecycle_runs import run_sglang, sglang_scenario

    result = run_sglang(engine_sut("sglang==0.5.23"), sglang_scenario(name), layers=2)
    assert _invariants(result) == set() and result.ok
    assert {e.get("path") for e in result.trace} >= ({"replay"} if "graph" in name else {"eager"})


@pytest.mark.engine
@pytest.mark.parametrize("defect", sorted(SGLANG_CONTROLS))
def test_each_seeded_defect_is_caught_on_0_5_23_by_its_check(engine_sut, defect):
    from gpu_impl.engines.lifecycle_runs import run_sglang, sglang_scenario

    sequence, invariant = SGLANG_CONTROLS[defect]
    result = run_sglang(engine_sut("sglang==0.5.23"), sglang_scenario(sequence), layers=2, defect=defect)
    assert invariant in _invariants(result)


#: seeded defect -> (vLLM sequence, the invariant that must catch it, the releases whose driver reaches it)
VLLM_CONTROLS = {
    "no-semaphore-reset-after-reuse": ("eager-3-steps", "SEMAPHORE_STARTS_AT_ZERO", ("0.33.0", "0.34.0")),
    "precompute-over-real-rows": ("full-graph-replay-padded", "PADDED_ROWS_READ_DEFINED", ("0.33.0", "0.34.0")),
    "capture-width-of-capture-batch": ("full-graph-replay-padded", "CAPTURE_COVERS_REPLAY", ("0.33.0", "0.34.0")),
}


#: (release, sequence) -> what the lifecycle judge finds on the release's own code (nothing elsewhere): vLLM 0.34.0's
#: V2 runner and 0.33.0's V1 runner skip the DCP context metadata build for a step with an empty context while the
#: graph replays the context call over the buffer step 0 left (the pair invariants hold there: shorter lengths)
VLLM_FOUND = {("0.34.0", "dcp-full-graph-empty-context"): {"READS_OWN_STEP_METADATA": [1]},
              ("0.33.0", "dcp-full-graph-empty-context"): {"READS_OWN_STEP_METADATA": [1]}}


@pytest.mark.engine
@pytest.mark.parametrize("release", ["0.33.0", "0.34.0"])
def test_vllm_sequences_hold_and_each_seeded_defect_is_caught(engine_sut, release):
    from gpu_impl.engines.lifecycle_runs import VLLM_SEQUENCES, found_by_invariant, run_vllm

    worker = engine_sut(f"vllm=={release}").worker
    for name, fields in VLLM_SEQUENCES.items():
        out = run_vllm(worker, fields)
        assert found_by_invariant(out["findings"]) == VLLM_FOUND.get((release, name), {}), name
        assert out["shape_errors"] == []
    for defect, (sequence, invariant, releases) in VLLM_CONTROLS.items():
        out = run_vllm(worker, VLLM_SEQUENCES[sequence], defect=defect)
        assert (invariant in found_by_invariant(out["findings"])) == (release in releases), defect


@pytest.mark.engine
def test_vllm_0_33_0_v1_runner_captures_once_per_graph_and_replays_padded_batches(engine_sut):
    """The V1 driver (graphs.V1Graphs): a FULL graph is captured the first time a batch dispatches to it (steps 0-2
    pad 2 requests to the capture size 2, step 3 pads 6 to 8), and every step replays the captured calls: its
    launches are judged as replays, with the capture's scalars (max_seqlen_k = max_model_len)."""
    from gpu_impl.engines.lifecycle_runs import VLLM_SEQUENCES, run_vllm

    out = run_vllm(engine_sut("vllm==0.33.0").worker, VLLM_SEQUENCES["full-graph-replay-padded"])
    launches = [e for e in out["trace"] if "path" in e]
    captures = [e for e in launches if e["path"] == "full: capture"]
    assert [e["step"] for e in captures] == [0, 0, 3, 3]          # two layers; graphs of 2 and of 8 requests
    assert {e["step"] for e in launches if e["path"] == "full"} == {0, 1, 2, 3}
    assert {e["graph"]["num_tokens"] for e in launches if e["step"] == 3} == {8}
    assert out["findings"] == [] and out["shape_errors"] == []


@pytest.mark.engine
def test_vllm_0_33_0_above_the_largest_capture_size_runs_eagerly(engine_sut):
    from gpu_impl.engines.lifecycle_runs import VLLM_SEQUENCES, run_vllm

    fields = dict(VLLM_SEQUENCES["full-graph-replay-padded"], capture_sizes=[1, 2, 4])
    out = run_vllm(engine_sut("vllm==0.33.0").worker, fields)
    paths = {e["step"]: e["path"] for e in out["trace"] if e.get("path") and e["path"] != "full: capture"}
    assert paths == {0: "full", 1: "full", 2: "full", 3: "none: above the captured graphs"}


@pytest.mark.engine
def test_vllm_0_33_0_a_one_split_replay_without_fa3s_reset_is_caught_at_the_replay(engine_sut):
    """SEMAPHORE_STARTS_AT_ZERO on the V1 runner's replays: with one split a graph (flash_attn_max_num_splits_for_cuda_graph
    1) no combine zeroes the semaphore, so FA3 before 1a58058a leaves the scheduler's count for the next layer's
    replayed launch; the same sequence with FA3's reset holds."""
    from gpu_impl.engines.lifecycle_runs import VLLM_SEQUENCES, found_by_invariant, run_vllm

    worker = engine_sut("vllm==0.33.0").worker
    fields = dict(VLLM_SEQUENCES["full-graph-replay-padded"], max_num_splits_for_cuda_graph=1)
    assert found_by_invariant(run_vllm(worker, fields)["findings"]) == {}
    out = run_vllm(worker, fields, defect="no-semaphore-reset-after-reuse")
    assert found_by_invariant(out["findings"]) == {"SEMAPHORE_STARTS_AT_ZERO": [0, 1, 2, 3]}
    assert {f["detail"]["detail"]["path"] for f in out["findings"]} == {"replay"}


@pytest.mark.engine
def test_a_v1_replay_over_a_buffer_its_step_did_not_rewrite_is_caught_on_the_release_code(engine_sut, tmp_path):
    """READS_OWN_STEP_METADATA on the V1 runner's replays: a 0.33.0 copy whose builder stores a recompute only into an
    all-zero buffer (the first capture's) replays later steps over step 0's metadata."""
    from gpu_impl.engines.lifecycle_runs import VLLM_SEQUENCES, found_by_invariant, run_vllm
    from gpu_impl.engines.vllm.host import VllmWorker
    from release_copies import STORE_ONCE_0_33_0, vllm_patched_copy

    engine_sut("vllm==0.33.0")     # the environment exists (built by the shared worker)
    worker = VllmWorker("0.33.0", progress=lambda m: None,
                        source=vllm_patched_copy("0.33.0", tmp_path / "once", STORE_ONCE_0_33_0))
    try:
        out = run_vllm(worker, VLLM_SEQUENCES["full-graph-replay-padded"])
    finally:
        worker.close()
    assert found_by_invariant(out["findings"])["READS_OWN_STEP_METADATA"] == [1, 2, 3]


@pytest.mark.engine
def test_vllm_0_33_0_v1_runner_dispatches_full_and_piecewise_as_the_release_does(engine_sut):
    """vLLM's default FA3 mode on the V1 runner: uniform decode batches replay FULL graphs, a mixed batch takes a
    PIECEWISE graph (attention eager, tokens padded), a batch above the largest size runs eagerly; the release's
    CudagraphDispatcher decides each."""
    worker = engine_sut("vllm==0.33.0").worker
    out = worker.run({"cuda_graph": "full_and_piecewise", "max_model_len": 8192, "capture_sizes": [1, 2, 4, 8],
                      "steps": [{"seq_lens": [3000, 100]}, {"seq_lens": [200, 300], "query_lens": [5, 2]},
                                {"seq_lens": [9] * 6}, {"seq_lens": [9] * 12}]})
    paths = {(e["step"], e["path"], e["graph"]["num_tokens"]) for e in out["trace"] if "path" in e}
    assert paths == {(0, "full: capture", 2), (0, "full", 2), (1, "piecewise", 8), (2, "full: capture", 8),
                     (2, "full", 8), (3, "none: above the captured graphs", 12)}
    assert out["findings"] == [] and out["shape_errors"] == []


@pytest.mark.engine
@pytest.mark.parametrize("release", ["0.33.0", "0.34.0"])
def test_vllm_graph_replay_of_a_smaller_precompute_is_a_silent_size_mismatch(engine_sut, release):
    """The size disagreement is named once, by the pair check's SHAPE, reported silent at the replay (0.33.0's V1
    runner and 0.34.0's V2 runner both replay the captured call behind the persistent buffer's captured view)."""
    from gpu_impl.engines.lifecycle_runs import VLLM_SEQUENCES, run_vllm

    worker = engine_sut(f"vllm=={release}").worker
    fields = dict(VLLM_SEQUENCES["full-graph-replay-padded"], defect={"precompute_num_splits": 0})
    out = run_vllm(worker, fields)
    assert {f["invariant"] for f in out["findings"]} == {"SHAPE"}
    assert all(f["detail"].get("replay") for f in out["findings"])


@pytest.mark.engine
@pytest.mark.parametrize("release", ["0.33.0", "0.34.0"])
def test_vllm_refuses_layers_of_other_heads_in_one_attention_group(engine_sut, release):
    from gpu_impl.engines.lifecycle_runs import VLLM_SEQUENCES, run_vllm
    from gpu_impl.sut import ScenarioUnsupported

    worker = engine_sut(f"vllm=={release}").worker
    with pytest.raises(ScenarioUnsupported, match="must share num_heads"):
        run_vllm(worker, VLLM_SEQUENCES["eager-3-steps"], defect="shared-precompute-heterogeneous-heads")


@pytest.mark.engine
def test_the_0_5_13_precompute_heads_case_replays_still_failing(engine_sut):
    """tests/corpus_lifecycle/sglang-0.5.13-prefill-cp-precompute-heads.json: `fa3verify replay` on the release it
    names still fails, the shared precompute not matching the layers (and the split overflow it causes)."""
    from pathlib import Path

    from fa3verify.commands.replay import replay

    path = Path(__file__).parent.parent / "corpus_lifecycle" / "sglang-0.5.13-prefill-cp-precompute-heads.json"
    summary, seen = replay(str(path), sut=engine_sut("sglang==0.5.13"))
    assert summary.exit_code == 1 and seen.outcome == "violation"
    assert {"SHARED_PRECOMPUTE_MATCHES_LAYER", "SPLIT_BOUND"} <= set(seen.invariants)
    shared = next(f for f in seen.findings if f.invariant == "SHARED_PRECOMPUTE_MATCHES_LAYER")
    assert shared.detail["detail"]["fields"] == {"num_heads": [8, 32], "num_heads_k": [1, 4]}


@pytest.mark.engine
def test_the_vllm_0_34_0_dcp_empty_context_case_replays_still_failing(engine_sut):
    """tests/corpus_lifecycle/vllm-0.34.0-dcp-full-graph-empty-context.json: on the release it names the replayed
    context call of step 1 still reads the metadata step 0 made, and nothing else is found."""
    from pathlib import Path

    from fa3verify.commands.replay import replay

    path = Path(__file__).parent.parent / "corpus_lifecycle" / "vllm-0.34.0-dcp-full-graph-empty-context.json"
    summary, seen = replay(str(path), sut=engine_sut("vllm==0.34.0"))
    assert summary.exit_code == 1 and seen.outcome == "violation"
    assert seen.invariants == ["READS_OWN_STEP_METADATA"]


def test_the_lifecycle_matrix_names_a_release_it_cannot_run_and_goes_on(monkeypatch, capsys):
    """`python -m gpu_impl.engines.lifecycle_runs`: bad usage is exit 2 before any release runs; a release whose run
    raises (its driver refusing a request included) is one 'not run' line with the reason, the next release still
    runs, and the exit is 3 (inconclusive) when nothing was found; a finding anywhere is 1."""
    from gpu_impl.engines import lifecycle_runs

    ran = []

    def fake_row(engine):
        ran.append(engine)
        if engine == "vllm==0.10.1":
            raise ValueError("vllm==0.10.1: FullAttentionSpec.__init__() missing 1 required positional argument")
        return [("eager-3-steps", {"SPLIT_BOUND": [1]} if engine == "vllm==0.34.0" else {}, 0.1)]

    monkeypatch.setattr(lifecycle_runs, "matrix_row", fake_row)
    assert lifecycle_runs.main(["vllm==0.10.1", "sglang-0.5.23"]) == 2 and ran == []
    assert lifecycle_runs.main(["vllm==0.10.1", "vllm==0.33.0"]) == 3
    out = capsys.readouterr().out
    assert "vllm==0.10.1: not run: ValueError" in out and "vllm==0.33.0  eager-3-steps" in out
    assert lifecycle_runs.main(["vllm==0.10.1", "vllm==0.34.0"]) == 1


def test_a_sequence_a_release_cannot_run_is_named_and_its_other_sequences_still_run(monkeypatch):
    """One sequence a release refuses (an older vLLM without the DCP workspace) is a 'not run' row with the driver's
    first line; the release's other sequences run on the same worker, a dead worker is started again."""
    from gpu_impl.engines import lifecycle_runs
    from gpu_impl.engines.errors import DriverError
    from gpu_impl.engines.vllm import host

    started = []

    class Worker:
        def __init__(self, release, progress=None):
            started.append(release)
            self.running = True

        def close(self):
            self.running = False

    def run(worker, fields):
        if fields.get("dcp"):
            worker.running = False
            raise DriverError("vllm==0.11.1: crash: ImportError: cannot import name 'workspace'\nTraceback ...")
        return {"findings": [], "shape_errors": []}

    monkeypatch.setattr(host, "VllmWorker", Worker)
    monkeypatch.setattr(lifecycle_runs, "run_vllm", run)
    rows = {name: found for name, found, _ in lifecycle_runs.matrix_row("vllm==0.11.1")}
    assert set(rows) == set(lifecycle_runs.VLLM_SEQUENCES)
    refused = [name for name, found in rows.items() if "not run" in found]
    assert refused and all("workspace" in rows[n]["not run"] and "Traceback" not in rows[n]["not run"] for n in refused)
    assert all(found == {} for name, found in rows.items() if name not in refused)
    assert len(started) == 1 + len(refused)
