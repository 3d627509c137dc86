"""gpu-check's ``fuzz`` stage: differential fuzz of the backend with the fixed guard, the kernel launched for real.

Invariant: within ``--fuzz-budget-s`` (no batch of cases is started that the mean cost of the last batches says
would end past it, ``fa3verify.campaign``), no case gives NaN, a predicted out-of-bounds access, a crash or an output
outside FA3's tolerance of the oracle; one case per worker task, so a crash costs one case. The loop is the one
campaign (``fa3verify.campaign``) over the strategy family ``gpu-decode``; the system under test is
:class:`WorkerTarget`, the real kernel behind the crash-isolating worker pool (the per-call check is
:mod:`fa3verify.gpu_check.fuzz_cases`).
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING

from spec.finding import DeviceOutcome, Finding, StageStatus

from ..campaign import Budget, Observation, run_campaign
from .fuzz_cases import fuzz_case_task, task_case

if TYPE_CHECKING:
    from .runner import GpuCheck, Stage

#: Failing cases saved (and reported as findings) at most.
MAX_SAVED = 25


class WorkerTarget:
    """The kernel adapter (real FA3, or the emulator in a dry run) in gpu-check's worker pool, as the campaign
    drives it: ``parallel`` cases at a time, one worker task each; a crash or an error of a task is its finding."""

    def __init__(self, check: "GpuCheck"):
        self.check = check
        self.parallel = max(1, int(check.plan.workers))
        self.index = 0

    def observe(self, case) -> Observation:
        return self.observe_many([case])[0]

    def observe_many(self, cases: list) -> list:
        p, adapter = self.check.plan, self.check.adapter
        dicts = []
        for case in cases:
            dicts.append(task_case(case, self.index))
            self.index += 1
        out: list = [None] * len(dicts)
        tasks = (functools.partial(fuzz_case_task, adapter, d) for d in dicts)
        for i, res in self.check.pool.run_many(tasks, timeout_s=p.fuzz_case_timeout_s):
            outcome = res.value["outcome"] if res.ok else _unanswered(res)
            msg = _fuzz_message(res.value) if res.ok else res.summary()
            found = [] if outcome in NOT_FINDINGS else \
                [Finding(outcome, message=msg, signature_key=f"{outcome}-{dicts[i]['index']}")]
            out[i] = Observation(outcome, [f.invariant for f in found], [msg], found, detail=(dicts[i], res))
        return out


#: Outcomes that are not findings: a pass, a configuration FA3 rejects, and a case past its deadline (killed: the
#: case is inconclusive, never a NO_CRASH violation; the stage is inconclusive unless something else failed).
NOT_FINDINGS = (DeviceOutcome.PASS, DeviceOutcome.SHAPE_ERROR, DeviceOutcome.TIMEOUT)


def _unanswered(res) -> str:
    """The outcome of a case whose worker gave no value: ``timeout`` (killed at its deadline), ``crash`` (died)
    or ``error`` (raised)."""
    if res.kind == "timeout":  # the worker pool's word for a task killed at its deadline
        return DeviceOutcome.TIMEOUT
    return DeviceOutcome.CRASH if res.crashed else DeviceOutcome.ERROR


def run(check: GpuCheck, stage: Stage) -> None:
    from ..strategies import gpu_decode_case

    p = check.plan
    stage.expectation = "fixed guard, real launches: no NaN, no predicted out-of-bounds access, no crash, " \
                        "every output within FA3's tolerance of the oracle"
    budget = check.budget(p.fuzz_budget_s, reserve=(p.gpu_tests_timeout_s if "gpu_tests" not in check.skip else 0)
                         + 20)
    stage.numbers["budget_s"] = round(budget, 1)
    if budget < 1:
        stage.status, stage.message = StageStatus.INCONCLUSIVE, "no time left for the fuzz"
        return
    strategy = functools.partial(gpu_decode_case, num_sm=check.num_sm or 132, max_len=p.fuzz_max_len,
                                 contexts=p.fuzz_contexts)
    counts = {"pass": 0}
    tally = {"calls": 0, "crashes": 0, "timeouts": 0}

    def checks(obs: Observation) -> list:
        _case, res = obs.detail
        counts[obs.outcome] = counts.get(obs.outcome, 0) + 1
        tally["calls"] += len(res.value.get("calls", [])) if res.ok else 0
        tally["crashes"] += int(obs.outcome == DeviceOutcome.CRASH)
        tally["timeouts"] += int(obs.outcome == DeviceOutcome.TIMEOUT)
        return obs.findings

    t0 = time.perf_counter()
    camp = run_campaign(WorkerTarget(check), strategy, checks, Budget(seconds=budget), seed=p.seed)
    if camp.interrupted:  # the stage runner decides what an interrupt means for the whole check
        raise KeyboardInterrupt
    failing = sorted(camp.failures.values(), key=lambda f: f.observation.detail[0]["index"])
    for failure in failing[:MAX_SAVED]:
        case, res = failure.observation.detail
        path = check.write_case("fuzz", failure.signature,
                                failure_case(failure.case, failure.invariant, failure.message, res, check.adapter))
        check.finding("fuzz", failure.invariant, f"case {case['index']} ({case['model']}, "
                      f"{_server_label(case['server'])}): {failure.message}", case_file=path)
    elapsed = time.perf_counter() - t0
    done, failures, calls, crashes = sum(counts.values()), camp.failing_cases, tally["calls"], tally["crashes"]
    stage.numbers.update(cases=done, failures=failures, crashes=crashes, timeouts=tally["timeouts"],
                         decode_calls=calls, outcomes=counts, cases_per_s=round(done / elapsed, 2) if elapsed > 0 else 0.0,
                         fuzz_seconds=round(elapsed, 1))
    if failures:
        stage.status = StageStatus.FAIL
    elif tally["timeouts"]:
        stage.status, stage.message = StageStatus.INCONCLUSIVE, (f"{tally['timeouts']} of {done} cases past their deadline "
                                                       f"({p.fuzz_case_timeout_s:g} s, killed); none failed")
    elif done == 0:
        stage.status, stage.message = StageStatus.INCONCLUSIVE, "no fuzz case finished"
    else:
        stage.status = StageStatus.PASS
    if not stage.message:
        stage.message = f"{done} cases ({calls} decode calls), {failures} failing, {crashes} crashes"


def failure_case(case, outcome: str, message: str, res, adapter: dict):
    """A failing fuzz case as a replayable ``fa3verify.case/1`` scenario case (``fa3verify.case_files``).

    The generated case (one decode step), the stage's policy (the fixed guard, the modelled backend's default head counts), the
    kernel it ran on in ``gpu-like`` mode and the seeded defects; the expected outcome from the worker's:
    ``predicted_oob`` -> a violation of the first predicted invariant, ``nan`` -> nan, ``mismatch`` -> a
    ``MATCHES_ORACLE`` violation, ``crash``/``error`` -> a ``NO_CRASH`` violation. The worker's own result is kept
    in ``expected.detail.gpu_check``. The replay draws its own tensors from the case seed (the worker hashes the
    seed with the DP rank), so a replay reproduces the metadata-level verdict exactly and the numerics in kind.
    """
    from ..case_files import scenario_case
    from ..policy import load_policy

    import json

    result = json.loads(json.dumps(res.value if res.ok else res.to_dict(), default=str))  # plain JSON values
    calls = result.get("calls", []) if res.ok else []
    if outcome == DeviceOutcome.PREDICTED_OOB:  # the worker names the invariants of every call it predicts out of bounds
        predicted = next(c["invariants"] for c in calls if c.get("outcome") == DeviceOutcome.PREDICTED_OOB)
        expected = {"outcome": "violation", "invariant": predicted[0]}
    elif outcome == DeviceOutcome.NAN:
        expected = {"outcome": "nan", "invariant": None}
    elif outcome == DeviceOutcome.MISMATCH:
        expected = {"outcome": "violation", "invariant": "MATCHES_ORACLE"}
    else:
        expected = {"outcome": "violation", "invariant": "NO_CRASH"}
    expected["detail"] = {"message": message, "gpu_check": {"outcome": outcome, "result": result}}
    return scenario_case(case, source="fuzz", policy=load_policy("fixed").to_dict(), expected=expected,
                         kernel={"name": adapter["name"], "mode": "gpu-like"}, defects=adapter.get("defects", ()),
                         notes=f"gpu-check fuzz stage: {outcome}: {message}"[:2000])


def _fuzz_message(value: dict) -> str:
    for c in value.get("calls", []):
        if c.get("outcome") != DeviceOutcome.PASS:
            return f"dp rank {c.get('dp_rank')} ({c.get('path')}): {c.get('outcome')}: {c.get('message', '')}"
    return value.get("outcome", "?")


def _server_label(s: dict) -> str:
    return (f"tp={s['tp_size']} dp={s['dp_size']}{' dp-attn' if s['enable_dp_attention'] else ''} "
            f"cp={s['attn_cp_size']} page={s['page_size']} splits={s['num_splits']}"
            f"{' graph' if s['cuda_graph'] else ''}")
