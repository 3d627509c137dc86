"""One attention rank of a scenario as a real ``torch.distributed`` process: the per-rank worker.

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

This module never imports ``fa3verify``; the launcher lives in ``fa3verify/multirank.py``. Placement and case
files are :mod:`gpu_impl.rank_placement`, the records and rank 0's verdict :mod:`gpu_impl.rank_verdict`; this
module holds the collectives, one rank's run and the process entry points, and re-exports the others' names.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from spec.violation import Violation

from .rank_placement import (RankPlacement, attention_world_size, case_to_dict, kernel_spec, loopback_interface,
                             rank_placement, scenario_from_case)
from .rank_verdict import VERDICT_SCHEMA, RankRecord, StepRecord, assemble
from .rank_verdict import json_safe  # noqa: F401 - fa3verify.multirank reads it from here
from .scenario import Scenario, Step

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
        record.guard_raised, record.guard_fault = str(exc), exc.invariant
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
    from .scenario import jsonable, rank_seed, decode_tensors, distribute_over_dp

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
        rec.shape_errors.append(Violation.at_step("SHAPE", index, call.dp_rank, verdict.shape_error, detail))
        return rec
    if not numerics:
        for v in verdict.violations:
            d = v.to_dict() if hasattr(v, "to_dict") else dict(v)
            rec.findings.append(Violation.at_step(d.get("invariant", "UNKNOWN"), index, call.dp_rank,
                                                  d.get("message", str(d)), {**detail, **d}))
        return rec
    tensors = decode_tensors(backend, call, seed=rank_seed(scn.seed, index, call.dp_rank), device=device)
    for sliding in [False] + ([True] if scn.model.has_sliding_window_layers else []):
        try:
            out, _ = backend.forward_decode(kernel, call, *tensors, sliding_window=sliding)
        except OutOfBoundsAccess as exc:
            rec.layers.append(("finding", Violation.at_step(
                exc.invariant, index, call.dp_rank, str(exc),
                {**detail, "batch": exc.batch, "indices": jsonable(exc.indices)})))
            break
        except MetadataShapeError as exc:
            rec.layers.append(("shape", Violation.at_step("SHAPE", index, call.dp_rank, str(exc), detail)))
            break
        rec.layers.append(("out", sliding, out.detach().cpu()))
    return rec


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
        _run_cases_in_group(rank, world, cases, out_dir, backend, flags, device)
    except BaseException as exc:
        # Reported before the group is torn down: tearing it down breaks the peers' collectives, and a peer's
        # report of that broken collective must not carry an earlier time than the cause's.
        _write_error_report(out_dir, rank, exc)
        raise
    finally:
        dist.destroy_process_group()
    return 0


def _write_error_report(out_dir: Path, rank: int, exc: BaseException) -> None:
    """``error-rank-N.json``: the exception, when it was caught (the launcher blames the earliest) and its
    traceback; written once per exception (the innermost handler's report, with the earliest time, stands)."""
    if getattr(exc, "_fa3verify_reported", False):
        return
    _write_json(out_dir / f"error-rank-{rank}.json",
                {"rank": rank, "error": f"{type(exc).__name__}: {exc}", "time": time.time(),
                 "traceback": traceback.format_exc()})
    try:
        exc._fa3verify_reported = True
    except AttributeError:  # an exception type without a __dict__: a second report only repeats the first
        pass


def _run_cases_in_group(rank: int, world: int, cases: Sequence[Any], out_dir: Path, backend: str,
                        flags: list, device: str) -> None:
    """Run every case as ``rank`` inside an initialised process group; rank 0 writes the verdicts."""
    import torch.distributed as dist

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
        _write_error_report(out_dir, rank, exc)  # no-op when _run_cases reported it already
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
        _write_error_report(path, rank, exc)  # no-op when _run_cases reported it already
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise
