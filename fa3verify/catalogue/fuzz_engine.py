"""The catalogue's fuzz engine: an entry's strategy family through the one campaign, defect on and off.

The campaign (``fa3verify.campaign.run_campaign``) runs the family's cases on a system under test with the
entry's policy and seeded defects: scenario families on the model (``fa3verify.commands.fuzz.ScenarioTarget``),
kernel-level families on the emulated kernel (``fa3verify.kernel_cases.KernelCallSUT``). What counts:

* defect **on**: stop at the first case showing an expected invariant (caught); a SHAPE entry instead runs the
  whole budget, is caught by a shape error and missed by any silent violation;
* defect **off**: every case must be clean (a kernel-level "clear_error" is allowed); one finding is a false alarm.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from spec.finding import CatalogueStatus, Finding, Outcome

from ..campaign import Budget, run_campaign, shrink_failure
from ..kernel_cases import KernelCallSUT
from .entries import FUZZ_SEED, Entry
from .results import EngineOutcome
from spec.finding import Outcome

__all__ = ["Policy", "targeted_fuzz", "scenario_engine", "kernel_engine", "engine_from_data"]


@dataclass(frozen=True)
class Policy:
    """A backend policy as a case file spells it (guard spec, heads, runner hygiene) plus seeded defects."""

    guard: str = "fixed"
    metadata_heads: str = "tp"
    clear_stale: bool = True
    defects: tuple = ()

    def to_case(self) -> dict:
        return {"guard": self.guard, "metadata_heads": self.metadata_heads, "clear_stale_cp_metadata": self.clear_stale}

    @classmethod
    def from_data(cls, data: dict) -> "Policy":
        return cls(data.get("guard", "fixed"), data.get("metadata_heads", "tp"),
                   data.get("clear_stale_cp_metadata", True), tuple(data.get("defects", ())))

    def target(self):
        """The model under this policy, as the campaign drives it (a crash of the model is NO_CRASH)."""
        from gpu_impl.guards import load_guard

        from ..commands.fuzz import ScenarioTarget
        from ..policy import Policy as BackendPolicy

        policy = BackendPolicy(guard_spec=self.guard, guard=load_guard(self.guard), metadata_heads=self.metadata_heads,
                               clear_stale_cp_metadata=self.clear_stale)
        return ScenarioTarget(policy, defects=self.defects, crash_is_finding=True)


def _mark(signature: str, invariant: str) -> Finding:
    """What the catalogue's checks count: a finding named ``invariant`` grouped under ``signature``."""
    return Finding(invariant, signature_key=signature)


def _scenario_case(case, policy: Policy, obs, entry_id: str, note: str, invariant: Optional[str] = None):
    """The spec.model.cases.Case of a scenario the fuzz engine found (seeded defects in its ``defects`` field)."""
    from ..case_files import scenario_case

    inv = invariant or (obs.invariants[0] if obs.invariants else None)
    expected = {"outcome": obs.outcome, "invariant": inv if obs.outcome == Outcome.VIOLATION else None,
                "detail": {"message": obs.messages[0] if obs.messages else "", "invariants": obs.invariants}}
    return scenario_case(case, source=f"catalogue:{entry_id or 'x'}", policy=policy.to_case(), expected=expected,
                         defects=policy.defects,
                         notes=f"bug catalogue entry {entry_id} ({note}), found by targeted fuzzing")


def _kernel_case(target: KernelCallSUT, call: dict, obs, entry_id: str, invariant: Optional[str]) -> dict:
    """The kernel-level case of a call the fuzz engine found."""
    kc = target.case(call)
    if obs.outcome == Outcome.SHAPE_ERROR:
        kc["expected"] = {"outcome": Outcome.SHAPE_ERROR, "invariant": None, "detail": {"message": obs.messages[0]}}
    else:
        kc["expected"] = {"outcome": obs.outcome, "invariant": invariant,
                          "detail": {"invariants": obs.invariants, "message": obs.messages[0] if obs.messages else ""}}
    kc["notes"] = f"bug catalogue entry {entry_id} (defect on), found by targeted kernel-level fuzzing"
    return kc


