"""The project's one finding type and its outcomes: what a check found broken, from the check to every report.

A :class:`Finding` is made where a check finds something (spec's invariants and domain assumptions, the kernel
model's plan checks, a scenario run's steps, the judge's faults: ``fa3verify.judge``) and the same object travels
through the run's result (``gpu_impl.scenario.ScenarioResult``), the judge's verdict (``fa3verify.judge.Verdict``),
the campaign's observation and its record of a signature's first case (``fa3verify.campaign``) into the run summary
(``fa3verify.summary.RunSummary.findings``), where the command fills in the report fields (the case file it was
saved to, the stage that found it, its replay command, the backend terms: ``fa3verify.finding_terms``) with
:meth:`Finding.reported`. Every surface renders it from here: the CLI and JUnit (:func:`finding_lines`), the JSON
report (:meth:`Finding.report_dict`, schema fa3verify.run/1), the HTML and Markdown pages and ``report merge``
(the same JSON), the Python API and the pytest plugin (:meth:`Finding.api_dict`).

:class:`Outcome` names what one run (a scenario, a kernel call, a replay) did; it is a ``str`` enum whose values are
the words the JSON reports and case files have always carried, so they serialise to the same bytes. Its exit code
is :func:`fa3verify.exitcodes.outcome_exit_code` (the one mapping).

Every other verdict word is an enum of the same kind, one per concept, defined here once: a theorem's
:class:`TheoremVerdict`, a run's and a summary row's :class:`Verdict`, an engine-matrix row's :class:`MatrixVerdict`
and its family probes' :class:`ProbeResult`,
a gpu-check stage's :class:`StageStatus`, a bug-catalogue engine's :class:`CatalogueStatus` and a gpu-check recorder's
:class:`DeviceOutcome`. Code compares with the members, never with the bare words
(``tests/robustness/test_verdict_words.py``).

Its own module, with no imports beyond the standard library, so that what needs only the types (the assumption
checks, case validation, the command line's input checks) does not import torch.
"""

from __future__ import annotations

import enum
from dataclasses import KW_ONLY, dataclass, field, fields, replace
from typing import Any, Mapping, Optional

__all__ = ["Outcome", "TheoremVerdict", "Verdict", "MatrixVerdict", "StageStatus", "CatalogueStatus",
           "DeviceOutcome", "ProbeResult", "Finding", "REPORT_FIELDS", "finding_lines", "finding_sentence"]


class _Word(enum.StrEnum):
    """A word a report or a case file carries, as an enum member: compares equal to (and serialises as) its value."""

    def __repr__(self) -> str:
        """The value's repr (``'pass'``), so that a list or a message that shows these words reads as it always did."""
        return repr(self.value)


class Outcome(_Word):
    """What one run did. Compares equal to (and serialises as) its value: ``Outcome.PASS == "pass"``."""

    PASS = "pass"                  #: nothing found
    VIOLATION = "violation"        #: a finding: an invariant broken, a guard fault, an FA3 abort, a crash as NO_CRASH
    SHAPE_ERROR = "shape_error"    #: FA3's loud shape check refused the call: loud and safe, not a violation
    CLEAR_ERROR = "clear_error"    #: a rejection naming the argument (FA3's TORCH_CHECK, a ValueError): allowed
    UNSUPPORTED = "unsupported"    #: the system under test does not run this scenario: skipped, counted, never a pass
    ERROR = "error"                #: the system under test crashed and the caller asked for the crash, not a finding
    NAN = "nan"                    #: a case file's expectation: NaN in the output (a replay matches it by a violation)
    NOT_MODELLED = "not-modelled"  #: a replayed case needs a path the scenario runner does not model (inconclusive)
    REJECTED = "rejected"          #: one FA3 call pair evaluated on its inputs: a TORCH_CHECK refused it (safe)
    PROCESS_ABORT = "process_abort"  #: one FA3 call pair evaluated on its inputs: FA3 ends the process (unsafe)
    INCONCLUSIVE = "inconclusive"  #: no answer: a deadline, a budget, an interrupt, nothing ran
    RANK_ERROR = "rank_error"      #: a multi-rank run (``fa3verify.multirank``): a rank raised or died (a failure)
    TIMEOUT = "timeout"            #: a multi-rank run past its deadline: its ranks were killed (inconclusive)

    @classmethod
    def of(cls, findings, shape_errors=()) -> "Outcome":
        """A finished run's outcome: a violation when it found something, else a shape error, else a pass."""
        if findings:
            return cls.VIOLATION
        if shape_errors:
            return cls.SHAPE_ERROR
        return cls.PASS


