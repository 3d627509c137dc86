"""Launch a scenario with one process per attention rank: spawn, rendezvous on loopback, timeout, cleanup.

``run_ranks(cases, world=None, backend="gloo", timeout_s=...)`` starts ``attn_dp_size * attn_cp_size`` processes
with ``torch.multiprocessing`` (spawn), each running :func:`gpu_impl.distributed.rank_main`.  The rendezvous is
a ``FileStore`` in a fresh temporary folder and gloo is pinned to the loopback interface, so every socket of the
run is on 127.0.0.1.  (A ``MASTER_ADDR=127.0.0.1`` TCPStore was the first design, but its server listens on
every interface -- ``*:PORT`` -- whatever address it is given.)  Rank 0 writes ``verdict-N.json`` (and per-rank traces, and the gathered outputs)
into the output folder; the launcher reads them back into :class:`MultiRankResult`.

Failure handling: the launcher polls every process.  The first rank that raises or exits non-zero ends the run:
the verdict names that rank and its error (its traceback, or its exit code / signal), the other ranks are
terminated (SIGTERM, then SIGKILL) and joined, and so are all ranks when the timeout passes.  No process started
here outlives :func:`run_ranks`.

Under ``torchrun`` (RANK and WORLD_SIZE in the environment) nothing is spawned: this process is one rank
(:func:`gpu_impl.distributed.torchrun_main`); see docs/multirank.md.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from . import exitcodes
from .errors import UsageError
from spec.finding import Outcome

#: Default wall-clock limit of one launch (seconds).
DEFAULT_TIMEOUT_S = 120.0
#: How long ranks get to exit on their own after rank 0's verdict or a failure, before SIGTERM / SIGKILL.
GRACE_S = 2.0
#: How long a SIGKILLed rank gets to be reaped.
KILL_WAIT_S = 10.0
POLL_S = 0.02


@dataclass
class MultiRankResult:
    """One case run over real ranks: the verdict rank 0 wrote, or the launcher's failure verdict."""

    outcome: str                              # pass | violation | shape_error | rank_error | timeout
    findings: list = field(default_factory=list)
    shape_errors: list = field(default_factory=list)
    trace: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    ranks: list = field(default_factory=list)   # per-rank traces
    failing_ranks: list = field(default_factory=list)
    failed_rank: Optional[int] = None           # the rank that raised / died / hung (launcher failures)
    error: Optional[str] = None
    world: int = 0
    backend: str = "gloo"
    elapsed_s: float = 0.0
    verdict_file: Optional[str] = None
    pids: list = field(default_factory=list)    # the processes the launcher started (all gone on return)

    @property
    def exit_code(self) -> int:
        """0 pass, 1 violation / shape error / a failed rank, 3 timeout (inconclusive)."""
        if self.outcome == Outcome.PASS:
            return exitcodes.PASS
        if self.outcome == Outcome.TIMEOUT:
            return exitcodes.INCONCLUSIVE
        return exitcodes.VIOLATION

    def to_dict(self) -> dict:
        """The verdict as JSON (without the output tensors)."""
        return {"outcome": self.outcome, "exit_code": self.exit_code, "world": self.world, "backend": self.backend,
                "failed_rank": self.failed_rank, "error": self.error, "failing_ranks": self.failing_ranks,
                "findings": self.findings, "shape_errors": self.shape_errors, "trace": self.trace,
                "ranks": self.ranks, "elapsed_s": round(self.elapsed_s, 3), "verdict_file": self.verdict_file}


# ------------------------------------------------------------------------------------------------
# Case loading and world size
# ------------------------------------------------------------------------------------------------


def load_case(path: str, trust_case_guard: bool = False) -> dict:
    """A case file as a dict (read by fa3verify.outputs, validated by ``spec.model.cases``); a bad file, or a guard
    that names code without ``trust_case_guard`` (fa3verify.trust), is a UsageError."""
    from spec.model.cases import Case, CaseFormatError

    from .outputs import read_text
    from .trust import guard_to_run

    text = read_text(str(path), "CASE")
    try:
        case = Case.from_json(text)
    except CaseFormatError as exc:
        raise UsageError(f"CASE {path}: {exc}") from None
    guard_to_run(case.policy.get("guard", "fixed"), None, trust_case_guard)
    return case.to_dict()


