"""fa3verify fuzz: differential fuzzing of the backend model across randomized CP/DP configurations.

The loop is the one campaign (:func:`fa3verify.campaign.run_campaign`) over the strategy family ``scenario``
(:mod:`fa3verify.strategies`), seeded, so the same seed gives the same cases. Each scenario runs on a system
under test (`gpu_impl.sut`: the model by default, or real engine code chosen with `--engine`) behind
:class:`ScenarioTarget`: metadata-level checks (spec's invariants) for every decode call, and, for numerics
cases, the kernel adapter against the float64 oracle under FA3's tolerance rule. The first failure of each
distinct violation signature is shrunk (fa3verify.shrinking) and saved as a case file (fa3verify.case_files);
later failures with a known signature are counted, not saved again.

Budgets. ``max_cases`` (``--cases N``) bounds the campaign by draws and each shrinking by steps
(:data:`fa3verify.shrinking.MAX_SHRINK_STEPS`), so the same seed saves byte-identical case files on any machine.
``budget_s`` (``--budget-s N``) bounds the whole stage -- loading the kernel adapter (torch's import, about a
second), the campaign, shrinking every distinct failure and writing its case file, and the summary -- to N
seconds; only an engine worker's start is not counted (it is a stage of its own, and usually started before).
The campaign gets what is left of N once the kernel is loaded, and never less than half of N
(:data:`MIN_CAMPAIGN_SHARE`). Each new failure is shrunk when the campaign finds it, so shrinking takes the time
it needs, no more; no case and no shrinking step is started when the clock plus its expected cost would pass N
less :data:`FINISH_SHARE` of N (kept for writing). A failure that could not be shrunk to its end in time is saved
as far as it got, and its finding says "shrunk partially".
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Callable, Optional

from spec.finding import Outcome, Verdict

from ..campaign import (Budget, Campaign, Failure, now, Observation, run_campaign as _run_campaign, shrink_failure,
    single_threaded_torch)
from ..case_files import scenario_case
from .arguments import add_cases_dir_argument, budget_from_args, cases_dir_of, with_engine_examples
from ..engine_choice import add_engine_argument, case_policy, identity_of
from ..errors import UsageError
from ..finding_terms import apply_terms, replay_line, run_terms
from ..judge import judge
from ..policy import add_policy_arguments, load_policy, Policy
from ..sharding import add_shard_argument, check_cases, parse_shard
from ..summary import Check, RunSummary, write_reports

if TYPE_CHECKING:  # the strategies load spec's domain (0.1 s): not at the command line's start
    from ..strategies import FuzzCase


__all__ = ["ScenarioTarget", "scenario_for", "evaluate", "run_campaign", "shrink", "save_case", "fuzz",
           "single_threaded_torch", "Campaign", "Failure", "FINISH_SHARE"]

#: Of a time budget, the part kept at its end for writing the case files and the reports (measured: 0.05 s for
#: four case files, the JSON summary and JUnit XML; 2 % of a 5 s budget is 0.1 s).
FINISH_SHARE = 0.02


def scenario_for(case: FuzzCase, policy: Policy, defects=frozenset()):
    """The gpu_impl Scenario a generated case describes, under the policy being tested (and seeded defects)."""
    from gpu_impl.scenario import Scenario, Step

    return Scenario(server=case.server, model=case.model, guard=policy.guard, guard_spec=policy.guard_spec,
                    steps=[Step(**s) for s in case.steps], metadata_heads=policy.metadata_heads,
                    clear_stale_cp_metadata=policy.clear_stale_cp_metadata, seed=case.seed,
                    defects=frozenset(defects), graph_replay_seqlen_k=policy.graph_replay_seqlen_k,
                    fa3_build=policy.fa3_build,
                    options=dict(case.options))


def evaluate(case: FuzzCase, policy: Policy, kernel, numerics_always: bool = False, sut=None,
             defects=frozenset(), crash_is_finding: bool = False) -> Optional[Observation]:
    """Run one case on the system under test (default: the model) under the policy and seeded defects, judged by
    :func:`fa3verify.judge.judge` (guard faults, FA3 aborts and, with ``crash_is_finding``, crashes are findings).

    The observation carries the verdict's findings; None when the engine cannot run the scenario.
    """
    from gpu_impl.domain import reached_paths

    verdict = judge(sut, scenario_for(case, policy, defects), kernel=kernel,
                    numerics=numerics_always or case.numerics, crash_is_finding=crash_is_finding)
    if verdict.unsupported:
        return None
    return Observation.of(verdict, reached=tuple(sorted(reached_paths(verdict.trace))))


class ScenarioTarget:
    """A scenario system under test (``gpu_impl.sut``: the model or a real engine) under a policy and seeded
    defects, as the campaign drives it: ``observe(FuzzCase) -> Observation | None``."""

    def __init__(self, policy: Policy, kernel=None, numerics_always: bool = False, sut=None, defects=frozenset(),
                 crash_is_finding: bool = False):
        self.policy, self.kernel, self.numerics_always, self.sut = policy, kernel, numerics_always, sut
        self.defects, self.crash_is_finding = frozenset(defects), crash_is_finding

    def observe(self, case: FuzzCase) -> Optional[Observation]:
        return evaluate(case, self.policy, self.kernel, self.numerics_always, sut=self.sut, defects=self.defects,
                        crash_is_finding=self.crash_is_finding)


def run_campaign(policy: Policy, kernel, seed: int = 0, budget_s: Optional[float] = 20.0,
                 max_cases: Optional[int] = None, numerics_always: bool = False,
                 progress: Optional[Callable[[Campaign], None]] = None,
                 stop_at_first_failure: bool = False, sut=None, defects=frozenset(),
                 strategy: Optional[str] = None, clock: Optional[Callable[[], float]] = None,
                 reserve: Optional[Callable[[Campaign], float]] = None,
                 on_failure: Optional[Callable[[Campaign, Failure], None]] = None, shard=None,
                 domain=None) -> Campaign:
    """The campaign of `fuzz`: a strategy family, or by default the system under test's own domain
    (``sut.domain()``, ``strategies.domain_strategy``: the model's is ``scenario``, an engine's a family of its
    own or its release's own accepted configurations; ``domain`` passes one already made) on the system under test
    (default: the model) under ``policy`` and seeded ``defects``, until the budget or the case count is reached
    (always bounded: see :class:`fa3verify.campaign.Budget`); ``strategy``: a family name or several
    (``strategies.families_strategy``: each draw from one of them); ``clock``, ``reserve``, ``on_failure`` and ``shard``
    as in
    :func:`fa3verify.campaign.run_campaign`."""
    from gpu_impl.engines.model.sut import ModelSUT

    from ..strategies import domain_strategy, families_strategy

    budget = Budget(seconds=budget_s, cases=max_cases).validate()
    if sut is not None:
        sut.spec.plugin.check_defects(sut.spec, defects)  # ValueError naming them where its driver applies none
    target = ScenarioTarget(policy, kernel, numerics_always, sut, defects=defects)
    if strategy:
        generate = families_strategy(strategy)
    else:
        domain = domain if domain is not None else (sut or ModelSUT()).domain()
        if shard is not None and domain.adapts:
            raise UsageError(f"--shard: {domain.name}'s domain weights each draw by what the earlier cases "
                             f"reached, so a shard cannot run its part of the unsplit campaign; run this campaign "
                             f"unsplit (--shard splits campaigns whose domain does not adapt)")
        generate = domain_strategy(domain)
    return _run_campaign(target, generate, budget=budget, seed=seed, progress=progress,
                         stop=(lambda camp: bool(camp.failures)) if stop_at_first_failure else None,
                         clock=clock, reserve=reserve, on_failure=on_failure, shard=shard)


def shrink(failure: Failure, policy: Policy, kernel, numerics_always: bool, sut=None, defects=frozenset(),
           max_steps: Optional[int] = None, deadline: Optional[float] = None,
           clock: Optional[Callable[[], float]] = None, step_cost: float = 0.0) -> FuzzCase:
    """A smaller case with the same violation signature (greedy structural shrinking, fa3verify.shrinking: at most
    ``max_steps`` candidates, none started past ``deadline``); how it ended is kept on ``failure``."""
    target = ScenarioTarget(policy, kernel, numerics_always, sut, defects=defects)

    def same_violation(case: FuzzCase) -> bool:
        obs = target.observe(case)
        return any(f.signature == failure.signature for f in (obs.findings if obs else ()))

    result = shrink_failure(failure.case, same_violation, max_steps, deadline=deadline, clock=clock,
                            step_cost=step_cost)
    failure.shrunk = _size(result.case) < _size(failure.case)
    failure.shrink_ended, failure.shrink_steps = result.ended, result.steps
    return result.case


def shrink_note(failure: Failure) -> str:
    """How a failure's shrinking ended, for its finding: "shrunk", "shrunk partially (...)", or ""."""
    if failure.shrink_ended == "deadline":
        return ("shrunk partially" if failure.shrunk else "not shrunk") + \
            f" (the budget ended after {failure.shrink_steps} steps)"
    if failure.shrink_ended == "steps":
        return f"shrunk partially (the step bound, {failure.shrink_steps} steps, was reached)"
    return "shrunk" if failure.shrunk else ""


#: The least share of a fuzz budget its campaign is given, however long setting up took: a machine so loaded that
#: torch's import takes most of the budget still runs cases (the stage then ends past N, by what setting up took
#: beyond the other half).
MIN_CAMPAIGN_SHARE = 0.5


def campaign_budget(budget_s: Optional[float], setup_s: float) -> Optional[float]:
    """The campaign's part of a fuzz budget: what is left of ``budget_s`` once setting up (the kernel adapter's
    load) took ``setup_s`` seconds, at least :data:`MIN_CAMPAIGN_SHARE` of it; None (no time bound) stays None."""
    if budget_s is None:
        return None
    return max(budget_s - max(setup_s, 0.0), MIN_CAMPAIGN_SHARE * budget_s)


def budget_reserve(budget_s: Optional[float]) -> Optional[Callable[[Campaign], float]]:
    """The campaign's reserve under a time budget: :data:`FINISH_SHARE` of it, for writing."""
    return None if budget_s is None else (lambda camp: FINISH_SHARE * budget_s)


def _size(case: FuzzCase) -> tuple:
    lens = [x for s in case.steps for x in s["seq_lens"]]
    return (len(case.steps), len(lens), sum(lens))


def save_case(failure: Failure, case: FuzzCase, policy: Policy, kernel_name: str, out_dir: str, sut=None,
              defects=frozenset()) -> str:
    """Write a replayable case file for a failure (spec.model.cases schema), carrying the engine it was found on and the
    seeded defects it ran with. Nothing in it is measured (no times, no host): under ``--cases N`` the same seed
    writes the same bytes on any machine."""
    engine = identity_of(sut) if sut is not None and sut.spec.case_records_engine else None
    partial = shrink_note(failure) if failure.shrink_ended in ("steps", "deadline") else ""
    c = scenario_case(case, source="fuzz", policy=case_policy(policy, sut), engine=engine,
                      kernel={"name": kernel_name, "mode": "strict"},
                      expected={"outcome": Outcome.VIOLATION, "invariant": failure.invariant,
                                "detail": {"message": failure.message}},
                      notes=f"fuzz signature {failure.signature}; numerics={case.numerics}"
                            + (f"; {partial}" if partial else ""), defects=defects)
    return str(c.save(out_dir))


def saved_case_terms(failure: Failure, case: FuzzCase, policy: Policy, kernel, numerics_always: bool, sut=None,
                     defects=frozenset()) -> Optional[dict]:
    """The backend terms of the case that is saved (the shrunk one), from one more run of it; its message becomes
    the failure's, so the finding, the case file's expected detail and its replay show the same numbers."""
    from gpu_impl.engines.model.sut import ModelSUT

    terms = run_terms(ModelSUT() if sut is None else sut, scenario_for(case, policy, defects), kernel=kernel,
                      numerics=numerics_always or case.numerics, invariant=failure.invariant,
                      signature=failure.signature)
    if terms and terms.get("message") and terms.get("invariant", failure.invariant) == failure.invariant:
        failure.finding = failure.finding.reported(message=terms["message"])
    return terms


def sut_policy(sut) -> Policy:
    """The model policy a scenario for ``sut`` is built under: the one its constructor was given
    (``ModelSUT(policy=...)``), else the harness's default (``load_policy()``: on a real engine its own code
    decides, and the case file records its release's profile, ``engine_choice.case_policy``)."""
    policy = getattr(sut, "policy", None)
    return policy if policy is not None else load_policy()


def fuzz(sut=None, kernel_name: str = "emulated", device: str = "cpu", seed: int = 0,
         budget_s: Optional[float] = 20.0, max_cases: Optional[int] = None, out_dir: str = "fa3verify-out/cases",
         show_progress: Optional[bool] = None, defects=None,
         strategy: Optional[str] = None, clock: Optional[Callable[[], float]] = None,
         shrink_steps: Optional[int] = None, shard=None) -> RunSummary:
    """The fuzz subcommand's work: campaign on the system under test (default ``ModelSUT()`` under the default
    policy) under its policy (:func:`sut_policy`), shrink each distinct failure as it is found, save cases
    (carrying the engine), summarise. ``budget_s`` covers all of it (module docstring), on ``clock`` (default
    ``time.perf_counter``); ``shrink_steps`` bounds each shrinking (default ``shrinking.MAX_SHRINK_STEPS``).

    An interrupt (SIGINT) ends the campaign: the failures found so far are saved (one whose shrinking it
    interrupted, unshrunk) and the summary is marked interrupted (exit 3); an interrupt before the campaign
    starts returns an empty interrupted summary.
    ``defects`` are seeded into every case (and written into each case file); ``strategy`` names the family
    (default: the engine's own); ``shard`` runs one shard of the campaign (:mod:`fa3verify.sharding`).
    """
    from gpu_impl.engines.model.sut import ModelSUT

    policy = sut_policy(sut)
    sut = ModelSUT(policy=policy) if sut is None else sut
    defects = frozenset(getattr(sut, "defects", frozenset()) if defects is None else defects)
    label = sut.spec.plugin.run_label(sut.spec)  # "" on the model, " on ENGINE" where the engine's own code ran
    summary = RunSummary(command="fuzz", seed=seed, policy=case_policy(policy, sut))
    clock = clock or now
    entered, engine_start_s = clock(), 0.0
    try:
        from gpu_impl.kernels import load

        kernel = load(kernel_name, mode="strict", device=device)
        numerics_always = kernel_name != "emulated"
        if callable(getattr(sut, "start", None)):
            started = clock()
            sut.start()  # an engine's worker start is not the budget's (its own stage; usually done before)
            engine_start_s = clock() - started
        show = sys.stdout.isatty() if show_progress is None else show_progress
        shrunk: dict = {}

        domain = None
        if not strategy:
            domain = sut.domain()
            domain.reset_counts()
        campaign_s = campaign_budget(budget_s, clock() - entered - engine_start_s)

        def shrink_new(camp: Campaign, failure: Failure) -> None:  # an interrupt here ends the campaign
            deadline = None if campaign_s is None else camp.started + campaign_s * (1 - FINISH_SHARE)
            shrunk[failure.signature] = shrink(failure, policy, kernel, numerics_always, sut=sut, defects=defects,
                                               max_steps=shrink_steps, deadline=deadline, clock=camp.clock,
                                               step_cost=camp.expected_cost())

        with _progress_line(show) as progress:
            camp = run_campaign(policy, kernel, seed=seed, budget_s=campaign_s, max_cases=max_cases,
                                numerics_always=numerics_always, progress=progress, sut=sut, defects=defects,
                                strategy=strategy, clock=clock, reserve=budget_reserve(campaign_s),
                                on_failure=shrink_new, shard=shard, domain=domain)
    except KeyboardInterrupt:
        summary.interrupted = True
        return summary
    check_name = sut.spec.plugin.fuzz_check_name(sut.spec, kernel_name)
    for failure in camp.failures.values():
        case = shrunk.get(failure.signature, failure.case)
        terms = saved_case_terms(failure, case, policy, kernel, numerics_always, sut, defects)
        failure.case_file = save_case(failure, case, policy, kernel_name, out_dir, sut=sut, defects=defects)
        note = shrink_note(failure)
        finding = failure.finding.reported(
            case_file=failure.case_file, engine=f"fuzz{label}",
            message=f"{failure.message} (seen {failure.count}x, first at "
                    f"{failure.found_at_s:.2f}s{', ' + note if note else ''})",
            replay=replay_line(failure.case_file, sut.spec.plugin.replay_guard(sut.spec, policy), sut.spec),
            check=check_name)
        summary.findings.append(apply_terms(finding, terms, keep_message=True))
    own_s = clock() - entered - engine_start_s  # the stage's own time: setting up, the campaign, the case files
    summary.cases = camp.cases
    summary.failures = camp.failing_cases
    summary.elapsed_s = own_s
    if camp.failures:
        summary.first_failure_s = min(f.found_at_s for f in camp.failures.values())
    verdict_failed = bool(camp.failures)
    summary.interrupted = camp.interrupted
    summary.checks.append(Check(
        name=check_name, kind="property",
        verdict=Verdict.FAIL if verdict_failed else (Verdict.PASS if camp.cases else Verdict.INCONCLUSIVE), seconds=own_s,
        failed=verdict_failed, inconclusive=camp.cases == 0,
        case_file=next(iter(camp.failures.values())).case_file if camp.failures else None,
        message=f"{camp.cases} cases, {camp.failing_cases} failing, {len(camp.failures)} distinct signatures: "
                + ", ".join(sorted(camp.failures)) if camp.failures else f"{camp.cases} cases, no violation"))
    if camp.loud:
        summary.checks[-1].message += (f"; {camp.loud} cases raised FA3's shape check (loud and safe: the call is "
                                       f"refused, nothing read out of bounds; not counted as violations)")
    if camp.unsupported:
        summary.checks[-1].message += f"; {camp.unsupported} generated cases the engine does not run were skipped"
    if strategy:
        names = [strategy] if isinstance(strategy, str) else list(dict.fromkeys(strategy))
        summary.checks[-1].message += f"; {'family' if len(names) == 1 else 'families'} {', '.join(names)}"
    if domain is not None and domain.reports:
        summary.domain = domain.report(dict(camp.reach), camp.cases)
        summary.checks[-1].message += "; " + domain_line(summary.domain)
    return summary


def domain_line(report: dict) -> str:
    """One line of a domain report: configurations drawn / rejected (top reasons), cases per path, not covered."""
    rejected = sum(report["rejected"].values())
    top = "; ".join(f"{n}x {reason}" for reason, n in list(report["rejected"].items())[:3])
    reach = ", ".join(f"{k} {v}" for k, v in report["reach"].items())
    missing = "; ".join(f"{k}: {v}" for k, v in report["not_covered"].items())
    return (f"domain {report['name']}: {report['drawn']} configurations drawn, {rejected} rejected by the release"
            + (f" ({top})" if top else "") + f"; cases per path: {reach}" + (f"; not covered: {missing}" if missing else ""))


class _progress_line:
    """A live one-line progress display (cases, cases/s, failures) on a terminal; silent otherwise."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.status = None

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.console import Console

        self.status = Console().status("fuzzing ...")
        self.status.__enter__()
        return self.update

    def update(self, camp: Campaign) -> None:
        rate = camp.cases / camp.elapsed if camp.elapsed > 0 else 0.0
        self.status.update(f"fuzzing: {camp.cases} cases, {rate:.0f} cases/s, {camp.failing_cases} failing, "
                           f"{len(camp.failures)} distinct")

    def __exit__(self, *exc):
        if self.status is not None:
            self.status.__exit__(*exc)
        return False


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
{fuzz}  fa3verify fuzz --cases 20000 --shard 2/4 --json s2.json    # one CI job of four; join: `report merge`
  fa3verify fuzz --family large-decode-batch --cases 40      # one strategy family (repeatable)

--family NAME draws every case from that strategy family instead of the system under test's own domain
(repeatable: each case from one of the named families, chosen by the seed); an unknown name is exit 2 naming
the families there are. A family whose cases the engine does not run gives skipped cases, said in the summary.
"""


def register(sub) -> None:
    p = sub.add_parser("fuzz", help=HELP, description=HELP, epilog=with_engine_examples(EPILOG),
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
    p.add_argument("--family", action="append", metavar="NAME",
                   help="draw the cases from this strategy family (repeatable; default: the system under test's "
                        "own domain); e.g. large-decode-batch, tile-corner")
    add_shard_argument(p)
    add_cases_dir_argument(p)
    p.add_argument("--json", metavar="PATH", help="write the run summary as JSON (schema fa3verify.run/1)")
    p.add_argument("--junit", metavar="PATH", help="write JUnit XML")
    p.set_defaults(func=run)


def check_families(names) -> Optional[tuple]:
    """The ``--family`` names, in order, repeats dropped (None: none given, the system's own domain); UsageError
    naming the allowed values for an unknown one, before any work starts."""
    if not names:
        return None
    from ..strategies import FAMILIES

    for name in names:
        if name not in FAMILIES:
            raise UsageError(f"--family: unknown family {name!r}; allowed: {', '.join(sorted(FAMILIES))}")
    return tuple(dict.fromkeys(names))


def run(args) -> int:
    from ..engine_choice import start_engine, sut_from_args
    from ..progress import stage

    budget, cases = budget_from_args(args)
    families = check_families(args.family)
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
                               budget_s=budget, max_cases=cases, out_dir=cases_dir_of(args), shard=shard,
                               strategy=families)
                if end is not None:  # a stand-in stage may hand the block nothing
                    end.interrupted = summary.interrupted
    except KeyboardInterrupt:  # before the campaign began: nothing found, the reports still say so (exit 3)
        summary = RunSummary(command="fuzz", seed=args.seed, policy=policy.to_dict(), interrupted=True)
    if shard is not None:
        summary.shard = shard.to_dict({"command": "fuzz", "seed": args.seed, "cases": cases, "budget_s": budget,
                                       "kernel": args.kernel, "engine": args.engine, "policy": summary.policy,
                                       "families": list(families or ())})
    return write_reports(summary, args)
