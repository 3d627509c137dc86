"""Gating real engine code: the prover's witnesses replayed on the engine, and the fuzz campaign run on it.

Invariant: on a real engine every verdict comes from running that engine's own code; the model only supplies
inputs. The gate's rows are (1) the z3 theorems that search for hazardous configurations, run on the model
with no guard and sglang's ``tp`` head counts (the backend as it was before any fix, so every configuration
where reusing metadata can overflow has a witness), shown for information; (2) each distinct witness replayed
on the engine (fails if the engine's calls break an invariant there); on vLLM also (2') its own theorem,
``vllm-flow`` under the release's profile, counting like a prove row; (3) the fuzz campaign on the engine.
Findings are case files carrying the engine (``spec.cases`` ``engine``), which replay on it.

``prove --engine X`` uses :func:`replay_witnesses` too: the theorems run under the chosen model policy, and
each refuted theorem's witness is replayed on X.
"""

from __future__ import annotations

import time
from typing import Optional

from .summary import Check, Finding, RunSummary

#: Theorems whose witnesses are whole scenarios (server configuration, model, batches) an engine can run.
WITNESS_THEOREMS = ("3-hazard", "4-guard-soundness")
#: The model policy the witness search runs under: no guard, precompute heads H // tp_size.
WITNESS_POLICY = ("none", "tp")


def witness_search(timeout_s: float, cases_dir: str) -> list:
    """Theorem rows of the witness search (informational: not failed); their case files are the witnesses."""
    from .policy import load_policy
    from .proving import theorem_results

    policy = load_policy(*WITNESS_POLICY)
    rows = []
    for r in theorem_results(policy, timeout_s=timeout_s, cases_dir=cases_dir, only=list(WITNESS_THEOREMS)):
        if r.name not in WITNESS_THEOREMS:
            continue
        rows.append(Check(name=f"witness search: {r.name}", kind="theorem", verdict=r.verdict, seconds=r.seconds,
                          failed=False, inconclusive=r.inconclusive, case_file=r.case_file,
                          message=f"on the model with no guard and tp heads (inputs for the engine, not a verdict "
                                  f"on it): {r.message or r.summary()}"))
    return rows


def replay_witnesses(sut, case_files, cases_dir: str, kernel=None) -> tuple[list, list]:
    """Run each distinct witness case on the engine; (check rows, findings). A violation on the engine fails its
    row and is saved as a case file carrying the engine."""
    from gpu_impl.guards import GuardRaised

    from .engine_choice import is_unsupported
    from .replaying import load_case, scenario_from_case

    checks, findings, seen = [], [], set()
    for path in case_files:
        if not path or path in seen:
            continue
        seen.add(path)
        case = load_case(path)
        scn = scenario_from_case(case)
        start = time.perf_counter()
        try:
            result = sut.run(scn, kernel=kernel)
            found = [f.to_dict() for f in result.findings]
        except GuardRaised as exc:
            found = [{"invariant": "GUARD_RAISED", "message": str(exc), "step": None, "dp_rank": None, "detail": {}}]
        except Exception as exc:
            if not is_unsupported(exc):
                raise
            checks.append(Check(name=f"witness {case.source.split(':', 1)[-1]} on {sut.spec}", kind="replay",
                                verdict="inconclusive", seconds=time.perf_counter() - start, inconclusive=True,
                                case_file=path, message=f"the engine does not run this witness: {exc}"))
            continue
        seconds = time.perf_counter() - start
        saved = save_engine_case(case, found[0], sut, cases_dir) if found else None
        msg = ("; ".join(f"{f['invariant']} at step {f['step']} dp rank {f['dp_rank']}: {f['message']}"
                         for f in found[:2]) if found else f"no violation on {sut.spec}")
        checks.append(Check(name=f"witness {case.source.split(':', 1)[-1]} on {sut.spec}", kind="replay",
                            verdict="fail" if found else "pass", seconds=seconds, failed=bool(found),
                            case_file=saved or path, message=msg))
        if found:
            findings.append(Finding(invariant=found[0]["invariant"], case_file=saved, engine=f"witness on {sut.spec}",
                                    message=found[0]["message"], replay=f"fa3verify replay {saved}"))
    return checks, findings


