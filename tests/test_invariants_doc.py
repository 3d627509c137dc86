"""docs/invariants.md is generated from spec's registries, and the theorem registry matches what prove runs."""

from pathlib import Path

from fa3verify.commands.invariants import catalogue, to_markdown
from fa3verify.policy import load_policy
from fa3verify.proving import theorem_results
from spec.theorems import THEOREMS

DOC = Path(__file__).resolve().parents[1] / "docs" / "invariants.md"


def test_invariants_page_is_current():
    assert DOC.read_text() == to_markdown(catalogue()), \
        "docs/invariants.md is stale: run `fa3verify invariants --format markdown > docs/invariants.md`"


def test_theorem_registry_names_every_theorem_prove_runs():
    names = [r.name for r in theorem_results(load_policy("fixed"), cases_dir=None)]
    assert set(names) == set(THEOREMS)
