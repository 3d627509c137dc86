"""`replay`: run a case file again and say whether it still fails the way the file says."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from .errors import UsageError
from .summary import Check, Finding, RunSummary


@dataclass
class ReplayOutcome:
    """What a replay observed next to what the case file expected."""

    expected_outcome: str
    expected_invariant: Optional[str]
    outcome: str
    invariants: list
    findings: list
    trace: list

    @property
    def still_fails(self) -> bool:
        """True when the case fails the way the file says (same outcome, and the same invariant if named)."""
        if self.expected_outcome == "pass":
            return False
        if self.outcome != self.expected_outcome and not (self.expected_outcome == "nan" and self.outcome == "violation"):
            return False
        return self.expected_invariant is None or self.expected_invariant in self.invariants


def load_case(path: str):
    """Load a case file; a missing or malformed file is a usage error naming the problem."""
    from spec.cases import Case, CaseFormatError

    try:
        return Case.load(path)
    except FileNotFoundError:
        raise UsageError(f"CASE: no such file: {path}") from None
    except CaseFormatError as exc:
        raise UsageError(f"CASE {path}: {exc}") from None


def scenario_from_case(case, guard_override: Optional[str] = None, metadata_heads: Optional[str] = None,
                       keep_stale: Optional[bool] = None):
    """The gpu_impl Scenario a case file describes; the CLI may override the policy."""
    from gpu_impl.config import ModelConfig, ServerConfig
    from gpu_impl.guards import GuardSpecError, load_guard
    from gpu_impl.scenario import Scenario, Step

    policy = dict(case.policy)
    guard_spec = guard_override or policy.get("guard", "fixed")
    try:
        guard = load_guard(guard_spec)
        server = ServerConfig.from_dict(case.server)
        model = ModelConfig.from_dict(case.model)
        steps = [Step(mode=b["mode"], seq_lens=list(b["seq_lens"]), extend_lens=b.get("extend_lens"))
                 for b in case.batches]
    except GuardSpecError as exc:
        raise UsageError(f"guard: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"case: {exc}") from None
    clear = policy.get("clear_stale_cp_metadata", True) if keep_stale is None else not keep_stale
    return Scenario(server=server, model=model, guard=guard, steps=steps, guard_spec=guard_spec,
                    metadata_heads=metadata_heads or policy.get("metadata_heads", "tp"),
                    clear_stale_cp_metadata=clear, seed=int(case.seed))


def replay(path: str, kernel_name: Optional[str] = None, device: str = "cpu", guard: Optional[str] = None,
           metadata_heads: Optional[str] = None, keep_stale: Optional[bool] = None,
           numerics: Optional[bool] = None, engine: Optional[str] = None,
           sut=None) -> tuple[RunSummary, ReplayOutcome]:
    """Replay one case on its engine (``engine`` overrides; ``sut`` supplies one already open); the summary
    fails (exit 1) when the case still fails as recorded."""
    from gpu_impl.guards import GuardRaised
    from gpu_impl.kernels import load

    from .engine_choice import engine_for_case, open_engine

    case = load_case(path)
    spec = sut.spec if sut is not None else engine_for_case(case, engine)
    if not spec.is_model:
        for option, value in (("--guard", guard), ("--metadata-heads", metadata_heads),
                              ("--keep-stale-cp-metadata", keep_stale)):
            if value:
                raise UsageError(f"{option}: does not apply when replaying on {spec} (the engine's own code "
                                 f"decides); use --engine model to replay on the model under another policy")
    scn = scenario_from_case(case, guard, metadata_heads, keep_stale)
    name = kernel_name or case.kernel.get("name", "emulated")
    kernel = load(name, mode=case.kernel.get("mode", "strict"), device=device)
    use_numerics = (name != "emulated") if numerics is None else numerics
    own = sut is None
    sut = open_engine(spec) if own else sut
    start = time.perf_counter()
    try:
        result = sut.run(scn, kernel=kernel, numerics=use_numerics, device=device)
        findings = [f.to_dict() for f in result.findings]
        outcome, trace = result.outcome, result.trace
    except GuardRaised as exc:
        findings = [{"invariant": "GUARD_RAISED", "message": str(exc), "step": None, "dp_rank": None, "detail": {}}]
        outcome, trace = "violation", []
    finally:
        if own:
            sut.close()
    elapsed = time.perf_counter() - start
    expected = case.expected or {}
    observed = ReplayOutcome(expected_outcome=expected.get("outcome", "violation"),
                             expected_invariant=expected.get("invariant"), outcome=outcome,
                             invariants=sorted({f["invariant"] for f in findings}), findings=findings, trace=trace)
    summary = RunSummary(command="replay", cases=1, failures=int(bool(findings)), elapsed_s=elapsed,
                         policy={"guard": scn.guard_spec, "metadata_heads": scn.metadata_heads,
                                 "clear_stale_cp_metadata": scn.clear_stale_cp_metadata})
    fails = observed.still_fails
    summary.failures = int(fails)
    msg = "; ".join(f"{f['invariant']} at step {f['step']} rank {f['dp_rank']}: {f['message']}" for f in findings[:3])
    summary.checks.append(Check(name=f"replay {path}" + ("" if spec.is_model else f" on {spec}"), kind="replay",
                                verdict="fail" if fails else "pass", seconds=elapsed, failed=fails, case_file=path,
                                message=msg or f"outcome {outcome} (expected {observed.expected_outcome})"))
    if fails:
        for f in findings:
            summary.findings.append(Finding(invariant=f["invariant"], case_file=path,
                                            engine="replay" if spec.is_model else f"replay on {spec}",
                                            message=f["message"]))
    return summary, observed
