"""The one campaign loop: generate cases, run each on a system under test, check, record distinct failures.

``run_campaign(target, strategy, checks, budget)`` is the only fuzz loop in the suite. ``fuzz``, ``gate`` and
``check`` (through :mod:`fa3verify.commands.fuzz`), the bug catalogue's fuzz engine (:mod:`fa3verify.catalogue`) and
gpu-check's fuzz stage all call it:

* **generation** -- one mechanism: a generator keyed by the campaign seed supplies one 64-bit seed per draw, and
  the case is built by a strategy family (:mod:`fa3verify.strategies`) from a ``random.Random`` seeded by it; the
  same seed gives the same cases in any process and whatever else is imported. A family may return None (no
  valid case from that draw): the draw counts against the case budget and is skipped. A shard
  (:mod:`fa3verify.sharding`) builds and runs only the draws it owns; the others still take their seed from the
  generator and count against the case budget, so N shards run exactly the unsplit campaign's cases;
* **evaluation** -- ``target.observe(case)`` runs the case on a system under test and returns an
  :class:`Observation` (outcome, invariants, messages, the findings), or None when the system cannot
  run that case (a feature its driver does not run: counted as ``unsupported``, never a pass). A target with
  ``parallel = n > 1`` gets ``observe_many(cases)`` with n cases at a time (gpu-check's crash-isolating worker
  pool); the cases are still recorded in draw order. Targets:
  :class:`fa3verify.commands.fuzz.ScenarioTarget` (the model and every real engine, ``gpu_impl.sut``),
  :class:`fa3verify.kernel_cases.KernelCallSUT` (kernel-level FA3 calls);
* **checking** -- ``checks(observation)`` names the failures a case shows, as findings (``spec.finding.Finding``:
  their ``signature`` groups them);
  the first case of each signature is kept (:class:`Failure`), later ones are counted;
* **stopping** -- the budget (seconds and/or draws, always bounded), ``stop(campaign)`` after each case, or an
  interrupt (SIGINT: what was found is kept and ``interrupted`` is set). A time budget is honoured with what
  comes after the loop: no case (for a parallel target, no batch) is started when the clock plus the expected
  cost of one (the mean of the last :data:`COST_WINDOW`) plus ``reserve(campaign)`` (the seconds the caller
  keeps at the end, e.g. ``fa3verify.commands.fuzz`` for writing case files and reports) would pass the budget. The
  clock is ``clock`` (default ``time.perf_counter``, looked up at each call, so a test can run the campaign on
  a simulated clock);
* **shrinking** -- :func:`shrink_failure` (greedy structural shrinking, :mod:`fa3verify.shrinking`), bounded by
  steps and, in a time-boxed run, by a deadline; ``on_failure(campaign, failure)`` runs when a new signature is
  recorded (``fuzz`` shrinks there, inside the budget);
* **progress** -- ``progress(campaign)`` every 25 cases;
* **reach** -- ``campaign.reach`` counts, per metadata path, the cases whose observation reached it
  (``Observation.reached``); a strategy with an ``observe(case, observation)`` method is told what each of its
  cases did (None: not run), in draw order, so it can weight later draws (an engine's domain does).

Case saving and the run summary are the callers' (``fa3verify.case_files``, ``fa3verify.commands.fuzz``): a campaign
returns what it found.
"""

from __future__ import annotations

import collections
import contextlib
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from spec.finding import Outcome
from spec.process.interrupts import raise_if_swallowed

__all__ = ["Budget", "Observation", "Failure", "Campaign", "run_campaign", "shrink_failure", "single_threaded_torch",
           "all_findings", "COST_WINDOW", "now"]

#: Cases (batches, for a parallel target) whose mean cost is the expected cost of the next one.
COST_WINDOW = 16


def now() -> float:
    """The suite's clock, ``time.perf_counter``, looked up at each call (a test may slow it)."""
    return time.perf_counter()


class _CampaignDone(BaseException):
    """Raised inside the draw loop to end the campaign (budget, case count or stop condition reached)."""


@dataclass(frozen=True)
class Budget:
    """How long a campaign may run: seconds and/or draws (at least one bound, each finite and > 0)."""

    seconds: Optional[float] = None
    cases: Optional[int] = None

    def validate(self) -> "Budget":
        s, n = self.seconds, self.cases
        if s is not None and not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0):
            raise ValueError(f"budget_s: expected a finite number > 0, got {s!r}")
        if s is None and n is None:
            raise ValueError("budget_s, max_cases: at least one bound is needed (the campaign would never end)")
        if n is not None and n < 1:
            raise ValueError(f"max_cases: expected an integer >= 1, got {n!r}")
        return self


@dataclass
class Observation:
    """What one case did on a system under test.

    ``outcome``: an :class:`spec.finding.Outcome` (PASS, VIOLATION, SHAPE_ERROR: FA3's loud shape check,
    CLEAR_ERROR: a rejection naming the argument; gpu-check's workers add their own words); ``findings``: the
    :class:`spec.finding.Finding` of every violation, as the judge made them (:meth:`of`).
    """

    outcome: str
    invariants: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    findings: list = field(default_factory=list)
    detail: Any = None  #: what the target wants kept with the observation (gpu-check: the task's case and result)
    #: the metadata paths this case reached on the system under test (``gpu_impl.domain.reached_paths``)
    reached: tuple = ()

    @classmethod
    def of(cls, verdict, reached: tuple = ()) -> "Observation":
        """A scenario's observation from the judge's verdict (``fa3verify.judge.Verdict``): its outcome, the distinct
        invariants, the first three findings' messages (or the first shape error's), the findings themselves."""
        found = verdict.findings
        msgs = [f.message for f in found[:3]] or [f.message for f in verdict.shape_errors[:1]]
        return cls(verdict.outcome, verdict.invariants, msgs, list(found), reached=reached)


def all_findings(obs: Observation) -> list:
    """The default check: every violation the system under test reported is a failure."""
    return list(obs.findings)


@dataclass
class Failure:
    """The first case that showed a failure signature, its finding (``spec.finding.Finding``, as the judge made it),
    and how often the signature recurred."""

    finding: Any
    case: Any
    found_at_s: float
    count: int = 1
    case_file: Optional[str] = None
    shrunk: bool = False
    observation: Optional[Observation] = None
    #: how its shrinking ended (``fa3verify.shrinking.Shrunk.ended``: "done", "steps", "deadline"), None if not shrunk
    shrink_ended: Optional[str] = None
    shrink_steps: int = 0

    @property
    def signature(self) -> str:
        return self.finding.signature

    @property
    def invariant(self) -> str:
        return self.finding.invariant

    @property
    def message(self) -> str:
        return self.finding.message


@dataclass
class Campaign:
    """State of one campaign: counters, distinct failures, and why it ended."""

    budget: Budget
    target: Any = None
    started: Optional[float] = None  #: the clock's value when the campaign began (default: now)
    draws: int = 0          #: draws used (cases, unsupported cases and draws a family skipped)
    cases: int = 0          #: cases that ran to a verdict
    failing_cases: int = 0
    failures: dict = field(default_factory=dict)
    unsupported: int = 0    #: cases the system under test could not run: skipped, counted, never a pass
    loud: int = 0           #: cases that ended in FA3's shape check ("shape_error"): loud and safe, not failures
    interrupted: bool = False  #: SIGINT ended the campaign: what was found is kept, the verdict is inconclusive
    stopped: bool = False   #: the stop condition ended the campaign
    progress: Optional[Callable[["Campaign"], None]] = None
    clock: Callable[[], float] = now
    #: seconds to keep at the end of a time budget, given the campaign so far (the caller's shrinking and writing)
    reserve: Optional[Callable[["Campaign"], float]] = None
    costs: collections.deque = field(default_factory=lambda: collections.deque(maxlen=COST_WINDOW))
    #: path -> cases that reached it (``Observation.reached``; each case counts once per path)
    reach: collections.Counter = field(default_factory=collections.Counter)

    def __post_init__(self):
        if self.started is None:
            self.started = self.clock()

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def expected_cost(self) -> float:
        """Seconds the next case (batch) is expected to take: the mean of the last ones (0 before the first)."""
        return sum(self.costs) / len(self.costs) if self.costs else 0.0

    def exhausted(self, starting: bool = True) -> bool:
        """Whether the budget is used up. With a time budget, a draw ``starting`` a case (a batch) also needs room
        for its expected cost and the caller's reserve."""
        if self.budget.cases is not None and self.draws >= self.budget.cases:
            return True
        if self.budget.seconds is None:
            return False
        keep = (self.reserve(self) if self.reserve is not None else 0.0) if starting else 0.0
        return self.elapsed + (self.expected_cost() if starting else 0.0) + keep >= self.budget.seconds

    def first(self, signatures) -> Optional[Failure]:
        """The earliest failure among ``signatures`` (None when none was seen)."""
        found = [f for s, f in self.failures.items() if s in signatures]
        return min(found, key=lambda f: f.found_at_s) if found else None


