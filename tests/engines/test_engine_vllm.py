"""vLLM 0.33.0's FlashAttention backend as a system under test (gpu_impl/engines/vllm*.py).

The unit tests need nothing; those marked ``engine`` run vLLM's own metadata builder and attention impl in the
cached vLLM environment (``gpu_impl.engines.envs``, ``engine="vllm"``) and skip, naming how to build it, without one
(``FA3VERIFY_BUILD_ENGINES=1`` builds it in the session fixture). Numbers: the worked example of docs/facts-fa3.md
section 1 (H=32, Hk=4, tp=4 -> 8 and 1 heads per rank; one 32768-token sequence and seven of 100).
"""

import os

import pytest

from gpu_impl.engines import envs
from gpu_impl.engines.vllm import driver as vllm_driver
from gpu_impl.engines.errors import UnknownRelease

RELEASE = "0.33.0"
SKEWED = [32768] + [100] * 7


# ---------------------------------------------------------------- unit: no environment needed


def test_scenario_defaults_fill_in_and_bad_fields_are_named():
    s = vllm_driver.check_scenario({"steps": [{"seq_lens": [5, 9]}]})
    assert s["steps"][0]["query_lens"] == [1, 1] and s["cuda_graph"] == "none"
    for bad, field in (({"tp": 0}, "tp:"), ({"cuda_graph": "sometimes"}, "cuda_graph:"),
                       ({"kv_cache_dtype": "int4"}, "kv_cache_dtype:"), ({"frobnicate": 1}, "unknown field"),
                       ({"steps": [{"seq_lens": [4], "query_lens": [5]}]}, "steps[0].query_lens"),
                       ({"steps": [{"seq_lens": [10 ** 6]}]}, "steps[0].seq_lens"),
                       ({"num_layers": 2, "sliding_window": [4096]}, "sliding_window:"),
                       ({"defect": {"precompute_num_splits": -1}}, "defect:"),
                       ({"steps": [{"seq_lens": [9000], "query_lens": [9000]}]}, "max_num_batched_tokens")):
        with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
            vllm_driver.check_scenario(bad)


def test_unknown_release_is_refused_naming_the_registered_ones():
    with pytest.raises(UnknownRelease, match="0.33.0"):
        envs.check_release("0.1.0", engine="vllm")


def test_scenario_mapping_from_the_suite_vocabulary():
    from gpu_impl.engines.vllm.host import scenario_to_vllm
    from gpu_impl.scenario import Step
    from spec.model.config import ModelConfig, ServerConfig

    class Scn:
        server = ServerConfig(tp_size=4, attn_cp_size=2, cuda_graph=True, page_size=1)
        model = ModelConfig(name="m", num_heads=32, num_kv_heads=4, head_dim=128)
        steps = [Step(mode="decode", seq_lens=[9, 3])]

    out = scenario_to_vllm(Scn)
    assert (out["tp"], out["dcp"], out["cuda_graph"], out["block_size"]) == (4, 2, "full", 16)
    assert out["steps"] == [{"seq_lens": [9, 3]}]
    vllm_driver.check_scenario(out)  # the mapping produces a scenario the driver accepts


# ---------------------------------------------------------------- engine: vLLM's own code


@pytest.fixture(scope="session")
def vllm_worker(engine_sut):
    if not envs.env_ready(RELEASE, engine="vllm"):
        if os.environ.get("FA3VERIFY_BUILD_ENGINES", "") in ("", "0"):
            pytest.skip(f"no environment for vllm {RELEASE} under {envs.env_dir(RELEASE, engine='vllm')}: set "
                        f"FA3VERIFY_BUILD_ENGINES=1 (and FA3VERIFY_VLLM_WHEEL=a local wheel) to build it")
    return engine_sut(f"vllm=={RELEASE}").worker  # the test process's shared worker (tests/engine_pool.py)


def _pairs(resp):
    return [e for e in resp["trace"] if "s_c" in e]


def _replayed(resp):
    """The one replayed pair of a one-step FULL-graph run: the V1 driver captures the graph (one capture-time pair, the
    capture's dummy batch) and replays it for the step (graphs.V1Graphs)."""
    pairs = _pairs(resp)
    assert [p["path"] for p in pairs] == ["full: capture", "full"], [p["path"] for p in pairs]
    return pairs[1]


@pytest.mark.engine
def test_eager_decode_runs_and_both_sides_agree(vllm_worker):
    resp = vllm_worker.run({"tp": 4, "steps": [{"seq_lens": SKEWED}]})
    (pair,) = _pairs(resp)
    assert pair["aot"] and pair["max_num_splits"] == 0
    assert (pair["precompute"]["num_heads"], pair["precompute"]["num_heads_k"]) == (8, 1)
    assert (pair["call"]["num_heads"], pair["call"]["num_heads_k"]) == (8, 1)
    assert pair["s_p"] == pair["s_c"] == 109
    assert resp["findings"] == [] and resp["shape_errors"] == []


