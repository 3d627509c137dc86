"""gpu-check's ``fidelity`` stage: refmodel against the adapter's ``get_scheduler_metadata``, in workers.

Invariant: over ``--fidelity-configs`` random configurations, the written metadata slots agree (sort ties
compared as multisets) and so does the call's split count (``hopper/flash_api.cpp``
``mha_fwd_get_scheduler_metadata``, ``hopper/flash_prepare_scheduler.cu``); the comparison itself is
:mod:`fa3verify.fidelity`, this module splits it into chunks and records mismatches and crashed chunks.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from spec.finding import StageStatus

if TYPE_CHECKING:
    from .runner import GpuCheck, Stage


def run(check: GpuCheck, stage: Stage) -> None:
    p = check.plan
    adapters = p.fidelity_adapters
    stage.expectation = ("0 mismatches on written metadata slots (ties as multisets) and 0 split-count "
                         f"mismatches over {p.fidelity_configs} configurations, for each FA3 build that loads")
    per_build, failed, incomplete = {}, False, []
    for i, adapter in enumerate(adapters):
        later = len(adapters) - i - 1
        budget = check.budget(p.fidelity_budget_s, reserve=p.fuzz_budget_s * 0.5 + 60 + later * 20)
        res = _check_build(check, adapter, budget, primary=(i == 0))
        per_build[res["label"]] = res["numbers"]
        if i == 0:
            stage.numbers.update(res["numbers"])
            stage.message = res["message"]
        failed = failed or res["status"] == StageStatus.FAIL
        if res["status"] == StageStatus.INCONCLUSIVE:
            incomplete.append(f"{res['label']}: {res['message']}")
    if len(adapters) > 1:
        stage.numbers["builds"] = per_build
        stage.message = "; ".join(f"{label}: {n.get('summary', '')}" for label, n in per_build.items())
    if failed:
        stage.status = StageStatus.FAIL
    elif incomplete:
        stage.status = StageStatus.INCONCLUSIVE
        stage.message = "; ".join(incomplete) if len(adapters) == 1 else stage.message
    else:
        stage.status = StageStatus.PASS


def _check_build(check: GpuCheck, adapter: dict, budget: float, primary: bool) -> dict:
    """One build's fidelity: ``{"label", "status", "message", "numbers"}``. A build whose library does not load here
    is recorded as not installable (with the reason) and does not count against the stage."""
    import functools

    from ..fidelity import FidelityReport

    p = check.plan
    label = adapter["name"] + (f" ({adapter['options']['root']})" if adapter.get("options", {}).get("root") else "")
    if not primary:
        probe = check.pool.run(functools.partial(describe_task, adapter), timeout_s=max(10.0, min(budget, 120)))
        if not probe.ok:
            reason = probe.error_text.strip().splitlines()[-1:] or [probe.summary()]
            return {"label": label, "status": StageStatus.SKIPPED, "message": f"not installable here: {reason[0]}",
                    "numbers": {"installable": False, "reason": probe.error_text[-1500:],
                                "summary": f"not installable here: {reason[0][:200]}"}}
        label = probe.value.get("build") or label
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
            yield functools.partial(fidelity_chunk_task, adapter, p.seed, start, count, left - 1,
                                    p.max_q_elems, p.max_kv_elems)

    describe = ""
    tag = "" if primary else f"{label}:"
    for index, res in check.pool.run_many(tasks(), timeout_s=max(10.0, budget + 30)):
        start, count = chunks[index]
        if res.ok:
            describe = res.value.pop("describe", describe)
            report.merge(FidelityReport.from_dict(res.value))
        else:
            crashes.append({"chunk": [start, start + count], "kind": res.kind, "error": res.error_text[-3000:]})
            path = check.save_case("fidelity", f"{tag}chunk{start}", {"chunk": [start, start + count],
                                                                     "seed": p.seed, "adapter": adapter,
                                                                     "result": res.to_dict()})
            check.finding("fidelity", f"{tag}worker:{res.kind}", f"{label} fidelity chunk {start}..{start + count - 1}: "
                         f"{res.summary()}", case_file=path)
    if primary:
        check.adapter_describe = check.adapter_describe or describe
    for i, f in enumerate(report.findings):
        path = check.save_case("fidelity", f"{tag}{f['kind']}-{f['config']['index']}",
                               {"seed": p.seed, "adapter": adapter, "build": report.build, **f})
        if i < 20:
            check.finding("fidelity", f"{tag}{f['kind']}", f"{label}: " + _fidelity_message(f), case_file=path)
    d = report.to_dict()
    numbers = dict(configs=d["configs"], configs_requested=p.fidelity_configs, build=d["build"],
                   metadata_mismatches=d["metadata_mismatches"], split_checked=d["split_checked"],
                   split_mismatches=d["split_mismatches"], errors=d["errors"], worker_crashes=len(crashes),
                   configs_per_s=d["configs_per_s"], coverage=d["kinds"], describe=describe)
    message = (f"{report.configs} configs: {report.metadata_mismatches} metadata and "
               f"{report.split_mismatches} split-count mismatches, {report.errors} errors")
    if report.metadata_mismatches or report.split_mismatches or report.errors:
        status = StageStatus.FAIL
    elif crashes or report.configs < p.fidelity_configs:
        status = StageStatus.INCONCLUSIVE
        message = (f"{len(crashes)} chunk(s) crashed; " if crashes else "") + \
            f"{report.configs}/{p.fidelity_configs} configurations checked"
    else:
        status = StageStatus.PASS
    numbers["summary"] = message
    return {"label": label, "status": status, "message": message, "numbers": numbers}


def describe_task(adapter: dict) -> dict:
    """Worker task: load the adapter (its library) and say what it is and which build it is judged as."""
    from ..fidelity import adapter_build
    from .tasks import task_kernel

    kernel = task_kernel(adapter, "strict")
    return {"describe": kernel.describe(), "build": adapter_build(kernel)}


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


def fidelity_chunk_task(adapter: dict, seed: int, start: int, count: int, budget_s: float, max_q_elems: int,
                        max_kv_elems: int) -> dict:
    """Worker task: fidelity configurations ``start .. start+count-1`` (see :mod:`fa3verify.fidelity`)."""
    from ..fidelity import fidelity_task

    return fidelity_task(adapter["name"], adapter.get("device"), seed, start, count, budget_s=budget_s,
                         options=adapter.get("options") or None, max_q_elems=max_q_elems, max_kv_elems=max_kv_elems)
