"""fa3verify report: render a run summary JSON (`--json` of prove, fuzz, gate, check, replay) as one HTML page."""

from __future__ import annotations

import argparse

HELP = ("render a run summary JSON (schema fa3verify.run/1) or a sanitizer log (.jsonl) as a one-page HTML report "
        "or as Markdown (a CI job summary); `report merge` joins shard reports into one verdict")
USAGE = """\
fa3verify report RUN.json [--html PATH] [--markdown PATH [--exit-code N] [--log PATH]]
       fa3verify report merge REPORT.json [REPORT.json ...] [--json PATH] [--junit PATH]"""
EPILOG = """\
`report RUN.json --html PATH`: the page is self-contained (inline CSS, no scripts): a verdict banner, counts
and timings, the checks table and every finding with its case file and replay command. --markdown PATH writes
the same run as Markdown for a CI job summary: the verdict, the rows that failed or were inconclusive, every
finding in backend terms (configuration, path, differing arguments, S_p vs S_c, guard decision, fix hint,
replay command), then all rows. A file that is not a run summary exits 2 naming the problem.

A CI job summary: `--markdown PATH --exit-code N --log PATH` (N: the exit code of the run that wrote RUN.json).
The header names N and only the rows that failed or were inconclusive are listed. When RUN.json is missing or
is not a run summary, PATH still gets a "NO RESULT (exit N)" summary with the last lines of --log, and report
exits 2: a run that left no result never reads as a pass.

`report merge A.json B.json ... [--json OUT] [--junit OUT]`: joins the reports of the N shards of one
campaign (`fuzz`, `conform` or `engine matrix` run with --shard K/N --json) into one verdict and exits with
its code: 0 pass, 1 violation, 3 inconclusive. Reports of different campaigns (another seed, case count,
policy, engine or N), a shard given twice or a missing shard are exit 2.

examples:
  fa3verify gate --guard pre-fix --json gate.json; fa3verify report gate.json --html gate.html
  fa3verify report fuzz.json --html reports/fuzz.html
  fa3verify report gate.json --markdown summary.md      # e.g. cat summary.md >> "$GITHUB_STEP_SUMMARY"
  fa3verify report out/gate.json --markdown out/summary.md --exit-code 1 --log out/gate.log   # a CI job summary
  fa3verify report fa3verify-sanitize/sanitize-12345.jsonl --html sanitize.html   # a sanitizer log
  fa3verify fuzz --cases 2000 --shard 1/2 --json s1.json; fa3verify fuzz --cases 2000 --shard 2/2 --json s2.json
  fa3verify report merge s1.json s2.json --json fuzz.json --junit fuzz.xml
"""


