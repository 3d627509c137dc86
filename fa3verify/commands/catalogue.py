"""fa3verify catalogue: re-create real historical bugs as seeded defects and check the suite catches each one."""

from __future__ import annotations

import argparse
import json
import sys

from spec.finding import CatalogueStatus, Verdict
from gpu_impl.plugin import engine_phrases

from ..errors import UsageError
from ..outputs import deliver, write_output

HELP = "run the bug catalogue: every seeded historical bug must be caught, and nothing may fire without it"
EPILOG = """\
Each entry is a real bug from FA3, {engines} or FlashInfer (docs/catalogue.md), re-created as a seeded
defect (gpu_impl/defects.py). The entry runs with its defect on -- the engines it names (prove, fuzz) must
catch it -- and off -- nothing may fire (no false alarm). Exit 0 when every entry passes both, 1 otherwise,
3 when a solver was inconclusive and nothing failed, 2 for bad arguments.

Fast mode (default) runs in a few tens of seconds on 2 cores; --full uses the nightly budgets.

examples:
  fa3verify catalogue
  fa3verify catalogue --only 1 --only 11 --json catalogue.json
  fa3verify catalogue --full --cases-dir fa3verify-out/catalogue
  fa3verify catalogue --write-corpus tests/corpus        # refresh the regression corpus
  fa3verify catalogue --write-docs docs/catalogue.md     # regenerate the document
"""


def register(sub) -> None:
    p = sub.add_parser("catalogue", help=HELP, description=HELP, epilog=EPILOG.replace("{engines}", ", ".join(engine_phrases("name"))),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", metavar="ID",
                   help="run only this entry (id such as 4 or 04, or its slug); repeatable")
    p.add_argument("--full", action="store_true", help="nightly budgets (larger fuzz budgets, longer z3 timeouts)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (schema fa3verify.run/1 + 'catalogue')")
    p.add_argument("--cases-dir", default="fa3verify-out/catalogue", metavar="DIR",
                   help="where each entry's catching case is written (default fa3verify-out/catalogue)")
    p.add_argument("--write-corpus", metavar="DIR", help="write each entry's catching case and the extra corpus "
                                                         "cases into DIR (e.g. tests/corpus), then exit")
    p.add_argument("--write-docs", metavar="PATH", help="write the generated catalogue document (docs/catalogue.md) "
                                                        "and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    from .. import exitcodes
    from ..catalogue import catalogue_markdown, resolve_ids, run_catalogue, write_corpus

    try:
        ids = [e.id for e in resolve_ids(args.only)] if args.only else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    mode = "full" if args.full else "fast"
    if args.write_docs:
        write_output(args.write_docs, catalogue_markdown(), "--write-docs")
        print(f"wrote {args.write_docs}")
        return exitcodes.PASS
    if args.write_corpus:
        for path in write_corpus(args.write_corpus, mode, ids):
            print(f"wrote {path}")
        return exitcodes.PASS
    show = sys.stdout.isatty()
    results = run_catalogue(ids, mode, args.cases_dir,
                            progress=(lambda r: print(f"  {r.entry.id} done ({r.seconds:.1f}s)", file=sys.stderr))
                            if show else None)
    summary = summarise(results, mode)
    print_catalogue(results)

    return deliver(summary.exit_code, [("--json", args.json,
                                        lambda: write_catalogue_json(summary, results, args.json))], "catalogue")


def summarise(results, mode: str):
    """A RunSummary (schema fa3verify.run/1) with one check of kind 'catalogue' per entry."""
    from ..summary import Check, Finding, RunSummary

    summary = RunSummary(command="catalogue", policy={"mode": mode})
    for r in results:
        e = r.entry
        failed = not r.ok and not r.inconclusive
        verdict = Verdict.PASS if r.ok else (Verdict.INCONCLUSIVE if r.inconclusive else Verdict.FAIL)
        why = []
        missing = [x for x in e.catchers if x not in r.caught_by]
        if missing:
            why.append(f"not caught by {', '.join(missing)}")
        if r.false_alarms:
            why.append(f"false alarm from {', '.join(r.false_alarms)} with the defect off")
        if r.errors:
            why.append(f"engine errors: {', '.join(r.errors)}")
        msg = "; ".join(why) or f"caught by {', '.join(r.caught_by) or 'nothing'}; silent with the defect off"
        summary.checks.append(Check(name=f"{e.id} {e.slug} ({e.reference})", kind="catalogue", verdict=verdict,
                                    seconds=r.seconds, failed=failed, inconclusive=r.inconclusive and not failed,
                                    case_file=r.case_file, message=msg))
        for engine in r.caught_by:
            o = r.on[engine]
            summary.findings.append(Finding(invariant=",".join(o.invariants) or e.invariant,
                                            case_file=o.case_file, engine=engine,
                                            message=f"catalogue {e.id}: {o.detail[:200]}"))
    summary.elapsed_s = sum(r.seconds for r in results)
    return summary


def _cell(outcome) -> str:
    if outcome is None or outcome.status == CatalogueStatus.NOT_APPLICABLE:
        return "-"
    return {"caught": "caught", "missed": "MISSED", "silent": "silent", "fired": "FIRED",
            "inconclusive": "unknown", "error": "ERROR"}.get(outcome.status, outcome.status)


def print_catalogue(results, console=None) -> None:
    """The table: id, reference, expected catcher, caught by prove / fuzz, defect off, seconds, case file."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="fa3verify catalogue")
    for col in ("id", "reference", "expected", "prove", "fuzz", "defect off", "seconds", "case file"):
        table.add_column(col)
    for r in results:
        e = r.entry
        off = ", ".join(f"{k}:{_cell(v)}" for k, v in r.off.items()
                        if v.status != CatalogueStatus.NOT_APPLICABLE) or "-"
        style = "green" if r.ok else ("yellow" if r.inconclusive else "red")
        table.add_row(f"[{style}]{e.id}[/{style}]", e.reference, "+".join(e.catchers), _cell(r.on.get("prove")),
                      _cell(r.on.get("fuzz")), off, f"{r.seconds:.1f}", r.case_file or "-")
    console.print(table)
    bad = [r for r in results if not r.ok]
    for r in bad:
        for side, runs in (("on", r.on), ("off", r.off)):
            for engine, o in runs.items():
                if o.status in (CatalogueStatus.MISSED, CatalogueStatus.FIRED, CatalogueStatus.ERROR,
                                CatalogueStatus.INCONCLUSIVE):
                    console.print(f"  {r.entry.id} {side} {engine}: {o.status}: {o.detail}")
    total = sum(r.seconds for r in results)
    ok = sum(r.ok for r in results)
    console.print(f"catalogue: {ok}/{len(results)} entries caught by their engines with no false alarm "
                  f"| {total:.1f}s | verdict: {'PASS' if ok == len(results) else 'FAIL'}")


def write_catalogue_json(summary, results, path: str) -> None:
    data = summary.to_dict()
    data["catalogue"] = [r.to_dict() for r in results]

    write_output(path, json.dumps(data, indent=2) + "\n", "--json")
