"""Verdict words are enums, defined once in ``spec/finding.py``, and serialise to the words reports have always carried;
no module of the packages compares a value with a bare verdict word."""

import ast
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from spec import finding
from spec.finding import (CatalogueStatus, DeviceOutcome, MatrixVerdict, Outcome, ProbeResult, StageStatus,
                          TheoremVerdict, Verdict)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("refmodel", "spec", "gpu_impl", "fa3verify")

#: Every enum of verdict words (each a subclass of spec.finding's word base) and its words, in order: a word renamed
#: here changes JSON reports, case files and the matrix tables.
WORDS = {
    TheoremVerdict: ["proved", "refuted", "inconclusive", "expected-refutation"],
    Verdict: ["pass", "fail", "inconclusive", "usage-error"],
    MatrixVerdict: ["pass", "fail", "inconclusive", "unavailable", "usage-error"],
    ProbeResult: ["pass", "pass (no precompute)", "fail", "error"],
    StageStatus: ["pending", "pass", "fail", "inconclusive", "skipped"],
    CatalogueStatus: ["caught", "missed", "silent", "fired", "n/a", "inconclusive", "error"],
    DeviceOutcome: ["pass", "agrees", "nan", "mismatch", "shape_error", "predicted_oob", "crash", "timeout", "error",
                    "not run"],
    Outcome: ["pass", "violation", "shape_error", "clear_error", "unsupported", "error", "nan", "not-modelled",
              "rejected", "process_abort", "inconclusive", "rank_error", "timeout"],
}

#: Comparisons with one of those words that compare something else, each with why (path -> the comparison as
#: ``ast.unparse`` writes it).
NOT_VERDICTS = {
    "gpu_impl/engines/host.py": {
        "kind == 'unsupported'": "an engine driver's reply kind (the worker protocol), turned into ScenarioUnsupported",
    },
    "gpu_impl/engines/lifecycle_runs.py": {
        "'not run' in found": "a key of the lifecycle sequence's findings (the sequence could not run, with why)",
    },
    "fa3verify/gpu_check/fuzz_stage.py": {
        "res.kind == 'timeout'": "the worker pool's kind of a task killed at its deadline (fa3verify.workers)",
    },
    "fa3verify/sanitize/records.py": {
        "x.get('type') == 'violation'": "a sanitizer log record's type (its JSON lines), not an outcome",
    },
}


def all_words() -> set:
    return {m.value for words in WORDS for m in words}


def _leading_word(text: str, words: set) -> bool:
    """``text`` is a word, or a word followed by a colon or a space (a cell such as "fail: SPLIT_BOUND")."""
    return text.rstrip(": ") in words


def bare_word_comparisons(source: str, words: set) -> list:
    """Each comparison in ``source`` with a string literal (alone, or in a tuple, list or set) that is one of
    ``words``, and each ``startswith``/``endswith`` on such a word (or on one followed by a colon), as ``ast.unparse``
    writes it; and each ``match`` case on such a literal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "endswith") and node.args:
            arg = node.args[0]
            items = arg.elts if isinstance(arg, ast.Tuple) else [arg]
            if any(isinstance(x, ast.Constant) and isinstance(x.value, str) and _leading_word(x.value, words)
                   for x in items):
                found.append(ast.unparse(node))
        if isinstance(node, ast.Compare):
            literals = []
            for side in (node.left, *node.comparators):
                items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                literals += [x.value for x in items if isinstance(x, ast.Constant) and isinstance(x.value, str)]
            if any(v in words for v in literals):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.MatchValue) and isinstance(node.value, ast.Constant) \
                and node.value.value in words:
            found.append(f"case {node.value.value!r}")
    return found


def test_every_word_enum_of_spec_finding_is_pinned():
    defined = {obj for obj in vars(finding).values()
               if isinstance(obj, type) and issubclass(obj, finding._Word) and obj is not finding._Word}
    assert defined == set(WORDS)
    for words, values in WORDS.items():
        assert [m.value for m in words] == values, words.__name__


@pytest.mark.parametrize("words", list(WORDS), ids=lambda w: w.__name__)
def test_words_serialise_as_they_always_did(words):
    for member in words:
        assert member == member.value and str(member) == member.value and f"{member}" == member.value
        assert repr(member) == repr(member.value)
        assert json.dumps({"v": member, "l": [member]}) == json.dumps({"v": member.value, "l": [member.value]})


def test_no_bare_verdict_word_is_compared_in_the_packages():
    words, bad = all_words(), []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            allowed = NOT_VERDICTS.get(rel, {})
            bad += [f"{rel}: {c}" for c in bare_word_comparisons(path.read_text(), words) if c not in allowed]
    assert not bad, "compare with the enum member of spec.finding instead:\n" + "\n".join(bad)


def test_every_allowed_comparison_still_exists():
    words = all_words()
    for rel, allowed in NOT_VERDICTS.items():
        found = set(bare_word_comparisons((ROOT / rel).read_text(), words))
        assert set(allowed) <= found, f"{rel}: {set(allowed) - found} no longer there: drop it from NOT_VERDICTS"


def test_a_bare_verdict_word_is_found():
    seeded = ("def f(r, row, o):\n"
              "    if r.verdict == 'proved':\n"
              "        return 1\n"
              "    if row.verdict in ('unavailable', 'inconclusive'):\n"
              "        return 2\n"
              "    if o.outcome == TheoremVerdict.PROVED:\n"
              "        return 3\n"
              "    if cell.startswith('fail: ') or cell.startswith(f'{ProbeResult.FAIL}: '):\n"
              "        return 4\n"
              "    match o.status:\n"
              "        case 'fired':\n"
              "            return 5\n")
    assert sorted(bare_word_comparisons(seeded, all_words())) == sorted([
        "r.verdict == 'proved'", "row.verdict in ('unavailable', 'inconclusive')", "cell.startswith('fail: ')",
        "case 'fired'"])


def test_results_carry_the_members_and_write_the_words():
    from fa3verify.engine_matrix import MatrixRow
    from fa3verify.summary import Check, RunSummary
    from spec.theorems.results import TheoremResult

    r = TheoremResult("t", "refuted", 0.0)
    assert r.verdict is TheoremVerdict.REFUTED and json.loads(json.dumps(r.to_dict()))["verdict"] == "refuted"
    with pytest.raises(ValueError, match="verdict: must be one of"):
        TheoremResult("t", "pass", 0.0)
    theorem, row = (Check("t", "theorem", "inconclusive", 0.0),
                    Check("fuzz", "property", "inconclusive", 0.0, inconclusive=True))
    assert theorem.verdict is TheoremVerdict.INCONCLUSIVE and row.verdict is Verdict.INCONCLUSIVE
    assert Check("x", "property", "a later word", 0.0).verdict == "a later word"
    summary = RunSummary("fuzz", checks=[row])
    assert summary.verdict is Verdict.INCONCLUSIVE
    assert json.loads(json.dumps(summary.to_dict()))["checks"][0]["verdict"] == "inconclusive"
    m = MatrixRow(release="0.5.23", verdict="unavailable", exit_code=3, expected="pass", fa3_build="x")
    assert m.verdict is MatrixVerdict.UNAVAILABLE and m.expected is MatrixVerdict.PASS
    assert json.loads(json.dumps(asdict(m)))["verdict"] == "unavailable"
