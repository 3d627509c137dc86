"""vLLM's paths per release (gpu_impl/engines/vllm/paths.py, paths.json): every path driven or not covered with its
reason on every release (negative control: a table with one path dropped is named), the labels a driven step carries,
the ``vllm-paths`` family and its case options; on a release with cascade attention (0.31.0), the release's own rule
decides cascade and both FA3 calls are judged against their own precomputes, drafter metadata goes through
``build_for_drafting``, DCP's skipped context is reached, and a copy with a one-path regression on cascade (its calls
pass half the split bound of their precomputes, tests/release_copies.py) is found where the release passes."""

from __future__ import annotations

import itertools
import random
import types

import pytest

from engine_releases import need_vllm

from gpu_impl.engines import envs
from gpu_impl.engines.vllm.paths import PATH_KEYS, missing_paths, release_paths, step_labels

CASCADE_RELEASE = "0.31.0"


def _registered_rows():
    from gpu_impl.engines.vllm.plugin import VllmPlugin

    return sorted({row for _, row in VllmPlugin().releases() if row is not None})


def test_every_path_is_driven_or_not_covered_with_a_reason_on_every_release():
    rows = _registered_rows()
    assert "0.31.0" in rows and "0.34.0" in rows
    for release in rows:
        table = release_paths(release)
        assert set(table) == set(PATH_KEYS), release
        assert missing_paths(table) == [], release
    assert release_paths("0.31.0")["cascade"] is None and release_paths("0.31.0")["drafter"] is None
    assert release_paths("0.32.0")["cascade"].startswith("not in this release")
    assert release_paths("0.34.0")["V2 runner"] is None and release_paths("0.34.0")["drafter"] is None  # drafter_v2
    assert release_paths("0.31.0")["V2 runner"] is None  # beside the V1 runner (releases.json v2_runner)
    assert release_paths("0.33.0")["V2 runner"] is None  # triton's active-driver query stood in (vllm_glue.FAKED)
    assert release_paths("0.25.1")["V2 runner"] is None and release_paths("0.18.0")["V2 runner"] is None
    assert release_paths("0.17.1")["V2 runner"] is None  # driver generation v2early (releases.json v2_runner)
    assert release_paths("0.12.0")["V2 runner"] is None  # driver generation v2first (releases.json v2_runner)
    assert release_paths("0.11.2")["V2 runner"].startswith("not in this release")
    assert release_paths("0.25.1")["DCP skipped context"].startswith("not in this release")
    assert release_paths("0.26.0")["DCP skipped context"] is None


def test_the_v2_drafter_is_a_path_of_its_own_driven_where_the_release_has_the_speculator():
    """``V2 drafter`` (drafter_v2): driven on 0.28.0 .. 0.34.0 (releases.json ``v2_runner.drafter``); on a release
    whose V2 runner is driven but has no such speculator, the measured reason (by an earlier driver generation: that
    generation's); where the V2 runner itself is not driven, that reason."""
    for release in ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"):
        assert release_paths(release)["V2 drafter"] is None, release
    assert "_fused_multi_step_decode" in release_paths("0.27.1")["V2 drafter"]  # measured: the driver's refusal
    assert "No module named 'vllm.v1.worker.gpu.spec_decode.autoregressive'" in release_paths("0.18.0")["V2 drafter"]
    # a V2 runner driven by an earlier generation (v2early, v2first): that generation's reason
    assert "driver generation v2early" in release_paths("0.17.1")["V2 drafter"]
    assert "driver generation v2first" in release_paths("0.12.0")["V2 drafter"]
    assert release_paths("0.10.0")["V2 drafter"].startswith("not driven: the V2 runner is not driven")
    # the speculator's FULL draft-decode graphs (drafter_graphs): wherever the V2 drafter is driven
    for release in ("0.28.0", "0.31.0", "0.33.0", "0.34.0"):
        assert release_paths(release)["V2 drafter FULL graph"] is None, release
    assert release_paths("0.27.1")["V2 drafter FULL graph"] == release_paths("0.27.1")["V2 drafter"]


def test_a_table_with_a_path_dropped_or_left_without_reason_is_named():
    table = release_paths("0.31.0")
    dropped = {k: v for k, v in table.items() if k != "cascade"}
    assert missing_paths(dropped) == ["cascade"]
    assert missing_paths({**table, "local attention": " "}) == ["local attention"]


