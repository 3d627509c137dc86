"""fa3verify replay: reproduce a case file; exit 1 if it still fails as recorded, 0 if it now passes."""

from __future__ import annotations

import argparse

from ..engine_choice import add_engine_argument

HELP = "replay a case file and report whether it still fails"
EPILOG = """\
A case file (JSON, schema fa3verify.case/1, see docs/case-format.md) is written by every refuted theorem,
every distinct fuzz failure and every catalogue entry. Replay runs its scenario again through the backend model
(or a kernel-level case's FA3 call on the emulated kernel), with the seeded defects it names, and prints the
violated invariant, the batch and the offending indices.

examples:
  fa3verify replay tests/corpus/worked_example_prefix_guard.json
  fa3verify replay CASE.json --guard fixed          # does the fixed guard make it pass?
  fa3verify replay CASE.json --without-defects      # does it pass without its seeded defects?
  fa3verify replay CASE.json --kernel fa3 --device cuda
  fa3verify replay CASE.json --engine sglang==0.5.23   # on real release code (default: the case's engine)
"""


def register(sub) -> None:
    p = sub.add_parser("replay", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("case", metavar="CASE.json", help="the case file to replay")
    p.add_argument("--kernel", choices=("emulated", "fa3"), help="kernel adapter (default: the case's)")
    p.add_argument("--device", default="cpu", help="torch device for tensors (default cpu; cuda for fa3)")
    p.add_argument("--guard", metavar="SPEC", help="override the case's guard (fixed, pre-fix, none, module:fn)")
    p.add_argument("--metadata-heads", choices=("tp", "attn_tp"), help="override the case's metadata heads")
    p.add_argument("--numerics", action="store_true", help="run the kernel on tensors even for the emulator")
    p.add_argument("--without-defects", action="store_true",
                   help="replay without the seeded defects the case's `defects` field names (does the fix pass?)")
    from ..policy import add_guard_timeout_argument

    add_guard_timeout_argument(p)
    p.add_argument("--trust-case-guard", action="store_true",
                   help="run the guard the case file names even when it is your own code (file or module); "
                        "without it a case file can only name fixed, pre-fix, none or this project's guards")
    p.add_argument("--json", metavar="PATH", help="write the run summary as JSON")
    add_engine_argument(p, default=None, help_extra="; default: the engine the case file names (none: model)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..replaying import replay
    from ..summary import finding_sentence, write_json

    summary, observed = replay(args.case, kernel_name=args.kernel, device=args.device, guard=args.guard,
                               metadata_heads=args.metadata_heads, numerics=True if args.numerics else None,
                               trust_case_guard=args.trust_case_guard, engine=args.engine,
                               defects=() if args.without_defects else None)
    print(f"case: {args.case}")
    if observed.ran_on:
        print(f"replayed on {observed.ran_on}")
    print(f"expected: {observed.expected_outcome}"
          + (f" ({observed.expected_invariant})" if observed.expected_invariant else ""))
    print(f"observed: {observed.outcome}" + (f" ({', '.join(observed.invariants)})" if observed.invariants else ""))
    for f in observed.findings[:5]:
        detail = f.detail or {}
        where = f"step {f.step}, dp rank {f.dp_rank}"
        extra = {k: detail[k] for k in ("batch", "indices", "s_p", "s_c") if k in detail}
        print(f"  {f.invariant} at {where}: {f.message}" + (f" {extra}" if extra else ""))
    if summary.findings:
        first = summary.findings[0]
        sentence = finding_sentence(first)
        if sentence:
            print(f"  in backend terms: {sentence}")
        for token, meaning in first.config_terms or []:
            print(f"    {token}: {meaning}")
        for side in ("precompute", "call"):
            if (first.source or {}).get(side):
                print(f"  {side} made in: {first.source[side]}")
        if first.hint:
            print(f"  fix: {first.hint}")
    if observed.outcome == "not-modelled":
        print(f"verdict: INCONCLUSIVE ({summary.checks[0].message})")
    else:
        print(f"verdict: {observed.verdict}")
    from ..output_writer import deliver

    return deliver(summary.exit_code, [("--json", args.json, lambda: write_json(summary, args.json))], "replay")
