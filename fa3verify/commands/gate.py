"""fa3verify gate: prove + fuzz for a backend policy; the job a backend change runs in CI.

Invariant: one gate for every system under test. Its proof stages are the system's own answer
(``SystemUnderTest.proof_plan()``, data): the model's is every theorem under the policy it was constructed with
(``ModelSUT(policy=...)``, :func:`fa3verify.commands.prove.prove`); a real engine's is the witness searches of its release's
profile run on the model and replayed on it, plus the engine's own flow theorem where its plugin's proof stages
say so (:mod:`fa3verify.engine_gate`). The fuzz stage then runs on the same system under the same policy
(:func:`fa3verify.commands.fuzz.fuzz`). This is what a backend change runs in CI (``fa3verify gate``, ``api.gate``,
the engine matrix).
"""

from __future__ import annotations

import argparse
import time
from typing import Optional

from ..engine_choice import add_engine_argument
from .arguments import budget_from_args, with_engine_examples
from ..policy import add_policy_arguments
from ..summary import RunSummary, write_reports


def _theorems(sut, policy, summary, options, lines, command="gate") -> None:
    """Every theorem (spec.theorems) under the system's policy."""
    from ..progress import stage
    from .prove import prove

    with stage(command, "prove (z3 theorems)", lines,
               result=lambda: f"{len(summary.checks)} theorems, {sum(c.failed for c in summary.checks)} failed"):
        summary.merge(prove(policy, timeout_s=options["timeout_s"], cases_dir=options["cases_dir"]))


def _witnesses(sut, policy, summary, options, lines, command="gate") -> None:
    """The witness searches of the system's release profile (z3 on the model), replayed on it."""
    from ..engine_gate import witness_stages

    witness_stages(sut, summary, lines=lines, **options)


def _flow_theorem(sut, policy, summary, options, lines, command="gate") -> None:
    """The engine's own flow theorem under the release's profile, its counterexample replayed on the engine."""
    from ..engine_gate import flow_stage

    flow_stage(sut, summary, lines=lines, **options)


#: The proof stages a system under test may name in its ``proof_plan()``, run in the order it names them.
STAGES = {"theorems": _theorems, "witnesses": _witnesses, "flow-theorem": _flow_theorem}


def gate(sut=None, budget_s: Optional[float] = 20.0, seed: int = 0, timeout_s: float = 10.0,
         cases_dir: str = "fa3verify-out/cases", kernel_name: str = "emulated", device: str = "cpu",
         max_cases: Optional[int] = None, show_progress: Optional[bool] = None, witnesses: bool = True,
         witness_cache: Optional[dict] = None, command: str = "gate", z3_cache: bool = False) -> RunSummary:
    """Run the proof stages ``sut`` names (default ``ModelSUT()`` under the default policy), then fuzz on it, and
    merge them into the gate's summary. ``witnesses=False`` skips the proof stages (fuzz only);
    ``witness_cache`` shares witness searches between gates (the engine matrix: each search runs once);
    ``z3_cache`` keeps an engine's witness searches and flow theorem across runs (:mod:`fa3verify.z3_cache`: keyed
    by a hash of their inputs and of the project's code; the command line's gate sets it).

    An interrupt (SIGINT) during the proofs stops the gate there; during fuzz the campaign keeps what it found.
    Either way the summary is marked interrupted (exit 3) and returned, so the command still writes its reports.

    A system under test with a worker is launched first (``launch``: its import runs while the proof stages' z3
    parts run on the model); the stages' parts that run on the engine (witness replay, a counterexample's replay)
    wait for it (its ``start`` stage line), then run in the stages' order with their rows where the stage puts them.
    """
    from gpu_impl.engines.model.sut import ModelSUT

    from spec.model.assumption_facts import not_enforced

    from ..engine_choice import case_policy, launch_engine, start_engine
    from .fuzz import fuzz, sut_policy
    from ..progress import stage

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
    deferred: list = []
    options = dict(timeout_s=timeout_s, cases_dir=cases_dir, kernel_name=kernel_name, device=device,
                   witness_cache=witness_cache, deferred=deferred, z3_cache=z3_cache)
    started: list = []

    def ready() -> None:
        """The engine started (its own stage line) before the first stage that runs on it."""
        if not started:
            started.append(True)
            start_engine(sut, command, lines)

    launch_engine(sut)  # a worker's import runs beside the z3 stages below
    try:
        for name in (sut.proof_plan() if witnesses else ()):
            STAGES[name](sut, policy, summary, options, lines, command)
        if deferred:  # the stages' parts that run on the engine, in the stages' order, their rows in place
            ready()
            checks_added = findings_added = 0
            for at_check, at_finding, part in deferred:
                checks, findings = part()
                summary.checks[at_check + checks_added:at_check + checks_added] = checks
                summary.findings[at_finding + findings_added:at_finding + findings_added] = findings
                checks_added, findings_added = checks_added + len(checks), findings_added + len(findings)
    except KeyboardInterrupt:
        summary.interrupted = True
    if not summary.interrupted:
        ready()
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


