"""The `fa3verify` command line: one subcommand per job, shared exit codes.

Exit codes (every subcommand): 0 pass, 1 violation found, 2 bad input or usage, 3 inconclusive.
Before any subcommand runs, `main` checks the shared options (fa3verify.validation) and every output path
(fa3verify.outputs); an interrupt is exit 3; a worker that missed its deadline (it was killed), died or garbled
its answers is exit 3 naming it (spec.process.worker_client.WorkerError); an unexpected error is exit 3 ("internal
error"), never 0 or 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Optional, Sequence

from gpu_impl.errors import KernelUnavailable
from spec.process.worker_client import WorkerError

from gpu_impl.plugin import engine_phrase

from . import __version__, exitcodes
from .errors import OutputNotWritten, UsageError

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
    ("sanitize", "sanitize"),
]

DESCRIPTION = """\
Verify FlashAttention-3 split-KV attention as serving backends use it.

fa3verify proves, with z3, when reusing precomputed FA3 scheduler metadata is safe and which backend
guard keeps it safe; fuzzes a backend model against an exact oracle; and gates backend changes in CI.

exit codes: 0 pass, 1 violation found, 2 bad input or usage, 3 inconclusive (solver timeout, budget)

deadlines: FA3VERIFY_ENGINE_TIMEOUT=S (default 900) bounds each answer of an engine worker,
FA3VERIFY_ENGINE_START_TIMEOUT=S (default 900) its start (the engine's import, up to its hello),
FA3VERIFY_GUARD_IMPORT_TIMEOUT=S (default 120) the import of a guard, FA3VERIFY_THEOREM_PART_TIMEOUT=S
(default 600) a theorem part in a prove worker, FA3VERIFY_MATRIX_LANE_TIMEOUT=S (default 1800) each answer
of an `engine matrix --jobs N` lane; a worker past its deadline is killed and named, and the run (or the
matrix row) is inconclusive (exit 3)

examples:
  fa3verify check                                   # proofs + short CPU fuzz on the fixed guard
  fa3verify prove --guard pre-fix                   # the {modelled} guard before PR #30439: refuted
  fa3verify gate --guard mypkg.backend:should_disable --junit report.xml
  fa3verify replay fa3verify-out/cases/fuzz-split-bound-bd7afb1e9e0fc5e8.json
""".replace("{modelled}", engine_phrase("modelled"))


class CommandLineParser(argparse.ArgumentParser):
    """The top-level parser: an option its command does not know is reported with that command's usage (the
    innermost one, ``engine matrix``), not the top-level usage."""

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            command_parser(self, parsed).error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    parser = CommandLineParser(prog="fa3verify", description=DESCRIPTION,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"fa3verify {__version__}")
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



def command_parser(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``args`` names, down to the innermost (``engine matrix``): its usage is the
    one an error in that command's options prints."""
    current = parser
    while True:
        action = next((a for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, action.dest, None) if action is not None else None
        if name is None or name not in action.choices:
            return current
        current = action.choices[name]


def typed_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set:
    """The options of ``parser`` typed on the command line (``--guard``, also as ``--guard=X`` or an unambiguous
    prefix), whatever their value: an option typed with its default value is still typed."""
    known = parser._option_string_actions
    typed = set()
    for token in argv:
        if token == "--":
            break
        if not token.startswith("--"):
            continue
        name = token.split("=", 1)[0]
        matches = [name] if name in known else [k for k in known if k.startswith(name)]
        if len(matches) == 1:
            typed.update(known[matches[0]].option_strings)
    return typed


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return exitcodes.USAGE
    if isinstance(parser, argparse.ArgumentParser):
        args.typed_options = typed_options(command_parser(parser, args), argv)
    import spec.model.guard_isolation as isolation
    from spec.process import interrupts

    with interrupts.watching():
        try:
            rc = _run_command(args, isolation)
        except KeyboardInterrupt:
            rc = None
        # a pass after a Ctrl-C is one that some callback swallowed: the run did not pass, it was stopped
        if rc is None or (rc == exitcodes.PASS and interrupts.seen()):
            print(f"fa3verify {args.command}: interrupted", file=sys.stderr)
            rc = exitcodes.INCONCLUSIVE
        if interrupts.seen():
            interrupts.forget_handled_interrupt()  # the exit status is `rc`, not death by SIGINT
    return rc


def _run_command(args, isolation) -> int:
    """The command's exit status; every failure but Ctrl-C is turned into its exit status here."""
    from .outputs import stdout_reserved_for
    from .outputs import check_outputs, output_paths
    from .validation import check_args, check_typed_policy_options

    saved_timeout = isolation.GUARD_TIMEOUT_S
    try:
        check_args(args)
        check_typed_policy_options(args)
        check_outputs(args.command, args)
        if getattr(args, "guard_timeout_s", None) is not None:
            isolation.GUARD_TIMEOUT_S = args.guard_timeout_s
        with stdout_reserved_for(output_paths(args.command, args)):  # `--json -`: stdout carries the report alone
            return int(args.func(args))
    except UsageError as exc:
        print(f"fa3verify {args.command}: error: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except KernelUnavailable as exc:
        print(f"fa3verify {args.command}: error: --kernel: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except OutputNotWritten as exc:  # an output that is the command's product (no verdict to keep): inconclusive
        print(f"fa3verify {args.command}: error: {exc} (exit 3, inconclusive)", file=sys.stderr)
        return exitcodes.INCONCLUSIVE
    except WorkerError as exc:  # a worker missed its deadline (killed), died or garbled: named, never 0 or 1
        print(f"fa3verify {args.command}: inconclusive: {exc}", file=sys.stderr)
        return exitcodes.INCONCLUSIVE
    except Exception as exc:  # noqa: BLE001 - a crash is inconclusive, never a pass or a violation
        if os.environ.get("FA3VERIFY_TRACEBACK"):
            import traceback

            traceback.print_exc()
        print(f"fa3verify {args.command}: internal error: {type(exc).__name__}: {exc} (exit 3, inconclusive; "
              f"set FA3VERIFY_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return exitcodes.INCONCLUSIVE
    finally:
        isolation.GUARD_TIMEOUT_S = saved_timeout


if __name__ == "__main__":
    sys.exit(main())
