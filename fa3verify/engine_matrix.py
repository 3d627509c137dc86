"""The engine matrix: the gate on every release of one engine (a registry form that takes a release), one row each, explained
against the release's profile, and each failing row's cases replayed on every later release (the fix release).

Invariant: each row is the verdict of ``gate --engine ENGINE==V`` on that release's own code (witnesses and a
fuzz campaign, ``fa3verify.engine_gate``), next to what facts about the release's code predict
(:func:`expected_verdict`: the witness theorems under its profile, ``spec/model/engine_profiles.json``, with the
assumptions it does not enforce dropped, ``spec/model/assumption_facts.json``): a release that accepts some configuration
in which its guard leaves the precompute on with ``H // tp_size`` heads differing from the call's must fail; one
with attention-TP heads must pass. A row that disagrees with its prediction is flagged, not hidden.

Beside the gate, each row carries the family probes (:data:`PROBES`): docs/facts-fa3.md's worked example
(Qwen3-30B-A3B shapes, one 32768-token row and seven 100-token rows) run on the release under prefill CP and under
DP attention, eager and CUDA graph, so a row says which family its heads and guard leave exposed even where a
short fuzz campaign reached only one. Probes are evidence beside the verdict, never the verdict.

Nothing here branches on the engine: the releases come from the engine's registry row (``gpu_impl.sut
.releases_of``), a case's family and path from its system under test (``SystemUnderTest.case_family``, else the
server configuration's families below), the probes from it too (``family_probes``), the prediction from the
release's profile (a profile the model plays: the witness theorems; one with its own theorem: the gate's own
row for it), and the fix releases from replays (:mod:`fa3verify.matrix_fixes`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from spec.finding import MatrixVerdict, ProbeResult, TheoremVerdict
from gpu_impl.plugin import release_forms
from spec.process.worker_client import WorkerError

from . import exitcodes
from .errors import UsageError

SCHEMA = "fa3verify.engine-matrix/1"


@dataclass
class MatrixRow:
    """One release: the gate's verdict, what broke where, and the profile's prediction."""

    release: str
    verdict: MatrixVerdict            # pass | fail | inconclusive | unavailable (a word is stored as its member)
    exit_code: int
    invariants: list = field(default_factory=list)
    families: list = field(default_factory=list)       # configuration families reaching a violation
    paths: list = field(default_factory=list)          # "eager" and/or "CUDA graph" among the violations
    seconds: float = 0.0
    cases: int = 0
    expected: str = ""                # the profile's prediction: a MatrixVerdict, "" when there is none
    agrees: Optional[bool] = None
    profile: str = ""
    message: str = ""
    case_files: list = field(default_factory=list)
    #: family probe name -> "fail: INV, ..." | "pass" | "pass (no precompute)" | "error: ..." (see PROBES); None:
    #: the engine has no family probes (its families are its campaign's, counted in ``reach``)
    probes: Optional[dict] = field(default_factory=dict)
    #: the fuzz stage's domain: cases per metadata path, and configurations the release rejected by its reason
    reach: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)
    #: the FA3 build that judged the row (refmodel/fa3_builds.json; set from the release in __post_init__)
    fa3_build: str = ""
    #: the engine (a registry kind of gpu_impl/engine_forms.json whose form takes a release)
    engine: str = field(default_factory=lambda: default_engine())
    #: paths the release's domain lists as not covered, each with why (``gpu_impl.domain.reach_report``)
    not_covered: dict = field(default_factory=dict)
    #: the release whose row ran this one ("" : itself; another: its driven files are byte-identical)
    runs_as: str = ""

    def __post_init__(self):
        self.verdict = MatrixVerdict(self.verdict)
        if self.expected:
            self.expected = MatrixVerdict(self.expected)
        if not self.fa3_build:
            from .engine_choice import fa3_build_of

            try:
                self.fa3_build = fa3_build_of(spec_of(self.engine, self.release))
            except ValueError:
                self.fa3_build = fa3_build_of(None)


def spec_of(engine: str, release: str):
    """The EngineSpec of ``release`` of ``engine`` (a registry kind), by its form's prefix (EngineSpecError, a
    ValueError, for a release the form does not take)."""
    from gpu_impl.sut import ENGINE_REGISTRY, parse_engine

    return parse_engine(ENGINE_REGISTRY[engine]["prefix"] + release)


#: The family probes: (name, server configuration) of the worked example; each runs eager and under CUDA graph.
PROBES = (
    ("prefill CP", dict(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag",
                        context_length=40960)),
    ("DP attention", dict(tp_size=4, dp_size=2, enable_dp_attention=True, context_length=40960)),
)
PROBE_MODEL = "qwen3-30b-a3b"
PROBE_BATCH = (32768,) + (100,) * 7


def run_probes(sut) -> dict:
    """Each family probe on the engine, eager and CUDA graph: ``{"prefill CP, eager": "fail: SPLIT_BOUND", ...}``,
    judged by :func:`fa3verify.judge.judge` like every scenario run (an FA3 abort is its PROCESS_ABORT finding).
    A probe the engine cannot run, or crashes on, is recorded as an error, never as a pass. The probes are the
    engine's own (``sut.family_probes()``) or, when it names none, :data:`PROBES`."""
    from gpu_impl.config import ServerConfig, get_model
    from gpu_impl.scenario import Scenario, Step

    from .judge import judge

    own = getattr(sut, "family_probes", lambda: None)()
    out = {}
    for name, server in (PROBES if own is None else own):
        for graph in (False, True):
            key = f"{name}, {'CUDA graph' if graph else 'eager'}"
            scn = Scenario(server=ServerConfig(**server, cuda_graph=graph), model=get_model(PROBE_MODEL), guard=None,
                           steps=[Step("decode", list(PROBE_BATCH))])
            # the judge re-raises a worker past its deadline (or dead): the row is inconclusive, not one probe's result
            verdict = judge(sut, scn, crash_is_error=True)
            if verdict.error is not None:  # the engine's crash (or refusal to run it) is the probe's result
                exc = verdict.error
                out[key] = f"{ProbeResult.ERROR}: {type(exc).__name__}: {str(exc)[:120]}"
                continue
            bad = sorted({f.invariant for f in verdict.findings} | {e.invariant for e in verdict.shape_errors})
            if bad:
                out[key] = f"{ProbeResult.FAIL}: " + ", ".join(bad)
            elif not any(e.get("precomputed") for e in verdict.trace):
                out[key] = ProbeResult.PASS_NO_PRECOMPUTE
            else:
                out[key] = ProbeResult.PASS
    return out


