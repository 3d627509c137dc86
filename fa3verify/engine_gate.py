"""Gating real engine code: the prover's witnesses replayed on the engine, and the fuzz campaign run on it.

Invariant: on a real engine every verdict comes from running that engine's own code; the model only supplies
inputs. The stages of an engine's gate (``fa3verify.commands.gate.gate`` runs what ``sut.proof_plan()`` names) give
these rows: (1) the z3 theorems that search for hazardous configurations, run on the model with the modelled backend's ``tp`` head counts under no guard and under the release's own guard, with and without the
assumptions the system under test says its code does not enforce (:func:`witness_plan`; so every configuration
the release accepts where reusing metadata can overflow has a witness), shown for information; (2) each distinct
witness put to the engine's own validation (rejected: counted with the release's message, not run) and replayed on
the engine (fails if the engine's calls break an invariant there); on an engine with a theorem of its own also
(2') that theorem (its plugin's ``flow_theorem``) under the release's profile, counting like a prove row; (3) the
fuzz campaign on the engine.
Findings are case files carrying the engine (``spec.model.cases`` ``engine``), which replay on it.

``prove --engine X`` uses :func:`replay_witnesses` too: the theorems run under the chosen model policy, and
each refuted theorem's witness is replayed on X.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import NamedTuple, Optional

from spec.finding import Outcome, TheoremVerdict, Verdict

from .finding_terms import WITNESS_SUBDIR, apply_terms, replay_line, terms_of_verdict
from .summary import Check, RunSummary

#: Theorems whose witnesses are whole scenarios (server configuration, model, batches) an engine can run.
WITNESS_THEOREMS = ("prefill-cp-hazard", "guard-soundness")
#: The model policy the witness search runs under: no guard, precompute heads H // tp_size.
WITNESS_POLICY = ("none", "tp")
#: What a witness-search row's refutation means (its case file goes to ``CASES/witnesses/``).
WITNESS_NOTE = ("a witness: inputs for the engine found on the model, not a verdict on the engine; "
                "its case file is under witnesses/")


class WitnessSearch(NamedTuple):
    """One witness search: the model policy (guard, precompute heads) and the prover assumptions it drops."""

    guard: str
    heads: str
    dropped: frozenset

    def label(self) -> str:
        drops = f", dropping {', '.join(sorted(self.dropped))}" if self.dropped else ""
        return f"guard '{self.guard}', {self.heads} heads{drops}"


def release_profile(sut):
    """The profile (spec.model.engine_profiles) of the release ``sut`` runs or stands beside (a checkout: its nearest
    release), or None (the model, an engine without model profiles, an unprofiled release)."""
    from spec.model.engine_profiles import ProfileError, profile_for

    from .engine_choice import identity_of

    release = (identity_of(sut) or {}).get("release") if sut is not None else None  # the model records none
    try:
        return profile_for(release) if release else None
    except ProfileError:
        return None


def witness_plan(sut) -> list:
    """The witness searches for ``sut``, each under ``tp`` heads: no guard (every configuration where reusing
    metadata can overflow) and, for a profiled release, the release's own guard (the configurations that guard leaves
    precomputing, so a release or checkout whose heads are ``H // tp_size`` gets a witness there); each with every
    assumption kept and again with the prover assumptions the system's own code does not enforce dropped
    (``sut.assumption_facts()``, ``spec.model.assumption_facts.prover_drops``), so a configuration the release accepts is
    never assumed away and a checkout whose validation is stricter than its release's still gets the old witnesses."""
    from spec.model.assumption_facts import prover_drops

    dropped = prover_drops(sut.assumption_facts()) if sut is not None else frozenset()
    guards = [WITNESS_POLICY[0]]
    profile = release_profile(sut)
    if profile is not None and profile.guard_spec != WITNESS_POLICY[0]:
        guards.append(profile.guard_spec)
    plan = []
    for guard in guards:
        for drops in (frozenset(), dropped):
            search = WitnessSearch(guard, WITNESS_POLICY[1], drops)
            if search not in plan:
                plan.append(search)
    return plan


