"""Every engine is a folder behind one interface (gpu_impl.plugin.EnginePlugin): each --engine form's registry row
names its plugin, the plugins answer what the registry's flags answered, and the harness asks the plugin instead of
branching on a flag (a seeded flag branch is caught)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpu_impl.plugin import EnginePlugin
from gpu_impl.sut import ENGINE_REGISTRY, parse_engine

ROOT = Path(__file__).resolve().parents[2]
FORMS = ["model", "sglang==0.5.23", "sglang-src=/x", "vllm==0.33.0", "vllm-src=/x", "sut=a.b:C"]

#: what the registry's flag columns answered for each form before they became plugin methods
FLAGS = {  # (scenario policy, named only, seeds defects, options key, conform, proof stages)
    "model": (True, False, True, None, None, ("theorems",)),
    "sglang": (False, False, False, None, "model-profile", ("witnesses",)),
    "sglang-src": (False, True, False, None, "model-profile", ("witnesses",)),
    "vllm": (False, False, True, "vllm", "own-profile", ("witnesses", "flow-theorem")),
    "vllm-src": (False, True, True, "vllm", "own-profile", ("witnesses", "flow-theorem")),
    "sut": (False, True, False, None, "model-profile", ("witnesses",)),
}


def test_every_row_names_a_plugin_in_an_engine_folder_and_no_flag_columns():
    for row in ENGINE_REGISTRY.values():
        assert set(row) <= {"kind", "prefix", "takes", "plugin", "example", "help", "what"}, row
        assert row["plugin"].startswith("gpu_impl.engines.") and row["plugin"].split(":")[0].endswith(".plugin")
        assert isinstance(parse_engine(FORMS[list(ENGINE_REGISTRY).index(row["kind"])]).plugin, EnginePlugin)


@pytest.mark.parametrize("text", FORMS)
def test_the_plugins_answer_what_the_flags_answered(text):
    spec = parse_engine(text)
    p = spec.plugin
    got = (p.runs_scenario_policy(spec), p.named_only(spec), p.applies_defects(spec), p.options_key,
           p.conformance(spec), p.proof_stages(spec))
    assert got == FLAGS[spec.kind]


def test_a_case_carrying_another_engines_options_is_refused_naming_the_engine_that_runs_them():
    spec = parse_engine("sglang==0.5.23")
    with pytest.raises(ValueError, match=r"vllm: .*--engine vllm==V"):
        spec.plugin.check_case_options(spec, {"vllm": {}})
    vllm = parse_engine("vllm==0.33.0")
    vllm.plugin.check_case_options(vllm, {"vllm": {}})


FLAG_BRANCH = re.compile(r"\b(if|elif|and|or|not)\b[^#]*\.(runs_scenario_policy|seeds_defects|runs_vllm_cases|"
                         r"flow_theorem|conform)\b|==\s*[\"']own-profile")


def _flag_branches(root: Path) -> list:
    return [f"{p.relative_to(root)}:{i}" for p in sorted((root / "fa3verify").rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if FLAG_BRANCH.search(line.split("#")[0])]


def test_the_harness_branches_on_no_registry_flag():
    assert _flag_branches(ROOT) == []


def test_negative_control_a_seeded_flag_branch_is_found(tmp_path):
    (tmp_path / "fa3verify").mkdir()
    (tmp_path / "fa3verify" / "x.py").write_text("def f(spec):\n    if not spec.runs_scenario_policy:\n"
                                                 "        return 1\n")
    assert _flag_branches(tmp_path) == ["fa3verify/x.py:2"]


# -- engine-owned case options: the schema is the plugin's, and only vLLM's folder names vLLM's options ----------

VLLM_FOLDER = Path("gpu_impl") / "engines" / "vllm"


def _vllm_option_names() -> frozenset:
    from gpu_impl.engines.vllm.options import VLLM_FIELDS

    return frozenset(VLLM_FIELDS)


def _defines_option_names(path: Path, names: frozenset) -> list:
    """Lines of ``path`` whose literal (tuple, list, set, or dict keys) holds two or more of ``names``: a module
    that defines an engine's option names (its schema, a strategy drawing them) rather than passing one value."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        elts = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) or not elts:
            continue
        named = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in names}
        if len(named) >= 2:
            found.append(f"line {node.lineno}")
    return found


def _option_definitions(root: Path) -> list:
    names = _vllm_option_names()
    return [f"{p.relative_to(root)} {where}" for package in ("refmodel", "spec", "gpu_impl", "fa3verify")
            for p in sorted((root / package).rglob("*.py")) if not p.relative_to(root).is_relative_to(VLLM_FOLDER)
            for where in _defines_option_names(p, names)]


def test_no_module_outside_the_vllm_folder_defines_vllms_option_names():
    assert _option_definitions(ROOT) == []
    assert _defines_option_names(ROOT / VLLM_FOLDER / "options.py", _vllm_option_names())  # the schema is here


def test_negative_control_a_seeded_option_table_outside_the_folder_is_found(tmp_path):
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "x.py").write_text("FIELDS = ('piecewise', 'kv_cache_dtype')\nok = {'piecewise': False}\n")
    (tmp_path / "fa3verify").mkdir()
    (tmp_path / "fa3verify" / "y.py").write_text("opts = {'num_layers': 2, 'sliding_window': 4096}\n")
    (tmp_path / VLLM_FOLDER).mkdir(parents=True)
    (tmp_path / VLLM_FOLDER / "z.py").write_text("FIELDS = ('piecewise', 'kv_cache_dtype')\n")
    assert _option_definitions(tmp_path) == ["spec/x.py line 1", "fa3verify/y.py line 1"]


