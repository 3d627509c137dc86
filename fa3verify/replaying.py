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

    @property
    def fails(self) -> bool:
        """True when the replay observed anything but a clean pass (a violation, NaN, a shape error, a guard
        fault): never exit 0, whatever the case file expected."""
        return self.outcome != "pass" or bool(self.findings)

    @property
    def verdict(self) -> str:
        """PASSES NOW / PASSES (as expected) / STILL FAILS / FAILS DIFFERENTLY."""
        if not self.fails:
            return "PASSES (as expected)" if self.expected_outcome == "pass" else "PASSES NOW"
        return "STILL FAILS" if self.still_fails else "FAILS DIFFERENTLY (not as the case file expected)"


#: Names a replay can report besides spec.invariants.INVARIANTS (gpu_impl.scenario and the guard faults).
SCENARIO_FINDINGS = ("MATCHES_ORACLE", "NO_NAN", "CP_PATH_MATCHES_ACTIVITY", "CP_LAYOUT_MATCHES_BATCH",
                     "CP_RANKS_AGREE")

#: A replay with tensors (--numerics, or the real kernel) refuses batches with more KV tokens than this.
MAX_NUMERICS_KV_TOKENS = 1 << 20


def known_invariants() -> list:
    """Every invariant name a case's expected.invariant may name."""
    from spec.guards import GUARD_FAULTS
    from spec.invariants import INVARIANTS

    return sorted(set(INVARIANTS) | set(GUARD_FAULTS) | set(SCENARIO_FINDINGS))


def unmodelled(case) -> Optional[str]:
    """Why the scenario runner cannot replay this case faithfully, or None (then the replay is inconclusive)."""
    if case.policy.get("cp_decode_kv", "replicated") != "replicated":
        return ("policy.cp_decode_kv is 'sharded' (a fork's CP decode over sharded KV): the scenario runner models "
                "only replicated KV, so replaying it as replicated would prove nothing")
    if case.server.get("cp_decode_sharded_kv"):
        return "server.cp_decode_sharded_kv is true: the scenario runner models only replicated KV"
    pinned = [f"batches[{i}].{k}" for i, b in enumerate(case.batches) for k in ("dp_rank", "cp_metadata") if k in b]
    if pinned:
        return f"{pinned[0]} is not modelled by the scenario runner (batches are split over DP ranks round-robin)"
    return None


def load_case(path: str):
    """Load a case file; a missing or malformed file is a usage error naming the problem."""
    from spec.cases import Case, CaseFormatError

    from .outputs import read_text

    text = read_text(path, "CASE")
    try:
        case = Case.from_json(text)
    except CaseFormatError as exc:
        raise UsageError(f"CASE {path}: {exc}") from None
    inv = case.expected.get("invariant")
    if inv is not None and inv not in known_invariants():
        raise UsageError(f"CASE {path}: expected.invariant: expected one of {', '.join(known_invariants())}, "
                         f"got {inv!r}")
    return case


def scenario_from_case(case, guard_override: Optional[str] = None, metadata_heads: Optional[str] = None,
                       keep_stale: Optional[bool] = None, trust_case_guard: bool = False):
    """The gpu_impl Scenario a case file describes; the CLI may override the policy (trust: fa3verify.trust)."""
    from gpu_impl.config import ModelConfig, ServerConfig
    from gpu_impl.guards import GuardSpecError, load_guard
    from gpu_impl.scenario import Scenario, Step

    from .trust import guard_to_run

    policy = dict(case.policy)
    guard_spec = guard_to_run(policy.get("guard", "fixed"), guard_override, trust_case_guard)
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
                    clear_stale_cp_metadata=clear, seed=int(case.seed),
                    graph_replay_seqlen_k=str(policy.get("graph_replay_seqlen_k", "max_seq_len")))


