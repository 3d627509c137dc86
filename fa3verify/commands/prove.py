"""fa3verify prove: z3 theorems about reusing FA3 scheduler metadata, for one backend policy.

`prove`: run spec's z3 theorems for a policy and collect them into a RunSummary.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Iterable, Optional

from spec.finding import TheoremVerdict
from gpu_impl.plugin import release_spec

from ..engine_choice import add_engine_argument, add_profile_argument
from ..errors import UsageError
from ..finding_terms import WITNESS_SUBDIR, apply_terms, case_file_terms, hint_for, replay_line
from ..policy import add_policy_arguments, load_policy, Policy
from ..summary import Check, Finding, RunSummary, write_reports
from .arguments import with_engine_examples


#: The theorem about a fork's CP decode over sharded KV (docs/facts-fa3.md section 1, second path). It is a safety theorem
#: only for a backend that has that path (--cp-decode-sharded-kv); otherwise its refutation is reported, not failed.
SHARDED_KV_THEOREM = "sharded-kv-decode"


def theorem_jobs(policy: Policy, timeout_s: float = 10.0, cases_dir: Optional[str] = None,
                 only: Optional[Iterable[str]] = None, dropped_assumptions: Iterable[str] = ()) -> list:
    """Every theorem of spec for this policy as jobs (spec.theorems.jobs), in catalogue order."""
    from spec.theorems import ProveRequest, jobs_for

    return jobs_for(ProveRequest(guard=policy.guard, metadata_heads=policy.metadata_heads, guard_spec=policy.guard_spec,
                                 clear_stale_cp_metadata=policy.clear_stale_cp_metadata, timeout_s=timeout_s,
                                 cases_dir=cases_dir, only=tuple(only) if only else None,
                                 dropped_assumptions=frozenset(dropped_assumptions)))


def run_theorems(policy: Policy, timeout_s: float = 10.0, cases_dir: Optional[str] = None,
                 only: Optional[Iterable[str]] = None, dropped_assumptions: Iterable[str] = (),
                 jobs: Optional[int] = None):
    """The theorems run on `jobs` worker processes (None: every CPU; 1: in this process): a spec JobRun.

    What the metadata theorems' replays import (spec.invariants: refmodel in plain ints, no torch, 0.02 s) is
    loaded here once, so forked workers share it; no part waits for a preload, the longest start first.
    """
    import spec.invariants  # noqa: F401
    from spec.theorems.jobs import default_workers, run_jobs
    from spec.theorems.pool import part_deadline_s

    try:
        deadline = part_deadline_s()  # read once: a bad value is a usage error before any part runs
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    workers = default_workers() if jobs is None else int(jobs)
    return run_jobs(theorem_jobs(policy, timeout_s, cases_dir, only, dropped_assumptions), workers=workers,
                    part_deadline_s=deadline)


def theorem_results(policy: Policy, timeout_s: float = 10.0, cases_dir: Optional[str] = None,
                    only: Optional[Iterable[str]] = None, dropped_assumptions: Iterable[str] = (),
                    jobs: Optional[int] = None) -> list:
    """All TheoremResults of spec for this policy: metadata (1-4), combine algebra (5), CP (6-7), FA3's int edges (8),
    the engine fork's tile choice (9).

    The same results, witness for witness, whatever `jobs` is (each theorem part runs in its own z3 context).
    Each result carries `finished_s` (not a field: it is not reported), when it was known since this call.
    """
    start = time.perf_counter()
    run = run_theorems(policy, timeout_s, cases_dir, only, dropped_assumptions, jobs)
    before = time.perf_counter() - start - run.elapsed_s  # building the jobs, before the run's clock started
    for r, at in zip(run.results, run.finished_s):
        r.finished_s = before + at  # unrounded: never past the run it belongs to (reports round it)
    return run.results


def prove(policy: Policy, timeout_s: float = 10.0, cases_dir: Optional[str] = None,
          only: Optional[Iterable[str]] = None, dropped_assumptions: Iterable[str] = (),
          jobs: Optional[int] = None) -> RunSummary:
    """Run the theorems and summarise: a refuted safety theorem fails, an unknown is inconclusive.

    `jobs` worker processes prove independent theorems side by side (None: every CPU this process may use; 1:
    one after another in this process); the results and their order do not depend on it. `first_failure_s` is
    when the first failing theorem's verdict was known, counted from the start of the run.
    """
    start = time.perf_counter()
    summary = RunSummary(command="prove", policy=policy.to_dict())
    solver_time = 0.0  # without `finished_s` (a stand-in theorem_results): in order, after the time before it
    extra = {} if jobs is None else {"jobs": jobs}
    for r in theorem_results(policy, timeout_s, cases_dir, only, dropped_assumptions, **extra):
        solver_time += r.seconds
        failed = bool(r.failed or (not r.expected and not r.inconclusive))
        if r.name == SHARDED_KV_THEOREM and not policy.cp_decode_sharded_kv and failed:
            failed = False
            r.message = (f"not applicable to this backend (no sharded-KV CP decode; see --cp-decode-sharded-kv): "
                         f"{r.message or r.summary()}")
        summary.checks.append(Check(name=r.name, kind="theorem", verdict=r.verdict, seconds=r.seconds,
                                    failed=failed, inconclusive=r.inconclusive, case_file=r.case_file,
                                    message=r.message or r.summary(),
                                    expected=expected_refutation(r, failed)))
        if failed and r.verdict == TheoremVerdict.REFUTED:
            invariant = str((r.witness or {}).get("invariant", r.name))
            finding = Finding(invariant=invariant, case_file=r.case_file, engine="prove", message=r.summary(),
                              replay=replay_line(r.case_file, policy.guard_spec), check=r.name)
            if r.case_file:
                finding = apply_terms(finding, case_file_terms(r.case_file, policy.guard_spec, invariant))
            summary.findings.append(finding)
            at = getattr(r, "finished_s", solver_time)
            if summary.first_failure_s is None or at < summary.first_failure_s:
                summary.first_failure_s = at
    move_witnesses(summary, cases_dir)
    summary.elapsed_s = time.perf_counter() - start
    return summary


def expected_refutation(r, failed: bool) -> str:
    """Why a refuted theorem is not a failure under this policy ('' when it is one, or not refuted)."""
    if r.verdict != TheoremVerdict.REFUTED or failed:
        return ""
    if r.name == SHARDED_KV_THEOREM:
        return "not applicable to this backend (no sharded-KV CP decode); its witness is informational"
    return ("the policy under test predicts this witness (a hazard its guard covers, or a drift the metadata "
            "cannot absorb); informational, not a violation")


def move_witnesses(summary: RunSummary, cases_dir: Optional[str]) -> None:
    """Case files of rows whose refutation is expected move to ``cases_dir/witnesses/`` (kept, but apart from the
    failures): a passing run leaves no case file that looks like a failure. A file a failed row also names stays."""
    if not cases_dir:
        return
    failing = {c.case_file for c in summary.checks if c.failed and c.case_file}
    moved: dict = {}
    for c in summary.checks:
        if not (c.expected and c.case_file) or c.case_file in failing:
            continue
        if c.case_file not in moved and os.path.isfile(c.case_file):
            target = os.path.join(os.path.dirname(c.case_file), WITNESS_SUBDIR, os.path.basename(c.case_file))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(c.case_file, target)
            moved[c.case_file] = target
        c.case_file = moved.get(c.case_file, c.case_file)


def prove_flow(spec, profile, timeout_s: float = 10.0, cases_dir: Optional[str] = None) -> RunSummary:
    """``prove --engine-profile ENGINE==V`` for an engine with a theorem of its own (``spec``'s plugin's
    ``flow_theorem``): that theorem under the release's profile.

    A refutation is a failed check with its counterexample, written as a case file into ``cases_dir`` (replayable
    on ``ENGINE==V``: the plugin's ``flow_results``); an unknown is inconclusive.
    """
    plugin = spec.plugin
    start = time.perf_counter()
    summary = RunSummary(command="prove", policy={"engine_profile": plugin.release_text(profile.release),
                                                 **profile.to_dict()})
    for r in plugin.flow_results(profile, timeout_s=timeout_s, cases_dir=cases_dir):
        failed = bool(r.failed or (not r.expected and not r.inconclusive))
        summary.checks.append(Check(name=r.name, kind="theorem", verdict=r.verdict, seconds=r.seconds,
                                    failed=failed, inconclusive=r.inconclusive, case_file=r.case_file,
                                    message=r.message or r.summary(), expected=expected_refutation(r, failed)))
        if failed and r.verdict == TheoremVerdict.REFUTED:
            invariant = str(r.witness.get("invariant", r.name))
            summary.findings.append(Finding(invariant=invariant, case_file=r.case_file, engine="prove",
                                            message=r.message, replay=replay_line(r.case_file), check=r.name,
                                            ran_on=plugin.flow_ran_on(profile),
                                            hint=hint_for(invariant)))
            if summary.first_failure_s is None:
                summary.first_failure_s = r.seconds
    summary.elapsed_s = time.perf_counter() - start
    return summary


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
{prove.profile}{prove.engine}"""


def register(sub) -> None:
    p = sub.add_parser("prove", help=HELP, description=HELP, epilog=with_engine_examples(EPILOG),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_policy_arguments(p)
    add_profile_argument(p)
    add_engine_argument(p, help_extra="; each refuted theorem's witness is also replayed on it")
    p.add_argument("--only", action="append", metavar="NAME",
                   help="run only theorems whose name contains NAME, of family NAME (--only 2), or with the "
                        "former id NAME (--only 3-hazard; docs/invariants.md lists them) (repeatable), e.g. "
                        "--only freshness")
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
    from ..engine_choice import profile_proof_of

    if not args.timeout_s > 0:
        raise UsageError(f"--timeout-s: must be > 0, got {args.timeout_s}")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs: must be >= 1, got {args.jobs}")
    return PROFILE_PROOFS[profile_proof_of(args)](args)


def _prove_policy(args) -> int:
    """The theorems under the policy options or a profile the model plays, each refutation's witness replayed on
    ``--engine`` when it names a real engine."""
    from ..engine_choice import open_engine, parse_engine_option, profile_policy_args, start_engine
    from ..engine_gate import replay_witnesses
    from ..progress import stage

    guard, heads, profile = profile_policy_args(args)
    policy = load_policy(guard, heads, args.keep_stale_cp_metadata, args.cp_decode_sharded_kv)
    check_assumptions(args.drop_assumption)
    check_only(args.only)
    spec = parse_engine_option(args.engine)
    dropped = list(args.drop_assumption)
    facts = None
    if profile is not None:
        print(f"engine profile: {profile.describe()}")
        facts, released_drops = _release_assumptions(args.engine_profile, profile.release)
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


def _prove_flow(args) -> int:
    """``--engine-profile ENGINE==V`` of an engine with a theorem of its own: that theorem; the model policy's
    options are refused (exit 2)."""
    from ..engine_choice import DEFAULT_ENGINE, flow_profile_arg
    from ..progress import stage

    spec, profile = flow_profile_arg(args)
    plugin = spec.plugin
    for option, given in (("--drop-assumption", args.drop_assumption), ("--only", args.only),
                          ("--engine", args.engine not in (None, DEFAULT_ENGINE))):
        if given:
            raise UsageError(f"{option}: does not apply to --engine-profile {plugin.release_text(profile.release)} "
                             f"(one theorem, {plugin.flow_theorem}; a counterexample is written into --cases-dir "
                             f"and replays on {plugin.release_text('V')})")
    print(f"engine profile: {profile.describe()}")
    with stage("prove", f"prove ({plugin.phrase('name')} flow)"):
        summary = prove_flow(spec, profile, timeout_s=args.timeout_s, cases_dir=args.cases_dir)
    return write_reports(summary, args)


#: how prove runs, by the answer of the profile's engine (``EnginePlugin.profile_proof``)
PROFILE_PROOFS = {"model-policy": _prove_policy, "flow-theorem": _prove_flow}


def _release_assumptions(text: str, release: str) -> tuple:
    """(facts, prover assumptions to drop) of the release ``--engine-profile`` names (its engine's
    ``assumption_facts``, spec/model/assumption_facts.json), printed: which assumptions the release enforces, which
    it does not, and what the prover therefore drops."""
    from spec.model.assumption_facts import enforced, not_enforced, prover_drops

    spec = release_spec(text)
    facts = spec.plugin.assumption_facts(release)
    drops = prover_drops(facts)
    name = spec.kind
    print(f"assumptions {name} {release} enforces: {', '.join(enforced(facts)) or 'none'}")
    print(f"assumptions {name} {release} does not enforce: {', '.join(not_enforced(facts)) or 'none'}; "
          f"the prover drops: {', '.join(sorted(drops)) or 'nothing'}")
    return facts, drops


def check_assumptions(names) -> None:
    from spec.model.domain import assumption_name_error

    message = assumption_name_error(names, "--drop-assumption")
    if message:
        raise UsageError(message)


def check_only(only) -> None:
    """Every --only NAME must select at least one theorem (spec.theorems.select): else exit 2 listing them."""
    from spec.theorems import THEOREMS, select

    for name in only or []:
        if not select([name], list(THEOREMS), lambda t: THEOREMS[t].number):
            raise UsageError(f"--only: {name!r} matches no theorem; names (or a family number, part of a name, or a former id such as 3-hazard): "
                             f"{', '.join(THEOREMS)}")