def test_spec_names_no_engine_option_and_validates_options_through_the_plugins_schema():
    from spec.model import cases

    source = (ROOT / "spec" / "model" / "cases.py").read_text()
    assert not _defines_option_names(ROOT / "spec" / "model" / "cases.py", _vllm_option_names())
    assert "vllm" not in source.replace('"vllm": "release", "vllm-src": "path"', "")  # its engine-name table only
    assert set(cases._options_schemas()) == {"vllm"}  # handed down by gpu_impl from the plugins


def _case_data(**extra) -> dict:
    return {"schema": "fa3verify.case/1", "id": "x", "source": "manual",
            "server": {"tp_size": 1, "dp_size": 1, "attn_cp_size": 1, "enable_dp_attention": False,
                       "enable_prefill_cp": False},
            "model": {"name": "m", "num_heads": 8, "num_kv_heads": 8, "head_dim": 128},
            "policy": {"guard": "fixed", "metadata_heads": "tp", "clear_stale_cp_metadata": True},
            "batches": [{"mode": "decode", "seq_lens": [5]}],
            "expected": {"outcome": "pass", "invariant": None, "detail": {}}, **extra}


def test_old_case_files_with_a_vllm_object_load_as_options_and_are_written_with_options():
    from spec.model.cases import Case, CaseFormatError

    old = Case.from_dict(_case_data(vllm={"piecewise": True}))
    new = Case.from_dict(_case_data(options={"vllm": {"piecewise": True}}))
    assert old.options == new.options == {"vllm": {"piecewise": True}}
    assert old.signature() == new.signature()  # the same case id as before options
    assert "options" in old.to_dict() and "vllm" not in old.to_dict()
    # the plugin's schema runs on both spellings, naming the field where the file has it
    with pytest.raises(CaseFormatError, match=r"^vllm\.kv_cache_dtype"):
        Case.from_dict(_case_data(vllm={"kv_cache_dtype": "int4"}))
    with pytest.raises(CaseFormatError, match=r"^options\.vllm\.kv_cache_dtype"):
        Case.from_dict(_case_data(options={"vllm": {"kv_cache_dtype": "int4"}}))
    with pytest.raises(CaseFormatError, match=r"^options\.trt: .*options of an engine that takes options \(vllm\)"):
        Case.from_dict(_case_data(options={"trt": {}}))
    with pytest.raises(CaseFormatError, match=r"^vllm: expected absent when the case has an options object"):
        Case.from_dict(_case_data(vllm={}, options={"vllm": {}}))
    with pytest.raises(CaseFormatError, match=r"^trt: expected one of the top-level fields .*options, got"):
        Case.from_dict(_case_data(trt={}))


def test_the_model_refuses_a_scenario_carrying_another_engines_options():
    import dataclasses

    from gpu_impl.config import MODELS, ServerConfig
    from gpu_impl.engines.model.sut import ModelSUT
    from gpu_impl.guards import load_guard
    from gpu_impl.scenario import Scenario, Step

    scn = Scenario(server=ServerConfig(), model=MODELS["llama-3-8b"], guard=load_guard("fixed"),
                   steps=[Step(mode="decode", seq_lens=[5])])
    ModelSUT().run(scn)
    with pytest.raises(ValueError, match=r"^vllm: .* run it on vllm==V"):
        ModelSUT().run(dataclasses.replace(scn, options={"vllm": {"piecewise": True}}))


def test_the_harness_reaches_vllms_families_profiles_and_conformance_through_its_plugin():
    from fa3verify.strategies import FAMILIES, family
    from gpu_impl.engines.vllm import strategies
    from gpu_impl.plugin import engine_profile_for
    from spec.model.engine_profiles import ProfileError

    spec = parse_engine("vllm==0.33.0")
    assert spec.plugin.strategy_families() == strategies.FAMILIES
    assert {n: FAMILIES[n] for n in strategies.FAMILIES} == strategies.FAMILIES and family("vllm-v2") is strategies.vllm_v2_case
    assert engine_profile_for("vllm==0.33.0") == ("vllm", spec.plugin.release_profile("0.33.0"))
    assert engine_profile_for("sglang==0.5.23")[0] == "sglang"
    with pytest.raises(ProfileError, match=r"^want sglang==V \(0\.5\.11 \.\. 0\.5\.23\) or vllm==V \("):
        engine_profile_for("trt==1")
    assert spec.plugin.own_profile(spec, None, "0.33.0") is spec.plugin.release_profile("0.33.0")
    from gpu_impl.plugin import OwnProfileRefused

    with pytest.raises(OwnProfileRefused) as err:
        spec.plugin.own_profile(spec, "sglang==0.5.23", "0.33.0")
    assert err.value.option == "--engine-profile" and "want vllm==V" in str(err.value)
    for text in FORMS:  # the plugins that take no options own no schema and drop no assumption
        other = parse_engine(text)
        if other.plugin.options_key is None:
            assert other.plugin.assumptions_not_required() == () and other.plugin.strategy_families() == {}


def test_enginespec_keeps_no_flag_the_plugin_answers():
    from gpu_impl.sut import EngineSpec

    gone = {"runs_scenario_policy", "named_only", "found_on", "seeds_defects", "runs_vllm_cases", "conform",
            "flow_theorem", "fa3_build"}
    assert not gone & set(vars(EngineSpec))
