"""The harness over systems under test (--engine): fuzz, replay and case files carrying the engine.

Real engines are replaced by fakes (tests/fake_engines.py) so these run without an engine environment; the
negative controls are a fake engine that violates on every decode step and case files naming real code."""

import dataclasses
import json

import pytest

from fa3verify import cli
from fa3verify.engine_choice import engine_for_case, identity_of, spec_from_identity
from fa3verify.errors import UsageError
from spec.model.cases import Case, CaseFormatError

from fake_engines import ProfileSUT, ViolatingSUT, install

WORKED = "tests/corpus/worked_example_prefix_guard.json"
_WITNESSES = {}


@pytest.fixture(autouse=True)
def _witness_search_once(monkeypatch, tmp_path_factory):
    """The model-side witness search is deterministic: run it once for the whole file (z3 takes ~10 s)."""
    import fa3verify.engine_gate as eg

    real = eg.witness_search

    def cached(timeout_s, cases_dir, search=None):
        key = (timeout_s, search)
        if key not in _WITNESSES:
            _WITNESSES[key] = real(timeout_s, str(tmp_path_factory.mktemp("witnesses")), search=search)
        return [dataclasses.replace(r) for r in _WITNESSES[key]]

    monkeypatch.setattr(eg, "witness_search", cached)


def _case_with_engine(tmp_path, engine, name="engine-case.json"):
    data = json.loads(open(WORKED).read())
    if engine is not None:
        data["engine"] = engine
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


# -- case files carry the engine ------------------------------------------------------------------------------

def test_old_case_without_engine_means_model():
    case = Case.load(WORKED)
    assert case.engine is None and not case.on_real_engine
    assert spec_from_identity(case.engine).is_model
    assert "engine" not in case.to_dict()


def test_case_engine_round_trips_and_changes_the_signature(tmp_path):
    plain = Case.load(WORKED)
    case = Case.load(_case_with_engine(tmp_path, {"name": "sglang", "release": "0.5.14", "revision": "abc"}))
    assert case.engine == {"name": "sglang", "release": "0.5.14", "revision": "abc"}
    assert Case.from_json(case.to_json()).engine == case.engine
    assert case.signature() != plain.signature()
    assert str(spec_from_identity(case.engine)) == "sglang==0.5.14"


@pytest.mark.parametrize("engine, field", [
    ({"name": "trtllm"}, "engine.name"),
    ({"name": "vllm"}, "engine.release"),  # vLLM cases name their release, like sglang ones
    ({"name": "sglang"}, "engine.release"),
    ({"name": "sglang", "release": "five"}, "engine.release"),
    ({"name": "sglang-src"}, "engine.path"),
    ({"name": "model", "colour": 1}, "engine.colour"),
    ("sglang", "engine"),
])
def test_bad_case_engine_names_the_field(tmp_path, engine, field):
    with pytest.raises(CaseFormatError) as info:
        Case.load(_case_with_engine(tmp_path, engine))
    assert info.value.field == field


def test_a_case_never_runs_a_checkout_the_user_did_not_name(tmp_path):
    case = Case.load(_case_with_engine(tmp_path, {"name": "sglang-src", "path": "/somewhere/sglang/python"}))
    with pytest.raises(UsageError, match="--engine sglang-src=/somewhere/sglang/python"):
        engine_for_case(case)
    assert str(engine_for_case(case, "sglang-src=/somewhere/sglang/python")) == "sglang-src=/somewhere/sglang/python"


def test_identity_is_normalised():
    sut = ProfileSUT("0.5.23")
    assert identity_of(sut) == {"name": "sglang", "release": "0.5.23", "revision": "fake-rev"}
    from gpu_impl.engines.model.sut import ModelSUT

    assert identity_of(ModelSUT()) == {"name": "model"}


# -- --engine on the command line -----------------------------------------------------------------------------

def test_unknown_engine_is_exit_2_naming_the_option(capsys):
    assert cli.main(["fuzz", "--engine", "tensorrt", "--cases", "3"]) == 2
    assert "--engine" in capsys.readouterr().err


