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
