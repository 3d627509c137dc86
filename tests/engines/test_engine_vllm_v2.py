"""vLLM 0.34.0 through the driver's second generation (gpu_impl/engines/vllm/driver_v2.py): the V2 model runner's own
dispatch, capture and metadata code in front of the release's FlashAttention builder and impl.

The unit tests need nothing; those marked ``engine`` run in the cached vllm 0.34.0 environment
(``fa3verify engine setup vllm==0.34.0``) and skip, naming how to build it, without one. Numbers: the worked example
of docs/facts-fa3.md section 1 (H=32, Hk=4, tp=4 -> 8 and 1 heads per rank; one 32768-token sequence and seven of
100). The engine tests share the test process's worker for the release (tests/engine_pool.py: vLLM's import is paid
once per test process)."""

import json

import pytest

from engine_releases import vllm_worker
from gpu_impl.engines import envs
from gpu_impl.engines.vllm import recipes as vllm_recipes

RELEASE = "0.34.0"
SKEWED = [32768] + [100] * 7


def test_each_release_has_a_driver_generation_and_the_generations_name_their_modules():
    assert set(vllm_recipes.DRIVER_GENERATIONS) == set(vllm_recipes.RELEASES)
    assert vllm_recipes.DRIVER_GENERATIONS["0.33.0"] == "v1"
    assert [r for r, g in vllm_recipes.DRIVER_GENERATIONS.items() if g == "v2"] == ["0.34.0"]
    # each generation a release is driven by, as its own or as its V2 runner's (releases.json v2_runner.generation)
    assert set(vllm_recipes.GENERATION_MODULES) == set(vllm_recipes.DRIVER_GENERATIONS.values()) | set(
        vllm_recipes.V2_RUNNER_CONFIGS)


def test_the_recipe_takes_the_wheel_own_specifiers():
    requires = ["transformers<5.23.0,>=5.16.1", "xgrammar==0.2.8; platform_machine == \"x86_64\" or platform_machine "
                "== \"aarch64\"", "protobuf==7.36.1; platform_machine == \"s390x\"", "zentorch==2.14.0.2; extra == \"zen\"",
                "filelock>=4.2.4", "numba==0.65.0"]  # numba: pinned by the wheel, not installed by the recipe
    pins = vllm_recipes.wheel_requirements(RELEASE, requires)
    assert pins == {"transformers": "<5.23.0,>=5.16.1", "xgrammar": "==0.2.8", "filelock": ">=4.2.4"}
    assert vllm_recipes.wheel_requirements("0.33.0", requires) == {}  # 0.33.0's row pins by hand, hash unchanged
    steps = envs.install_steps(RELEASE, "vllm", pins)
    assert "transformers<5.23.0,>=5.16.1" in steps[0][1] and "xgrammar==0.2.8" in steps[1][1]


def test_an_unregistered_release_is_told_its_nearest_generation_and_what_to_add():
    from gpu_impl.engines.errors import UnknownRelease

    assert vllm_recipes.nearest_generation("0.35.1") == ("0.34.0", "v2")
    assert vllm_recipes.nearest_generation("0.33.2") == ("0.33.0", "v1")
    oldest = vllm_recipes.RELEASES[0]
    assert vllm_recipes.nearest_generation("0.8.0") == (oldest, "v0")  # before every registered one: the oldest
    with pytest.raises(UnknownRelease) as err:
        envs.check_release("0.35.0", engine="vllm")
    text = str(err.value)
    assert "0.33.0, 0.34.0)" in text and "nearest driver generation is v2 (vllm==0.34.0's)" in text
    assert "--engine vllm-src=<the vllm 0.35.0 wheel>" in text and "DRIVER_GENERATIONS" in text
    with pytest.raises(UnknownRelease, match="not a release number"):
        envs.check_release("latest", engine="vllm")


@pytest.fixture(scope="module")
def worker(engine_sut):
    yield from vllm_worker(RELEASE, engine_sut)


def _pairs(resp, path=None):
    return [e for e in resp["trace"] if "s_c" in e and (path is None or e["path"] == path)]


@pytest.mark.engine
def test_the_worker_runs_the_release_under_the_v2_generation(worker):
    assert worker.hello["release"] == RELEASE and worker.hello["driver"] == "v2" and worker.hello["fa_version"] == 3


@pytest.mark.engine
def test_eager_piecewise_and_above_the_largest_graph_use_the_heuristic_on_both_sides(worker):
    eager = worker.run({"tp": 4, "steps": [{"seq_lens": SKEWED}]})
    (p,) = _pairs(eager)
    assert (p["precompute"]["num_heads"], p["precompute"]["num_heads_k"]) == (p["call"]["num_heads"],
                                                                             p["call"]["num_heads_k"]) == (8, 1)
    assert p["s_p"] == p["s_c"] == 109 and p["precompute"]["num_splits"] == p["call"]["num_splits"] == 0
    # FULL graphs captured only up to 4 requests: 8 decodes dispatch eagerly (CudaGraphManager.dispatch)
    above = worker.run({"tp": 4, "cuda_graph": "full", "capture_sizes": [1, 2, 4], "steps": [{"seq_lens": SKEWED}]})
    (p,) = _pairs(above)
    assert p["path"] == "none: above the captured graphs" and p["max_num_splits"] == 0 and p["s_p"] == p["s_c"] == 109
    pw = worker.run({"tp": 4, "cuda_graph": "piecewise", "steps": [{"seq_lens": [300, 100, 5]}]})
    (p,) = _pairs(pw)
    assert p["path"] == "piecewise" and p["call"]["batch_size"] == 3 and p["graph"]["num_reqs"] is None
    assert eager["findings"] == above["findings"] == pw["findings"] == []


@pytest.mark.engine
def test_full_graph_replay_reissues_the_captured_call_on_the_persistent_buffers(worker):
    """Token-keyed FULL graphs are captured with max_query_len = the graph's token count and max_seq_len =
    max_model_len (cudagraph_utils.py:903, model_states/default.py:196); a replay's precompute sees the batch's own
    values, and the split bound (32) is the same on both sides."""
    resp = worker.run({"tp": 4, "cuda_graph": "full", "steps": [{"seq_lens": SKEWED}, {"seq_lens": [100] * 8}]})
    capture, replays = _pairs(resp, "full: capture"), _pairs(resp, "full")
    assert len(capture) == 1 and len(replays) == 2  # captured once, replayed each step
    assert capture[0]["call"]["seqlen_k"] == 40960 and capture[0]["precompute"]["max_seqlen_q"] == 8
    first = replays[0]
    assert first["precompute"]["max_seqlen_k"] == 32768 and first["precompute"]["max_seqlen_q"] == 1
    assert first["call"]["seqlen_k"] == 40960  # the captured max_seqlen_k (the fork takes it as seqlen_k)
    assert first["precompute"]["num_splits"] == first["call"]["num_splits"] == 32
    assert replays[1]["precompute"]["max_seqlen_k"] == 100  # the second replay's own precompute
    assert resp["findings"] == []


@pytest.mark.engine
def test_full_and_piecewise_takes_decode_graphs_and_runs_mixed_batches_piecewise(worker):
    resp = worker.run({"tp": 4, "cuda_graph": "full_and_piecewise",
                       "steps": [{"seq_lens": SKEWED}, {"seq_lens": [32768, 100, 100], "query_lens": [1, 37, 100]}]})
    decode = _pairs(resp, "full")[0]
    assert decode["graph"]["uniform_token_count"] == 1 and decode["call"]["num_splits"] == 32
    (mixed,) = _pairs(resp, "piecewise")
    assert mixed["precompute"]["num_splits"] == mixed["call"]["num_splits"] == 32  # use_full_cuda_graph is true
    assert resp["findings"] == []


@pytest.mark.engine
def test_dcp_full_graph_step_without_context_replays_on_the_previous_metadata(worker):
    """DCP 2 under FULL graphs: a step whose context is empty builds no metadata (skip_dcp_context_attention) and the
    replayed context call reads the persistent buffer as the previous build left it: driven and judged. The pair
    invariants hold (shorter lengths over step 0's metadata); the lifecycle judge names the stale read
    (READS_OWN_STEP_METADATA: precomputed at step 0, replayed at step 1), and nothing else."""
    resp = worker.run({"tp": 4, "dcp": 2, "cuda_graph": "full",
                       "steps": [{"seq_lens": [32768, 100]}, {"seq_lens": [1, 1]}]})
    step1 = [p for p in _pairs(resp, "full") if p["step"] == 1]
    assert step1 and not step1[0]["aot"] and step1[0]["precompute"]["max_seqlen_k"] == 16384
    (stale,) = resp["findings"]
    assert stale["invariant"] == "READS_OWN_STEP_METADATA" and stale["step"] == 1
    assert stale["detail"]["detail"]["made_at"] == [0, 0] and stale["detail"]["detail"]["path"] == "replay"
    assert resp["shape_errors"] == []


