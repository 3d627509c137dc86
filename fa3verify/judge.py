"""The one judge: run a scenario on a system under test and say what it did, in one violation type.

Invariant: every harness path that runs a scenario (fuzz and its shrinking, replay, run-ranks in-process,
prove's witness replay, conform, the multi-rank simulation and the finding terms) turns the run into a
:class:`Verdict` here, so a fault reads the same on every surface:

- a guard that raises (or exits, or returns a non-bool) is a ``GUARD_RAISED`` violation, a guard past its deadline
  (``--guard-timeout-s``) a ``GUARD_TIMEOUT`` violation (``spec.model.guards.GUARD_FAULTS``);
- FA3 ending the process (a modelled ``refmodel.errors.ProcessAbort``: a zero-block prepare launch, a host SIGFPE)
  is a ``PROCESS_ABORT`` violation: loud, but every request on a server's process is lost;
- a scenario the system under test does not run (``gpu_impl.sut.ScenarioUnsupported``) is the outcome
  "unsupported": skipped and counted, never a pass and never a violation;
- any other exception is re-raised, or with ``crash_is_finding`` is a ``NO_CRASH`` violation; a worker that missed
  its deadline (``spec.process.worker_client.WorkerError``) is always re-raised (inconclusive, never a finding).

Every finding is a :class:`spec.violation.Violation` located in the run (``Violation.at_step``); a fault's
finding has no step and no DP rank (``step`` None) and its signature is its invariant alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["Verdict", "judge", "FAULTS", "fault_finding"]

#: The findings a run's fault gives (besides the invariants a finished run reports).
FAULTS = ("GUARD_RAISED", "GUARD_TIMEOUT", "PROCESS_ABORT", "NO_CRASH")


@dataclass
class Verdict:
    """What one scenario did on a system under test: its outcome, its findings, and the run's result.

    ``outcome``: "pass", "violation", "shape_error" (FA3's loud shape check) or "unsupported" (the system does not
    run this scenario; ``reason`` says why). ``result`` is the run's ``ScenarioResult`` (None when the run ended in a
    fault or was unsupported).
    """

    outcome: str
    findings: list = field(default_factory=list)
    result: Any = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        """True when nothing was found (a pass, a loud shape error, or an unsupported scenario)."""
        return not self.findings

    @property
    def unsupported(self) -> bool:
        return self.outcome == "unsupported"

    @property
    def invariants(self) -> list:
        """The distinct invariants of the findings, sorted."""
        return sorted({f.invariant for f in self.findings})

    @property
    def trace(self) -> list:
        """The run's FA3 events ([] when it did not finish)."""
        return list(self.result.trace) if self.result is not None else []

    @property
    def shape_errors(self) -> list:
        return list(self.result.shape_errors) if self.result is not None else []

    @property
    def fault(self) -> Optional[str]:
        """The message of the fault that ended the run (a guard fault, an abort, a crash), else None."""
        if self.result is None and self.findings:
            return self.findings[0].message
        return None

    def finding_dicts(self) -> list:
        """The findings as JSON-ready dicts (``Finding.to_dict``)."""
        return [f.to_dict() for f in self.findings]


def fault_finding(invariant: str, message: str):
    """The finding of a fault that ended a run: no step, no DP rank; its signature is the invariant."""
    from spec.violation import Violation

    return Violation.at_step(invariant=invariant, step=None, dp_rank=None, message=message, signature_key=invariant)


def judge(sut, scenario, kernel=None, numerics: bool = False, device: str = "cpu",
          crash_is_finding: bool = False) -> Verdict:
    """Run ``scenario`` on ``sut`` (default: the model) and judge it (module docstring: one meaning per fault)."""
    from gpu_impl.guards import GuardRaised
    from gpu_impl.sut import ModelSUT, ScenarioUnsupported
    from refmodel.errors import ProcessAbort
    from spec.process.worker_client import WorkerError

    sut = ModelSUT() if sut is None else sut
    try:
        result = sut.run(scenario, kernel=kernel, numerics=numerics, device=device)
    except GuardRaised as exc:  # GuardTimeout is one: its invariant is GUARD_TIMEOUT
        return Verdict("violation", [fault_finding(exc.invariant, str(exc))])
    except ProcessAbort as exc:
        return Verdict("violation", [fault_finding("PROCESS_ABORT", str(exc))])
    except ScenarioUnsupported as exc:
        return Verdict("unsupported", reason=str(exc))
    except WorkerError:
        raise  # a missed deadline or a dead worker: inconclusive, never a finding
    except Exception as exc:
        if not crash_is_finding:
            raise
        return Verdict("violation", [fault_finding("NO_CRASH", f"{type(exc).__name__}: {exc}")])
    return Verdict(result.outcome, list(result.findings), result)
