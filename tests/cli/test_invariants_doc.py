"""docs/invariants.md is generated from spec's registries, and the theorem registry matches what prove runs."""

from pathlib import Path

from fa3verify.commands.invariants import catalogue, to_markdown
from fa3verify.policy import load_policy
from fa3verify.commands.prove import theorem_jobs
from spec.theorems import THEOREMS

DOC = Path(__file__).resolve().parents[2] / "docs" / "invariants.md"


def test_invariants_page_is_current():
    assert DOC.read_text() == to_markdown(catalogue()), \
        "docs/invariants.md is stale: run `fa3verify invariants --format markdown > docs/invariants.md`"


def test_theorem_registry_names_every_theorem_prove_runs():
    """The theorems prove's jobs compute, each once, for every guard; that a run's results are exactly its jobs'
    names, in order, is checked on a whole run in tests/prover/test_prover_parallel.py."""
    for guard in ("fixed", "pre-fix", "none"):
        names = [n for job in theorem_jobs(load_policy(guard), cases_dir=None) for n in job.names]
        assert len(names) == len(set(names)) and set(names) == set(THEOREMS), guard