def test_policy_options_are_refused_on_a_real_engine(monkeypatch, capsys):
    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    assert cli.main(["fuzz", "--engine", "sglang==0.5.14", "--guard", "pre-fix", "--cases", "3"]) == 2
    err = capsys.readouterr().err
    assert "--guard" in err and "does not apply" in err
    assert cli.main(["fuzz", "--engine", "sglang==0.5.14", "--metadata-heads", "attn_tp", "--cases", "3"]) == 2


def test_unavailable_engine_is_exit_2(monkeypatch, capsys):
    import gpu_impl.sut as sut_mod
    from gpu_impl.engines.errors import EnvSetupError

    def fail(spec):
        raise EnvSetupError("sglang==0.5.14: no environment: run `fa3verify engine setup sglang==0.5.14`")

    monkeypatch.setattr(sut_mod, "open_sut", fail)
    assert cli.main(["fuzz", "--engine", "sglang==0.5.14", "--cases", "3"]) == 2
    assert "--engine: sglang==0.5.14: no environment" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["UnknownRelease", "NoPrecompute", "EnvSetupError", "CheckoutImportError"])
def test_every_engine_cannot_open_error_is_a_usage_error_naming_engine(monkeypatch, name):
    """Each of gpu_impl.engines.errors' "cannot open" classes, raised while opening, is a UsageError naming --engine
    (exit 2), caught by class, not by name."""
    import gpu_impl.engines.errors as errors
    import gpu_impl.sut as sut_module
    from fa3verify.engine_choice import open_engine
    from fa3verify.errors import UsageError

    def refuse(spec):
        raise getattr(errors, name)(f"{spec}: cannot be opened ({name})")

    monkeypatch.setattr(sut_module, "open_sut", refuse)
    with pytest.raises(UsageError, match=rf"^--engine: sglang==0.5.14: cannot be opened \({name}\)"):
        open_engine("sglang==0.5.14")


def test_an_error_that_is_not_an_engine_error_is_not_turned_into_a_usage_error(monkeypatch):
    """A bug while opening (any other exception) reaches the caller: it is a crash, never exit 2 or a pass."""
    import gpu_impl.sut as sut_module
    from fa3verify.engine_choice import open_engine

    class EngineUnavailable(Exception):  # the right name on the wrong class is not an engine error
        pass

    monkeypatch.setattr(sut_module, "open_sut", lambda spec: (_ for _ in ()).throw(EngineUnavailable("x")))
    with pytest.raises(EngineUnavailable):
        open_engine("sglang==0.5.14")


def test_fuzz_runs_every_case_on_the_engine_and_saves_engine_cases(monkeypatch, tmp_path):
    opened = install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    out = tmp_path / "cases"
    code = cli.main(["fuzz", "--engine", "sglang==0.5.14", "--cases", "150", "--seed", "3", "--out", str(out)])
    assert code == 1  # 0.5.14's profile (pre-fix guard, tp heads) overflows under prefill CP
    sut = opened[0]
    assert sut.runs >= 150 and sut.closed
    files = sorted(out.glob("*.json"))
    assert files
    for f in files:
        case = Case.load(f)
        assert case.engine == {"name": "sglang", "release": "0.5.14", "revision": "fake-rev"}
        assert case.policy["guard"] == "pre-fix" and case.policy["metadata_heads"] == "tp"  # the release's profile


def test_fuzz_on_a_clean_engine_passes(monkeypatch, tmp_path):
    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    assert cli.main(["fuzz", "--engine", "sglang==0.5.23", "--cases", "150", "--out", str(tmp_path)]) == 0


def test_replay_uses_the_case_engine_and_the_override(monkeypatch, tmp_path, capsys):
    opened = install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    path = _case_with_engine(tmp_path, {"name": "sglang", "release": "0.5.14"})
    assert cli.main(["replay", path]) == 1  # replays on sglang 0.5.14 (fake): still fails
    assert opened and opened[-1].spec.release == "0.5.14" and opened[-1].runs == 1
    assert cli.main(["replay", path, "--engine", "sglang==0.5.23"]) == 0  # the fixed release passes
    assert opened[-1].spec.release == "0.5.23"
    assert cli.main(["replay", path, "--engine", "model"]) == 1  # the model under the case's pre-fix policy
    assert cli.main(["replay", path, "--guard", "fixed"]) == 2  # a policy override does not apply to real code


def test_replay_refuses_a_checkout_named_only_by_the_case(tmp_path, capsys):
    path = _case_with_engine(tmp_path, {"name": "sglang-src", "path": str(tmp_path / "sglang" / "python")})
    assert cli.main(["replay", path]) == 2
    assert "--engine sglang-src=" in capsys.readouterr().err


# -- gate and prove on an engine ------------------------------------------------------------------------------

def _gate_json(tmp_path, name):
    return json.loads((tmp_path / name).read_text())


def test_gate_on_a_violating_engine_exits_1(monkeypatch, tmp_path):
    install(monkeypatch, lambda spec: ViolatingSUT(spec.release))
    code = cli.main(["gate", "--engine", "sglang==0.5.23", "--cases", "20", "--cases-dir", str(tmp_path / "c"),
                     "--json", str(tmp_path / "g.json")])
    assert code == 1
    data = _gate_json(tmp_path, "g.json")
    assert any(c["name"].startswith("witness") and c["kind"] == "replay" and c["failed"] for c in data["checks"])
    for f in data["findings"]:
        assert f["case_file"] and Case.load(f["case_file"]).engine["release"] == "0.5.23"


def test_gate_on_engines_follows_their_code(monkeypatch, tmp_path):
    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    fixed = cli.main(["gate", "--engine", "sglang==0.5.23", "--cases", "100", "--cases-dir", str(tmp_path / "a"),
                      "--json", str(tmp_path / "a.json")])
    assert fixed == 0
    data = _gate_json(tmp_path, "a.json")
    rows = {c["name"]: c for c in data["checks"]}
    assert rows["witness search: prefill-cp-hazard"]["verdict"] == "refuted" and not rows["witness search: prefill-cp-hazard"]["failed"]
    assert any(n.startswith("witness prefill-cp-hazard on sglang==0.5.23") and not r["failed"] for n, r in rows.items())
    old = cli.main(["gate", "--engine", "sglang==0.5.14", "--cases", "100", "--cases-dir", str(tmp_path / "b"),
                    "--json", str(tmp_path / "b.json")])
    assert old == 1
    data = _gate_json(tmp_path, "b.json")
    failed = [c for c in data["checks"] if c["failed"]]
    assert any(c["kind"] == "replay" for c in failed)
    case = Case.load(failed[0]["case_file"])
    assert case.engine["release"] == "0.5.14" and case.expected["invariant"] == "SPLIT_BOUND"
    assert cli.main(["replay", failed[0]["case_file"]]) == 1  # the finding replays on the engine it names


def test_gate_on_a_real_engine_needs_no_guard_and_refuses_one(monkeypatch, tmp_path):
    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    assert cli.main(["gate", "--engine", "sglang==0.5.23", "--guard", "examples/guards/fixed_guard.py:should_disable",
                     "--cases", "5", "--cases-dir", str(tmp_path)]) == 2


def test_prove_engine_profile_maps_onto_the_builtin_policies(tmp_path, capsys):
    base = ["prove", "--only", "prefill-cp-hazard", "--only", "guard-soundness", "--cases-dir", str(tmp_path)]
    assert cli.main(base + ["--engine-profile", "sglang==0.5.14"]) == 1  # pre-fix guard, tp heads
    assert "guard 'pre-fix'" in capsys.readouterr().out
    assert cli.main(base + ["--engine-profile", "sglang==0.5.23"]) == 0  # both fixes
    assert cli.main(base + ["--engine-profile", "sglang==0.5.10"]) == 2  # no precompute: nothing to prove
    assert "nothing to prove" in capsys.readouterr().err
    assert cli.main(base + ["--engine-profile", "sglang==0.5.99"]) == 2
    assert cli.main(base + ["--engine-profile", "vllm==0.33.0"]) == 2


