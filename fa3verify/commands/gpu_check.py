"""fa3verify gpu-check: the command line of the real-FA3 checks on a GPU machine (or their CPU dry run).

The stages, the stage runner and the plan are the package :mod:`fa3verify.gpu_check` (its docstring lists the
stages). This module parses the options, builds the plan and runs the stages; ``python -m
fa3verify.commands.gpu_check`` is the same subcommand without the CLI around it, and ``--child-worked-example``
runs one worked example in this process (the compute-sanitizer child).

Exit codes: 0 every stage met its expectation, 1 one did not, 3 a stage could not run (no GPU or no FA3
module without --dry-run, a timeout), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys

from ..gpu_check import SCHEMA, STAGE_NAMES, STAGES, SUMMARY_NAME, GpuCheck, junit_counts, junit_failures, make_plan
from ..gpu_check import parse_memcheck
from ..gpu_check.fuzz_cases import random_fuzz_case
from ..gpu_check.worked_example import worked_expected, child_main

# names the tests and scripts read from this module
__all__ = ["HELP", "EPILOG", "register", "add_arguments", "run", "main", "SCHEMA", "SUMMARY_NAME", "STAGE_NAMES",
           "junit_counts", "junit_failures", "parse_memcheck", "random_fuzz_case", "worked_expected", "child_main"]

HELP = "run the real-FA3 checks on a GPU (fidelity, fuzz, worked example); --dry-run on CPU"
EPILOG = """\
examples:
  fa3verify gpu-check --dry-run                  # the same plumbing on CPU, emulated kernel (~1 min)
  fa3verify gpu-check                            # on an sm90 GPU with an FA3 module (~4-7 min)
  fa3verify gpu-check --fidelity-configs 2000 --fuzz-budget-s 120 --out gpu-out
  bash scripts/gpu_check.sh                      # installs a carried fa3-fwd wheel first, copies the summary to $OUT

writes OUT/gpu_check_summary.json (schema fa3verify.gpu_check/1), OUT/gpu_tests.xml, OUT/cases/*.json
exit codes: 0 every stage met its expectation, 1 one did not, 3 a stage could not run, 2 bad arguments
"""


def register(sub) -> None:
    p = sub.add_parser("gpu-check", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p) -> None:
    p.add_argument("--dry-run", action="store_true",
                   help="run every stage on CPU with the emulated kernel (CI); no GPU needed")
    p.add_argument("--out", default="fa3verify-out/gpu-check", metavar="DIR",
                   help="where the summary, JUnit XML and case files go (default fa3verify-out/gpu-check)")
    p.add_argument("--fidelity-configs", type=int, metavar="N",
                   help="random configurations for the metadata fidelity check (default 1000; dry run 30)")
    p.add_argument("--fidelity-budget-s", type=float, metavar="S",
                   help="seconds of the fidelity check per FA3 build (default 110; dry run 40)")
    p.add_argument("--fuzz-budget-s", type=float, metavar="S",
                   help="seconds of differential fuzzing (default 60; dry run 6)")
    p.add_argument("--total-budget-s", type=float, metavar="S",
                   help="the whole run ends within S seconds; stages shrink to fit (default 420; dry run 150)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="worker processes (default: 1 in a dry run, else min(4, CPUs/4))")
    p.add_argument("--seed", type=int, default=0, help="seed of the fidelity configurations and fuzz cases")
    p.add_argument("--fa3-build", action="append", default=[], metavar="DIR",
                   help="also check the FA3 build laid out in DIR (scripts/prepare_fa3_builds.py: an engine's own "
                        "FA3 package as its wheel ships it; repeatable)")
    p.add_argument("--skip", action="append", default=[], metavar="STAGE", choices=STAGE_NAMES,
                   help=f"leave a stage out (repeatable): {', '.join(STAGE_NAMES)}")


def run(args) -> int:
    plan = make_plan(args)
    check = GpuCheck(plan, out_dir=args.out, skip=set(args.skip), stages=STAGES)
    return check.run()


def main(argv=None) -> int:
    """``python -m fa3verify.commands.gpu_check [gpu-check options]``: the subcommand without the CLI around it
    (for a machine where another subcommand's imports fail); ``--child-worked-example`` runs :func:`child_main`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a.startswith("--child-worked-example") for a in argv):
        return child_main(argv)
    from ..errors import UsageError

    p = argparse.ArgumentParser(prog="python -m fa3verify.commands.gpu_check", description=HELP, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        from ..validation import check_args

        check_args(args)  # the CLI's shared ranges (fa3verify.validation), as the subcommand checks them
        return run(args)
    except UsageError as exc:
        print(f"fa3verify gpu-check: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
