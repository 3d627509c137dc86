"""fa3verify replay: reproduce a case file; exit 1 if it still fails as recorded, 0 if it now passes.

Reads every case the suite writes: scenario cases (``fa3verify.case/1``, run on a system under test,
``gpu_impl.sut``) and kernel-level cases (``fa3verify.case/1`` with a ``call``, or the older
``fa3verify.kernel-case/1``, run on the emulated kernel by ``fa3verify.kernel_cases``), with the seeded defects
the case names (its ``defects`` field, or an older guard spec naming a ``gpu_impl.defects.SeededPolicy``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from typing import Iterable, Optional

from spec.finding import Outcome, Verdict

from .. import verdicts
from ..engine_choice import add_engine_argument
from ..errors import UsageError
from ..finding_terms import apply_terms, configuration_terms, hint_for, ran_on, terms_of_finding
from ..judge import judge
from ..kernel_cases import is_kernel_case, replay_kernel_case
from ..outputs import deliver, read_text
from ..policy import add_guard_timeout_argument, Policy, UPSTREAM_BUILD
from ..summary import Check, Finding, finding_sentence, RunSummary, write_json
from ..trust import guard_to_run
from .arguments import with_engine_examples


@dataclass
class ReplayOutcome:
    """What a replay observed next to what the case file expected."""

    expected_outcome: str
    expected_invariant: Optional[str]
    outcome: str
    invariants: list
    findings: list
    trace: list
    ran_on: str = ""          #: the system under test that ran it (fa3verify.finding_terms.ran_on)

    @property
    def still_fails(self) -> bool:
        """True when the case fails the way the file says (:func:`fa3verify.verdicts.replay_still_fails`)."""
        return verdicts.replay_still_fails(self)

    @property
    def fails(self) -> bool:
        """True when the replay observed anything but a clean pass (:func:`fa3verify.verdicts.replay_fails`)."""
        return verdicts.replay_fails(self)

    @property
    def verdict(self) -> str:
        """PASSES NOW / PASSES (as expected) / STILL FAILS / FAILS DIFFERENTLY (:func:`fa3verify.verdicts.replay_verdict`)."""
        return verdicts.replay_verdict(self)


#: Names a replay can report besides spec.invariants.INVARIANTS (gpu_impl.scenario and the guard faults).
SCENARIO_FINDINGS = ("MATCHES_ORACLE", "NO_NAN", "CP_PATH_MATCHES_ACTIVITY", "CP_LAYOUT_MATCHES_BATCH",
                     "CP_RANKS_AGREE", "NO_CRASH", "PROCESS_ABORT")

#: A replay with tensors (--numerics, or the real kernel) refuses batches with more KV tokens than this.
MAX_NUMERICS_KV_TOKENS = 1 << 20


def known_invariants() -> list:
    """Every invariant name a case's expected.invariant may name."""
    from spec.lifecycle_invariants import LIFECYCLE_INVARIANTS
    from spec.model.guards import GUARD_FAULTS
    from spec.invariants import INVARIANTS

    # the lifecycle invariants: what the engine drivers' lifecycle judge reports (gpu_impl.engines.lifecycle_judge)
    return sorted(set(INVARIANTS) | set(GUARD_FAULTS) | set(SCENARIO_FINDINGS) | set(LIFECYCLE_INVARIANTS))


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
    from spec.model.cases import Case, CaseFormatError

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


def case_defects(case, override: Optional[Iterable[str]] = None) -> frozenset:
    """The seeded defects a replay runs with: ``override`` (e.g. none), else the case's ``defects``; an unknown
    name is a usage error naming the field and the known names."""
    from gpu_impl.defects import check_defects

    try:
        return check_defects(case.defects if override is None else override)
    except ValueError as exc:
        raise UsageError(f"{exc}") from None


