"""What each rank of a multi-process run reports, and how rank 0 assembles and judges it.

Invariant: rank 0 merges every rank's record in the in-process simulation's order (step, then DP rank) and
judges each gathered output against the float64 oracle under FA3's tolerance rule, exactly as
``gpu_impl.scenario.run_scenario`` does, so both give the same findings and trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from spec.violation import Violation

from .scenario import Scenario
from .rank_placement import rank_placement, scenario_from_case
from spec.finding import Outcome


#: Schema tag of the verdict file rank 0 writes.
VERDICT_SCHEMA = "fa3verify.ranks/1"


# ------------------------------------------------------------------------------------------------
# One rank's run
# ------------------------------------------------------------------------------------------------


@dataclass
class StepRecord:
    """What one rank did at one step: its trace entry, the findings it saw itself, and what rank 0 must judge."""

    step: int
    kind: str                                  # "extend" | "decode"
    entry: Optional[dict] = None               # None: this rank's DP share was empty (idle)
    findings: list = field(default_factory=list)
    shape_errors: list = field(default_factory=list)
    cp_call: Optional[dict] = None             # this rank's own CP varlen call (extend, CP path)
    extend: Optional[dict] = None              # {"mode", "path", "seq_lens", "extend_lens", "out"}
    call: Any = None                           # the DecodeCall (decode)
    layers: list = field(default_factory=list)  # decode numerics: ("out", sliding, out) | ("finding", Violation)


@dataclass
class RankRecord:
    """Everything one rank sends to rank 0 for one case."""

    rank: int
    dp_rank: int
    cp_rank: int
    steps: list = field(default_factory=list)
    guard_raised: Optional[str] = None
    #: the guard fault's invariant (``spec.model.guards.GUARD_FAULTS``: GUARD_RAISED, or GUARD_TIMEOUT past its deadline)
    guard_fault: str = "GUARD_RAISED"
    elapsed_s: float = 0.0


# ------------------------------------------------------------------------------------------------
# Rank 0: assemble and judge
# ------------------------------------------------------------------------------------------------


def _strip(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "cp_calls"}


def assemble(case: Any, records: Sequence[RankRecord], numerics: bool = True) -> dict:
    """Rank 0's view of a run: every rank's record merged in the simulation's order (step, then DP rank), each
    gathered output judged against the oracle; returns the verdict (JSON-ready but for ``outputs``)."""
    from .backend import FlashAttentionBackend
    from .runner import Batch
    from .scenario import MODES, extend_tensors, judge_decode_output, judge_extend_output

    scn = scenario_from_case(case)
    server = scn.server
    by_place = {(r.dp_rank, r.cp_rank): r for r in records}
    findings: list[Violation] = []
    shape_errors: list[Violation] = []
    trace: list[dict] = []
    outputs: list[torch.Tensor] = []
    rank_findings: dict[int, list[str]] = {r.rank: [] for r in records}
    guard = [r for r in records if r.guard_raised]
    if guard:
        findings.append(Violation.at_step(guard[0].guard_fault, None, None, guard[0].guard_raised, {},
                                          signature_key=guard[0].guard_fault))
    else:
        backend = FlashAttentionBackend(server, scn.model, scn.guard, scn.metadata_heads,
                                        graph_replay_seqlen_k=scn.graph_replay_seqlen_k,
                                        fa3_build=scn.fa3_build)
        for index in range(len(scn.steps)):
            for d in range(server.attn_dp_size):
                group = [by_place[(d, c)] for c in range(server.attn_cp_size)]
                steps = [g.steps[index] for g in group]
                lead = steps[0]
                for g, s in zip(group, steps):
                    own = [f.invariant for f in s.findings + s.shape_errors] + \
                          [x[1].invariant for x in s.layers if x[0] in ("finding", "shape")]
                    rank_findings[g.rank].extend(own)
                    if s.entry != lead.entry and (s.entry is None or lead.entry is None
                                                  or _strip(s.entry) != _strip(lead.entry)):
                        findings.append(Violation.at_step(
                            "CP_RANKS_AGREE", index, d, f"rank {g.rank} recorded {s.entry}, its CP leader {lead.entry}",
                            {"mode": scn.steps[index].mode, "rank": g.rank}))
                if lead.entry is None:
                    continue
                entry = dict(lead.entry)
                if lead.cp_call is not None:
                    entry["cp_calls"] = [s.cp_call for s in steps]
                trace.append(entry)
                findings.extend(lead.findings)
                shape_errors.extend(lead.shape_errors)
                if lead.kind == "extend" and lead.extend is not None:
                    ex = lead.extend
                    batch = Batch(mode=MODES[ex["mode"]], seq_lens=tuple(ex["seq_lens"]), extend_lens=tuple(ex["extend_lens"]))
                    q, k, v = extend_tensors(scn, index, d, batch)
                    bad = judge_extend_output(index, d, ex["mode"], ex["path"], batch, q, k, v, ex["out"])
                    if bad is not None:
                        findings.append(bad)
                    else:
                        outputs.append(ex["out"])
                elif lead.kind == "decode" and lead.layers:
                    call = lead.call
                    detail = {"mode": "decode", "path": call.path, "s_p": entry.get("s_p"), "s_c": entry.get("s_c"),
                              "seq_lens": call.seq_lens}
                    for layer in lead.layers:
                        if layer[0] == "finding":
                            findings.append(layer[1])
                            break
                        if layer[0] == "shape":
                            shape_errors.append(layer[1])
                            break
                        _, sliding, out = layer
                        bad = judge_decode_output(scn, backend, index, call, sliding, out, detail)
                        if bad is not None:
                            findings.append(bad)
                            break
                        outputs.append(out[:call.real_rows])
    outcome = Outcome.VIOLATION if findings else (Outcome.SHAPE_ERROR if shape_errors else Outcome.PASS)
    failing_dp = sorted({f.dp_rank for f in findings + shape_errors if f.dp_rank is not None})
    failing = sorted({g for d in failing_dp for g in rank_placement(server, d * server.attn_cp_size).cp_group})
    return {
        "schema": VERDICT_SCHEMA,
        "outcome": outcome,
        "findings": [_jsonable_finding(f) for f in findings],
        "shape_errors": [_jsonable_finding(f) for f in shape_errors],
        "trace": json_safe(trace),
        "failing_ranks": failing,
        "ranks": [{"rank": r.rank, "dp_rank": r.dp_rank, "cp_rank": r.cp_rank, "elapsed_s": round(r.elapsed_s, 4),
                   "findings": rank_findings[r.rank], "guard_raised": r.guard_raised,
                   "trace": json_safe([_rank_entry(s) for s in r.steps])} for r in records],
        "outputs": outputs,
    }


def _rank_entry(s: StepRecord) -> dict:
    entry = {"step": s.step, "kind": s.kind, "idle": s.entry is None}
    if s.entry is not None:
        entry.update(_strip(s.entry))
    if s.cp_call is not None:
        entry["cp_call"] = s.cp_call
    entry["findings"] = [f.invariant for f in s.findings + s.shape_errors] + \
        [x[1].invariant for x in s.layers if x[0] in ("finding", "shape")]
    return entry


def _jsonable_finding(f: Violation) -> dict:
    return json_safe(f.to_dict())


def json_safe(x):
    from .scenario import jsonable

    x = jsonable(x)
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    return x