def default_engine() -> str:
    """The engine the matrix gates unless told: the first registry form that takes a release."""
    return release_forms()[0]["kind"]


def engine_plugin(engine: Optional[str]):
    """The plugin of registry kind ``engine`` (None: :func:`default_engine`)."""
    from gpu_impl.sut import EngineSpec

    return EngineSpec(engine or default_engine()).plugin


def expected_verdict(profile, facts: Optional[dict] = None, timeout_s: float = 10.0,
                     cases_dir: Optional[str] = None, engine: Optional[str] = None) -> str:
    """What the release's code predicts, derived from facts about it rather than written down: the witness theorems
    (``prefill-cp-hazard``, ``guard-soundness``) under the release's profile (its heads and guard) with the prover assumptions
    the release does not enforce dropped (``facts``, ``spec.model.assumption_facts``): ``fail`` when one is refuted (some
    configuration the release accepts overflows), ``pass`` when all are proved, ``inconclusive`` otherwise."""
    from spec.model.assumption_facts import prover_drops

    from .engine_gate import WITNESS_THEOREMS
    from .policy import load_policy
    from .commands.prove import theorem_results

    facts = engine_plugin(engine).assumption_facts(profile.release) if facts is None else facts
    policy = load_policy(profile.guard_spec, profile.precompute_heads)
    results = [r for r in theorem_results(policy, timeout_s=timeout_s, cases_dir=cases_dir,
                                          only=list(WITNESS_THEOREMS), dropped_assumptions=prover_drops(facts))
               if r.name in WITNESS_THEOREMS]
    if any(r.verdict == TheoremVerdict.REFUTED for r in results):
        return MatrixVerdict.FAIL
    if results and all(r.verdict == TheoremVerdict.PROVED for r in results):
        return MatrixVerdict.PASS
    return MatrixVerdict.INCONCLUSIVE


