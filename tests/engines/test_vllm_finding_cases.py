"""The case files of docs/engines-vllm.md "Findings, for vLLM's maintainers": each names its release and the finding
it records (fast), and, where the release's engine environment is built, replays STILL FAILS on a release that has
the finding and PASSES NOW on its fix release, as the section prints the commands; a case of a difference judged
harmless (finding 8, the padded-rows replay) expects a pass and replays PASSES (as expected) on the releases that have
it (slow: one replay is 20-40 s with the worker's start; the findings themselves are pinned fast by
tests/engines/test_engine_vllm_v0.py, test_vllm_v0_full_graph_splits.py, test_vllm_dcp_context_splits.py,
test_vllm_front_attribution.py, test_padded_replay_judge.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
VLLM = ROOT / "tests" / "corpus_vllm"
LIFECYCLE = ROOT / "tests" / "corpus_lifecycle"

#: case file -> (the release it names, the invariant it expects; None: the case expects a pass)
CASES = {
    VLLM / "vllm-0.8.5-precompute-without-window-split-bound.json": ("0.8.5", "SPLIT_BOUND"),
    VLLM / "vllm-0.8.5-precompute-without-window-shared-precompute.json": ("0.8.5", "SHARED_PRECOMPUTE_MATCHES_LAYER"),
    VLLM / "v2-runner-mixed-full-graph-captured-for-one-token-queries-0.30.0.json": ("0.30.0", "SHAPE"),
    VLLM / "v2-runner-full-graph-replay-fewer-requests-than-captured-0.17.1.json": ("0.17.1", "SHAPE"),
    # a FULL-graph replay over fewer rows than captured, judged harmless under the build 0.16.0 ships (finding 8)
    LIFECYCLE / "vllm-0.16.0-full-graph-padded-rows.json": ("0.16.0", None),
    VLLM / "vllm-0.33.0-diffkv-precompute-without-headdim-v-block-256.json": ("0.33.0", "SPLIT_BOUND"),
    VLLM / "vllm-0.19.1-batch-invariant-layers-precompute-model-config-kv-heads.json": ("0.19.1", "QUERY_COVER"),
    VLLM / "vllm-0.9.2-full-graph-chunked-local-replay-reads-capture-metadata.json": ("0.9.2", "READS_OWN_STEP_METADATA"),
    # DCP's skipped context attention at a FULL replay over shorter queries' metadata (finding 7)
    VLLM / "vllm-0.34.0-dcp-full-graph-skipped-context-query-rows.json": ("0.34.0", "QUERY_COVER"),
    VLLM / "v2-runner-dcp-full-graph-skipped-context-query-rows-0.33.0.json": ("0.33.0", "QUERY_COVER"),
    # the V2 drafter's FULL draft-decode graph: its first draft step reads a host build in another layout (finding 15)
    VLLM / "v2-drafter-full-graph-replay-window-dropped-0.31.0.json": ("0.31.0", "SHAPE"),
}

#: (case file, release, exit code of the replay): the finding's releases and its fix, as the docs name them
REPLAYS = [
    (VLLM / "vllm-0.8.5-precompute-without-window-split-bound.json", "0.8.5", 1),
    (VLLM / "vllm-0.8.5-precompute-without-window-split-bound.json", "0.8.5.post1", 0),
    (VLLM / "vllm-0.8.5-precompute-without-window-shared-precompute.json", "0.8.5", 1),
    (VLLM / "vllm-0.8.5-precompute-without-window-shared-precompute.json", "0.8.5.post1", 0),
    (VLLM / "full-graph-replay-window-dropped-at-recompute.json", "0.16.0", 0),
    (VLLM / "full-graph-replay-window-dropped-at-recompute.json", "0.17.0", 1),
    (LIFECYCLE / "vllm-0.16.0-full-graph-padded-rows.json", "0.11.1", 0),
    (LIFECYCLE / "vllm-0.16.0-full-graph-padded-rows.json", "0.13.0", 0),
    (LIFECYCLE / "vllm-0.16.0-full-graph-padded-rows.json", "0.16.0", 0),
    (LIFECYCLE / "vllm-0.16.0-full-graph-padded-rows.json", "0.17.0", 0),
    (VLLM / "vllm-0.33.0-diffkv-precompute-without-headdim-v-block-256.json", "0.33.0", 1),
    (VLLM / "vllm-0.19.1-batch-invariant-layers-precompute-model-config-kv-heads.json", "0.17.0", 1),
    (VLLM / "vllm-0.19.1-batch-invariant-layers-precompute-model-config-kv-heads.json", "0.19.1", 1),
    (VLLM / "vllm-0.19.1-batch-invariant-layers-precompute-model-config-kv-heads.json", "0.20.0", 0),
    (VLLM / "vllm-0.9.2-full-graph-chunked-local-replay-reads-capture-metadata.json", "0.9.1", 1),
    (VLLM / "vllm-0.9.2-full-graph-chunked-local-replay-reads-capture-metadata.json", "0.9.2", 1),
    (VLLM / "vllm-0.9.2-full-graph-chunked-local-replay-reads-capture-metadata.json", "0.10.0", 0),
    (VLLM / "vllm-0.13.0-dcp-batch-invariant-context-call-metadata-shape.json", "0.13.0", 1),
    (VLLM / "vllm-0.13.0-dcp-batch-invariant-context-call-metadata-shape.json", "0.17.0", 0),
    (VLLM / "v2-runner-full-graph-replay-fewer-requests-than-captured-0.17.1.json", "0.17.0", 1),
    (VLLM / "v2-runner-full-graph-replay-fewer-requests-than-captured-0.17.1.json", "0.17.1", 1),
    (VLLM / "v2-runner-full-graph-replay-fewer-requests-than-captured-0.17.1.json", "0.18.0", 0),
    (VLLM / "vllm-0.34.0-dcp-full-graph-skipped-context-query-rows.json", "0.25.1", 0),
    (VLLM / "vllm-0.34.0-dcp-full-graph-skipped-context-query-rows.json", "0.26.0", 1),
    (VLLM / "vllm-0.34.0-dcp-full-graph-skipped-context-query-rows.json", "0.34.0", 1),
    (VLLM / "v2-drafter-full-graph-replay-window-dropped-0.31.0.json", "0.31.0", 1),
    (VLLM / "v2-drafter-full-graph-replay-window-dropped-0.31.0.json", "0.32.0", 0),
]


@pytest.mark.parametrize("path", sorted(CASES), ids=lambda p: p.name)
def test_each_case_file_names_its_release_and_finding(path):
    release, invariant = CASES[path]
    case = json.loads(path.read_text())
    assert case["engine"] == {"name": "vllm", "release": release}
    if invariant is None:
        assert case["expected"]["outcome"] == "pass" and case["expected"]["invariant"] is None
    else:
        assert case["expected"]["outcome"] == "violation" and case["expected"]["invariant"] == invariant


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.parametrize("path, release, code", REPLAYS, ids=lambda v: getattr(v, "name", str(v)))
def test_each_case_replays_as_the_docs_print_it(path, release, code):
    from engine_releases import need_vllm

    need_vllm(release)  # $FA3VERIFY_ENGINE_HOME or the default home, as the replay sees it
    r = subprocess.run([sys.executable, "-m", "fa3verify", "replay", str(path.relative_to(ROOT)), "--engine",
                        f"vllm=={release}"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == code, r.stdout + r.stderr
    passes = "verdict: PASSES (as expected)" if CASES.get(path, ("", ""))[1] is None else "verdict: PASSES NOW"
    assert ("verdict: STILL FAILS" if code else passes) in r.stdout
