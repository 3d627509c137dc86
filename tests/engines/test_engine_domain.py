"""The engine's own domain (gpu_impl.domain, gpu_impl.engines.sglang.domain): configurations come from the
system under test, only those its own checks accept are run, rejections are counted by the release's reason,
and every metadata path is reported with how many cases reached it. No engine environment needed: the release's
validation is played by fakes here (tests/engines/test_engine_domain_real.py asks real releases)."""

from __future__ import annotations

import random

import pytest

from fake_engines import ProfileSUT
from gpu_impl.config import MODELS, ServerConfig
from gpu_impl.domain import PATHS, ConfigDomain, reach_report, reached_paths
from gpu_impl.engines.sglang import recipes
from gpu_impl.engines.sglang.domain import VALIDATED_FIELDS, ReleaseDomain, release_arguments
from gpu_impl.engines.sglang.validation import FIELD_NAMES


def _entry(path, precomputed=True, passed=True, idle=False):
    return {"path": path, "precomputed": precomputed, "idle": idle, "call": {"metadata_passed": passed}}


def test_reach_counts_only_calls_that_consumed_precomputed_metadata():
    trace = [_entry("eager"), _entry("capture", precomputed=False), _entry("replay", passed=False),
             _entry("replay", idle=True), {"step": 0, "mode": "extend", "engine": "not run"}]
    assert reached_paths(trace) == {"eager", "replay", "dp-idle", "layer:full-attention"}
    # negative control: a run whose guard turned the precompute off reaches no path
    assert reached_paths([_entry(p, precomputed=False) for p in ("eager", "capture", "replay")]) == set()


def test_a_path_no_case_reached_is_listed_as_not_covered_never_left_out():
    report = reach_report({"eager": 3}, {"layer:sliding-window": "the driver drives one full-attention layer"})
    assert set(report["reach"]) >= set(PATHS) and report["reach"]["replay"] == 0
    assert report["not_covered"]["replay"] == "reached by no case of this run"
    assert "eager" not in report["not_covered"]
    assert report["not_covered"]["layer:sliding-window"].startswith("the driver drives")


def _accept_all(server, model):
    return True, "accepted"


def _draws(domain, n=600, seed=0):
    rng = random.Random(seed)
    return [got for got in (domain.draw_config(rng) for _ in range(n)) if got is not None]


def test_the_release_domain_draws_what_the_release_accepts_and_the_prover_assumes_away():
    dom = ReleaseDomain("0.5.23", _accept_all)
    got = _draws(dom)
    servers = [s for s, _, _, _ in got]
    assert any(s.attn_cp_size > 1 and not s.enable_prefill_cp for s in servers)       # ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP
    assert any(s.enable_prefill_cp and s.cp_strategy is None for s in servers)         # ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY
    assert any(s.tp_size == 4 and s.dp_size == 3 for s in servers)
    assert any(s.cp_strategy == "interleave" for s in servers)                         # the release's own choice
    assert any(m.num_heads == 71 and s.tp_size == 2 and s.attn_tp_size == 1 for s, m, _, _ in got)
    assert {t for _, _, t, _ in got} == {"eager", "graph", "dp-idle"}
    assert all(s.cuda_graph == (t != "eager") for s, _, t, _ in got)
    assert all(s.enable_dp_attention and s.dp_size > 1 for s, _, t, _ in got if t == "dp-idle")


def test_only_configurations_the_release_accepts_are_kept_and_each_rejection_is_counted_by_its_reason():
    asked = []

    def no_cp(server, model):
        asked.append(server)
        if server.attn_cp_size > 1:
            return False, "AssertionError: attn_cp_size is not supported here"
        if server.page_size == 128:
            return None, "inconclusive: needs a GPU"
        return True, "accepted"

    dom = ReleaseDomain("0.5.23", no_cp)
    got = _draws(dom)
    assert got and all(s.attn_cp_size == 1 and s.page_size != 128 for s, _, _, _ in got)
    assert dom.rejected["ServerArgs: AssertionError: attn_cp_size is not supported here"] > 0
    assert any(r.startswith("inconclusive (validation did not run on CPU)") for r in dom.rejected)
    assert dom.drawn == dom.accepted + sum(dom.rejected.values()) and dom.accepted == len(got)
    # the release is asked once per configuration it validates
    keys = [tuple(getattr(s, f) for f in VALIDATED_FIELDS) for s in asked]
    assert len(asked) == len(dom.verdicts) <= len(keys) and len(set(keys)) <= len(asked)


