"""The engine matrix: the gate on every sglang release, one row each, explained against the release's profile.

Invariant: each row is the verdict of ``gate --engine sglang==V`` on that release's own code (witnesses and a
fuzz campaign, ``fa3verify.engine_gate``), next to what facts about the release's code predict
(:func:`expected_verdict`: the witness theorems under its profile, ``spec/model/engine_profiles.json``, with the
assumptions it does not enforce dropped, ``spec/model/assumption_facts.json``): a release that accepts some configuration
in which its guard leaves the precompute on with ``H // tp_size`` heads differing from the call's must fail; one
with attention-TP heads must pass. A row that disagrees with its prediction is flagged, not hidden.

Beside the gate, each row carries the family probes (:data:`PROBES`): docs/facts-fa3.md's worked example
(Qwen3-30B-A3B shapes, one 32768-token row and seven 100-token rows) run on the release under prefill CP and under
DP attention, eager and CUDA graph, so a row says which family its heads and guard leave exposed even where a
short fuzz campaign reached only one. Probes are evidence beside the verdict, never the verdict.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from spec.process.worker_client import WorkerError

from . import exitcodes

SCHEMA = "fa3verify.engine-matrix/1"


@dataclass
class MatrixRow:
    """One release: the gate's verdict, what broke where, and the profile's prediction."""

    release: str
    verdict: str                      # pass | fail | inconclusive | unavailable
    exit_code: int
    invariants: list = field(default_factory=list)
    families: list = field(default_factory=list)       # configuration families reaching a violation
    paths: list = field(default_factory=list)          # "eager" and/or "CUDA graph" among the violations
    seconds: float = 0.0
    cases: int = 0
    expected: str = ""
    agrees: Optional[bool] = None
    profile: str = ""
    message: str = ""
    case_files: list = field(default_factory=list)
    #: family probe name -> "fail: INV, ..." | "pass" | "pass (no precompute)" | "error: ..." (see PROBES)
    probes: dict = field(default_factory=dict)
    #: the fuzz stage's domain: cases per metadata path, and configurations the release rejected by its reason
    reach: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)
    #: the FA3 build that judged the row (refmodel/fa3_builds.json; set from the release in __post_init__)
    fa3_build: str = ""

    def __post_init__(self):
        if not self.fa3_build:
            from .engine_choice import fa3_build_of
            from gpu_impl.sut import parse_engine

            try:
                self.fa3_build = fa3_build_of(parse_engine(f"sglang=={self.release}"))
            except ValueError:
                self.fa3_build = fa3_build_of(None)


#: The family probes: (name, server configuration) of the worked example; each runs eager and under CUDA graph.
PROBES = (
    ("prefill CP", dict(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag",
                        context_length=40960)),
    ("DP attention", dict(tp_size=4, dp_size=2, enable_dp_attention=True, context_length=40960)),
)
PROBE_MODEL = "qwen3-30b-a3b"
PROBE_BATCH = (32768,) + (100,) * 7


def run_probes(sut) -> dict:
    """Each family probe on the engine, eager and CUDA graph: ``{"prefill CP, eager": "fail: SPLIT_BOUND", ...}``.
    A probe the engine cannot run is recorded as an error, never as a pass."""
    from gpu_impl.config import ServerConfig, get_model
    from gpu_impl.scenario import Scenario, Step

    out = {}
    for name, server in PROBES:
        for graph in (False, True):
            key = f"{name}, {'CUDA graph' if graph else 'eager'}"
            scn = Scenario(server=ServerConfig(**server, cuda_graph=graph), model=get_model(PROBE_MODEL), guard=None,
                           steps=[Step("decode", list(PROBE_BATCH))])
            try:
                result = sut.run(scn)
            except WorkerError:
                raise  # a worker past its deadline (or dead): the row is inconclusive, not one probe's result
            except Exception as exc:  # noqa: BLE001 - the engine's crash is the probe's result
                out[key] = f"error: {type(exc).__name__}: {str(exc)[:120]}"
                continue
            bad = sorted({f.invariant for f in result.findings} | {e.invariant for e in result.shape_errors})
            if bad:
                out[key] = "fail: " + ", ".join(bad)
            elif not any(e.get("precomputed") for e in result.trace):
                out[key] = "pass (no precompute)"
            else:
                out[key] = "pass"
    return out


def expected_verdict(profile, facts: Optional[dict] = None, timeout_s: float = 10.0,
                     cases_dir: Optional[str] = None) -> str:
    """What the release's code predicts, derived from facts about it rather than written down: the witness theorems
    (``prefill-cp-hazard``, ``guard-soundness``) under the release's profile (its heads and guard) with the prover assumptions
    the release does not enforce dropped (``facts``, ``spec.model.assumption_facts``): ``fail`` when one is refuted (some
    configuration the release accepts overflows), ``pass`` when all are proved, ``inconclusive`` otherwise."""
    from spec.model.assumption_facts import facts_for, prover_drops

    from .engine_gate import WITNESS_THEOREMS
    from .policy import load_policy
    from .commands.prove import theorem_results

    facts = facts_for("sglang", profile.release) if facts is None else facts
    policy = load_policy(profile.guard_spec, profile.precompute_heads)
    results = [r for r in theorem_results(policy, timeout_s=timeout_s, cases_dir=cases_dir,
                                          only=list(WITNESS_THEOREMS), dropped_assumptions=prover_drops(facts))
               if r.name in WITNESS_THEOREMS]
    if any(r.verdict == "refuted" for r in results):
        return "fail"
    if results and all(r.verdict == "proved" for r in results):
        return "pass"
    return "inconclusive"


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


def row_from_summary(release: str, profile, summary, seconds: float, expected: str = "") -> MatrixRow:
    """A matrix row from one release's gate summary (findings' case files give families and paths)."""
    from spec.model.cases import Case

    invariants, families, paths, files = set(), set(), set(), []
    for f in summary.findings:
        invariants.add(f.invariant)
        if f.case_file:
            try:
                case = Case.load(f.case_file)
            except (OSError, ValueError):
                continue
            fam, path = family_of(case.server)
            families.add(fam)
            paths.add(path)
            files.append(f.case_file)
    verdict = exitcodes.verdict_name(summary.exit_code)
    return MatrixRow(release=release, verdict=verdict, exit_code=summary.exit_code, invariants=sorted(invariants),
                     families=sorted(families), paths=sorted(paths), seconds=round(seconds, 2), cases=summary.cases,
                     expected=expected, agrees=(verdict == expected) if verdict in ("pass", "fail") else None,
                     profile=profile.describe(),
                     case_files=sorted(set(files)),
                     reach=dict((summary.domain or {}).get("reach", {})),
                     rejected=dict((summary.domain or {}).get("rejected", {})))


def run_matrix(releases, open_sut: Callable, budget_s: Optional[float] = 20.0, max_cases: Optional[int] = None,
               seed: int = 0, timeout_s: float = 10.0, cases_dir: str = "fa3verify-out/engine-matrix",
               progress: Optional[Callable[[str], None]] = None, with_probes: bool = True) -> list:
    """Gate every release (``open_sut(release)`` opens it; a UsageError there makes an 'unavailable' row)."""
    from spec.model.engine_profiles import profile_for

    from .commands.gate import gate
    from .errors import UsageError

    say = progress or (lambda line: None)
    say("witness searches on the model are shared by releases with the same guard and assumptions")
    witness_cache: dict = {}
    rows = []
    for release in releases:
        profile = profile_for(release)
        start = time.perf_counter()
        say(f"sglang {release}: expected verdict from its facts (z3) ...")
        expected = expected_verdict(profile, timeout_s=timeout_s, cases_dir=f"{cases_dir}/expected/{release}")
        say(f"sglang {release}: environment ...")
        try:
            sut = open_sut(release)
        except UsageError as exc:
            rows.append(MatrixRow(release=release, verdict="unavailable", exit_code=exitcodes.INCONCLUSIVE,
                                  expected=expected, profile=profile.describe(), message=str(exc)))
            say(f"sglang {release}: unavailable ({exc})")
            continue
        try:
            with sut:
                say(f"sglang {release}: gate (witness searches, witness replay, fuzz) ...")
                searched = len(witness_cache)
                summary = gate(sut, budget_s=budget_s, seed=seed, timeout_s=timeout_s,
                               cases_dir=f"{cases_dir}/{release}", max_cases=max_cases, show_progress=False,
                               witness_cache=witness_cache)
                say(f"sglang {release}: witness search done ({len(witness_cache) - searched} searches run now, "
                    f"{len(witness_cache)} in all, shared by the releases that need them)")
                if with_probes:
                    say(f"sglang {release}: family probes ...")
                probes = run_probes(sut) if with_probes else {}
        except Exception as exc:  # noqa: BLE001 - a worker that dies or never answers: this row ran nothing
            if not isinstance(exc, WorkerError):
                raise
            rows.append(MatrixRow(release=release, verdict="inconclusive", exit_code=exitcodes.INCONCLUSIVE,
                                  seconds=round(time.perf_counter() - start, 2), expected=expected,
                                  profile=profile.describe(), message=str(exc).splitlines()[0]))
            say(f"sglang {release}: inconclusive ({rows[-1].message})")
            continue
        row = row_from_summary(release, profile, summary, time.perf_counter() - start, expected)
        row.probes = probes
        rows.append(row)
        say(f"sglang {release}: {row.verdict} (expected {row.expected}) {', '.join(row.invariants) or '-'} "
            f"[{'; '.join(row.families) or '-'}] {row.seconds:.1f}s; probes: "
            f"{'; '.join(f'{k} {v}' for k, v in row.probes.items()) or '-'}")
    return rows


def matrix_exit_code(rows) -> int:
    """1 if any release fails its gate, else 3 if any could not run or was inconclusive, else 0."""
    return exitcodes.combine([r.exit_code for r in rows]) if rows else exitcodes.INCONCLUSIVE


def matrix_json(rows) -> dict:
    return {"schema": SCHEMA, "exit_code": matrix_exit_code(rows),
            "disagreeing": [r.release for r in rows if r.agrees is False], "rows": [asdict(r) for r in rows]}


def matrix_markdown(rows) -> str:
    """The matrix as a Markdown table (docs/engines.md)."""
    out = ["| release | verdict | expected (profile) | invariants violated | configuration families | path | "
           "cases | seconds | probes: prefill CP eager / graph | probes: DP attention eager / graph |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        probe = [_short(r.probes.get(f"{name}, {p}")) for name, _ in PROBES for p in ("eager", "CUDA graph")]
        out.append(f"| {r.release} | {r.verdict} | {r.expected}{'' if r.agrees is not False else ' (DISAGREES)'} | "
                   f"{', '.join(r.invariants) or '-'} | {'; '.join(r.families) or '-'} | "
                   f"{', '.join(r.paths) or '-'} | {r.cases} | {r.seconds:.1f} | {probe[0]} / {probe[1]} | "
                   f"{probe[2]} / {probe[3]} |")
    return "\n".join(out)


def matrix_table(rows) -> str:
    """The matrix as a plain-text table (one row per release)."""
    head = f"{'release':<8} {'verdict':<12} {'expected':<8} {'invariants':<28} {'path':<18} {'s':>6}  families"
    lines = [head, "-" * len(head)]
    for r in rows:
        flag = "" if r.agrees is not False else " !"
        lines.append(f"{r.release:<8} {r.verdict + flag:<12} {r.expected:<8} {', '.join(r.invariants) or '-':<28} "
                     f"{', '.join(r.paths) or '-':<18} {r.seconds:>6.1f}  {'; '.join(r.families) or '-'}")
    return "\n".join(lines)


def matrix_verdict_line(rows, code: int) -> str:
    """The matrix's one verdict line: VERDICT, releases, failing, disagreeing with their profile."""
    return (f"verdict: {exitcodes.verdict_name(code).upper()} | releases {len(rows)} | failing "
            f"{sum(r.verdict == 'fail' for r in rows)} | disagreeing with their profile "
            f"{sum(r.agrees is False for r in rows)}")


def _short(probe: Optional[str]) -> str:
    """A probe result for a table cell: fail (with the invariants), pass, pass without a precompute, error, -."""
    if not probe:
        return "-"
    if probe.startswith("fail: "):
        return "fail (" + probe[len("fail: "):] + ")"
    return "error" if probe.startswith("error") else probe
