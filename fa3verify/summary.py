"""Run summaries: the JSON report (`--json`), JUnit XML (`--junit`) and the terminal table (`write_reports`: all
three at the end of a run command).

JSON schema "fa3verify.run/1" (documented in docs/reports.md):
{"schema", "command", "verdict": "pass|fail|inconclusive", "exit_code", "cases", "failures", "elapsed_s",
 "cases_per_s", "first_failure_s", "seed", "policy", "checks": [Check...], "findings": [Finding...]}
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from . import exitcodes
from .verdicts import run_exit_code

SCHEMA = "fa3verify.run/1"


@dataclass
class Check:
    """One row of the summary table: a theorem or a fuzz property and its verdict."""

    name: str
    kind: str                 # "theorem" | "property" | "catalogue" | "replay"
    verdict: str              # "proved" | "refuted" | "expected-refutation" | "pass" | "fail" | "inconclusive"
    seconds: float
    failed: bool = False
    inconclusive: bool = False
    case_file: Optional[str] = None
    message: str = ""


@dataclass
class Finding:
    """A violation worth a case file: which invariant, where it was saved, and how to replay it."""

    invariant: str
    case_file: Optional[str]
    engine: str               # "prove" | "fuzz" | "replay" | "catalogue"
    message: str = ""
    replay: Optional[str] = None


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
    #: the system under test's domain report of a campaign that drew from it (``gpu_impl.domain.ConfigDomain
    #: .report``: draws, rejections by the release's reason, cases per path, not covered), else None
    domain: Optional[dict] = None

    @property
    def exit_code(self) -> int:
        """0 pass, 1 violation, 2 usage, 3 inconclusive (:func:`fa3verify.verdicts.run_exit_code`)."""
        return run_exit_code(self)

    @property
    def verdict(self) -> str:
        return exitcodes.verdict_name(self.exit_code)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA, "command": self.command, "verdict": self.verdict, "exit_code": self.exit_code,
            "cases": self.cases, "failures": self.failures, "elapsed_s": round(self.elapsed_s, 4),
            "cases_per_s": round(self.cases / self.elapsed_s, 2) if self.elapsed_s > 0 else 0.0,
            "first_failure_s": None if self.first_failure_s is None else round(self.first_failure_s, 4),
            "seed": self.seed, "policy": self.policy, "interrupted": self.interrupted,
            "checks": [asdict(c) for c in self.checks], "findings": [asdict(f) for f in self.findings],
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


def write_json(summary: RunSummary, path: str) -> None:
    """Write the run summary as JSON (schema fa3verify.run/1), atomically."""
    write_atomic(path, json.dumps(summary.to_dict(), indent=2) + "\n")


def write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename: an interrupted or failed
    write never leaves a half-written report, nor destroys the previous one."""
    import tempfile

    _ensure_parent(path)
    fd, tmp = tempfile.mkstemp(prefix=".fa3verify-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_junit(summary: RunSummary, path: str) -> None:
    """Write JUnit XML: one testcase per check, failures with the finding's message and case file."""
    _ensure_parent(path)
    suite = ET.Element("testsuite", name=f"fa3verify.{summary.command}", tests=str(len(summary.checks)),
                       failures=str(sum(c.failed for c in summary.checks)),
                       skipped=str(sum(c.inconclusive and not c.failed for c in summary.checks)),
                       time=f"{summary.elapsed_s:.3f}")
    for check in summary.checks:
        case = ET.SubElement(suite, "testcase", classname=f"fa3verify.{check.kind}", name=check.name,
                             time=f"{check.seconds:.3f}")
        text = check.message + (f"\ncase file: {check.case_file}" if check.case_file else "")
        if check.failed:
            ET.SubElement(case, "failure", message=f"{check.verdict}: {check.message}"[:500]).text = text
        elif check.inconclusive:
            ET.SubElement(case, "skipped", message=f"inconclusive: {check.message}"[:500]).text = text
        elif check.case_file:
            ET.SubElement(case, "system-out").text = text
    root = ET.Element("testsuites")
    root.append(suite)
    write_atomic(path, "<?xml version='1.0' encoding='utf-8'?>\n" + ET.tostring(root, encoding="unicode"))


def print_table(summary: RunSummary, console=None) -> None:
    """Print the verdict table (check, verdict, seconds, case file) and the one-line verdict."""
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:  # logs and CI: print whole rows rather than crop at 80 columns
            console = Console(width=max(console.width, 160))
    from rich.markup import escape

    table = Table(title=f"fa3verify {summary.command}")
    table.add_column("check", no_wrap=True, overflow="ellipsis", max_width=44)
    table.add_column("kind", no_wrap=True, min_width=8)
    table.add_column("verdict", no_wrap=True, min_width=19)
    table.add_column("seconds", justify="right", no_wrap=True, min_width=7)
    table.add_column("case file / note", no_wrap=True, overflow="ellipsis", max_width=80)
    for c in summary.checks:
        style = "red" if c.failed else ("yellow" if c.inconclusive else "green")
        note = c.case_file or c.message.splitlines()[0] if (c.case_file or c.message) else ""
        table.add_row(escape(c.name), c.kind, f"[{style}]{escape(c.verdict)}[/{style}]", f"{c.seconds:.2f}",
                      escape(note))
    console.print(table)
    console.print(verdict_line(summary))


def write_reports(summary: RunSummary, args, finding_line: Optional[Callable[[Finding], str]] = None) -> int:
    """The end of a run command (check, fuzz, gate, prove), in one place: the verdict table, one line per finding
    (``finding_line``, if given), then the JSON report (``args.json``) and the JUnit XML (``args.junit``) when
    asked. Returns the run's exit code."""
    print_table(summary)
    if finding_line is not None:
        for finding in summary.findings:
            print(finding_line(finding))
    if getattr(args, "json", None):
        write_json(summary, args.json)
    if getattr(args, "junit", None):
        write_junit(summary, args.junit)
    return summary.exit_code


def verdict_line(summary: RunSummary) -> str:
    """One line a human or a log grep can read: VERDICT, counts, time."""
    parts = [f"verdict: {summary.verdict.upper()}", f"checks {len(summary.checks)}",
             f"failed {sum(c.failed for c in summary.checks)}"]
    if summary.cases:
        parts.append(f"fuzz cases {summary.cases}, failures {summary.failures}")
    parts.append(f"{summary.elapsed_s:.1f}s")
    return " | ".join(parts)


def _ensure_parent(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
