"""fa3verify bench: the performance figures (time to first failure, throughput, proof time, oracle cost)."""

from __future__ import annotations

import argparse
import json

HELP = "measure the suite: time to first failure, fuzz throughput, proof time, oracle cost"
EPILOG = """\
Every figure is a ratio measured side by side or a count, so it holds on a noisy machine. Bars from the
performance issue are printed next to the figures; a missed bar is reported, not hidden.

examples:
  fa3verify bench                      # all figures, table on stdout
  fa3verify bench --json bench.json --markdown docs/performance-table.md
  fa3verify bench --quick              # shorter budgets, two seeds
"""


def register(sub) -> None:
    p = sub.add_parser("bench", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="shorter budgets and fewer seeds")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the figures as a Markdown table")
    p.set_defaults(func=run)


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..bench import run_all, to_json, to_markdown

    figs = run_all(quick=args.quick)
    table = Table(title="fa3verify bench")
    for col in ("figure", "value", "bar", "holds", "command"):
        table.add_column(col)
    for f in figs:
        holds = "" if f.holds is None else ("[green]yes[/green]" if f.holds else "[red]no[/red]")
        table.add_row(f.name, f"{f.value:.3g} {f.unit}", f.bar or "", holds, f.command)
    Console().print(table)
    for f in figs:
        if f.detail:
            print(f"{f.name}: {json.dumps(f.detail)}")
    from ..outputs import write_output

    if args.json:
        write_output(args.json, json.dumps(to_json(figs), indent=2), "--json")
    if args.markdown:
        write_output(args.markdown, to_markdown(figs) + "\n", "--markdown")
    return 0
