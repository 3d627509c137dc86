"""The fix release of every failing matrix row: its case files replayed on their own release and on every later one.

Invariant: a failing row's case file is first replayed on the release it was found on (it must STILL FAIL there,
else the finding is not reproducible and is said so), then on every later release the matrix gates, while that
release's engine is open for its own gate (one worker start per release; with lanes, once every earlier release
has its row: :mod:`fa3verify.matrix_lanes`). A family's fix release is the first
later release on which every case file of that family (found on that row) PASSES NOW; a release whose own
validation rejects the configuration, that cannot run it, or on which it fails differently is not a fix and is
named as what it is. A family no later release fixes says so, naming the releases that still fail.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spec.finding import MatrixVerdict

from .commands.replay import load_case

__all__ = ["FixLedger", "CaseReplays", "ledger_cases", "replay_on_release", "fixes_table", "fixes_markdown",
           "across_shards", "replay_across_shards", "unreplayed_before_first_pass", "STILL_FAILS", "PASSES_NOW"]

STILL_FAILS = "STILL FAILS"
PASSES_NOW = "PASSES NOW"


@dataclass
class CaseReplays:
    """One case file of a failing row and what replaying it on each release said."""

    found_on: str
    case_file: str
    family: str
    path: str
    invariant: str
    replays: dict = field(default_factory=dict)   # release -> STILL FAILS | PASSES NOW | FAILS DIFFERENTLY | ...


def replay_on_release(case_file: str, sut) -> str:
    """The replay verdict of ``case_file`` on an open system under test: STILL FAILS, PASSES NOW, FAILS
    DIFFERENTLY (:attr:`fa3verify.commands.replay.ReplayOutcome.verdict`), REJECTED (its own validation refuses the
    configuration, with its reason) or NOT RUN (it cannot run the case, or its worker failed, with why)."""
    from .engine_choice import engine_validation
    from .errors import UsageError
    from .commands.replay import replay, scenario_from_case

    from spec.process.worker_client import WorkerError

    case = load_case(case_file)
    scn = scenario_from_case(case)
    try:
        accepted, why = engine_validation(sut, scn.server, scn.model)
        if accepted is False:
            return f"REJECTED ({' '.join(why.split())[:160]})"
        _, outcome = replay(case_file, sut=sut)
    except (UsageError, WorkerError) as exc:  # the engine cannot run it, or its worker failed: never a pass
        return f"NOT RUN ({' '.join(str(exc).split())[:160]})"
    return outcome.verdict


def ledger_cases(row, sut) -> list:
    """The :class:`CaseReplays` of a failing row's case files (family and path in ``sut``'s terms), none for any
    other row; an unreadable case file is skipped, as the row skips it."""
    from .engine_matrix import case_family

    if row.verdict != MatrixVerdict.FAIL:
        return []
    out = []
    for path in row.case_files:
        try:
            case = load_case(path)
        except Exception:  # noqa: BLE001 - an unreadable case file is skipped by the row already
            continue
        family, where = case_family(case, sut)
        invariant = str((case.expected or {}).get("invariant") or "")
        out.append(CaseReplays(row.release, path, family, where, invariant))
    return out


class FixLedger:
    """The case files of the failing rows so far, and their replays per release (see the module doc)."""

    def __init__(self):
        self.cases: list = []

    def add(self, cases: list) -> None:
        """Register a failing row's case files (:func:`ledger_cases`)."""
        self.cases.extend(cases)

    def pending(self, release: str) -> list:
        """The registered case files (its own release's and earlier ones') not yet replayed on ``release``."""
        return sorted({c.case_file for c in self.cases if release not in c.replays})

    def record(self, release: str, verdicts: dict) -> None:
        """Keep the replay verdicts on ``release`` (case file -> verdict; a file without one: NOT RUN)."""
        for c in self.cases:
            if release not in c.replays:
                c.replays[release] = verdicts.get(c.case_file, "NOT RUN (no replay answer)")

    def entries(self, order: list) -> list:
        """One entry per (release found on, family): its case files, whether they STILL FAIL on their own release,
        the verdict on each later release, and the first later release where every one PASSES NOW (None: none)."""
        groups: dict = {}
        rank = {r: i for i, r in enumerate(order)}
        for c in sorted(self.cases, key=lambda c: rank.get(c.found_on, len(rank))):  # release order, however run
            groups.setdefault((c.found_on, c.family), []).append(c)
        out = []
        for (found_on, family), cases in groups.items():
            later = [r for r in order[order.index(found_on) + 1:] if all(r in c.replays for c in cases)] \
                if found_on in order else []
            per_release = {r: _combined([c.replays[r] for c in cases]) for r in [found_on] + later
                           if all(r in c.replays for c in cases)}
            first = next((r for r in later if per_release.get(r) == PASSES_NOW), None)
            out.append({"found_on": found_on, "family": family, "paths": sorted({c.path for c in cases}),
                        "invariants": sorted({c.invariant for c in cases if c.invariant}),
                        "case_files": [c.case_file for c in cases],
                        "still_fails_on_own_release": per_release.get(found_on) == STILL_FAILS,
                        "replays": per_release, "first_pass": first,
                        "still_failing_later": [r for r in later if per_release.get(r) == STILL_FAILS]})
        return out


def _combined(verdicts: list) -> str:
    """One verdict for a family's case files on one release: the same verdict for all, else each with its count."""
    distinct = sorted(set(verdicts))
    if len(distinct) == 1:
        return distinct[0]
    return "; ".join(f"{v} ({verdicts.count(v)} of {len(verdicts)})" for v in distinct)