def case_model_policy(case, guard_override: Optional[str] = None, metadata_heads: Optional[str] = None,
                      keep_stale: Optional[bool] = None, trust_case_guard: bool = False):
    """The model policy a case file records (its ``policy`` object: guard, metadata heads, runner hygiene, the
    graph replay's ``max_seqlen_k``), with the CLI's overrides (trust: fa3verify.trust): what builds the
    ``ModelSUT`` a case replays on."""
    from gpu_impl.guards import GuardSpecError, load_guard

    policy = dict(case.policy)
    guard_spec = guard_to_run(policy.get("guard", "fixed"), guard_override, trust_case_guard)
    try:
        guard = load_guard(guard_spec)
    except GuardSpecError as exc:
        raise UsageError(f"guard: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"case: {exc}") from None
    clear = policy.get("clear_stale_cp_metadata", True) if keep_stale is None else not keep_stale
    return Policy(guard_spec=guard_spec, guard=guard, metadata_heads=metadata_heads or policy.get("metadata_heads", "tp"),
                  clear_stale_cp_metadata=clear,
                  graph_replay_seqlen_k=str(policy.get("graph_replay_seqlen_k", "max_seq_len")),
                  fa3_build=str(policy.get("fa3_build", "upstream-0251105a")))


def scenario_from_case(case, guard_override: Optional[str] = None, metadata_heads: Optional[str] = None,
                       keep_stale: Optional[bool] = None, trust_case_guard: bool = False,
                       defects: Optional[Iterable[str]] = None, policy=None):
    """The gpu_impl Scenario a case file describes, under ``policy`` (default: :func:`case_model_policy`, the
    case's own with the CLI's overrides) and the seeded defects (the case's, or ``defects``)."""
    from gpu_impl.config import ModelConfig, ServerConfig
    from gpu_impl.scenario import Scenario, Step

    if policy is None:
        policy = case_model_policy(case, guard_override, metadata_heads, keep_stale, trust_case_guard)
    try:
        server = ServerConfig.from_dict(case.server)
        model = ModelConfig.from_dict(case.model)
        steps = [Step(mode=b["mode"], seq_lens=list(b["seq_lens"]), extend_lens=b.get("extend_lens"))
                 for b in case.batches]
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"case: {exc}") from None
    return Scenario(server=server, model=model, guard=policy.guard, steps=steps, guard_spec=policy.guard_spec,
                    metadata_heads=policy.metadata_heads, clear_stale_cp_metadata=policy.clear_stale_cp_metadata,
                    seed=int(case.seed), defects=case_defects(case, defects),
                    graph_replay_seqlen_k=policy.graph_replay_seqlen_k, fa3_build=policy.fa3_build,
                    options=dict(case.options), lifecycle=case.lifecycle)


def replay(path: str, kernel_name: Optional[str] = None, device: str = "cpu", guard: Optional[str] = None,
           metadata_heads: Optional[str] = None, keep_stale: Optional[bool] = None,
           numerics: Optional[bool] = None, trust_case_guard: bool = False, engine: Optional[str] = None,
           sut=None, defects: Optional[Iterable[str]] = None) -> tuple[RunSummary, ReplayOutcome]:
    """Replay one case on its engine (``engine`` overrides; ``sut`` supplies one already open; ``defects``
    overrides the case's seeded defects); the summary fails (exit 1) whenever the replay observes a violation, a
    shape error or a guard fault, and is inconclusive (exit 3) when the case needs a path the scenario runner
    does not model."""
    from gpu_impl.kernels import load

    from ..engine_choice import DEFAULT_ENGINE, engine_for_case, open_engine, start_engine

    if _is_kernel_file(path):
        options = {"--kernel": kernel_name not in (None, "emulated"), "--guard": guard,
                   "--metadata-heads": metadata_heads, "--numerics": numerics, "--engine": engine not in (None, DEFAULT_ENGINE),
                   "--keep-stale-cp-metadata": keep_stale}
        bad = next((o for o, v in options.items() if v), None)
        if bad or sut is not None:
            raise UsageError(f"{bad or 'sut'}: does not apply to a kernel-level case (one FA3 call on the emulated "
                             f"kernel; see docs/case-format.md)")
        return _replay_kernel(path, defects)
    case = load_case(path)
    expected = case.expected or {}
    why_not = unmodelled(case)
    if why_not:
        return _not_modelled(path, case, why_not)
    spec = sut.spec if sut is not None else engine_for_case(case, engine)
    for option, value in (("--guard", guard), ("--metadata-heads", metadata_heads),
                          ("--keep-stale-cp-metadata", keep_stale)):
        refusal = spec.plugin.policy_option_refusal(spec, option, replay=True) if value else None
        if refusal:
            raise UsageError(refusal)
    try:
        spec.plugin.check_case_options(spec, case.options)
    except ValueError as exc:
        raise UsageError(f"{exc} (the case names {case.engine or 'no engine'})") from None
    policy = case_model_policy(case, guard, metadata_heads, keep_stale, trust_case_guard)
    scn = scenario_from_case(case, defects=defects, policy=policy)
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
    # the case's policy builds the model it replays on (ModelSUT(policy=...)); an engine's own code decides
    sut = open_engine(spec, policy=policy) if own else sut
    start = time.perf_counter()
    try:
        if own:
            start_engine(sut, "replay")  # its own progress line: a release's import takes tens of seconds
            start = time.perf_counter()
        verdict = judge(sut, scn, kernel=kernel, numerics=use_numerics, device=device)
    finally:
        if own:
            sut.close()
    if verdict.unsupported:
        raise UsageError(f"--engine: {spec} cannot run this case: {verdict.reason}")
    result, findings, outcome, trace = verdict.result, verdict.findings, verdict.outcome, verdict.trace
    elapsed = time.perf_counter() - start
    observed = ReplayOutcome(expected_outcome=expected.get("outcome", Outcome.VIOLATION),
                             expected_invariant=expected.get("invariant"), outcome=outcome,
                             invariants=verdict.invariants, findings=findings, trace=trace)
    summary = RunSummary(command="replay", cases=1, failures=int(bool(findings)), elapsed_s=elapsed,
                         policy={"guard": scn.guard_spec, "metadata_heads": scn.metadata_heads,
                                 "clear_stale_cp_metadata": scn.clear_stale_cp_metadata,
                                 **({"defects": sorted(scn.defects)} if scn.defects else {}),
                                 **({"fa3_build": scn.fa3_build} if scn.fa3_build != UPSTREAM_BUILD else {})})
    fails = observed.fails
    summary.failures = int(fails)
    from ..engine_choice import fa3_build_of

    msg = "; ".join(f"{f.invariant} at step {f.step} rank {f.dp_rank}: {f.message}" for f in findings[:3])
    # numerics run on the emulator, which models upstream's kernel: such a run is judged under upstream's build
    # (the model judges under its scenario's build: the case's policy, e.g. a release profile's)
    build = fa3_build_of(None) if use_numerics else spec.plugin.judging_build(spec, scn)
    judged = f" [FA3 build {build}]"
    summary.checks.append(Check(name=f"replay {path}" + spec.plugin.run_label(spec), kind="replay",
                                verdict=Verdict.FAIL if fails else Verdict.PASS, seconds=elapsed, failed=fails, case_file=path,
                                message=(msg or f"outcome {outcome} (expected {observed.expected_outcome})") + judged))
    from ..sanitize.records import recorded_layout_text

    run_layout = recorded_layout_text(case)     # a sanitizer's case: the run's layout, not the model's stand-in
    if fails:
        terms = {"ran_on": ran_on(spec, scn), **configuration_terms(scn.server, scn.model)}
        if run_layout:
            terms["config"] = run_layout
        engine_findings = list(getattr(result, "findings", None) or []) if result is not None else []
        for i, f in enumerate(findings):
            finding = f.reported(case_file=path, check=summary.checks[-1].name,
                                 engine="replay" + spec.plugin.run_label(spec),
                                 hint=hint_for(f.invariant))
            if i < len(engine_findings):
                terms_i = {**terms, **terms_of_finding(scn, result, engine_findings[i], spec)}
                if run_layout:
                    terms_i["config"] = run_layout
            else:
                guard_fault = f.step is None and f.invariant in ("GUARD_RAISED", "GUARD_TIMEOUT")
                terms_i = {**terms, "guard": f"the guard raised: {f.message}"} if guard_fault else terms
            summary.findings.append(apply_terms(finding, terms_i))
    observed.ran_on = ran_on(spec, scn) + (f"; {run_layout}" if run_layout else "")
    return summary, observed


