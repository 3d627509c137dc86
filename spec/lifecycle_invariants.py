"""Invariants over the scheduler metadata's whole life: a sequence of launches (layers x steps, eager and replayed).

Every invariant of spec.invariants judges one precompute against one call. These judge a trace of
refmodel.metadata_lifecycle (``run_sequence``): what each launch read, from whom, with which semaphore, under which
captured geometry. The registry (name, statement, the FA3 lines each models, where it is checked, its negative
control) is data: lifecycle_invariants.json, rendered into docs/invariants.md.

Each invariant has a seeded defect of the engine model (:data:`DEFECTS`, :func:`seed_defect`) that only it catches
on its control sequence (:func:`control_sequence`); tests/prover/test_lifecycle_invariants.py checks that, and that the
model without defects violates none of them over generated sequences.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from refmodel.fa3_builds import VLLM_FORK
from refmodel.metadata_lifecycle import (METADATA_INPUT_FIELDS, EngineModel, FA3Behaviour, LayerShape, Step, Trace,
                                         run_sequence)

from spec.violation import Violation

__all__ = ["LifecycleInvariant", "LIFECYCLE_INVARIANTS", "DEFECTS", "CHECKS", "check_trace", "violated",
           "seed_defect", "control_sequence", "run_and_check"]


@dataclass(frozen=True)
class LifecycleInvariant:
    name: str
    statement: str
    models: str     #: the FA3 (and engine) lines it models
    checked: str    #: where the suite checks it
    defect: str     #: the seeded defect only it catches


_DATA = json.loads(Path(__file__).with_name("lifecycle_invariants.json").read_text())
#: name -> LifecycleInvariant, in the order docs/invariants.md lists them
LIFECYCLE_INVARIANTS: dict = {i["name"]: LifecycleInvariant(**i) for i in _DATA["invariants"]}
#: seeded-defect name -> what it changes in the engine model
DEFECTS: dict = dict(_DATA["defects"])
#: the paragraph docs/invariants.md opens the lifecycle table with (what the engine model covers, and how real code
#: reaches it)
PAGE_INTRO: str = _DATA["page_intro"]

_LIMIT = 8   # violations reported per invariant and trace (the rest are counted)


def _cap(name: str, found: list) -> list:
    if len(found) <= _LIMIT:
        return found
    extra = len(found) - _LIMIT
    return found[:_LIMIT] + [Violation.at_step(name, None, None, f"{extra} more launches violate {name}",
                                               {"more": extra})]


def _where(r) -> dict:
    return {"step": r.step, "layer": r.layer, "mode": r.mode}


def check_semaphore_starts_at_zero(trace: Trace) -> list:
    found = []
    for r in trace.launches:
        if r.kernel_ran and r.semaphore_start is not None and r.semaphore_start != 0:
            found.append(Violation.at_step(
                "SEMAPHORE_STARTS_AT_ZERO", r.step, None,
                f"layer {r.layer} ({r.mode}) starts its tile scheduler from {r.semaphore_start}: {r.skipped_tiles} of "
                f"{r.tiles} tiles are skipped", {**_where(r), "semaphore": r.semaphore_start,
                                                 "written_by": r.semaphore_origin.kind, "skipped_tiles": r.skipped_tiles,
                                                 "tiles": r.tiles}))
    return _cap("SEMAPHORE_STARTS_AT_ZERO", found)


def check_reads_own_step(trace: Trace) -> list:
    found = []
    for r in trace.launches:
        stale = [x for x in r.reads if x.origin.step != r.step]
        if stale:
            x = stale[0]
            found.append(Violation.at_step(
                "READS_OWN_STEP_METADATA", r.step, None,
                f"layer {r.layer} ({r.mode}) reads {len(stale)} metadata slots not written for step {r.step} "
                f"(slot {x.slot}, {x.vector}[{x.vb}] from {x.origin.kind} of step {x.origin.step})",
                {**_where(r), "slots": len(stale), "first": {"slot": x.slot, "vector": x.vector, "vb": x.vb,
                                                             "written_at": x.origin.step, "by": x.origin.kind}}))
    return _cap("READS_OWN_STEP_METADATA", found)


def check_capture_covers_replay(trace: Trace) -> list:
    found = []
    for r in trace.launches:
        cap = r.captured
        if r.mode != "replay" or cap is None:
            continue
        inp = cap.call.inputs
        problems = {}
        if len(r.seqused_k) > inp.batch_size:
            problems["rows"] = [len(r.seqused_k), inp.batch_size]
        if max(r.seqused_k) > inp.seqlen_k:
            problems["kv_width"] = [max(r.seqused_k), inp.seqlen_k]
        if cap.num_splits > 1:
            bound = min(cap.num_splits, cap.combine_capacity)
            over = [x.value for x in r.reads if x.vector == "num_splits" and x.value > bound]
            if over:
                problems["splits"] = [max(over), bound]
        if problems:
            found.append(Violation.at_step(
                "CAPTURE_COVERS_REPLAY", r.step, None,
                f"layer {r.layer}'s graph captured at step {cap.step} does not cover this replay: "
                + ", ".join(f"{k} {v[0]} > {v[1]}" for k, v in problems.items()), {**_where(r), **problems}))
    return _cap("CAPTURE_COVERS_REPLAY", found)


def check_padded_rows_read_defined(trace: Trace) -> list:
    found = []
    for r in trace.launches:
        undefined = [x for x in r.reads if not x.origin.defined]
        if undefined:
            rows = sorted({x.vb for x in undefined})
            found.append(Violation.at_step(
                "PADDED_ROWS_READ_DEFINED", r.step, None,
                f"layer {r.layer} ({r.mode}) reads {len(undefined)} uninitialised metadata slots for virtual batches "
                f"{rows} (real rows: {r.real_batch} of {r.call.inputs.batch_size})",
                {**_where(r), "virtual_batches": rows, "real_batch": r.real_batch,
                 "vectors": sorted({x.vector for x in undefined})}))
    return _cap("PADDED_ROWS_READ_DEFINED", found)


def check_shared_precompute_matches_layer(trace: Trace) -> list:
    found = []
    for r in trace.launches:
        if r.precompute is None:
            continue
        p, c = r.precompute.schedule.inputs, r.call.inputs
        diff = {f: [getattr(p, f), getattr(c, f)] for f in METADATA_INPUT_FIELDS if getattr(p, f) != getattr(c, f)}
        if diff:
            found.append(Violation.at_step(
                "SHARED_PRECOMPUTE_MATCHES_LAYER", r.step, None,
                f"layer {r.layer} uses a precompute made for other shapes: "
                + ", ".join(f"{k} {v[0]} (precompute) != {v[1]} (layer)" for k, v in diff.items()),
                {**_where(r), "fields": diff}))
    return _cap("SHARED_PRECOMPUTE_MATCHES_LAYER", found)


def check_precompute_call_size_agree(trace: Trace) -> list:
    found = []
    for r in trace.launches:
        if r.precompute is None or r.precompute.size == r.call.metadata_size:
            continue
        if r.shape_error:
            how = "FA3 raises at capture (CHECK_SHAPE)" if r.mode == "replay" else "FA3 raises (CHECK_SHAPE)"
        else:
            how = "silent: the captured view has the call's size"
        found.append(Violation.at_step(
            "PRECOMPUTE_CALL_SIZE_AGREE", r.step, None,
            f"layer {r.layer} ({r.mode}) expects {r.call.metadata_size} metadata slots; its precompute made "
            f"{r.precompute.size} ({how})", {**_where(r), "precompute_size": r.precompute.size,
                                              "call_size": r.call.metadata_size, "loud": r.shape_error}))
    return _cap("PRECOMPUTE_CALL_SIZE_AGREE", found)


#: invariant name -> its check over a trace
CHECKS: dict = {
    "SEMAPHORE_STARTS_AT_ZERO": check_semaphore_starts_at_zero,
    "READS_OWN_STEP_METADATA": check_reads_own_step,
    "CAPTURE_COVERS_REPLAY": check_capture_covers_replay,
    "PADDED_ROWS_READ_DEFINED": check_padded_rows_read_defined,
    "SHARED_PRECOMPUTE_MATCHES_LAYER": check_shared_precompute_matches_layer,
    "PRECOMPUTE_CALL_SIZE_AGREE": check_precompute_call_size_agree,
}


def check_trace(trace: Trace, only: Sequence[str] = ()) -> list:
    """Every lifecycle invariant's violations over a trace (``only``: just these names)."""
    out = []
    for name, check in CHECKS.items():
        if not only or name in only:
            out += check(trace)
    return out


def violated(trace: Trace) -> set:
    """The names of the lifecycle invariants a trace violates."""
    return {v.invariant for v in check_trace(trace)}


# ---- seeded defects and their control sequences ----------------------------------------------------------------

def _halve_last_layer_kv_heads(engine: EngineModel) -> EngineModel:
    last = engine.layers[-1]
    layers = engine.layers[:-1] + (dataclasses.replace(last, num_heads_k=max(1, last.num_heads_k // 2)),)
    return dataclasses.replace(engine, layers=layers, precompute_layer=0)


_SEEDS: dict = {
    "no-semaphore-reset-after-reuse": lambda e, s, f: (e, s, FA3Behaviour(reset_after_reuse=False)),
    "replay-skips-metadata-refresh": lambda e, s, f: (e, _stale_replays(s), f),
    "capture-width-of-capture-batch": lambda e, s, f: (dataclasses.replace(e, capture_width=_capture_width(e, s)), s, f),
    "precompute-over-real-rows": lambda e, s, f: (dataclasses.replace(e, precompute_padded_batch=False), s, f),
    "shared-precompute-heterogeneous-heads": lambda e, s, f: (_halve_last_layer_kv_heads(e), s, f),
    "fork-precompute-heuristic-splits": lambda e, s, f: (dataclasses.replace(e, build=VLLM_FORK, call_num_splits=32,
                                                                             precompute_num_splits=0), s, f),
}


def _stale_replays(steps: Sequence[Step]) -> list:
    out, seen = [], set()
    for st in steps:
        b = len(st.cache_seqlens)
        if st.mode == "replay":
            out.append(dataclasses.replace(st, refresh=b not in seen))
            seen.add(b)
        else:
            out.append(st)
    return out


def _capture_width(engine: EngineModel, steps: Sequence[Step]) -> int:
    caps = [max(st.cache_seqlens) for st in steps if st.mode == "capture"]
    return engine.page_width(max(caps) if caps else 1)


def seed_defect(name: str, engine: EngineModel, steps: Sequence[Step],
                fa3: FA3Behaviour = FA3Behaviour()) -> tuple:
    """(engine, steps, fa3) with the named defect seeded; ValueError naming the known defects otherwise."""
    if name not in _SEEDS:
        raise ValueError(f"defect: one of {sorted(_SEEDS)}, got {name!r}")
    return _SEEDS[name](engine, list(steps), fa3)


def control_sequence(defect: str) -> tuple:
    """A sequence on which the engine model is clean and the named defect violates only its invariant."""
    layers = (LayerShape(32, 8),) * 3
    if defect == "no-semaphore-reset-after-reuse":   # one split on both sides (deterministic inference)
        engine = EngineModel(layers=layers, context_len=8192, precompute_num_splits=1, call_num_splits=1)
        return engine, [Step("eager", (700, 300, 1200, 90) * 6)]
    if defect == "fork-precompute-heuristic-splits":  # vLLM: 32 splits under full CUDA graphs on both sides
        engine = EngineModel(layers=layers, context_len=32768, precompute_num_splits=32, call_num_splits=32,
                             build=VLLM_FORK)
        return engine, [Step("capture", (32768,) * 8), Step("replay", (300,) * 8)]
    engine = EngineModel(layers=layers, context_len=32768)
    if defect == "shared-precompute-heterogeneous-heads":
        return engine, [Step("eager", (32768,) + (100,) * 7)]
    if defect == "precompute-over-real-rows":
        return engine, [Step("capture", (1,) * 8), Step("replay", (4000,) * 6 + (1, 1), real_batch=6)]
    return engine, [Step("capture", (1,) * 8), Step("replay", (32768,) + (100,) * 7),
                    Step("replay", (500,) * 8)]


def run_and_check(engine: EngineModel, steps: Sequence[Step], fa3: FA3Behaviour = FA3Behaviour(),
                  defect: str = "") -> tuple:
    """Run a sequence (with ``defect`` seeded when named) and check it: (trace, violations)."""
    if defect:
        engine, steps, fa3 = seed_defect(defect, engine, steps, fa3)
    trace = run_sequence(engine, steps, fa3)
    return trace, check_trace(trace)