DCP_SKIP = {"num_heads": 32, "num_kv_heads": 2, "tp": 2, "dcp": 2, "cuda_graph": "full"}
FRESH = {"seq_lens": [17, 5], "query_lens": [17, 5]}  # two fresh prompts: every context empty, the context call skipped


@pytest.mark.engine
def test_dcp_skipped_context_replay_reads_the_previous_step_not_the_capture(worker):
    """Step 1's graph (32 tokens) is first used at step 1; vLLM captured it at start-up, so its replay, whose build
    skips the context attention, reads step 0's metadata (a 4-row layout under the 32-row graph: a silent SHAPE),
    not the capture's one-token rows (which the driver once read, reporting QUERY_COVER from them)."""
    resp = worker.run({**DCP_SKIP, "steps": [{"seq_lens": [32768, 100, 17]}, FRESH]})
    assert {f["invariant"] for f in resp["findings"]} == {"SHAPE", "READS_OWN_STEP_METADATA"}
    (stale,) = [f for f in resp["findings"] if f["invariant"] == "READS_OWN_STEP_METADATA"]
    assert stale["step"] == 1 and stale["detail"]["detail"]["made_at"] == [0, 0]


@pytest.mark.engine
def test_dcp_skipped_context_replay_leaves_query_rows_uncovered(worker):
    """The finding (docs/engines-vllm.md finding 7): graph 32 captured and replayed by 22 one-token decodes at step 0;
    at step 1 two fresh prompts replay it, the build skips the context attention, and the captured context call
    reads step 0's m-blocks (1 per row) for 17- and 5-token queries (544 and 160 packed rows): rows past 128 are
    never computed. The same batch with a context (not skipped) passes."""
    resp = worker.run({**DCP_SKIP, "steps": [{"seq_lens": [100] * 22}, FRESH]})
    cover = sorted((f["detail"]["batch"], tuple(f["detail"]["detail"]["uncovered_rows"]))
                   for f in resp["findings"] if f["invariant"] == "QUERY_COVER")
    assert cover == [(0, (128, 543)), (1, (128, 159))]
    assert {f["invariant"] for f in resp["findings"]} == {"QUERY_COVER", "READS_OWN_STEP_METADATA"}
    with_context = worker.run({**DCP_SKIP, "steps": [{"seq_lens": [100] * 22},
                                                     {"seq_lens": [18, 6], "query_lens": [17, 5]}]})
    assert with_context["findings"] == []


@pytest.mark.engine
def test_fresh_one_token_prompts_take_no_decode_graph_under_full_and_piecewise(worker):
    """0.34.0 lets a batch take a decode graph only when no request is prefilling (``decode_graph_eligible``,
    model_runner.py 1427-1438): four fresh one-token prompts run PIECEWISE under vLLM's default mode, so the skipped
    DCP context attention has no captured call to read stale rows (the driver once replayed the decode graph for them
    and reported a QUERY_COVER vLLM cannot reach). Under FULL the mixed graph replays them: finding 7, still found."""
    steps = [{"seq_lens": [100] * 3}, {"seq_lens": [1] * 4, "query_lens": [1] * 4}]
    assert worker.run({**DCP_SKIP, "cuda_graph": "full_and_piecewise", "steps": steps})["findings"] == []
    full = worker.run({**DCP_SKIP, "steps": steps})
    assert {f["invariant"] for f in full["findings"]} == {"QUERY_COVER", "READS_OWN_STEP_METADATA"}


