"""fa3verify gate: prove + fuzz for a backend policy; the job a backend change runs in CI."""

from __future__ import annotations

import argparse

from ..engine_choice import add_engine_argument
from ..policy import add_policy_arguments

HELP = "prove and fuzz a backend policy; exit 0 only if both pass"
EPILOG = """\
The gate runs every theorem (z3) and a fuzz campaign for the policy, prints one table (theorem or
property, verdict, seconds, case file), writes JUnit XML and JSON if asked, and exits 0 pass,
1 violation, 2 bad input, 3 inconclusive.

--budget-s N is the fuzz stage's budget (as for `fuzz`: its cases, shrinking and case files end within N
seconds); the proofs run before it, each z3 query bounded by --timeout-s, and on a real engine so do the
witness replays. --cases N replaces it with a case count: same seed, byte-identical case files.

examples:
  fa3verify gate --guard mypkg.attention.backend:_should_disable_scheduler_metadata_precompute \\
                 --junit report.xml --json gate.json
  fa3verify gate --guard examples/guards/prefix_guard.py:should_disable      # exits 1
  fa3verify gate --guard pre-fix --metadata-heads attn_tp                    # exits 0
  fa3verify gate --engine sglang==0.5.14     # sglang 0.5.14's own backend: witnesses + fuzz on real code
  fa3verify gate --engine sglang-src=../sglang/python --json gate.json        # your checkout (see docs/engines.md)
  fa3verify gate --engine vllm==0.33.0       # vLLM's builder and impl: vllm-flow theorem + fuzz of family vllm
"""


def register(sub) -> None:
    p = sub.add_parser("gate", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_policy_arguments(p)
    add_engine_argument(p, help_extra="; a real engine needs no --guard (its guard is its own code)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--budget-s", type=float, metavar="N", help="fuzz stage budget in seconds, shrinking included (default 20)")
    group.add_argument("--cases", type=int, metavar="N", help="fuzz case count instead (no clock: the same case files on any machine)")
    p.add_argument("--seed", type=int, default=0, help="fuzz seed (default 0)")
    p.add_argument("--timeout-s", type=float, default=10.0, help="z3 timeout per query (default 10)")
    p.add_argument("--kernel", default="emulated", choices=("emulated", "fa3"), help="kernel adapter for fuzz")
    p.add_argument("--device", default="cpu", help="torch device for fuzz numerics")
    p.add_argument("--cases-dir", default="fa3verify-out/cases", metavar="DIR", help="where case files go")
    p.add_argument("--json", metavar="PATH", help="write the run summary as JSON (schema fa3verify.run/1)")
    p.add_argument("--junit", metavar="PATH", help="write JUnit XML for CI systems")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..engine_choice import sut_from_args
    from ..gating import gate
    from ..summary import write_reports
    from .fuzz import budget_from_args

    budget, cases = budget_from_args(args)
    with sut_from_args(args) as sut:  # the model is opened under the policy options (ModelSUT(policy=...))
        # the gate launches a real engine's worker beside its z3 stages; its start is a stage line of its own
        summary = gate(sut, budget_s=budget, seed=args.seed, timeout_s=args.timeout_s, cases_dir=args.cases_dir,
                       kernel_name=args.kernel, device=args.device, max_cases=cases)
    return write_reports(summary, args)
