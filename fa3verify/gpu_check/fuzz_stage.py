"""gpu-check's ``fuzz`` stage: differential fuzz of the backend with the fixed guard, the kernel launched for real.

Invariant: within ``--fuzz-budget-s``, no case gives NaN, a predicted out-of-bounds access, a crash or an output
outside FA3's tolerance of the oracle; one case per worker task, so a crash costs one case. The cases and the
per-call check come from :mod:`fa3verify.gpu_check.fuzz_cases`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .fuzz_cases import fuzz_case_task, random_fuzz_case

if TYPE_CHECKING:
    from .runner import GpuCheck, Stage


def run(check: GpuCheck, stage: Stage) -> None:
    import functools

    p = check.plan
    stage.expectation = "fixed guard, real launches: no NaN, no predicted out-of-bounds access, no crash, " \
                        "every output within FA3's tolerance of the oracle"
    budget = check.budget(p.fuzz_budget_s, reserve=(p.gpu_tests_timeout_s if "gpu_tests" not in check.skip else 0)
                         + 20)
    stage.numbers["budget_s"] = round(budget, 1)
    if budget < 1:
        stage.status, stage.message = "inconclusive", "no time left for the fuzz"
        return
    num_sm = check.num_sm or 132
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
    for index, res in check.pool.run_many(tasks(), timeout_s=p.fuzz_case_timeout_s):
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
            path = check.save_case("fuzz", f"{outcome}-{case['index']}", payload)
            msg = (_fuzz_message(res.value) if res.ok else res.summary())
            check.finding("fuzz", outcome, f"case {case['index']} ({case['model']}, "
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


def _fuzz_message(value: dict) -> str:
    for c in value.get("calls", []):
        if c.get("outcome") != "pass":
            return f"dp rank {c.get('dp_rank')} ({c.get('path')}): {c.get('outcome')}: {c.get('message', '')}"
    return value.get("outcome", "?")


def _server_label(s: dict) -> str:
    return (f"tp={s['tp_size']} dp={s['dp_size']}{' dp-attn' if s['enable_dp_attention'] else ''} "
            f"cp={s['attn_cp_size']} page={s['page_size']} splits={s['num_splits']}"
            f"{' graph' if s['cuda_graph'] else ''}")