def family_of(server: dict) -> tuple[str, str]:
    """(configuration family, path) of a case's server object: DP attention / prefill CP / attention CP without
    prefill CP / TP only; eager or graph."""
    parts = []
    if server.get("enable_dp_attention"):
        parts.append(f"DP attention (dp {server.get('dp_size', 1)})")
    if server.get("enable_prefill_cp"):
        parts.append(f"prefill CP (attn_cp {server.get('attn_cp_size', 1)})")
    elif server.get("attn_cp_size", 1) > 1:
        parts.append(f"attention CP without prefill CP (attn_cp {server.get('attn_cp_size', 1)})")
    family = " + ".join(parts) or "TP only"
    return family, "CUDA graph" if server.get("cuda_graph") else "eager"


def case_family(case, sut=None) -> tuple[str, str]:
    """(family, path) of a case: the system under test's own terms (``sut.case_family``), else :func:`family_of`
    its server configuration."""
    own = getattr(sut, "case_family", None) if sut is not None else None
    named = own(case) if own is not None else None
    return tuple(named) if named else family_of(case.server)


def row_from_summary(release: str, profile, summary, seconds: float, expected: str = "", sut=None,
                     engine: Optional[str] = None) -> MatrixRow:
    """A matrix row from one release's gate summary (findings' case files give families and paths, named by
    ``sut`` where it names them). ``expected`` "" on a release whose profile has its own theorem: the gate's row
    for it predicts (:func:`own_theorem_prediction`)."""
    from spec.model.cases import Case

    engine = engine or default_engine()
    invariants, families, paths, files = set(), set(), set(), []
    for f in summary.findings:
        invariants.add(f.invariant)
        if f.case_file:
            try:
                case = Case.load(f.case_file)
            except (OSError, ValueError):
                continue
            fam, path = case_family(case, sut)
            families.add(fam)
            paths.add(path)
            files.append(f.case_file)
    verdict = MatrixVerdict(exitcodes.verdict_name(summary.exit_code))
    expected = expected or own_theorem_prediction(summary)
    domain = summary.domain or {}
    return MatrixRow(release=release, verdict=verdict, exit_code=summary.exit_code, invariants=sorted(invariants),
                     families=sorted(families), paths=sorted(paths), seconds=round(seconds, 2), cases=summary.cases,
                     expected=expected,
                     agrees=(verdict == expected) if verdict in (MatrixVerdict.PASS, MatrixVerdict.FAIL) and expected
                     else None, profile=describe_profile(profile), engine=engine,
                     case_files=sorted(set(files)),
                     reach=dict(domain.get("reach", {})), not_covered=dict(domain.get("not_covered", {})),
                     rejected=dict(domain.get("rejected", {})))


def describe_profile(profile) -> str:
    return profile.describe() if profile is not None else "no profile (spec/model: none for this release)"


