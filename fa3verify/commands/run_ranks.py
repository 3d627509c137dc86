"""fa3verify run-ranks: run a case with one process per attention rank (torch.distributed, gloo or NCCL)."""

from __future__ import annotations

import argparse
import json
import os
import time

from gpu_impl.plugin import engine_phrase
from spec.finding import Outcome

from ..errors import UsageError
from ..outputs import deliver, fresh_dir

HELP = "run a case file with one process per attention rank (real collectives)"
EPILOG = """\
Starts attn_dp_size * attn_cp_size processes (torch.multiprocessing spawn; file-store rendezvous, gloo
bound to the loopback interface: no socket on any other address). DP ranks take their share of every batch,
CP ranks all-gather K/V and outputs, every rank computes (or skips) its own scheduler metadata and makes its
own kernel calls; rank 0 compares the gathered outputs with the float64 oracle and writes the verdict and
per-rank traces.

A rank that raises or dies ends the run with a verdict naming it (exit 1); a run past --timeout-s is killed
(exit 3). Under torchrun (RANK/WORLD_SIZE set) this process is one rank and nothing is spawned.

examples:
  fa3verify run-ranks tests/corpus/worked_example_prefix_guard.json            # fails on every CP rank
  fa3verify run-ranks CASE.json --world 4 --timeout-s 60 --out-dir ranks/
  fa3verify run-ranks CASE.json --compare        # also run the in-process simulation; exit 1 if they differ
  torchrun --nproc-per-node 4 -m fa3verify run-ranks CASE.json --backend nccl  # see docs/multirank.md
"""