def replay(path: str, kernel_name: Optional[str] = None, device: str = "cpu", guard: Optional[str] = None,
           metadata_heads: Optional[str] = None, keep_stale: Optional[bool] = None,
           numerics: Optional[bool] = None, trust_case_guard: bool = False, engine: Optional[str] = None,
           sut=None) -> tuple[RunSummary, ReplayOutcome]:
    """Replay one case on its engine (``engine`` overrides; ``sut`` supplies one already open); the summary
    fails (exit 1) whenever the replay observes a violation or a guard fault, and is inconclusive (exit 3) when
    the case needs a path the scenario runner does not model."""
    from gpu_impl.guards import GuardRaised
    from gpu_impl.kernels import load

    from .engine_choice import engine_for_case, open_engine

    case = load_case(path)
    expected = case.expected or {}
    why_not = unmodelled(case)
    if why_not:
        return _not_modelled(path, case, why_not)
    spec = sut.spec if sut is not None else engine_for_case(case, engine)
    if not spec.is_model:
        for option, value in (("--guard", guard), ("--metadata-heads", metadata_heads),
                              ("--keep-stale-cp-metadata", keep_stale)):
            if value:
                raise UsageError(f"{option}: does not apply when replaying on {spec} (the engine's own code "
                                 f"decides); use --engine model to replay on the model under another policy")
    scn = scenario_from_case(case, guard, metadata_heads, keep_stale, trust_case_guard)
    name = kernel_name or case.kernel.get("name", "emulated")
    use_numerics = (name != "emulated") if numerics is None else numerics
    if use_numerics:
        for i, b in enumerate(case.batches):
            if sum(b["seq_lens"]) > MAX_NUMERICS_KV_TOKENS:
                raise UsageError(f"CASE {path}: batches[{i}].seq_lens: at most {MAX_NUMERICS_KV_TOKENS} KV tokens "
                                 f"per batch with tensors (--numerics or a real kernel), got {sum(b['seq_lens'])}; "
                                 f"replay without --numerics to check the metadata only")
    kernel = load(name, mode=case.kernel.get("mode", "strict"), device=device)
    own = sut is None
    sut = open_engine(spec) if own else sut
    start = time.perf_counter()
    try:
        result = sut.run(scn, kernel=kernel, numerics=use_numerics, device=device)
        findings = [f.to_dict() for f in result.findings]
        outcome, trace = result.outcome, result.trace
    except GuardRaised as exc:
        findings = [{"invariant": exc.invariant, "message": str(exc), "step": None, "dp_rank": None, "detail": {}}]
        outcome, trace = "violation", []
    except Exception as exc:
        from .engine_choice import is_unsupported

        if not is_unsupported(exc):
            raise
        raise UsageError(f"--engine: {spec} cannot run this case: {exc}") from None
    finally:
        if own:
            sut.close()
    elapsed = time.perf_counter() - start
    observed = ReplayOutcome(expected_outcome=expected.get("outcome", "violation"),
                             expected_invariant=expected.get("invariant"), outcome=outcome,
                             invariants=sorted({f["invariant"] for f in findings}), findings=findings, trace=trace)
    summary = RunSummary(command="replay", cases=1, failures=int(bool(findings)), elapsed_s=elapsed,
                         policy={"guard": scn.guard_spec, "metadata_heads": scn.metadata_heads,
                                 "clear_stale_cp_metadata": scn.clear_stale_cp_metadata})
    fails = observed.fails
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


def _not_modelled(path: str, case, why: str) -> tuple[RunSummary, ReplayOutcome]:
    expected = case.expected or {}
    observed = ReplayOutcome(expected_outcome=expected.get("outcome", "violation"),
                             expected_invariant=expected.get("invariant"), outcome="not-modelled", invariants=[],
                             findings=[], trace=[])
    summary = RunSummary(command="replay", cases=0, policy=dict(case.policy))
    summary.checks.append(Check(name=f"replay {path}", kind="replay", verdict="inconclusive", seconds=0.0,
                                inconclusive=True, case_file=path, message=why))
    return summary, observed
