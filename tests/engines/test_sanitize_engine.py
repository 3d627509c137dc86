"""fa3verify.sanitize inside a real sglang engine: the release's own FlashAttentionBackend, FA3 served by plain
emulator-backed stand-ins (no checking shim), the sanitizer installed from FA3VERIFY_SANITIZE as in a user's run.

The worked example (prefill CP, tp 4 = attn_cp 4, Qwen3-30B-A3B, one 32768-token sequence and seven of 100):
0.5.13 precomputes with (8, 1) heads and the sanitizer raises SPLIT_BOUND (S_p 109 vs S_c 29) before the call runs,
writing a case that replays to the same verdict; 0.5.23 runs clean. Marked ``engine``; skipped (with the reason)
when the cached environment of a release is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_impl.config import ServerConfig, get_model
from gpu_impl.engines import envs
from gpu_impl.scenario import Scenario, Step

REPO = Path(__file__).resolve().parents[2]
OLD, NEW = "0.5.13", "0.5.23"
QWEN = get_model("qwen3-30b-a3b")
SKEWED = [32768] + [100] * 7

pytestmark = pytest.mark.engine


def prefill_cp(cuda_graph: bool = False) -> ServerConfig:
    return ServerConfig(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag",
                        cuda_graph=cuda_graph, context_length=40960)


def plain_tp(cuda_graph: bool = False) -> ServerConfig:
    return ServerConfig(tp_size=4, cuda_graph=cuda_graph, context_length=40960)


def scenario(server: ServerConfig, *batches) -> Scenario:
    return Scenario(server=server, model=QWEN, guard=None, steps=[Step("decode", list(b)) for b in batches])


def _sanitized(release: str, out_dir: Path, install: str = "start", causes: bool = True):
    if not envs.env_ready(release):
        pytest.skip(f"the engine environment of sglang {release} is not built ({envs.env_dir(release)}); "
                    f"build it with `python -m gpu_impl.engines.envs {release}`")
    from fa3verify.sanitize.engine import open_sanitized

    sut = open_sanitized(f"sglang=={release}", "raise", out_dir=out_dir, install=install, causes=causes)
    sut.start()
    return sut


@pytest.fixture(scope="module")
def san_old(tmp_path_factory):
    """The old release under the sanitizer's overflow checks alone (no cause check): what each of sglang's paths
    overflows, eager and at a CUDA-graph replay (the cause: test_old_release_the_cause_is_reported_...)."""
    sut = _sanitized(OLD, tmp_path_factory.mktemp("san-old"), causes=False)
    yield sut
    sut.close()


@pytest.fixture(scope="module")
def san_new(tmp_path_factory):
    sut = _sanitized(NEW, tmp_path_factory.mktemp("san-new"))
    yield sut
    sut.close()


def _sanitizer_findings(result):
    return [f for f in result.findings if f.detail.get("source") == "sanitizer"]


def test_old_release_the_sanitizer_raises_the_worked_example_and_writes_a_replayable_case(san_old):
    result = san_old.run(scenario(prefill_cp(), SKEWED))
    (finding,) = _sanitizer_findings(result)
    assert finding.invariant == "SPLIT_BOUND" and finding.detail["path"] == "eager"
    assert "S_p=109 S_c=29" in finding.message and "MetadataMismatch" not in finding.message
    assert (finding.detail["s_p"], finding.detail["s_c"]) == (109, 29)
    assert (finding.detail["precompute"]["num_heads"], finding.detail["precompute"]["num_heads_k"]) == (8, 1)
    assert (finding.detail["call"]["num_heads"], finding.detail["call"]["num_heads_k"]) == (32, 4)
    (entry,) = result.trace
    assert entry["raised"] == "MetadataMismatch"   # raised before the kernel ran: the emulator saw no call
    status = san_old.observed
    assert status["violation_events"] == 1 and status["checked_calls"] == 1 and status["unreachable"] == []
    case_path = finding.detail["case_path"]
    assert case_path and case_path in status["files"] and Path(case_path).exists()
    case = json.loads(Path(case_path).read_text())
    assert case["expected"]["invariant"] == "SPLIT_BOUND" and case["batches"][0]["seq_lens"] == SKEWED
    assert (case["expected"]["detail"]["S_p"], case["expected"]["detail"]["S_c"]) == (109, 29)
    replay = subprocess.run([sys.executable, "-m", "fa3verify", "replay", case_path],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600)
    assert replay.returncode == 1 and "STILL FAILS" in replay.stdout and "SPLIT_BOUND" in replay.stdout, \
        replay.stdout + replay.stderr


def test_old_release_the_sanitizer_wrapped_what_sglangs_dispatcher_holds(san_old):
    status = san_old.observed
    assert {"sgl_kernel.flash_attn.get_scheduler_metadata", "sgl_kernel.flash_attn.flash_attn_with_kvcache",
            "sglang.jit_kernel.flash_attention_v3.flash_attn_with_kvcache"} <= set(status["wrapped"])
    # the dispatcher (<= 0.5.17: sglang.jit_kernel.flash_attention) bound flash_attention_v3's function at import:
    # installed at start, what it bound is the wrapper
    assert status["rebinder_bindings"]["sglang.jit_kernel.flash_attention"] == {"fa3_flash_attn_with_kvcache": "checked"}
    assert status["install"] == "start"


def test_old_release_plain_tp_passes_with_every_call_checked(san_old):
    """Positive control on the same release: without CP the precompute's heads are the layer's."""
    before = san_old.observed["checked_calls"]
    result = san_old.run(scenario(plain_tp(), SKEWED, [300, 200, 100]))
    assert result.ok, result.findings
    assert san_old.observed["checked_calls"] == before + 2 and san_old.observed["violation_events"] == 1
    assert all(e["metadata_passed"] and e["plan_violations"] == [] for e in result.trace)


def test_old_release_cuda_graph_replay_stale_recompute_is_caught_before_the_replay(san_old):
    result = san_old.run(scenario(prefill_cp(cuda_graph=True), SKEWED))
    (finding,) = _sanitizer_findings(result)
    assert finding.invariant == "SPLIT_BOUND" and finding.detail["path"] == "replay"
    assert (finding.detail["s_p"], finding.detail["s_c"]) == (109, 29)
    assert san_old.observed["graph_checks"] >= 1


def test_old_release_padded_graph_replay_is_checked(san_old):
    """Five real rows in the graph captured for eight: sglang recomputes for the padded batch (its padding rows
    have length 1), so the recompute has the captured call's batch size and is checked; short rows are safe."""
    checks = san_old.observed["graph_checks"]
    result = san_old.run(scenario(prefill_cp(cuda_graph=True), [300, 200, 100, 100, 100]))
    assert result.ok, result.findings
    assert san_old.observed["graph_checks"] > checks and san_old.observed["graph_unmatched"] == 0