def test_a_release_whose_runner_module_does_not_import_has_cascade_not_covered_never_a_crash(monkeypatch):
    """``paths.json`` ``runner_module_does_not_import``: a release listed there has cascade "not covered" with the
    import error, and its cascade rule is never imported (0, no step takes cascade); unlisted, the rule decides.
    0.10.1 .. 0.19.1 import the module since their rows install what it imports (recipes ``_RUNNER_MODULE``)."""
    from gpu_impl.engines.vllm import paths

    for release in ("0.10.1", "0.15.1", "0.16.0", "0.19.1"):
        assert release not in paths._DATA["runner_module_does_not_import"], release
        assert release_paths(release)["cascade"] is None, release
    error = "ModuleNotFoundError: No module named 'diskcache'"
    monkeypatch.setitem(paths._DATA, "runner_module_does_not_import",
                        {**paths._DATA["runner_module_does_not_import"], "0.19.1": error})
    assert release_paths("0.19.1")["cascade"] == ("not covered: the release's cascade rule lives in its V1 model "
                                                  f"runner module, which does not import in its environment ({error})")
    assert release_paths("0.19.0")["cascade"] is None

    class Rule:  # the runner class's rule: 7 shared tokens wherever it is asked
        @staticmethod
        def _compute_cascade_attn_prefix_len(self, num_scheduled_tokens, num_common_prefix_blocks):
            return 7

    imported = []
    monkeypatch.setattr(paths, "_runner_class", lambda: imported.append(1) or Rule)
    cfg = types.SimpleNamespace(s={"common_prefix": 512, "block_size": 16, "sliding_window": None, "num_sm": 132,
                                   "dcp": 1}, h=8, builder=types.SimpleNamespace(use_cascade_attention=None),
                                spec=None)
    for version, expected in (("0.19.1", 0), ("0.19.0", 7)):
        monkeypatch.setitem(__import__("sys").modules, "vllm", types.SimpleNamespace(__version__=version))
        assert paths.cascade_prefix_len(cfg, [16] * 8, [600] * 8) == expected, version
    assert imported == [1]  # the listed release never imported its runner module


def test_the_domain_reports_every_path_with_a_count_or_a_reason():
    from gpu_impl.engines.vllm.host import VllmSUT

    domain = VllmSUT(CASCADE_RELEASE).domain()  # no worker starts for the report
    assert domain.family == "vllm-paths-both-drafts" and VllmSUT("0.11.2").domain().family == "vllm-paths"
    assert VllmSUT("0.12.0").domain().family == VllmSUT("0.17.1").domain().family == "vllm-paths-both"
    assert VllmSUT("0.27.1").domain().family == "vllm-paths-both"  # its V2 runner's drafter is not driven
    report = domain.report({"cascade": 3, "eager": 5}, 8)
    assert all(k in report["reach"] for k in PATH_KEYS)
    assert report["reach"]["cascade"] == 3 and "cascade" not in report["not_covered"]
    assert all(k in report["not_covered"] for k in PATH_KEYS if report["reach"][k] == 0)
    assert report["not_covered"]["local attention"] == "reached by no case of this run"  # driven on 0.31.0
    assert release_paths("0.34.0")["local attention"] is None  # generation v2: the V2 runner's attention groups
    for release in ("0.8.5", "0.9.2", "0.10.0", "0.10.1", "0.33.0"):  # v0 (builder branch, 0.10.0's runner), v1
        assert release_paths(release)["local attention"] is None, release


def test_step_labels_name_the_graph_mode_cascade_dcp_and_the_drafter():
    from gpu_impl.engines.vllm.driver import check_scenario

    s = check_scenario({"cuda_graph": "full", "dcp": 2, "tp": 2, "steps": [{"seq_lens": [5]}]})
    md = types.SimpleNamespace(use_cascade=True, max_dcp_context_kv_len=0, scheduler_metadata=None)
    assert step_labels(s, [1, 1], [5, 5], md, "v1") == ["eager", "cascade", "DCP", "DCP skipped context"]
    assert step_labels(s, [1] * 600, [5] * 600, None, "v1") == ["full graph above captured sizes", "DCP"]
    assert step_labels(s, [1], [5], None, "v2", drafter=True) == ["drafter", "V2 drafter", "full graph", "DCP",
                                                                   "V2 runner"]
    assert "V2 drafter" not in step_labels(s, [1], [5], None, "v1", drafter=True)  # the V1 runner's build_for_drafting


