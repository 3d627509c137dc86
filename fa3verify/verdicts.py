"""The decisions that turn what a run observed into a verdict: a wrong line here is a false pass.

Kept as plain functions (the dataclasses' ``exit_code`` / ``still_fails`` / ``fails`` / ``verdict`` properties call
them) so that `make mutation` measures them: mutmut does not mutate property bodies.

* :func:`run_exit_code` -- a run summary's exit code (``fa3verify.summary.RunSummary.exit_code``);
* :func:`replay_still_fails`, :func:`replay_fails`, :func:`replay_verdict` -- replay's comparison of what it
  observed with what the case file expected (``fa3verify.commands.replay.ReplayOutcome``).
"""

from __future__ import annotations

from . import exitcodes
from spec.finding import Outcome

__all__ = ["run_exit_code", "replay_still_fails", "replay_fails", "replay_verdict"]


def run_exit_code(summary) -> int:
    """0 pass, 1 violation, 2 usage, 3 inconclusive: interrupted, a check inconclusive, or nothing ran."""
    if summary.usage_error:
        return exitcodes.USAGE
    if summary.interrupted:
        return exitcodes.INCONCLUSIVE
    if any(c.failed for c in summary.checks) or summary.failures:
        return exitcodes.VIOLATION
    if any(c.inconclusive for c in summary.checks) or not summary.checks:
        return exitcodes.INCONCLUSIVE
    return exitcodes.PASS


def replay_still_fails(outcome) -> bool:
    """True when the case fails the way the file says (same outcome, and the same invariant if named)."""
    if outcome.expected_outcome == Outcome.PASS:
        return False
    if outcome.outcome != outcome.expected_outcome and not (outcome.expected_outcome == Outcome.NAN
                                                            and outcome.outcome == Outcome.VIOLATION):
        return False
    return outcome.expected_invariant is None or outcome.expected_invariant in outcome.invariants


def replay_fails(outcome) -> bool:
    """True when the replay observed anything but a clean pass (a violation, NaN, a shape error, a guard fault):
    never exit 0, whatever the case file expected."""
    return outcome.outcome != Outcome.PASS or bool(outcome.findings)


def replay_verdict(outcome) -> str:
    """PASSES NOW / PASSES (as expected) / STILL FAILS / FAILS DIFFERENTLY."""
    if not replay_fails(outcome):
        return "PASSES (as expected)" if outcome.expected_outcome == Outcome.PASS else "PASSES NOW"
    return "STILL FAILS" if replay_still_fails(outcome) else "FAILS DIFFERENTLY (not as the case file expected)"
