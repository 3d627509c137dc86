"""Theorems 1-4: expected verdicts under the fixed policy, and a seeded defect for each that makes z3
refute it (pre-fix guard, dropped assumption, heuristic change at the precompute, off-by-one split ranges, a guard
that raises on older ServerArgs)."""

import time
from unittest import mock

import pytest
import z3

import refmodel.fa3_scheduler as fs
from spec.model import domain as D
from spec.model.cases import Case
from spec.theorems.results import TheoremResult
from spec.theorems.metadata import THEOREMS
from spec.theorems.metadata_lemmas import kv_cover_lemma
from spec.theorems.metadata_jobs import run_metadata_theorems


def _by_name(results):
    return {r.name: r for r in results}


@pytest.fixture(scope="module")
def fixed_run():
    start = time.perf_counter()
    results = run_metadata_theorems(guard="fixed", metadata_heads="tp", timeout_s=10.0)
    return _by_name(results), time.perf_counter() - start


@pytest.fixture(scope="module")
def prefix_run(tmp_path_factory):
    cases = tmp_path_factory.mktemp("cases")
    results = run_metadata_theorems(guard=D.prefix_guard, metadata_heads="tp", timeout_s=10.0, cases_dir=cases,
                                    only=["3", "4"])
    return _by_name(results), cases


def test_fixed_policy_has_every_expected_verdict(fixed_run):
    res, seconds = fixed_run
    assert set(res) == set(THEOREMS)
    for r in res.values():
        assert isinstance(r, TheoremResult)
        assert r.expected and not r.failed and not r.inconclusive, r.summary()
    for name in ("kv-cover", "batch-over-992", "benign-drift", "prefill-cp-hazard", "guard-soundness",
                 "root-cause-alternative", "sharded-kv-decode", "guard-robustness"):
        assert res[name].verdict == "proved", res[name].summary()


def test_freshness_is_an_expected_refutation_at_fa3s_tile_corner(fixed_run):
    r = fixed_run[0]["freshness"]
    assert r.verdict == "expected-refutation"
    w = r.witness
    assert w["kind"] == "host-kernel-tile" and w["headdim"] <= 64 and 64 < w["headdim_v"] <= 192
    assert w["precompute_block_m"] == 192 and w["kernel_block_m"] == 128 and w["replayed"] == "violation"
    assert "flash_api.cpp" in r.message and "tile_size.h" in r.message


def test_drift_breaking_changes_each_have_a_witness(fixed_run):
    res = fixed_run[0]
    expect = {"h_k": "SPLIT_BOUND", "seqlen_k": "SPLIT_BOUND", "seqlen_q": "QUERY_COVER", "pack": "QUERY_COVER",
              "b": "BATCH_PERMUTATION"}
    for change, inv in expect.items():
        r = res[f"drift-breaks-{change}"]
        assert r.verdict == "refuted" and r.expected and not r.failed, r.summary()
        assert r.witness["invariant"] == inv


def test_prefix_guard_hazard_is_found_and_written_as_a_case(prefix_run):
    res, cases = prefix_run
    hazard = res["prefill-cp-hazard"]
    assert hazard.verdict == "refuted" and hazard.failed and hazard.expected
    w = hazard.witness
    assert w["invariant"] == "SPLIT_BOUND" and w["S_p"] > w["S_c"] > 1 and max(w["splits"]) > w["S_c"]
    assert "pcp" in w["config"]
    case = Case.load(hazard.case_file)
    assert case.source == "prove:prefill-cp-hazard" and case.policy["guard"] == "pre-fix"
    assert case.server["enable_prefill_cp"] and not case.server["enable_dp_attention"]
    assert case.batches[0]["seq_lens"] == w["seq_lens"] and max(w["seq_lens"]) <= case.server["context_length"]
    assert case.expected == Case.from_json(case.to_json()).expected
    assert res["guard-soundness"].verdict == "refuted" and res["guard-soundness"].failed
    assert res["root-cause-alternative"].verdict == "proved"


def test_root_cause_fix_alone_misses_the_sharded_kv_path():
    res = _by_name(run_metadata_theorems(guard="pre-fix", metadata_heads="attn_tp", only=["prefill-cp-hazard", "4-sharded"]))
    assert res["prefill-cp-hazard"].verdict == "proved"
    sharded = res["sharded-kv-decode"]
    assert sharded.verdict == "refuted" and sharded.witness["precompute_heads"] == sharded.witness["call_heads"]
    assert sharded.witness["call_seqlen_k"] < sharded.witness["precompute_seqlen_k"]