def test_paths_family_keeps_the_vllm_draws_and_adds_prefixes_and_drafts():
    from gpu_impl.engines.vllm.strategies import SHARED_PREFIXES, vllm_case, vllm_paths_case

    shared = drafts = checked = 0
    for seed in itertools.count():
        if checked == 300:  # 300 cases that are not redrawn
            break
        plain, paths = vllm_case(random.Random(seed)), vllm_paths_case(random.Random(seed))
        if paths.options["vllm"].get("attention_chunk_size"):  # redrawn as a chunked-local model (test below)
            continue
        if paths.options["vllm"].get("layer_kv_heads") or paths.model.head_dim_v != paths.model.head_dim:
            continue  # redrawn as layers / K/V head sizes that differ (tests/engines/test_vllm_heterolayers.py)
        checked += 1
        assert (plain.server, plain.model, plain.seed) == (paths.server, paths.model, paths.seed)
        prefix = paths.options["vllm"].get("common_prefix", 0)
        if prefix:
            shared += 1
            assert prefix in SHARED_PREFIXES and not paths.options["vllm"].get("sliding_window")
            first = len(paths.steps) - len(plain.steps) - 1  # after DCP's fresh-prefill step, if one was drawn
            assert [st["seq_lens"] for st in paths.steps[first:-1]] == [
                [min(40960, k + prefix) for k in st["seq_lens"]] for st in plain.steps]
            cascade = paths.steps[-1]
            assert len(cascade["seq_lens"]) >= 8 and max(cascade["extend_lens"]) > 1
            assert min(k - q for k, q in zip(cascade["seq_lens"], cascade["extend_lens"])) >= prefix
        drafts += bool(paths.options["vllm"].get("draft_tokens"))
    assert 60 < shared < 120 and 40 < drafts < 120


def test_paths_family_draws_llama4_shaped_chunked_local_models():
    from gpu_impl.engines.vllm.host import scenario_to_vllm
    from gpu_impl.engines.vllm.scenario import check_scenario
    from gpu_impl.engines.vllm.strategies import CHUNK_SIZES, vllm_case, vllm_paths_case
    from gpu_impl.scenario import Step

    local = []
    for seed in range(300):
        plain, paths = vllm_case(random.Random(seed)), vllm_paths_case(random.Random(seed))
        opts = paths.options["vllm"]
        if not opts.get("attention_chunk_size"):
            continue
        local.append(paths)
        chunk = opts["attention_chunk_size"]
        assert chunk[:3] == [chunk[0]] * 3 and chunk[3] is None and chunk[0] in CHUNK_SIZES and opts["num_layers"] == 4
        assert (paths.model.num_heads, paths.model.num_kv_heads, paths.model.head_dim) == (40, 8, 128)
        assert not opts.get("sliding_window") and paths.server.attn_cp_size == 1
        assert not opts.get("common_prefix") and not opts.get("draft_tokens")
        assert (paths.steps[:-1], paths.seed, paths.server.tp_size) == (plain.steps, plain.seed, plain.server.tp_size)
        last = paths.steps[-1]
        assert min(last["seq_lens"]) > chunk[0] and 2 <= last["extend_lens"][0] <= 2048
        steps = [Step(st["mode"], list(st["seq_lens"]), st["extend_lens"]) for st in paths.steps]
        scn = types.SimpleNamespace(server=paths.server, model=paths.model, steps=steps, options=paths.options)
        s = check_scenario(scenario_to_vllm(scn))
        assert s["attention_chunk_size"] == chunk
    assert 5 < len(local) < 40
    assert any(c.server.cuda_graph for c in local) and any(c.options["vllm"].get("piecewise") for c in local)


def test_chunk_sizes_are_checked_naming_the_field():
    from spec.model.case_bounds import CaseFormatError
    from gpu_impl.engines.vllm.options import check_vllm_options
    from gpu_impl.engines.vllm.scenario import check_scenario

    assert check_scenario({"num_layers": 2, "attention_chunk_size": 64})["attention_chunk_size"] == [64, 64]
    assert check_scenario({"num_layers": 2, "attention_chunk_size": [None, None]})["attention_chunk_size"] is None
    for bad in (0, True, [64], "64", [64, -16]):
        with pytest.raises(ValueError, match="attention_chunk_size: must be null"):
            check_scenario({"num_layers": 2, "attention_chunk_size": bad})
    with pytest.raises(ValueError, match="attention_chunk_size: each size a multiple of block_size"):
        check_scenario({"attention_chunk_size": 100})
    with pytest.raises(ValueError, match="attention_chunk_size: a layer with a chunk size has no sliding_window"):
        check_scenario({"num_layers": 2, "attention_chunk_size": [64, None], "sliding_window": [64, None]})
    assert check_scenario({"num_layers": 2, "attention_chunk_size": [64, None], "sliding_window": [None, 64]})
    assert check_vllm_options({"num_layers": 2, "attention_chunk_size": [8192, None]}, {})
    with pytest.raises(CaseFormatError, match="vllm.attention_chunk_size"):
        check_vllm_options({"num_layers": 2, "attention_chunk_size": [8192]}, {})