def own_theorem_prediction(summary) -> str:
    """What a release's own profile theorem predicts, read from the gate's row for it (a theorem row that is not
    a witness search: the engine's own flow theorem): ``pass`` when proved, ``fail`` when refuted, "" when the gate has no
    such row or it could not decide."""
    rows = [c for c in summary.checks if c.kind == "theorem" and not c.name.startswith("witness search")]
    if not rows or any(c.inconclusive or c.verdict not in (TheoremVerdict.PROVED, TheoremVerdict.REFUTED)
                       for c in rows):
        return ""
    return MatrixVerdict.FAIL if any(c.verdict == TheoremVerdict.REFUTED for c in rows) else MatrixVerdict.PASS


def release_profile(engine: str, release: str):
    """The profile of ``release`` of ``engine`` (``gpu_impl.plugin.engine_profile_for``), or None."""
    from gpu_impl.plugin import engine_profile_for

    try:
        return engine_profile_for(str(spec_of(engine, release)))[1]
    except ValueError:
        return None


def predicted_verdict(profile, timeout_s: float, cases_dir: str, engine: Optional[str] = None) -> str:
    """The prediction made before the gate: a profile the model plays (it names a model ``policy``) by the
    witness theorems (:func:`expected_verdict`); "" for any other (its own theorem runs in the gate)."""
    if profile is None or not callable(getattr(profile, "policy", None)):
        return ""
    return expected_verdict(profile, timeout_s=timeout_s, cases_dir=cases_dir, engine=engine)


@dataclass
class RowOptions:
    """How every release of one matrix run is gated (the same for every lane)."""

    engine: str
    budget_s: Optional[float] = 20.0
    max_cases: Optional[int] = None
    seed: int = 0
    timeout_s: float = 10.0
    cases_dir: str = "fa3verify-out/engine-matrix"
    with_probes: bool = True
    #: keep the release's engine open after its row (the fix-release replays run on it)
    keep_open: bool = True


@dataclass
class ReleaseRun:
    """One release gated: its row; its engine, still open when the options keep it (None otherwise, or when the
    release could not run); the case files of a failing row with their family and path in the engine's terms
    (:class:`fa3verify.matrix_fixes.CaseReplays`); whether a SIGINT cut the gate short."""

    row: MatrixRow
    sut: object = None
    cases: list = field(default_factory=list)
    interrupted: bool = False
    #: the engine is held open (in this process: ``sut``; in a lane's process: there) for the fix-release replays
    open: bool = False

    def __post_init__(self):
        self.open = self.open or self.sut is not None


def gate_release(release: str, open_sut: Callable, options: RowOptions,
                 say: Callable[[str], None] = lambda line: None, witness_cache: Optional[dict] = None) -> ReleaseRun:
    """Gate ``release`` (``open_sut(release)`` opens it; a UsageError or a worker that cannot start there makes an
    'unavailable' row with the reason, a worker that dies or never answers an 'inconclusive' one): the prediction,
    the gate (witness searches and flow theorem from the z3 cache where they are kept, as the gate command keeps them),
    the family probes, the row. ``witness_cache`` (keyed by search) shares the witness searches between the releases
    one process gates. A SIGINT that reaches it outside the gate's own handling (opening the engine, the probes) makes
    an interrupted inconclusive row."""
    try:
        return _gate_release(release, open_sut, options, say, witness_cache)
    except KeyboardInterrupt:
        return ReleaseRun(inconclusive_row(release, options.engine, INTERRUPTED), interrupted=True)


INTERRUPTED = "not gated: the run was interrupted (SIGINT) before this release"


