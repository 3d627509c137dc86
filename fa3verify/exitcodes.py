"""Exit codes shared by every fa3verify subcommand, and the verdict word of each (``spec.finding.Verdict``: a run
summary's verdict is "pass", "fail", "usage-error" or "inconclusive")."""

from spec.finding import Verdict

PASS = 0          #: every check had its expected result
VIOLATION = 1     #: a violation was found (a refuted safety theorem, a failing fuzz case, a replayed failure)
USAGE = 2         #: bad input or usage; the message names the field and what is allowed
INCONCLUSIVE = 3  #: a solver timeout or an exhausted budget before any result

NAMES = {PASS: Verdict.PASS, VIOLATION: Verdict.FAIL, USAGE: Verdict.USAGE_ERROR, INCONCLUSIVE: Verdict.INCONCLUSIVE}


def combine(codes) -> int:
    """Overall code of several checks: any violation fails, else any inconclusive, else pass."""
    codes = list(codes)
    if VIOLATION in codes:
        return VIOLATION
    if USAGE in codes:
        return USAGE
    if INCONCLUSIVE in codes:
        return INCONCLUSIVE
    return PASS


def verdict_name(code: int) -> Verdict:
    """The verdict word of an exit code: pass, fail, usage-error or inconclusive (any other code: fail)."""
    return NAMES.get(code, Verdict.FAIL)
