"""vLLM 0.9.1 .. 0.10.0 under full CUDA graphs, judged under the FA3 build their wheels ship (vllm-fork-8798f277).

Two findings of their gates, each pinned in milliseconds on the model and by its case file (replayed on the release,
slow, only with the release's engine environment):

- 0.9.1 passes no split bound on either side (``num_splits`` 0). The graph of capture size 8 was captured by
  ``_dummy_run(8)`` (8 requests of ``max_model_len`` 32768, ``max_seqlen_q`` 8): FA3's heuristic gave the captured
  call S_c = 38. A replay's metadata is precomputed on the real batch (falcon-7b: 71 heads on 1, d 64;
  ``seq_lens`` [1, 8449, 1 x 6]): S_p = 39 and 39 splits for batch 1, past the captured partial buffers
  (SPLIT_BOUND). 0.9.2 bounds both sides with ``_DEFAULT_MAX_NUM_SPLITS_FOR_CUDA_GRAPH`` (16): the case passes there.
- 0.9.2 and 0.10.0 precompute with ``num_splits = self.max_num_splits`` (16) on every build under a full graph
  (``flash_attn.py`` ``schedule``), but a batch with more tokens than the largest capture size runs eagerly and its
  call passes ``max_num_splits`` 0 (set only when ``num_actual_tokens <= max_cudagraph_size``): qwen3-30b-a3b at tp 8
  (4 heads on 1, d 128), ``seq_lens`` [769, 512], query lengths [1, 512]: 7 splits for batch 0 against S_c 6.
"""

import json
from pathlib import Path

import pytest

from refmodel import call_inputs, precompute_inputs, resolve_schedule
from refmodel.fa3_builds import VLLM_FORK_8798F277
from refmodel.prepare import prepare_scheduler
from spec import invariants
from vllm_split_findings import replay_on_release

ROOT = Path(__file__).resolve().parents[2]
CAPTURED = ROOT / "tests" / "corpus_vllm" / "vllm-0.9.1-full-graph-replay-splits-above-the-captured-call.json"
ABOVE = ROOT / "tests" / "corpus_vllm" / "vllm-0.10.0-above-captured-graphs-precompute-max-num-splits.json"


def _replay_verdict(captured_seqlen_q: int) -> list:
    lens = [1, 8449, 1, 1, 1, 1, 1, 1]
    pre = resolve_schedule(precompute_inputs(8, 1, 8449, 71, 1, 64, varlen_q=True, page_size=16, causal=True,
                                             build=VLLM_FORK_8798F277))
    result = prepare_scheduler(pre, lens, seqlens_q=[1] * 8)
    call = resolve_schedule(call_inputs(8, captured_seqlen_q, 32768, 71, 1, 64, varlen_q=True, page_size=16,
                                        causal=True, total_q=8, build=VLLM_FORK_8798F277))
    assert pre.metadata_size == call.metadata_size == 9
    return [v.invariant for v in invariants.check_all(pre, result, call, {"seqused_k": lens, "seqlens_q": [1] * 8})]


def test_0_9_1_a_replay_precomputes_more_splits_than_the_captured_call_holds():
    assert _replay_verdict(8) == ["SPLIT_BOUND"]


def test_control_a_call_with_the_replays_own_split_count_passes():
    # the same metadata read by a call whose heuristic sees the replay's scalars (max_seqlen_q 1: 109 splits)
    assert _replay_verdict(1) == []


def _above_verdict(call_num_splits: int) -> list:
    lens, qlens = [769, 512], [1, 512]
    pre = resolve_schedule(precompute_inputs(2, 512, 769, 4, 1, 128, varlen_q=True, page_size=16, causal=True,
                                             num_splits=16, build=VLLM_FORK_8798F277))
    result = prepare_scheduler(pre, lens, seqlens_q=qlens)
    assert result.num_splits == [7, 4]
    call = resolve_schedule(call_inputs(2, 512, 769, 4, 1, 128, varlen_q=True, page_size=16, causal=True,
                                        num_splits=call_num_splits, total_q=513, build=VLLM_FORK_8798F277))
    return [v.invariant for v in invariants.check_all(pre, result, call, {"seqused_k": lens, "seqlens_q": qlens})]


def test_0_10_0_a_batch_above_the_captured_graphs_calls_with_fewer_splits_than_precomputed():
    assert _above_verdict(0) == ["SPLIT_BOUND"]


def test_control_the_call_passing_the_precomputes_bound_passes():
    assert _above_verdict(16) == []


@pytest.mark.parametrize("path, release, invariant", [(CAPTURED, "0.9.1", "SPLIT_BOUND"),
                                                      (ABOVE, "0.10.0", "SPLIT_BOUND")])
def test_the_case_files_name_the_finding_and_the_release(path, release, invariant):
    case = json.loads(path.read_text())
    assert case["engine"] == {"name": "vllm", "release": release}
    assert case["expected"]["outcome"] == "violation" and case["expected"]["invariant"] == invariant
    assert case["server"]["cuda_graph"] is True


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("path, release, code", [(CAPTURED, "0.9.1", 1), (CAPTURED, "0.9.2", 0),
                                                 (ABOVE, "0.10.0", 1), (ABOVE, "0.11.0", 0)])
def test_the_case_files_replay_on_their_release_and_the_fix(path, release, code):
    r = replay_on_release(path, release)
    assert r.returncode == code, r.stdout + r.stderr
    assert ("verdict: STILL FAILS" if code else "verdict: PASSES NOW") in r.stdout
