"""Theorem names say what the theorem proves, in one style, and the ids they had before (which began with the
family number) stay accepted: by ``--only``, by spec.theorems.canonical_name, and in old case files."""

import re
from pathlib import Path

import pytest

from spec.theorems import ALIASES, CATALOGUE, THEOREMS, canonical_name, select

REPO = Path(__file__).resolve().parents[2]
#: FA3's own identifiers keep their underscores inside a name
FA3_IDENTIFIERS = re.compile(r"h_k|seqlen_k|seqlen_q")
STYLE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


def follows_style(name: str) -> bool:
    """Kebab-case words, no leading family number; underscores only inside FA3 identifiers."""
    return bool(STYLE.fullmatch(FA3_IDENTIFIERS.sub("x", name)))


def test_every_theorem_name_follows_the_one_style():
    assert [t.name for t in CATALOGUE if not follows_style(t.name)] == []


def test_negative_control_the_former_ids_break_the_style():
    """The check is not vacuous: every former id (a leading family number, or snake_case) fails it."""
    assert ALIASES and all(not follows_style(old) for old in ALIASES)
    assert not follows_style("3-hazard") and not follows_style("combine_exact_merge")


def test_every_former_id_names_one_theorem_and_no_current_name():
    assert len(ALIASES) == len(CATALOGUE)
    assert set(ALIASES.values()) == set(THEOREMS)
    assert not set(ALIASES) & set(THEOREMS)
    assert canonical_name("3-hazard") == "prefill-cp-hazard" and canonical_name("vllm-flow") == "vllm-flow"


@pytest.mark.parametrize("only, expected", [
    (["3-hazard"], ["prefill-cp-hazard"]),
    (["11-size-fork"], ["metadata-size-fork"]),
    (["combine_exact_merge"], ["combine-exact-merge"]),
    (["2-drift-breaks"], ["drift-breaks-h_k", "drift-breaks-seqlen_k", "drift-breaks-seqlen_q", "drift-breaks-pack",
                          "drift-breaks-b"]),
])
def test_only_accepts_a_former_id_or_a_part_of_one(only, expected):
    assert select(only, list(THEOREMS)) == expected


def test_only_by_family_number_selects_as_before():
    """``--only 2`` selects what it selected when names began with the family number: the family, and (as before)
    every theorem whose id contained the text."""
    by_family = [t.name for t in CATALOGUE if t.number == "2"]
    assert by_family == ["benign-drift", "drift-breaks-h_k", "drift-breaks-seqlen_k", "drift-breaks-seqlen_q",
                         "drift-breaks-pack", "drift-breaks-b"]
    before = [ALIASES_INV[n] for n in select(["4"], list(THEOREMS))]
    assert before == [a for a in ALIASES if "4" in a or THEOREMS[ALIASES[a]].number == "4"]
    assert set(by_family) <= set(select(["2"], list(THEOREMS)))


ALIASES_INV = {v: k for k, v in ALIASES.items()}


def test_an_old_prove_case_file_still_loads_with_its_former_id():
    from spec.model.cases import Case

    case = Case.load(str(REPO / "tests" / "corpus" / "prove-3-hazard-prefix-guard.json"))
    assert case.source == "prove:3-hazard"
    assert canonical_name(case.source.split(":", 1)[1]) == "prefill-cp-hazard"