@pytest.mark.engine
def test_full_cuda_graph_decode_uses_the_fixed_split_count_on_both_sides(vllm_worker):
    resp = vllm_worker.run({"tp": 4, "cuda_graph": "full", "steps": [{"seq_lens": SKEWED}]})
    pair = _replayed(resp)
    assert pair["max_num_splits"] == 32 and pair["precompute"]["num_splits"] == 32
    assert pair["call"]["num_splits"] == 32 and pair["call"]["batch_size"] == 8  # 8 is a capture size
    assert resp["findings"] == []


@pytest.mark.engine
def test_seeded_defect_precompute_split_count_differs_from_the_call_is_caught(vllm_worker):
    """vLLM #20301's shape: metadata computed with another max_num_splits than the call's (here the heuristic
    against the CUDA-graph 32) -- the real builder and impl run; the shim sees 86 splits for 32 buffers."""
    resp = vllm_worker.run({"tp": 4, "cuda_graph": "full", "defect": {"precompute_num_splits": 0},
                            "steps": [{"seq_lens": SKEWED}]})
    found = {f["invariant"] for f in resp["findings"]}
    assert "SPLIT_BOUND" in found
    pair = _replayed(resp)
    assert (pair["s_p"], pair["s_c"]) == (109, 32)
    fresh = vllm_worker.run({"tp": 4, "cuda_graph": "full", "steps": [{"seq_lens": SKEWED}]})
    assert fresh["findings"] == []  # the control: the same batch without the defect passes


@pytest.mark.engine
def test_batch_invariant_and_mixed_windows_turn_the_precompute_off(vllm_worker):
    bi = vllm_worker.run({"tp": 4, "batch_invariant": True, "steps": [{"seq_lens": SKEWED}]})
    (pair,) = _pairs(bi)
    assert not pair["aot"] and pair["call"]["num_splits"] == 1
    mixed = vllm_worker.run({"num_layers": 2, "sliding_window": [4096, None], "steps": [{"seq_lens": SKEWED}]})
    assert [p["aot"] for p in _pairs(mixed)] == [False, False]
    one = vllm_worker.run({"num_layers": 2, "sliding_window": 4096, "steps": [{"seq_lens": SKEWED}]})
    assert all(p["aot"] and p["precompute"]["window_size"] == p["call"]["window_size"] for p in _pairs(one))
    assert one["findings"] == []


@pytest.mark.engine
def test_fp8_cache_and_chunked_prefill_agree(vllm_worker):
    fp8 = vllm_worker.run({"tp": 4, "kv_cache_dtype": "fp8", "steps": [{"seq_lens": SKEWED}]})
    (pair,) = _pairs(fp8)
    assert "float8" in str(pair["precompute"]["qkv_dtype"]) and fp8["findings"] == []
    mixed = vllm_worker.run({"tp": 4, "steps": [{"seq_lens": [32768, 100, 100], "query_lens": [1, 37, 100]}]})
    assert mixed["findings"] == [] and _pairs(mixed)[0]["aot"]


@pytest.mark.engine
def test_piecewise_runs_attention_eagerly_on_unpadded_metadata(vllm_worker):
    """Under PIECEWISE the hidden states are padded to a capture size but the attention metadata is not
    (gpu_model_runner: pad_attn only under FULL): the heuristic (0) on both sides, the batch's own size."""
    lens = [300, 100, 5]
    pw = vllm_worker.run({"tp": 4, "cuda_graph": "piecewise", "steps": [{"seq_lens": lens}]})
    (pair,) = _pairs(pw)
    assert pair["path"] == "piecewise" and pair["aot"] and pair["max_num_splits"] == 0
    assert pair["call"]["batch_size"] == 3 and pair["call"]["num_splits"] == pair["precompute"]["num_splits"] == 0
    full = vllm_worker.run({"tp": 4, "cuda_graph": "full", "steps": [{"seq_lens": lens}]})
    pair = _replayed(full)
    assert pair["call"]["batch_size"] == 4 and pair["call"]["num_splits"] == 32  # FULL pads to the capture size
    assert pw["findings"] == full["findings"] == []


