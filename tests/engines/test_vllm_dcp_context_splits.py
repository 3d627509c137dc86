"""vLLM 0.11.1 .. 0.16.0 with decode context parallelism under full CUDA graphs, judged under their own FA3 build.

The builder precomputes the DCP context attention's metadata with ``num_splits = max_num_splits`` (32 under full
graphs; vllm/v1/attention/backends/flash_attn.py@0.13.0 ``schedule``), but ``FlashAttentionImpl._forward_with_dcp``
calls ``flash_attn_varlen_func`` for the context without ``num_splits``, so FA3 sizes the call's partial buffers with
its own heuristic. Under vllm-fork-a8937124 (the build these releases ship, refmodel/fa3_builds.json) the precomputed
dynamic split vector is read by the call (flash_api.cpp@a8937124 994-1028: the argument 0 is not 1, so the vector is
used): a batch with more splits than the call's S_c writes and reads past the buffers (SPLIT_BOUND). 0.17.0 passes
``num_splits=attn_metadata.max_num_splits`` in that call. Before the build was read these releases' full-graph steps
stopped inconclusive (their 257-slot buffer against the modelled build's 385), so this was never reached.

The model-level test pins the class in milliseconds; the case file
``tests/corpus_vllm/vllm-0.13.0-dcp-full-graph-context-call-default-splits.json`` replays it on the release (slow, and
only with the release's engine environment).
"""

import json
from pathlib import Path

import pytest

from refmodel.fa3_builds import VLLM_FORK_A8937124
from vllm_split_findings import replay_on_release, varlen_verdict

ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / "tests" / "corpus_vllm" / "vllm-0.13.0-dcp-full-graph-context-call-default-splits.json"
LENS = [100, 2000, 300, 40]


def _verdict(call_num_splits: int) -> list:
    # the context attention of starcoder at tp 2, DCP 2: 24 heads per rank gathered over DCP = 48 query heads, 1 KV head
    # metadata of 5 slots on both sides (the semaphore and 4 split counts): no SHAPE error
    return varlen_verdict(LENS, [1] * 4, 48, 1, 128, build=VLLM_FORK_A8937124, precompute_splits=32,
                          call_splits=call_num_splits, metadata_size=5)


def test_the_dcp_context_call_without_num_splits_overflows_its_partial_buffers():
    found = _verdict(0)
    assert [v.invariant for v in found] == ["SPLIT_BOUND"]
    assert found[0].detail["metadata_splits"] == 16 and found[0].detail["call_splits"] == 14


def test_negative_control_the_call_with_the_precomputes_num_splits_passes():
    # 0.17.0's fix: num_splits=attn_metadata.max_num_splits on the context call
    assert _verdict(32) == []


def test_the_case_file_names_the_finding_and_the_release():
    case = json.loads(CASE.read_text())
    assert case["engine"] == {"name": "vllm", "release": "0.13.0"}
    assert case["expected"]["outcome"] == "violation" and case["expected"]["invariant"] == "SPLIT_BOUND"
    assert (case["server"]["attn_cp_size"], case["server"]["tp_size"], case["server"]["cuda_graph"]) == (2, 2, True)


@pytest.mark.slow
@pytest.mark.engine
def test_the_case_still_fails_on_vllm_0_13_0():
    r = replay_on_release(CASE, "0.13.0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "verdict: STILL FAILS" in r.stdout and "SPLIT_BOUND" in r.stdout