def test_step_labels_name_local_attention():
    from gpu_impl.engines.vllm.scenario import check_scenario

    s = check_scenario({"num_layers": 4, "attention_chunk_size": [1024] * 3 + [None], "steps": [{"seq_lens": [5]}]})
    assert step_labels(s, [1], [5], None, "v1") == ["eager", "local attention"]
    assert "local attention" not in step_labels(check_scenario({"steps": [{"seq_lens": [5]}]}), [1], [5], None, "v1")


def test_paths_both_family_puts_half_the_cases_on_the_v2_runner():
    from gpu_impl.engines.vllm.strategies import vllm_paths_both_case, vllm_paths_case

    runners = [vllm_paths_both_case(random.Random(seed)) for seed in range(200)]
    v2 = [c for c in runners if c.options["vllm"].get("runner") == "v2"]
    assert 60 < len(v2) < 140
    assert any(c.options["vllm"].get("full_and_piecewise") for c in v2)
    assert all(c.steps == vllm_paths_case(random.Random(seed)).steps for seed, c in enumerate(runners))


def test_paths_both_drafts_family_drafts_on_most_v2_cases_and_keeps_every_other_draw():
    """``vllm-paths-both-drafts`` (a release whose V2 runner's drafter is driven): the same cases as
    ``vllm-paths-both``, except that two thirds of its V2 cases draft 2..4 tokens, in every graph mode."""
    from gpu_impl.engines.vllm.strategies import vllm_paths_both_case, vllm_paths_both_drafts_case

    eligible = drafted = 0
    for seed in range(400):
        both, drafts = vllm_paths_both_case(random.Random(seed)), vllm_paths_both_drafts_case(random.Random(seed))
        assert (both.server, both.model, both.steps, both.seed) == (drafts.server, drafts.model, drafts.steps,
                                                                   drafts.seed)
        a, b = dict(both.options["vllm"]), dict(drafts.options["vllm"])
        tokens = b.pop("draft_tokens", None)
        if b.get("runner") == "v2":
            eligible += 1
            drafted += tokens is not None
            assert tokens is None or 2 <= tokens <= 4
            a.pop("draft_tokens", None)
        else:  # the V1 runner's draws
            assert tokens == a.pop("draft_tokens", None)
        assert a == b
    assert eligible > 120 and 0.55 < drafted / eligible < 0.8
    assert any(c.server.cuda_graph and c.options["vllm"].get("draft_tokens") and c.options["vllm"].get("runner") == "v2"
               for c in map(vllm_paths_both_drafts_case, map(random.Random, range(100))))


def test_v2_family_drafts_in_every_graph_mode_and_keeps_the_vllm_draws():
    """``vllm-v2`` (0.34.0): a third of the cases draft 2..4 tokens, under a FULL mode too (the speculator's FULL
    draft-decode graphs, drafter_graphs)."""
    from gpu_impl.engines.vllm.strategies import vllm_case, vllm_v2_case

    cases = [vllm_v2_case(random.Random(seed)) for seed in range(300)]
    drafted = [c for c in cases if c.options["vllm"].get("draft_tokens")]
    assert 60 < len(drafted) < 150 and {c.options["vllm"]["draft_tokens"] for c in drafted} == {2, 3, 4}
    full = [c for c in drafted if c.server.cuda_graph]
    assert 10 < len(full) < len(drafted) and any(c.options["vllm"].get("full_and_piecewise") for c in full)
    # every case not redrawn with K/V head sizes or layers that differ (tests/engines/test_vllm_heterolayers.py) or as
    # chunked local layers keeps its draws
    kept = [(seed, c) for seed, c in enumerate(cases) if c.model.head_dim_v == c.model.head_dim
            and not c.options["vllm"].get("layer_kv_heads") and not c.options["vllm"].get("attention_chunk_size")]
    assert len(kept) > 200 and all(c.steps == vllm_case(random.Random(seed)).steps for seed, c in kept)