def witness_search(timeout_s: float, cases_dir: str, search: Optional[WitnessSearch] = None) -> list:
    """Theorem rows of one witness search (informational: not failed); their case files are the witnesses.
    ``search`` defaults to :data:`WITNESS_POLICY` with every assumption kept; the rows of a search under another
    guard name it."""
    from .policy import load_policy
    from .commands.prove import theorem_results

    search = search or WitnessSearch(*WITNESS_POLICY, frozenset())
    policy = load_policy(search.guard, search.heads)
    default = search == WitnessSearch(*WITNESS_POLICY, frozenset())
    rows = []
    for r in theorem_results(policy, timeout_s=timeout_s, cases_dir=cases_dir, only=list(WITNESS_THEOREMS),
                             dropped_assumptions=search.dropped):
        if r.name not in WITNESS_THEOREMS:
            continue
        name = f"witness search: {r.name}" if default else f"witness search ({search.label()}): {r.name}"
        rows.append(Check(name=name, kind="theorem", verdict=r.verdict, seconds=r.seconds,
                          failed=False, inconclusive=r.inconclusive, case_file=r.case_file,
                          expected=WITNESS_NOTE if r.verdict == TheoremVerdict.REFUTED else "",
                          message=f"on the model with {search.label()} (inputs for the engine, not a verdict "
                                  f"on it): {r.message or r.summary()}"))
    return rows


def plan_rows(sut, timeout_s: float, cases_dir: str, cache: Optional[dict] = None, z3_cache: bool = False,
              hits: Optional[list] = None) -> list:
    """The rows of every search of :func:`witness_plan` (``cache``, keyed by search, shares them between engines;
    ``z3_cache``: also across runs, :mod:`fa3verify.z3_cache`, each search from the cache appended to ``hits``);
    every search writes its witnesses into ``cases_dir`` (case files are named by their content)."""
    from . import z3_cache as disk

    rows = []
    for search in witness_plan(sut):
        if cache is not None and search in cache:
            found = cache[search]
        else:
            inputs = {"search": "witness", "guard": search.guard, "heads": search.heads,
                      "dropped": sorted(search.dropped), "timeout_s": float(timeout_s)}
            found = disk.load("witness-search", inputs, cases_dir) if z3_cache else None
            if found is not None and hits is not None:
                hits.append(search)
            if found is None:
                found = witness_search(timeout_s, cases_dir, search=search)
                if z3_cache:
                    disk.store("witness-search", inputs, found, cases_dir)
            if cache is not None:
                cache[search] = found
        rows.extend(dataclasses.replace(r) for r in found)
    return rows


def replay_witnesses(sut, case_files, cases_dir: str, kernel=None) -> tuple[list, list]:
    """Run each distinct witness case on the engine; (check rows, findings). A witness the engine's own validation
    rejects is a ``rejected`` row with the release's message (neither a pass nor a failure) and does not run; a
    violation on the engine fails its row and is saved as a case file carrying the engine."""
    from .engine_choice import engine_validation
    from .judge import judge
    from .commands.replay import load_case, scenario_from_case

    checks, findings, seen = [], [], set()
    for path in case_files:
        if not path or path in seen:
            continue
        seen.add(path)
        case = load_case(path)
        scenario_key = json.dumps([case.server, case.model, case.batches], sort_keys=True, default=str)
        if scenario_key in seen:  # two searches found the same configuration and batches: run it once
            continue
        seen.add(scenario_key)
        scn = scenario_from_case(case)
        name = f"witness {case.source.split(':', 1)[-1]} on {sut.spec}"
        start = time.perf_counter()
        accepted, why = engine_validation(sut, scn.server, scn.model)
        if accepted is False:
            checks.append(Check(name=name, kind="replay", verdict="rejected", seconds=time.perf_counter() - start,
                                case_file=path, message=f"not run: {sut.spec}'s own validation rejects this "
                                                        f"configuration: {why}"))
            continue
        verdict = judge(sut, scn, kernel=kernel)
        if verdict.unsupported:
            checks.append(Check(name=name, kind="replay",
                                verdict=TheoremVerdict.INCONCLUSIVE, seconds=time.perf_counter() - start, inconclusive=True,
                                case_file=path, message=f"the engine does not run this witness: {verdict.reason}"))
            continue
        found = verdict.findings
        seconds = time.perf_counter() - start
        saved = save_engine_case(case, found[0], sut, cases_dir) if found else None
        msg = ("; ".join(f"{f.invariant} at step {f.step} dp rank {f.dp_rank}: {f.message}"
                         for f in found[:2]) if found else f"no violation on {sut.spec}")
        checks.append(Check(name=name, kind="replay",
                            verdict=Verdict.FAIL if found else Verdict.PASS, seconds=seconds, failed=bool(found),
                            case_file=saved or path, message=msg))
        if found:
            finding = found[0].reported(case_file=saved, engine=f"witness on {sut.spec}",
                                        replay=replay_line(saved, engine=sut.spec), check=name)
            terms = terms_of_verdict(scn, verdict, found[0].invariant, sut.spec)
            findings.append(apply_terms(finding, terms))
    return checks, findings


