"""gpu-check's plan: the budgets and sizes of one run (the GPU defaults or the dry run's), from the arguments.

Invariant: every budget and size a stage uses comes from one :class:`Plan`, checked here (a bad value is a
``UsageError`` naming the option and its range, exit 2) before anything runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

#: docs/facts-fa3.md's worked example.
WORKED_MODEL = "qwen3-30b-a3b"
WORKED_LONG, WORKED_SHORT, WORKED_SHORT_COUNT = 32768, 100, 7
#: The CPU scale of the worked example (dry run): same heads and parallelism, a 16-SM GPU, a 4096-token sequence.
DRY_WORKED_LONG, DRY_WORKED_NUM_SM = 4096, 16


@dataclass(frozen=True)
class Plan:
    """Budgets and sizes of one run (GPU defaults, or the dry run's)."""

    dry_run: bool
    total_budget_s: float
    fidelity_configs: int
    fidelity_chunk: int
    fidelity_budget_s: float
    fuzz_budget_s: float
    fuzz_max_len: int
    fuzz_contexts: tuple
    fuzz_case_timeout_s: float
    worked_long: int
    worked_num_sm: Optional[int]
    worked_timeout_s: float
    gpu_tests_timeout_s: float
    sanitizer_timeout_s: float
    workers: int
    max_q_elems: int
    max_kv_elems: int
    seed: int
    #: the adapters of more FA3 builds to check (``--fa3-build DIR``: gpu_impl.kernels.laid_out_build)
    build_adapters: tuple = ()

    @property
    def adapter(self) -> dict:
        return {"name": "emulated", "device": "cpu"} if self.dry_run else {"name": "fa3", "device": "cuda"}

    @property
    def fidelity_adapters(self) -> tuple:
        """Every FA3 build the fidelity stage checks: the main adapter's, then each laid-out build given."""
        return (self.adapter,) + (() if self.dry_run else tuple(self.build_adapters))


def make_plan(args) -> Plan:
    from ..errors import UsageError

    dry = bool(args.dry_run)
    cpus = os.cpu_count() or 2
    n_fid = args.fidelity_configs if args.fidelity_configs is not None else (30 if dry else 1000)
    fuzz_s = args.fuzz_budget_s if args.fuzz_budget_s is not None else (6.0 if dry else 60.0)
    total = args.total_budget_s if args.total_budget_s is not None else (150.0 if dry else 420.0)
    fid_s = getattr(args, "fidelity_budget_s", None)
    fid_s = fid_s if fid_s is not None else (40.0 if dry else 110.0)
    if fid_s <= 0:
        raise UsageError(f"--fidelity-budget-s: must be > 0 seconds, got {fid_s}")
    if n_fid < 1:
        raise UsageError(f"--fidelity-configs: must be >= 1, got {n_fid}")
    if fuzz_s <= 0:
        raise UsageError(f"--fuzz-budget-s: must be > 0 seconds, got {fuzz_s}")
    if total < 30:
        raise UsageError(f"--total-budget-s: must be >= 30 seconds, got {total}")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers: must be >= 1, got {args.workers}")
    workers = args.workers or (1 if dry else max(1, min(4, cpus // 4)))
    from gpu_impl.kernels import laid_out_build

    build_adapters = []
    for d in getattr(args, "fa3_build", None) or ():
        try:
            build_adapters.append(laid_out_build(d))
        except ValueError as exc:
            raise UsageError(f"--fa3-build: {exc}") from None
    return Plan(
        dry_run=dry, total_budget_s=float(total), fidelity_configs=int(n_fid),
        fidelity_chunk=max(1, min(250, -(-n_fid // max(1, workers)))) if not dry else max(1, -(-n_fid // 2)),
        fidelity_budget_s=float(fid_s), fuzz_budget_s=float(fuzz_s),
        fuzz_max_len=384 if dry else 16384, fuzz_contexts=(1024, 2048) if dry else (4096, 16384, 32768),
        fuzz_case_timeout_s=60.0 if dry else 90.0,
        worked_long=DRY_WORKED_LONG if dry else WORKED_LONG, worked_num_sm=DRY_WORKED_NUM_SM if dry else None,
        worked_timeout_s=60.0 if dry else 120.0, gpu_tests_timeout_s=90.0 if dry else 150.0,
        sanitizer_timeout_s=180.0, workers=workers,
        max_q_elems=(1 << 18) if dry else (1 << 26), max_kv_elems=(1 << 24) if dry else (1 << 29),
        seed=int(args.seed), build_adapters=tuple(build_adapters))