def targeted_fuzz(family: Callable, policy: Optional[Policy], expect: tuple, n: int, on: bool, shrink_steps: int,
                  shape_entry: bool = False, entry_id: str = "", defects: tuple = ()) -> EngineOutcome:
    """Run ``family`` through the campaign: on the model under ``policy``, or (``policy`` None) as kernel-level
    calls with ``defects``; classify what it found (module docstring). A catching scenario is shrunk in at most
    ``shrink_steps`` candidates (steps, not seconds: the same case files on any machine)."""
    kernel_level = policy is None
    target = KernelCallSUT(defects, source=f"catalogue:{entry_id}") if kernel_level else policy.target()
    allowed_off = (Outcome.PASS, Outcome.CLEAR_ERROR) if kernel_level else (Outcome.PASS,)
    if not on:
        checks, stop = (lambda o: [] if o.outcome in allowed_off else [_mark(CatalogueStatus.FIRED, o.outcome)]), \
            (lambda camp: bool(camp.failures))
    elif shape_entry:
        checks = lambda o: [_mark(k, k) for k, hit in (("SHAPE", o.outcome == Outcome.SHAPE_ERROR),  # noqa: E731
                                                       (CatalogueStatus.SILENT, o.outcome == Outcome.VIOLATION)) if hit]
        stop = lambda camp: CatalogueStatus.SILENT in camp.failures  # noqa: E731
    else:
        checks = lambda o: [_mark(i, i) for i in o.invariants]  # noqa: E731
        stop = lambda camp: any(i in camp.failures for i in expect)  # noqa: E731
    start = time.perf_counter()
    camp = run_campaign(target, family, checks, Budget(cases=n), seed=FUZZ_SEED, stop=stop)
    if camp.interrupted:
        raise KeyboardInterrupt
    secs, cases = time.perf_counter() - start, camp.cases

    def case_of(case, obs, note, invariant=None):
        if kernel_level:
            return _kernel_case(target, case, obs, entry_id, invariant)
        return _scenario_case(case, policy, obs, entry_id, note, invariant)

    def shrunk(case, keep):
        def still(c) -> bool:
            obs = target.observe(c)
            return obs is not None and keep(obs)
        try:
            small = shrink_failure(case, still, shrink_steps).case
        except Exception:  # noqa: BLE001 - shrinking is best effort
            small = case
        return small, target.observe(small) if small is not case else None

    if not on:
        if camp.failures:
            f = camp.failures[CatalogueStatus.FIRED]
            o = f.observation
            return EngineOutcome("fuzz", CatalogueStatus.FIRED, secs, o.invariants or [o.outcome], cases,
                                 f"false alarm: {o.outcome} {o.invariants}: {o.messages[:1]}",
                                 case_of(f.case, o, "defect off"))
        return EngineOutcome("fuzz", CatalogueStatus.SILENT, secs, [], cases, f"{cases} cases, nothing fired")
    if shape_entry:
        if CatalogueStatus.SILENT in camp.failures:
            o = camp.failures[CatalogueStatus.SILENT].observation
            return EngineOutcome("fuzz", CatalogueStatus.MISSED, secs, o.invariants, cases,
                                 f"silent violation instead of a shape error: {o.invariants} {o.messages[:1]}")
        if "SHAPE" in camp.failures:
            f = camp.failures["SHAPE"]
            case, o = shrunk(f.case, lambda x: x.outcome == Outcome.SHAPE_ERROR)
            o = o or f.observation
            shown = o.messages[0][:120] if kernel_level else o.messages[:1]
            return EngineOutcome("fuzz", CatalogueStatus.CAUGHT, secs, ["SHAPE"], cases,
                                 f"shape error reported as such ({shown}); no silent violation in {cases} cases",
                                 case_of(case, o, "defect on"))
        return EngineOutcome("fuzz", CatalogueStatus.MISSED, secs, [], cases, "no shape error in the budget")
    hit = camp.first(expect)
    if hit is not None:
        want = next(i for i in hit.observation.invariants if i in expect)
        case, o = shrunk(hit.case, lambda x: want in x.invariants)
        o = o or hit.observation
        return EngineOutcome("fuzz", CatalogueStatus.CAUGHT, secs, o.invariants, cases,
                             o.messages[0] if o.messages else "",
                             case_of(case, o, "defect on", invariant=want))
    other = sorted(camp.failures)
    return EngineOutcome("fuzz", CatalogueStatus.MISSED, secs, other, cases,
                         f"no {expect} in {cases} cases" + (f" (saw {other})" if other else ""))


def scenario_engine(family: Callable, on_policy: Policy, off_policy: Policy, expect: tuple, shape: bool = False):
    """The fuzz engine of a scenario entry: ``run(entry, on, budgets) -> EngineOutcome``."""
    def run(entry: Entry, on: bool, b: dict) -> EngineOutcome:
        n = b["on_cases"] if on else b["off_cases"]
        return targeted_fuzz(family, on_policy if on else off_policy, expect, n, on, b["shrink_steps"],
                             shape_entry=shape, entry_id=entry.id)
    return run


def kernel_engine(family: Callable, expect: tuple, shape: bool = False):
    """The fuzz engine of a kernel-level entry: the entry's switches on, none off."""
    def run(entry: Entry, on: bool, b: dict) -> EngineOutcome:
        n = b["kernel_on_cases"] if on else b["kernel_off_cases"]
        return targeted_fuzz(family, None, expect, n, on, b["shrink_steps"], shape_entry=shape, entry_id=entry.id,
                             defects=entry.switches if on else ())
    return run


def engine_from_data(run: dict):
    """The fuzz engine an entry's ``fuzz_run`` object describes."""
    from ..strategies import family, is_kernel_family

    gen, expect, shape = family(run["family"]), tuple(run["expect"]), bool(run.get("shape", False))
    if is_kernel_family(run["family"]):
        return kernel_engine(gen, expect, shape)
    return scenario_engine(gen, Policy.from_data(run["on"]), Policy.from_data(run["off"]), expect, shape)
