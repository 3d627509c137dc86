"""gpu-check's stage runner: one deadline, crash-isolated stages, the summary rewritten after every stage.

Invariant: the run ends within the plan's total budget, a stage that raises is recorded as inconclusive (it never
loses the others), and ``OUT/gpu_check_summary.json`` always holds every finished stage; the exit code is 1 when
a stage failed, 3 when one was inconclusive or none ran, else 0. The JUnit and compute-sanitizer (memcheck)
parsers the stages use are its helpers.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from spec.finding import StageStatus, Verdict

from ..outputs import shown_path
from .environment import gpu_problem, print_environment, probe_environment
from .plan import Plan
from .tasks import worker_init

SCHEMA = "fa3verify.gpu_check/1"
SUMMARY_NAME = "gpu_check_summary.json"

STATUS_CODE = {StageStatus.PASS: 0, StageStatus.SKIPPED: 0, StageStatus.FAIL: 1, StageStatus.INCONCLUSIVE: 3}


@dataclass
class Stage:
    """One stage's result: status (pass/fail/inconclusive/skipped), what was expected, seconds, numbers."""

    name: str
    status: StageStatus = StageStatus.PENDING
    expectation: str = ""
    seconds: float = 0.0
    numbers: dict = field(default_factory=dict)
    message: str = ""

    def to_dict(self) -> dict:
        return {"status": self.status, "expectation": self.expectation, "seconds": round(self.seconds, 2),
                "message": self.message, **self.numbers}


#: A stage: a function that fills in its :class:`Stage` (status, expectation, numbers, message) for a run.
StageFn = Callable[["GpuCheck", "Stage"], None]


