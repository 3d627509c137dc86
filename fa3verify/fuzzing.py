"""`fuzz`: a differential fuzz campaign of the backend under a policy, against the oracle.

Generation is Hypothesis (`fa3verify.strategies`), seeded, so the same seed gives the same cases. Each
scenario runs on a system under test (`gpu_impl.sut`: the model by default, or real engine code chosen with
`--engine`) through `SystemUnderTest.run`: metadata-level checks (spec's invariants) for every
decode call, and, for numerics cases, the kernel adapter against the float64 oracle under FA3's tolerance
rule. The first failure of each distinct violation signature is shrunk (fa3verify.shrinking) and saved as a
case file; later failures with a known signature are counted, not saved again.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from hypothesis import HealthCheck, Phase, given, seed as hyp_seed, settings

from .engine_choice import case_policy, identity_of
from .policy import Policy
from .strategies import FuzzCase, fuzz_cases
from .summary import Check, Finding, RunSummary

#: Seconds spent shrinking each distinct failure at most.
SHRINK_BUDGET_S = 4.0


class _CampaignDone(BaseException):
    """Raised inside the Hypothesis loop to end the campaign (budget or case count reached)."""


@dataclass
class Failure:
    """The first scenario that showed a violation signature, and how often it recurred."""

    signature: str
    invariant: str
    case: FuzzCase
    message: str
    found_at_s: float
    count: int = 1
    case_file: Optional[str] = None
    shrunk: bool = False


@dataclass
class Campaign:
    """State of one fuzz run: counters, distinct failures, the policy and kernel it exercises."""

    policy: Policy
    kernel: object
    numerics_always: bool
    budget_s: Optional[float]
    max_cases: Optional[int]
    started: float = field(default_factory=time.perf_counter)
    cases: int = 0
    failing_cases: int = 0
    failures: dict = field(default_factory=dict)
    progress: Optional[Callable[["Campaign"], None]] = None
    interrupted: bool = False  #: SIGINT ended the campaign: what was found is kept, the verdict is inconclusive
    #: the system under test every case runs on (None: the model, gpu_impl.sut.ModelSUT)
    sut: object = None
    #: cases the engine could not run (a feature its driver does not run): skipped, counted, never a pass
    unsupported: int = 0

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def exhausted(self) -> bool:
        if self.max_cases is not None and self.cases + self.unsupported >= self.max_cases:
            return True
        return self.budget_s is not None and self.elapsed >= self.budget_s


def scenario_for(case: FuzzCase, policy: Policy):
    """The gpu_impl Scenario a generated case describes, under the policy being tested."""
    from gpu_impl.scenario import Scenario, Step

    return Scenario(server=case.server, model=case.model, guard=policy.guard, guard_spec=policy.guard_spec,
                    steps=[Step(**s) for s in case.steps], metadata_heads=policy.metadata_heads,
                    clear_stale_cp_metadata=policy.clear_stale_cp_metadata, seed=case.seed,
                    graph_replay_seqlen_k=policy.graph_replay_seqlen_k)


def evaluate(case: FuzzCase, policy: Policy, kernel, numerics_always: bool = False, sut=None) -> list:
    """Run one case on the system under test (default: the model); return (signature, invariant, message)s,
    or None when the engine cannot run the scenario (see ``engine_choice.is_unsupported``)."""
    from gpu_impl.guards import GuardRaised
    from gpu_impl.sut import ModelSUT

    from .engine_choice import is_unsupported

    sut = ModelSUT() if sut is None else sut
    try:
        result = sut.run(scenario_for(case, policy), kernel=kernel, numerics=numerics_always or case.numerics)
    except GuardRaised as exc:
        return [(exc.invariant, exc.invariant, str(exc))]
    except Exception as exc:
        if is_unsupported(exc):
            return None
        raise
    return [(f.signature, f.invariant, f.message) for f in result.findings]


def run_campaign(policy: Policy, kernel, seed: int = 0, budget_s: Optional[float] = 20.0,
                 max_cases: Optional[int] = None, numerics_always: bool = False,
                 progress: Optional[Callable[[Campaign], None]] = None,
                 stop_at_first_failure: bool = False, sut=None) -> Campaign:
    """Generate and run cases on the system under test (default: the model) until the budget or the case count is reached; record distinct failures.

    The campaign is always bounded: a budget that is not a finite number > 0, or neither a budget nor a case
    count, is a ValueError (a NaN budget would never be reached).
    """
    import math

    if budget_s is not None and not (isinstance(budget_s, (int, float)) and math.isfinite(budget_s) and budget_s > 0):
        raise ValueError(f"budget_s: expected a finite number > 0, got {budget_s!r}")
    if budget_s is None and max_cases is None:
        raise ValueError("budget_s, max_cases: at least one bound is needed (the campaign would never end)")
    if max_cases is not None and max_cases < 1:
        raise ValueError(f"max_cases: expected an integer >= 1, got {max_cases!r}")
    camp = Campaign(policy=policy, kernel=kernel, numerics_always=numerics_always, budget_s=budget_s,
                    max_cases=max_cases, progress=progress, sut=sut)

    @hyp_seed(seed)
    @settings(max_examples=10**9, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(fuzz_cases())
    def one_case(case: FuzzCase) -> None:
        if camp.exhausted():
            raise _CampaignDone()
        findings = evaluate(case, policy, kernel, numerics_always, sut=sut)
        if findings is None:
            camp.unsupported += 1
            return
        camp.cases += 1
        if findings:
            camp.failing_cases += 1
        for signature, invariant, message in findings:
            if signature in camp.failures:
                camp.failures[signature].count += 1
            else:
                camp.failures[signature] = Failure(signature, invariant, case, message, camp.elapsed)
        if stop_at_first_failure and camp.failures:
            raise _CampaignDone()
        if camp.progress and camp.cases % 25 == 0:
            camp.progress(camp)

    with single_threaded_torch():
        try:
            one_case()
        except _CampaignDone:
            pass
        except KeyboardInterrupt:
            camp.interrupted = True
    return camp


@contextlib.contextmanager
def single_threaded_torch():
    """Run torch ops on one thread: fuzz tensors are tiny, and intra-op threads cost far more than they save
    (measured: a numerics case took 0.59 s with 2 threads on a busy 2-core machine, 0.022 s with one)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def shrink(failure: Failure, policy: Policy, kernel, numerics_always: bool,
           budget_s: float = SHRINK_BUDGET_S, sut=None) -> FuzzCase:
    """A smaller case with the same violation signature (greedy structural shrinking, fa3verify.shrinking)."""
    from .shrinking import shrink_case

    def same_violation(case: FuzzCase) -> bool:
        return any(sig == failure.signature for sig, _, _ in evaluate(case, policy, kernel, numerics_always, sut=sut)
                   or ())

    smaller = shrink_case(failure.case, same_violation, budget_s=budget_s)
    failure.shrunk = _size(smaller) < _size(failure.case)
    return smaller