def test_cells_whose_cases_reach_no_precompute_are_drawn_less_but_still_drawn():
    dom = ReleaseDomain("0.5.23", _accept_all)
    before = dom.cell_weights()
    guarded = [c for c in dom.priors if c[1] or c[2]]   # DP attention or prefill CP
    for cell in dom.priors:
        for _ in range(40):
            dom.observe(cell, set() if cell in guarded else {"eager", "layer:full-attention"})
    after = dom.cell_weights()
    assert all(0 < after[c] < before[c] for c in guarded)
    assert all(after[c] > before[c] for c in dom.priors if c not in guarded)
    rng = random.Random(1)
    cells = [got.cell for got in (dom.draw_config(rng) for _ in range(400)) if got is not None]
    assert any(c in guarded for c in cells)
    assert sum(c in guarded for c in cells) < sum(c not in guarded for c in cells) / 2


def test_the_domain_strategy_tells_the_domain_what_each_case_reached():
    from fa3verify.campaign import Observation
    from fa3verify.strategies import domain_strategy

    dom = ReleaseDomain("0.5.23", _accept_all)
    strategy = domain_strategy(dom)
    case = next(c for c in (strategy(random.Random(i)) for i in range(20)) if c is not None)
    strategy.observe(case, Observation("pass", reached=("replay",)))
    strategy.observe(case, Observation("pass", reached=("replay",)))  # told once only
    assert sum(dom.tries.values()) == 1 and sum(dom.hits.values()) == 1


def _model_load(server, model):
    """The verdict shape of a release whose model-load head split refuses heads that do not split evenly over
    attn_tp_size (as ``SglangSUT.validate`` gives it)."""
    attn_tp, h, hk = server.attn_tp_size, model.num_heads, model.num_kv_heads
    where = "model load (srt/models/qwen3.py Qwen3Attention.__init__): AssertionError: "
    if attn_tp >= 1 and h % attn_tp:
        return False, where + "assert self.total_num_heads % attn_tp_size == 0 (qwen3.py line 87)"
    if attn_tp >= 1 and (hk % attn_tp if hk >= attn_tp else attn_tp % hk):
        return False, where + "assert self.total_num_kv_heads % attn_tp_size == 0 (qwen3.py line 93)"
    return True, "accepted by ServerArgs and at model load"


def test_a_head_split_the_release_refuses_at_model_load_is_counted_under_its_own_message_not_run():
    dom = ReleaseDomain("0.5.23", _model_load)
    reason = dom.admit(ServerConfig(tp_size=2), MODELS["falcon-7b"])
    assert reason.startswith("model load (srt/models/qwen3.py Qwen3Attention.__init__): AssertionError: assert")
    assert dom.admit(ServerConfig(tp_size=2, attn_cp_size=2), MODELS["falcon-7b"]) is None  # 71 heads, attn_tp 1
    # negative control: the domain adds no head split of its own; what the release accepts runs
    assert ReleaseDomain("0.5.23", _accept_all).admit(ServerConfig(tp_size=2), MODELS["falcon-7b"]) is None


def test_the_cached_verdict_is_keyed_on_every_field_the_release_validates():
    assert set(VALIDATED_FIELDS) == set(FIELD_NAMES) | {"cuda_graph"}


def test_every_registered_release_has_its_own_argument_definitions():
    for release in recipes.RELEASES:
        used, args = release_arguments(release)
        assert used == release and {"tp_size", "dp_size", "page_size", "disable_cuda_graph"} <= set(args)
    assert release_arguments("0.5.99")[0] == recipes.RELEASES[-1]
    assert "cp_strategy" not in release_arguments("0.5.13")[1]  # 0.5.13 splits prefill CP its own way
    assert release_arguments("0.5.23")[1]["cp_strategy"]["choices"] == ["interleave", "zigzag"]


def test_an_idle_dp_rank_target_gets_fewer_rows_than_dp_ranks():
    from fa3verify.strategies import domain_strategy

    draw = domain_strategy(ReleaseDomain("0.5.23", _accept_all))
    cases = [c for c in (draw(random.Random(i)) for i in range(300)) if c is not None]
    idle = [c for c in cases if c.server.enable_dp_attention and c.server.cuda_graph]
    assert any(len(c.steps[0]["seq_lens"]) < c.server.attn_dp_size for c in idle)
    assert all(s["mode"] == "decode" for c in cases for s in c.steps)


class _DomainSUT(ProfileSUT):
    """A fake release with a domain of its own, validated by ``check`` and the model-load head split."""

    def __init__(self, check, **kw):
        super().__init__(**kw)
        self.check = check
        self._domain = None

    def validate(self, server_config, model_config=None):
        """``check`` plays ServerArgs; what it accepts then goes through the model-load head split, as a release's."""
        accepted, message = self.check(server_config, model_config)
        if accepted is True and model_config is not None:
            return _model_load(server_config, model_config)
        return accepted, message

    def domain(self):
        if self._domain is None:
            self._domain = ReleaseDomain(self.release, self.validate, label=str(self.spec))
        return self._domain