def register(sub) -> None:
    """Add the run-ranks subcommand (models launching the modelled backend's attention ranks, one process each)."""
    p = sub.add_parser("run-ranks", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="+", metavar="CASE.json",
                   help="case file(s); several cases must imply the same world size and run in one launch")
    p.add_argument("--world", type=int, metavar="N",
                   help="number of processes; must equal attn_dp_size * attn_cp_size of the case (the default)")
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"),
                   help="torch.distributed backend: gloo (CPU, default) or nccl (one GPU per rank)")
    p.add_argument("--timeout-s", type=float, default=120.0, metavar="S",
                   help="wall-clock limit of the whole run in seconds (default 120); past it every rank is killed")
    p.add_argument("--out-dir", default=None, metavar="DIR",
                   help="where rank 0 writes verdict-N.json and the per-rank traces (default fa3verify-out/ranks, "
                        "or the first fa3verify-out/ranks/run-N free of earlier verdicts); a DIR holding earlier "
                        "verdicts is refused, never cleaned")
    from ..policy import add_guard_timeout_argument

    add_guard_timeout_argument(p)
    p.add_argument("--trust-case-guard", action="store_true",
                   help="run the guard a case file names even when it is code (a file or module)")
    p.add_argument("--metadata-only", action="store_true",
                   help="check metadata against each call (spec's invariants) without running the kernel")
    p.add_argument("--compare", action="store_true",
                   help="also run the in-process simulation and report any difference (exit 1)")
    p.add_argument("--json", metavar="PATH", help="write the run summary as JSON (schema fa3verify.run/1)")
    p.add_argument("--engine", default="model", metavar="ENGINE",
                   help=f"system under test (default model: one process per rank); a real engine "
                        f"({engine_phrase('in-process forms')}) runs the case in-process on it, and the output says so")
    p.add_argument("--inject-fault", metavar="RANK:KIND", help=argparse.SUPPRESS)  # tests: 1:exit:7, 1:raise
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the case files over real ranks and return the exit code (0 pass, 1 violation, 2 usage, 3 timeout)."""
    from .. import exitcodes
    from ..multirank import compare_with_simulation, load_case, resolve_world, run_ranks
    from ..finding_terms import print_backend_terms
    from ..summary import Check, RunSummary, write_json

    from ..engine_choice import parse_engine_option

    spec = parse_engine_option(args.engine)
    if not spec.plugin.runs_ranks_in_process(spec):  # a real engine's ranks run in its worker
        from ..engine_ranks import run_on_engine

        return run_on_engine(args)
    if args.world is not None and args.world < 1:
        raise UsageError(f"--world: must be >= 1, got {args.world}")
    if not args.timeout_s > 0:
        raise UsageError(f"--timeout-s: must be > 0, got {args.timeout_s}")
    cases = [load_case(path, trust_case_guard=args.trust_case_guard) for path in args.cases]
    numerics = not args.metadata_only
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.out_dir = args.out_dir or "fa3verify-out/ranks"  # every rank must name the same folder
        return _run_under_torchrun(args, cases, numerics)
    if args.out_dir is None:
        args.out_dir = fresh_dir("fa3verify-out/ranks", ("verdict-*.json", "error-rank-*.json"))
    resolve_world(cases, args.world)
    results = run_ranks(cases, world=args.world, backend=args.backend, timeout_s=args.timeout_s,
                        out_dir=args.out_dir, numerics=numerics, inject_fault=args.inject_fault)
    summary = RunSummary(command="run-ranks", cases=len(cases))
    codes = []
    for path, case, res in zip(args.cases, cases, results):
        code = res.exit_code
        _print_result(path, case, res)
        message = res.error or "; ".join(f"{f['invariant']} at step {f['step']} dp rank {f['dp_rank']}"
                                         for f in res.findings[:3]) or res.outcome
        if args.compare and res.outcome not in (Outcome.RANK_ERROR, Outcome.TIMEOUT):
            diffs = compare_with_simulation(case, res, numerics=numerics)
            if diffs:
                print("  DISAGREES with the in-process simulation:")
                for d in diffs[:10]:
                    print(f"    {d}")
                code = exitcodes.VIOLATION
                message = f"disagrees with the simulation: {diffs[0]}"
            else:
                print("  agrees with the in-process simulation (verdict, trace, outputs bitwise)")
        codes.append(code)
        summary.checks.append(Check(name=f"run-ranks {path}", kind="replay", verdict=exitcodes.verdict_name(code),
                                    seconds=res.elapsed_s, failed=code == exitcodes.VIOLATION,
                                    inconclusive=code == exitcodes.INCONCLUSIVE, case_file=path, message=message))
        if code == exitcodes.VIOLATION:
            summary.failures += 1
            found = rank_findings(path, res)
            if found:
                print_backend_terms(found[0])  # fa3verify.finding_terms
            summary.findings += found

    return deliver(exitcodes.combine(codes), [("--json", args.json, lambda: write_json(summary, args.json))],
                   "run-ranks")


def _print_result(path: str, case: dict, res) -> None:
    expected = case.get("expected") or {}
    print(f"case: {path}  ({res.world} ranks, {res.backend}, {res.elapsed_s:.1f}s)")
    if expected:
        print(f"  expected: {expected.get('outcome')}" + (f" ({expected['invariant']})" if expected.get("invariant")
                                                          else ""))
    print(f"  observed: {res.outcome}" + (f" -- {res.error}" if res.error else ""))
    for f in res.findings[:5]:
        print(f"  {f['invariant']} at step {f['step']}, dp rank {f['dp_rank']}: {f['message'][:160]}")
    if res.failing_ranks:
        print(f"  failing ranks: {res.failing_ranks}")
    if res.verdict_file:
        print(f"  verdict: {res.verdict_file}")


def _run_under_torchrun(args, cases, numerics: bool) -> int:
    """One rank of a torchrun job: run, and on rank 0 print and return the verdicts' exit code."""
    from pathlib import Path

    from gpu_impl.distributed import torchrun_main

    from .. import exitcodes
    from ..multirank import resolve_world

    world = int(os.environ["WORLD_SIZE"])
    need = resolve_world(cases, args.world)
    if world != need:
        raise UsageError(f"WORLD_SIZE: the case needs attn_dp_size * attn_cp_size = {need} ranks, "
                         f"torchrun started {world}")

    started = time.time()
    torchrun_main(cases, args.out_dir, backend=args.backend, numerics=numerics, timeout_s=args.timeout_s)
    if int(os.environ["RANK"]) != 0:
        return exitcodes.PASS
    codes = []
    for i, path in enumerate(args.cases):
        verdict_path = Path(args.out_dir) / f"verdict-{i}.json"
        if not verdict_path.is_file() or verdict_path.stat().st_mtime < started - 1:
            print(f"case: {path}: no verdict written by this run ({verdict_path}): inconclusive")
            codes.append(exitcodes.INCONCLUSIVE)  # an earlier run's verdict is never read as this one's
            continue
        verdict = json.loads(verdict_path.read_text(encoding="utf-8"))
        print(f"case: {path}  ({world} ranks, {args.backend}): {verdict['outcome']}")
        for f in verdict["findings"][:5]:
            print(f"  {f['invariant']} at step {f['step']}, dp rank {f['dp_rank']}: {f['message'][:160]}")
        codes.append(exitcodes.PASS if verdict["outcome"] == Outcome.PASS else exitcodes.VIOLATION)
    return exitcodes.combine(codes)


def rank_findings(path: str, res) -> list:
    """The summary findings of one run-ranks result, each in backend terms (``fa3verify.finding_terms``: one
    model run of the case per invariant, shared by the ranks' findings of that invariant)."""
    from ..finding_terms import apply_terms
    from ..finding_terms import run_ranks_terms
    from ..summary import Finding

    terms: dict = {}
    out = []
    for f in res.findings:
        inv = f["invariant"]
        if inv not in terms:
            terms[inv] = run_ranks_terms(path, inv, res.world, res.backend)
        out.append(apply_terms(Finding(invariant=inv, case_file=path, engine="run-ranks", message=f["message"]),
                               terms[inv], keep_message=True))
    return out
