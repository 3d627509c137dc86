"""One attention rank of a scenario as a real ``torch.distributed`` process: the per-rank worker of issue 9.

A deployment runs one process per attention rank: ``attn_dp_size * attn_cp_size`` of them (attention-TP ranks
only split heads, so one process stands for a whole attention-TP group and holds the layer's per-rank head
counts).  Global rank ``r`` is DP rank ``r // attn_cp_size`` and CP rank ``r % attn_cp_size``.  Each rank:

* takes its DP share of every batch (``distribute_over_dp`` / ``distribute_extend_over_dp``, the round-robin
  of ``gpu_impl.scenario``; python/sglang/srt/managers/data_parallel_controller.py dispatches requests);
* steps its own eager runner (CP-v2 metadata lifetime, ``gpu_impl.runner``) on extend/mixed batches and, on
  the CP path, exchanges K/V shards with ``all_gather`` inside its CP group, makes its own varlen attention
  call (``gpu_impl.cp_attention``) and all-gathers the outputs back to global order (cp/zigzag.py);
* on decode batches, agrees with the other DP ranks on the CUDA-graph batch (``all_reduce`` MAX, as the DP
  attention padding does in python/sglang/srt/layers/dp_attention.py), computes -- or, per the guard,
  skips -- its own FA3 scheduler metadata and makes its own kernel calls (``FlashAttentionBackend``);
* sends its record to rank 0, which compares every gathered output with the float64 oracle (FA3's tolerance
  rule) and writes the verdict and the per-rank traces.

Every computation is the in-process simulation's own function (``gpu_impl.scenario``, ``gpu_impl.backend``,
``gpu_impl.cp_attention``) with the same seeds, so ``run_scenario`` and a multi-process run agree: same
findings, same trace, bitwise-equal outputs for the emulated kernel on CPU.  Only the transport differs.

This module never imports ``fa3verify``; the launcher lives in ``fa3verify/multirank.py``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch

from .config import ModelConfig, ServerConfig
from .scenario import Finding, Scenario, Step

__all__ = [
    "ENV_FAULT",
    "VERDICT_SCHEMA",
    "RankPlacement",
    "attention_world_size",
    "rank_placement",
    "case_to_dict",
    "scenario_from_case",
    "kernel_spec",
    "loopback_interface",
    "RankComm",
    "run_rank",
    "assemble",
    "rank_main",
    "torchrun_main",
]

#: Hidden fault injection for tests: "RANK:exit:CODE" (os._exit), "RANK:raise" or "RANK:hang", at the first step.
ENV_FAULT = "FA3VERIFY_INJECT_FAULT"
#: Schema tag of the verdict file rank 0 writes.
VERDICT_SCHEMA = "fa3verify.ranks/1"


# ------------------------------------------------------------------------------------------------
# Placement and case files
# ------------------------------------------------------------------------------------------------


def attention_world_size(server: ServerConfig) -> int:
    """Processes a deployment runs attention on: ``attn_dp_size * attn_cp_size`` (dp_attention.py world info)."""
    return server.attn_dp_size * server.attn_cp_size


@dataclass(frozen=True)
class RankPlacement:
    """Where one global rank sits: its DP rank, its CP rank, and the global ranks of its CP group."""

    rank: int
    world: int
    dp_rank: int
    cp_rank: int
    cp_group: tuple[int, ...]

    @property
    def is_cp_leader(self) -> bool:
        """CP rank 0 of its DP group (the one whose replicated records rank 0 reads)."""
        return self.cp_rank == 0


def rank_placement(server: ServerConfig, rank: int) -> RankPlacement:
    """DP-major, CP-minor placement of a global rank (CP groups are contiguous ranks, as sglang's attention
    groups are built in python/sglang/srt/layers/dp_attention.py)."""
    world = attention_world_size(server)
    if not 0 <= rank < world:
        raise ValueError(f"rank: must be in [0, {world}), got {rank}")
    cp = server.attn_cp_size
    dp_rank, cp_rank = divmod(rank, cp)
    return RankPlacement(rank, world, dp_rank, cp_rank, tuple(range(dp_rank * cp, dp_rank * cp + cp)))


def case_to_dict(case: Any) -> dict:
    """Plain-dict form of a case (a ``spec.cases.Case``, a mapping, or a JSON file path): the fields this
    worker reads (server, model, policy, batches, kernel, seed, expected)."""
    if isinstance(case, (str, os.PathLike)):
        try:
            from spec.cases import Case  # the project's case-file reader, when present
        except ImportError:
            with open(case, encoding="utf-8") as fh:
                return json.load(fh)
        case = Case.load(str(case))
    if isinstance(case, Mapping):
        return dict(case)
    if hasattr(case, "to_dict"):
        return dict(case.to_dict())
    return {name: getattr(case, name) for name in ("server", "model", "policy", "batches", "kernel", "seed",
                                                  "expected") if hasattr(case, name)}


def scenario_from_case(case: Any) -> Scenario:
    """The Scenario a case describes (server, model, policy, batches, seed); ValueError names a bad field."""
    from .guards import load_guard

    data = case_to_dict(case)
    for name in ("server", "model", "batches"):
        if name not in data:
            raise ValueError(f"{name}: missing from the case")
    policy = dict(data.get("policy") or {})
    if policy.get("cp_decode_kv", "replicated") != "replicated":
        raise ValueError(f"policy.cp_decode_kv: only 'replicated' is modelled by the scenario runner, "
                         f"got {policy['cp_decode_kv']!r}")
    for i, b in enumerate(data["batches"]):
        pinned = sorted(set(b) & {"dp_rank", "cp_metadata"})
        if pinned:
            raise ValueError(f"batches[{i}].{pinned[0]}: not modelled by the scenario runner (batches are split "
                             f"over DP ranks round-robin)")
    guard_spec = policy.get("guard", "fixed")
    steps = [Step(mode=b["mode"], seq_lens=list(b["seq_lens"]), extend_lens=b.get("extend_lens"))
             for b in data["batches"]]
    return Scenario(server=ServerConfig.from_dict(data["server"]), model=ModelConfig.from_dict(data["model"]),
                    guard=load_guard(guard_spec), steps=steps, guard_spec=guard_spec,
                    metadata_heads=policy.get("metadata_heads", "tp"),
                    clear_stale_cp_metadata=bool(policy.get("clear_stale_cp_metadata", True)),
                    seed=int(data.get("seed", 0)),
                    graph_replay_seqlen_k=str(policy.get("graph_replay_seqlen_k", "max_seq_len")))


def kernel_spec(case: Any) -> tuple[str, str]:
    """``(name, mode)`` of the kernel adapter a case asks for (default: the emulator, strict)."""
    kernel = case_to_dict(case).get("kernel") or {}
    return kernel.get("name", "emulated"), kernel.get("mode", "strict")


def loopback_interface() -> str:
    """Name of the loopback network interface ("lo" on Linux), so gloo never binds another address."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        names = []
    for name in names:
        if name == "lo" or name.startswith("lo"):
            return name
    return "lo"


