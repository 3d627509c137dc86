"""fa3verify report: render a run summary JSON (`--json` of prove, fuzz, gate, check, replay) as one HTML page."""

from __future__ import annotations

import argparse

HELP = "render a run summary JSON (schema fa3verify.run/1) or a sanitizer log (.jsonl) as a one-page HTML report"
EPILOG = """\
The page is self-contained (inline CSS, no scripts): a verdict banner, counts and timings, the checks
table and every finding with its case file and replay command. A file that is not a run summary exits 2
naming the problem.

examples:
  fa3verify gate --guard pre-fix --json gate.json; fa3verify report gate.json --html gate.html
  fa3verify report fuzz.json --html reports/fuzz.html
  fa3verify report fa3verify-sanitize/sanitize-12345.jsonl --html sanitize.html   # a sanitizer log
"""


def register(sub) -> None:
    p = sub.add_parser("report", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_json", metavar="RUN.json", help="a run summary written with --json, or a sanitizer log")
    p.add_argument("--html", required=True, metavar="PATH", help="where to write the HTML page")
    p.set_defaults(func=run)


def run(args) -> int:
    import os

    from ..errors import UsageError
    from ..html_report import load_summary, validate_summary, write_html
    from ..outputs import read_text
    from ..sanitize.records import is_log, log_to_run_summary

    read_text(args.run_json, "RUN.json")  # a regular, readable file of bounded size before anything opens it
    if is_log(args.run_json):
        try:
            data = validate_summary(log_to_run_summary(args.run_json), args.run_json)
        except (ValueError, RecursionError) as exc:
            raise UsageError(f"RUN.json: {args.run_json}: {exc}"[:300]) from None
    else:
        data = load_summary(args.run_json)
    parent = os.path.dirname(os.path.abspath(args.html))
    if not os.path.isdir(parent):
        raise UsageError(f"--html: directory does not exist: {parent}")
    write_html(data, args.html, source=args.run_json)
    print(f"wrote {args.html}: verdict {data['verdict'].upper()}, {len(data.get('checks', []))} checks, "
          f"{len(data.get('findings', []))} findings")
    return 0