def flow_theorem_rows(sut, timeout_s: float, cases_dir: str, kernel=None, replay: bool = True,
                      z3_cache: bool = False, hits: Optional[list] = None) -> RunSummary:
    """The engine's own theorem for the gate (its plugin's ``flow_theorem``) under the release's profile (``prove
    --engine-profile ENGINE==V``, a failed row when refuted), its counterexample replayed on the engine (``replay``
    False: the caller replays it); a release without a profile is an inconclusive row (the theorem cannot run),
    never a pass. ``z3_cache``: rows without findings kept across runs (:mod:`fa3verify.z3_cache`; a hit is appended
    to ``hits``)."""
    from .commands.prove import prove_flow

    plugin = sut.spec.plugin
    try:
        profile = plugin.release_profile(getattr(sut, "release", None) or sut.spec.release)  # a checkout: its nearest
    except ValueError as exc:
        out = RunSummary(command="gate")
        out.checks.append(Check(name=plugin.flow_theorem, kind="theorem", verdict=TheoremVerdict.INCONCLUSIVE, seconds=0.0,
                                inconclusive=True,
                                message=f"{exc}: the flow theorem needs the release's profile "
                                        f"({plugin.flow_profiles_file}; `conform --engine {sut.spec}` checks one)"))
        return out
    out = _flow_from_cache(sut, profile, timeout_s, cases_dir) if z3_cache else None
    if out is not None and hits is not None:
        hits.append(plugin.flow_theorem)
    if out is None:
        out = prove_flow(sut.spec, profile, timeout_s=timeout_s, cases_dir=cases_dir)
        if z3_cache and not out.findings:  # a refutation's rows go with findings: computed each run
            from . import z3_cache as disk

            disk.store("flow-theorem", _flow_inputs(sut, profile, timeout_s), out.checks, cases_dir)
    refuted = [c.case_file for c in out.checks if c.verdict == TheoremVerdict.REFUTED and c.case_file]
    if refuted and replay:
        checks, findings = replay_witnesses(sut, refuted, cases_dir, kernel=kernel)
        out.checks.extend(checks)
        out.findings.extend(findings)
    return out


def _flow_inputs(sut, profile, timeout_s: float) -> dict:
    plugin = sut.spec.plugin
    return {"theorem": plugin.flow_theorem, "engine": sut.spec.kind, "profile": profile.to_dict(),
            "release": plugin.release_text(profile.release), "timeout_s": float(timeout_s)}


def _flow_from_cache(sut, profile, timeout_s: float, cases_dir: str) -> Optional[RunSummary]:
    """The flow theorem's summary from :mod:`fa3verify.z3_cache`, or None (a miss)."""
    from . import z3_cache as disk

    rows = disk.load("flow-theorem", _flow_inputs(sut, profile, timeout_s), cases_dir)
    if rows is None:
        return None
    out = RunSummary(command="prove", policy={"engine_profile": sut.spec.plugin.release_text(profile.release),
                                              **profile.to_dict()})
    out.checks.extend(rows)
    out.elapsed_s = 0.0
    return out


