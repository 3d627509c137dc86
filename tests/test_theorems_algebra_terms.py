"""The combine's z3 terms (spec/theorems_algebra_z3.py) built with raw z3 calls are the terms z3's operators build.

``RAW_TERMS`` switches the term helpers between the raw calls (the default, for speed) and z3's own Python
operators; every query of ``combine_exact_merge`` and ``combine_all_empty`` (each split count they check, with
and without each seeded combine defect) must come out as the identical AST both ways. The negative control seeds
a wrong raw call (``<=`` for ``<``), which the comparison must catch.
"""

import pytest
import z3

from spec import theorems_algebra_merge as merge
from spec import theorems_algebra_z3 as tz
from spec.theorems_algebra import DEFAULT_SPLIT_COUNTS, DEFECTS
from spec.z3ctx import fresh_context


def _merge_terms(n, defects):
    t = merge.exact_merge_terms(n, defects)
    out = list(t["base"]) + [t["claim"], t["reference_def"]]
    for _name, lemma, hints, _deps, _pre in t["lemmas"]:
        out += [lemma, *hints]
    return out


def _empty_terms(n, defects):
    return list(merge.all_empty_terms(n, defects)[3])


def _both_ways(monkeypatch, build, n, defects):
    """(reference terms, raw terms) in one z3 context: equal terms are the same AST there."""
    with fresh_context():
        monkeypatch.setattr(tz, "RAW_TERMS", False)
        reference = build(n, defects)
        monkeypatch.setattr(tz, "RAW_TERMS", True)
        raw = build(n, defects)
    return reference, raw


def _same(reference, raw):
    return len(reference) == len(raw) and all(a.eq(b) for a, b in zip(reference, raw))


@pytest.mark.parametrize("defects", [frozenset()] + [frozenset([d]) for d in sorted(DEFECTS)])
@pytest.mark.parametrize("build", [_merge_terms, _empty_terms], ids=["exact_merge", "all_empty"])
def test_raw_terms_are_the_operators_terms_for_every_split_count(monkeypatch, build, defects):
    for n in DEFAULT_SPLIT_COUNTS:
        reference, raw = _both_ways(monkeypatch, build, n, defects)
        assert _same(reference, raw), (build.__name__, n, sorted(defects))


def test_raw_terms_are_the_default():
    assert tz.RAW_TERMS is True


@pytest.mark.parametrize("build", [_merge_terms, _empty_terms], ids=["exact_merge", "all_empty"])
def test_negative_control_a_wrong_raw_comparison_is_caught(monkeypatch, build):
    monkeypatch.setattr(tz, "_mk_lt", z3.Z3_mk_le)  # seeded defect: the raw "<" builds "<="
    reference, raw = _both_ways(monkeypatch, build, 2, frozenset())
    assert not _same(reference, raw)
