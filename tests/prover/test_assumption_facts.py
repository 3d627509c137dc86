"""spec's assumptions as per-release facts (``spec/model/assumption_facts.json``): the data's schema, what it makes the
prover drop, ``prove --engine-profile`` and the gate's witness stage on fakes. The facts against the releases' own
code are in tests/prover/test_assumption_facts_real.py."""

from __future__ import annotations

import json

import pytest

from fa3verify import cli
from spec.model import assumption_facts as F
from spec.model.config import ASSUMPTION_NAMES, ServerConfig, config_violations
from spec.model.engine_profiles import RELEASES

from fake_engines import FactsSUT, ProfileSUT


def test_every_assumption_has_one_fact_on_every_release_and_enforced_ones_name_their_check():
    for release in RELEASES:
        facts = F.facts_for("sglang", release)
        assert set(facts) == set(ASSUMPTION_NAMES)
        for fact in facts.values():
            assert fact.status in F.STATUSES
            if fact.is_enforced:
                assert fact.stage in F.STAGES and fact.checks
                assert all(" " in c and c.split(" ", 1)[0].endswith(".py") for c in fact.checks), fact.checks
    assert F.facts_for("sglang", "0.5.17.post1") == F.facts_for("sglang", "0.5.17")
    with pytest.raises(F.FactsError, match="0.5.11 .. 0.5.23"):
        F.facts_for("sglang", "0.5.99")


def test_each_probe_breaks_exactly_the_assumption_it_probes():
    probes = F.probes()
    assert probes
    for p in probes:
        broken = {v.invariant for v in config_violations(p.model, ServerConfig(**p.server))}
        assert p.assumption in broken, (p.assumption, broken)
    # every fact checked in ServerArgs or at model load has a probe to put to the release
    # (tests/prover/test_assumption_facts_real.py), and so has every unenforced one the release can be asked about
    probed = {p.assumption for p in probes}
    for release in RELEASES:
        for fact in F.facts_for("sglang", release).values():
            if fact.stage in ("server_args", "model_load"):
                assert fact.assumption in probed
    assert "ASSUMPTION_DTYPE_SUPPORTED" in probed


def test_vllm_probes_are_its_facts_own_and_break_exactly_their_assumption():
    probes = F.probes("vllm")
    assert [p.assumption for p in probes] == sorted(F.facts_for("vllm", "0.33.0"))
    for p in probes:
        broken = {v.invariant for v in config_violations(p.model, ServerConfig(**p.server))}
        assert broken == {p.assumption}, (p.assumption, broken)
    (dcp,) = probes
    assert dcp.model.num_kv_heads < dcp.server["tp_size"]  # vLLM's DCP needs tp_size above the KV heads
    # negative control: sglang's probe of the same assumption is not vLLM's
    assert dcp != next(p for p in F.probes() if p.assumption == dcp.assumption)
    with pytest.raises(F.FactsError, match="engines"):
        F.probes("trt")


def test_what_each_release_makes_the_prover_drop():
    drops = {r: F.prover_drops(F.facts_for("sglang", r)) for r in RELEASES}
    # num_heads % tp_size: no release checks it (the model-load asserts use attn_tp_size), so every profile drops it
    integral = "ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL"
    assert drops["0.5.13"] == {"ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP", "ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY",
                               integral}  # no cp_strategy field
    assert {drops[r] for r in RELEASES[3:]} == {frozenset({"ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP", integral})}
    # ASSUMPTION_HEADS_DIVISIBLE holds the two head splits enforced at model load: it stays
    assert all("ASSUMPTION_HEADS_DIVISIBLE" not in d and "ASSUMPTION_TP_DIVISIBLE" not in d for d in drops.values())
    assert F.prover_drops({}) == frozenset()  # a system that describes nothing keeps every assumption
    from gpu_impl.engines.vllm.strategies import NOT_ASSUMED_BY_VLLM

    assert NOT_ASSUMED_BY_VLLM == ("ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP",)


def test_facts_data_that_breaks_the_schema_is_refused(monkeypatch, tmp_path):
    """Negative control of the loader: an enforced fact without its check, and a release left without a fact."""
    data = json.loads(F.DATA_PATH.read_text())
    bad = json.loads(json.dumps(data))
    bad["assumptions"]["ASSUMPTION_TP_DIVISIBLE"]["sglang"][0].pop("checks")
    short = json.loads(json.dumps(data))
    short["assumptions"]["ASSUMPTION_GQA_GROUPS"]["sglang"][0]["releases"] = "0.5.11..0.5.22"
    for broken, match in ((bad, "names its checks"), (short, "sglang==0.5.23 has no fact")):
        path = tmp_path / "facts.json"
        path.write_text(json.dumps(broken))
        monkeypatch.setattr(F, "DATA_PATH", path)
        F.reload()
        with pytest.raises(F.FactsError, match=match):
            F.facts_for("sglang", "0.5.23")
    monkeypatch.undo()
    F.reload()


