"""fa3verify fuzz: differential fuzzing of the backend model across randomized CP/DP configurations."""

from __future__ import annotations

import argparse

from ..engine_choice import add_engine_argument
from ..policy import add_policy_arguments
from ..sharding import add_shard_argument

HELP = "fuzz the backend under a policy against the oracle"
EPILOG = """\
Cases are generated from a seed (same seed, same cases, in any process): server configurations (tp 1..8,
DP attention, prefill CP, split policy, CUDA graph, SM counts of real GPUs), real model shapes, and batch
sequences (skewed decode batches, prefix-cache prefills, CP-v2 extends, MIXED batches). Each distinct
violation is shrunk and saved once as a case file in --cases-dir (--out is its older name, still accepted).

Budgets: --budget-s N covers the whole fuzz stage -- running cases, shrinking each failure, writing case files
and reports -- loading the kernel included (process start-up and an engine's worker start are not counted;
the cases get at least half of N); a case is not started when its expected cost would pass N, and a failure
that cannot be shrunk in time is saved partially shrunk (its finding says so). How many cases fit depends on
the machine. --cases N reads no clock: the campaign runs N draws and each shrinking a bounded number of steps,
so the same --cases N --seed S writes byte-identical case files on any machine.

examples:
  fa3verify fuzz --budget-s 20                       # fixed guard, emulated kernel, 20 s
  fa3verify fuzz --guard pre-fix --cases 2000 --seed 7 --json fuzz.json
  fa3verify fuzz --kernel fa3 --device cuda --budget-s 120   # real FA3 on a GPU box
  fa3verify fuzz --engine sglang==0.5.14 --cases 200         # sglang 0.5.14's own backend (no --guard)
  fa3verify fuzz --engine vllm==0.33.0 --cases 2000          # vLLM's builder and impl, family vllm
  fa3verify fuzz --cases 20000 --shard 2/4 --json s2.json    # one CI job of four; join: `report merge`
"""


def register(sub) -> None:
    p = sub.add_parser("fuzz", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_policy_arguments(p)
    add_engine_argument(p)
    p.add_argument("--kernel", default="emulated", choices=("emulated", "fa3"),
                   help="kernel adapter: CPU emulation of FA3 (default) or the real FA3 build")
    p.add_argument("--device", default="cpu", help="torch device (default cpu; use cuda with --kernel fa3)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--budget-s", type=float, metavar="N", help="time budget of the fuzz stage, shrinking and reports included (default 20)")
    group.add_argument("--cases", type=int, metavar="N",
                       help="run N cases instead (no clock: the same case files on any machine)")
    p.add_argument("--seed", type=int, default=0, help="generation seed (default 0)")
    add_shard_argument(p)
    add_cases_dir_argument(p)
    p.add_argument("--json", metavar="PATH", help="write the run summary as JSON (schema fa3verify.run/1)")
    p.add_argument("--junit", metavar="PATH", help="write JUnit XML")
    p.set_defaults(func=run)


def add_cases_dir_argument(p) -> None:
    """``--cases-dir DIR``, the case folder's name in every command; ``--out DIR`` is kept as its hidden older name
    (its own dest, so a bad path is named as typed)."""
    names = p.add_mutually_exclusive_group()
    names.add_argument("--cases-dir", default=None, metavar="DIR",
                       help="where failing cases are saved (default fa3verify-out/cases; --out DIR is an older name)")
    names.add_argument("--out", default=None, metavar="DIR", help=argparse.SUPPRESS)


def cases_dir_of(args) -> str:
    """The case folder ``--cases-dir`` (or its older name ``--out``) names."""
    return args.cases_dir or args.out or "fa3verify-out/cases"


def budget_from_args(args, default_budget: float = 20.0):
    """(budget_s, max_cases) from --budget-s/--cases, validated."""
    from ..errors import UsageError

    if args.cases is not None:
        if args.cases < 1:
            raise UsageError(f"--cases: must be >= 1, got {args.cases}")
        return None, args.cases
    budget = default_budget if args.budget_s is None else args.budget_s
    if not budget > 0:  # NaN too (fa3verify.validation checks the range first)
        raise UsageError(f"--budget-s: must be > 0, got {budget}")
    return budget, None


def run(args) -> int:
    from ..engine_choice import start_engine, sut_from_args
    from ..fuzzing import fuzz
    from ..policy import load_policy
    from ..progress import stage
    from ..summary import RunSummary, write_reports

    from ..sharding import check_cases, parse_shard

    budget, cases = budget_from_args(args)
    shard = parse_shard(args.shard)
    check_cases(shard, cases)
    policy = load_policy(args.guard, args.metadata_heads, args.keep_stale_cp_metadata, args.cp_decode_sharded_kv)
    try:
        with sut_from_args(args, policy) as sut:  # the model is opened under the policy options (ModelSUT(policy=...))
            start_engine(sut, "fuzz")  # its own line: the worker's start-up is not part of the fuzz budget
            with stage("fuzz", f"fuzz ({args.kernel} kernel, {f'{cases} cases' if cases else f'{budget:g} s'}"
                               f"{f', shard {shard}' if shard else ''})",
                       result=lambda: f"{summary.cases} cases, {summary.failures} failing") as end:
                summary = fuzz(sut, kernel_name=args.kernel, device=args.device, seed=args.seed,
                               budget_s=budget, max_cases=cases, out_dir=cases_dir_of(args), shard=shard)
                if end is not None:  # a stand-in stage may hand the block nothing
                    end.interrupted = summary.interrupted
    except KeyboardInterrupt:  # before the campaign began: nothing found, the reports still say so (exit 3)
        summary = RunSummary(command="fuzz", seed=args.seed, policy=policy.to_dict(), interrupted=True)
    if shard is not None:
        summary.shard = shard.to_dict({"command": "fuzz", "seed": args.seed, "cases": cases, "budget_s": budget,
                                       "kernel": args.kernel, "engine": args.engine, "policy": summary.policy})
    return write_reports(summary, args)
