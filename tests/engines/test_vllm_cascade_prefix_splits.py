"""vLLM 0.10.1 .. 0.11.0: cascade attention under a full CUDA graph mode, judged under their own FA3 build.

With a full CUDA graph mode and a step within the largest capture size, the builder precomputes both cascade
schedules with ``num_splits = max_num_splits`` (16 in 0.10.x, 32 in 0.11.0; vllm/v1/attention/backends/
flash_attn.py@0.11.0 262-269, 293), but ``cascade_attention`` calls ``flash_attn_varlen_func`` for the shared prefix
without ``num_splits`` (@0.11.0 742), so FA3 sizes the call's partial buffers with its own heuristic while reading the
precomputed split counts (the build these releases ship, vllm-fork-2d3b7508: the num_splits argument 0 is not 1, so
the vector is read). 0.11.1 passes ``num_splits=max_num_splits`` to both cascade calls (@0.11.1 999, 1024).

The model-level test pins the class in milliseconds (negative control: the call given the precompute's bound passes);
the case file ``tests/corpus_vllm/vllm-0.11.0-cascade-prefix-call-default-splits.json`` replays it on the release
(slow, and only with the release's engine environment).
"""

import json
from pathlib import Path

import pytest

from refmodel.fa3_builds import VLLM_FORK_2D3B7508
from vllm_split_findings import replay_on_release, varlen_verdict

ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / "tests" / "corpus_vllm" / "vllm-0.11.0-cascade-prefix-call-default-splits.json"
PREFIX, ROWS = 2048, 47  # the shared prefix; the step's query rows (seven decodes and a 40-token chunk)


def _verdict(call_num_splits: int, max_num_splits: int = 32) -> list:
    # the prefix call of llama-3-8b at tp 8 (4 query heads, 1 KV head per rank): one row of the batch, non-causal;
    # metadata of 2 slots on both sides (the semaphore and one split count): no SHAPE error
    return varlen_verdict([PREFIX], [ROWS], 4, 1, 128, causal=False, build=VLLM_FORK_2D3B7508,
                          precompute_splits=max_num_splits, call_splits=call_num_splits, metadata_size=2)


def test_the_cascade_prefix_call_without_num_splits_overflows_its_partial_buffers():
    for bound in (16, 32):  # 0.10.x's bound, 0.11.0's
        found = _verdict(0, bound)
        assert [v.invariant for v in found] == ["SPLIT_BOUND"], bound
        assert found[0].detail["metadata_splits"] == 16 and found[0].detail["call_splits"] == 14


def test_negative_control_the_prefix_call_with_the_precomputes_num_splits_passes():
    # 0.11.1's fix: num_splits=max_num_splits on both cascade calls
    assert _verdict(32) == []


def test_the_case_file_names_the_finding_and_the_release():
    case = json.loads(CASE.read_text())
    assert case["engine"] == {"name": "vllm", "release": "0.11.0"}
    assert case["expected"]["outcome"] == "violation" and case["expected"]["invariant"] == "SPLIT_BOUND"
    assert case["options"]["vllm"]["common_prefix"] == PREFIX and case["server"]["cuda_graph"] is True
    assert sum(case["batches"][0]["extend_lens"]) == ROWS


@pytest.mark.slow
@pytest.mark.engine
def test_the_case_still_fails_on_vllm_0_11_0():
    r = replay_on_release(CASE, "0.11.0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "verdict: STILL FAILS" in r.stdout and "SPLIT_BOUND" in r.stdout
