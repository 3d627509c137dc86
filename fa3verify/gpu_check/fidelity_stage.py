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
    import functools

    from ..fidelity import FidelityReport

    p = check.plan
    stage.expectation = ("0 mismatches on written metadata slots (ties as multisets) and 0 split-count "
                         f"mismatches over {p.fidelity_configs} configurations")
    budget = check.budget(p.fidelity_budget_s, reserve=p.fuzz_budget_s * 0.5 + 60)
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
    for index, res in check.pool.run_many(tasks(), timeout_s=max(10.0, budget + 30)):
        start, count = chunks[index]
        if res.ok:
            describe = res.value.pop("describe", describe)
            report.merge(FidelityReport.from_dict(res.value))
        else:
            crashes.append({"chunk": [start, start + count], "kind": res.kind, "error": res.error_text[-3000:]})
            path = check.save_case("fidelity", f"chunk{start}", {"chunk": [start, start + count], "seed": p.seed,
                                                                "result": res.to_dict()})
            check.finding("fidelity", f"worker:{res.kind}", f"fidelity chunk {start}..{start + count - 1}: "
                         f"{res.summary()}", case_file=path)
    check.adapter_describe = check.adapter_describe or describe
    for i, f in enumerate(report.findings):
        path = check.save_case("fidelity", f"{f['kind']}-{f['config']['index']}", {"seed": p.seed, **f})
        if i < 20:
            check.finding("fidelity", f["kind"], _fidelity_message(f), case_file=path)
    d = report.to_dict()
    stage.numbers.update(configs=d["configs"], configs_requested=p.fidelity_configs,
                         metadata_mismatches=d["metadata_mismatches"], split_checked=d["split_checked"],
                         split_mismatches=d["split_mismatches"], errors=d["errors"],
                         worker_crashes=len(crashes), configs_per_s=d["configs_per_s"], coverage=d["kinds"])
    if report.metadata_mismatches or report.split_mismatches or report.errors:
        stage.status = StageStatus.FAIL
    elif crashes or report.configs < p.fidelity_configs:
        stage.status = StageStatus.INCONCLUSIVE
        stage.message = (f"{len(crashes)} chunk(s) crashed; " if crashes else "") + \
            f"{report.configs}/{p.fidelity_configs} configurations checked"
    else:
        stage.status = StageStatus.PASS
    if not stage.message:
        stage.message = (f"{report.configs} configs: {report.metadata_mismatches} metadata and "
                         f"{report.split_mismatches} split-count mismatches, {report.errors} errors")


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