@pytest.mark.engine
def test_full_graph_replay_of_a_recompute_in_another_layout_is_a_finding(worker):
    """The finding in 0.34.0's own code: a FULL graph is captured with max_seqlen_q = its token count and
    max_seqlen_k = max_model_len (cudagraph_utils.py:903, model_states/default.py:196); a replay's recompute sees the
    batch's own (1 and 5000). With head_dim 64 FA3 drops causal for a one-token query at the recompute only (no
    window, not 64 < d <= 128), so the recompute writes 9 int32 values (no heads-in-L2 vector) into the buffer of a
    call captured causal, which reads 13: silent at a replay (no host check). With head_dim 128 the layouts agree;
    under FULL_AND_PIECEWISE the decode graph is captured with max_seqlen_q 1 and the layouts agree."""
    d64 = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 64, "steps": [{"seq_lens": [5000, 100, 100]}]}
    found = worker.run({**d64, "cuda_graph": "full"})
    (f,) = found["findings"]
    assert f["invariant"] == "SHAPE" and "silent layout mismatch" in f["message"] and f["detail"]["replay"]
    assert "13 int32 values (precompute produces 9)" in f["message"] and found["shape_errors"] == []
    assert worker.run({**d64, "cuda_graph": "full_and_piecewise"})["findings"] == []
    assert worker.run({**d64, "head_dim": 128, "cuda_graph": "full"})["findings"] == []
    # a uniform sliding window and a decode batch shorter than it: the recompute drops the window (max_seqlen_k 2), the
    # call captured with max_model_len keeps it -- vLLM's default mode too. A one-token sequence is a fresh prompt,
    # which takes no decode graph from 0.31.0 on (decode_graph_eligible): no finding there.
    sw = {"num_heads": 16, "num_kv_heads": 8, "head_dim": 256, "tp": 2, "num_layers": 2, "sliding_window": 4096,
          "cuda_graph": "full_and_piecewise"}
    assert {f["invariant"] for f in worker.run({**sw, "steps": [{"seq_lens": [2]}]})["findings"]} == {"SHAPE"}
    assert worker.run({**sw, "steps": [{"seq_lens": [1]}]})["findings"] == []


@pytest.mark.engine
def test_seeded_split_count_difference_is_caught_on_the_v2_path(worker):
    seeded = worker.run({"tp": 4, "cuda_graph": "full", "defect": {"precompute_num_splits": 0},
                         "steps": [{"seq_lens": SKEWED}]})
    assert "SPLIT_BOUND" in {f["invariant"] for f in seeded["findings"]}
    (p,) = _pairs(seeded, "full")
    assert (p["s_p"], p["s_c"]) == (109, 32)


@pytest.mark.engine
def test_profile_claims_hold_on_the_released_code(worker):
    from gpu_impl.engines.vllm.profiles import raw_release, vllm_profile_for

    prof, model = raw_release(RELEASE), vllm_profile_for(RELEASE)
    for sc in ({"tp": 4}, {"tp": 4, "cuda_graph": "piecewise"}, {"tp": 4, "cuda_graph": "full"},
               {"tp": 8, "dcp": 2, "cuda_graph": "full"}, {"tp": 4, "batch_invariant": True}):
        resp = worker.run({**sc, "steps": [{"seq_lens": SKEWED}]})
        for p in _pairs(resp):
            if not p["aot"]:
                assert sc.get("batch_invariant") and p["call"]["num_splits"] == prof["max_num_splits"]["batch_invariant"]
                continue
            pre, call = p["precompute"], p["call"]
            assert (pre["num_heads"], pre["num_heads_k"]) == (call["num_heads"], call["num_heads_k"])
            assert call["seqlen_k"] >= pre["max_seqlen_k"]
            mode = sc.get("cuda_graph", "none")
            assert (pre["num_splits"], call["num_splits"]) == model.splits(mode)
            assert pre["headdim_v"] == pre["headdim"]
        assert resp["findings"] == []
    assert json.loads(json.dumps(prof))["driver"].startswith("v2")


def _gate_copy(root, tmp_path, name, cases):
    from fa3verify.cli import main

    out = tmp_path / f"{name}.json"
    rc = main(["gate", "--engine", f"vllm-src={root}", "--cases", str(cases), "--cases-dir",
               str(tmp_path / "cases"), "--json", str(out)])  # one cases directory: the theorem memo answers twice
    return rc, json.loads(out.read_text())