def test_prove_engine_profile_drops_what_the_release_does_not_enforce(tmp_path, capsys):
    base = ["prove", "--only", "guard-soundness", "--cases-dir", str(tmp_path), "--json", str(tmp_path / "p.json")]
    assert cli.main(base + ["--engine-profile", "sglang==0.5.17"]) == 1
    out = capsys.readouterr().out
    assert "assumptions sglang 0.5.17 enforces: ASSUMPTION_TP_DIVISIBLE" in out
    assert "the prover drops: ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP, ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL" in out
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["policy"]["dropped_assumptions"] == ["ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP",
                                                     "ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL"]
    (finding,) = data["findings"]
    case = json.loads(open(finding["case_file"]).read())
    assert case["server"]["attn_cp_size"] > 1 and not case["server"]["enable_prefill_cp"]
    # negative control: the same heads and guard with every assumption kept prove (the hole the facts close)
    assert cli.main(["prove", "--only", "guard-soundness", "--cases-dir", str(tmp_path), "--guard", "fixed",
                     "--metadata-heads", "tp"]) == 0


@pytest.fixture(scope="module")
def witness_cache():
    return {}


def _witness_stage(sut, tmp_path, cache):
    from fa3verify.engine_gate import plan_rows, replay_witnesses

    rows = plan_rows(sut, 10.0, str(tmp_path / "w"), cache)
    return replay_witnesses(sut, [r.case_file for r in rows], str(tmp_path / "cases"))


def test_the_witness_stage_replays_what_a_release_accepts_and_counts_what_it_rejects(tmp_path, witness_cache):
    # a release true to its facts: 0.5.17 accepts attention CP without prefill CP, its guard leaves it precomputing
    checks, findings = _witness_stage(FactsSUT("0.5.17"), tmp_path, witness_cache)
    assert findings and findings[0].invariant == "SPLIT_BOUND"
    case = json.loads(open(findings[0].case_file).read())
    assert case["server"]["attn_cp_size"] > 1 and not case["server"]["enable_prefill_cp"]
    assert cli.main(["replay", findings[0].case_file, "--engine", "model"]) == 1  # replays as the release
    # negative control: the same release with a validation that rejects the configuration the finding needs
    checks, findings = _witness_stage(ProfileSUT("0.5.17"), tmp_path, witness_cache)
    assert not findings and not any(c.failed for c in checks)
    rejected = [c for c in checks if c.verdict == "rejected"]
    assert rejected and all("validation rejects" in c.message for c in rejected)
    assert any(c.verdict == "pass" for c in checks)  # the witnesses it accepts still ran


def test_a_release_with_attention_tp_heads_passes_the_same_witnesses(tmp_path, witness_cache):
    checks, findings = _witness_stage(FactsSUT("0.5.23"), tmp_path, witness_cache)
    assert not findings and checks and all(c.verdict == "pass" for c in checks)
    # negative control: 0.5.23 with its heads reverted to H // tp_size fails on them
    checks, findings = _witness_stage(FactsSUT("0.5.23", heads="tp"), tmp_path, witness_cache)
    assert findings


def test_docs_facts_table_is_generated_from_the_facts():
    text = open("docs/engines.md", encoding="utf-8").read()
    inside = text.split("<!-- assumption-facts:begin -->\n", 1)[1].split("\n<!-- assumption-facts:end -->", 1)[0]
    assert inside == F.facts_markdown()


def test_gate_on_a_release_says_what_it_does_not_enforce_and_fails_where_it_accepts_an_overflow(monkeypatch,
                                                                                                  tmp_path):
    from fake_engines import install

    install(monkeypatch, lambda spec: FactsSUT(spec.release))
    code = cli.main(["gate", "--engine", "sglang==0.5.17", "--cases", "5", "--cases-dir", str(tmp_path),
                     "--json", str(tmp_path / "g.json")])
    data = json.loads((tmp_path / "g.json").read_text())
    assert code == 1 and "ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP" in data["policy"]["not_enforced_assumptions"]
    assert any(c["name"].startswith("witness search (guard 'fixed'") for c in data["checks"])


def test_the_prover_searches_heads_that_tp_size_does_not_divide_only_when_dropped():
    """falcon-7b's 71 heads on tp 2 with attn_cp 2 (attn_tp_size 1): every release accepts it (ServerArgs and the
    model-load split), so a release's profile drops ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL and the prover's domain holds
    it; negative control: with every assumption kept it is excluded, under that name alone."""
    from spec.model import domain
    from spec.model.config import MODELS, ServerConfig

    cfg = domain.Config(ServerConfig(tp_size=2, attn_cp_size=2, enable_prefill_cp=True, cp_strategy="zigzag"),
                        MODELS["falcon-7b"])
    assert [name for name, _ in domain.violations(cfg)] == ["ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL"]
    assert domain.valid(cfg, F.prover_drops(F.facts_for("sglang", "0.5.23")))
