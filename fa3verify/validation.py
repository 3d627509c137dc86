"""Validation of command-line values shared by every subcommand: numbers, devices, named choices.

Invariant: a parsed option that reaches a command's `run` is finite and inside its documented range (below);
otherwise the run ends before any work with exit 2 and a message naming the option and the allowed range.
`check_args(command, args)` applies the table to whatever options the subcommand has (by argparse dest), so a
new command gets the same checks by using the same option names.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

from .errors import UsageError

DAY_S = 86400.0

#: argparse dest -> (kind, low, high, low_inclusive). Floats must be finite; None bounds are open.
NUMERIC_OPTIONS: dict[str, tuple[str, Optional[float], Optional[float], bool]] = {
    "timeout_s": ("float", 0.0, DAY_S, False),
    "budget_s": ("float", 0.0, DAY_S, False),
    "fuzz_budget_s": ("float", 0.0, DAY_S, False),
    "fidelity_budget_s": ("float", 0.0, DAY_S, False),
    "total_budget_s": ("float", 0.0, DAY_S, False),
    "guard_timeout_s": ("float", 0.0, 3600.0, False),
    "cases": ("int", 1, 10_000_000, True),
    "seed": ("int", 0, 2 ** 63 - 1, True),
    "world": ("int", 1, 1024, True),
    "workers": ("int", 1, 64, True),
    "fidelity_configs": ("int", 1, 1_000_000, True),
}
# hazard-map's --sm/--tp/--page-size have narrower, command-specific rules it checks itself (real SM counts,
# divisors of the model's heads), so they are not in this table.

_DEVICE_RE = re.compile(r"^(cpu|cuda(:\d{1,3})?)$")


def option_name(dest: str) -> str:
    """The command-line spelling of an argparse dest (`budget_s` -> `--budget-s`)."""
    return "--" + dest.replace("_", "-")


def allowed_range(kind: str, lo, hi, lo_inclusive: bool) -> str:
    """Human text of a range, e.g. 'a finite number in (0, 86400]'."""
    what = "a finite number" if kind == "float" else "an integer"
    left = "[" if lo_inclusive else "("
    return f"{what} in {left}{lo:g}, {hi:g}]" if kind == "float" else f"{what} in {left}{lo}, {hi}]"


def check_number(flag: str, value: Any, kind: str, lo, hi, lo_inclusive: bool = True) -> None:
    """Raise UsageError naming `flag` unless `value` is finite and in the range."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and kind == "float":
        ok = math.isfinite(value)
    if ok and lo is not None:
        ok = value >= lo if lo_inclusive else value > lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        raise UsageError(f"{flag}: expected {allowed_range(kind, lo, hi, lo_inclusive)}, got {value!r}")


def check_device(flag: str, value: Any) -> None:
    """A torch device this tool can use: cpu, cuda or cuda:N (cuda only where torch sees a GPU)."""
    if value is None:
        return
    if not isinstance(value, str) or not _DEVICE_RE.match(value):
        raise UsageError(f"{flag}: expected cpu, cuda or cuda:N, got {value!r}")
    if value.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"{flag}: {value} requested but torch sees no CUDA device here; use --device cpu")
        index = int(value.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise UsageError(f"{flag}: {value} requested but torch sees {torch.cuda.device_count()} CUDA device(s)")


def check_args(args) -> None:
    """Apply the shared checks to every option the parsed subcommand has."""
    values = vars(args)
    for dest, (kind, lo, hi, lo_inc) in NUMERIC_OPTIONS.items():
        if isinstance(values.get(dest), (int, float)):  # `cases` is a list of paths in run-ranks
            check_number(option_name(dest), values[dest], kind, lo, hi, lo_inc)
    if "device" in values:
        check_device("--device", values["device"])


#: commands where the model policy still counts with a real engine: prove chooses the model theorems under it and
#: replays their witnesses on the engine
POLICY_CHOOSES_WITH_ENGINE = ("prove",)


def check_typed_policy_options(args) -> None:
    """A model-policy option (``--guard``, ``--metadata-heads``, ...) typed at its default value together with a
    real engine is a UsageError naming both (``--guard fixed``): a real engine runs its own
    guard, head counts and runner, so the option would be ignored, and a user who typed it expects it to count.
    ``args.typed_options`` (set by the command line) holds the options typed; the values set away from their
    defaults are refused again when the engine opens (:func:`fa3verify.engine_choice.refuse_policy_options`)."""
    typed = getattr(args, "typed_options", None) or ()
    engine = getattr(args, "engine", None)
    if not typed or not isinstance(engine, str) or getattr(args, "command", None) in POLICY_CHOOSES_WITH_ENGINE:
        return
    from .engine_choice import POLICY_OPTIONS, parse_engine_option

    # typed at the default value only: a value away from the default is refused when the engine opens, with its
    # own words (fa3verify.engine_choice.refuse_policy_options)
    given = [(dest, option) for dest, option, default in POLICY_OPTIONS
             if option in typed and hasattr(args, dest) and getattr(args, dest) == default]
    if not given:
        return
    spec = parse_engine_option(engine)
    dest, option = given[0]
    if spec.plugin.policy_option_refusal(spec, option) is None:  # the option applies (the model's policy runs)
        return
    value = getattr(args, dest)
    shown = option if isinstance(value, bool) else f"{option} {value}"
    raise UsageError(f"{shown}: conflicts with --engine {spec}: a real engine's guard, head counts and runner are "
                     f"its own code, so {option} would be ignored; drop {option}, or use --engine model to run "
                     f"the model under it")