def test_case_options_for_the_paths_are_validated_naming_the_field():
    from spec.model.case_bounds import CaseFormatError
    from gpu_impl.engines.vllm.options import check_vllm_options

    assert check_vllm_options({"common_prefix": 1024, "draft_tokens": 2}, {})["draft_tokens"] == 2
    with pytest.raises(CaseFormatError, match="vllm.common_prefix"):
        check_vllm_options({"common_prefix": -1}, {})
    with pytest.raises(CaseFormatError, match="vllm.draft_tokens"):
        check_vllm_options({"draft_tokens": 9}, {})
    with pytest.raises(CaseFormatError, match="vllm.runner"):
        check_vllm_options({"runner": "v3"}, {})


def test_driver_refuses_bad_path_fields_naming_them():
    from gpu_impl.engines.vllm.driver import check_scenario

    with pytest.raises(ValueError, match="common_prefix"):
        check_scenario({"common_prefix": -1})
    assert check_scenario({"common_prefix": 40960, "max_model_len": 4096})["common_prefix"] == 40960  # rule caps it
    with pytest.raises(ValueError, match="draft_tokens"):
        check_scenario({"draft_tokens": True})
    with pytest.raises(ValueError, match="runner"):
        check_scenario({"runner": "v0"})


# ---------------------------------------------------------------- engine: a release with cascade attention


def _needs(release: str) -> None:
    need_vllm(release)


@pytest.fixture(scope="module")
def cascade_worker(engine_sut):
    _needs(CASCADE_RELEASE)
    return engine_sut(f"vllm=={CASCADE_RELEASE}").worker


#: a mixed batch of 8 sequences sharing 4096 tokens (tp 8: 4 query heads, 1 KV head per rank): the release's rule
#: takes cascade; under the full CUDA graph the builder gives both calls the split bound 32 (eager dispatch)
SHARED = {"num_heads": 32, "num_kv_heads": 8, "tp": 8, "cuda_graph": "full", "common_prefix": 4096,
          "steps": [{"seq_lens": [4196] * 8, "query_lens": [1] * 7 + [40]}]}


def _pairs(resp):
    return [e for e in resp["trace"] if "s_c" in e]


@pytest.mark.engine
def test_cascade_is_the_release_rule_and_each_call_is_judged_against_its_own_precompute(cascade_worker):
    resp = cascade_worker.run(SHARED)
    pairs = _pairs(resp)
    assert resp["findings"] == [] and len(pairs) == 2
    prefix, suffix = pairs
    assert all("cascade" in e["reached"] and "eager" in e["reached"] for e in pairs)
    assert (prefix["call"]["batch_size"], prefix["call"]["seqlen_k"], prefix["call"]["causal"]) == (1, 4096, False)
    assert suffix["call"]["batch_size"] == 8 and suffix["call"]["causal"] is True
    assert all(e["call"]["metadata_passed"] and e["call"]["num_splits"] == 32 for e in pairs)
    # the rule says no: no shared prefix, or a decode-only GQA batch (FlashDecoding is judged faster)
    alone = cascade_worker.run({**SHARED, "common_prefix": 0})
    decode = cascade_worker.run({**SHARED, "steps": [{"seq_lens": [4196] * 8}]})
    assert all("cascade" not in e["reached"] for r in (alone, decode) for e in _pairs(r))


@pytest.mark.engine
def test_drafter_metadata_and_dcp_skipped_context_are_reached(cascade_worker):
    drafted = cascade_worker.run({"tp": 4, "draft_tokens": 2, "steps": [{"seq_lens": [300, 17]}]})
    drafts = [e for e in _pairs(drafted) if "drafter" in e["reached"]]
    assert len(drafts) == 2 and not any(e["call"]["metadata_passed"] for e in drafts)  # fast_build: no schedule
    assert [e["call"]["seqlen_k"] for e in drafts][0] >= 301
    fresh = cascade_worker.run({"tp": 4, "dcp": 2, "steps": [{"seq_lens": [100, 17], "query_lens": [100, 17]}]})
    steps = [e["reached"] for e in fresh["trace"] if "seconds" in e]
    assert steps == [["eager", "DCP", "DCP skipped context"]] and fresh["findings"] == []


@pytest.mark.engine
def test_the_v2_runner_of_a_release_that_ships_both_is_driven_per_case(cascade_worker):
    both = cascade_worker.run({"tp": 4, "runner": "v2", "cuda_graph": "full_and_piecewise",
                               "steps": [{"seq_lens": [32768, 100, 100]}, {"seq_lens": [300, 100], "query_lens": [1, 30]}]})
    pairs = _pairs(both)
    assert both["findings"] == [] and {e["path"] for e in pairs} == {"full: capture", "full", "piecewise"}
    assert all("V2 runner" in e["reached"] for e in pairs)
    v1 = _pairs(cascade_worker.run({"tp": 4, "cuda_graph": "full", "steps": [{"seq_lens": [32768, 100, 100]}]}))
    assert v1 and all("V2 runner" not in e["reached"] for e in v1)
    with pytest.raises(ValueError, match="set_dcp_capture_context"):  # not driven there: said, never a pass
        cascade_worker.run({"num_heads": 32, "num_kv_heads": 4, "tp": 4, "dcp": 2, "runner": "v2",
                            "cuda_graph": "full", "steps": [{"seq_lens": [5]}]})


