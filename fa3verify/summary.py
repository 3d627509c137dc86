"""Run summaries: the JSON report (`--json`), JUnit XML (`--junit`) and the terminal table (`write_reports`: all
three at the end of a run command).

JSON schema "fa3verify.run/1" (documented in docs/reports.md):
{"schema", "command", "verdict": "pass|fail|inconclusive", "exit_code", "cases", "failures", "elapsed_s",
 "cases_per_s", "first_failure_s", "seed", "policy", "checks": [Check...], "findings": [Finding...]}
"""

from __future__ import annotations

import json
import os  # noqa: F401 - os.replace, reached through this module, is how tests make a report's rename fail
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from spec.finding import Finding, TheoremVerdict, Verdict, finding_lines, finding_sentence

from . import exitcodes
from .verdicts import run_exit_code

__all__ = ["SCHEMA", "Check", "Finding", "RunSummary", "write_json", "write_junit", "write_reports", "print_table",
           "verdict_label", "finding_sentence", "finding_lines", "finding_text", "summary_markdown",
           "no_result_markdown", "verdict_line"]

SCHEMA = "fa3verify.run/1"


@dataclass
class Check:
    """One row of the summary table: a theorem or a fuzz property and its verdict."""

    name: str
    kind: str                 # "theorem" | "property" | "catalogue" | "replay"
    #: a theorem row's TheoremVerdict ("proved" | "refuted" | "expected-refutation" | "inconclusive"), any other
    #: row's Verdict ("pass" | "fail" | "inconclusive"); a word is stored as its member
    verdict: TheoremVerdict | Verdict
    seconds: float
    failed: bool = False
    inconclusive: bool = False
    case_file: Optional[str] = None
    message: str = ""
    #: why this row's refutation is expected and not a failure ("" otherwise); the row then reads "refuted
    #: (expected)" on every surface (:func:`verdict_label`) and its case file is a witness, not a failure
    expected: str = ""

    def __post_init__(self) -> None:
        self.verdict = verdict_word(self.verdict, theorem=self.kind == "theorem")


def verdict_word(word, theorem: bool = False):
    """``word`` as its member: a theorem row's :class:`TheoremVerdict` (``theorem``), any other row's
    :class:`Verdict`, else the other enum's; a word of neither unchanged (a report written by a later version)."""
    for words in ((TheoremVerdict, Verdict) if theorem else (Verdict, TheoremVerdict)):
        try:
            return words(word)
        except ValueError:
            pass
    return word


@dataclass
class RunSummary:
    """Everything a run reports; `exit_code` follows fa3verify's exit codes."""

    command: str
    checks: list = field(default_factory=list)
    findings: list = field(default_factory=list)
    cases: int = 0
    failures: int = 0
    elapsed_s: float = 0.0
    first_failure_s: Optional[float] = None
    seed: Optional[int] = None
    policy: dict = field(default_factory=dict)
    usage_error: Optional[str] = None
    interrupted: bool = False  #: SIGINT stopped the run: what was found is reported, the verdict is inconclusive
    shard: Optional[dict] = None  #: one shard of a campaign (``fa3verify.sharding``): {"k", "n", "campaign"}
    #: the system under test's domain report of a campaign that drew from it (``gpu_impl.domain.ConfigDomain
    #: .report``: draws, rejections by the release's reason, cases per path, not covered), else None
    domain: Optional[dict] = None

    @property
    def exit_code(self) -> int:
        """0 pass, 1 violation, 2 usage, 3 inconclusive (:func:`fa3verify.verdicts.run_exit_code`)."""
        return run_exit_code(self)

    @property
    def verdict(self) -> Verdict:
        return exitcodes.verdict_name(self.exit_code)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA, "command": self.command, "verdict": self.verdict, "exit_code": self.exit_code,
            "cases": self.cases, "failures": self.failures, "elapsed_s": round(self.elapsed_s, 4),
            "cases_per_s": round(self.cases / self.elapsed_s, 2) if self.elapsed_s > 0 else 0.0,
            "first_failure_s": None if self.first_failure_s is None else round(self.first_failure_s, 4),
            "seed": self.seed, "policy": self.policy, "interrupted": self.interrupted,
            "checks": [asdict(c) for c in self.checks], "findings": [f.report_dict() for f in self.findings],
            **({"shard": self.shard} if self.shard is not None else {}),
            **({"domain": self.domain} if self.domain is not None else {}),
        }

    def merge(self, other: "RunSummary") -> None:
        """Fold another run (e.g. fuzz into a gate) into this one."""
        self.checks.extend(other.checks)
        self.findings.extend(other.findings)
        self.cases += other.cases
        self.failures += other.failures
        self.elapsed_s += other.elapsed_s
        self.interrupted |= other.interrupted
        if other.first_failure_s is not None and self.first_failure_s is None:
            self.first_failure_s = other.first_failure_s
        if other.domain is not None:
            self.domain = other.domain


