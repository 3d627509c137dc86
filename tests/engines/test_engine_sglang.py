"""Real sglang as the system under test (gpu_impl.engines): released backends on CPU reproduce and fix the bug.

Marked ``engine``: a session fixture builds (once, cached under $FA3VERIFY_ENGINE_HOME or
~/.cache/fa3verify/engines) the environments of sglang 0.5.13 (heads from tp_size, guard only for DP attention)
and 0.5.23 (heads from attn_tp_size, guard for prefill CP and DP attention). The spec errors run without one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_impl.config import ServerConfig, get_model
from gpu_impl.engines import CheckoutImportError, NoPrecompute, UnknownRelease
from gpu_impl.scenario import Scenario, Step
from gpu_impl.sut import EngineSpecError, open_sut

OLD, NEW = "0.5.13", "0.5.23"
QWEN = get_model("qwen3-30b-a3b")
SKEWED = [32768] + [100] * 7


def prefill_cp(cuda_graph: bool = False) -> ServerConfig:
    return ServerConfig(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag",
                        cuda_graph=cuda_graph, context_length=40960)


def scenario(server: ServerConfig, *batches) -> Scenario:
    return Scenario(server=server, model=QWEN, guard=None, steps=[Step("decode", list(b)) for b in batches])


@pytest.fixture(scope="session")
def sut_old(engine_sut):
    return engine_sut(f"sglang=={OLD}")  # the test process's shared worker (tests/engine_pool.py)


@pytest.fixture(scope="session")
def sut_new(engine_sut):
    return engine_sut(f"sglang=={NEW}")


# -- spec errors (no environment needed) --------------------------------------------------------------------

def test_a_release_before_the_precompute_is_refused_with_the_reason():
    with pytest.raises(NoPrecompute, match=r"sglang 0\.5\.10 has no FA3 metadata precompute \(first in 0\.5\.11\)"):
        open_sut("sglang==0.5.10")
    with pytest.raises(NoPrecompute, match="nothing to gate"):
        open_sut("sglang==0.5.10.post1")


def test_an_unknown_release_is_refused_naming_the_registered_ones():
    with pytest.raises(UnknownRelease, match=r"not a release this suite knows \(registered: 0\.5\.11 \.\. 0\.5\.23\)"):
        open_sut("sglang==9.9.9")
    with pytest.raises(EngineSpecError):
        open_sut("sglang==bogus")


def test_engine_errors_are_spec_errors_so_the_cli_exits_2():
    assert issubclass(NoPrecompute, EngineSpecError) and issubclass(UnknownRelease, EngineSpecError)
    assert issubclass(CheckoutImportError, EngineSpecError)


def test_a_path_with_no_sglang_is_refused(tmp_path):
    with pytest.raises(CheckoutImportError, match="no sglang package"):
        open_sut(f"sglang-src={tmp_path}")


# -- the worked example on released code --------------------------------------------------------------------

@pytest.mark.engine
def test_old_release_reproduces_the_worked_example_under_prefill_cp(sut_old):
    result = sut_old.run(scenario(prefill_cp(), SKEWED))
    bound = [f for f in result.findings if f.invariant == "SPLIT_BOUND"]
    assert bound, result.findings
    d = bound[0].detail
    assert (d["s_p"], d["s_c"], d["path"]) == (109, 29, "eager")
    assert d["split_counts"][0] == 86 and d["seq_lens"] == SKEWED
    (entry,) = result.trace
    assert (entry["precompute"]["num_heads"], entry["precompute"]["num_heads_k"]) == (8, 1)
    assert (entry["call"]["num_heads"], entry["call"]["num_heads_k"]) == (32, 4)


@pytest.mark.engine
def test_new_release_passes_the_same_configuration(sut_new):
    result = sut_new.run(scenario(prefill_cp(), SKEWED))
    assert result.ok and result.outcome == "pass", result.findings
    (entry,) = result.trace
    assert entry["precomputed"] is False and entry["call"]["metadata_passed"] is False
    assert entry["s_c"] == 29


@pytest.mark.engine
def test_cuda_graph_capture_then_replays_with_other_batches(sut_old):
    result = sut_old.run(scenario(prefill_cp(cuda_graph=True), SKEWED, [300, 200, 100]))
    paths = [(e["step"], e["path"]) for e in result.trace]
    assert paths == [(0, "capture"), (0, "replay"), (1, "capture"), (1, "replay")]
    cap, rep = result.trace[0], result.trace[1]
    assert cap["precompute"]["max_seqlen_k"] == 1 and rep["precompute"]["max_seqlen_k"] == 32768
    assert rep["call"]["seqlen_k"] == 40960  # the captured call's page table spans the whole context
    assert {(f.invariant, f.detail["path"]) for f in result.findings} >= {("SPLIT_BOUND", "replay")}
    # the batch-4 replay of short rows does not overflow; its precompute still has the tp heads, not the layer's
    # (the lifecycle judge's SHARED_PRECOMPUTE_MATCHES_LAYER, at every launch of 0.5.13 under prefill CP)
    assert all(f.step == 0 for f in result.findings if f.invariant != "SHARED_PRECOMPUTE_MATCHES_LAYER")
    assert {f.invariant for f in result.findings if f.step == 1} == {"SHARED_PRECOMPUTE_MATCHES_LAYER"}


@pytest.mark.engine
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_dp_attention_idle_rank(sut_new, cuda_graph):
    server = ServerConfig(tp_size=4, dp_size=2, enable_dp_attention=True, cuda_graph=cuda_graph,
                          context_length=8192)
    result = sut_new.run(scenario(server, [5000]))
    ranks = sorted({e["dp_rank"] for e in result.trace})
    assert ranks == ([0, 1] if cuda_graph else [0])  # an idle rank replays the graph; eager it makes no call
    assert all(e["call"]["num_heads"] == 16 and e["call"]["num_heads_k"] == 2 for e in result.trace)
    assert result.ok


@pytest.mark.engine
def test_old_release_guard_disables_the_precompute_under_dp_attention(sut_old):
    server = ServerConfig(tp_size=4, dp_size=2, enable_dp_attention=True, context_length=40960)
    result = sut_old.run(scenario(server, SKEWED))
    assert result.ok and {e["precomputed"] for e in result.trace} == {False}


# -- a source checkout: 0.5.23 with the fix reverted must fail (the negative control) ------------------------

def _reverted_checkout(tmp_path: Path) -> Path:
    """0.5.23's installed sglang as a tree of links, with its backend patched at test time: heads from tp_size
    and the precompute guard removed (nothing of sglang is committed to this repository)."""
    from release_copies import patched_copy

    # each pattern must match the 0.5.23 backend once (else the release no longer contains it)
    patches = [(r"attention_tp_size = get_parallel\(\)\.attn_tp_size", "attention_tp_size = get_parallel().tp_size"),
               (r"return bool\(get_parallel\(\)\.enable_prefill_cp or get_parallel\(\)\.attn_dp_enabled\)",
                "return False")]
    return patched_copy(NEW, tmp_path / "sglang-reverted", patches)


@pytest.mark.engine
def test_new_release_with_the_fix_reverted_fails_as_a_source_checkout(sut_new, tmp_path):
    root = _reverted_checkout(tmp_path)
    sut = open_sut(f"sglang-src={root}")
    try:
        assert sut.identity()["name"] == "sglang-src" and sut.identity()["release"] == NEW
        assert sut.start()["path"].startswith(str(root))
        result = sut.run(scenario(prefill_cp(), SKEWED))
    finally:
        sut.close()
    bound = [f for f in result.findings if f.invariant == "SPLIT_BOUND"]
    assert bound and (bound[0].detail["s_p"], bound[0].detail["s_c"]) == (109, 29)


@pytest.mark.engine
def test_a_checkout_that_does_not_import_names_the_failing_import(sut_new, tmp_path):
    pkg = tmp_path / "broken" / "python" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "version.py").write_text('__version__ = "0.5.23"\n')
    (pkg / "__init__.py").write_text("import sglang_missing_dependency_xyz\n")
    sut = open_sut(f"sglang-src={pkg.parent}")
    with pytest.raises(CheckoutImportError, match="sglang_missing_dependency_xyz"):
        sut.start()
    sut.close()


# -- configurations come from the release ------------------------------------------------------------------

@pytest.mark.engine
def test_the_release_validates_configurations_with_its_own_server_args(sut_old, sut_new):
    for sut in (sut_old, sut_new):
        ok, message = sut.validate(prefill_cp(), QWEN)
        assert ok is True, message
        bad = ServerConfig(tp_size=4, attn_cp_size=3, enable_prefill_cp=True, cp_strategy="zigzag")
        ok, message = sut.validate(bad, QWEN)
        assert ok is False and "divisible by attn_cp_size" in message, message


@pytest.mark.engine
@pytest.mark.parametrize("which", ["old", "new"])
def test_deterministic_inference_reaches_the_backend_as_one_split(which, sut_old, sut_new):
    sut = sut_old if which == "old" else sut_new
    server = ServerConfig(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag",
                          enable_deterministic_inference=True, context_length=40960)
    result = sut.run(scenario(server, SKEWED))
    (entry,) = result.trace
    assert entry["call"]["num_splits"] == 1 and entry["s_c"] == 1
    # one split on both sides: no overflow is possible; the old release's precompute still has the tp heads (8, 1)
    # where the layer has (32, 4): the lifecycle judge's SHARED_PRECOMPUTE_MATCHES_LAYER, and nothing else
    found = {f.invariant for f in result.findings} | {f.invariant for f in result.shape_errors}
    assert found == ({"SHARED_PRECOMPUTE_MATCHES_LAYER"} if which == "old" else set())
