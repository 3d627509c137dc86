"""The CI job summary of a gate run: the verdict, the rows that failed or were inconclusive, and each finding with
its replay command, as Markdown (examples/ci/run-gate.sh appends it to ``$GITHUB_STEP_SUMMARY``).

Invariant: every check of the run summary (``gate.json``, schema fa3verify.run/1: docs/reports.md) whose
``failed`` or ``inconclusive`` is true is a row of the table, and nothing else is; a run without a summary says so
with the gate's exit code and the last lines of its log, never as a pass. Standard library only: it runs with
any Python 3, before or without fa3-verify's environment.

Usage: ``python job_summary.py OUT_DIR`` (the gate's output folder: gate.json, exit-code, gate.log).
"""

import json
import os
import sys

#: Rows and findings shown at most (GitHub caps a step summary at 1 MiB; the artifact holds everything).
MAX_ROWS = 50


def cell(text) -> str:
    """One Markdown table cell: no pipes or line breaks."""
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def summary(out_dir: str) -> str:
    code = (read(os.path.join(out_dir, "exit-code")) or "?").strip()
    raw = read(os.path.join(out_dir, "gate.json"))
    lines = []
    try:
        run = json.loads(raw) if raw is not None else None
    except ValueError:
        run = None
    if not isinstance(run, dict):
        log = (read(os.path.join(out_dir, "gate.log")) or "").strip().splitlines()[-15:]
        lines += [f"## fa3-verify gate: NO RESULT (exit {code})", "",
                  "The gate wrote no run summary (bad input, or it did not start). The end of its log:", "", "```"]
        lines += log or ["(no log)"]
        lines += ["```"]
        return "\n".join(lines) + "\n"
    checks = run.get("checks") or []
    bad = [c for c in checks if c.get("failed") or c.get("inconclusive")]
    lines += [f"## fa3-verify gate: {str(run.get('verdict', '?')).upper()} (exit {code})", "",
              f"{len(checks)} checks, {len(bad)} failed or inconclusive; fuzz cases {run.get('cases', '?')}, "
              f"failures {run.get('failures', '?')}, seed {run.get('seed', '?')}, {run.get('elapsed_s', 0):.0f} s.",
              ""]
    if bad:
        lines += ["| check | kind | verdict | case file | message |", "|---|---|---|---|---|"]
        for c in bad[:MAX_ROWS]:
            lines.append(f"| {cell(c.get('name'))} | {cell(c.get('kind'))} | {cell(c.get('verdict'))} | "
                         f"{cell(c.get('case_file'))} | {cell(c.get('message'))} |")
        if len(bad) > MAX_ROWS:
            lines.append(f"\n({len(bad) - MAX_ROWS} more rows in gate.json)")
        lines.append("")
    findings = run.get("findings") or []
    if findings:
        lines += ["### Findings", ""]
        for f in findings[:MAX_ROWS]:
            lines.append(f"- **{f.get('invariant')}** ({f.get('engine')}): {f.get('message')}")
            if f.get("replay"):
                lines.append(f"  replay: `{f['replay']}`")
        lines.append("")
    lines.append("Report, run summary, JUnit XML and case files: the job's `fa3verify-report` artifact "
                 "(gate.html, gate.json, report.xml, cases/).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python job_summary.py OUT_DIR", file=sys.stderr)
        raise SystemExit(2)
    sys.stdout.write(summary(sys.argv[1]))
