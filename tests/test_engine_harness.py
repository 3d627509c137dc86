"""The harness over systems under test (--engine): fuzz, replay and case files carrying the engine.

Real engines are replaced by fakes (tests/fake_engines.py) so these run without an engine environment; the
negative controls are a fake engine that violates on every decode step and case files naming real code."""

import json

import pytest

from fa3verify import cli
from fa3verify.engine_choice import engine_for_case, identity_of, spec_from_identity
from fa3verify.errors import UsageError
from spec.cases import Case, CaseFormatError

from fake_engines import ProfileSUT, ViolatingSUT, install

WORKED = "tests/corpus/worked_example_prefix_guard.json"


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
    ({"name": "vllm"}, "engine.name"),
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
    from gpu_impl.sut import ModelSUT

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

    class EngineUnavailable(RuntimeError):
        pass

    def fail(spec):
        raise EngineUnavailable("no environment for sglang 0.5.14: run `fa3verify engine setup sglang==0.5.14`")

    monkeypatch.setattr(sut_mod, "open_sut", fail)
    assert cli.main(["fuzz", "--engine", "sglang==0.5.14", "--cases", "3"]) == 2
    assert "--engine: sglang==0.5.14: no environment" in capsys.readouterr().err


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