def case_world(case: Any) -> int:
    """Attention ranks a case's configuration implies (attn_dp_size * attn_cp_size); UsageError on a bad case."""
    from gpu_impl.distributed import attention_world_size, scenario_from_case
    from gpu_impl.guards import GuardSpecError

    try:
        server = scenario_from_case(case).server
    except GuardSpecError as exc:
        raise UsageError(f"policy.guard: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"case: {exc}") from None
    for name in ("tp_size", "dp_size", "attn_cp_size"):
        if getattr(server, name) < 1:
            raise UsageError(f"server.{name}: must be >= 1, got {getattr(server, name)}")
    return attention_world_size(server)


def resolve_world(cases: Sequence[Any], world: Optional[int]) -> int:
    """The world size: what the cases imply; ``world`` given and different is a UsageError naming both numbers."""
    implied = sorted({case_world(c) for c in cases})
    if len(implied) != 1:
        raise UsageError(f"CASE: the cases imply different world sizes {implied}; launch them separately")
    need = implied[0]
    if world is not None and world != need:
        raise UsageError(f"--world: the case needs attn_dp_size * attn_cp_size = {need} ranks, got --world {world}")
    return need


# ------------------------------------------------------------------------------------------------
# Launch
# ------------------------------------------------------------------------------------------------


def run_ranks(cases: Sequence[Any] | Any, world: Optional[int] = None, backend: str = "gloo",
              timeout_s: float = DEFAULT_TIMEOUT_S, out_dir: Optional[str] = None,
              numerics: bool | Sequence[bool] = True, inject_fault: Optional[str] = None) -> list[MultiRankResult]:
    """Run each case with one spawned process per attention rank (torch.multiprocessing spawn, gloo on loopback
    or NCCL; models a multi-GPU serving deployment's attention ranks) and return one result per case; every
    process is gone when this returns.

    ``numerics`` (one flag, or one per case): run the kernel on tensors and judge outputs against the oracle;
    False checks only metadata against each call.  ``inject_fault`` ("RANK:exit:CODE", "RANK:raise",
    "RANK:hang") makes a rank fail on purpose at the first step (tests of the failure handling).
    """
    import torch.multiprocessing as mp

    from gpu_impl.distributed import loopback_interface

    if not isinstance(cases, (list, tuple)):
        cases = [cases]
    cases = [load_case(c) if isinstance(c, (str, os.PathLike)) else c for c in cases]
    if backend not in ("gloo", "nccl"):
        raise UsageError(f"--backend: must be gloo or nccl, got {backend!r}")
    if not timeout_s > 0:
        raise UsageError(f"--timeout-s: must be > 0, got {timeout_s}")
    flags = [bool(numerics)] * len(cases) if isinstance(numerics, bool) else [bool(x) for x in numerics]
    if len(flags) != len(cases):
        raise UsageError(f"numerics: one flag per case ({len(cases)}), got {len(flags)}")
    n = resolve_world(cases, world)
    keep = out_dir is not None
    folder = Path(out_dir) if keep else Path(tempfile.mkdtemp(prefix="fa3verify-ranks-"))
    stale = sorted(str(p) for p in list(folder.glob("verdict-*.json")) + list(folder.glob("error-rank-*.json")))
    if stale:  # never delete what this run did not create, never read an earlier run's verdict as this one's
        raise UsageError(f"--out-dir: {folder} already holds {len(stale)} verdict/error file(s) of an earlier run "
                         f"(e.g. {stale[0]}); choose an empty --out-dir or remove them yourself")
    folder.mkdir(parents=True, exist_ok=True)
    store_dir = tempfile.mkdtemp(prefix="fa3verify-store-")
    payload = {"cases": [_plain(c) for c in cases], "world": n, "backend": backend, "numerics": flags,
               "timeout_s": float(timeout_s), "out_dir": str(folder), "store_path": os.path.join(store_dir, "store"),
               "gloo_ifname": loopback_interface() if backend == "gloo" else "", "fault": inject_fault or ""}
    start = time.perf_counter()
    ctx = mp.start_processes(_rank_entry, args=(payload,), nprocs=n, join=False, daemon=True,
                             start_method="spawn")
    pids = [p.pid for p in ctx.processes]
    failure: Optional[dict] = {"outcome": Outcome.RANK_ERROR, "failed_rank": None, "error": "launcher interrupted"}
    try:
        failure = _supervise(ctx, folder, start + timeout_s, timeout_s)
    finally:
        _reap(ctx, failed=failure is not None)
        shutil.rmtree(store_dir, ignore_errors=True)
    elapsed = time.perf_counter() - start
    try:
        results = [_read_case(folder, i, n, backend, elapsed, failure) for i in range(len(cases))]
        for r in results:
            r.pids = pids
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    return results


def _rank_entry(rank: int, payload: dict) -> None:
    import sys

    from gpu_impl.distributed import rank_main

    code = 0
    try:
        rank_main(rank, payload)  # on failure it has written error-rank-N.json already
    except BaseException:
        code = 1
    # Skip the interpreter's (slow, torch-heavy) teardown: everything is written, and a failed rank must
    # show its exit code at once so the launcher can end the run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _plain(case: Any) -> dict:
    from gpu_impl.distributed import case_to_dict

    return json.loads(json.dumps(case_to_dict(case)))


def _supervise(ctx, folder: Path, deadline: float, timeout_s: float) -> Optional[dict]:
    """Poll every rank until all exit 0 (None), one fails (its description) or the deadline passes (the ranks
    still running, named with their pids)."""
    procs = ctx.processes
    while True:
        codes = [p.exitcode for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            # Let collateral failures (peers of a dead rank) show, then blame the earliest one.
            time.sleep(0.2)
            failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]  # with those that showed
            return describe_failure(ctx, folder, failed)
        if all(c == 0 for c in codes):
            return None
        if time.perf_counter() > deadline:
            alive = [r for r, p in enumerate(procs) if p.exitcode is None]
            running = ", ".join(f"rank {r} (pid {procs[r].pid})" for r in alive) or "no rank"
            return {"outcome": Outcome.TIMEOUT, "failed_rank": alive[0] if alive else None,
                    "error": f"no verdict within {timeout_s:g} s: {running} still running; killed"}
        time.sleep(POLL_S)


def describe_failure(ctx, folder: Path, first_seen: list[int]) -> dict:
    procs = ctx.processes
    reports = {}
    for path in folder.glob("error-rank-*.json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            reports[int(data["rank"])] = data
        except (OSError, ValueError, KeyError):
            continue
    # A rank that died without a report (os._exit, a signal) died first: its peers only saw a broken collective.
    # Otherwise the earliest report is the cause, whether or not its rank has exited yet (a rank reports, then
    # tears its group down, and that breaks its peers' collectives, which report later).
    silent = [r for r in first_seen if r not in reports]
    if silent:
        rank = silent[0]
    else:
        rank = min(set(first_seen) | set(reports), key=lambda r: (reports[r].get("time", math.inf), r))
    code = procs[rank].exitcode
    if rank in reports:
        error = reports[rank]["error"]
        tb = reports[rank].get("traceback", "")
    else:
        if code is not None and code < 0:
            try:
                error = f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                error = f"killed by signal {-code}"
        else:
            error = f"exited with code {code}"
        tb = ""
    others = {r: procs[r].exitcode for r in range(len(procs)) if r != rank}
    return {"outcome": Outcome.RANK_ERROR, "failed_rank": rank, "error": f"rank {rank}: {error}", "traceback": tb,
            "other_ranks": others}


def _reap(ctx, failed: bool) -> None:
    """Join every process (after a failure: SIGTERM at once), SIGKILL the ones still alive; remove torch's error
    files."""
    procs = ctx.processes
    if not failed:
        deadline = time.perf_counter() + GRACE_S
        for p in procs:
            p.join(max(0.0, deadline - time.perf_counter()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(GRACE_S)
        if p.is_alive():
            p.kill()
            p.join(KILL_WAIT_S)  # SIGKILL cannot be refused; the bound only keeps a stuck kernel from hanging us
    for path in getattr(ctx, "error_files", []) or []:
        try:
            os.unlink(path)
        except (OSError, TypeError):
            pass


def _read_case(folder: Path, index: int, world: int, backend: str, elapsed: float,
               failure: Optional[dict]) -> MultiRankResult:
    import torch

    verdict_path = folder / f"verdict-{index}.json"
    if failure is not None or not verdict_path.exists():
        failure = failure or {"outcome": Outcome.RANK_ERROR, "failed_rank": 0,
                              "error": "rank 0 exited without writing a verdict"}
        return MultiRankResult(outcome=failure["outcome"], failed_rank=failure.get("failed_rank"),
                               error=failure.get("error"), world=world, backend=backend, elapsed_s=elapsed,
                               failing_ranks=[] if failure.get("failed_rank") is None else [failure["failed_rank"]])
    verdict = json.loads(verdict_path.read_text(encoding="utf-8"))
    ranks = [json.loads((folder / name).read_text(encoding="utf-8")) for name in verdict.get("rank_traces", [])]
    outputs = torch.load(folder / f"outputs-{index}.pt", weights_only=True)
    return MultiRankResult(outcome=verdict["outcome"], findings=verdict["findings"],
                           shape_errors=verdict["shape_errors"], trace=verdict["trace"], outputs=outputs,
                           ranks=ranks, failing_ranks=verdict["failing_ranks"], world=world, backend=backend,
                           elapsed_s=elapsed, verdict_file=str(verdict_path))


# ------------------------------------------------------------------------------------------------
# Agreement with the in-process simulation
# ------------------------------------------------------------------------------------------------


def simulate(case: Any, numerics: bool = True, device: str = "cpu"):
    """The in-process simulation of a case: the model with the case's kernel adapter, judged by
    :func:`fa3verify.judge.judge` (a :class:`fa3verify.judge.Verdict`)."""
    from gpu_impl.distributed import kernel_spec, scenario_from_case
    from gpu_impl.kernels import load
    from gpu_impl.engines.model.sut import ModelSUT

    import torch

    from .judge import judge

    name, mode = kernel_spec(case)
    kernel = load(name, mode=mode, device=device) if numerics else None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks run: the same float64 reductions, so bitwise-equal outputs
    try:
        return judge(ModelSUT(), scenario_from_case(case), kernel=kernel, numerics=numerics, device=device)
    finally:
        torch.set_num_threads(threads)


def compare_with_simulation(case: Any, result: MultiRankResult, numerics: bool = True) -> list[str]:
    """Differences between a multi-rank result and the in-process simulation of the same case: outcome,
    findings, trace, outputs (bitwise); an empty list means they agree. A fault that ended the simulation (a guard
    fault, an FA3 abort) agrees when the ranks report the same fault's invariant alone."""
    verdict = simulate(case, numerics=numerics)
    if verdict.result is None:
        theirs = [f["invariant"] for f in result.findings]
        if theirs == verdict.invariants:
            return []
        return [f"simulation ended in {verdict.invariants[0]} ({verdict.fault}); multi-rank findings "
                f"{result.findings}"]
    sim = verdict.result
    diffs = []
    if sim.outcome != result.outcome:
        diffs.append(f"outcome: simulation {sim.outcome}, multi-rank {result.outcome} ({result.error or ''})")
    for name, mine, theirs in (("findings", sim.findings, result.findings),
                               ("shape_errors", sim.shape_errors, result.shape_errors)):
        a = _normal([f.to_dict() for f in mine])
        b = _normal(theirs)
        if a != b:
            diffs.append(f"{name}: simulation {a}, multi-rank {b}")
    a, b = _normal(sim.trace), _normal(result.trace)
    if a != b:
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                diffs.append(f"trace[{i}]: simulation {x}, multi-rank {y}")
                break
        else:
            diffs.append(f"trace: simulation has {len(a)} entries, multi-rank {len(b)}")
    if len(sim.outputs) != len(result.outputs):
        diffs.append(f"outputs: simulation has {len(sim.outputs)}, multi-rank {len(result.outputs)}")
    else:
        for i, (x, y) in enumerate(zip(sim.outputs, result.outputs)):
            if not bitwise_equal(x, y):
                diffs.append(f"outputs[{i}]: not bitwise equal ({x.dtype} {tuple(x.shape)} / {y.dtype} {tuple(y.shape)})")
    return diffs


def bitwise_equal(x, y) -> bool:
    """Same dtype, same shape, same bytes (NaNs included)."""
    if x.dtype != y.dtype or tuple(x.shape) != tuple(y.shape):
        return False
    import torch

    return torch.equal(x.detach().cpu().contiguous().reshape(-1).view(torch.uint8),
                       y.detach().cpu().contiguous().reshape(-1).view(torch.uint8))


def _normal(x):
    from gpu_impl.distributed import json_safe

    return json.loads(json.dumps(json_safe(x)))