def test_prove_replays_its_witnesses_on_the_engine(monkeypatch, tmp_path):
    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    base = ["prove", "--guard", "pre-fix", "--only", "prefill-cp-hazard", "--cases-dir", str(tmp_path),
            "--json", str(tmp_path / "p.json")]
    assert cli.main(base + ["--engine", "sglang==0.5.23"]) == 1  # the model's pre-fix theorem is still refuted
    rows = _gate_json(tmp_path, "p.json")["checks"]
    replayed = [c for c in rows if c["kind"] == "replay"]
    assert replayed and not any(c["failed"] for c in replayed)  # ... but 0.5.23's code is safe there
    assert cli.main(base + ["--engine", "sglang==0.5.12"]) == 1
    replayed = [c for c in _gate_json(tmp_path, "p.json")["checks"] if c["kind"] == "replay"]
    assert replayed and all(c["failed"] for c in replayed)


# -- conformance ----------------------------------------------------------------------------------------------

def test_conform_passes_when_the_engine_does_what_its_profile_says(monkeypatch, tmp_path):
    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    code = cli.main(["conform", "--engine", "sglang==0.5.14", "--cases", "120", "--cases-dir", str(tmp_path),
                     "--json", str(tmp_path / "c.json")])
    assert code == 0
    data = _gate_json(tmp_path, "c.json")
    assert data["conform"]["compared"] == 120 and data["conform"]["events_compared"] > 120
    assert not list(tmp_path.glob("conform-*.json"))


def test_conform_reports_a_profile_with_the_wrong_heads(monkeypatch, tmp_path, capsys):
    # negative control: the engine precomputes with attn_tp heads, the profile checked says tp
    install(monkeypatch, lambda spec: ProfileSUT(spec.release, heads="attn_tp"))
    code = cli.main(["conform", "--engine", "sglang==0.5.14", "--cases", "120", "--cases-dir", str(tmp_path)])
    assert code == 1
    assert "precompute.num_heads: model" in capsys.readouterr().out
    files = sorted(tmp_path.glob("conform-*.json"))
    assert files
    case = Case.load(files[0])
    assert case.engine["release"] == "0.5.14" and case.notes.startswith("conformance difference")


def test_conform_reports_a_wrong_guard_as_a_difference(monkeypatch, tmp_path):
    install(monkeypatch, lambda spec: ProfileSUT(spec.release, guard="fixed"))
    assert cli.main(["conform", "--engine", "sglang==0.5.14", "--cases", "150", "--cases-dir", str(tmp_path)]) == 1


def test_conform_skips_and_counts_rejected_configurations(monkeypatch, tmp_path):
    from fa3verify.commands.conform import conform
    from spec.model.engine_profiles import profile_for

    from fake_engines import NoGraphSUT

    report = conform(NoGraphSUT("0.5.23"), profile_for("0.5.23"), cases=60, cases_dir=str(tmp_path))
    assert report.skipped_rejected > 0 and report.compared + report.skipped_rejected == 60
    assert not report.differences


def test_conform_reports_configurations_spec_assumes_away(monkeypatch, tmp_path):
    from fake_engines import PermissiveSUT

    install(monkeypatch, lambda spec: PermissiveSUT(spec.release))
    code = cli.main(["conform", "--engine", "sglang==0.5.23", "--cases", "5", "--cases-dir", str(tmp_path),
                     "--json", str(tmp_path / "c.json")])
    assert code == 1
    found = {a[0] for a in _gate_json(tmp_path, "c.json")["conform"]["assumption_findings"]}
    assert "ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP" in found
    probes = [Case.load(p) for p in tmp_path.glob("conform-*.json")]
    assert probes and all(c.source == "conform" and c.notes.startswith("assumption finding") for c in probes)


@pytest.mark.parametrize("argv", [["conform"], ["conform", "--engine", "model"],
                                  ["conform", "--engine", "sglang==0.5.23", "--cases", "0"],
                                  ["conform", "--engine", "sglang==0.5.23", "--engine-profile", "sglang==0.5.3"]])
def test_conform_bad_usage_is_exit_2(monkeypatch, argv):
    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    assert cli.main(argv) == 2


def test_model_pairs_go_through_pair_summary_and_agree_with_the_model_trace():
    import random

    from fa3verify.commands.fuzz import scenario_for
    from fa3verify.policy import load_policy
    from fa3verify.strategies import random_fuzz_case
    from gpu_impl.model_pairs import PAIR_KEYS, model_pairs
    from gpu_impl.scenario import run_scenario

    policy = load_policy("none")
    paths, checked = set(), 0
    for i in range(150):
        case = random_fuzz_case(random.Random(i), numerics_share=0.0)
        scn = scenario_for(case, policy)
        result = run_scenario(scn)
        decode = [t for t in result.trace if t.get("mode") == "decode"]
        pairs = [p for p in model_pairs(scn, result) if p["path"] != "capture"]
        assert len(pairs) == len(decode)
        for p, t in zip(pairs, decode):
            assert tuple(p) == PAIR_KEYS
            assert (p["s_p"], p["s_c"]) == (t["s_p"], t["s_c"])
            assert p["call"]["seqlen_k"] == t["call_seqlen_k"] and p["precomputed"] == t["precomputed"]
            paths.add(p["path"])
            checked += 1
    assert checked > 150 and paths == {"eager", "replay"}


# -- engine setup and the engine matrix -----------------------------------------------------------------------

def test_engine_matrix_rows_follow_the_profiles(monkeypatch, tmp_path, capsys):
    from fake_engines import FactsSUT

    install(monkeypatch, lambda spec: FactsSUT(spec.release))
    out = tmp_path / "m.json"
    code = cli.main(["engine", "matrix", "--releases", "0.5.14..0.5.15", "--cases", "100", "--cases-dir",
                     str(tmp_path / "cases"), "--json", str(out)])
    assert code == 1  # 0.5.14 fails
    data = json.loads(out.read_text())
    rows = {r["release"]: r for r in data["rows"]}
    assert list(rows) == ["0.5.14", "0.5.15"]
    assert rows["0.5.14"]["verdict"] == "fail" and "SPLIT_BOUND" in rows["0.5.14"]["invariants"]
    assert any("prefill CP" in f for f in rows["0.5.14"]["families"])
    # 0.5.15's guard leaves attention CP without prefill CP precomputing with tp heads, and 0.5.15 accepts it
    # (spec/model/assumption_facts.json): the facts predict a failure there and the gate's witness finds it
    assert rows["0.5.15"]["verdict"] == "fail" and rows["0.5.15"]["expected"] == "fail"
    assert any("attention CP without prefill CP" in f for f in rows["0.5.15"]["families"])
    assert all(r["agrees"] for r in rows.values()) and data["disagreeing"] == []
    assert rows["0.5.14"]["case_files"]
    for f in rows["0.5.14"]["case_files"]:
        assert Case.load(f).engine["release"] == "0.5.14"


def test_engine_matrix_flags_a_release_that_disagrees_with_its_profile(monkeypatch, tmp_path):
    # negative control: 0.5.23's code seeded to precompute with tp heads and no guard
    install(monkeypatch, lambda spec: ProfileSUT(spec.release, heads="tp", guard="none"))
    code = cli.main(["engine", "matrix", "--releases", "0.5.23..0.5.23", "--cases", "40", "--cases-dir",
                     str(tmp_path), "--json", str(tmp_path / "m.json")])
    assert code == 1
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["disagreeing"] == ["0.5.23"]


def test_engine_matrix_unavailable_release_is_inconclusive(monkeypatch, tmp_path):
    import gpu_impl.sut as sut_mod
    from gpu_impl.engines.errors import EnvSetupError

    def fail(spec):
        raise EnvSetupError("sglang==0.5.23: no environment")

    monkeypatch.setattr(sut_mod, "open_sut", fail)
    assert cli.main(["engine", "matrix", "--releases", "0.5.23", "--cases", "5", "--cases-dir", str(tmp_path)]) == 3


@pytest.mark.parametrize("argv", [["engine", "matrix", "--releases", "0.5.9..0.5.23"],
                                  ["engine", "matrix", "--releases", "0.5.20..0.5.12"],
                                  ["engine", "matrix", "--releases", "banana"],
                                  ["engine", "setup", "sglang==0.5.10"], ["engine", "setup", "0.5.23"],
                                  ["engine", "setup", "vllm==0.1.0"], ["engine", "setup", "foo==1"],
                                  ["engine"]])
def test_engine_command_bad_usage_is_exit_2(argv, capsys):
    assert cli.main(argv) == 2


def test_engine_setup_calls_the_engine_environments_with_progress(monkeypatch, capsys):
    import sys
    import types

    calls = []
    envs = types.SimpleNamespace(ensure_env=lambda release, progress, engine: (calls.append((engine, release)),
                                                                               progress("step 1/2"),
                                                                               "/cache/sglang-" + release)[-1])
    pkg = types.ModuleType("gpu_impl.engines")
    pkg.envs = envs
    monkeypatch.setitem(sys.modules, "gpu_impl.engines", pkg)
    assert cli.main(["engine", "setup", "sglang==0.5.23"]) == 0
    out = capsys.readouterr().out
    assert calls == [("sglang", "0.5.23")] and "step 1/2" in out and "/cache/sglang-0.5.23" in out


def test_run_ranks_on_a_real_engine_runs_in_process_and_says_so(monkeypatch, capsys, tmp_path):
    opened = install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    assert cli.main(["run-ranks", WORKED, "--engine", "sglang==0.5.14", "--json", str(tmp_path / "r.json")]) == 1
    out = capsys.readouterr().out
    assert "in-process" in out and "not available for real engines" in out and "SPLIT_BOUND" in out
    assert "ignored here" not in out  # no multi-process option was given
    assert opened[0].runs == 1 and opened[0].closed
    assert cli.main(["run-ranks", WORKED, "--engine", "sglang==0.5.14", "--out-dir", str(tmp_path / "o")]) == 1
    assert "note: --out-dir applies to the multi-process run only; ignored here" in capsys.readouterr().out
    assert cli.main(["run-ranks", WORKED, "--engine", "sglang==0.5.23"]) == 0
    assert cli.main(["run-ranks", WORKED, "--engine", "sglang==0.5.23", "--compare"]) == 2
    assert cli.main(["run-ranks", WORKED, "--engine", "nope"]) == 2


def test_docs_profile_table_is_generated_from_the_profiles():
    from spec.model.engine_profiles import profiles_markdown

    text = open("docs/engines.md", encoding="utf-8").read()
    inside = text.split("<!-- profiles:begin -->\n", 1)[1].split("\n<!-- profiles:end -->", 1)[0]
    assert inside == profiles_markdown()


def test_profiles_follow_engines_md_section_1():
    from spec.model.engine_profiles import RELEASES, profile_for

    assert RELEASES[0] == "0.5.11" and RELEASES[-1] == "0.5.23" and len(RELEASES) == 13
    guards = {r: profile_for(r).guard_spec for r in RELEASES}
    heads = {r: profile_for(r).precompute_heads for r in RELEASES}
    assert guards["0.5.11"] == "none"
    assert {guards[r] for r in ("0.5.12", "0.5.13", "0.5.14")} == {"pre-fix"}
    assert {guards[r] for r in RELEASES[4:]} == {"fixed"}
    assert {heads[r] for r in RELEASES[:10]} == {"tp"} and {heads[r] for r in RELEASES[10:]} == {"attn_tp"}
    assert profile_for("0.5.14.post1") == profile_for("0.5.14")


