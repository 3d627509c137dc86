"""fa3verify conform: does the model pass FA3 what a real engine release does, on the same random configurations?

Invariant: for every random configuration (``fa3verify.strategies``) the release's ``ServerArgs`` accepts, the
model under that release's profile (``spec.model.engine_profiles``) and the real engine make the same FA3 events
-- per (step, DP rank, path) the same precompute arguments and call arguments (heads, batch, max_seqlen_k,
page-table width, page size, num_splits, causal, softcap, dtype, whether metadata is passed, capture vs
replay) and the same split counts -- and reach the same verdict (the same violated invariants). That is the
link that lets ``prove --engine-profile`` speak about the real code.

The configurations are the strategy family the system under test names (``sut.conformance_family()``: by default
``release``, ``fa3verify.strategies``; None: its own domain), drawn and run by the one
campaign (:func:`fa3verify.campaign.run_campaign`) on :class:`ConformanceTarget`. The model's events come from
:func:`gpu_impl.model_pairs.model_pairs`; the engine's from its trace (entries shaped by
``gpu_impl.fa3_calls.pair_summary``). Each configuration with a difference is a fidelity finding saved as a case
file carrying the engine (``fa3verify.case_files``). Configurations the release rejects are skipped and counted. A few
configurations that ``spec`` assumes away (docs/invariants.md, the prover's assumptions) are put to the
release's validation too; one it accepts is a finding about that assumption.

Simplifications (documented in docs/engines.md): CUDA-graph capture events are matched by (DP rank, graph
batch size), not by step, since a runner captures each size once; engine calls on sliding-window layers
(``window_size`` not (-1, -1)) are counted, not compared (the model has no sliding-window decode event).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

from spec.finding import Outcome, Verdict
from spec.model import assumption_facts

from ..campaign import Budget, Observation, run_campaign
from ..case_files import scenario_case
from ..engine_choice import add_engine_argument, add_profile_argument
from ..errors import UsageError
from ..finding_terms import replay_line
from ..judge import judge
from ..outputs import deliver, write_output
from ..policy import load_policy
from ..sharding import add_shard_argument, check_cases, parse_shard
from ..summary import Check, Finding, finding_text, print_table, RunSummary
from .arguments import with_engine_examples


PRECOMPUTE_FIELDS = ("batch_size", "max_seqlen_q", "max_seqlen_k", "num_heads", "num_heads_k", "headdim",
                     "headdim_v", "page_size", "causal", "has_softcap", "num_splits", "qkv_dtype")
CALL_FIELDS = ("batch_size", "num_heads", "num_heads_k", "headdim", "headdim_v", "seqlen_k", "page_table_width",
               "page_size", "num_splits", "causal", "softcap", "dtype", "metadata_passed")

#: Configurations spec assumes away, put to the release's own validation: (assumption, description, fields, model),
#: one per assumption that has a probe (``spec.model.assumption_facts``, the one source of the probes).
ASSUMPTION_PROBES = tuple((p.assumption, p.description, p.server, p.model) for p in assumption_facts.probes())


@dataclass
class ConformReport:
    """Counts and findings of one conformance run."""

    engine: str
    profile: Optional[str]
    cases: int = 0
    compared: int = 0
    skipped_rejected: int = 0
    rejected_reasons: dict = field(default_factory=dict)
    skipped_unsupported: int = 0       # the engine's driver does not run the scenario (MLA, fp8 KV cache)
    unvalidated: int = 0               # the release's validation could not run on CPU (compared anyway)
    events_compared: int = 0
    sliding_window_calls: int = 0
    differences: list = field(default_factory=list)      # (case index, [difference text], case file)
    assumption_findings: list = field(default_factory=list)  # (assumption, description, case file)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _norm_dtype(x):
    return None if x is None else str(x).replace("torch.", "")


def event_view(entry: dict) -> tuple:
    """The compared fields of one FA3 event, normalised (headdim_v None means headdim; dtypes without 'torch.')."""
    pre = entry.get("precompute")
    call = dict(entry.get("call") or {})
    if call.get("page_size") and call.get("seqlen_k") is not None and "page_table_width" not in call:
        call["page_table_width"] = call["seqlen_k"] // call["page_size"]
    pv = None
    if pre:
        pre = dict(pre)
        pre["headdim_v"] = pre.get("headdim_v") or pre.get("headdim")
        pre["qkv_dtype"] = _norm_dtype(pre.get("qkv_dtype"))
        pv = tuple((k, pre.get(k)) for k in PRECOMPUTE_FIELDS)
    call["headdim_v"] = call.get("headdim_v") or call.get("headdim")
    call["dtype"] = _norm_dtype(call.get("dtype"))
    call["softcap"] = float(call.get("softcap") or 0.0)
    cv = tuple((k, call.get(k)) for k in CALL_FIELDS)
    return (("precomputed", bool(entry.get("precomputed"))), ("precompute", pv), ("call", cv),
            ("s_p", entry.get("s_p")), ("s_c", entry.get("s_c")))


def event_key(entry: dict) -> tuple:
    """Where an event happened: (step, DP rank, path); a capture by (DP rank, graph batch size)."""
    if entry.get("path") == "capture":
        return ("capture", entry.get("dp_rank"), (entry.get("call") or {}).get("batch_size"))
    return (entry.get("step"), entry.get("dp_rank"), entry.get("path"))


def _is_sliding(entry: dict) -> bool:
    return list((entry.get("call") or {}).get("window_size") or [-1, -1]) != [-1, -1]


def _group(events) -> dict:
    out = {}
    for e in events:
        out.setdefault(event_key(e), set()).add(event_view(e))
    return out


def _field_diffs(model_view: tuple, engine_view: tuple) -> list:
    m, e = dict(model_view), dict(engine_view)
    out = []
    for name in ("precomputed", "s_p", "s_c"):
        if m[name] != e[name]:
            out.append(f"{name}: model {m[name]} vs engine {e[name]}")
    for side in ("precompute", "call"):
        if (m[side] is None) != (e[side] is None):
            out.append(f"{side}: model {'none' if m[side] is None else 'made'} vs engine "
                       f"{'none' if e[side] is None else 'made'}")
            continue
        if m[side] is None:
            continue
        md, ed = dict(m[side]), dict(e[side])
        out += [f"{side}.{k}: model {md[k]!r} vs engine {ed[k]!r}" for k in md if md[k] != ed.get(k)]
    return out


def compare_events(model_events, engine_events) -> tuple[list, int, int]:
    """(differences as text, events compared, sliding-window engine calls skipped)."""
    sliding = sum(1 for e in engine_events if _is_sliding(e))
    model, engine = _group(model_events), _group([e for e in engine_events if not _is_sliding(e)])
    diffs, compared = [], 0
    for key in sorted(set(model) | set(engine), key=repr):
        where = (f"capture on dp rank {key[1]} (graph batch {key[2]})" if key[0] == "capture"
                 else f"step {key[0]} dp rank {key[1]} {key[2]}")
        if key not in engine:
            diffs.append(f"{where}: event only in the model")
            continue
        if key not in model:
            diffs.append(f"{where}: event only in the engine")
            continue
        compared += 1
        if model[key] != engine[key]:
            m, e = sorted(model[key], key=repr), sorted(engine[key], key=repr)
            detail = _field_diffs(m[0], e[0]) or [f"{len(m)} distinct model events vs {len(e)} engine events"]
            diffs.append(f"{where}: " + "; ".join(detail))
    return diffs, compared, sliding


def verdict_diff(model_result, engine_result) -> Optional[str]:
    """A difference in verdicts (outcome and violated invariants of two judged runs, or two ScenarioResults), or
    None. The lifecycle invariants (spec.lifecycle_invariants) are left out of the comparison: an engine driver's
    lifecycle judge reports them on every launch, while the model's scenario run judges each step's pair only (the
    model's lifecycle is judged by gpu_impl.lifecycle and the lifecycle fuzz), so a run whose only findings are
    lifecycle ones is compared as a pass."""
    from spec.lifecycle_invariants import LIFECYCLE_INVARIANTS

    def compared(result) -> tuple:
        names = {f.invariant for f in result.findings}
        kept = sorted(names - set(LIFECYCLE_INVARIANTS))
        outcome = Outcome.PASS if result.outcome == Outcome.VIOLATION and names and not kept else result.outcome
        return outcome, kept

    (mo, mi), (eo, ei) = compared(model_result), compared(engine_result)
    if mo != eo or mi != ei:
        return f"verdict: model {mo} {mi} vs engine {eo} {ei}"
    return None


def _validate(sut, server, model=None) -> tuple:
    """(accepted, message) from the release's own validation (:func:`fa3verify.engine_choice.engine_validation`)."""
    from ..engine_choice import engine_validation

    return engine_validation(sut, server, model)


def _save(sut, profile_policy: dict, case, notes: str, cases_dir: str, engine_result=None) -> str:
    """A finding's case file (``fa3verify.case_files``): the configuration, the engine, the release's profile as
    policy, and as expected outcome what the engine itself showed (so ``replay`` reproduces the engine's side and
    ``replay --engine model`` the model's); the difference is in the notes."""
    from ..engine_choice import identity_of

    expected = {"outcome": Outcome.PASS, "invariant": None, "detail": {}}
    if engine_result is not None and engine_result.outcome != Outcome.PASS:
        first = (engine_result.findings or engine_result.shape_errors)[0]
        expected = {"outcome": engine_result.outcome,
                    "invariant": first.invariant if engine_result.outcome == Outcome.VIOLATION else None,
                    "detail": {"message": first.message}}
    c = scenario_case(case, source="conform", policy=profile_policy, expected=expected, notes=notes,
                      engine=identity_of(sut))
    return str(c.save(cases_dir))


def probe_assumptions(sut, profile_policy: dict, cases_dir: str, report: ConformReport) -> None:
    """Put configurations spec assumes away to the release's validation; an accepted one is a finding."""
    from spec.model.config import ServerConfig, config_violations

    from ..strategies import FuzzCase

    for assumption, description, fields, model in ASSUMPTION_PROBES:
        server = ServerConfig(**fields)
        broken = {v.invariant for v in config_violations(model, server)}
        if assumption not in broken:
            continue  # the probe no longer breaks it: nothing to learn
        ok, _ = _validate(sut, server, model)
        if not ok:  # rejected, or None: the validation could not say
            continue
        case = FuzzCase(server=server, model=model, numerics=False, seed=0,
                        steps=({"mode": "decode", "seq_lens": [4096, 100], "extend_lens": None},))
        try:
            path = _save(sut, profile_policy, case, f"assumption finding: {sut.spec} accepts {description}, which "
                         f"spec assumes away ({assumption})", cases_dir)
        except ValueError:  # beyond what a case file can hold (a size < 1): a finding without a case
            path = None
        report.assumption_findings.append((assumption, description, path))


class ConformanceTarget:
    """The model (under a release's profile) and the engine on the same case, as the campaign drives them:
    ``observe(FuzzCase) -> Observation | None``.

    A configuration the release rejects, or one the engine's driver does not run, is counted in the report and
    observed as None (the campaign counts it unsupported, never a pass). Both sides are judged by
    :func:`fa3verify.judge.judge`, so a fault of the model's guard is its GUARD_RAISED or GUARD_TIMEOUT finding,
    a verdict the engine does not share. The observation is a ``CONFORMANCE`` violation when
    :func:`compare_events` or :func:`verdict_diff` finds a
    difference; its signature names the configuration's index, so every differing configuration is its own
    failure (conformance reports each configuration, not each distinct difference).
    """

    def __init__(self, sut, policy, report: ConformReport):
        self.sut, self.policy, self.report = sut, policy, report
        #: the campaign-wide index of the configuration being drawn (set by a shard's generator), else None
        self.index: Optional[int] = None

    def observe(self, case):
        from gpu_impl.model_pairs import model_pairs
        from gpu_impl.engines.model.sut import ModelSUT

        from .fuzz import scenario_for

        report, sut = self.report, self.sut
        index = report.cases if self.index is None else self.index
        report.cases += 1
        ok, message = _validate(sut, case.server, case.model)
        if ok is False:
            report.skipped_rejected += 1
            reason = (message.split(":")[0] or "rejected")[:80]
            report.rejected_reasons[reason] = report.rejected_reasons.get(reason, 0) + 1
            return None
        if ok is None:
            report.unvalidated += 1
        scn = scenario_for(case, self.policy)
        # the model under the release's profile (ModelSUT(policy=...)); a fault of its guard is its finding,
        # compared as a verdict
        model = judge(ModelSUT(policy=self.policy), scn)
        engine = judge(sut, scn)
        if engine.unsupported:
            report.skipped_unsupported += 1
            return None
        engine_result = engine.result
        if model.result is not None and engine_result is not None:
            engine_events = [e for e in engine_result.trace if "call" in e]
            diffs, compared, sliding = compare_events(model_pairs(scn, model.result), engine_events)
        else:
            diffs, compared, sliding = [], 0, 0
        verdict = verdict_diff(model, engine)
        if verdict:
            diffs.append(verdict)
        report.compared += 1
        report.events_compared += compared
        report.sliding_window_calls += sliding
        found = [Finding("CONFORMANCE", message=" | ".join(diffs[:5]), signature_key=f"CONFORMANCE#{index}")] \
            if diffs else []
        return Observation(Outcome.of(found), ["CONFORMANCE"] if diffs else [], diffs, found,
                           detail=(index, diffs, engine_result))


def conform(sut, profile, cases: int = 200, seed: int = 0, cases_dir: str = "fa3verify-out/cases",
            probes: bool = True, progress=None, shard=None) -> ConformReport:
    """Run ``cases`` configurations of the system's conformance family (default ``release``) on the model (under ``profile``) and on the
    engine through the one campaign (:func:`fa3verify.campaign.run_campaign`, seeded by ``seed``); compare.

    ``progress(report)`` is called every 25 compared configurations. An interrupt (SIGINT) ends the run as before
    the campaign existed: ``KeyboardInterrupt`` reaches the caller. ``shard`` (:mod:`fa3verify.sharding`) compares
    only the configurations it owns, each named by its index in the whole campaign; every shard puts the
    assumption probes.
    """
    from gpu_impl.guards import load_guard

    from ..strategies import domain_strategy, family

    start = time.perf_counter()
    # the model is judged under the FA3 build that judges the engine (EnginePlugin.fa3_build: its release's kernel
    # build, upstream's for a checkout or a named system), so both sides schedule with one build's rules
    build = sut.spec.plugin.fa3_build(sut.spec)
    policy = (load_policy(profile.guard_spec, profile.precompute_heads,
                          graph_replay_seqlen_k=profile.graph_replay_seqlen_k, fa3_build=build)
              if profile else load_policy(fa3_build=build))
    report = ConformReport(engine=str(sut.spec), profile=profile.release if profile else None)
    load_guard(policy.guard_spec)
    target = ConformanceTarget(sut, policy, report)
    drawn_from = sut.conformance_family()  # what the system says its configurations are drawn from
    generate = family(drawn_from) if drawn_from else domain_strategy(sut.domain())
    if shard is not None:
        owned, draw = itertools.count(), generate

        def generate(rng):  # the strategy runs once per owned draw: the j-th is draw k-1 + j*n of the campaign
            target.index = shard.k - 1 + next(owned) * shard.n
            return draw(rng)
    camp = run_campaign(target, generate, budget=Budget(cases=cases), seed=seed, shard=shard,
                        progress=(lambda _camp: progress(report)) if progress else None)
    if camp.interrupted:
        raise KeyboardInterrupt
    for failure in camp.failures.values():
        index, diffs, engine_result = failure.observation.detail
        path = _save(sut, policy.to_dict(), failure.case, "conformance difference: " + " | ".join(diffs[:5]),
                     cases_dir, engine_result)
        report.differences.append((index, diffs, path))
    if probes:
        probe_assumptions(sut, policy.to_dict(), cases_dir, report)
    report.elapsed_s = time.perf_counter() - start
    return report


def summarise(report: ConformReport) -> RunSummary:
    """The conformance run as a RunSummary (one check for events and verdicts, one for the assumptions)."""
    summary = RunSummary(command="conform", cases=report.compared, failures=len(report.differences),
                         elapsed_s=report.elapsed_s, policy={"engine": report.engine, "profile": report.profile})
    first = report.differences[0] if report.differences else None
    summary.checks.append(Check(
        name=f"model (profile {report.profile}) == {report.engine}: FA3 events and verdicts", kind="property",
        verdict=Verdict.FAIL if first else (Verdict.PASS if report.compared else Verdict.INCONCLUSIVE), seconds=report.elapsed_s,
        failed=bool(first), inconclusive=not report.compared, case_file=first[2] if first else None,
        message=(f"{report.compared} configurations compared ({report.events_compared} event groups), "
                 f"{report.skipped_rejected} rejected by the release, {len(report.differences)} differing"
                 + (f"; first: {first[1][0]}" if first else ""))))
    a = report.assumption_findings
    summary.checks.append(Check(
        name=f"{report.engine} rejects what spec assumes away", kind="property", verdict=Verdict.FAIL if a else Verdict.PASS,
        seconds=0.0, failed=bool(a), case_file=a[0][2] if a else None,
        message="; ".join(f"accepts {d} ({n})" for n, d, _ in a) or
                f"{len(ASSUMPTION_PROBES)} assumption probes rejected (or not put: no validation)"))
    for index, diffs, path in report.differences:
        summary.findings.append(Finding(invariant="CONFORMANCE", case_file=path, engine=f"conform {report.engine}",
                                        message=f"configuration {index}: " + "; ".join(diffs[:3]),
                                        replay=conform_replay_line(path, report.engine)))
    for name, desc, path in a:
        summary.findings.append(Finding(invariant=name, case_file=path, engine=f"conform {report.engine}",
                                        message=f"the release accepts {desc}, which spec assumes away"))
    return summary


def conform_replay_line(path: str, engine: str) -> str:
    """The two replays of a conformance difference, each as typed (``finding_terms.replay_line``): the model's side
    (``--engine model``) and the engine's (with ``--engine PATH-SPEC`` when the case was found on a checkout, which a
    case file alone never makes replay run)."""
    from gpu_impl.sut import parse_engine

    return f"{replay_line(path)} --engine model; {replay_line(path, engine=parse_engine(engine))}"


HELP = "compare the model (under a release's profile) with the real engine, FA3 call by FA3 call"
EPILOG = """\
Draws random configurations and batches (the fuzzer's strategies), skips those the release's own ServerArgs
validation rejects (counted), runs the rest on the model under the release's profile (spec/model/engine_profiles.json:
precompute heads and guard) and on the real engine, and compares per (step, DP rank, eager|capture|replay)
what each passes to get_scheduler_metadata and flash_attn_with_kvcache (heads, batch, max_seqlen_k,
page-table width, page size, num_splits, causal, softcap, dtype, whether metadata is passed), the split
counts and the verdicts. Each configuration that differs is a fidelity finding with a case file; so is a
configuration spec assumes away (docs/invariants.md) that the release accepts. Exit 1 on any difference.

examples:
{conform}{conform.shard}"""


def register(sub) -> None:
    p = sub.add_parser("conform", help=HELP, description=HELP, epilog=with_engine_examples(EPILOG),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_argument(p, default=None, help_extra=" (required; not 'model')")
    add_profile_argument(p)
    p.add_argument("--cases", type=int, default=200, metavar="N", help="random configurations (default 200)")
    p.add_argument("--seed", type=int, default=0, help="generation seed (default 0)")
    add_shard_argument(p, "configurations")
    p.add_argument("--no-assumption-probes", action="store_true",
                   help="do not put the configurations spec assumes away to the release's validation")
    p.add_argument("--cases-dir", default="fa3verify-out/cases", metavar="DIR", help="where findings are saved")
    p.add_argument("--json", metavar="PATH", help="write the summary and the conformance counts as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..engine_choice import parse_engine_option

    if args.engine is None:
        from gpu_impl.plugin import release_forms

        forms = " or ".join(row["prefix"] + "V" for row in release_forms())
        raise UsageError(f"--engine: required ({forms}, or a checkout): conform compares the model (or the engine's "
                         f"own profile) with it")
    if args.cases < 1:
        raise UsageError(f"--cases: must be >= 1, got {args.cases}")

    shard = parse_shard(args.shard)
    check_cases(shard, args.cases)
    spec = parse_engine_option(args.engine)
    how = spec.plugin.conformance(spec)  # the engine's plugin says how it is conformed
    if how is None:
        raise UsageError(f"--engine: conform compares the model with a real engine; '{spec}' is the model itself")
    return CONFORMANCES[how](args, spec, shard)


def _conform_claims(args, spec, shard) -> int:
    """``own-profile``: the engine's own profile checked claim by claim on its code (not over drawn configurations)."""
    if shard is not None:
        raise UsageError(f"--shard: {spec} conforms claim by claim, not over drawn configurations; "
                         f"--shard applies to engines conformed over drawn configurations")
    return _conform_own_profile(args, spec)


def _conform_drawn(args, spec, shard) -> int:
    """``model-profile``: the model under the engine's release profile against the engine on drawn configurations."""
    from ..engine_choice import conform_profile, open_engine, start_engine
    from ..progress import stage

    with open_engine(spec) as sut:
        profile = conform_profile(args.engine_profile, sut)
        # both sides are judged under the build the release's kernel wheel ships (refmodel/fa3_builds.json)
        print(f"engine: {spec}   profile: {profile.describe()}; both sides judged under FA3 build {spec.plugin.fa3_build(spec)}")
        start_engine(sut, "conform")
        with stage("conform", f"conform {args.cases} configurations on {spec}"
                              + (f", shard {shard}" if shard else ""),
                   result=lambda: f"{report.compared} compared, {len(report.differences)} differing"):
            report = conform(sut, profile, cases=args.cases, seed=args.seed, cases_dir=args.cases_dir,
                             probes=not args.no_assumption_probes, progress=_progress_every_25(args.cases),
                             shard=shard)
    summary = summarise(report)
    if shard is not None:
        summary.seed = args.seed
        summary.shard = shard.to_dict({"command": "conform", "seed": args.seed, "cases": args.cases,
                                       "engine": args.engine, "profile": profile.describe(),
                                       "probes": not args.no_assumption_probes})
    print_table(summary)
    print(f"configurations: {report.cases} drawn, {report.compared} compared, {report.skipped_rejected} rejected "
          f"by the release" + (f" {report.rejected_reasons}" if report.rejected_reasons else "")
          + f"; sliding-window calls not compared: {report.sliding_window_calls}")
    for f in summary.findings[:10]:
        print(finding_text(f))  # the one renderer: evidence, case file and the replay lines as typed

    return deliver(summary.exit_code, [("--json", args.json, lambda: write_output(
        args.json, json.dumps({**summary.to_dict(), "conform": report.to_dict()}, indent=2) + "\n", "--json"))],
        "conform")


#: how conform runs, by the answer of the engine's plugin (``EnginePlugin.conformance``)
CONFORMANCES = {"model-profile": _conform_drawn, "own-profile": _conform_claims}


def _progress_every_25(total: int):
    """conform's progress callback: a line on stderr every 25 compared configurations, on logs only."""
    from ..progress import log_lines_enabled

    if not log_lines_enabled():
        return None

    def say(report) -> None:
        print(f"fa3verify conform: {report.cases}/{total} configurations drawn, {report.compared} compared, "
              f"{len(report.differences)} differing so far", file=sys.stderr, flush=True)
    return say


def _conform_own_profile(args, spec) -> int:
    """``own-profile``: the engine's own release profile (``--engine-profile``, else the release ``--engine`` names
    or a checkout's nearest), checked claim by claim on its own code by its plugin."""
    from gpu_impl.plugin import OwnProfileRefused

    from ..engine_choice import open_engine

    if not args.engine_profile and spec.release is None:
        with open_engine(spec) as probe:  # a checkout conforms to its nearest release's profile unless told otherwise
            release = probe.release
    else:
        release = spec.release
    if not args.engine_profile and spec.release is not None:  # the release named by --engine must be one we drive
        from gpu_impl.engines.envs import check_release
        from gpu_impl.engines.errors import UnknownRelease

        try:
            check_release(spec.release, engine=spec.kind)
        except UnknownRelease as exc:
            raise UsageError(f"--engine: {exc}") from None
    try:  # the profile comes from --engine-profile when given, else from the release: errors name that option
        profile = spec.plugin.own_profile(spec, args.engine_profile, release)
    except OwnProfileRefused as exc:
        raise UsageError(f"{exc.option}: {exc}") from None
    from ..engine_choice import start_engine
    from ..progress import stage

    with open_engine(spec) as sut:
        print(f"engine: {spec}   profile: {profile.describe()}")
        start_engine(sut, "conform")
        with stage("conform", f"conform {spec}'s claims against its profile"):
            summary = claims_summary(spec.plugin.check_own_profile(sut, profile))
    print_table(summary)
    for f in summary.findings[:10]:
        print(f"  {f.message[:300]}")

    return deliver(summary.exit_code, [("--json", args.json, lambda: write_output(
        args.json, json.dumps(summary.to_dict(), indent=2) + "\n", "--json"))], "conform")


def claims_summary(report) -> RunSummary:
    """The run summary of an ``own-profile`` conformance (a ``gpu_impl.plugin.ClaimReport``): one property row per
    claim (fail where the code contradicts it) and the report's findings; exit 1 when any claim fails."""
    summary = RunSummary(command="conform", policy=dict(report.policy))
    summary.checks = [Check(name=c.name, kind="property", verdict="pass" if c.holds else "fail", seconds=c.seconds,
                            failed=not c.holds, message=c.message) for c in report.claims]
    summary.findings = list(report.findings)
    summary.elapsed_s = report.elapsed_s
    return summary
