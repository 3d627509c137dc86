"""fa3verify prove: z3 theorems about reusing FA3 scheduler metadata, for one backend policy."""

from __future__ import annotations

import argparse

from ..engine_choice import add_engine_argument, add_profile_argument
from ..policy import add_policy_arguments, load_policy
from ..summary import write_reports

HELP = "prove the metadata invariants and guard theorems with z3"
EPILOG = """\
Each theorem is a bounded z3 query with a fixed seed. A query is bounded by work, not by the clock
(--timeout-s N buys N * 10M of z3's resource units, with a wall-clock deadline of 3N s), so the same
run gives the same answers on a quiet and on a loaded machine. A query that runs out is reported as
inconclusive (exit 3), never as proved. Every refuted theorem writes a replayable case file.

examples:
  fa3verify prove                                   # fixed guard: every theorem has its expected verdict
  fa3verify prove --guard pre-fix                   # hazard found, guard soundness refuted: exit 1
  fa3verify prove --guard pre-fix --metadata-heads attn_tp   # root-cause fix: exit 0
  fa3verify prove --only hazard --json prove.json --cases-dir cases/
  fa3verify prove --drop-assumption ASSUMPTION_TP_DIVISIBLE
  fa3verify prove --engine-profile sglang==0.5.14   # that release's heads and guard: refuted (exit 1)
  fa3verify prove --engine-profile sglang==0.5.17   # drops what 0.5.17 does not enforce: refuted (exit 1)
  fa3verify prove --engine-profile vllm==0.33.0     # vLLM's flow (heads, KV extents, split counts): proved
  fa3verify prove --guard pre-fix --engine sglang==0.5.23   # witnesses replayed on 0.5.23's own code
"""


def register(sub) -> None:
    p = sub.add_parser("prove", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_policy_arguments(p)
    add_profile_argument(p)
    add_engine_argument(p, help_extra="; each refuted theorem's witness is also replayed on it")
    p.add_argument("--only", action="append", metavar="NAME",
                   help="run only theorems whose name contains NAME (repeatable), e.g. --only freshness")
    p.add_argument("--timeout-s", type=float, default=10.0, metavar="N",
                   help="the work one z3 query may do, in seconds of a quiet core (default 10): N * 10M resource "
                        "units, and a wall-clock deadline of 3N s; running out is inconclusive")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="worker processes proving theorems side by side (default: one per CPU; 1: in this "
                        "process); results and witnesses do not depend on it")
    p.add_argument("--drop-assumption", action="append", default=[], metavar="NAME",
                   help="re-check without a configuration-domain assumption; a witness shows where a guard "
                        "then fails (names: see docs/invariants.md)")
    p.add_argument("--cases-dir", default="fa3verify-out/cases", metavar="DIR",
                   help="where refuted theorems write case files (default fa3verify-out/cases)")
    p.add_argument("--json", metavar="PATH", help="write the run summary as JSON (schema fa3verify.run/1)")
    p.add_argument("--junit", metavar="PATH", help="write JUnit XML for CI systems")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import UsageError
    from ..progress import stage
    from ..proving import prove

    if not args.timeout_s > 0:
        raise UsageError(f"--timeout-s: must be > 0, got {args.timeout_s}")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs: must be >= 1, got {args.jobs}")
    from ..engine_choice import open_engine, parse_engine_option, profile_policy_args, start_engine
    from ..engine_gate import replay_witnesses

    from ..engine_choice import vllm_profile_arg

    vprofile = vllm_profile_arg(args)
    if vprofile is not None:
        return _prove_vllm(args, vprofile)
    guard, heads, profile = profile_policy_args(args)
    policy = load_policy(guard, heads, args.keep_stale_cp_metadata, args.cp_decode_sharded_kv)
    check_assumptions(args.drop_assumption)
    check_only(args.only)
    spec = parse_engine_option(args.engine)
    dropped = list(args.drop_assumption)
    facts = None
    if profile is not None:
        print(f"engine profile: {profile.describe()}")
        facts, released_drops = _release_assumptions(profile.release)
        dropped += [n for n in sorted(released_drops) if n not in dropped]
    with stage("prove", "prove (z3 theorems)"):
        summary = prove(policy, timeout_s=args.timeout_s, cases_dir=args.cases_dir, only=args.only,
                        dropped_assumptions=dropped, jobs=args.jobs)
    if facts is not None:
        from spec.model.assumption_facts import enforced, not_enforced

        summary.policy.update(enforced_assumptions=enforced(facts), not_enforced_assumptions=not_enforced(facts),
                              dropped_assumptions=dropped)
    if "witnesses" in spec.plugin.proof_stages(spec):  # the model's witnesses are its own runs already
        with open_engine(spec) as sut:
            start_engine(sut, "prove")
            with stage("prove", f"witnesses replayed on {spec}"):
                checks, findings = replay_witnesses(sut, [c.case_file for c in summary.checks if c.failed],
                                                    args.cases_dir)
        summary.checks.extend(checks)
        summary.findings.extend(findings)
    return write_reports(summary, args)


def _prove_vllm(args, profile) -> int:
    """``--engine-profile vllm==V``: the vLLM flow theorem; sglang-only options are refused (exit 2)."""
    from ..engine_choice import DEFAULT_ENGINE
    from ..errors import UsageError
    from ..progress import stage
    from ..proving import prove_vllm

    for option, given in (("--drop-assumption", args.drop_assumption), ("--only", args.only),
                          ("--engine", args.engine not in (None, DEFAULT_ENGINE))):
        if given:
            raise UsageError(f"{option}: does not apply to --engine-profile vllm=={profile.release} (one theorem, "
                             f"vllm-flow; a counterexample is written into --cases-dir and replays on vllm==V)")
    print(f"engine profile: {profile.describe()}")
    with stage("prove", "prove (vLLM flow)"):
        summary = prove_vllm(profile, timeout_s=args.timeout_s, cases_dir=args.cases_dir)
    return write_reports(summary, args)


def _release_assumptions(release: str) -> tuple:
    """(facts, prover assumptions to drop) of sglang ``release`` (spec/model/assumption_facts.json), printed: which
    assumptions the release enforces, which it does not, and what the prover therefore drops."""
    from spec.model.assumption_facts import enforced, facts_for, not_enforced, prover_drops

    facts = facts_for("sglang", release)
    drops = prover_drops(facts)
    print(f"assumptions sglang {release} enforces: {', '.join(enforced(facts)) or 'none'}")
    print(f"assumptions sglang {release} does not enforce: {', '.join(not_enforced(facts)) or 'none'}; "
          f"the prover drops: {', '.join(sorted(drops)) or 'nothing'}")
    return facts, drops


def check_assumptions(names) -> None:
    from ..errors import UsageError
    from spec.model.domain import assumption_name_error

    message = assumption_name_error(names, "--drop-assumption")
    if message:
        raise UsageError(message)


def check_only(only) -> None:
    """Every --only NAME must select at least one theorem (spec.theorems.select): else exit 2 listing them."""
    from ..errors import UsageError
    from spec.theorems import THEOREMS, select

    for name in only or []:
        if not select([name], list(THEOREMS), lambda t: THEOREMS[t].number):
            raise UsageError(f"--only: {name!r} matches no theorem; names (or a number or part of a name): "
                             f"{', '.join(THEOREMS)}")