def save_engine_case(case, finding, sut, cases_dir: str) -> str:
    """The witness as a case found on the engine: same scenario, the engine's identity, the release's profile."""
    from spec.model.cases import Case

    from .engine_choice import identity_of, profile_of

    profile = profile_of(sut.spec)
    policy = profile.policy() if profile is not None else case.policy
    c = Case.from_parts(source=case.source, server=case.server, model=case.model, policy=policy,
                        batches=case.batches, kernel=case.kernel, seed=case.seed, engine=identity_of(sut),
                        expected={"outcome": Outcome.VIOLATION, "invariant": finding.invariant,
                                  "detail": {"message": finding.message}},
                        notes=f"model witness {case.id} replayed on {sut.spec}")
    return str(c.save(cases_dir))


def _failed(rows) -> str:
    return f"{len(rows)} rows, {sum(c.failed for c in rows)} failed"


def _on_engine(summary: RunSummary, deferred: Optional[list], part) -> None:
    """Run ``part`` (-> (check rows, findings), on the engine) now, adding its rows to ``summary``; or, where the
    gate defers the engine's parts (``deferred``: a list), queue it with the place its rows go."""
    if deferred is None:
        checks, findings = part()
        summary.checks.extend(checks)
        summary.findings.extend(findings)
    else:
        deferred.append((len(summary.checks), len(summary.findings), part))


def witness_stages(sut, summary: RunSummary, timeout_s: float = 10.0, cases_dir: str = "fa3verify-out/cases",
                   kernel_name: str = "emulated", device: str = "cpu", witness_cache: Optional[dict] = None,
                   lines: Optional[bool] = None, deferred: Optional[list] = None, z3_cache: bool = False) -> None:
    """The gate's ``"witnesses"`` stage (``fa3verify.commands.gate``): the witness searches of :func:`witness_plan` (z3 on
    the model; ``witness_cache``, keyed by search, shares them between gates) and each witness replayed on ``sut``,
    added to ``summary`` (the replay queued on ``deferred`` when the gate gives one: :func:`_on_engine`)."""
    from gpu_impl.kernels import load

    from .progress import stage

    kernel = load(kernel_name, mode="strict", device=device)
    rows: list = []
    hits: list = []
    with stage("gate", f"witness searches (z3 on the model, {len(witness_plan(sut))} searches)", lines,
               result=lambda: _failed(rows) + (f", {len(hits)} searches from the z3 cache" if hits else "")):
        rows = plan_rows(sut, timeout_s, os.path.join(cases_dir, WITNESS_SUBDIR), witness_cache, z3_cache=z3_cache,
                         hits=hits)
    summary.checks.extend(rows)

    def replay() -> tuple:
        checks: list = []
        with stage("gate", f"witness replay on {sut.spec}", lines, result=lambda: _failed(checks)):
            checks, findings = replay_witnesses(sut, [r.case_file for r in rows], cases_dir, kernel=kernel)
        return checks, findings

    _on_engine(summary, deferred, replay)


def flow_stage(sut, summary: RunSummary, timeout_s: float = 10.0, cases_dir: str = "fa3verify-out/cases",
               kernel_name: str = "emulated", device: str = "cpu", witness_cache: Optional[dict] = None,
               lines: Optional[bool] = None, deferred: Optional[list] = None, z3_cache: bool = False) -> None:
    """The gate's ``"flow-theorem"`` stage: :func:`flow_theorem_rows` (z3 under the release's profile), merged into
    ``summary``; a refutation's counterexample replayed on the engine (queued on ``deferred`` when given)."""
    from gpu_impl.kernels import load

    from .progress import stage

    kernel = load(kernel_name, mode="strict", device=device)
    flow = RunSummary(command="gate")
    refuted: list = []
    hits: list = []
    with stage("gate", f"{sut.spec.plugin.flow_theorem} theorem (z3 under the release's profile)", lines,
               result=lambda: _failed(flow.checks) + (", from the z3 cache" if hits else "")):
        flow = flow_theorem_rows(sut, timeout_s, cases_dir, kernel=kernel, replay=False, z3_cache=z3_cache,
                                 hits=hits)
        refuted = [c.case_file for c in flow.checks if c.verdict == TheoremVerdict.REFUTED and c.case_file]
    summary.merge(flow)
    if refuted:
        _on_engine(summary, deferred, lambda: replay_witnesses(sut, refuted, cases_dir, kernel=kernel))