HELP = "prove and fuzz a backend policy; exit 0 only if both pass"
EPILOG = """\
The gate runs every theorem (z3) and a fuzz campaign for the policy, prints one table (theorem or
property, verdict, seconds, case file), writes JUnit XML and JSON if asked, and exits 0 pass,
1 violation, 2 bad input, 3 inconclusive.

--budget-s N is the fuzz stage's budget (as for `fuzz`: its cases, shrinking and case files end within N
seconds); the proofs run before it, each z3 query bounded by --timeout-s, and on a real engine so do the
witness replays. --cases N replaces it with a case count: same seed, byte-identical case files.

On a real engine the witness searches' and flow theorem's z3 rows are kept across runs, keyed by a hash of
their inputs and of this installation's code, in $FA3VERIFY_Z3_CACHE (default ~/.cache/fa3verify/z3);
FA3VERIFY_Z3_CACHE=off recomputes them. Inconclusive rows and found violations are never kept.

examples:
  fa3verify gate --guard mypkg.attention.backend:_should_disable_scheduler_metadata_precompute \\
                 --junit report.xml --json gate.json
  fa3verify gate --guard examples/guards/prefix_guard.py:should_disable      # exits 1
  fa3verify gate --guard pre-fix --metadata-heads attn_tp                    # exits 0
{gate}"""


def register(sub) -> None:
    p = sub.add_parser("gate", help=HELP, description=HELP, epilog=with_engine_examples(EPILOG),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_policy_arguments(p)
    add_engine_argument(p, help_extra="; a real engine needs no --guard (its guard is its own code)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--budget-s", type=float, metavar="N", help="fuzz stage budget in seconds, shrinking included (default 20)")
    group.add_argument("--cases", type=int, metavar="N", help="fuzz case count instead (no clock: the same case files on any machine)")
    p.add_argument("--seed", type=int, default=0, help="fuzz seed (default 0)")
    p.add_argument("--timeout-s", type=float, default=10.0, help="z3 timeout per query (default 10)")
    p.add_argument("--kernel", default="emulated", choices=("emulated", "fa3"), help="kernel adapter for fuzz")
    p.add_argument("--device", default="cpu", help="torch device for fuzz numerics")
    p.add_argument("--cases-dir", default="fa3verify-out/cases", metavar="DIR", help="where case files go")
    p.add_argument("--json", metavar="PATH", help="write the run summary as JSON (schema fa3verify.run/1)")
    p.add_argument("--junit", metavar="PATH", help="write JUnit XML for CI systems")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..engine_choice import sut_from_args

    budget, cases = budget_from_args(args)
    with sut_from_args(args) as sut:  # the model is opened under the policy options (ModelSUT(policy=...))
        # the gate launches a real engine's worker beside its z3 stages; its start is a stage line of its own
        summary = gate(sut, budget_s=budget, seed=args.seed, timeout_s=args.timeout_s, cases_dir=args.cases_dir,
                       kernel_name=args.kernel, device=args.device, max_cases=cases, z3_cache=True)
    return write_reports(summary, args)
