"""The trust model of case files: a case file never makes the tool run code the user did not name.

Invariant: the guard a replay runs is (1) the `--guard` the user gave on the command line, else (2) the case's
`policy.guard` when it names only this project's code (`fixed`, `pre-fix`, `none`, or a function in
spec.model.guards.PROJECT_GUARD_MODULES), else (3) the case's guard only with `--trust-case-guard`; anything else is
exit 2 naming `policy.guard`. Even a trusted guard runs in a child process with a deadline
(spec.model.guard_isolation). Used by `replay` and `run-ranks`.
"""

from __future__ import annotations

from typing import Optional

from .errors import UsageError


def guard_to_run(case_guard: str, cli_guard: Optional[str] = None, trust_case_guard: bool = False) -> str:
    """The guard spec a run over a case may load (see the module invariant)."""
    from spec.model.guards import is_builtin_guard

    if cli_guard:
        return cli_guard
    if is_builtin_guard(case_guard) or trust_case_guard:
        return case_guard
    raise UsageError(f"policy.guard: the case file names code to run ({case_guard!r}); a case file cannot make "
                     f"fa3verify import a file or module. Pass --guard {case_guard} to run it (or "
                     f"--guard fixed|pre-fix|none), or --trust-case-guard if you trust where the case came from")
