"""Deadlines a user sets, through the environment or an argument: one parser, one message.

Invariant: a deadline variable that is unset or blank gives its default; any other value, and any value given as
an argument, must be a finite number of seconds in (0, maximum] (3600 unless the caller names another), else the
error names the variable or argument and the range (exit 2 at the command line).
"""

from __future__ import annotations

import math
import os
from typing import Mapping, Optional

MAX_DEADLINE_S = 3600.0


def checked_seconds(value, source: str, maximum: float = MAX_DEADLINE_S, error: type = ValueError,
                    what: str = "") -> float:
    """``value`` as seconds in (0, maximum]; else raises ``error`` naming ``source`` (a variable or an argument),
    ``what`` the deadline is, and the range."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= maximum):
        raise error(f"{source}: {what + ' ' if what else ''}must be a finite number of seconds in "
                    f"(0, {maximum:g}], got {value!r}")
    return seconds


def seconds_from_env(name: str, default: float, environ: Optional[Mapping[str, str]] = None,
                     error: type = ValueError, maximum: float = MAX_DEADLINE_S, what: str = "") -> float:
    """``$name`` as seconds in (0, maximum], or ``default`` when it is unset or blank; else raises ``error``."""
    text = (os.environ if environ is None else environ).get(name, "").strip()
    if not text:
        return default
    return checked_seconds(text, name, maximum, error, what)