class GpuCheck:
    """State of one gpu-check run: the plan, the deadline, the stages done, the worker pool, the case files."""

    def __init__(self, plan: Plan, out_dir: str, skip: set = frozenset(),
                 stages: Sequence[tuple[str, StageFn]] = (), defects: Sequence[str] = ()):
        self.plan = plan
        #: seeded defects (gpu_impl.defects) the fuzz stage's workers apply from outside (a negative control)
        self.defects = tuple(sorted(set(defects)))
        self.steps = tuple(stages)
        self.out_dir = os.path.abspath(out_dir)
        self.cases_dir = os.path.join(self.out_dir, "cases")
        self.skip = set(skip)
        self.started = time.perf_counter()
        self.deadline = self.started + plan.total_budget_s
        self.environment: dict = {}
        self.stages: dict[str, Stage] = {}
        self.findings: list[dict] = []
        self.case_files: list[str] = []
        self.pool = None
        self.adapter_describe = ""
        self.num_sm: Optional[int] = None
        self.error: Optional[str] = None

    # -- bookkeeping --------------------------------------------------------------------------------------
    def remaining(self) -> float:
        return self.deadline - time.perf_counter()

    def budget(self, cap: float, reserve: float = 0.0) -> float:
        """Seconds a stage may use: its cap, but never past the deadline minus what later stages need."""
        return max(0.0, min(cap, self.remaining() - reserve))

    def exit_code(self) -> int:
        """1 if a stage failed, 3 if one was inconclusive or none ran (all skipped is never a pass), else 0."""
        if self.error:
            return 3
        if not any(s.status != StageStatus.SKIPPED for s in self.stages.values()):
            return 3
        codes = [STATUS_CODE.get(s.status, 3) for s in self.stages.values()]
        if 1 in codes:
            return 1
        if 3 in codes:
            return 3
        return 0

    def summary(self) -> dict:
        code = self.exit_code()
        return {
            "schema": SCHEMA, "command": "gpu-check", "dry_run": self.plan.dry_run,
            "verdict": {0: Verdict.PASS, 1: Verdict.FAIL, 3: Verdict.INCONCLUSIVE}.get(code,
                        Verdict.FAIL), "exit_code": code,
            "elapsed_s": round(time.perf_counter() - self.started, 2), "error": self.error,
            "environment": self.environment, "adapter": self.adapter_describe,
            "plan": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.plan.__dict__.items()},
            "stages": {name: s.to_dict() for name, s in self.stages.items()},
            "findings": self.findings[:100], "case_files": self.case_files[:200],
        }

    def write_summary(self) -> str:
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, SUMMARY_NAME)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(self.summary(), fh, indent=2, default=str)
            fh.write("\n")
        os.replace(tmp, path)
        return path

    @property
    def adapter(self) -> dict:
        """The kernel adapter the workers load (the plan's), with the seeded defects when there are any."""
        return {**self.plan.adapter, "defects": list(self.defects)} if self.defects else self.plan.adapter

    def save_case(self, stage: str, name: str, payload: dict) -> str:
        """A stage's evidence file (``fa3verify.gpu_check_case/1``: what the stage saw, not a replayable case)."""
        path = self._case_path(stage, name)
        with open(path, "w") as fh:
            json.dump({"schema": "fa3verify.gpu_check_case/1", "stage": stage, **payload}, fh, indent=2, default=str)
            fh.write("\n")
        return path

    def write_case(self, stage: str, name: str, case) -> str:
        """A replayable case file (``fa3verify.case/1``, ``fa3verify.case_files``) that ``fa3verify replay`` reads."""
        from ..case_files import write_case

        return str(write_case(case, self._case_path(stage, name)))

    def _case_path(self, stage: str, name: str) -> str:
        os.makedirs(self.cases_dir, exist_ok=True)
        path = os.path.join(self.cases_dir, f"{stage}-{name}.json")
        self.case_files.append(os.path.relpath(path, self.out_dir))
        return path

    def finding(self, stage: str, kind: str, message: str, case_file: Optional[str] = None, **extra) -> None:
        self.findings.append({"stage": stage, "kind": kind, "message": message[:1000],
                              "case_file": None if case_file is None else os.path.relpath(case_file, self.out_dir),
                              **extra})

    def say(self, text: str) -> None:
        print(f"[gpu-check {time.perf_counter() - self.started:6.1f}s] {text}", flush=True)

    # -- driver ---------------------------------------------------------------------------------------------
    def run(self) -> int:
        os.makedirs(self.out_dir, exist_ok=True)
        mode = "DRY RUN (CPU, emulated FA3)" if self.plan.dry_run else "GPU (real FA3)"
        self.say(f"{mode}; out {shown_path(self.out_dir)}; total budget {self.plan.total_budget_s:.0f}s")
        self.environment = probe_environment()
        print_environment(self.say, self.environment)
        gpu = self.environment.get("gpu") or {}
        self.num_sm = 132 if self.plan.dry_run else gpu.get("sms")
        problem = None if self.plan.dry_run else gpu_problem(self.environment)
        if problem:
            self.error = problem
            self.say(f"cannot run on this machine: {problem}")
            self.say("nothing was run; use --dry-run to exercise the plumbing on CPU")
            self.write_summary()
            print(f"fa3verify gpu-check: inconclusive: {problem}", file=sys.stderr)
            return 3
        from ..workers import WorkerInitError, WorkerPool

        # one torch thread per worker on a small (CI) machine: oversubscribed thread pools crawl
        threads = 1 if self.plan.dry_run else max(1, (os.cpu_count() or 2) // (self.plan.workers + 1))
        try:
            self.pool = WorkerPool(self.plan.workers, init=worker_init, init_args=(threads,),
                                   timeout_s=self.plan.fuzz_case_timeout_s)
            for name, fn in self.steps:
                stage = Stage(name)
                self.stages[name] = stage
                if name in self.skip:
                    stage.status, stage.message = StageStatus.SKIPPED, "left out with --skip"
                    continue
                t0 = time.perf_counter()
                self.say(f"stage {name} ...")
                try:
                    fn(self, stage)
                except WorkerInitError as exc:
                    stage.status, stage.message = StageStatus.INCONCLUSIVE, f"workers could not start: {exc}"[:2000]
                except Exception as exc:  # noqa: BLE001 - one broken stage must not lose the others
                    import traceback

                    stage.status = StageStatus.INCONCLUSIVE
                    stage.message = f"stage raised {type(exc).__name__}: {exc}"[:500]
                    stage.numbers["traceback"] = traceback.format_exc()[-4000:]
                stage.seconds = time.perf_counter() - t0
                self.say(f"stage {name}: {stage.status.upper()} in {stage.seconds:.1f}s"
                         + (f" -- {stage.message}" if stage.message else ""))
                self.write_summary()
        finally:
            if self.pool is not None:
                self.pool.close()
        path = self.write_summary()
        self.print_table(path)
        return self.exit_code()

    def print_table(self, path: str) -> None:
        print("\nfa3verify gpu-check summary" + (" (dry run)" if self.plan.dry_run else ""))
        width = max([16] + [len(n) for n in self.stages])
        for name, s in self.stages.items():
            nums = ", ".join(f"{k}={v}" for k, v in s.numbers.items()
                             if isinstance(v, (int, float, str, bool)) and k != "traceback" and len(str(v)) < 60)
            print(f"  {name:<{width}} {s.status.upper():<12} {s.seconds:7.1f}s  {nums}")
        code = self.exit_code()
        print(f"verdict: {self.summary()['verdict'].upper()} (exit {code}) | findings {len(self.findings)} | "
              f"{time.perf_counter() - self.started:.1f}s | summary {shown_path(path)}", flush=True)


def junit_counts(path: str) -> dict:
    """tests/failures/errors/skipped/passed from a pytest JUnit XML (None values when it is missing)."""
    if not os.path.exists(path):
        return {"tests": None, "failures": None, "errors": None, "skipped": None, "passed": None}
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    total["passed"] = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    return total


def junit_failures(path: str) -> list[str]:
    out = []
    if not os.path.exists(path):
        return out
    for case in ET.parse(path).getroot().iter("testcase"):
        for tag in ("failure", "error"):
            el = case.find(tag)
            if el is not None:
                out.append(f"{case.get('classname')}::{case.get('name')}: {tag}: {(el.get('message') or '')[:300]}")
    return out


_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error")


def parse_memcheck(text: str) -> dict:
    """``{"errors": N | None, "first_errors": [...]}`` from compute-sanitizer output."""
    found = _ERROR_SUMMARY.findall(text or "")
    errors = int(found[-1]) if found else None
    firsts = [line.strip("= ").strip() for line in (text or "").splitlines()
              if "Invalid __global__" in line or "Invalid __shared__" in line or "Out-of-range" in line
              or "Program hit" in line][:5]
    return {"errors": errors, "first_errors": firsts}


def tail(text: str, n: int = 2000) -> str:
    return (text or "")[-n:]


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
