"""`gate`: the proofs a system under test names for itself, then fuzz on it; one table, one exit code.

Invariant: one gate for every system under test. Its proof stages are the system's own answer
(``SystemUnderTest.proof_plan()``, data): the model's is every theorem under the policy it was constructed with
(``ModelSUT(policy=...)``, :func:`fa3verify.proving.prove`); a real engine's is the witness searches of its release's
profile run on the model and replayed on it, plus vLLM's flow theorem where its registry row says so
(:mod:`fa3verify.engine_gate`). The fuzz stage then runs on the same system under the same policy
(:func:`fa3verify.fuzzing.fuzz`). This is what a backend change runs in CI (``fa3verify gate``, ``api.gate``,
the engine matrix).
"""

from __future__ import annotations

import time
from typing import Optional

from .summary import RunSummary


def _theorems(sut, policy, summary, options, lines, command="gate") -> None:
    """Every theorem (spec.theorems) under the system's policy."""
    from .progress import stage
    from .proving import prove

    with stage(command, "prove (z3 theorems)", lines,
               result=lambda: f"{len(summary.checks)} theorems, {sum(c.failed for c in summary.checks)} failed"):
        summary.merge(prove(policy, timeout_s=options["timeout_s"], cases_dir=options["cases_dir"]))


def _witnesses(sut, policy, summary, options, lines, command="gate") -> None:
    """The witness searches of the system's release profile (z3 on the model), replayed on it."""
    from .engine_gate import witness_stages

    witness_stages(sut, summary, lines=lines, **options)


def _flow_theorem(sut, policy, summary, options, lines, command="gate") -> None:
    """vLLM's flow theorem under the release's profile, its counterexample replayed on the engine."""
    from .engine_gate import flow_stage

    flow_stage(sut, summary, lines=lines, **options)


#: The proof stages a system under test may name in its ``proof_plan()``, run in the order it names them.
STAGES = {"theorems": _theorems, "witnesses": _witnesses, "flow-theorem": _flow_theorem}


def gate(sut=None, budget_s: Optional[float] = 20.0, seed: int = 0, timeout_s: float = 10.0,
         cases_dir: str = "fa3verify-out/cases", kernel_name: str = "emulated", device: str = "cpu",
         max_cases: Optional[int] = None, show_progress: Optional[bool] = None, witnesses: bool = True,
         witness_cache: Optional[dict] = None, command: str = "gate") -> RunSummary:
    """Run the proof stages ``sut`` names (default ``ModelSUT()`` under the default policy), then fuzz on it, and
    merge them into the gate's summary. ``witnesses=False`` skips the proof stages (fuzz only);
    ``witness_cache`` shares witness searches between gates (the engine matrix: each search runs once).

    An interrupt (SIGINT) during the proofs stops the gate there; during fuzz the campaign keeps what it found.
    Either way the summary is marked interrupted (exit 3) and returned, so the command still writes its reports.
    """
    from gpu_impl.sut import ModelSUT

    from spec.model.assumption_facts import not_enforced

    from .engine_choice import case_policy
    from .fuzzing import fuzz, sut_policy
    from .progress import stage

    start = time.perf_counter()
    policy = sut_policy(sut)
    sut = ModelSUT(policy=policy) if sut is None else sut
    # an engine whose own code decides names itself in the summary's policy (its plugin's answer)
    summary = RunSummary(command=command, seed=seed,
                         policy=sut.spec.plugin.summary_policy(case_policy(policy, sut), sut.spec))
    facts = sut.assumption_facts()
    if facts:  # what the system under test says about itself: the assumptions its own code lets through
        summary.policy["not_enforced_assumptions"] = not_enforced(facts)
    lines = None if show_progress is None else False  # API callers choose; the CLI prints on logs
    options = dict(timeout_s=timeout_s, cases_dir=cases_dir, kernel_name=kernel_name, device=device,
                   witness_cache=witness_cache)
    try:
        for name in (sut.proof_plan() if witnesses else ()):
            STAGES[name](sut, policy, summary, options, lines, command)
    except KeyboardInterrupt:
        summary.interrupted = True
    if not summary.interrupted:
        what = f"{max_cases} cases" if max_cases else f"{budget_s:g} s"
        on = sut.spec.plugin.run_label(sut.spec)
        fuzzed = RunSummary(command=command)
        with stage(command, f"fuzz{on} ({kernel_name} kernel, {what})", lines,
                   result=lambda: f"{fuzzed.cases} cases, {fuzzed.failures} failing") as end:
            fuzzed = fuzz(sut, kernel_name=kernel_name, device=device, seed=seed, budget_s=budget_s,
                          max_cases=max_cases, out_dir=cases_dir, show_progress=show_progress)
            if end is not None:  # a stand-in stage may hand the block nothing
                end.interrupted = fuzzed.interrupted
        summary.merge(fuzzed)
    summary.elapsed_s = time.perf_counter() - start
    return summary