class TheoremVerdict(_Word):
    """A theorem's verdict (``spec.theorems.results.TheoremResult.verdict``)."""

    PROVED = "proved"              #: z3 answered unsat for the property's negation on the whole stated domain
    REFUTED = "refuted"            #: z3 (or a search) found a witness
    INCONCLUSIVE = "inconclusive"  #: z3 answered unknown (a timeout, incompleteness): never counted as proved
    EXPECTED_REFUTATION = "expected-refutation"  #: a documented, expected witness; proved on the rest of the domain


class Verdict(_Word):
    """The verdict word of a run summary and of one row of it (``fa3verify.summary.RunSummary.verdict``,
    ``Check.verdict`` of a fuzz, conform, replay or catalogue row; a theorem row carries its
    :class:`TheoremVerdict`), one per exit code (``fa3verify.exitcodes.verdict_name``)."""

    PASS = "pass"                  #: exit 0
    FAIL = "fail"                  #: exit 1: a violation
    INCONCLUSIVE = "inconclusive"  #: exit 3: no answer
    USAGE_ERROR = "usage-error"    #: exit 2: bad input or usage


class MatrixVerdict(_Word):
    """One release's row of the engine matrix (``fa3verify.engine_matrix.MatrixRow.verdict``) and the verdict its
    profile predicts (``MatrixRow.expected``, "" when there is none)."""

    PASS = "pass"                  #: the release's gate passed
    FAIL = "fail"                  #: the release's gate found a violation
    INCONCLUSIVE = "inconclusive"  #: the gate gave no answer (or crashed)
    UNAVAILABLE = "unavailable"    #: the release cannot be opened here (its reason in the row's message)
    USAGE_ERROR = "usage-error"    #: the gate refused its input (exit 2)


class ProbeResult(_Word):
    """One family probe of an engine-matrix row (``fa3verify.engine_matrix.run_probes``): the cell is the word, or
    ``"fail: INVARIANT, ..."`` / ``"error: why"`` (the word, a colon and what broke)."""

    PASS = "pass"                                  #: the probe ran and nothing broke
    PASS_NO_PRECOMPUTE = "pass (no precompute)"    #: nothing broke, and no call used precomputed metadata
    FAIL = "fail"                                  #: invariants broke (named after the colon)
    ERROR = "error"                                #: the engine crashed or refused the probe (why after the colon)


class StageStatus(_Word):
    """One stage of ``fa3verify gpu-check`` (``fa3verify.gpu_check.runner.Stage.status``)."""

    PENDING = "pending"            #: not run yet
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    SKIPPED = "skipped"            #: left out (``--skip``) or not applicable on this machine


class CatalogueStatus(_Word):
    """One engine on one bug-catalogue entry, defect on or off (``fa3verify.catalogue.results.EngineOutcome``)."""

    CAUGHT = "caught"              #: defect on: the engine found it
    MISSED = "missed"              #: defect on: the engine did not
    SILENT = "silent"              #: defect off: nothing found, as it should be
    FIRED = "fired"                #: defect off: the engine found something (a false alarm)
    NOT_APPLICABLE = "n/a"         #: the engine has nothing for this entry
    INCONCLUSIVE = "inconclusive"  #: z3 unknown
    ERROR = "error"                #: the engine itself failed (the detail says how)


class DeviceOutcome(_Word):
    """What one call (or worked example) on a real GPU did, as gpu-check's recorders write it
    (``fa3verify.gpu_check.fuzz_cases``, ``fa3verify.gpu_check.worked_example``, ``fa3verify.gpu_check.fuzz_stage``)."""

    PASS = "pass"                    #: a fuzz case's call: no NaN, no predicted violation, within FA3's tolerance
    AGREES = "agrees"                #: the worked example: within FA3's tolerance of the oracle
    NAN = "nan"                      #: NaN in a real row's output
    MISMATCH = "mismatch"            #: outside FA3's tolerance of the oracle
    SHAPE_ERROR = "shape_error"      #: FA3's loud shape check refused the call
    PREDICTED_OOB = "predicted_oob"  #: the model predicts an out-of-bounds read for the call
    CRASH = "crash"                  #: the worker died
    TIMEOUT = "timeout"              #: the worker was killed at its deadline
    ERROR = "error"                  #: the worker raised
    NOT_RUN = "not run"              #: no time was left to run it


#: The fields of a finding in a run summary's JSON (schema fa3verify.run/1), in their order there.
REPORT_FIELDS = ("invariant", "case_file", "engine", "message", "replay", "check", "ran_on", "config", "config_terms",
                 "path", "source", "differs", "seq_lens", "s_p", "s_c", "guard", "hint")


