"""`prove`: run spec's z3 theorems for a policy and collect them into a RunSummary."""

from __future__ import annotations

import time
from typing import Iterable, Optional

from .errors import UsageError
from .finding_terms import apply_terms, case_file_terms, hint_for, replay_line
from .policy import Policy
from .summary import Check, Finding, RunSummary

#: The theorem about a fork's CP decode over sharded KV (docs/facts-fa3.md section 1, second path). It is a safety theorem
#: only for a backend that has that path (--cp-decode-sharded-kv); otherwise its refutation is reported, not failed.
SHARDED_KV_THEOREM = "4-sharded-kv-decode"


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
    the vLLM fork's tile choice (9).

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
        if failed and r.verdict == "refuted":
            invariant = str((r.witness or {}).get("invariant", r.name))
            finding = Finding(invariant=invariant, case_file=r.case_file, engine="prove", message=r.summary(),
                              replay=replay_line(r.case_file, policy.guard_spec), check=r.name)
            if r.case_file:
                apply_terms(finding, case_file_terms(r.case_file, policy.guard_spec, invariant))
            summary.findings.append(finding)
            at = getattr(r, "finished_s", solver_time)
            if summary.first_failure_s is None or at < summary.first_failure_s:
                summary.first_failure_s = at
    move_witnesses(summary, cases_dir)
    summary.elapsed_s = time.perf_counter() - start
    return summary


def expected_refutation(r, failed: bool) -> str:
    """Why a refuted theorem is not a failure under this policy ('' when it is one, or not refuted)."""
    if r.verdict != "refuted" or failed:
        return ""
    if r.name == SHARDED_KV_THEOREM:
        return "not applicable to this backend (no sharded-KV CP decode); its witness is informational"
    return ("the policy under test predicts this witness (a hazard its guard covers, or a drift the metadata "
            "cannot absorb); informational, not a violation")


def move_witnesses(summary: RunSummary, cases_dir: Optional[str]) -> None:
    """Case files of rows whose refutation is expected move to ``cases_dir/witnesses/`` (kept, but apart from the
    failures): a passing run leaves no case file that looks like a failure. A file a failed row also names stays."""
    import os

    from .finding_terms import WITNESS_SUBDIR

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


def prove_vllm(profile, timeout_s: float = 10.0, cases_dir: Optional[str] = None) -> RunSummary:
    """``prove --engine-profile vllm==V``: the ``vllm-flow`` theorem under the release's profile (gpu_impl.engines.vllm.theorems).

    A refutation is a failed check with its counterexample, written as a case file into ``cases_dir`` (replayable
    on ``vllm==V``: ``gpu_impl.engines.vllm.theorems.write_vllm_case``); an unknown is inconclusive.
    """
    from gpu_impl.engines.vllm.theorems import run_vllm_theorems

    start = time.perf_counter()
    summary = RunSummary(command="prove", policy={"engine_profile": f"vllm=={profile.release}",
                                                 **profile.to_dict()})
    for r in run_vllm_theorems(profile, timeout_s=timeout_s, cases_dir=cases_dir):
        failed = bool(r.failed or (not r.expected and not r.inconclusive))
        summary.checks.append(Check(name=r.name, kind="theorem", verdict=r.verdict, seconds=r.seconds,
                                    failed=failed, inconclusive=r.inconclusive, case_file=r.case_file,
                                    message=r.message or r.summary(), expected=expected_refutation(r, failed)))
        if failed and r.verdict == "refuted":
            invariant = str(r.witness.get("invariant", r.name))
            summary.findings.append(Finding(invariant=invariant, case_file=r.case_file, engine="prove",
                                            message=r.message, replay=replay_line(r.case_file), check=r.name,
                                            ran_on=f"the model of vllm=={profile.release}'s flow",
                                            hint=hint_for(invariant)))
            if summary.first_failure_s is None:
                summary.first_failure_s = r.seconds
    summary.elapsed_s = time.perf_counter() - start
    return summary
