"""Backend terms of findings observed outside one scenario run of the harness: a sanitizer log's recorded pair
and a run-ranks verdict.

Invariant: such a finding carries the same terms as a fuzz, gate or replay finding (``fa3verify.finding_terms``:
configuration, path, the FA3 arguments that differ, S_p vs S_c, the guard's decision, a fix hint), each read from
data the finding has -- a sanitizer finding from the precompute/call pair it recorded (what sglang's
``flashattention_backend.py`` passed to FA3, normalised by ``gpu_impl.fa3_calls.pair_summary``) and, for the
configuration, its replayable case; a run-ranks finding from one run of its case file on the model, the scenario
every rank ran -- and a term the data does not give is left empty, never guessed.
"""

from __future__ import annotations

from typing import Optional

from .finding_terms import case_file_terms, config_label_of_case, differing_arguments, hint_for

__all__ = ["sanitizer_terms", "run_ranks_terms", "print_backend_terms"]


def _guard(pair: dict) -> str:
    if pair.get("precomputed"):
        return "the engine's guard kept the precompute (the call was passed its scheduler_metadata)"
    return "the call was passed scheduler_metadata of no recorded precompute"


def sanitizer_terms(line: dict, mode: Optional[str] = None) -> dict:
    """The terms of one sanitizer log ``violation`` line (``fa3verify.sanitize.records``): the recorded pair's
    differing arguments, S_p/S_c, the call's cache lengths when read, the path (a log written before it was
    recorded: none), the guard's decision, the configuration of its case file (when one was written), a hint."""
    pair = line.get("summary") or {}
    violations = line.get("violations") or [{}]
    invariant = violations[0].get("invariant", "")
    differs = differing_arguments(pair) if pair.get("precompute") else {}
    lens = (line.get("call") or {}).get("cache_seqlens")
    terms = {"ran_on": "the sanitized process" + (f" (sanitizer mode {mode})" if mode else ""),
             "path": line.get("path") or "", "differs": differs, "seq_lens": list(lens) if lens else None,
             "s_p": pair.get("s_p"), "s_c": pair.get("s_c"), "guard": _guard(pair) if pair else "",
             "hint": hint_for(invariant, differs)}
    config = _case_config(line.get("case_file"))
    if config:
        terms["config"] = config
    return terms


def _case_config(path: Optional[str]) -> str:
    from .errors import UsageError
    from .replaying import load_case

    if not path:
        return ""
    from .sanitize.records import recorded_layout_text

    try:
        case = load_case(path)
        return recorded_layout_text(case) or config_label_of_case(case)
    except (UsageError, ValueError, KeyError, TypeError, OSError):
        return ""


def run_ranks_terms(case_path: str, invariant: str, world: int, backend: str) -> dict:
    """The terms of a run-ranks finding: its case file run once on the model (the scenario every rank ran), the
    finding of the same invariant; and which system ran it ({world} processes over {backend})."""
    terms = dict(case_file_terms(case_path, invariant=invariant) or {})
    terms.pop("message", None)  # the evidence is the ranks' own message
    terms["ran_on"] = f"the model, one process per attention rank ({world} ranks, {backend})"
    terms.setdefault("hint", hint_for(invariant))
    return terms


def print_backend_terms(finding) -> None:
    """A finding's backend-terms sentence and fix hint as two indented lines (as ``replay`` prints them)."""
    from .summary import finding_sentence

    sentence = finding_sentence(finding)
    if sentence:
        print(f"  in backend terms: {sentence}")
    if finding.hint:
        print(f"  fix: {finding.hint}")