@dataclass(frozen=True)
class Finding:
    """A check found this broken.

    Where it was found: the invariant, the (actual) batch it concerns, the offending values and indices
    (``detail``), a sentence (``message``), and where a run found it (``step``, ``dp_rank``: None outside a run, or
    for a fault that ended the run). Once a command reports it (keyword-only, :meth:`reported`): the case file it
    was saved to, the stage that found it (``engine``: "prove", "fuzz", "replay", ... and "... on ENGINE"), the
    replay command, the row it fails (``check``), and what it means for the backend (``fa3verify.finding_terms``).
    """

    invariant: str
    batch: Optional[int] = None
    detail: dict = field(default_factory=dict)
    message: str = ""
    step: Optional[int] = None  #: the scenario step (None outside a run, or for a fault that ended the run)
    dp_rank: Optional[int] = None  #: the attention DP rank (None outside a run, or for a fault that ended it)
    #: the signature of a finding that is not a step's (a fault that ended the run: its invariant alone)
    signature_key: Optional[str] = field(default=None, compare=False, repr=False)
    #: found by a scenario run (:meth:`at_step`): :meth:`to_dict` writes the run's keys (step, dp_rank)
    located: bool = field(default=False, compare=False, repr=False)
    _: KW_ONLY
    # -- the report's fields (a command fills them in with :meth:`reported`) --
    case_file: Optional[str] = field(default=None, repr=False)
    engine: str = field(default="", repr=False)      #: the stage: "prove" | "fuzz" | "replay" | ... ("... on ENGINE")
    replay: Optional[str] = field(default=None, repr=False)
    check: str = field(default="", repr=False)       #: the row (``Check.name``) this finding fails
    ran_on: str = field(default="", repr=False)      #: the system under test that ran the saved case
    config: str = field(default="", repr=False)      #: model/tp/dp/cp/SM count/split policy (``Config.label``)
    #: [token, meaning] for every token of ``config`` (fa3verify.config_terms.config_terms)
    config_terms: list = field(default_factory=list, repr=False)
    path: str = field(default="", repr=False)        #: "eager" | "capture" | "replay" (a CUDA graph's) | "eager extend"
    #: where a real engine's code made each side: {"precompute": "Class.function (file.py:line), from ...", "call": ...}
    source: dict = field(default_factory=dict, repr=False)
    differs: dict = field(default_factory=dict, repr=False)  #: FA3 argument -> [precompute, call], those that differ
    seq_lens: Optional[list] = field(default=None, repr=False)  #: the offending call's cache lengths
    s_p: Optional[int] = field(default=None, repr=False)  #: the precompute's split count
    s_c: Optional[int] = field(default=None, repr=False)  #: the call's own split count
    guard: str = field(default="", repr=False)       #: the guard's decision
    hint: str = field(default="", repr=False)        #: a one-line fix hint
    #: the case file's JSON when the Python API returns this finding and the file is readable, else None; the run
    #: summary's JSON (``--json``) leaves it out
    case: Optional[dict] = field(default=None, repr=False)

    # -- made by a check or a run --

    @classmethod
    def at_step(cls, invariant: str, step: Optional[int], dp_rank: Optional[int], message: str,
                detail: Optional[dict] = None, signature_key: Optional[str] = None) -> "Finding":
        """A finding a scenario run made at ``step`` on DP rank ``dp_rank`` (both None: a fault ended the run)."""
        return cls(invariant, None, {} if detail is None else detail, message, step, dp_rank, signature_key,
                   located=True)

    @classmethod
    def fault(cls, invariant: str, message: str) -> "Finding":
        """The finding of a fault that ended a run (a guard fault, an FA3 abort, a crash): no step, no DP rank; its
        signature is its invariant."""
        return cls.at_step(invariant, None, None, message, signature_key=invariant)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Finding":
        """The inverse of :meth:`to_dict` (a run's form when it has a ``step`` key)."""
        if "step" in data:
            return cls.at_step(data["invariant"], data["step"], data.get("dp_rank"), data["message"],
                               data.get("detail", {}))
        return cls(data["invariant"], data.get("batch"), dict(data.get("detail", {})), data.get("message", ""))

    @classmethod
    def from_report(cls, data: Mapping[str, Any]) -> "Finding":
        """A finding read back from a run summary's JSON (:meth:`report_dict`; unknown keys are ignored)."""
        known = {f.name for f in fields(cls)} & (set(REPORT_FIELDS) | {"case"})
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def indices(self) -> dict:
        """Alias of `detail` (the offending indices and values)."""
        return self.detail

    @property
    def signature(self) -> str:
        """What makes two findings 'the same violation': invariant and step mode, not the lengths."""
        if self.signature_key is not None:
            return self.signature_key
        return f"{self.invariant}:{self.detail.get('mode', '')}:{self.detail.get('path', '')}"

    def to_dict(self) -> dict:
        """JSON-ready: {invariant, batch, detail, message}; found by a run: {invariant, step, dp_rank, message, detail}."""
        if self.located:
            return {"invariant": self.invariant, "step": self.step, "dp_rank": self.dp_rank, "message": self.message,
                    "detail": self.detail}
        return {"invariant": self.invariant, "batch": self.batch, "detail": dict(self.detail),
                "message": self.message}

    # -- reported by a command --

    def reported(self, **report) -> "Finding":
        """This finding with the report's fields filled in (``case_file``, ``engine``, ``replay``, the terms ...);
        ``message`` may be given to replace the run's sentence with the report's."""
        return replace(self, **report)

    def report_dict(self) -> dict:
        """The run summary's form (schema fa3verify.run/1): :data:`REPORT_FIELDS`, in that order."""
        return {name: _copy(getattr(self, name)) for name in REPORT_FIELDS}

    def api_dict(self) -> dict:
        """The Python API's form (``fa3verify.api.RunResult.to_dict``): :meth:`report_dict` with ``case`` last."""
        return {**self.report_dict(), "case": _copy(self.case)}

    def __str__(self) -> str:
        """A reported finding (one that names its stage) as every surface prints it (:func:`finding_lines`, the case
        file named before the replay command when both are known); a check's finding, its repr."""
        if not self.engine:
            return repr(self)
        lines = finding_lines(self)
        if self.case_file and self.replay:
            lines.insert(-1, f"    case file: {self.case_file}")
        return "\n".join(lines)