#: the V2 runner's drafter (drafter_v2) on 0.31.0: 3 speculative tokens, so 2 draft decode steps after the step; one
#: long sequence, so FA3's scheduler splits its draft decode
V2_DRAFTS = {"tp": 4, "draft_tokens": 3, "runner": "v2",
             "steps": [{"seq_lens": [30000, 100], "query_lens": [1, 30]}]}


@pytest.mark.engine
def test_the_v2_drafter_of_a_release_that_ships_both_judges_each_draft_step_against_its_own_precompute(cascade_worker):
    """0.31.0's own speculator (``AutoRegressiveSpeculator``: ``_configure_fused_multi_step_decode`` chooses the fused
    path where every attention group ``supports_draft_decode_metadata_update``, DCP 1; ``_generate_fused_drafts``
    has each group's builder recompute the metadata before the next draft step; DCP 2: the eager rebuild): every
    draft decode call has a precompute of its own with the call's split count, on the path ``V2 drafter``."""
    for graph in ("none", "piecewise"):
        resp = cascade_worker.run({**V2_DRAFTS, "cuda_graph": graph})
        drafts = [e for e in _pairs(resp) if "V2 drafter" in e["reached"]]
        assert resp["findings"] == [] and len(drafts) == 2, graph  # 2 draft steps x 1 layer
        assert all(e["aot"] and e["s_p"] == e["s_c"] == 109 and "V2 runner" in e["reached"] for e in drafts)
    dcp = cascade_worker.run({**V2_DRAFTS, "num_heads": 32, "num_kv_heads": 4, "dcp": 2, "cuda_graph": "none"})
    assert dcp["findings"] == [] and len([e for e in _pairs(dcp) if "V2 drafter" in e["reached"]]) == 2
    v1 = cascade_worker.run({**V2_DRAFTS, "runner": None, "cuda_graph": "none"})  # the V1 runner's build_for_drafting
    assert [e for e in _pairs(v1) if "drafter" in e["reached"]] and not any(
        "V2 drafter" in e["reached"] for e in _pairs(v1))
    full = cascade_worker.run({**V2_DRAFTS, "cuda_graph": "full"})  # the speculator's FULL draft-decode graph
    drafts = [e for e in _pairs(full) if "V2 drafter" in e["reached"]]
    assert full["findings"] == [] and drafts and all("V2 drafter FULL graph" in e["reached"] for e in drafts)


#: finding 15 (docs/engines-vllm.md): gemma-2-9b's shapes at tp 2, both layers with window 4096, FULL_AND_PIECEWISE, a
#: mixed target step (PIECEWISE) and 3 speculative tokens: the draft decode replays a FULL draft-decode graph
WINDOWED_DRAFTS = {"num_heads": 16, "num_kv_heads": 8, "head_dim": 256, "tp": 2, "num_layers": 2,
                   "sliding_window": 4096, "cuda_graph": "full_and_piecewise", "draft_tokens": 3, "runner": "v2",
                   "steps": [{"seq_lens": [100, 17], "query_lens": [1, 17]}]}


@pytest.mark.engine
def test_the_v2_drafter_full_graph_first_step_reads_a_host_build_in_another_layout(cascade_worker):
    """0.31.0's ``_fused_multi_step_decode`` builds the first draft step's metadata on the host
    (``_build_uniform_attn_metadata``, ``max_seq_len`` = propose's ``draft_max_seq_len``, here 103) and replays the
    graph captured with ``max_seq_len = max_model_len``; ``_generate_fused_drafts`` updates the metadata only between
    draft steps, so the first replayed draft call reads that build: FA3 drops the window at the recompute (4095 >=
    seqlen_k - 1) and keeps it in the captured call, 9 int32 values for a kernel that reads 13 (SHAPE at the replay,
    silent), on both layers of the first draft step only; the second step reads the in-graph update."""
    resp = cascade_worker.run(WINDOWED_DRAFTS)
    found = resp["findings"]
    assert {(f["invariant"], f["detail"]["path"]) for f in found} == {("SHAPE", "full: draft replay")}
    assert len(found) == 2 and all(f["detail"].get("drafter") and f["detail"].get("replay") for f in found)
    assert "13 int32 values (precompute produces 9)" in found[0]["message"]
    target = [e for e in _pairs(resp) if "drafter" not in e["reached"]]
    assert target and all(e["path"] == "piecewise" for e in target)