def vllm_flow_rows(sut, timeout_s: float, cases_dir: str, kernel=None) -> RunSummary:
    """vLLM's own theorem for the gate: ``vllm-flow`` under the release's profile (``prove --engine-profile
    vllm==V``, a failed row when refuted), its counterexample replayed on the engine; a release without a profile
    is an inconclusive row (the theorem cannot run), never a pass."""
    from spec.engine_profiles_vllm import VllmProfileError, vllm_profile_for

    from .proving import prove_vllm

    try:
        profile = vllm_profile_for(sut.spec.release)
    except VllmProfileError as exc:
        out = RunSummary(command="gate")
        out.checks.append(Check(name="vllm-flow", kind="theorem", verdict="inconclusive", seconds=0.0,
                                inconclusive=True,
                                message=f"{exc}: the flow theorem needs the release's profile "
                                        f"(spec/engine_profiles_vllm.json; `conform --engine {sut.spec}` checks one)"))
        return out
    out = prove_vllm(profile, timeout_s=timeout_s, cases_dir=cases_dir)
    refuted = [c.case_file for c in out.checks if c.verdict == "refuted" and c.case_file]
    if refuted:
        checks, findings = replay_witnesses(sut, refuted, cases_dir, kernel=kernel)
        out.checks.extend(checks)
        out.findings.extend(findings)
    return out


def save_engine_case(case, finding: dict, sut, cases_dir: str) -> str:
    """The witness as a case found on the engine: same scenario, the engine's identity, the release's profile."""
    from spec.cases import Case

    from .engine_choice import identity_of, profile_of

    profile = profile_of(sut.spec)
    policy = profile.policy() if profile is not None else case.policy
    c = Case.from_parts(source=case.source, server=case.server, model=case.model, policy=policy,
                        batches=case.batches, kernel=case.kernel, seed=case.seed, engine=identity_of(sut),
                        expected={"outcome": "violation", "invariant": finding["invariant"],
                                  "detail": {"message": finding["message"]}},
                        notes=f"model witness {case.id} replayed on {sut.spec}")
    return str(c.save(cases_dir))


def gate_engine(sut, budget_s: Optional[float] = 20.0, seed: int = 0, timeout_s: float = 10.0,
                cases_dir: str = "fa3verify-out/cases", kernel_name: str = "emulated", device: str = "cpu",
                max_cases: Optional[int] = None, show_progress: Optional[bool] = None,
                witnesses: bool = True, witness_rows: Optional[list] = None) -> RunSummary:
    """The gate on a real engine: witness search (model), witnesses replayed on the engine, fuzz on the engine.
    ``witness_rows`` reuses a search already made (the engine matrix searches once for every release)."""
    from gpu_impl.kernels import load

    from .engine_choice import case_policy
    from .fuzzing import fuzz
    from .policy import load_policy
    from .progress import stage

    start = time.perf_counter()
    default = load_policy()
    summary = RunSummary(command="gate", seed=seed, policy={**case_policy(default, sut), "engine": str(sut.spec)})
    lines = None if show_progress is None else False  # API callers choose; the CLI prints on logs

    def failed(rows) -> str:
        return f"{len(rows)} rows, {sum(c.failed for c in rows)} failed"

    if witnesses:
        kernel = load(kernel_name, mode="strict", device=device)
        if witness_rows is not None:
            rows = witness_rows
        else:
            with stage("gate", "witness search (z3 on the model)", lines, result=lambda: failed(rows)):
                rows = witness_search(timeout_s, cases_dir)
        summary.checks.extend(rows)
        checks: list = []
        with stage("gate", f"witness replay on {sut.spec}", lines, result=lambda: failed(checks)):
            checks, findings = replay_witnesses(sut, [r.case_file for r in rows], cases_dir, kernel=kernel)
        summary.checks.extend(checks)
        summary.findings.extend(findings)
        if sut.spec.kind == "vllm":
            flow = RunSummary(command="gate")
            with stage("gate", "vllm-flow theorem (z3 under the release's profile)", lines,
                       result=lambda: failed(flow.checks)):
                flow = vllm_flow_rows(sut, timeout_s, cases_dir, kernel=kernel)
            summary.merge(flow)
    what = f"{max_cases} cases" if max_cases else f"{budget_s:g} s"
    fuzzed = RunSummary(command="gate")
    with stage("gate", f"fuzz on {sut.spec} ({kernel_name} kernel, {what})", lines,
               result=lambda: f"{fuzzed.cases} cases, {fuzzed.failures} failing"):
        fuzzed = fuzz(default, kernel_name=kernel_name, device=device, seed=seed, budget_s=budget_s,
                      max_cases=max_cases, out_dir=cases_dir, show_progress=show_progress, sut=sut)
    summary.merge(fuzzed)
    summary.elapsed_s = time.perf_counter() - start
    return summary
