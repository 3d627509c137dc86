"""The one judge: run a scenario (or one kernel-level FA3 call) on a system under test and say what it did, in one
finding type (:class:`spec.finding.Finding`) and one outcome enum (:class:`spec.finding.Outcome`).

Invariant: every harness path that runs a scenario (fuzz and its shrinking, replay, run-ranks in-process,
prove's witness replay, conform, the engine matrix's family probes, the multi-rank simulation and the finding
terms) turns the run into a :class:`Verdict` with :func:`judge`, and every kernel-level case (the catalogue's
kernel families, their replay) with :func:`judge_call`, so a fault reads the same on every surface:

- a guard that raises (or exits, or returns a non-bool) is a ``GUARD_RAISED`` violation, a guard past its deadline
  (``--guard-timeout-s``) a ``GUARD_TIMEOUT`` violation (``spec.model.guards.GUARD_FAULTS``);
- FA3 ending the process (a modelled ``refmodel.errors.ProcessAbort``: a zero-block prepare launch, a host SIGFPE)
  is a ``PROCESS_ABORT`` violation: loud, but every request on a server's process is lost;
- a scenario the system under test does not run (``gpu_impl.sut.ScenarioUnsupported``) is the outcome
  ``UNSUPPORTED``: skipped and counted, never a pass and never a violation;
- any other exception is re-raised, or with ``crash_is_finding`` is a ``NO_CRASH`` violation, or with
  ``crash_is_error`` the outcome ``ERROR`` (the exception kept on the verdict: the matrix's probes report it as
  their row's error); a worker that missed its deadline (``spec.process.worker_client.WorkerError``) is always
  re-raised (inconclusive, never a finding);
- on one kernel-level call (:func:`judge_call`): FA3's loud shape check is ``SHAPE_ERROR``, FA3's own rejection
  (``FA3_REJECTS_<FIELD>``) and a ValueError naming the argument are ``CLEAR_ERROR`` (allowed), an out-of-bounds
  access is its invariant's violation, and any other exception a ``NO_CRASH`` violation.

Every finding of a scenario is located in the run (``Finding.at_step``); a fault's finding has no step and no DP
rank (``step`` None) and its signature is its invariant alone (``Finding.fault``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from spec.finding import Finding, Outcome

__all__ = ["Verdict", "judge", "judge_call", "FAULTS", "fault_finding", "Outcome"]

#: The findings a run's fault gives (besides the invariants a finished run reports).
FAULTS = ("GUARD_RAISED", "GUARD_TIMEOUT", "PROCESS_ABORT", "NO_CRASH")


@dataclass
class Verdict:
    """What one scenario (or one kernel-level call) did on a system under test: its outcome, its findings, and the
    run's result.

    ``outcome``: an :class:`Outcome` (PASS, VIOLATION, SHAPE_ERROR: FA3's loud shape check, CLEAR_ERROR: a
    rejection naming the argument, UNSUPPORTED: the system does not run this scenario, ``reason`` says why, ERROR:
    it crashed, ``error`` is the exception). ``result`` is the run's ``ScenarioResult`` (None when the run ended in a
    fault, was unsupported, or was one kernel call). ``refusals``: a kernel call's loud refusal (its shape check's or
    its argument check's, as a finding; a scenario's are its result's ``shape_errors``).
    """

    outcome: Outcome
    findings: list = field(default_factory=list)
    result: Any = None
    reason: str = ""
    refusals: list = field(default_factory=list)
    error: Optional[BaseException] = None

    @property
    def ok(self) -> bool:
        """True when nothing was found (a pass, a loud shape error, or an unsupported scenario)."""
        return not self.findings

    @property
    def unsupported(self) -> bool:
        return self.outcome == Outcome.UNSUPPORTED

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
        return list(self.result.shape_errors) if self.result is not None else list(self.refusals)

    @property
    def fault(self) -> Optional[str]:
        """The message of the fault that ended the run (a guard fault, an abort, a crash), else None."""
        if self.result is None and self.findings:
            return self.findings[0].message
        return None


def fault_finding(invariant: str, message: str) -> Finding:
    """The finding of a fault that ended a run: no step, no DP rank; its signature is the invariant."""
    return Finding.fault(invariant, message)


def judge(sut, scenario, kernel=None, numerics: bool = False, device: str = "cpu",
          crash_is_finding: bool = False, crash_is_error: bool = False) -> Verdict:
    """Run ``scenario`` on ``sut`` (default: the model) and judge it (module docstring: one meaning per fault)."""
    from gpu_impl.guards import GuardRaised
    from gpu_impl.sut import ScenarioUnsupported
    from gpu_impl.engines.model.sut import ModelSUT
    from refmodel.errors import ProcessAbort
    from spec.process.worker_client import WorkerError

    sut = ModelSUT() if sut is None else sut
    try:
        result = sut.run(scenario, kernel=kernel, numerics=numerics, device=device)
    except GuardRaised as exc:  # GuardTimeout is one: its invariant is GUARD_TIMEOUT
        return Verdict(Outcome.VIOLATION, [fault_finding(exc.invariant, str(exc))])
    except ProcessAbort as exc:
        return Verdict(Outcome.VIOLATION, [fault_finding("PROCESS_ABORT", str(exc))])
    except ScenarioUnsupported as exc:
        return Verdict(Outcome.UNSUPPORTED, reason=str(exc), error=exc)
    except WorkerError:
        raise  # a missed deadline or a dead worker: inconclusive, never a finding
    except Exception as exc:
        if crash_is_error:
            return Verdict(Outcome.ERROR, reason=f"{type(exc).__name__}: {exc}", error=exc)
        if not crash_is_finding:
            raise
        return Verdict(Outcome.VIOLATION, [fault_finding("NO_CRASH", f"{type(exc).__name__}: {exc}")])
    return Verdict(Outcome(result.outcome), list(result.findings), result)


def judge_call(call: Callable[[], Any], check: Callable[[Any], list]) -> Verdict:
    """Run one kernel-level FA3 call and judge it: ``call()`` makes the call (what it raises is judged as the module
    docstring says), ``check(what_it_returned)`` compares its output with the oracle (``gpu_impl.oracle_check``) and
    returns the findings (outside the judged call: an oracle that fails is the harness's error, never the kernel's).
    A refusal's finding names FA3's rejected field (``FA3_REJECTS_<FIELD>``) or nothing (invariant ``""``: the shape
    check, a ValueError); its message is what the call said. Every finding's signature is its invariant."""
    from gpu_impl.errors import FA3Rejected, MetadataShapeError, OutOfBoundsAccess

    try:
        returned = call()
    except MetadataShapeError as exc:
        return Verdict(Outcome.SHAPE_ERROR, refusals=[Finding("", message=str(exc))])
    except FA3Rejected as exc:  # FA3's own TORCH_CHECK: loud and safe, named by the field it refuses
        return Verdict(Outcome.CLEAR_ERROR, refusals=[Finding(f"FA3_REJECTS_{exc.field.upper()}",
                                                              message=f"{type(exc).__name__}: {exc}")])
    except OutOfBoundsAccess as exc:
        return Verdict(Outcome.VIOLATION, [fault_finding(exc.invariant, str(exc))])
    except (ValueError, NotImplementedError) as exc:
        return Verdict(Outcome.CLEAR_ERROR, refusals=[Finding("", message=f"{type(exc).__name__}: {exc}")])
    except Exception as exc:  # noqa: BLE001 - an unhandled exception is the NO_CRASH finding
        return Verdict(Outcome.VIOLATION, [fault_finding("NO_CRASH", f"{type(exc).__name__}: {exc}")])
    found = [fault_finding(f.invariant, f.message) for f in check(returned)]
    return Verdict(Outcome.VIOLATION if found else Outcome.PASS, found)
