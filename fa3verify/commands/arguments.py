"""Argument handling more than one command shares (not a command: the commands take these from here, never from
each other): the case folder (``--cases-dir``, older name ``--out``) and the fuzz budget (``--budget-s`` or
``--cases``), and the engines' example lines in a command's help."""

from __future__ import annotations

import argparse
import re

from gpu_impl.plugin import engine_examples

from ..errors import UsageError

_EXAMPLES = re.compile(r"\{([a-z]+(?:\.[a-z]+)?)\}")


def with_engine_examples(epilog: str) -> str:
    """A command's epilog with each ``{place}`` marker replaced by the engines' example lines for that place
    (``gpu_impl.plugin.engine_examples``: the words each engine's folder holds), so the help names no engine of
    its own."""
    return _EXAMPLES.sub(lambda m: engine_examples(m.group(1)), epilog)


def add_cases_dir_argument(p) -> None:
    """``--cases-dir DIR``, the case folder's name in every command; ``--out DIR`` is kept as its hidden older name
    (its own dest, so a bad path is named as typed)."""
    names = p.add_mutually_exclusive_group()
    names.add_argument("--cases-dir", default=None, metavar="DIR",
                       help="where failing cases are saved (default fa3verify-out/cases; --out DIR is an older name)")
    names.add_argument("--out", default=None, metavar="DIR", help=argparse.SUPPRESS)


def cases_dir_of(args) -> str:
    """The case folder ``--cases-dir`` (or its older name ``--out``) names."""
    return args.cases_dir or args.out or "fa3verify-out/cases"


def budget_from_args(args, default_budget: float = 20.0):
    """(budget_s, max_cases) from --budget-s/--cases, validated."""
    if args.cases is not None:
        if args.cases < 1:
            raise UsageError(f"--cases: must be >= 1, got {args.cases}")
        return None, args.cases
    budget = default_budget if args.budget_s is None else args.budget_s
    if not budget > 0:  # NaN too (fa3verify.validation checks the range first)
        raise UsageError(f"--budget-s: must be > 0, got {budget}")
    return budget, None