def _copy(value):
    """A JSON-ready copy of a report field (lists and dicts copied, as ``dataclasses.asdict`` did)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(v) for v in value)
    return value


def _fmt(value) -> str:
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return f"({value[0]}, {value[1]})"
    return str(value)


def _lens(lens) -> str:
    lens = list(lens)
    return str(lens) if len(lens) <= 8 else f"[{', '.join(map(str, lens[:8]))}, ... ({len(lens)} rows)]"


def _report(f) -> dict:
    return f if isinstance(f, dict) else f.report_dict()


def finding_sentence(f) -> str:
    """The backend-terms sentence of a finding: configuration and path, the arguments that differ between the
    precompute and the call, the batch, S_p vs S_c, the guard's decision ('' when the finding has no terms).
    ``f``: a Finding or its report JSON."""
    d = _report(f)
    parts = []
    where = " ".join(x for x in (d.get("config"), f"({d['path']} path)" if d.get("path") else "") if x)
    differs = d.get("differs") or {}
    if differs:
        pre = ", ".join(f"{k} {_fmt(v[0])}" for k, v in differs.items())
        call = ", ".join(f"{k} {_fmt(v[1])}" for k, v in differs.items())
        parts.append(f"precomputes with {pre} but calls with {call}")
    elif d.get("s_p") is not None:
        parts.append("precompute and call agree on every argument")
    batch = []
    if d.get("seq_lens") is not None:
        batch.append(f"b={len(d['seq_lens'])} seq_lens={_lens(d['seq_lens'])}")
    if d.get("s_p") is not None or d.get("s_c") is not None:
        batch.append(f"S_p={d.get('s_p')} vs S_c={d.get('s_c')}")
    if batch:
        parts.append(": ".join(batch) if len(batch) == 1 else f"{batch[0]} gives {batch[1]}")
    if d.get("guard"):
        parts.append(d["guard"])
    text = "; ".join(parts)
    return f"{where}: {text}" if where and text else (where or text)


def finding_lines(f) -> list:
    """A finding as every surface prints it (CLI, JUnit, HTML, Markdown, pytest): the invariant with its
    backend-terms sentence, the evidence, which engine ran it, the fix hint and the replay command. ``f``: a
    Finding or its report JSON."""
    d = _report(f)
    sentence = finding_sentence(d)
    stage = d.get("engine", "")
    if stage == "prove" and d.get("check"):
        stage = f"prove {d['check']}"  # two theorems may share one witness
    lines = [f"[{stage}] {d.get('invariant')}: {sentence or d.get('message', '')}"]
    if sentence and d.get("message"):
        lines.append(f"    evidence: {d['message']}")
    source = d.get("source") if isinstance(d.get("source"), dict) else {}
    for side in ("precompute", "call"):
        if source.get(side):
            lines.append(f"    {side} made in: {source[side]}")
    if d.get("config_terms"):
        lines.append(f"    configuration {d.get('config') or ''}:".replace(" :", ":"))
        lines += [f"      {item[0]}: {item[1]}" for item in d["config_terms"]
                  if isinstance(item, (list, tuple)) and len(item) == 2]
    if d.get("ran_on"):
        lines.append(f"    ran on: {d['ran_on']}")
    if d.get("hint"):
        lines.append(f"    fix: {d['hint']}")
    if d.get("replay"):
        lines.append(f"    replay: {d['replay']}")
    elif d.get("case_file"):
        lines.append(f"    case file: {d['case_file']}")
    return lines