# ------------------------------------------------------------------------------------------------
# Collectives
# ------------------------------------------------------------------------------------------------


class RankComm:
    """The collectives one rank uses, over ``torch.distributed`` (gloo or NCCL): its CP group and the world."""

    def __init__(self, placement: RankPlacement, cp_size: int, dp_size: int, device: str):
        import torch.distributed as dist

        self.dist = dist
        self.placement = placement
        self.device = device
        # new_group is collective over the world: every rank creates every group, in the same order.
        self.cp_group = None
        for d in range(dp_size):
            ranks = list(range(d * cp_size, d * cp_size + cp_size))
            group = dist.new_group(ranks) if cp_size > 1 else None
            if d == placement.dp_rank:
                self.cp_group = group

    def all_gather_rows(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """All-gather equal-shaped tensors inside the CP group, bit for bit (the K/V and output all-gathers of
        cp/zigzag.py; sent as bytes, any dtype)."""
        if self.cp_group is None:
            return [tensor]
        t = tensor.contiguous()
        raw = t.view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)
        out = [torch.empty_like(raw) for _ in self.placement.cp_group]
        self.dist.all_gather(out, raw, group=self.cp_group)
        return [o.view(t.dtype).reshape(t.shape) for o in out]

    def all_reduce_max(self, value: int) -> int:
        """Max of an integer over every attention rank (the DP-attention batch-size agreement)."""
        t = torch.tensor([int(value)], dtype=torch.int64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return int(t.item())

    def gather_to_rank0(self, obj: Any) -> Optional[list]:
        """Every rank's object on rank 0 (None elsewhere): the harness's collection point, no sglang counterpart."""
        out = [None] * self.placement.world if self.placement.rank == 0 else None
        self.dist.gather_object(obj, out, dst=0)
        return out


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
    layers: list = field(default_factory=list)  # decode numerics: ("out", sliding, out) | ("finding", Finding)


@dataclass
class RankRecord:
    """Everything one rank sends to rank 0 for one case."""

    rank: int
    dp_rank: int
    cp_rank: int
    steps: list = field(default_factory=list)
    guard_raised: Optional[str] = None
    elapsed_s: float = 0.0


def _inject_fault(rank: int, index: int) -> None:
    spec = os.environ.get(ENV_FAULT, "")
    if not spec or index != 0:
        return
    parts = spec.split(":")
    if int(parts[0]) != rank:
        return
    if parts[1] == "exit":
        os._exit(int(parts[2]) if len(parts) > 2 else 7)
    if parts[1] == "raise":
        raise RuntimeError(f"injected fault on rank {rank} ({ENV_FAULT}={spec})")
    if parts[1] == "hang":
        while True:
            time.sleep(1)


def run_rank(case: Any, placement: RankPlacement, comm: RankComm, numerics: bool = True, device: str = "cpu",
             kernel=None) -> RankRecord:
    """Run every step of a case as one attention rank (the per-rank work of sglang's scheduler + model runner +
    flashattention_backend.py); returns the record rank 0 assembles."""
    from .guards import GuardRaised
    from .scenario import ScenarioRun, prepare_run, step_decode_runners

    start = time.perf_counter()
    scn = scenario_from_case(case)
    record = RankRecord(placement.rank, placement.dp_rank, placement.cp_rank)
    if kernel is None and numerics:
        from .kernels import load

        name, mode = kernel_spec(case)
        kernel = load(name, mode=mode, device=device)
    try:
        scn, backend, kernel = prepare_run(scn, kernel)
    except GuardRaised as exc:
        record.guard_raised = str(exc)
        return record
    run = ScenarioRun(scn)
    for index, step in enumerate(scn.steps):
        _inject_fault(placement.rank, index)
        if step.mode in ("extend", "mixed"):
            record.steps.append(_extend_step(scn, run, placement, comm, index, step, numerics, device))
        else:
            seqs = step.seq_lens if step.mode == "decode" else []
            step_decode_runners(run, index, seqs, only_rank=placement.dp_rank)
            record.steps.append(_decode_step(scn, backend, placement, comm, index, seqs, numerics, kernel, device))
    record.elapsed_s = time.perf_counter() - start
    return record


def _extend_step(scn: Scenario, run, placement: RankPlacement, comm: RankComm, index: int, step: Step,
                 numerics: bool, device: str) -> StepRecord:
    from .cp_attention import (CPLayoutMismatch, check_layout_matches_batch, extend_rows, join_prefix_and_extend,
                               local_shard, plain_prefill_attention, rank_prefill_attention, unshard)
    from .runner import Batch
    from .scenario import (MODES, cp_path_finding, distribute_extend_over_dp, extend_numerics_plan,
                           extend_tensors, extend_trace_entry, layout_mismatch_finding)

    rec = StepRecord(index, "extend")
    extend = step.extend_lens if step.extend_lens is not None else list(step.seq_lens)
    seqs, exts = distribute_extend_over_dp(step.seq_lens, extend, scn.server.attn_dp_size)[placement.dp_rank]
    if not seqs:
        return rec
    dp_rank = placement.dp_rank
    batch = Batch(mode=MODES[step.mode], seq_lens=tuple(seqs), extend_lens=tuple(exts))
    trace = run.step(dp_rank, batch, index)
    rec.entry = extend_trace_entry(index, step.mode, dp_rank, trace)
    finding = cp_path_finding(run.batch_steps, index, step.mode, dp_rank, trace)
    if finding is not None:
        rec.findings.append(finding)
    if not numerics:
        return rec
    path, skip = extend_numerics_plan(scn, batch, trace.took_cp_path)
    rec.entry["numerics"] = skip or path
    if skip:
        return rec
    q, k, v = extend_tensors(scn, index, dp_rank, batch, device)
    if path == "plain":
        out, _ = plain_prefill_attention(q, k, v, batch.seq_lens, batch.extend_lens)
    else:
        layout = batch.attn_cp_metadata.layout
        try:
            check_layout_matches_batch(layout, batch.seq_lens, batch.extend_lens)
        except CPLayoutMismatch as exc:
            rec.entry["numerics"] = "layout_mismatch"
            rec.findings.append(layout_mismatch_finding(index, dp_rank, batch.mode.value, exc))
            return rec
        r = placement.cp_rank
        rows = extend_rows(batch.seq_lens, batch.extend_lens).to(k.device)
        # This rank's K/V shard (what it computed from its local hidden states) -> all-gather -> global order.
        k_ext = unshard(layout, comm.all_gather_rows(local_shard(layout, r, k.index_select(0, rows))))
        v_ext = unshard(layout, comm.all_gather_rows(local_shard(layout, r, v.index_select(0, rows))))
        k_full = join_prefix_and_extend(k, k_ext, batch.seq_lens, batch.extend_lens)
        v_full = join_prefix_and_extend(v, v_ext, batch.seq_lens, batch.extend_lens)
        out_local, _, call = rank_prefill_attention(layout, r, local_shard(layout, r, q), k_full, v_full)
        rec.cp_call = call.to_dict()
        out = unshard(layout, comm.all_gather_rows(out_local))
    rec.extend = {"mode": batch.mode.value, "path": path, "seq_lens": list(batch.seq_lens),
                  "extend_lens": list(batch.extend_lens),
                  "out": out.detach().cpu() if placement.is_cp_leader else None}
    return rec


def _decode_step(scn: Scenario, backend, placement: RankPlacement, comm: RankComm, index: int,
                 seq_lens: Sequence[int], numerics: bool, kernel, device: str) -> StepRecord:
    from .errors import MetadataShapeError, OutOfBoundsAccess
    from .scenario import _jsonable, _seed, decode_tensors, distribute_over_dp

    rec = StepRecord(index, "decode")
    dp_rank = placement.dp_rank
    mine = distribute_over_dp(seq_lens, scn.server.attn_dp_size)[dp_rank]
    view: list[list[int]] = [[] for _ in range(scn.server.attn_dp_size)]
    view[dp_rank] = mine
    if scn.server.cuda_graph:
        # The graph batch is the largest DP rank's batch: agreed on with a real collective.
        longest = comm.all_reduce_max(len(mine))
        if longest > len(mine):
            view[(dp_rank + 1) % len(view)] = [1] * longest
    calls = [c for c in backend.decode_calls(view) if c.dp_rank == dp_rank]
    if not calls:
        return rec  # eager and idle: no call
    call = calls[0]
    rec.call = call
    verdict = backend.check_decode(call)
    rec.entry = {"step": index, "mode": "decode", **verdict.to_dict()}
    detail = {"mode": "decode", "path": call.path, "s_p": verdict.s_p, "s_c": verdict.s_c, "seq_lens": call.seq_lens}
    if verdict.shape_error:
        rec.shape_errors.append(Finding("SHAPE", index, call.dp_rank, verdict.shape_error, detail))
        return rec
    if not numerics:
        for v in verdict.violations:
            d = v.to_dict() if hasattr(v, "to_dict") else dict(v)
            rec.findings.append(Finding(d.get("invariant", "UNKNOWN"), index, call.dp_rank,
                                        d.get("message", str(d)), {**detail, **d}))
        return rec
    tensors = decode_tensors(backend, call, seed=_seed(scn.seed, index, call.dp_rank), device=device)
    for sliding in [False] + ([True] if scn.model.has_sliding_window_layers else []):
        try:
            out, _ = backend.forward_decode(kernel, call, *tensors, sliding_window=sliding)
        except OutOfBoundsAccess as exc:
            rec.layers.append(("finding", Finding(exc.invariant, index, call.dp_rank, str(exc),
                                                  {**detail, "batch": exc.batch, "indices": _jsonable(exc.indices)})))
            break
        except MetadataShapeError as exc:
            rec.layers.append(("shape", Finding("SHAPE", index, call.dp_rank, str(exc), detail)))
            break
        rec.layers.append(("out", sliding, out.detach().cpu()))
    return rec


# ------------------------------------------------------------------------------------------------
# Rank 0: assemble and judge
# ------------------------------------------------------------------------------------------------


def _judge_decode(scn: Scenario, backend, index: int, call, sliding: bool, out: torch.Tensor,
                  detail: dict) -> Optional[Finding]:
    """Oracle comparison of one gathered decode output (the comparison of scenario._run_decode_numerics)."""
    from refmodel.tolerance import fa3_output_close, reference_outputs

    from .scenario import _seed, decode_tensors

    q, k_cache, v_cache, page_table = decode_tensors(backend, call, seed=_seed(scn.seed, index, call.dp_rank))
    seqlens = torch.tensor(call.seq_lens, dtype=torch.int32)
    cu = torch.arange(len(call.seq_lens) + 1, dtype=torch.int32)
    ref, low = reference_outputs(q, k_cache, v_cache, cache_seqlens=seqlens, cu_seqlens_q=cu, max_seqlen_q=1,
                                 page_table=page_table, causal=True)
    rows = call.real_rows
    out_rows = out[:rows]
    if torch.isnan(out_rows.float()).any() and not torch.isnan(ref[:rows]).any():
        bad = sorted({int(i) for i in torch.nonzero(torch.isnan(out_rows.float()))[:, 0].tolist()})
        return Finding("NO_NAN", index, call.dp_rank, f"NaN in output rows {bad[:8]} where the oracle has none",
                       {**detail, "rows": bad[:32], "sliding_window": sliding})
    ok, err, bound = fa3_output_close(out_rows, ref[:rows], low[:rows])
    if not ok:
        return Finding("MATCHES_ORACLE", index, call.dp_rank, f"max error {err:.3e} exceeds FA3's bound {bound:.3e}",
                       {**detail, "max_error": err, "bound": bound, "sliding_window": sliding})
    return None


def _strip(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k != "cp_calls"}


def assemble(case: Any, records: Sequence[RankRecord], numerics: bool = True) -> dict:
    """Rank 0's view of a run: every rank's record merged in the simulation's order (step, then DP rank), each
    gathered output judged against the oracle; returns the verdict (JSON-ready but for ``outputs``)."""
    from .backend import FlashAttentionBackend
    from .runner import Batch
    from .scenario import MODES, judge_extend_output, extend_tensors

    scn = scenario_from_case(case)
    server = scn.server
    by_place = {(r.dp_rank, r.cp_rank): r for r in records}
    findings: list[Finding] = []
    shape_errors: list[Finding] = []
    trace: list[dict] = []
    outputs: list[torch.Tensor] = []
    rank_findings: dict[int, list[str]] = {r.rank: [] for r in records}
    guard = [r for r in records if r.guard_raised]
    if guard:
        findings.append(Finding("GUARD_RAISED", -1, None, guard[0].guard_raised, {}))
    else:
        backend = FlashAttentionBackend(server, scn.model, scn.guard, scn.metadata_heads,
                                        graph_replay_seqlen_k=scn.graph_replay_seqlen_k)
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
                        findings.append(Finding("CP_RANKS_AGREE", index, d,
                                                f"rank {g.rank} recorded {s.entry}, its CP leader {lead.entry}",
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
                        bad = _judge_decode(scn, backend, index, call, sliding, out, detail)
                        if bad is not None:
                            findings.append(bad)
                            break
                        outputs.append(out[:call.real_rows])
    outcome = "violation" if findings else ("shape_error" if shape_errors else "pass")
    failing_dp = sorted({f.dp_rank for f in findings + shape_errors if f.dp_rank is not None})
    failing = sorted({g for d in failing_dp for g in rank_placement(server, d * server.attn_cp_size).cp_group})
    return {
        "schema": VERDICT_SCHEMA,
        "outcome": outcome,
        "findings": [_jsonable_finding(f) for f in findings],
        "shape_errors": [_jsonable_finding(f) for f in shape_errors],
        "trace": _json_safe(trace),
        "failing_ranks": failing,
        "ranks": [{"rank": r.rank, "dp_rank": r.dp_rank, "cp_rank": r.cp_rank, "elapsed_s": round(r.elapsed_s, 4),
                   "findings": rank_findings[r.rank], "guard_raised": r.guard_raised,
                   "trace": _json_safe([_rank_entry(s) for s in r.steps])} for r in records],
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


def _jsonable_finding(f: Finding) -> dict:
    return _json_safe(f.to_dict())


def _json_safe(x):
    from .scenario import _jsonable

    x = _jsonable(x)
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    return x


# ------------------------------------------------------------------------------------------------
# Process entry points
# ------------------------------------------------------------------------------------------------


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False), encoding="utf-8")
    tmp.replace(path)


def _run_cases(rank: int, world: int, cases: Sequence[Any], out_dir: Path, backend: str,
               numerics: bool | Sequence[bool], timeout_s: float, store_path: Optional[str] = None) -> int:
    """Initialise the process group (a FileStore at ``store_path``, else ``env://``), run every case as ``rank``,
    let rank 0 write verdicts; returns 0."""
    import torch.distributed as dist

    device = "cpu"
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    else:
        torch.set_num_threads(1)
    timeout = timedelta(seconds=max(1.0, float(timeout_s)))
    if store_path:
        # A file rendezvous: unlike a TCPStore (whose server listens on every interface), no socket at all.
        dist.init_process_group(backend=backend, store=dist.FileStore(store_path, world), rank=rank,
                                world_size=world, timeout=timeout)
    else:
        dist.init_process_group(backend=backend, rank=rank, world_size=world, init_method="env://", timeout=timeout)
    flags = [bool(numerics)] * len(cases) if isinstance(numerics, bool) else list(numerics)
    try:
        for i, case in enumerate(cases):
            numerics = flags[i]
            server = scenario_from_case(case).server
            if attention_world_size(server) != world:
                raise ValueError(f"case {i}: needs {attention_world_size(server)} ranks, the world has {world}")
            placement = rank_placement(server, rank)
            comm = RankComm(placement, server.attn_cp_size, server.attn_dp_size, device)
            record = run_rank(case, placement, comm, numerics=numerics, device=device)
            records = comm.gather_to_rank0(record)
            if rank == 0:
                verdict = assemble(case, records, numerics=numerics)
                outputs = verdict.pop("outputs")
                verdict.update({"world": world, "backend": backend, "numerics": numerics})
                torch.save(outputs, out_dir / f"outputs-{i}.pt")
                ranks = verdict.pop("ranks")
                for r in ranks:
                    _write_json(out_dir / f"case-{i}-rank-{r['rank']}.json", r)
                verdict["rank_traces"] = [f"case-{i}-rank-{r['rank']}.json" for r in ranks]
                _write_json(out_dir / f"verdict-{i}.json", verdict)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def rank_main(rank: int, payload: dict) -> None:
    """Spawn entry point of one rank (``torch.multiprocessing.start_processes``): rendezvous through the file
    store named in ``payload`` (or MASTER_ADDR / MASTER_PORT when it names one), gloo pinned to loopback, runs
    the cases, and on any exception writes ``error-rank-N.json`` before re-raising."""
    if payload.get("master_addr"):
        os.environ["MASTER_ADDR"] = payload["master_addr"]
        os.environ["MASTER_PORT"] = str(payload["master_port"])
    if payload.get("gloo_ifname"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", payload["gloo_ifname"])
    if payload.get("fault"):
        os.environ[ENV_FAULT] = payload["fault"]
    out_dir = Path(payload["out_dir"])
    try:
        _run_cases(rank, payload["world"], payload["cases"], out_dir, payload["backend"], payload["numerics"],
                   payload["timeout_s"], store_path=payload.get("store_path"))
    except BaseException as exc:
        _write_json(out_dir / f"error-rank-{rank}.json",
                    {"rank": rank, "error": f"{type(exc).__name__}: {exc}", "time": time.time(),
                     "traceback": traceback.format_exc()})
        raise


def torchrun_main(cases: Sequence[Any], out_dir: str, backend: str = "nccl", numerics: bool | Sequence[bool] = True,
                  timeout_s: float = 600.0) -> int:
    """Run as one rank of a ``torchrun`` job: RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT from the environment."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    try:
        return _run_cases(rank, world, cases, path, backend, numerics, timeout_s)
    except BaseException as exc:
        _write_json(path / f"error-rank-{rank}.json",
                    {"rank": rank, "error": f"{type(exc).__name__}: {exc}", "time": time.time(),
                     "traceback": traceback.format_exc()})
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise
