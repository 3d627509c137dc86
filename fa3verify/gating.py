"""`gate`: prove + fuzz for one policy, one table, one exit code (what a backend change runs in CI)."""

from __future__ import annotations

import time
from typing import Optional

from .policy import Policy
from .summary import RunSummary


def gate(policy: Policy, budget_s: float = 20.0, seed: int = 0, timeout_s: float = 10.0,
         cases_dir: str = "fa3verify-out/cases", kernel_name: str = "emulated", device: str = "cpu",
         max_cases: Optional[int] = None, show_progress: Optional[bool] = None) -> RunSummary:
    """Run `prove` then `fuzz` under one policy and merge them into the gate's summary."""
    from .fuzzing import fuzz
    from .proving import prove

    start = time.perf_counter()
    summary = RunSummary(command="gate", seed=seed, policy=policy.to_dict())
    summary.merge(prove(policy, timeout_s=timeout_s, cases_dir=cases_dir))
    summary.merge(fuzz(policy, kernel_name=kernel_name, device=device, seed=seed, budget_s=budget_s,
                       max_cases=max_cases, out_dir=cases_dir, show_progress=show_progress))
    summary.elapsed_s = time.perf_counter() - start
    return summary