@pytest.mark.engine
def test_dcp_call_seqlen_k_is_the_passed_max_not_the_block_table_width(vllm_worker):
    """Under DCP the KV cache is sharded (AttentionSpec.dcp_sharded): each rank's block table holds
    max_model_len / dcp tokens (vLLM's max_num_blocks_per_req and get_block_table_width). Under vLLM's FA3 build the
    call's seqlen_k is the max_seqlen_k vLLM passes, not that width (flash_api.cpp@617264c1 835): the batch's
    longest sequence (under DCP the rank's), >= the precompute's per-rank upper bound (the harmless direction)."""
    one = vllm_worker.run({"tp": 4, "steps": [{"seq_lens": SKEWED}]})
    two = vllm_worker.run({"tp": 4, "dcp": 2, "steps": [{"seq_lens": SKEWED}]})
    assert one["fa3_build"] == two["fa3_build"] == "vllm-fork-617264c1"
    (one,), (two,) = _pairs(one), _pairs(two)
    assert one["call"]["seqlen_k"] == one["precompute"]["max_seqlen_k"] == max(SKEWED) == 32768
    assert two["precompute"]["max_seqlen_k"] == 16384 <= two["call"]["seqlen_k"] == 16384   # DCP: per-rank lengths
    assert two["s_p"] <= two["s_c"]


# ---------------------------------------------------------------- the release profile, checked against the code

def _profile():
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).resolve().parents[2] / "gpu_impl" / "engines" / "vllm" / "profiles.json").read_text())
    (prof,) = [p for p in data["releases"] if p["release"] == RELEASE]
    return prof


@pytest.mark.engine
def test_profile_conforms_to_the_released_code(vllm_worker):
    """Each claim of the vLLM profile, on the real builder and impl: heads equal on both sides (also under DCP),
    call seqlen_k >= precompute max_seqlen_k, the same split count on both sides in every mode."""
    prof = _profile()
    assert vllm_worker.hello["release"] == prof["reported_version"]
    for sc in ({"tp": 4}, {"tp": 4, "cuda_graph": "full"}, {"tp": 4, "dcp": 2}, {"tp": 8, "dcp": 4, "cuda_graph": "full"},
               {"tp": 4, "batch_invariant": True}):
        resp = vllm_worker.run({**sc, "steps": [{"seq_lens": SKEWED}]})
        for p in _pairs(resp):
            assert p["call"]["num_splits"] == prof["max_num_splits"]["batch_invariant"] or not sc.get("batch_invariant")
            if not p["aot"]:
                continue
            pre, call = p["precompute"], p["call"]
            assert prof["heads_equal"] == ((pre["num_heads"], pre["num_heads_k"]) == (call["num_heads"], call["num_heads_k"]))
            assert prof["seqlen_k_call_at_least_precompute"] == (call["seqlen_k"] >= pre["max_seqlen_k"])
            assert prof["same_num_splits_both_sides"] == (pre["num_splits"] == call["num_splits"])
            assert pre["headdim_v"] == pre["headdim"]  # never passed: the fork defaults it to headdim
            assert resp["findings"] == []


@pytest.mark.engine
def test_case_sliding_window_short_batch_replays(vllm_worker):
    """The campaign's one former difference (a case file of the one schema, fa3verify.case/1 with a ``vllm``
    object), settled under vLLM's FA3 build: the fork's call takes seqlen_k = max_seqlen_k (flash_api.cpp@617264c1
    835), so both sides resolve causal and the sizes agree; replayed by ``fa3verify replay`` on vllm==0.33.0."""
    from pathlib import Path

    from fa3verify.commands.replay import replay
    from gpu_impl.engines.vllm.host import VllmSUT
    from spec.model.cases import Case

    path = Path(__file__).parent.parent / "corpus_vllm" / "sliding-window-short-batch-causal-vs-local.json"
    case = Case.load(path)
    sut = VllmSUT(RELEASE)
    sut._worker = vllm_worker  # the session's worker: no second import
    summary, seen = replay(str(path), sut=sut)
    assert seen.outcome == case.expected["outcome"] == "pass" and seen.verdict == "PASSES (as expected)"
    assert seen.findings == [] and summary.exit_code == 0
    assert "[FA3 build vllm-fork-617264c1]" in summary.checks[0].message
    p = _pairs({"trace": seen.trace})[0]
    assert p["precompute"]["max_seqlen_k"] == case.expected["detail"]["precompute_max_seqlen_k"]
    assert p["call"]["seqlen_k"] == case.expected["detail"]["call_seqlen_k"]
    assert p["precompute"]["causal"] and p["call"]["window_size"][0] == 4095
    assert p["s_p"] == p["s_c"] == 1


def test_engine_spec_names_vllm_releases():
    from gpu_impl.sut import EngineSpecError, open_sut, parse_engine

    spec = parse_engine("vllm==0.33.0")
    assert (spec.kind, spec.release, str(spec)) == ("vllm", "0.33.0", "vllm==0.33.0")
    with pytest.raises(EngineSpecError, match="vllm==0.33.0"):
        parse_engine("vllm==latest")
    sut = open_sut(spec)  # lazy: no environment or worker until the first run
    assert sut.identity() == {"name": "vllm==0.33.0", "release": "0.33.0"}
    sut.close()
