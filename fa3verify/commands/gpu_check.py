"""fa3verify gpu-check: one prepared run of the real-FA3 checks on a GPU machine (or all of its plumbing on CPU).

Stages, in the order they run (each with a time budget inside one overall deadline, so the run ends within
``--total-budget-s``, default 420 s; the summary is rewritten after every stage, so a killed run keeps what
it did):

``environment``     GPU, torch and CUDA versions, the FA3 module found and its file, compute-sanitizer.
``crash_isolation`` a worker that exits on purpose is recorded and replaced (workers.py self-test).
``worked_example``  FACTS section 1's example (Qwen3-30B-A3B, H=32, Hk=4, d=128, bf16, tp=4, attn_cp=4; one
                    32768-token and seven 100-token sequences; num_splits=0) through the backend, in a worker:
                    with the pre-fix guard the precompute uses h_k=1 and the call overflows its split buffers:
                    expected NaN or an illegal memory access (a recorded crash), or a wrong result; with the
                    fixed guard expected to agree with the float64 oracle under FA3's tolerance.
``fidelity``        refmodel vs the adapter's ``get_scheduler_metadata`` on written slots (ties as multisets)
                    and the call's split count, over ``--fidelity-configs`` random configurations, in workers.
``fuzz``            differential fuzz: random sglang configurations and skewed decode batches through the backend
                    with the fixed guard, the kernel launched for real (gpu-like mode), every output against the
                    oracle; one case per worker task, so a crash costs one case; ``--fuzz-budget-s`` seconds.
``gpu_tests``       ``pytest -m gpu tests/gpu`` in a subprocess; counts from its JUnit XML.
``sanitizer``       the pre-fix worked example under ``compute-sanitizer --tool memcheck`` (only when it is on
                    PATH), expecting memcheck errors.
``fa3_sanitize``    the worked example with ``fa3verify.sanitize`` over the FA3 module: the pre-fix metadata is
                    refused before launch (SPLIT_BOUND), the fresh one runs; sanitizer time per call against the
                    kernel's (``fa3verify.sanitize.gpu_stage``).

Every crash, failing fuzz case and mismatch is written as a JSON case file under ``OUT/cases`` (with the error
text). ``--dry-run`` runs the same stages on CPU with the emulated kernel: fewer configurations, a short fuzz,
the emulator's gpu-like mode for the pre-fix case so the NaN appears, and the worked example scaled to fit a
CPU (a 16-SM GPU and a 4096-token long sequence: S_p = 14, S_c = 4, metadata split count 11 > 4).

Exit codes: 0 every stage met its expectation, 1 one did not, 3 a stage could not run (no GPU or no FA3
module without --dry-run, a timeout), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

HELP = "run the real-FA3 checks on a GPU (fidelity, fuzz, worked example); --dry-run on CPU"
EPILOG = """\
examples:
  fa3verify gpu-check --dry-run                  # the same plumbing on CPU, emulated kernel (~1 min)
  fa3verify gpu-check                            # on an sm90 GPU with an FA3 module (~4-7 min)
  fa3verify gpu-check --fidelity-configs 2000 --fuzz-budget-s 120 --out gpu-out
  bash scripts/gpu_check.sh                      # installs a carried fa3-fwd wheel first, copies the summary to $OUT