def test_scenarios_the_engine_does_not_run_are_skipped_and_counted(monkeypatch, tmp_path):
    from fa3verify.commands.conform import conform
    from fa3verify.commands.fuzz import fuzz
    from spec.model.engine_profiles import profile_for

    from fake_engines import NoMlaSUT

    summary = fuzz(max_cases=80, budget_s=None, out_dir=str(tmp_path), sut=NoMlaSUT("0.5.23"),
                   show_progress=False)
    assert summary.exit_code == 0 and 0 < summary.cases < 80
    assert "the engine does not run were skipped" in summary.checks[-1].message
    report = conform(NoMlaSUT("0.5.23"), profile_for("0.5.23"), cases=80, cases_dir=str(tmp_path))
    assert report.skipped_unsupported > 0 and report.compared + report.skipped_unsupported == 80
    assert not report.differences


def test_engine_matrix_no_setup_reports_missing_environments_unavailable(monkeypatch, tmp_path):
    import gpu_impl.engines.envs as envs

    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    monkeypatch.setattr(envs, "env_ready", lambda release, root=None, engine="sglang": release == "0.5.15" and engine == "sglang")
    code = cli.main(["engine", "matrix", "--releases", "0.5.15..0.5.16", "--no-setup", "--cases", "30",
                     "--cases-dir", str(tmp_path), "--json", str(tmp_path / "m.json")])
    rows = {r["release"]: r for r in json.loads((tmp_path / "m.json").read_text())["rows"]}
    assert rows["0.5.15"]["verdict"] == "pass" and rows["0.5.16"]["verdict"] == "unavailable"
    assert code == 3  # one release could not run: inconclusive, never a pass


def test_a_matrix_row_that_ran_nothing_is_inconclusive_and_agrees_with_nothing():
    from fa3verify.engine_matrix import row_from_summary
    from fa3verify.summary import Check, RunSummary
    from spec.model.engine_profiles import profile_for

    summary = RunSummary(command="gate")
    summary.checks.append(Check(name="fuzz", kind="property", verdict="inconclusive", seconds=0.0,
                                inconclusive=True))
    row = row_from_summary("0.5.11", profile_for("0.5.11"), summary, 1.0, expected="fail")
    assert row.verdict == "inconclusive" and row.exit_code == 3 and row.agrees is None and row.expected == "fail"


def test_engine_setup_builds_a_vllm_environment_through_the_one_builder(monkeypatch, capsys):
    import sys
    import types

    calls = []
    envs = types.SimpleNamespace(ensure_env=lambda release, progress, engine="sglang": (
        calls.append((engine, release)), "/cache/%s-%s" % (engine, release))[-1])
    pkg = types.ModuleType("gpu_impl.engines")
    pkg.envs = envs
    monkeypatch.setitem(sys.modules, "gpu_impl.engines", pkg)
    assert cli.main(["engine", "setup", "vllm==0.33.0"]) == 0
    assert calls == [("vllm", "0.33.0")] and "/cache/vllm-0.33.0" in capsys.readouterr().out


def test_open_engine_opens_by_the_opener_its_row_names_and_refuses_any_other_row():
    """Every real engine row of gpu_impl/engine_forms.json names the plugin of an engine folder of gpu_impl.engines
    with a host side; a row naming none (the model, a named SUT) is EngineUnavailable, never opened by a guess at
    its kind."""
    from gpu_impl.engines import EngineUnavailable, open_engine, real_engine_plugins
    from gpu_impl.sut import ENGINE_REGISTRY, EngineSpec

    real = {row["kind"] for row in ENGINE_REGISTRY.values() if row["plugin"] in real_engine_plugins()}
    assert real == {"sglang", "sglang-src", "vllm", "vllm-src"}
    for spec in (EngineSpec("model"), EngineSpec("sut", target="a.b:C")):
        with pytest.raises(EngineUnavailable, match=f"no real engine of kind {spec.kind!r}"):
            open_engine(spec)
