"""`gate`: prove + fuzz for one policy, one table, one exit code (what a backend change runs in CI)."""

from __future__ import annotations

import time
from typing import Optional

from .policy import Policy
from .summary import RunSummary


def gate(policy: Policy, budget_s: float = 20.0, seed: int = 0, timeout_s: float = 10.0,
         cases_dir: str = "fa3verify-out/cases", kernel_name: str = "emulated", device: str = "cpu",
         max_cases: Optional[int] = None, show_progress: Optional[bool] = None) -> RunSummary:
    """Run `prove` then `fuzz` under one policy and merge them into the gate's summary.

    An interrupt (SIGINT) during prove stops the gate there; during fuzz the campaign keeps what it found. Either
    way the summary is marked interrupted (exit 3) and returned, so the command still writes its reports.
    """
    from .fuzzing import fuzz
    from .progress import stage
    from .proving import prove

    start = time.perf_counter()
    summary = RunSummary(command="gate", seed=seed, policy=policy.to_dict())
    show_lines = None if show_progress is None else False  # API callers choose; the CLI prints on logs
    try:
        with stage("gate", "prove (z3 theorems)", show_lines,
                   result=lambda: f"{len(summary.checks)} theorems, {sum(c.failed for c in summary.checks)} failed"):
            summary.merge(prove(policy, timeout_s=timeout_s, cases_dir=cases_dir))
    except KeyboardInterrupt:
        summary.interrupted = True
    if not summary.interrupted:
        what = f"{max_cases} cases" if max_cases else f"{budget_s:g} s"
        with stage("gate", f"fuzz ({kernel_name} kernel, {what})", show_lines,
                   result=lambda: f"{summary.cases} cases, {summary.failures} failing"):
            summary.merge(fuzz(policy, kernel_name=kernel_name, device=device, seed=seed, budget_s=budget_s,
                               max_cases=max_cases, out_dir=cases_dir, show_progress=show_progress))
    summary.elapsed_s = time.perf_counter() - start
    return summary