writes OUT/gpu_check_summary.json (schema fa3verify.gpu_check/1), OUT/gpu_tests.xml, OUT/cases/*.json
exit codes: 0 every stage met its expectation, 1 one did not, 3 a stage could not run, 2 bad arguments
"""

SCHEMA = "fa3verify.gpu_check/1"
SUMMARY_NAME = "gpu_check_summary.json"

#: The worked example of FACTS section 1.
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

    @property
    def adapter(self) -> dict:
        return {"name": "emulated", "device": "cpu"} if self.dry_run else {"name": "fa3", "device": "cuda"}


def make_plan(args) -> Plan:
    from ..errors import UsageError

    dry = bool(args.dry_run)
    cpus = os.cpu_count() or 2
    n_fid = args.fidelity_configs if args.fidelity_configs is not None else (30 if dry else 1000)
    fuzz_s = args.fuzz_budget_s if args.fuzz_budget_s is not None else (6.0 if dry else 60.0)
    total = args.total_budget_s if args.total_budget_s is not None else (150.0 if dry else 420.0)
    if n_fid < 1:
        raise UsageError(f"--fidelity-configs: must be >= 1, got {n_fid}")
    if fuzz_s <= 0:
        raise UsageError(f"--fuzz-budget-s: must be > 0 seconds, got {fuzz_s}")
    if total < 30:
        raise UsageError(f"--total-budget-s: must be >= 30 seconds, got {total}")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers: must be >= 1, got {args.workers}")
    workers = args.workers or (1 if dry else max(1, min(4, cpus // 4)))
    return Plan(
        dry_run=dry, total_budget_s=float(total), fidelity_configs=int(n_fid),
        fidelity_chunk=max(1, min(250, -(-n_fid // max(1, workers)))) if not dry else max(1, -(-n_fid // 2)),
        fidelity_budget_s=40.0 if dry else 110.0, fuzz_budget_s=float(fuzz_s),
        fuzz_max_len=384 if dry else 16384, fuzz_contexts=(1024, 2048) if dry else (4096, 16384, 32768),
        fuzz_case_timeout_s=60.0 if dry else 90.0,
        worked_long=DRY_WORKED_LONG if dry else WORKED_LONG, worked_num_sm=DRY_WORKED_NUM_SM if dry else None,
        worked_timeout_s=60.0 if dry else 120.0, gpu_tests_timeout_s=90.0 if dry else 150.0,
        sanitizer_timeout_s=180.0, workers=workers,
        max_q_elems=(1 << 18) if dry else (1 << 26), max_kv_elems=(1 << 24) if dry else (1 << 29),
        seed=int(args.seed))


# ----------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------


def register(sub) -> None:
    p = sub.add_parser("gpu-check", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p) -> None:
    p.add_argument("--dry-run", action="store_true",
                   help="run every stage on CPU with the emulated kernel (CI); no GPU needed")
    p.add_argument("--out", default="fa3verify-out/gpu-check", metavar="DIR",
                   help="where the summary, JUnit XML and case files go (default fa3verify-out/gpu-check)")
    p.add_argument("--fidelity-configs", type=int, metavar="N",
                   help="random configurations for the metadata fidelity check (default 1000; dry run 30)")
    p.add_argument("--fuzz-budget-s", type=float, metavar="S",
                   help="seconds of differential fuzzing (default 60; dry run 6)")
    p.add_argument("--total-budget-s", type=float, metavar="S",
                   help="the whole run ends within S seconds; stages shrink to fit (default 420; dry run 150)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="worker processes (default: 1 in a dry run, else min(4, CPUs/4))")
    p.add_argument("--seed", type=int, default=0, help="seed of the fidelity configurations and fuzz cases")
    p.add_argument("--skip", action="append", default=[], metavar="STAGE", choices=STAGE_NAMES,
                   help=f"leave a stage out (repeatable): {', '.join(STAGE_NAMES)}")


def run(args) -> int:
    plan = make_plan(args)
    check = GpuCheck(plan, out_dir=args.out, skip=set(args.skip))
    return check.run()


# ----------------------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------------------

STAGE_NAMES = ("crash_isolation", "worked_example", "fidelity", "fuzz", "gpu_tests", "sanitizer", "fa3_sanitize")
STATUS_CODE = {"pass": 0, "skipped": 0, "fail": 1, "inconclusive": 3}


@dataclass
class Stage:
    """One stage's result: status (pass/fail/inconclusive/skipped), what was expected, seconds, numbers."""

    name: str
    status: str = "pending"
    expectation: str = ""
    seconds: float = 0.0
    numbers: dict = field(default_factory=dict)
    message: str = ""

    def to_dict(self) -> dict:
        return {"status": self.status, "expectation": self.expectation, "seconds": round(self.seconds, 2),
                "message": self.message, **self.numbers}


class GpuCheck:
    """State of one gpu-check run: the plan, the deadline, the stages done, the worker pool, the case files."""

    def __init__(self, plan: Plan, out_dir: str, skip: set = frozenset()):
        self.plan = plan
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
        if not any(s.status != "skipped" for s in self.stages.values()):
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
            "verdict": {0: "pass", 1: "fail", 3: "inconclusive"}.get(code, "fail"), "exit_code": code,
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

    def save_case(self, stage: str, name: str, payload: dict) -> str:
        os.makedirs(self.cases_dir, exist_ok=True)
        path = os.path.join(self.cases_dir, f"{stage}-{name}.json")
        with open(path, "w") as fh:
            json.dump({"schema": "fa3verify.gpu_check_case/1", "stage": stage, **payload}, fh, indent=2, default=str)
            fh.write("\n")
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
        self.say(f"{mode}; out {self.out_dir}; total budget {self.plan.total_budget_s:.0f}s")
        self.environment = probe_environment()
        self.print_environment()
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

        steps: list[tuple[str, Callable[[Stage], None]]] = [
            ("crash_isolation", self.stage_crash_isolation), ("worked_example", self.stage_worked_example),
            ("fidelity", self.stage_fidelity), ("fuzz", self.stage_fuzz), ("gpu_tests", self.stage_gpu_tests),
            ("sanitizer", self.stage_sanitizer), ("fa3_sanitize", self.stage_fa3_sanitize)]
        # one torch thread per worker on a small (CI) machine: oversubscribed thread pools crawl
        threads = 1 if self.plan.dry_run else max(1, (os.cpu_count() or 2) // (self.plan.workers + 1))
        try:
            self.pool = WorkerPool(self.plan.workers, init=worker_init, init_args=(threads,),
                                   timeout_s=self.plan.fuzz_case_timeout_s)
            for name, fn in steps:
                stage = Stage(name)
                self.stages[name] = stage
                if name in self.skip:
                    stage.status, stage.message = "skipped", "left out with --skip"
                    continue
                t0 = time.perf_counter()
                self.say(f"stage {name} ...")
                try:
                    fn(stage)
                except WorkerInitError as exc:
                    stage.status, stage.message = "inconclusive", f"workers could not start: {exc}"[:2000]
                except Exception as exc:  # noqa: BLE001 - one broken stage must not lose the others
                    import traceback

                    stage.status = "inconclusive"
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

    def print_environment(self) -> None:
        e = self.environment
        self.say(f"python {e.get('python')} | torch {e.get('torch')} (CUDA build {e.get('torch_cuda')}) | "
                 f"{e.get('cpu_count')} CPUs")
        gpu = e.get("gpu")
        self.say("GPU: " + (f"{gpu['name']} sm{gpu['capability']} {gpu['sms']} SMs {gpu['memory_gib']} GiB"
                            if gpu else f"none ({e.get('gpu_reason', 'CUDA not available')})"))
        if e.get("nvidia_smi"):
            self.say(f"nvidia-smi: {e['nvidia_smi']}")
        fa3 = e.get("fa3") or {}
        self.say("FA3 module: " + (f"{fa3['module']} from {fa3['file']} (paged KV: {fa3.get('paged_kv')})"
                                   if fa3.get("module") else f"not importable ({fa3.get('reason', '?')[:300]})"))
        self.say(f"compute-sanitizer: {e.get('compute_sanitizer') or 'not on PATH'}")

    def print_table(self, path: str) -> None:
        print("\nfa3verify gpu-check summary" + (" (dry run)" if self.plan.dry_run else ""))
        for name, s in self.stages.items():
            nums = ", ".join(f"{k}={v}" for k, v in s.numbers.items()
                             if isinstance(v, (int, float, str, bool)) and k != "traceback" and len(str(v)) < 60)
            print(f"  {name:<16} {s.status.upper():<12} {s.seconds:7.1f}s  {nums}")
        code = self.exit_code()
        print(f"verdict: {self.summary()['verdict'].upper()} (exit {code}) | findings {len(self.findings)} | "
              f"{time.perf_counter() - self.started:.1f}s | summary {path}", flush=True)

    # -- stages ---------------------------------------------------------------------------------------------
    def stage_crash_isolation(self, stage: Stage) -> None:
        import functools

        from ..workers import probe_task

        stage.expectation = "a worker that calls os._exit(3) is recorded as a crash and replaced; the next task runs"
        crash = self.pool.run(functools.partial(probe_task, "exit"), timeout_s=60)
        after = self.pool.run(functools.partial(probe_task, "ok", "alive"), timeout_s=self.budget(180))
        stage.numbers.update(crash_kind=crash.kind, crash_exitcode=crash.exitcode, next_task_ok=after.ok,
                             replacements=self.pool.replacements)
        good = crash.crashed and crash.kind == "died" and after.ok and after.value == "alive"
        stage.status = "pass" if good else ("inconclusive" if not after.ok and after.crashed else "fail")
        if not after.ok:
            stage.message = f"replacement worker: {after.summary()}"

    def stage_worked_example(self, stage: Stage) -> None:
        import functools

        p = self.plan
        stage.expectation = ("pre-fix guard: NaN, an illegal memory access (crash) or a wrong result; "
                             "fixed guard: agrees with the float64 oracle")
        stage.numbers["shapes"] = {"model": WORKED_MODEL, "tp_size": 4, "attn_cp_size": 4,
                                   "seq_lens": [p.worked_long] + [WORKED_SHORT] * WORKED_SHORT_COUNT,
                                   "num_splits": 0, "num_sm": p.worked_num_sm or self.num_sm or "the GPU's",
                                   "scaled_for_cpu": p.dry_run}
        outcomes = {}
        for guard in ("pre-fix", "fixed"):
            limit = self.budget(p.worked_timeout_s, reserve=30)
            if limit < 5:
                outcomes[guard] = {"outcome": "not run", "reason": "no time left"}
                continue
            task = functools.partial(worked_example_task, p.adapter, guard, p.worked_long, p.worked_num_sm, p.seed)
            res = self.pool.run(task, timeout_s=limit)
            if res.ok:
                value = dict(res.value)
            else:
                value = {"outcome": "crash" if res.crashed else "error", "kind": res.kind, "exitcode": res.exitcode,
                         "error": res.error_text[-3000:], "seconds": round(res.elapsed, 2)}
            outcomes[guard] = value
            expected = _worked_expected(guard, value)
            if guard == "pre-fix" and value["outcome"] in ("nan", "crash", "mismatch"):
                path = self.save_case("worked_example", "pre-fix", {"guard": guard, "shapes": stage.numbers["shapes"],
                                                                     "result": value})
                self.finding("worked_example", f"pre-fix:{value['outcome']}",
                             f"pre-fix guard, worked example: {value['outcome']}"
                             + (f" ({res.summary()})" if not res.ok else ""), case_file=path)
            elif not expected:
                path = self.save_case("worked_example", guard, {"guard": guard, "shapes": stage.numbers["shapes"],
                                                                "result": value})
                self.finding("worked_example", f"{guard}:unexpected:{value['outcome']}",
                             f"{guard} guard, worked example: unexpected outcome {value['outcome']}", case_file=path)
        stage.numbers["pre_fix"] = outcomes.get("pre-fix")
        stage.numbers["fixed"] = outcomes.get("fixed")
        stage.numbers["pre_fix_outcome"] = (outcomes.get("pre-fix") or {}).get("outcome")
        stage.numbers["fixed_outcome"] = (outcomes.get("fixed") or {}).get("outcome")
        verdicts = [_worked_expected(g, outcomes[g]) if outcomes.get(g, {}).get("outcome") != "not run" else None
                    for g in ("pre-fix", "fixed")]
        if any(v is False for v in verdicts):
            stage.status = "fail"
        elif any(v is None for v in verdicts) or any(o.get("outcome") == "error" for o in outcomes.values()):
            stage.status = "inconclusive"
        else:
            stage.status = "pass"
        stage.message = (f"pre-fix -> {stage.numbers['pre_fix_outcome']}, fixed -> {stage.numbers['fixed_outcome']}")

    def stage_fidelity(self, stage: Stage) -> None:
        import functools

        from ..fidelity import FidelityReport

        p = self.plan
        stage.expectation = ("0 mismatches on written metadata slots (ties as multisets) and 0 split-count "
                             f"mismatches over {p.fidelity_configs} configurations")
        budget = self.budget(p.fidelity_budget_s, reserve=p.fuzz_budget_s * 0.5 + 60)
        deadline = time.perf_counter() + budget
        report = FidelityReport(seed=p.seed)
        chunks = [(start, min(p.fidelity_chunk, p.fidelity_configs - start))
                  for start in range(0, p.fidelity_configs, p.fidelity_chunk)]
        crashes = []

        def tasks():
            for start, count in chunks:
                left = deadline - time.perf_counter()
                if left <= 2:
                    return
                yield functools.partial(fidelity_chunk_task, p.adapter, p.seed, start, count, left - 1,
                                        p.max_q_elems, p.max_kv_elems)

        describe = ""
        for index, res in self.pool.run_many(tasks(), timeout_s=max(10.0, budget + 30)):
            start, count = chunks[index]
            if res.ok:
                describe = res.value.pop("describe", describe)
                report.merge(FidelityReport.from_dict(res.value))
            else:
                crashes.append({"chunk": [start, start + count], "kind": res.kind, "error": res.error_text[-3000:]})
                path = self.save_case("fidelity", f"chunk{start}", {"chunk": [start, start + count], "seed": p.seed,
                                                                    "result": res.to_dict()})
                self.finding("fidelity", f"worker:{res.kind}", f"fidelity chunk {start}..{start + count - 1}: "
                             f"{res.summary()}", case_file=path)
        self.adapter_describe = self.adapter_describe or describe
        for i, f in enumerate(report.findings):
            path = self.save_case("fidelity", f"{f['kind']}-{f['config']['index']}", {"seed": p.seed, **f})
            if i < 20:
                self.finding("fidelity", f["kind"], _fidelity_message(f), case_file=path)
        d = report.to_dict()
        stage.numbers.update(configs=d["configs"], configs_requested=p.fidelity_configs,
                             metadata_mismatches=d["metadata_mismatches"], split_checked=d["split_checked"],
                             split_mismatches=d["split_mismatches"], errors=d["errors"],
                             worker_crashes=len(crashes), configs_per_s=d["configs_per_s"], coverage=d["kinds"])
        if report.metadata_mismatches or report.split_mismatches or report.errors:
            stage.status = "fail"
        elif crashes or report.configs < p.fidelity_configs:
            stage.status = "inconclusive"
            stage.message = (f"{len(crashes)} chunk(s) crashed; " if crashes else "") + \
                f"{report.configs}/{p.fidelity_configs} configurations checked"
        else:
            stage.status = "pass"
        if not stage.message:
            stage.message = (f"{report.configs} configs: {report.metadata_mismatches} metadata and "
                             f"{report.split_mismatches} split-count mismatches, {report.errors} errors")

    def stage_fuzz(self, stage: Stage) -> None:
        import functools

        p = self.plan
        stage.expectation = "fixed guard, real launches: no NaN, no predicted out-of-bounds access, no crash, " \
                            "every output within FA3's tolerance of the oracle"
        budget = self.budget(p.fuzz_budget_s, reserve=(p.gpu_tests_timeout_s if "gpu_tests" not in self.skip else 0)
                             + 20)
        stage.numbers["budget_s"] = round(budget, 1)
        if budget < 1:
            stage.status, stage.message = "inconclusive", "no time left for the fuzz"
            return
        num_sm = self.num_sm or 132
        t0 = time.perf_counter()
        end = t0 + budget
        cases: list[dict] = []

        def tasks():
            index = 0
            while time.perf_counter() < end:
                case = random_fuzz_case(p.seed, index, num_sm, p.fuzz_max_len, p.fuzz_contexts)
                cases.append(case)
                index += 1
                yield functools.partial(fuzz_case_task, p.adapter, case)

        counts = {"pass": 0}
        failures, crashes, calls, saved = 0, 0, 0, 0
        for index, res in self.pool.run_many(tasks(), timeout_s=p.fuzz_case_timeout_s):
            case = cases[index]
            if res.ok:
                outcome = res.value["outcome"]
                calls += len(res.value.get("calls", []))
            else:
                outcome = "crash" if res.crashed else "error"
                crashes += int(res.crashed)
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome in ("pass", "shape_error"):
                continue
            failures += 1
            if saved < 25:
                saved += 1
                payload = {"case": case, "guard": "fixed", "outcome": outcome,
                           "result": res.value if res.ok else res.to_dict()}
                path = self.save_case("fuzz", f"{outcome}-{case['index']}", payload)
                msg = (_fuzz_message(res.value) if res.ok else res.summary())
                self.finding("fuzz", outcome, f"case {case['index']} ({case['model']}, "
                             f"{_server_label(case['server'])}): {msg}", case_file=path)
        elapsed = time.perf_counter() - t0
        done = sum(counts.values())
        stage.numbers.update(cases=done, failures=failures, crashes=crashes, decode_calls=calls,
                             outcomes=counts, cases_per_s=round(done / elapsed, 2) if elapsed > 0 else 0.0,
                             fuzz_seconds=round(elapsed, 1))
        if failures:
            stage.status = "fail"
        elif done == 0:
            stage.status, stage.message = "inconclusive", "no fuzz case finished"
        else:
            stage.status = "pass"
        if not stage.message:
            stage.message = f"{done} cases ({calls} decode calls), {failures} failing, {crashes} crashes"

    def stage_gpu_tests(self, stage: Stage) -> None:
        p = self.plan
        stage.expectation = ("on CPU every gpu test skips (none fails)" if p.dry_run
                             else "at least one gpu test passes and none fails or errors")
        repo = _repo_root()
        tests_dir = os.path.join(repo, "tests", "gpu")
        if not os.path.isdir(tests_dir):
            stage.status, stage.message = "inconclusive", f"no tests/gpu folder under {repo}"
            return
        limit = self.budget(p.gpu_tests_timeout_s, reserve=10)
        junit = os.path.join(self.out_dir, "gpu_tests.xml")
        if os.path.exists(junit):
            os.remove(junit)
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-rs", f"--junitxml={junit}"]
        stage.numbers["command"] = " ".join(cmd[1:])
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        try:
            proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=max(5.0, limit))
        except subprocess.TimeoutExpired as exc:
            stage.status, stage.message = "inconclusive", f"pytest did not finish within {limit:.0f}s"
            stage.numbers["output_tail"] = _tail((exc.stdout or b"").decode(errors="replace")
                                                 if isinstance(exc.stdout, bytes) else (exc.stdout or ""))
            return
        counts = junit_counts(junit)
        stage.numbers.update(returncode=proc.returncode, **counts)
        stage.numbers["output_tail"] = _tail(proc.stdout + proc.stderr, 1500)
        if counts.get("tests") is None:
            stage.status = "inconclusive"
            stage.message = f"pytest exited {proc.returncode} without a JUnit report"
            return
        bad = counts["failures"] + counts["errors"]
        if bad:
            stage.status = "fail"
            for case in junit_failures(junit)[:10]:
                self.finding("gpu_tests", "test_failed", case)
        elif p.dry_run:
            stage.status = "pass"
        else:
            stage.status = "pass" if counts["passed"] >= 1 else "inconclusive"
        stage.message = (f"{counts['passed']} passed, {counts['failures']} failed, {counts['errors']} errors, "
                         f"{counts['skipped']} skipped")

    def stage_fa3_sanitize(self, stage: Stage) -> None:
        """The worked example with fa3verify.sanitize over the real FA3 module (fa3verify.sanitize.gpu_stage)."""
        import functools

        from ..sanitize.gpu_stage import sanitize_worked_example_task

        p = self.plan
        stage.expectation = ("the pre-fix precompute (8, 1) is refused before launch with SPLIT_BOUND; the fresh "
                             "precompute (32, 4) runs finite; overhead per call measured against the kernel")
        limit = self.budget(p.worked_timeout_s, reserve=5)
        if limit < 10:
            stage.status, stage.message = "inconclusive", f"only {limit:.0f}s left"
            return
        task = functools.partial(sanitize_worked_example_task, p.adapter, p.worked_long, p.worked_num_sm,
                                 os.path.join(self.out_dir, "sanitize"), 1 if p.dry_run else 20, p.seed)
        res = self.pool.run(task, timeout_s=limit)
        if not res.ok:
            stage.status, stage.message = "inconclusive" if not res.crashed else "fail", res.summary()[:500]
            stage.numbers["error"] = res.error_text[-3000:]
            return
        v = dict(res.value)
        stage.numbers.update(v)
        caught = v.get("stale", {}).get("caught") and v["stale"].get("invariant") == "SPLIT_BOUND"
        clean = v.get("fresh", {}).get("finite") and v["fresh"].get("violations") == 0 and v.get("restored")
        stage.status = "pass" if caught and clean else "fail"
        stage.message = (f"stale caught: {v.get('stale', {}).get('invariant')}; fresh clean: {bool(clean)}; "
                         f"overhead {v.get('overhead_us', float('nan')):.1f} us per call against "
                         f"{v.get('kernel_call_us', float('nan')):.1f} us")
        if not caught:
            self.finding("fa3_sanitize", "not-caught", "the sanitizer let the pre-fix metadata reach the kernel",
                         case_file=self.save_case("fa3_sanitize", "not-caught", v))

    def stage_sanitizer(self, stage: Stage) -> None:
        p = self.plan
        stage.expectation = "memcheck reports errors for the pre-fix worked example (out-of-bounds split buffers)"
        tool = shutil.which("compute-sanitizer")
        stage.numbers["compute_sanitizer"] = tool
        if p.dry_run:
            stage.status, stage.message = "skipped", "dry run: no GPU to check"
            return
        if not tool:
            stage.status, stage.message = "skipped", "compute-sanitizer is not on PATH"
            return
        limit = self.budget(p.sanitizer_timeout_s, reserve=5)
        if limit < 30:
            stage.status, stage.message = "inconclusive", f"only {limit:.0f}s left; memcheck needs more"
            return
        cmd = [tool, "--tool", "memcheck", "--print-limit", "20", "--error-exitcode", "99",
               sys.executable, "-m", "fa3verify.commands.gpu_check", "--child-worked-example", "pre-fix",
               "--long", str(p.worked_long), "--seed", str(p.seed)]
        stage.numbers["command"] = " ".join(cmd)
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTORCH_NO_CUDA_MEMORY_CACHING="1")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=_repo_root(), env=env, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            stage.status, stage.message = "inconclusive", f"memcheck did not finish within {limit:.0f}s"
            stage.numbers["output_tail"] = _tail(out)
            return
        text = proc.stdout + "\n" + proc.stderr
        parsed = parse_memcheck(text)
        stage.numbers.update(returncode=proc.returncode, run_seconds=round(time.perf_counter() - t0, 1), **parsed)
        stage.numbers["output_tail"] = _tail(text, 3000)
        if parsed["errors"] is None:
            stage.status = "inconclusive"
            stage.message = f"no memcheck ERROR SUMMARY in the output (exit {proc.returncode})"
        elif parsed["errors"] > 0:
            stage.status = "pass"
            path = self.save_case("sanitizer", "pre-fix", {"command": stage.numbers["command"], **parsed,
                                                           "output": _tail(text, 20000)})
            self.finding("sanitizer", "memcheck", f"memcheck: {parsed['errors']} error(s) in the pre-fix worked "
                         f"example; first: {parsed['first_errors'][:1]}", case_file=path)
            stage.message = f"{parsed['errors']} memcheck error(s)"
        else:
            stage.status = "fail"
            stage.message = "memcheck finished without errors on the pre-fix case"


def _worked_expected(guard: str, value: dict) -> Optional[bool]:
    outcome = value.get("outcome")
    if outcome in ("not run",):
        return None
    if guard == "pre-fix":
        if outcome == "error":
            return None
        return outcome in ("nan", "crash", "mismatch")
    if outcome in ("error", "crash"):
        return False if outcome == "crash" else None
    return outcome == "agrees"


def _fidelity_message(f: dict) -> str:
    cfg = f["config"]
    where = (f"config {cfg['index']} (b={cfg['batch_size']}, sq={cfg['max_seqlen_q']}, sk={cfg['max_seqlen_k']}, "
             f"h={cfg['num_heads']}/{cfg['num_heads_k']}, d={cfg['headdim']}, causal={cfg['causal']}, "
             f"num_splits={cfg['num_splits']}, page={cfg['page_size']})")
    if f["kind"] == "split_count":
        return f"{where}: call split count FA3 {f['fa3']} vs refmodel {f['refmodel']}"
    if f["kind"] == "metadata":
        m = f["mismatches"][0]
        return f"{where}: metadata {m['field']}: FA3 {m.get('fa3')} vs refmodel {m.get('refmodel')}"
    return f"{where}: {f.get('error', f['kind'])}"


def _fuzz_message(value: dict) -> str:
    for c in value.get("calls", []):
        if c.get("outcome") != "pass":
            return f"dp rank {c.get('dp_rank')} ({c.get('path')}): {c.get('outcome')}: {c.get('message', '')}"
    return value.get("outcome", "?")


def _server_label(s: dict) -> str:
    return (f"tp={s['tp_size']} dp={s['dp_size']}{' dp-attn' if s['enable_dp_attention'] else ''} "
            f"cp={s['attn_cp_size']} page={s['page_size']} splits={s['num_splits']}"
            f"{' graph' if s['cuda_graph'] else ''}")


def _tail(text: str, n: int = 2000) -> str:
    return (text or "")[-n:]


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ----------------------------------------------------------------------------------------------------------
# Environment
# ----------------------------------------------------------------------------------------------------------


def probe_environment() -> dict:
    """Python/torch/CUDA versions, the GPU, the FA3 module and compute-sanitizer (never raises)."""
    env: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable,
                           "platform": platform.platform(), "cpu_count": os.cpu_count(),
                           "pythonpath": os.environ.get("PYTHONPATH", "")}
    try:
        import torch

        env.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            env["gpu"] = {"name": props.name, "capability": f"{props.major}{props.minor}",
                          "sms": props.multi_processor_count,
                          "memory_gib": round(props.total_memory / 2**30, 1), "count": torch.cuda.device_count()}
        else:
            env["gpu_reason"] = f"torch.cuda.is_available() is False (CUDA build {torch.version.cuda})"
    except Exception as exc:  # noqa: BLE001
        env["torch"] = None
        env["gpu_reason"] = f"torch not importable: {exc}"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            env["nvidia_smi"] = out.stdout.strip().replace("\n", "; ") or out.stderr.strip()[:200]
        except Exception as exc:  # noqa: BLE001
            env["nvidia_smi"] = f"failed: {exc}"
    try:
        from gpu_impl.kernels.fa3 import find_fa3_module, module_supports_paged_kv

        name, module = find_fa3_module()
        env["fa3"] = {"module": name, "file": getattr(module, "__file__", None),
                      "paged_kv": module_supports_paged_kv(name)}
        try:
            from importlib.metadata import version

            env["fa3"]["fa3_fwd_version"] = version("fa3-fwd")
        except Exception:  # noqa: BLE001
            pass
    except Exception as exc:  # noqa: BLE001 - KernelUnavailable, or an import error of gpu_impl itself
        env["fa3"] = {"module": None, "reason": str(exc)[:2000]}
    env["compute_sanitizer"] = shutil.which("compute-sanitizer")
    return env


def gpu_problem(env: dict) -> Optional[str]:
    """Why the real run cannot go ahead here (None when it can): no CUDA, not sm90, no FA3 module."""
    if not env.get("cuda_available"):
        return (f"no CUDA GPU visible ({env.get('gpu_reason', 'CUDA not available')}; torch {env.get('torch')}): "
                f"the real FA3 kernel needs an sm90 GPU")
    gpu = env.get("gpu") or {}
    if not str(gpu.get("capability", "")).startswith("9"):
        return f"GPU {gpu.get('name')} is sm{gpu.get('capability')}; FA3 (hopper) needs sm90"
    fa3 = env.get("fa3") or {}
    if not fa3.get("module"):
        return f"no FA3 module importable: {fa3.get('reason', '?')[:600]}"
    return None


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


# ----------------------------------------------------------------------------------------------------------
# Worker tasks (module level: they are pickled into the worker processes)
# ----------------------------------------------------------------------------------------------------------


def worker_init(threads: int) -> None:
    """Each worker: torch with ``threads`` CPU threads (the oracle runs on CPU)."""
    import torch

    torch.set_num_threads(max(1, int(threads)))


def _kernel(adapter: dict, mode: str, **options):
    from ..fidelity import load_adapter

    return load_adapter(adapter["name"], mode, adapter.get("device"), **{**adapter.get("options", {}), **options})


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def fidelity_chunk_task(adapter: dict, seed: int, start: int, count: int, budget_s: float, max_q_elems: int,
                        max_kv_elems: int) -> dict:
    """Worker task: fidelity configurations ``start .. start+count-1`` (see :mod:`fa3verify.fidelity`)."""
    from ..fidelity import fidelity_task

    return fidelity_task(adapter["name"], adapter.get("device"), seed, start, count, budget_s=budget_s,
                         options=adapter.get("options") or None, max_q_elems=max_q_elems, max_kv_elems=max_kv_elems)


def worked_example_task(adapter: dict, guard: str, long_len: int = WORKED_LONG, num_sm: Optional[int] = None,
                        seed: int = 0) -> dict:
    """The FACTS worked example through the backend with ``guard``; the kernel in gpu-like mode (it launches).

    Returns ``{"outcome": "nan" | "agrees" | "mismatch", ...}`` with the split counts the kernel read, S_c,
    refmodel's S_p, the predicted violations and (when no NaN) the error against the oracle. An illegal memory
    access raises here and the worker pool records the crash.
    """
    import torch

    from gpu_impl.backend import FlashAttentionBackend
    from gpu_impl.config import ServerConfig, get_model
    from gpu_impl.guards import load_guard
    from gpu_impl.scenario import decode_tensors
    from refmodel.metadata import schedule_and_prepare
    from refmodel.tolerance import fa3_output_close, reference_outputs

    from ..fidelity import adapter_supports_paged

    t0 = time.perf_counter()
    options = {"num_sm": num_sm} if num_sm else {}
    kernel = _kernel(adapter, "gpu-like", **options)
    device = adapter.get("device") or "cpu"
    server = ServerConfig(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag", page_size=1,
                          num_sm=int(kernel.num_sm))
    model = get_model(WORKED_MODEL)
    backend = FlashAttentionBackend(server, model, load_guard(guard))
    lens = [int(long_len)] + [WORKED_SHORT] * WORKED_SHORT_COUNT
    call = backend.decode_calls([lens])[0]
    out_info: dict[str, Any] = {"guard": guard, "precomputed": call.precomputed, "skip_reason": call.skip_reason,
                                "precompute_heads": call.precompute_heads, "call_heads": call.call_heads,
                                "describe": kernel.describe()}
    if call.precomputed:
        h, hk = call.precompute_heads
        sched, result = schedule_and_prepare(
            len(lens), 1, max(lens), h, hk, model.head_dim, torch.tensor(lens, dtype=torch.int32),
            cu_seqlens_q=list(range(len(lens) + 1)), page_size=1 if adapter_supports_paged(kernel) else None,
            causal=True, num_sm=int(kernel.num_sm), arch=int(kernel.arch))
        out_info["refmodel_s_p"] = sched.num_splits
        out_info["refmodel_metadata_splits"] = list(result.num_splits)
    q, k_cache, v_cache, table = decode_tensors(backend, call, seed=seed, device=device)
    out, lse = backend.forward_decode(kernel, call, q, k_cache, v_cache, table)
    _sync(device)
    trace = kernel.last_trace or {}
    out_info["s_c"] = (trace.get("schedule") or {}).get("num_splits")
    out_info["observed_num_splits"] = trace.get("observed_num_splits")
    out_info["metadata_splits_read"] = ((trace.get("metadata") or {}).get("num_splits"))
    out_info["predicted_violations"] = sorted({v["invariant"] for v in trace.get("verdicts", [])})
    nan_rows = torch.isnan(out.float()).reshape(out.shape[0], -1).any(dim=1).nonzero().flatten().tolist()
    out_info["nan_batches"] = [int(i) for i in nan_rows]
    out_info["kernel_seconds"] = round(time.perf_counter() - t0, 2)
    if nan_rows:
        out_info["outcome"] = "nan"
        out_info["oracle"] = "skipped: the output has NaN; the oracle is finite (every row has keys)"
    else:
        cs = torch.tensor(lens, dtype=torch.int32)
        cu = torch.arange(len(lens) + 1, dtype=torch.int32)
        exact, lowp = reference_outputs(q.cpu(), k_cache.cpu(), v_cache.cpu(), cache_seqlens=cs, cu_seqlens_q=cu,
                                        max_seqlen_q=1, page_table=table.cpu(), causal=True)
        ok, err, bound = fa3_output_close(out.cpu(), exact, lowp)
        out_info.update(outcome="agrees" if ok else "mismatch", max_error=err, bound=bound)
    out_info["seconds"] = round(time.perf_counter() - t0, 2)
    return out_info


def random_fuzz_case(seed: int, index: int, num_sm: int, max_len: int, contexts: tuple) -> dict:
    """Case ``index`` of stream ``seed``: a valid sglang configuration of a real model and a decode batch.

    Half the batches are skewed (one long sequence, short companions: the shape that overflows split buffers).
    """
    from gpu_impl.config import MODELS, ServerConfig, is_valid_config

    rng = random.Random(f"fa3verify.gpu_fuzz:{seed}:{index}")
    names = sorted(MODELS)
    model, server = None, None
    for _ in range(500):
        model = MODELS[rng.choice(names)]
        attn_tp = rng.choice((1, 2, 4, 8))
        attn_cp = rng.choice((1, 1, 2, 4))
        dp_attention = rng.random() < 0.35
        dp = rng.choice((2, 4)) if dp_attention else rng.choice((1, 1, 2))
        tp = attn_tp * attn_cp * (dp if dp_attention else 1)
        prefill_cp = attn_cp > 1 or rng.random() < 0.2
        server = ServerConfig(
            tp_size=tp, dp_size=dp, attn_cp_size=attn_cp, enable_dp_attention=dp_attention,
            enable_prefill_cp=prefill_cp, cp_strategy="zigzag" if prefill_cp else None,
            page_size=rng.choice((1, 16, 64)), num_splits=rng.choice((0, 0, 0, 0, 0, 0, 1, 2, 4, 16)),
            enable_deterministic_inference=rng.random() < 0.1, cuda_graph=rng.random() < 0.4, num_sm=int(num_sm),
            context_length=rng.choice(tuple(contexts)))
        if is_valid_config(model, server):
            break
    cap = min(max_len, server.context_length)
    n = rng.randint(1, 12) * server.attn_dp_size
    if rng.random() < 0.5:
        lens = [rng.randint(1, min(cap, 160)) for _ in range(n)]
        lens[rng.randrange(n)] = rng.randint(max(1, cap // 4), cap)
    else:
        top = max(1, int(2 ** rng.uniform(0, max(0.0, (cap).bit_length() - 1))))
        lens = [rng.randint(1, min(cap, top)) for _ in range(n)]
    return {"index": index, "model": model.name, "server": server.to_dict(), "seq_lens": lens,
            "seed": rng.randrange(2**31)}


def fuzz_case_task(adapter: dict, case: dict, guard: str = "fixed") -> dict:
    """Worker task: one fuzz case through the backend with ``guard``, every decode call launched and checked."""
    import hashlib

    from gpu_impl.backend import FlashAttentionBackend
    from gpu_impl.config import ServerConfig, get_model
    from gpu_impl.guards import load_guard
    from gpu_impl.scenario import distribute_over_dp

    kernel = _kernel(adapter, "gpu-like")
    device = adapter.get("device") or "cpu"
    server = ServerConfig.from_dict(case["server"])
    model = get_model(case["model"])
    backend = FlashAttentionBackend(server, model, load_guard(guard))
    records = []
    for call in backend.decode_calls(distribute_over_dp(case["seq_lens"], server.attn_dp_size)):
        digest = hashlib.sha256(json.dumps([case["seed"], call.dp_rank]).encode()).digest()
        records.append(_fuzz_call(backend, kernel, call, int.from_bytes(digest[:4], "little"), device))
    bad = [r["outcome"] for r in records if r["outcome"] != "pass"]
    return {"outcome": bad[0] if bad else "pass", "calls": records}


def _fuzz_call(backend, kernel, call, seed: int, device: str) -> dict:
    import torch

    from gpu_impl.errors import MetadataShapeError, OutOfBoundsAccess
    from gpu_impl.scenario import decode_tensors
    from refmodel.tolerance import fa3_output_close, reference_outputs

    rec: dict[str, Any] = {"dp_rank": call.dp_rank, "path": call.path, "precomputed": call.precomputed,
                           "rows": len(call.seq_lens), "real_rows": call.real_rows, "max_len": max(call.seq_lens),
                           "call_seqlen_k": call.call_seqlen_k, "outcome": "pass"}
    tensors = decode_tensors(backend, call, seed=seed, device=device)
    q, k_cache, v_cache, table = tensors
    exact = lowp = None
    layers = [False] + ([True] if backend.model.has_sliding_window_layers else [])
    for sliding in layers:
        try:
            out, _ = backend.forward_decode(kernel, call, *tensors, sliding_window=sliding)
            _sync(device)
        except MetadataShapeError as exc:
            rec.update(outcome="shape_error", message=str(exc)[:500])
            return rec
        except OutOfBoundsAccess as exc:
            rec.update(outcome="predicted_oob", message=str(exc)[:500])
            return rec
        trace = kernel.last_trace or {}
        rec["s_c"] = (trace.get("schedule") or {}).get("num_splits")
        verdicts = sorted({v["invariant"] for v in trace.get("verdicts", [])})
        rows = out[: call.real_rows].float()
        if torch.isnan(rows).any():
            bad = sorted({int(i) for i in torch.nonzero(torch.isnan(rows))[:, 0].tolist()})
            rec.update(outcome="nan", message=f"NaN in output rows {bad[:8]} (sliding_window={sliding}); "
                                              f"predicted violations {verdicts}", nan_rows=bad[:32])
            return rec
        if verdicts:
            rec.update(outcome="predicted_oob", message=f"the model predicts {verdicts} for this call "
                                                        f"(sliding_window={sliding}), though the output has no NaN")
            return rec
        if exact is None:
            cs = torch.tensor(call.seq_lens, dtype=torch.int32)
            cu = torch.arange(len(call.seq_lens) + 1, dtype=torch.int32)
            exact, lowp = reference_outputs(q.cpu(), k_cache.cpu(), v_cache.cpu(), cache_seqlens=cs, cu_seqlens_q=cu,
                                            max_seqlen_q=1, page_table=table.cpu(), causal=True)
        ok, err, bound = fa3_output_close(out[: call.real_rows].cpu(), exact[: call.real_rows],
                                          lowp[: call.real_rows])
        rec["max_error"], rec["bound"] = err, bound
        if not ok:
            rec.update(outcome="mismatch", message=f"max error {err:.3e} exceeds FA3's bound {bound:.3e} "
                                                   f"(sliding_window={sliding})")
            return rec
    return rec


# ----------------------------------------------------------------------------------------------------------
# A child process for compute-sanitizer: the pre-fix worked example in this process, no workers
# ----------------------------------------------------------------------------------------------------------


def child_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fa3verify.commands.gpu_check",
                                description="run one worked example in this process (used under compute-sanitizer)")
    p.add_argument("--child-worked-example", choices=("pre-fix", "fixed"), required=True)
    p.add_argument("--adapter", default="fa3", choices=("fa3", "emulated"))
    p.add_argument("--device", default=None)
    p.add_argument("--long", type=int, default=WORKED_LONG)
    p.add_argument("--num-sm", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    device = a.device or ("cuda" if a.adapter == "fa3" else "cpu")
    result = worked_example_task({"name": a.adapter, "device": device}, a.child_worked_example, a.long, a.num_sm,
                                 a.seed)
    print("WORKED_EXAMPLE_RESULT " + json.dumps(result, default=str), flush=True)
    return 0


def main(argv=None) -> int:
    """``python -m fa3verify.commands.gpu_check [gpu-check options]``: the subcommand without the CLI around it
    (for a machine where another subcommand's imports fail); ``--child-worked-example`` runs :func:`child_main`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a.startswith("--child-worked-example") for a in argv):
        return child_main(argv)
    from ..errors import UsageError

    p = argparse.ArgumentParser(prog="python -m fa3verify.commands.gpu_check", description=HELP, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except UsageError as exc:
        print(f"fa3verify gpu-check: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