@pytest.mark.engine
def test_negative_controls_one_path_split_regression_fails_the_gate_and_aligned_sides_clear_it(tmp_path):
    """Copies of the 0.34.0 wheel's package (tests/release_copies.py): on the full-graph path only, the call passes
    half the split bound the precompute was given (16 vs 32): the gate fails with SPLIT_BOUND (exit 1); the same copy
    with the precompute asking the same halved bound has no split finding left (only the release's own SHAPE can
    remain). The same draws (--cases) on both."""
    if not envs.env_ready(RELEASE, engine="vllm"):
        pytest.skip(f"no environment for vllm {RELEASE} under {envs.env_dir(RELEASE, engine='vllm')}")
    from release_copies import ALIGNED_HALF_SPLITS_0_34_0, CALL_HALF_SPLITS_0_34_0, vllm_patched_copy

    seeded = vllm_patched_copy(RELEASE, tmp_path / "seeded", CALL_HALF_SPLITS_0_34_0)
    rc, summary = _gate_copy(seeded, tmp_path, "seeded", 200)
    failed = [c for c in summary["checks"] if c.get("failed")]
    assert rc == 1 and failed and any("SPLIT_BOUND" in json.dumps(c) for c in failed), failed
    assert all(f.get("case_file") for f in summary["findings"])
    aligned = vllm_patched_copy(RELEASE, tmp_path / "aligned", ALIGNED_HALF_SPLITS_0_34_0)
    rc, summary = _gate_copy(aligned, tmp_path, "aligned", 200)
    # aligned: the seeded class is gone; what may remain is the release's own finding (SHAPE at a FULL graph replay,
    # test_full_graph_replay_of_a_recompute_in_another_layout_is_a_finding), never inconclusive
    found = {f["invariant"] for f in summary["findings"]}
    assert rc in (0, 1) and not found & {"SPLIT_BOUND", "COMBINE_CAPACITY"} and found <= {"SHAPE"}, found
    assert not any(c.get("inconclusive") for c in summary["checks"])


@pytest.mark.engine
def test_the_finding_case_file_replays_still_failing(worker):
    """tests/corpus_vllm/full-graph-replay-window-dropped-at-recompute.json (found by the gate on 0.34.0, seed 0):
    `fa3verify replay` on the release it names says STILL FAILS (exit 1), SHAPE at the FULL graph replay."""
    from pathlib import Path

    from fa3verify.commands.replay import replay
    from gpu_impl.engines.vllm.host import VllmSUT

    path = Path(__file__).parent.parent / "corpus_vllm" / "full-graph-replay-window-dropped-at-recompute.json"
    sut = VllmSUT(RELEASE)
    sut._worker = worker  # the module's worker: no second import
    summary, seen = replay(str(path), sut=sut)
    assert summary.exit_code == 1 and seen.outcome == "violation"
    assert {f.invariant for f in seen.findings} == {"SHAPE"}


#: the V2 runner's drafter (gpu_impl/engines/vllm/drafter_v2.py): 3 speculative tokens, so 2 draft decode steps after
#: each step; one long sequence, so FA3's scheduler splits its draft decode
DRAFTS = {"tp": 4, "draft_tokens": 3, "steps": [{"seq_lens": [30000, 100], "query_lens": [1, 30]}]}


@pytest.mark.engine
def test_the_v2_drafter_judges_each_draft_step_against_its_own_precompute(worker):
    """The release's speculator decides (0.34.0: the fused draft-decode update, DCP 1): every draft decode call has
    a precompute of its own (update_draft_decode_metadata's) with the call's split count; under DCP 2 the builder
    does not support the update and the speculator rebuilds the metadata eagerly for each step."""
    for graph in ("none", "piecewise"):
        resp = worker.run({**DRAFTS, "cuda_graph": graph})
        drafts = [e for e in _pairs(resp) if "drafter" in e["reached"]]
        assert resp["findings"] == [] and len(drafts) == 2, graph  # 2 draft steps x 1 layer per step
        assert all(e["aot"] and e["s_p"] == e["s_c"] and "V2 runner" in e["reached"] for e in drafts)
    dcp = worker.run({**DRAFTS, "num_heads": 32, "num_kv_heads": 4, "dcp": 2, "cuda_graph": "none"})
    assert dcp["findings"] == [] and [e for e in _pairs(dcp) if "drafter" in e["reached"]]


#: decode steps for the FULL draft-decode graphs: 3 speculative tokens (2 draft steps); the third step has one request,
#: so it dispatches to another graph
GRAPHED_DRAFTS = {"tp": 4, "draft_tokens": 3, "steps": [{"seq_lens": [30000, 100]}, {"seq_lens": [30001, 101]},
                                                         {"seq_lens": [3000]}]}