def write_json(summary: RunSummary, path: str, field: str = "--json") -> None:
    """Write the run summary as JSON (schema fa3verify.run/1), atomically; ``field`` names the option in an
    error (:class:`fa3verify.errors.OutputNotWritten`)."""
    write_atomic(path, json.dumps(summary.to_dict(), indent=2) + "\n", field)


def write_atomic(path: str, text: str, field: str = "output") -> None:
    """Write a report to `path` (``-`` is stdout; regular files atomically, special files written through:
    :func:`fa3verify.outputs.write_output`); ``field`` names the option in an error."""
    from .outputs import write_output

    write_output(path, text, field)


def write_junit(summary: RunSummary, path: str, field: str = "--junit") -> None:
    """Write JUnit XML: one testcase per check, failures with the finding's message and case file."""
    suite = ET.Element("testsuite", name=f"fa3verify.{summary.command}", tests=str(len(summary.checks)),
                       failures=str(sum(c.failed for c in summary.checks)),
                       skipped=str(sum(c.inconclusive and not c.failed for c in summary.checks)),
                       time=f"{summary.elapsed_s:.3f}")
    for check in summary.checks:
        case = ET.SubElement(suite, "testcase", classname=f"fa3verify.{check.kind}", name=check.name,
                             time=f"{check.seconds:.3f}")
        text = check.message + (f"\ncase file: {check.case_file}" if check.case_file else "")
        text += "".join("\n" + finding_text(f) for f in summary.findings if f.check == check.name)
        if check.failed:
            ET.SubElement(case, "failure", message=f"{check.verdict}: {check.message}"[:500]).text = text
        elif check.inconclusive:
            ET.SubElement(case, "skipped", message=f"inconclusive: {check.message}"[:500]).text = text
        elif check.case_file or check.expected:
            ET.SubElement(case, "system-out").text = (f"{verdict_label(check)}: {check.expected}\n"
                                                      if check.expected else "") + text
    root = ET.Element("testsuites")
    root.append(suite)
    write_atomic(path, "<?xml version='1.0' encoding='utf-8'?>\n" + ET.tostring(root, encoding="unicode"), field)


def print_table(summary: RunSummary, console=None) -> None:
    """Print the verdict table in the form that fits the terminal's width or the log
    (:func:`fa3verify.run_table.print_table`), the domain's reach, and the one-line verdict."""
    from .run_table import print_table as print_run_table

    print_run_table(summary, console)


def write_reports(summary: RunSummary, args, finding_line: Optional[Callable[[Finding], str]] = None) -> int:
    """The end of a run command (check, fuzz, gate, prove), in one place: the verdict table, each finding
    (``finding_line``, default :func:`finding_text`), then the JSON report (``args.json``) and the JUnit XML
    (``args.junit``) when asked. Returns the run's exit code: the verdict's, also when a report cannot be written
    then (named on stderr), except a PASS with a missing report, which is 3 (:func:`fa3verify.outputs.deliver`)."""
    from .outputs import deliver

    print_table(summary)
    render = finding_text if finding_line is None else finding_line
    for finding in summary.findings:
        print(render(finding))
    json_path, junit_path = getattr(args, "json", None), getattr(args, "junit", None)
    return deliver(summary.exit_code, [("--json", json_path, lambda: write_json(summary, json_path)),
                                       ("--junit", junit_path, lambda: write_junit(summary, junit_path))],
                   summary.command)


