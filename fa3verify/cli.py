"""The `fa3verify` command line: one subcommand per job, shared exit codes.

Exit codes (every subcommand): 0 pass, 1 violation found, 2 bad input or usage, 3 inconclusive.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

from gpu_impl.errors import KernelUnavailable

from . import exitcodes
from .errors import UsageError

#: (subcommand, module under fa3verify.commands). Each module has `register(subparsers)` and `run(args) -> int`.
COMMANDS = [
    ("check", "check"),
    ("prove", "prove"),
    ("fuzz", "fuzz"),
    ("replay", "replay"),
    ("gate", "gate"),
    ("bench", "bench"),
    ("catalogue", "catalogue"),
    ("invariants", "invariants"),
    ("hazard-map", "hazard_map"),
    ("report", "report"),
    ("run-ranks", "run_ranks"),
    ("conform", "conform"),
    ("engine", "engine"),
    ("gpu-check", "gpu_check"),
]

DESCRIPTION = """\
Verify FlashAttention-3 split-KV attention as serving backends use it.

fa3verify proves, with z3, when reusing precomputed FA3 scheduler metadata is safe and which backend
guard keeps it safe; fuzzes a backend model against an exact oracle; and gates backend changes in CI.

exit codes: 0 pass, 1 violation found, 2 bad input or usage, 3 inconclusive (solver timeout, budget)

examples:
  fa3verify check                                   # proofs + short CPU fuzz on the fixed guard
  fa3verify prove --guard pre-fix                   # the sglang guard before PR #30439: refuted
  fa3verify gate --guard mypkg.backend:should_disable --junit report.xml
  fa3verify replay fa3verify-out/cases/split_bound-1a2b3c.json
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fa3verify", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS:
        try:
            mod = importlib.import_module(f"fa3verify.commands.{module}")
        except ModuleNotFoundError as exc:
            if exc.name == f"fa3verify.commands.{module}":
                continue
            raise
        mod.register(sub)
    return parser



def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return exitcodes.USAGE
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"fa3verify {args.command}: error: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except KernelUnavailable as exc:
        print(f"fa3verify {args.command}: error: --kernel: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except KeyboardInterrupt:
        print(f"fa3verify {args.command}: interrupted", file=sys.stderr)
        return exitcodes.INCONCLUSIVE


if __name__ == "__main__":
    sys.exit(main())