@pytest.mark.engine
def test_the_v2_drafter_full_graphs_are_captured_once_and_replayed_with_their_own_recompute(worker):
    """Under a FULL mode the release's speculator dispatches its draft decode to its own FULL draft-decode graphs
    (drafter_graphs): each graph is captured on first use (the fused loop: per draft step the update's precompute with
    the capture's scalars, its store, the call) and replayed on later steps, each replayed draft call judged against
    the recompute of its own replay; under DCP 2 the graph holds one draft step and the host rebuilds the metadata
    before each replay. The release passes; every draft call is on the path 'V2 drafter FULL graph'."""
    for graph in ("full", "full_and_piecewise"):
        resp = worker.run({**GRAPHED_DRAFTS, "cuda_graph": graph})
        drafts = [e for e in _pairs(resp) if "drafter" in e["reached"]]
        assert resp["findings"] == [] and resp["shape_errors"] == [], graph
        assert all("V2 drafter FULL graph" in e["reached"] and e["s_p"] == e["s_c"] == 32 for e in drafts), graph
        paths = [(e["step"], e["path"]) for e in drafts]
        # step 0 captures the graph of 2 requests (2 draft steps) and replays it; step 1 replays it; step 2 (1 request)
        assert paths == ([(0, "full: draft capture")] * 2 + [(0, "full: draft replay")] * 2
                         + [(1, "full: draft replay")] * 2
                         + [(2, "full: draft capture")] * 2 + [(2, "full: draft replay")] * 2), graph
    dcp = worker.run({**GRAPHED_DRAFTS, "num_heads": 32, "num_kv_heads": 4, "dcp": 2, "cuda_graph": "full"})
    drafts = [e for e in _pairs(dcp) if "drafter" in e["reached"]]
    assert dcp["findings"] == [] and [e["path"] for e in drafts if e["step"] == 1] == ["full: draft replay"] * 2


@pytest.mark.engine
def test_a_copy_whose_draft_graph_recompute_asks_more_splits_than_its_call_is_found(worker, tmp_path):
    """Negative control (tests/release_copies.py DRAFT_GRAPH_UPDATE_SPLITS_0_34_0): the fused update under a
    full-graph mode asks FA3 for twice the split bound (64) the draft call passes (32): SPLIT_BOUND (and the lifecycle
    judge's CAPTURE_COVERS_REPLAY: the replay's splits above the captured launch's) on the draft calls of the long
    sequence at the replays, where the release passes (above); the same copy eagerly is the release's own (its bound
    is 0 there)."""
    from release_copies import DRAFT_GRAPH_UPDATE_SPLITS_0_34_0, vllm_patched_copy

    from gpu_impl.engines.vllm.host import VllmSUT
    from gpu_impl.sut import parse_engine

    root = vllm_patched_copy(RELEASE, tmp_path / "seeded", DRAFT_GRAPH_UPDATE_SPLITS_0_34_0)
    with VllmSUT(spec=parse_engine(f"vllm-src={root}"), progress=lambda line: None) as sut:
        graphed = sut.worker.run({**GRAPHED_DRAFTS, "cuda_graph": "full"})
        eager = sut.worker.run({**GRAPHED_DRAFTS, "cuda_graph": "none"})
    found = graphed["findings"]
    assert "SPLIT_BOUND" in {f["invariant"] for f in found}
    assert {f["invariant"] for f in found} <= {"SPLIT_BOUND", "COMBINE_CAPACITY", "CAPTURE_COVERS_REPLAY"}
    assert all(f["detail"].get("drafter") and f["detail"]["s_p"] > f["detail"]["s_c"] == 32 for f in found)
    assert "full: draft replay" in {f["detail"]["path"] for f in found}
    assert eager["findings"] == []


@pytest.mark.engine
def test_a_copy_whose_draft_step_precompute_asks_more_splits_than_its_call_is_found(worker, tmp_path):
    """Negative control (tests/release_copies.py DRAFT_UPDATE_SPLITS_0_34_0): the draft steps' recompute asks FA3
    for a split bound of 128 where the draft call passes 0: SPLIT_BOUND on the draft calls only (S_p 128 vs the
    call's 109), where the release itself passes the same scenario (above)."""
    from release_copies import DRAFT_UPDATE_SPLITS_0_34_0, vllm_patched_copy

    from gpu_impl.engines.vllm.host import VllmSUT
    from gpu_impl.sut import parse_engine

    root = vllm_patched_copy(RELEASE, tmp_path / "seeded", DRAFT_UPDATE_SPLITS_0_34_0)
    with VllmSUT(spec=parse_engine(f"vllm-src={root}"), progress=lambda line: None) as sut:
        resp = sut.worker.run({**DRAFTS, "cuda_graph": "none"})
    assert {(f["invariant"], f["detail"]["s_p"], f["detail"]["s_c"]) for f in resp["findings"]} == {
        ("SPLIT_BOUND", 128, 109)}
    target = [e for e in _pairs(resp) if "drafter" not in e["reached"]]
    assert target and all(e["s_p"] == e["s_c"] for e in target)  # the target step is the release's own
