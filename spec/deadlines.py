"""Deadlines a user sets through the environment: one parser, one range, one message.

Invariant: a deadline variable that is unset or blank gives its default; any other value must be a finite number
of seconds in (0, 3600], else the error names the variable and the range (exit 2 at the command line).
"""

from __future__ import annotations

import math
import os
from typing import Mapping, Optional

MAX_DEADLINE_S = 3600.0


def seconds_from_env(name: str, default: float, environ: Optional[Mapping[str, str]] = None,
                     error: type = ValueError) -> float:
    """``$name`` as seconds in (0, 3600], or ``default`` when it is unset or blank; else raises ``error``."""
    text = (os.environ if environ is None else environ).get(name, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_DEADLINE_S):
        raise error(f"{name}: must be a finite number of seconds in (0, {MAX_DEADLINE_S:g}], got {text!r}")
    return seconds