@pytest.mark.engine
def test_a_0_31_0_copy_whose_draft_update_asks_more_splits_than_its_call_is_found(tmp_path):
    """Negative control (tests/release_copies.py DRAFT_UPDATE_SPLITS_0_31_0): the fused draft-decode update asks FA3
    for a split bound of 128 where the draft call passes the metadata's 0: SPLIT_BOUND (S_p 128 vs 109) on the second
    draft call only -- 0.31.0's ``_generate_fused_drafts`` updates the metadata between draft steps, not before the
    first, which runs on the step-1 metadata ``_fused_multi_step_decode`` built --, none on the target step, where the
    release itself passes the same scenario (above)."""
    _needs(CASCADE_RELEASE)
    from release_copies import DRAFT_UPDATE_SPLITS_0_31_0, vllm_patched_copy

    from gpu_impl.engines.vllm.host import VllmSUT
    from gpu_impl.sut import parse_engine

    root = vllm_patched_copy(CASCADE_RELEASE, tmp_path / "seeded", DRAFT_UPDATE_SPLITS_0_31_0)
    with VllmSUT(spec=parse_engine(f"vllm-src={root}"), progress=lambda line: None) as sut:
        resp = sut.worker.run({**V2_DRAFTS, "cuda_graph": "none"})
    found = resp["findings"]
    assert {(f["invariant"], f["detail"]["s_p"], f["detail"]["s_c"]) for f in found} == {("SPLIT_BOUND", 128, 109)}
    assert len(found) == 1 and found[0]["detail"].get("drafter")
    drafts = [e for e in _pairs(resp) if "V2 drafter" in e["reached"]]
    assert [e["s_p"] for e in drafts] == [109, 128]  # the step-1 build, then the seeded update
    target = [e for e in _pairs(resp) if "V2 drafter" not in e["reached"]]
    assert target and all(e["s_p"] == e["s_c"] for e in target)  # the target step is the release's own


@pytest.mark.engine
def test_the_v2_runner_finding_of_a_release_that_ships_both_replays_still_failing(cascade_worker, engine_sut):
    """tests/corpus_vllm/v2-runner-full-graph-replay-window-dropped-0.31.0.json (found by the gate on 0.31.0, seed
    0, on its V2 runner): the FULL-graph replay's recompute in another layout than the captured call (0.34.0's
    finding), STILL FAILS on the release it names."""
    import json
    from pathlib import Path

    from fa3verify.commands.replay import replay

    path = Path(__file__).parent.parent / "corpus_vllm" / "v2-runner-full-graph-replay-window-dropped-0.31.0.json"
    summary, seen = replay(str(path), sut=engine_sut(f"vllm=={CASCADE_RELEASE}"))
    assert summary.exit_code == 1 and {f.invariant for f in seen.findings} == {"SHAPE"}
    case = json.loads(path.read_text())
    assert case["vllm"]["runner"] == "v2" and case["engine"]["release"] == CASCADE_RELEASE


@pytest.mark.engine
def test_the_v2_runner_mixed_full_graph_captured_for_one_token_queries_fails_on_0_30_0_and_passes_on_0_31_0(
        engine_sut, cascade_worker):
    """tests/corpus_vllm/v2-runner-mixed-full-graph-captured-for-one-token-queries-0.30.0.json (found by the gate on
    0.30.0, seed 0): the V2 runner of 0.28.0 .. 0.30.0 captures a mixed FULL graph on a dummy batch of one-token
    requests (max_query_len 1), and a prefill replayed on it reads the recompute's 193 int32 at the capture's
    129-value layout: SHAPE, and the captured semaphore slot holds the recompute's heads-in-L2 count. STILL FAILS on
    0.30.0 (no READS_OWN_STEP_METADATA: the recompute did rewrite the buffer), PASSES NOW on 0.31.0, whose
    prepare_inputs_to_capture captures mixed FULL graphs with max_query_len = the token count."""
    from pathlib import Path

    from fa3verify.commands.replay import replay

    _needs("0.30.0")
    path = (Path(__file__).parent.parent / "corpus_vllm"
            / "v2-runner-mixed-full-graph-captured-for-one-token-queries-0.30.0.json")
    _, own = replay(str(path), sut=engine_sut("vllm==0.30.0"))
    assert own.verdict == "STILL FAILS"
    assert {f.invariant for f in own.findings} == {"SHAPE", "SEMAPHORE_STARTS_AT_ZERO"}
    _, later = replay(str(path), sut=engine_sut(f"vllm=={CASCADE_RELEASE}"))
    assert later.verdict == "PASSES NOW"