def verdict_label(check) -> str:
    """A row's verdict as every surface shows it: "refuted (expected)" for a refutation that is not a failure
    (``Check.expected``), else the verdict. ``check``: a Check or its JSON."""
    get = check.get if isinstance(check, dict) else (lambda k, d=None: getattr(check, k, d))
    verdict = get("verdict", "")
    return f"{verdict} (expected)" if get("expected") and verdict == TheoremVerdict.REFUTED else verdict


def finding_text(f) -> str:
    """:func:`finding_lines` as one indented block (the CLI's and JUnit's form)."""
    return "\n".join("  " + line for line in finding_lines(f))


#: Rows shown at most in a CI job summary (GitHub caps a step summary at 1 MiB; the artifact holds everything).
JOB_MAX_ROWS = 50


def summary_markdown(data, exit_code: Optional[int] = None) -> str:
    """A run summary (RunSummary or its JSON) as Markdown: the verdict, the rows that failed or were inconclusive
    first, every finding in backend terms, then all rows. With ``exit_code`` (a CI job summary): the header names
    the exit code, and only the failed or inconclusive rows are listed (at most :data:`JOB_MAX_ROWS`)."""
    d = data.to_dict() if isinstance(data, RunSummary) else data
    checks, findings = d.get("checks", []), d.get("findings", [])

    def cell(text) -> str:
        return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")

    def rows(selected) -> list:
        out = ["| check | kind | verdict | seconds | case file / note |", "|---|---|---|---|---|"]
        for c in selected:
            note = c.get("case_file") or (c.get("message") or "").split("\n")[0]
            out.append(f"| {cell(c.get('name'))} | {cell(c.get('kind'))} | {cell(verdict_label(c))} | "
                       f"{float(c.get('seconds') or 0):.2f} | {cell(note)} |")
        return out

    failed = [c for c in checks if c.get("failed") or c.get("inconclusive")]
    head = f"## fa3verify {d.get('command', 'run')}: {str(d.get('verdict', '')).upper()}"
    lines = [head + (f" (exit {exit_code})" if exit_code is not None else ""), ""]
    if exit_code is not None:
        lines += [f"{len(checks)} checks, {len(failed)} failed or inconclusive; fuzz cases {d.get('cases', 0)}, "
                  f"failures {d.get('failures', 0)}, seed {d.get('seed', '?')}, "
                  f"{float(d.get('elapsed_s') or 0):.0f} s.", ""]
    shown = failed[:JOB_MAX_ROWS] if exit_code is not None else failed
    if failed:
        lines += [f"### Rows that failed or were inconclusive ({len(failed)})", ""] + rows(shown) + [""]
        if len(shown) < len(failed):
            lines += [f"({len(failed) - len(shown)} more rows in the run summary)", ""]
    else:
        lines += ["No row failed.", ""]
    if findings:
        lines += [f"### Findings ({len(findings)})", ""]
        for f in findings:
            first, *rest = finding_lines(f)
            lines.append(f"- {cell(first)}")
            lines += [f"  - {cell(r.strip())}" if not r.strip().startswith("replay:") else
                      f"  - replay: `{r.strip()[len('replay: '):]}`" for r in rest]
        lines.append("")
    if exit_code is not None:
        return "\n".join(lines) + "\n"
    lines += [f"### All rows ({len(checks)})", ""] + rows(checks)
    return "\n".join(lines) + "\n"


def no_result_markdown(command: str, exit_code: Optional[int], reason: str, log_tail: list) -> str:
    """The CI job summary of a run that left no readable run summary: never a pass; says why, with the exit code
    and the last lines of the run's log."""
    code = "?" if exit_code is None else exit_code
    lines = [f"## fa3verify {command}: NO RESULT (exit {code})", "",
             f"The {command} wrote no run summary ({reason}): bad input, or it did not start. The end of its log:",
             "", "```"] + (list(log_tail) or ["(no log)"]) + ["```"]
    return "\n".join(lines) + "\n"


def verdict_line(summary: RunSummary) -> str:
    """One line a human or a log grep can read: VERDICT, counts, time."""
    parts = [f"verdict: {summary.verdict.upper()}", f"checks {len(summary.checks)}",
             f"failed {sum(c.failed for c in summary.checks)}"]
    if summary.cases:
        parts.append(f"fuzz cases {summary.cases}, failures {summary.failures}")
    parts.append(f"{summary.elapsed_s:.1f}s")
    return " | ".join(parts)