def register(sub) -> None:
    p = sub.add_parser("report", help=HELP, description=HELP, epilog=EPILOG, usage=USAGE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_json", nargs="+", metavar="FILE",
                   help="RUN.json, a run summary written with --json, or a sanitizer log; or `merge` followed by "
                        "the shard reports (REPORT.json ...)")
    p.add_argument("--html", metavar="PATH", help="where to write the HTML page")
    p.add_argument("--markdown", metavar="PATH", help="where to write the Markdown summary (failed rows first)")
    p.add_argument("--exit-code", metavar="N", help="with --markdown: the exit code of the run (0 .. 255), named in "
                                                    "the summary's header; a CI job summary lists only failed rows")
    p.add_argument("--log", metavar="PATH", help="with --markdown: the run's log, whose last lines a NO RESULT "
                                                 "summary shows")
    p.add_argument("--json", metavar="PATH", help="merge: write the joined report as JSON ('-': stdout)")
    p.add_argument("--junit", metavar="PATH", help="merge: write the joined report as JUnit XML")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import UsageError

    if args.run_json[0] == "merge":
        from ..report_merge import merge

        for option in ("html", "markdown", "exit_code", "log"):
            if getattr(args, option):
                option = option.replace("_", "-")
                raise UsageError(f"--{option}: `report merge` writes --json and --junit; render the merged JSON "
                                 f"with `fa3verify report MERGED.json --{option} PATH`")
        return merge(args.run_json[1:], json_out=args.json, junit_out=args.junit)
    if len(args.run_json) > 1:
        raise UsageError(f"RUN.json: one run summary to render, got {len(args.run_json)} (to join shard reports: "
                         f"`fa3verify report merge {' '.join(args.run_json)}`)")
    for option in ("json", "junit"):
        if getattr(args, option):
            raise UsageError(f"--{option}: only `report merge` writes it; rendering writes --html or --markdown")
    if not args.html and not args.markdown:
        raise UsageError("--html or --markdown: name at least one output (the HTML page, the Markdown summary), "
                         "or `report merge REPORT.json ...`")
    args.run_json = args.run_json[0]
    for option in ("exit_code", "log"):
        if getattr(args, option) is not None and not args.markdown:
            raise UsageError(f"--{option.replace('_', '-')}: applies to the Markdown summary; add --markdown PATH")
    if args.exit_code is not None:
        raw = args.exit_code
        try:
            args.exit_code = int(args.exit_code)
        except ValueError:
            args.exit_code = -1
        if not 0 <= args.exit_code <= 255:
            raise UsageError(f"--exit-code: an exit status 0 .. 255, got {raw!r}")
    try:
        return render(args)
    except UsageError as exc:
        if not args.markdown or _is_output_problem(exc):
            raise
        return _no_result(args, str(exc))


def _is_output_problem(exc) -> bool:
    return str(exc).startswith(("--html", "--markdown"))


def _no_result(args, reason: str) -> int:
    """RUN.json missing or not a run summary, with --markdown: a NO RESULT summary (exit 2), never a pass."""
    import os
    import sys

    from ..errors import UsageError
    from ..summary import no_result_markdown, write_atomic

    stem = os.path.splitext(os.path.basename(args.run_json))[0]
    command = stem if stem in ("gate", "prove", "fuzz", "check", "replay", "conform") else "run"
    tail: list = []
    if args.log:
        try:
            with open(args.log, encoding="utf-8", errors="replace") as f:
                tail = f.read()[-64000:].strip().splitlines()[-15:]
        except OSError as exc:
            tail = [f"(the log {args.log} could not be read: {exc.strerror or exc})"]
    parent = os.path.dirname(os.path.abspath(args.markdown))
    if not os.path.isdir(parent):
        raise UsageError(f"--markdown: directory does not exist: {parent}")
    write_atomic(args.markdown, no_result_markdown(command, args.exit_code, reason[:300], tail), "--markdown")
    print(f"wrote {args.markdown}: NO RESULT ({reason[:200]})", file=sys.stderr)
    return 2



def render(args) -> int:
    import os

    from ..errors import UsageError
    from ..html_report import load_summary, validate_summary, write_html
    from ..outputs import read_text
    from ..sanitize.records import is_log, log_to_run_summary
    from ..summary import summary_markdown, write_atomic

    read_text(args.run_json, "RUN.json")  # a regular, readable file of bounded size before anything opens it
    if is_log(args.run_json):
        try:
            data = validate_summary(log_to_run_summary(args.run_json), args.run_json)
        except (ValueError, RecursionError) as exc:
            raise UsageError(f"RUN.json: {args.run_json}: {exc}"[:300]) from None
    else:
        data = load_summary(args.run_json)
    for option, path in (("--html", args.html), ("--markdown", args.markdown)):
        parent = os.path.dirname(os.path.abspath(path)) if path else None
        if parent and not os.path.isdir(parent):
            raise UsageError(f"{option}: directory does not exist: {parent}")
    counts = (f"verdict {data['verdict'].upper()}, {len(data.get('checks', []))} checks, "
              f"{len(data.get('findings', []))} findings")
    if args.html:
        write_html(data, args.html, source=args.run_json)
        print(f"wrote {args.html}: {counts}")
    if args.markdown:
        write_atomic(args.markdown, summary_markdown(data, exit_code=args.exit_code), "--markdown")
        print(f"wrote {args.markdown}: {counts}")
    return 0