@pytest.mark.engine
def test_a_copy_with_a_cascade_split_regression_is_found_where_the_release_passes(cascade_worker, tmp_path):
    from release_copies import CASCADE_HALF_SPLITS_0_31_0, vllm_patched_copy

    from gpu_impl.engines.vllm.host import VllmSUT
    from gpu_impl.sut import parse_engine

    assert cascade_worker.run(SHARED)["findings"] == []
    root = vllm_patched_copy(CASCADE_RELEASE, tmp_path / "seeded", CASCADE_HALF_SPLITS_0_31_0)
    with VllmSUT(spec=parse_engine(f"vllm-src={root}"), progress=lambda line: None) as sut:
        resp = sut.worker.run(SHARED)
    found = {(f["invariant"], f["detail"]["s_c"]) for f in resp["findings"]}
    assert ("SPLIT_BOUND", 16) in found, resp["findings"]


@pytest.mark.engine
def test_triton_active_driver_is_stood_in_where_listed_so_the_v2_runner_imports():
    """0.32.0 (releases.json v2_runner.triton_active_driver): with the CPU glue's answer to triton's active-driver
    query, generation v2 finds everything it needs; without it (negative control: the list emptied) vLLM picks its
    Triton placeholder and mamba_mixer2's configs fail on ``num_stages``."""
    import os
    import subprocess
    from pathlib import Path

    _needs("0.32.0")
    python = envs.env_dir("0.32.0", engine="vllm") / "bin" / "python"
    code = ("from gpu_impl.engines.vllm import glue; {off}glue.install(); "
            "import vllm.triton_utils.importing as t; from gpu_impl.engines.vllm.recipes import missing_for_generation;"
            " print(t.HAS_TRITON, missing_for_generation('v2'))")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}

    def run(off):
        return subprocess.run([str(python), "-c", code.format(off=off)], capture_output=True, text=True, env=env,
                              timeout=300).stdout.strip().splitlines()[-1]

    assert run("") == "True []"
    without = run("glue._triton_driver_releases = lambda: []; ")
    assert without.startswith("False") and "num_stages" in without


@pytest.mark.engine
@pytest.mark.parametrize("release", ["0.18.0", "0.27.1"])
def test_the_v2_runner_of_releases_before_0_28_is_driven_with_their_own_signatures(engine_sut, release):
    """0.18.0 .. 0.27.1: generation v2 follows the release's dispatch, capture and InputBatch (no max_query_len; a
    capture pair before 0.21; no seq_lens_cpu_upper_bound before 0.20; the block-table width from the V1 block table
    before 0.27): a FULL capture and replay and a piecewise batch through that release's V2 runner."""
    _needs(release)
    resp = engine_sut(f"vllm=={release}").worker.run(
        {"tp": 4, "runner": "v2", "cuda_graph": "full_and_piecewise",
         "steps": [{"seq_lens": [32768, 100, 100]}, {"seq_lens": [300, 100], "query_lens": [1, 30]}]})
    pairs = _pairs(resp)
    assert resp["findings"] == [] and {e["path"] for e in pairs} == {"full: capture", "full", "piecewise"}
    assert all("V2 runner" in e["reached"] for e in pairs)


@pytest.mark.engine
def test_the_v2_runner_replay_layout_finding_starts_at_0_20_0(engine_sut):
    """The V2 runner's FULL-graph replay layout finding (case file of 0.31.0) replays STILL FAILS on 0.20.0, where
    prepare_attn first takes max_seq_len from the batch outside a capture, and PASSES NOW on 0.19.1, whose V2 runner
    builds every step with max_model_len."""
    from pathlib import Path

    from fa3verify.commands.replay import replay

    for release in ("0.20.0", "0.19.1"):
        _needs(release)
    path = Path(__file__).parent.parent / "corpus_vllm" / "v2-runner-full-graph-replay-window-dropped-0.31.0.json"
    _, first = replay(str(path), sut=engine_sut("vllm==0.20.0"))
    assert first.verdict == "STILL FAILS" and {f.invariant for f in first.findings} == {"SHAPE"}
    _, before = replay(str(path), sut=engine_sut("vllm==0.19.1"))
    assert before.verdict == "PASSES NOW"
