"""The bounds, option ranges and exit-code contract stated in docs/case-format.md and docs/reports.md
are the ones the code enforces (the behaviours are checked in tests/test_cli_*.py and cli/test_cli_fuzz.py)."""

import re
from pathlib import Path

import pytest

import spec.model.cases as cases
from fa3verify import exitcodes, validation
from fa3verify.commands import replay as replaying

DOCS = Path(__file__).resolve().parents[2] / "docs"
CASE_DOC = (DOCS / "case-format.md").read_text()
REPORTS_DOC = (DOCS / "reports.md").read_text()


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_every_bound_in_the_docs_is_the_constant_the_reader_enforces():
    rows = re.findall(r"^\| (.+?) \| (\d+)(?: [a-z]+)? \(`([A-Za-z0-9_.]+)`", _section(CASE_DOC, "Bounds"), re.M)
    assert len(rows) == 11
    for _, number, name in rows:
        module, _, const = name.rpartition(".")
        value = getattr(replaying if module else cases, const)
        assert int(number) == value, name


@pytest.mark.parametrize("name", ["MAX_RANKS", "MAX_HEADS", "MAX_NUM_SM", "MAX_PAGE_SIZE", "MAX_LEN", "MAX_STEPS",
                                  "MAX_BATCH", "MAX_SEED", "MAX_CASE_CHARS", "MAX_JSON_DEPTH"])
def test_every_case_bound_constant_is_documented(name):
    assert f"`{name}`" in CASE_DOC


def test_the_option_ranges_table_matches_the_validation_table():
    table = _section(REPORTS_DOC, "Exit codes: the contract")
    rows = dict(re.findall(r"^\| (`--[^|]+) \| ([^|]+) \|$", table, re.M))
    documented = {}
    for opts, allowed in rows.items():
        for opt in re.findall(r"`(--[a-z-]+)`", opts):
            documented[opt] = allowed.strip()
    for dest in ("timeout_s", "budget_s", "fuzz_budget_s", "total_budget_s", "guard_timeout_s", "cases", "seed",
                 "world", "workers"):
        kind, lo, hi, inc = validation.NUMERIC_OPTIONS[dest]
        assert documented[validation.option_name(dest)].startswith(validation.allowed_range(kind, lo, hi, inc)), dest


def test_the_exit_code_table_is_the_code_table():
    table = _section(REPORTS_DOC, "Exit codes: the contract")
    rows = re.findall(r"^\| (\d) \| `([a-z-]+)` \|", table, re.M)
    assert {int(c): v for c, v in rows} == exitcodes.NAMES


def test_the_trust_model_names_the_project_guard_modules():
    from spec.model.guards import PROJECT_GUARD_MODULES

    trust = _section(CASE_DOC, "Trust model")
    for module in PROJECT_GUARD_MODULES:
        assert f"`{module}`" in trust
    assert "--trust-case-guard" in trust and "GUARD_TIMEOUT" in trust