def _size(case: FuzzCase) -> tuple:
    lens = [x for s in case.steps for x in s["seq_lens"]]
    return (len(case.steps), len(lens), sum(lens))


def save_case(failure: Failure, case: FuzzCase, policy: Policy, kernel_name: str, out_dir: str, sut=None) -> str:
    """Write a replayable case file for a failure (spec.cases schema), carrying the engine it was found on."""
    from spec.cases import Case

    engine = None if sut is None or sut.spec.is_model else identity_of(sut)
    c = Case.from_parts(
        source="fuzz", server=case.server.to_dict(), model=case.model.to_dict(), policy=case_policy(policy, sut),
        engine=engine,
        batches=[dict(s) for s in case.steps], kernel={"name": kernel_name, "mode": "strict"}, seed=case.seed,
        expected={"outcome": "violation", "invariant": failure.invariant, "detail": {"message": failure.message}},
        notes=f"fuzz signature {failure.signature}; numerics={case.numerics}")
    return str(c.save(out_dir))


def fuzz(policy: Policy, kernel_name: str = "emulated", device: str = "cpu", seed: int = 0,
         budget_s: Optional[float] = 20.0, max_cases: Optional[int] = None, out_dir: str = "fa3verify-out/cases",
         show_progress: Optional[bool] = None, sut=None) -> RunSummary:
    """The fuzz subcommand's work: campaign on the system under test (default the model), shrink each distinct
    failure, save cases (carrying the engine), summarise.

    An interrupt (SIGINT) ends the campaign: the failures found so far are saved unshrunk and the summary is
    marked interrupted (exit 3); an interrupt before the campaign starts returns an empty interrupted summary.
    """
    on_engine = sut is not None and not sut.spec.is_model
    summary = RunSummary(command="fuzz", seed=seed, policy=case_policy(policy, sut))
    try:
        from gpu_impl.kernels import load

        kernel = load(kernel_name, mode="strict", device=device)
        numerics_always = kernel_name != "emulated"
        show = sys.stdout.isatty() if show_progress is None else show_progress
        with _progress_line(show) as progress:
            camp = run_campaign(policy, kernel, seed=seed, budget_s=budget_s, max_cases=max_cases,
                                numerics_always=numerics_always, progress=progress, sut=sut)
    except KeyboardInterrupt:
        summary.interrupted = True
        return summary
    for failure in camp.failures.values():
        case = failure.case if camp.interrupted else _shrink_or_keep(failure, policy, kernel, numerics_always, camp)
        failure.case_file = save_case(failure, case, policy, kernel_name, out_dir, sut=sut)
        summary.findings.append(Finding(invariant=failure.invariant, case_file=failure.case_file,
                                        engine=f"fuzz on {sut.spec}" if on_engine else "fuzz",
                                        message=f"{failure.message} (seen {failure.count}x, first at "
                                                f"{failure.found_at_s:.2f}s{', shrunk' if failure.shrunk else ''})",
                                        replay=f"fa3verify replay {failure.case_file}"))
    summary.cases = camp.cases
    summary.failures = camp.failing_cases
    summary.elapsed_s = camp.elapsed
    if camp.failures:
        summary.first_failure_s = min(f.found_at_s for f in camp.failures.values())
    verdict_failed = bool(camp.failures)
    summary.interrupted = camp.interrupted
    summary.checks.append(Check(
        name=(f"fuzz on {sut.spec}: no OOB, matches FA3's rules" if on_engine
              else f"fuzz ({kernel_name}): no OOB, no NaN, matches oracle"), kind="property",
        verdict="fail" if verdict_failed else ("pass" if camp.cases else "inconclusive"), seconds=camp.elapsed,
        failed=verdict_failed, inconclusive=camp.cases == 0,
        case_file=next(iter(camp.failures.values())).case_file if camp.failures else None,
        message=f"{camp.cases} cases, {camp.failing_cases} failing, {len(camp.failures)} distinct signatures: "
                + ", ".join(sorted(camp.failures)) if camp.failures else f"{camp.cases} cases, no violation"))
    if camp.unsupported:
        summary.checks[-1].message += f"; {camp.unsupported} generated cases the engine does not run were skipped"
    return summary


def _shrink_or_keep(failure: Failure, policy: Policy, kernel, numerics_always: bool, camp: Campaign) -> FuzzCase:
    """The shrunk case; an interrupt while shrinking keeps the unshrunk one and ends the run (exit 3)."""
    try:
        return shrink(failure, policy, kernel, numerics_always, sut=camp.sut)
    except KeyboardInterrupt:
        camp.interrupted = True
        return failure.case


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