def test_new_release_runs_clean_and_its_dispatcher_holds_the_wrapper(san_new):
    for server in (prefill_cp(), prefill_cp(cuda_graph=True)):
        result = san_new.run(scenario(server, SKEWED))
        assert result.ok and not result.shape_errors, result.findings
        assert all(not e["metadata_passed"] for e in result.trace)   # the guard: no precompute under prefill CP
    result = san_new.run(scenario(plain_tp(), SKEWED))               # heads from attn_tp_size: checked, passes
    assert result.ok and all(e["metadata_passed"] for e in result.trace)
    status = san_new.observed
    assert status["violation_events"] == 0 and status["checked_calls"] >= 1 and status["files"] == []
    assert "sglang.kernels.ops.attention.flash_attention_v3.flash_attn_with_kvcache" in status["wrapped"]
    assert status["rebinder_bindings"]["sglang.kernels.ops.attention.flash_attention"] == {
        "fa3_flash_attn_with_kvcache": "checked"}


def test_installed_late_the_sanitizer_replaces_the_dispatchers_binding_and_still_catches(tmp_path):
    sut = _sanitized(OLD, tmp_path / "late", install="late")
    try:
        status = sut.observed
        assert "module sglang.jit_kernel.flash_attention: fa3_flash_attn_with_kvcache" in status["patched_bindings"]
        assert status["rebinder_bindings"]["sglang.jit_kernel.flash_attention"] == {
            "fa3_flash_attn_with_kvcache": "checked"}
        result = sut.run(scenario(prefill_cp(), SKEWED))
    finally:
        sut.close()
    (finding,) = _sanitizer_findings(result)
    assert finding.invariant == "SPLIT_BOUND" and "S_p=109 S_c=29" in finding.message


def test_old_release_the_cause_is_reported_on_a_batch_that_does_not_overflow(tmp_path):
    """The default sanitizer (cause check on) on the old release: under prefill CP a batch of [4000, 100] gives
    S_p = S_c = 28 -- no overflow -- and is reported as PRECOMPUTE_ARGUMENTS with the heads (8, 1) vs (32, 4),
    eager and at a CUDA graph's capture; plain TP (the precompute's heads are the layer's) passes."""
    sut = _sanitized(OLD, tmp_path / "causes")
    try:
        eager = sut.run(scenario(prefill_cp(), [4000, 100]))
        graph = sut.run(scenario(prefill_cp(cuda_graph=True), [4000, 100]))
        plain = sut.run(scenario(plain_tp(), [4000, 100]))
    finally:
        sut.close()
    for result, path in ((eager, "eager"), (graph, "capture")):
        (finding,) = _sanitizer_findings(result)
        assert finding.invariant == "PRECOMPUTE_ARGUMENTS" and finding.detail["path"] == path, finding
        (v,) = finding.detail["violations"]
        diffs = {d["argument"]: (d["precompute"], d["call"]) for d in v["detail"]["differences"]}
        assert diffs == {"num_heads": (8, 32), "num_heads_k": (1, 4)}
    assert (eager.findings[0].detail["s_p"], eager.findings[0].detail["s_c"]) == (28, 28)
    assert plain.ok, plain.findings


def test_a_bad_sanitizer_option_is_refused_before_anything_starts():
    from fa3verify.sanitize.engine import open_sanitized

    with pytest.raises(ValueError, match="mode: must be one of raise, warn, record"):
        open_sanitized(f"sglang=={OLD}", "loud")
    with pytest.raises(ValueError, match="install: must be one of start, late"):
        open_sanitized(f"sglang=={OLD}", "raise", install="never")


def test_the_sanitizer_imports_in_an_engine_environment_without_the_projects_other_dependencies():
    """The engine environment holds torch and sglang only (no z3, no hypothesis): the sanitizer and its engine
    worker import there from the project on PYTHONPATH, and load none of the project's heavier dependencies."""
    if not envs.env_ready(OLD):
        pytest.skip(f"the engine environment of sglang {OLD} is not built ({envs.env_dir(OLD)})")
    code = ("import importlib.util, sys; assert importlib.util.find_spec('z3') is None; "
            "import fa3verify.sanitize.core, fa3verify.sanitize.engine_worker, fa3verify.sanitize.records; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'z3', 'hypothesis', 'rich', 'sglang'}))")
    out = subprocess.run([str(envs.env_python(OLD)), "-c", code], env=envs.driver_environ(), capture_output=True,
                         text=True, timeout=300, cwd=str(REPO))
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
