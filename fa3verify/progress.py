"""Progress lines for logs: one line when a stage starts and one when it ends, on non-terminals only.

Invariant: when stdout is not a terminal (CI logs, pipes), every stage a command runs (the gate's prove and
fuzz; on a real engine its worker's start, the witness search, the witness replay and the fuzz campaign on it;
a standalone prove, fuzz or conform; the engine worker's start of replay and run-ranks) writes `fa3verify COMMAND: STAGE ...` to stderr as it starts and
`fa3verify COMMAND: STAGE done in N.Ns (...)` as it ends (`interrupted in` after a Ctrl-C, also one the stage
caught and turned into a partial result, such as a fuzz campaign that keeps what it found; `stopped in` after any
other exception: a usage error or a crash is never labelled an interrupt), so a log shows what runs and how long it
took;
on a terminal the live rich display (fa3verify.commands.fuzz) is used instead and these lines are not printed.
Progress is never written to stdout, which may carry a report (`--json -`).
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional


def log_lines_enabled(show: Optional[bool] = None) -> bool:
    """Whether to print stage lines: explicitly asked, else when stdout is not a terminal."""
    if show is not None:
        return show
    try:
        return not sys.stdout.isatty()
    except (AttributeError, ValueError):
        return True


class StageEnd:
    """What the block of :func:`stage` tells its end line: ``interrupted`` when the block caught a Ctrl-C itself
    and ended with a partial result (a fuzz campaign's ``RunSummary.interrupted``)."""

    def __init__(self) -> None:
        self.interrupted = False


@contextmanager
def stage(command: str, name: str, show: Optional[bool] = None,
          result: Optional[Callable[[], str]] = None) -> Iterator[StageEnd]:
    """Print the start and end line of one stage (see the module invariant); `result()` adds a summary. The block
    gets a :class:`StageEnd`; a Ctrl-C it caught (``end.interrupted = True``, or a SIGINT seen during the block)
    makes the end line say ``interrupted``, not ``done``."""
    from spec.process import interrupts

    enabled = log_lines_enabled(show)
    start = time.perf_counter()
    seen_before = interrupts.seen()
    end = StageEnd()
    if enabled:
        print(f"fa3verify {command}: {name} ...", file=sys.stderr, flush=True)
    outcome = "stopped"
    try:
        yield end
        outcome = "interrupted" if end.interrupted or (interrupts.seen() and not seen_before) else "done"
    except KeyboardInterrupt:
        outcome = "interrupted"
        raise
    finally:
        if enabled:
            extra = ""
            if result is not None and (outcome == "done" or end.interrupted):
                try:
                    extra = f" ({result()})"
                except Exception:  # noqa: BLE001 - a progress line must never break the run
                    extra = ""
            print(f"fa3verify {command}: {name} {outcome} in {time.perf_counter() - start:.1f}s{extra}",
                  file=sys.stderr, flush=True)