def _not_modelled(path: str, case, why: str) -> tuple[RunSummary, ReplayOutcome]:
    expected = case.expected or {}
    observed = ReplayOutcome(expected_outcome=expected.get("outcome", Outcome.VIOLATION),
                             expected_invariant=expected.get("invariant"), outcome=Outcome.NOT_MODELLED, invariants=[],
                             findings=[], trace=[])
    summary = RunSummary(command="replay", cases=0, policy=dict(case.policy))
    summary.checks.append(Check(name=f"replay {path}", kind="replay", verdict=Verdict.INCONCLUSIVE, seconds=0.0,
                                inconclusive=True, case_file=path, message=why))
    return summary, observed


def _is_kernel_file(path: str) -> bool:
    """True when the case file is a kernel-level case (a missing file is left to the scenario reader's error)."""
    try:
        return is_kernel_case(json.loads(read_text(path, "CASE")))
    except (UsageError, ValueError, RecursionError):
        return False


def _replay_kernel(path: str, defects: Optional[Iterable[str]]) -> tuple[RunSummary, ReplayOutcome]:
    """Replay a kernel-level case on the emulated kernel (fa3verify.kernel_cases); exit 1 unless it passes."""
    from spec.model.cases import CaseFormatError

    start = time.perf_counter()
    try:
        r = replay_kernel_case(path, defects)
    except CaseFormatError as exc:
        raise UsageError(f"CASE {path}: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"CASE {path}: {exc}".replace(f"CASE {path}: {path}: ", f"CASE {path}: ")) from None
    elapsed = time.perf_counter() - start
    exp, verdict = r["expected"], r["verdict"]
    findings = [f for f in verdict.findings or verdict.refusals if f.invariant]  # a refusal named by FA3's field too
    observed = ReplayOutcome(expected_outcome=exp["outcome"], expected_invariant=exp.get("invariant"),
                             outcome=r["outcome"], invariants=sorted(r["invariants"]), findings=findings, trace=[])
    fails = observed.fails
    summary = RunSummary(command="replay", cases=1, failures=int(fails), elapsed_s=elapsed,
                         policy={"kernel-level": True, "defects": sorted(defects) if defects is not None else None})
    msg = "; ".join(f"{f.invariant}: {f.message}" for f in findings[:3]) or "; ".join(r["messages"][:1])
    summary.checks.append(Check(name=f"replay {path} (kernel-level)", kind="replay",
                                verdict=Verdict.FAIL if fails else Verdict.PASS, seconds=elapsed, failed=fails, case_file=path,
                                message=msg or f"outcome {r['outcome']} (expected {exp['outcome']})"))
    for f in findings if fails else []:
        summary.findings.append(f.reported(case_file=path, engine="replay (kernel-level)"))
    return summary, observed


HELP = "replay a case file and report whether it still fails"
EPILOG = """\
A case file (JSON, schema fa3verify.case/1, see docs/case-format.md) is written by every refuted theorem,
every distinct fuzz failure and every catalogue entry. Replay runs its scenario again through the backend model
(or a kernel-level case's FA3 call on the emulated kernel), with the seeded defects it names, and prints the
violated invariant, the batch and the offending indices.

examples:
  fa3verify replay tests/corpus/worked_example_prefix_guard.json
  fa3verify replay CASE.json --guard fixed          # does the fixed guard make it pass?
  fa3verify replay CASE.json --without-defects      # does it pass without its seeded defects?
  fa3verify replay CASE.json --kernel fa3 --device cuda
{replay}"""


def register(sub) -> None:
    p = sub.add_parser("replay", help=HELP, description=HELP, epilog=with_engine_examples(EPILOG),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("case", metavar="CASE.json", help="the case file to replay")
    p.add_argument("--kernel", choices=("emulated", "fa3"), help="kernel adapter (default: the case's)")
    p.add_argument("--device", default="cpu", help="torch device for tensors (default cpu; cuda for fa3)")
    p.add_argument("--guard", metavar="SPEC", help="override the case's guard (fixed, pre-fix, none, module:fn)")
    p.add_argument("--metadata-heads", choices=("tp", "attn_tp"), help="override the case's metadata heads")
    p.add_argument("--numerics", action="store_true", help="run the kernel on tensors even for the emulator")
    p.add_argument("--without-defects", action="store_true",
                   help="replay without the seeded defects the case's `defects` field names (does the fix pass?)")

    add_guard_timeout_argument(p)
    p.add_argument("--trust-case-guard", action="store_true",
                   help="run the guard the case file names even when it is your own code (file or module); "
                        "without it a case file can only name fixed, pre-fix, none or this project's guards")
    p.add_argument("--json", metavar="PATH", help="write the run summary as JSON")
    add_engine_argument(p, default=None, help_extra="; default: the engine the case file names (none: model)")
    p.set_defaults(func=run)


def run(args) -> int:
    summary, observed = replay(args.case, kernel_name=args.kernel, device=args.device, guard=args.guard,
                               metadata_heads=args.metadata_heads, numerics=True if args.numerics else None,
                               trust_case_guard=args.trust_case_guard, engine=args.engine,
                               defects=() if args.without_defects else None)
    print(f"case: {args.case}")
    if observed.ran_on:
        print(f"replayed on {observed.ran_on}")
    print(f"expected: {observed.expected_outcome}"
          + (f" ({observed.expected_invariant})" if observed.expected_invariant else ""))
    print(f"observed: {observed.outcome}" + (f" ({', '.join(observed.invariants)})" if observed.invariants else ""))
    for f in observed.findings[:5]:
        detail = f.detail or {}
        where = f"step {f.step}, dp rank {f.dp_rank}"
        extra = {k: detail[k] for k in ("batch", "indices", "s_p", "s_c") if k in detail}
        print(f"  {f.invariant} at {where}: {f.message}" + (f" {extra}" if extra else ""))
    if summary.findings:
        first = summary.findings[0]
        sentence = finding_sentence(first)
        if sentence:
            print(f"  in backend terms: {sentence}")
        for token, meaning in first.config_terms or []:
            print(f"    {token}: {meaning}")
        for side in ("precompute", "call"):
            if (first.source or {}).get(side):
                print(f"  {side} made in: {first.source[side]}")
        if first.hint:
            print(f"  fix: {first.hint}")
    if observed.outcome == Outcome.NOT_MODELLED:
        print(f"verdict: INCONCLUSIVE ({summary.checks[0].message})")
    else:
        print(f"verdict: {observed.verdict}")

    return deliver(summary.exit_code, [("--json", args.json, lambda: write_json(summary, args.json))], "replay")