def test_dropped_assumption_yields_a_witness_for_the_fixed_guard():
    res = _by_name(run_metadata_theorems(guard="fixed", only=["guard-soundness"],
                                         dropped_assumptions={"ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP"}))
    r = res["guard-soundness"]
    assert r.verdict == "refuted" and r.failed and not r.expected
    assert r.witness["server"]["attn_cp_size"] > 1 and not r.witness["server"]["enable_prefill_cp"]
    with pytest.raises(ValueError, match="NO_SUCH"):
        run_metadata_theorems(only=["4"], dropped_assumptions={"NO_SUCH"})


_FA3_HEURISTIC = fs.num_splits_heuristic


def _heuristic_090(total_mblocks, num_sms, num_n_blocks, num_m_blocks, size_one_kv_head, is_causal_or_local,
                   max_splits=128):
    """FA3's split heuristic with the 0.85 efficiency threshold raised to 0.90 (a seeded defect).

    (0.85 -> 0.80 would pick fewer splits at the precompute: S_p <= S_c, which is safe and cannot be refuted.)
    """
    if fs.F32(total_mblocks) >= fs.F32(0.8) * fs.F32(num_sms) or num_n_blocks <= 4:
        return _FA3_HEURISTIC(total_mblocks, num_sms, num_n_blocks, num_m_blocks, size_one_kv_head,
                              is_causal_or_local, max_splits)
    eff = fs.split_efficiencies(total_mblocks, num_sms, min(max_splits, num_sms, num_n_blocks))
    best = max(eff)
    return next(s for s, e in enumerate(eff, 1) if float(e) >= 0.90 * float(best))


def precompute_heuristic_090(inp):
    with mock.patch.object(fs, "num_splits_heuristic", _heuristic_090):
        return fs.get_num_splits(inp)


def test_heuristic_changed_at_the_precompute_refutes_freshness_and_drift():
    res = _by_name(run_metadata_theorems(only=["freshness", "benign-drift"],
                                         heuristic_precompute=precompute_heuristic_090))
    for name in ("freshness", "benign-drift"):
        r = res[name]
        assert r.verdict == "refuted" and r.failed, r.summary()
        assert r.witness["invariant"] == "SPLIT_BOUND"


def test_off_by_one_split_range_refutes_kv_cover():
    def sym_floor(n_min, n_max, s, i):
        per = z3.If(n_max <= n_min, 0, (n_max - n_min) / s)
        lo = n_min + i * per
        return lo, z3.If(lo + per < n_max, lo + per, n_max)

    def floor_range(n_min, n_max, s, i):
        per = 0 if n_max <= n_min else (n_max - n_min) // s
        lo = n_min + i * per
        return lo, min(lo + per, n_max)

    r = run_metadata_theorems(only=["kv-cover"], kv_range=(sym_floor, floor_range))[0]
    assert r.verdict == "refuted" and r.failed and r.witness["invariant"] == "KV_COVER"
    assert kv_cover_lemma().verdict == "proved"


def test_a_guard_that_raises_on_older_server_args_is_reported():
    def strict_guard(server_args):
        return server_args.enable_prefill_cp or server_args.enable_dp_attention

    r = run_metadata_theorems(guard=strict_guard, only=["guard-robustness"])[0]
    assert r.verdict == "refuted" and r.failed
    assert r.witness["missing_attribute"] == "enable_prefill_cp" and "getattr" in r.message


def test_domain_attn_tp_and_assumptions():
    cfg = D.Config(D.Server(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag"),
                   D.MODELS["qwen3-30b-a3b"])
    assert cfg.attn_tp_size == 1 and cfg.precompute_heads("tp") == (8, 1) and cfg.call_heads == (32, 4)
    assert cfg.precompute_heads("attn_tp") == cfg.call_heads
    plain_dp = D.Config(D.Server(tp_size=4, dp_size=2), D.MODELS["llama-3-8b"])
    assert plain_dp.attn_tp_size == 4  # without DP attention dp_size does not enter attn_tp_size
    assert D.valid(cfg) and not D.valid(D.Config(D.Server(tp_size=4, attn_cp_size=4), D.MODELS["llama-3-8b"]))
    assert D.valid(D.Config(D.Server(tp_size=4, attn_cp_size=4), D.MODELS["llama-3-8b"]),
                   dropped=frozenset({"ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP"}))
    configs = list(D.enumerate_configs())
    assert 1000 < len(configs) < 20000 and all(D.valid(c) for c in configs)
    assert D.fixed_guard(D.server_args(cfg)) and not D.prefix_guard(D.server_args(cfg))
    assert not D.precomputes(D.Config(D.Server(), D.MODELS["deepseek-v2-lite"]), D.no_guard)
    for name, text in D.ASSUMPTIONS.items():
        assert name.isupper() and text
