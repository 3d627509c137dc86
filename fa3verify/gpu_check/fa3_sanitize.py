"""gpu-check's ``fa3_sanitize`` stage: the worked example with :mod:`fa3verify.sanitize` over the FA3 module.

Invariant: the pre-fix precompute (8, 1) is refused before launch with SPLIT_BOUND, the fresh precompute (32, 4)
runs finite with no violation, and the FA3 entry points are restored afterwards; the sanitizer's time per call is
measured against the kernel's (the task is ``fa3verify.sanitize.gpu_stage``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from spec.finding import StageStatus

if TYPE_CHECKING:
    from .runner import GpuCheck, Stage


def run(check: GpuCheck, stage: Stage) -> None:
    """The worked example with fa3verify.sanitize over the real FA3 module (fa3verify.sanitize.gpu_stage)."""
    import functools

    from ..sanitize.gpu_stage import sanitize_worked_example_task

    p = check.plan
    stage.expectation = ("the pre-fix precompute (8, 1) is refused before launch with SPLIT_BOUND; the fresh "
                         "precompute (32, 4) runs finite; overhead per call measured against the kernel")
    limit = check.budget(p.worked_timeout_s, reserve=5)
    if limit < 10:
        stage.status, stage.message = StageStatus.INCONCLUSIVE, f"only {limit:.0f}s left"
        return
    task = functools.partial(sanitize_worked_example_task, p.adapter, p.worked_long, p.worked_num_sm,
                             os.path.join(check.out_dir, "sanitize"), 1 if p.dry_run else 20, p.seed)
    res = check.pool.run(task, timeout_s=limit)
    if not res.ok:
        stage.status, stage.message = StageStatus.INCONCLUSIVE if not res.crashed else StageStatus.FAIL, res.summary()[:500]
        stage.numbers["error"] = res.error_text[-3000:]
        return
    v = dict(res.value)
    stage.numbers.update(v)
    caught = v.get("stale", {}).get("caught") and v["stale"].get("invariant") == "SPLIT_BOUND"
    clean = v.get("fresh", {}).get("finite") and v["fresh"].get("violations") == 0 and v.get("restored")
    stage.status = StageStatus.PASS if caught and clean else StageStatus.FAIL
    stage.message = (f"stale caught: {v.get('stale', {}).get('invariant')}; fresh clean: {bool(clean)}; "
                     f"overhead {v.get('overhead_us', float('nan')):.1f} us per call against "
                     f"{v.get('kernel_call_us', float('nan')):.1f} us")
    if not caught:
        check.finding("fa3_sanitize", "not-caught", "the sanitizer let the pre-fix metadata reach the kernel",
                     case_file=check.save_case("fa3_sanitize", "not-caught", v))