def _gate_release(release, open_sut, options, say, witness_cache) -> ReleaseRun:
    from .commands.gate import gate
    from .matrix_fixes import ledger_cases

    engine = options.engine
    profile = release_profile(engine, release)
    start = time.perf_counter()
    if callable(getattr(profile, "policy", None)):
        say(f"{engine} {release}: expected verdict from its facts (z3) ...")
    expected = predicted_verdict(profile, options.timeout_s, f"{options.cases_dir}/expected/{release}", engine)
    say(f"{engine} {release}: environment ...")
    try:
        sut = open_sut(release)
    except (UsageError, WorkerError, ValueError) as exc:
        row = MatrixRow(release=release, verdict=MatrixVerdict.UNAVAILABLE, exit_code=exitcodes.INCONCLUSIVE,
                        expected=expected, profile=describe_profile(profile), engine=engine,
                        message=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        say(f"{engine} {release}: unavailable ({row.message})")
        return ReleaseRun(row)
    kept = False
    try:
        say(f"{engine} {release}: gate (witness searches, witness replay, fuzz) ...")
        witness_cache = {} if witness_cache is None else witness_cache
        searched = len(witness_cache)
        summary = gate(sut, budget_s=options.budget_s, seed=options.seed, timeout_s=options.timeout_s,
                       cases_dir=f"{options.cases_dir}/{release}", max_cases=options.max_cases, show_progress=False,
                       witness_cache=witness_cache, z3_cache=True)
        say(f"{engine} {release}: witness search done ({len(witness_cache) - searched} searches run now or read from "
            f"the z3 cache, {len(witness_cache)} in all in this process, shared by the releases that need them)")
        own_probes = getattr(sut, "family_probes", lambda: None)()
        probes = {}
        if options.with_probes and own_probes != () and not summary.interrupted:
            say(f"{engine} {release}: family probes ...")
            probes = run_probes(sut)
        row = row_from_summary(release, profile, summary, time.perf_counter() - start, expected, sut=sut,
                               engine=engine)
        row.probes = None if own_probes == () else probes  # None: the engine has no probes
        cases = ledger_cases(row, sut)
        say(f"{engine} {release}: {row.verdict} (expected {row.expected or '-'}) {', '.join(row.invariants) or '-'} "
            f"[{'; '.join(row.families) or '-'}] {row.seconds:.1f}s; probes: "
            f"{'; '.join(f'{k} {v}' for k, v in (row.probes or {}).items()) or '-'}")
        kept = options.keep_open and not summary.interrupted
        return ReleaseRun(row, sut if kept else None, cases, bool(summary.interrupted))
    except WorkerError as exc:  # a worker that dies or never answers: this row ran nothing
        row = inconclusive_row(release, engine, str(exc).splitlines()[0])
        row.seconds, row.expected = round(time.perf_counter() - start, 2), expected
        say(f"{engine} {release}: inconclusive ({row.message})")
        return ReleaseRun(row)
    finally:
        if not kept:
            sut.close()


def inconclusive_row(release: str, engine: str, why: str) -> MatrixRow:
    """The row of a release that was not gated to its end (a SIGINT stopped the run before it, or the lane gating
    it died): inconclusive, saying why; never a pass."""
    return MatrixRow(release=release, verdict=MatrixVerdict.INCONCLUSIVE, exit_code=exitcodes.INCONCLUSIVE,
                     engine=engine, profile=describe_profile(release_profile(engine, release)), message=why)


def shared_row(row: MatrixRow, release: str) -> MatrixRow:
    """The row of a release whose driven files are byte-identical to ``row``'s release: its verdict, saying so."""
    import dataclasses

    return dataclasses.replace(row, release=release, runs_as=row.release, seconds=0.0,
                               message=f"driven files byte-identical to {row.engine} {row.release}: its row")


def matrix_exit_code(rows) -> int:
    """1 if any release fails its gate, else 3 if any could not run or was inconclusive, else 0."""
    return exitcodes.combine([r.exit_code for r in rows]) if rows else exitcodes.INCONCLUSIVE


def matrix_json(rows, fixes: Optional[list] = None) -> dict:
    """The matrix (schema fa3verify.engine-matrix/1); ``fixes``: the fix releases (:mod:`fa3verify.matrix_fixes`)."""
    data = {"schema": SCHEMA, "exit_code": matrix_exit_code(rows),
            "disagreeing": [r.release for r in rows if r.agrees is False], "rows": [asdict(r) for r in rows]}
    if fixes is not None:
        data["fixes"] = list(fixes)
    return data


def _reach_cell(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "-"


def matrix_markdown(rows) -> str:
    """The matrix as a Markdown table (docs/engines.md); an engine without family probes gets the reach per path
    in its rows instead."""
    if rows and all(r.probes is None for r in rows):
        out = ["| release | verdict | expected (profile) | invariants violated | configuration families | path | "
               "reach (cases per path) | cases | seconds |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            waiting = r.verdict in (MatrixVerdict.UNAVAILABLE, MatrixVerdict.INCONCLUSIVE)
            verdict = r.verdict + (f" ({r.message})" if waiting and r.message
                                   else "")
            out.append(f"| {r.release} | {verdict} | {r.expected or '-'}"
                       f"{'' if r.agrees is not False else ' (DISAGREES)'} | {', '.join(r.invariants) or '-'} | "
                       f"{'; '.join(r.families) or '-'} | {', '.join(r.paths) or '-'} | {_reach_cell(r.reach)} | "
                       f"{r.cases} | {r.seconds:.1f} |")
        return "\n".join(out)
    out = ["| release | verdict | expected (profile) | invariants violated | configuration families | path | "
           "cases | seconds | probes: prefill CP eager / graph | probes: DP attention eager / graph |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        probe = [_short((r.probes or {}).get(f"{name}, {p}")) for name, _ in PROBES for p in ("eager", "CUDA graph")]
        out.append(f"| {r.release} | {r.verdict} | {r.expected}{'' if r.agrees is not False else ' (DISAGREES)'} | "
                   f"{', '.join(r.invariants) or '-'} | {'; '.join(r.families) or '-'} | "
                   f"{', '.join(r.paths) or '-'} | {r.cases} | {r.seconds:.1f} | {probe[0]} / {probe[1]} | "
                   f"{probe[2]} / {probe[3]} |")
    return "\n".join(out)


def matrix_table(rows) -> str:
    """The matrix as a plain-text table (one row per release; a row that could not run gives its reason, a row
    with a reach report its cases per path)."""
    head = f"{'release':<8} {'verdict':<12} {'expected':<8} {'invariants':<28} {'path':<18} {'s':>6}  families"
    lines = [head, "-" * len(head)]
    for r in rows:
        flag = "" if r.agrees is not False else " !"
        lines.append(f"{r.release:<8} {r.verdict + flag:<12} {r.expected or '-':<8} "
                     f"{', '.join(r.invariants) or '-':<28} "
                     f"{', '.join(r.paths) or '-':<18} {r.seconds:>6.1f}  {'; '.join(r.families) or '-'}")
        if r.verdict in (MatrixVerdict.UNAVAILABLE, MatrixVerdict.INCONCLUSIVE) and r.message:
            lines.append(f"{'':<8} why: {r.message}")
        if r.runs_as:
            lines.append(f"{'':<8} {r.message}")
        if r.probes is None and r.reach:
            lines.append(f"{'':<8} reach: {_reach_cell(r.reach)}")
    return "\n".join(lines)


def matrix_verdict_line(rows, code: int) -> str:
    """The matrix's one verdict line: VERDICT, releases, failing, disagreeing with their profile."""
    return (f"verdict: {exitcodes.verdict_name(code).upper()} | releases {len(rows)} | failing "
            f"{sum(r.verdict == MatrixVerdict.FAIL for r in rows)} | disagreeing with their profile "
            f"{sum(r.agrees is False for r in rows)}")


def _short(probe: Optional[str]) -> str:
    """A probe result for a table cell: fail (with the invariants), pass, pass without a precompute, error, -."""
    if not probe:
        return "-"
    failed = f"{ProbeResult.FAIL}: "
    if probe.startswith(failed):
        return f"{ProbeResult.FAIL} (" + probe[len(failed):] + ")"
    return ProbeResult.ERROR if probe.startswith(ProbeResult.ERROR) else probe