def fix_sentence(entry: dict) -> str:
    """``family (found on V): STILL FAILS on V; passes first on W`` (or: fails on every later release gated)."""
    own = entry["replays"].get(entry["found_on"], "not replayed")
    later = [r for r in entry["replays"] if r != entry["found_on"]]
    if entry["first_pass"]:
        tail = f"first passes on {entry['first_pass']}"
    elif later:
        tail = "passes on no later release gated (" + ", ".join(f"{r}: {entry['replays'][r]}" for r in later) + ")"
    else:
        tail = "no later release gated"
    if entry.get("not_replayed"):  # a merged shard report: later releases another shard gated
        tail += f" (not replayed on {', '.join(entry['not_replayed'])}: gated by another shard)"
    return f"{entry['family']} [{', '.join(entry['paths'])}] (found on {entry['found_on']}): {own} there; {tail}"


def fixes_table(entries: list) -> str:
    """The fix releases as plain lines (stdout, after the matrix table)."""
    if not entries:
        return "fix releases: no failing row"
    return "\n".join(["fix releases (each failing row's case files replayed on every later release):"]
                     + [f"  {fix_sentence(e)}" for e in entries])


def fixes_markdown(entries: list) -> str:
    """The fix releases as a Markdown table (docs)."""
    out = ["| found on | family | path | invariants | own release | first release where it passes | "
           "later releases |", "|---|---|---|---|---|---|---|"]
    for e in entries:
        later = "; ".join(f"{r}: {v}" for r, v in e["replays"].items() if r != e["found_on"]) or "-"
        out.append(f"| {e['found_on']} | {e['family']} | {', '.join(e['paths'])} | "
                   f"{', '.join(e['invariants']) or '-'} | {e['replays'].get(e['found_on'], '-')} | "
                   f"{e['first_pass'] or 'none'} | {later} |")
    return "\n".join(out)


def across_shards(entries: list, releases: list) -> dict:
    """For the fix entries of a merged sharded matrix (:func:`fa3verify.report_merge.merge_fixes`): per entry index,
    the releases another shard gated that decide its fix release, in release order: those after the family's last
    STILL FAILS before its first replayed pass, up to that pass (or to the last release when none passes). The
    releases before that last failure stay unreplayed and are named so (``unreplayed_before_first_pass``)."""
    order = {r: i for i, r in enumerate(releases)}
    out = {}
    for i, e in enumerate(entries):
        first = e.get("first_pass")
        limit = order.get(first, len(order)) if first else len(order)
        fails = [order[r] for r, v in e["replays"].items() if v == STILL_FAILS and r in order and order[r] < limit]
        low = max(fails, default=order.get(e["found_on"], -1))
        todo = sorted((r for r in e.get("not_replayed", []) if r in order and low < order[r] < limit), key=order.get)
        if todo:
            out[i] = todo
    return out


def replay_across_shards(entries: list, releases: list, open_sut, say=lambda line: None) -> int:
    """Completes the fix releases of a merged sharded matrix in place: each entry's case files replayed on the
    releases :func:`across_shards` names, each release opened once (in release order) for every case file due
    there, so each entry's ``first_pass`` is the first release of the campaign after its last failure where every
    case file PASSES NOW, as the unsplit run would name it. ``open_sut(release)`` opens a release's engine; one that
    cannot open gives NOT RUN, never a pass. Returns the number of case replays run."""
    from spec.process.worker_client import WorkerError

    from .errors import UsageError

    order = {r: i for i, r in enumerate(releases)}
    pending = across_shards(entries, releases)
    due: dict = {}
    for i, todo in pending.items():
        for release in todo:
            due.setdefault(release, set()).update(entries[i]["case_files"])
    verdicts: dict = {}
    for release in sorted(due, key=order.get):
        files = sorted(due[release])
        say(f"{release}: replaying {len(files)} case files of families found in other shards ...")
        try:
            sut = open_sut(release)
            with sut:
                verdicts[release] = {f: replay_on_release(f, sut) for f in files}
        except (UsageError, WorkerError, ValueError) as exc:
            why = " ".join(str(exc).split())[:160]
            verdicts[release] = {f: f"NOT RUN ({why})" for f in files}
    for i, todo in pending.items():
        e = entries[i]
        for release in todo:
            e["replays"][release] = _combined([verdicts[release][f] for f in e["case_files"]])
        e["replays"] = dict(sorted(e["replays"].items(), key=lambda kv: order.get(kv[0], len(order))))
        e["not_replayed"] = [r for r in e["not_replayed"] if r not in todo]
        e["still_failing_later"] = sorted(set(e.get("still_failing_later", []))
                                          | {r for r in todo if e["replays"][r] == STILL_FAILS},
                                          key=lambda r: order.get(r, len(order)))
        first = next((r for r in todo if e["replays"][r] == PASSES_NOW), None)
        if first is not None:
            e["first_pass"] = first
    for e in entries:
        e.pop("unreplayed_before_first_pass", None)
        e.update(unreplayed_before_first_pass(e["not_replayed"], e.get("first_pass"), order))
    return sum(len(v) for v in verdicts.values())


def unreplayed_before_first_pass(not_replayed: list, first_pass, order: dict) -> dict:
    """``{"unreplayed_before_first_pass": [...]}``: the releases an entry was not replayed on that come before its
    first pass (so an earlier fix cannot be ruled out), or {} when there are none or nothing passes."""
    before = [r for r in not_replayed if first_pass and order.get(r, len(order)) < order.get(first_pass, len(order))]
    return {"unreplayed_before_first_pass": before} if before else {}