def run_campaign(target, strategy: Callable[[random.Random], Any], checks: Callable[[Observation], list] = all_findings,
                 budget: Budget = Budget(seconds=20.0), seed: int = 0,
                 stop: Optional[Callable[[Campaign], bool]] = None,
                 progress: Optional[Callable[[Campaign], None]] = None,
                 clock: Optional[Callable[[], float]] = None,
                 reserve: Optional[Callable[[Campaign], float]] = None,
                 on_failure: Optional[Callable[[Campaign, Failure], None]] = None, shard=None) -> Campaign:
    """Draw cases from ``strategy`` and run them on ``target`` until the budget or ``stop``; record failures.
    ``shard`` (a :class:`fa3verify.sharding.Shard`) runs only the draws it owns.

    The campaign is always bounded: a budget that is not a finite number > 0, or neither a budget nor a case
    count, is a ValueError (a NaN budget would never be reached). ``clock`` and ``reserve``: see the module
    docstring (stopping); a case-count budget uses neither, so its cases do not depend on the machine's speed.
    ``on_failure(campaign, failure)`` is called when a new signature's first case is recorded (``fuzz`` shrinks it
    there, so shrinking spends the campaign's time as it goes); its time is not counted as case cost.
    """
    camp = Campaign(budget=budget.validate(), target=target, progress=progress, clock=clock or now,
                    reserve=reserve)
    width = max(1, int(getattr(target, "parallel", 1)))
    pending: list = []

    observe = getattr(strategy, "observe", None)

    def record(case, obs) -> None:
        if observe is not None:
            observe(case, obs)
        if obs is None:
            camp.unsupported += 1
            return
        camp.cases += 1
        camp.loud += obs.outcome == Outcome.SHAPE_ERROR
        camp.reach.update(set(obs.reached))
        found = checks(obs)
        if found:
            camp.failing_cases += 1
        for finding in found:
            signature = finding.signature
            if signature in camp.failures:
                camp.failures[signature].count += 1
            else:
                camp.failures[signature] = Failure(finding, case, camp.elapsed, observation=obs)
                if on_failure is not None:
                    on_failure(camp, camp.failures[signature])
        if stop is not None and stop(camp):
            camp.stopped = True
            raise _CampaignDone()
        if camp.progress and camp.cases % 25 == 0:
            camp.progress(camp)

    def flush() -> None:
        batch = pending[:]
        pending.clear()
        started = camp.clock()
        observed = [target.observe(batch[0])] if len(batch) == 1 else target.observe_many(batch)
        camp.costs.append(camp.clock() - started)
        for case, obs in zip(batch, observed):
            record(case, obs)

    # One 64-bit seed per draw from a generator keyed by the campaign seed alone: the same seed gives the same
    # cases in any process (a Hypothesis draw mixes in constants mined from whatever modules are loaded, so the
    # same seed drew different cases inside the test suite than from the command line).
    draws = random.Random(f"fa3verify.campaign:{int(seed)}")

    def one_case() -> None:
        while True:
            if camp.exhausted(starting=not pending):  # a new case (batch) starts with this draw
                raise _CampaignDone()
            raise_if_swallowed()  # a Ctrl-C dropped in a callback stops the campaign here
            camp.draws += 1
            draw_seed = draws.getrandbits(64)
            if shard is not None and not shard.owns(camp.draws - 1):
                continue
            case = strategy(random.Random(draw_seed))
            if case is None:
                continue
            pending.append(case)
            if len(pending) >= width:
                flush()

    with single_threaded_torch():
        try:
            try:
                one_case()
            except _CampaignDone:
                pass
            if pending and not camp.stopped:  # a parallel target's last, partial batch
                flush()
        except _CampaignDone:
            pass
        except KeyboardInterrupt:
            camp.interrupted = True
    return camp


def shrink_failure(case, still_fails: Callable[[Any], bool], max_steps: Optional[int] = None,
                   deadline: Optional[float] = None, clock: Optional[Callable[[], float]] = None,
                   step_cost: float = 0.0):
    """A smaller scenario case for which ``still_fails`` holds, as a :class:`fa3verify.shrinking.Shrunk` (greedy,
    at most ``max_steps`` candidates, default ``shrinking.MAX_SHRINK_STEPS``, and none started past ``deadline``);
    kernel-level calls and any case shrinking cannot handle come back as they are (``ended`` "unsupported")."""
    from .shrinking import MAX_SHRINK_STEPS, Shrunk, shrink
    from .strategies import FuzzCase

    if not isinstance(case, FuzzCase):
        return Shrunk(case, 0, "unsupported")
    return shrink(case, still_fails, MAX_SHRINK_STEPS if max_steps is None else max_steps, deadline=deadline,
                  clock=clock, step_cost=step_cost)


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
