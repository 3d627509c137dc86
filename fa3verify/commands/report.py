"""fa3verify report: render a run summary JSON (`--json` of prove, fuzz, gate, check, replay) as one HTML page."""

from __future__ import annotations

import argparse

HELP = ("render a run summary JSON (schema fa3verify.run/1) or a sanitizer log (.jsonl) as a one-page HTML report; "
        "`report merge` joins shard reports into one verdict")
USAGE = """\
fa3verify report RUN.json --html PATH
       fa3verify report merge REPORT.json [REPORT.json ...] [--json PATH] [--junit PATH]"""
EPILOG = """\
`report RUN.json --html PATH`: the page is self-contained (inline CSS, no scripts): a verdict banner, counts
and timings, the checks table and every finding with its case file and replay command. A file that is not a
run summary exits 2 naming the problem.

`report merge A.json B.json ... [--json OUT] [--junit OUT]`: joins the reports of the N shards of one
campaign (`fuzz`, `conform` or `engine matrix` run with --shard K/N --json) into one verdict and exits with
its code: 0 pass, 1 violation, 3 inconclusive. Reports of different campaigns (another seed, case count,
policy, engine or N), a shard given twice or a missing shard are exit 2.

examples:
  fa3verify gate --guard pre-fix --json gate.json; fa3verify report gate.json --html gate.html
  fa3verify report fuzz.json --html reports/fuzz.html
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
    p.add_argument("--html", metavar="PATH", help="where to write the HTML page (required to render)")
    p.add_argument("--json", metavar="PATH", help="merge: write the joined report as JSON ('-': stdout)")
    p.add_argument("--junit", metavar="PATH", help="merge: write the joined report as JUnit XML")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import UsageError

    if args.run_json[0] == "merge":
        from ..report_merge import merge

        if args.html:
            raise UsageError("--html: `report merge` writes --json and --junit; render the merged JSON with "
                             "`fa3verify report MERGED.json --html PATH`")
        return merge(args.run_json[1:], json_out=args.json, junit_out=args.junit)
    if len(args.run_json) > 1:
        raise UsageError(f"RUN.json: one run summary to render, got {len(args.run_json)} (to join shard reports: "
                         f"`fa3verify report merge {' '.join(args.run_json)}`)")
    for option in ("json", "junit"):
        if getattr(args, option):
            raise UsageError(f"--{option}: only `report merge` writes it; rendering writes --html")
    if not args.html:
        raise UsageError("--html: required: where to write the HTML page (or `report merge REPORT.json ...`)")
    args.run_json = args.run_json[0]
    return render(args)


def render(args) -> int:
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
