"""fa3verify check: the project's own gate (fixed guard, short fuzz budget), ending in one verdict line."""

from __future__ import annotations

import argparse

HELP = "gate the project's fixed guard with a short budget (what `make check` runs)"


def register(sub) -> None:
    p = sub.add_parser("check", help=HELP, description=HELP + ". Example: fa3verify check --budget-s 10",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-s", type=float, default=10.0, help="fuzz budget in seconds (default 10)")
    p.add_argument("--seed", type=int, default=0, help="fuzz seed (default 0)")
    p.add_argument("--json", metavar="PATH", help="write the run summary as JSON")
    p.add_argument("--junit", metavar="PATH", help="write JUnit XML")
    p.set_defaults(func=run)


def run(args) -> int:
    from gpu_impl.engines.model.sut import ModelSUT

    from ..errors import UsageError
    from .gate import gate
    from ..policy import load_policy
    from ..summary import verdict_line, write_reports

    if args.budget_s <= 0:
        raise UsageError(f"--budget-s: must be > 0, got {args.budget_s}")
    # the stage lines, the table's title, the JSON's "command" and JUnit's suite name say what ran
    summary = gate(ModelSUT(policy=load_policy("fixed")), budget_s=args.budget_s, seed=args.seed, command="check")
    summary.command = "check"
    code = write_reports(summary, args)
    print(f"fa3verify check: {verdict_line(summary)}")
    return code