def test_the_campaign_draws_from_the_systems_domain_and_reports_reach_and_rejections(tmp_path):
    from fa3verify.commands.fuzz import fuzz

    def no_dp_attention(server, model):
        if server.tp_size % (server.attn_dp_size * server.attn_cp_size):
            return False, "AssertionError: tp_size must be divisible"
        return (False, "AssertionError: no DP attention") if server.enable_dp_attention else (True, "ok")

    sut = _DomainSUT(no_dp_attention, release="0.5.23")
    summary = fuzz(sut=sut, max_cases=40, out_dir=str(tmp_path), show_progress=False)
    dom = summary.domain
    assert dom is not None and dom["name"] == "sglang==0.5.23" and summary.cases > 0
    assert dom["rejected"]["ServerArgs: AssertionError: no DP attention"] > 0
    assert dom["reach"]["eager"] > 0 and dom["reach"]["replay"] > 0
    assert "dp-idle" in dom["not_covered"] and "layer:sliding-window" in dom["not_covered"]
    assert "cases per path: eager" in summary.checks[-1].message
    assert summary.to_dict()["domain"]["reach"] == dom["reach"]


def test_a_domain_the_release_rejects_entirely_runs_nothing_and_passes_nothing(tmp_path):
    from fa3verify.commands.fuzz import fuzz

    sut = _DomainSUT(lambda s, m: (False, "ValueError: nothing is accepted"), release="0.5.23")
    summary = fuzz(sut=sut, max_cases=10, out_dir=str(tmp_path), show_progress=False)
    assert summary.cases == 0 and summary.checks[-1].verdict == "inconclusive" and summary.exit_code == 3
    assert summary.domain["accepted"] == 0 and summary.domain["rejected"]["ServerArgs: ValueError: nothing is accepted"]


def test_the_model_and_a_named_family_keep_the_suites_own_space():
    from gpu_impl.engines.model.sut import ModelSUT

    dom = ModelSUT().domain()
    assert isinstance(dom, ConfigDomain) and dom.family == "scenario" and not dom.draws_itself
    assert ProfileSUT().domain().family == "scenario"


def test_a_family_domain_keeps_only_the_cases_its_system_accepts_and_counts_the_rest():
    from fa3verify.strategies import domain_strategy

    def no_dcp(case):
        return "ParallelConfig: ValueError: no DCP here" if case.server.attn_cp_size > 1 else None

    dom = ConfigDomain("vllm==x", family="vllm", check=no_dcp, reach_keys=("none", "piecewise", "full"))
    draw = domain_strategy(dom)
    cases = [c for c in (draw(random.Random(i)) for i in range(200)) if c is not None]
    assert cases and all(c.server.attn_cp_size == 1 for c in cases)
    assert dom.rejected["ParallelConfig: ValueError: no DCP here"] > 0 and dom.accepted == len(cases)
    assert dom.reports and set(dom.report({"full": 2}, len(cases))["reach"]) == {"none", "piecewise", "full"}
    # negative control: without a check every drawn case is kept
    plain = ConfigDomain("vllm==x", family="vllm")
    assert not plain.reports and domain_strategy(plain) is not draw


def test_a_matrix_row_carries_its_releases_reach_and_rejections():
    from fa3verify.engine_matrix import row_from_summary
    from fa3verify.summary import RunSummary
    from spec.model.engine_profiles import profile_for

    summary = RunSummary(command="gate", cases=3)
    summary.domain = {"reach": {"eager": 2, "replay": 1}, "rejected": {"ServerArgs: AssertionError: x": 4}}
    row = row_from_summary("0.5.23", profile_for("0.5.23"), summary, 1.0)
    assert row.reach == {"eager": 2, "replay": 1} and row.rejected == {"ServerArgs: AssertionError: x": 4}
    assert row_from_summary("0.5.23", profile_for("0.5.23"), RunSummary(command="gate"), 1.0).reach == {}


def test_a_matrix_family_names_attention_cp_without_prefill_cp_for_what_it_is():
    from fa3verify.engine_matrix import family_of

    assert family_of({"attn_cp_size": 4, "enable_prefill_cp": False})[0] == "attention CP without prefill CP (attn_cp 4)"
    assert family_of({"attn_cp_size": 4, "enable_prefill_cp": True})[0] == "prefill CP (attn_cp 4)"
