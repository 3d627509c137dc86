"""``fa3verify report merge``: the N shard reports of one campaign (``--shard K/N``) joined into one verdict.

Invariant: the merged report says what the unsplit run would have said about the same cases: it is built only
from the reports of every shard 1..N of one campaign (same command, seed, case count or budget, policy, engine,
same N: the ``shard.campaign`` object of :mod:`fa3verify.sharding`), each once; anything else is a UsageError
(exit 2) naming the report. Checks of the same name are joined (failed if any shard failed it, inconclusive if
any shard could not decide it, seconds summed), counts summed, findings kept from every shard, and the exit code
is that of the joined verdict (:func:`fa3verify.verdicts.run_exit_code`; for the engine matrix,
:func:`fa3verify.engine_matrix.matrix_exit_code`), never better than any shard's own.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

from spec.finding import MatrixVerdict

from . import exitcodes
from .errors import UsageError
from .summary import SCHEMA as RUN_SCHEMA
from .summary import Check, Finding, RunSummary
from .outputs import deliver, read_json, write_output

FIELD = "REPORT.json"


def _known(cls, data: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def load_shard_report(path: str) -> dict:
    """A shard report (a run summary or an engine matrix written with ``--shard K/N --json``); UsageError else."""
    from .engine_matrix import SCHEMA as MATRIX_SCHEMA

    data = read_json(path, FIELD)
    if not isinstance(data, dict) or data.get("schema") not in (RUN_SCHEMA, MATRIX_SCHEMA):
        raise UsageError(f"{FIELD}: {path}: expected a report of schema {RUN_SCHEMA} or {MATRIX_SCHEMA}")
    shard = data.get("shard")
    if not isinstance(shard, dict):
        raise UsageError(f"{FIELD}: {path}: not a shard report (no 'shard' object: write it with --shard K/N --json)")
    k, n = shard.get("k"), shard.get("n")
    if not (type(k) is int and type(n) is int and 1 <= k <= n) or not isinstance(shard.get("campaign"), dict):
        raise UsageError(f"{FIELD}: {path}: shard: expected k, n with 1 <= k <= n and a campaign object, got "
                         f"{json.dumps(shard)[:200]}")
    return data


def check_one_campaign(paths, reports) -> int:
    """N, after checking that the reports are shards 1..N of one campaign, each once."""
    first = reports[0]
    n = first["shard"]["n"]
    seen: dict = {}
    for path, r in zip(paths, reports):
        s = r["shard"]
        if r["schema"] != first["schema"]:
            raise UsageError(f"{FIELD}: {path} is a {r['schema']} report, {paths[0]} a {first['schema']} one")
        if s["n"] != n:
            raise UsageError(f"{FIELD}: {path} is shard {s['k']}/{s['n']}, {paths[0]} one of {n}: "
                             f"not the same split")
        if r.get("seed") != first.get("seed") or s["campaign"] != first["shard"]["campaign"]:
            diff = sorted(key for key in set(s["campaign"]) | set(first["shard"]["campaign"])
                          if s["campaign"].get(key) != first["shard"]["campaign"].get(key)) or ["seed"]
            raise UsageError(f"{FIELD}: {path} is a shard of another campaign than {paths[0]} "
                             f"(they differ in {', '.join(diff)})")
        if s["k"] in seen:
            raise UsageError(f"{FIELD}: {path} and {seen[s['k']]} are both shard {s['k']}/{n}")
        seen[s["k"]] = path
    missing = [k for k in range(1, n + 1) if k not in seen]
    if missing:
        raise UsageError(f"{FIELD}: shard(s) {', '.join(f'{k}/{n}' for k in missing)} missing: a merge needs all "
                         f"{n} shards of the campaign")
    return n


def join_checks(rows_by_shard) -> list:
    """Checks of the same (name, kind) across shards, joined (module invariant); first-seen order."""
    groups: dict = {}
    for k, rows in rows_by_shard:
        for row in rows:
            groups.setdefault((row.name, row.kind), []).append((k, row))
    out = []
    for (name, kind), rows in groups.items():
        failed = [r for _, r in rows if r.failed]
        undecided = [r for _, r in rows if r.inconclusive]
        pick = failed[0] if failed else (undecided[0] if undecided else rows[0][1])
        messages = {r.message for _, r in rows}
        message = rows[0][1].message if len(messages) == 1 else "; ".join(
            f"shard {k}: {r.message}" for k, r in rows)
        case_file = pick.case_file or next((r.case_file for _, r in rows if r.case_file), None)
        out.append(dataclasses.replace(pick, name=name, kind=kind, verdict=pick.verdict,
                                       seconds=sum(r.seconds for _, r in rows), failed=bool(failed),
                                       inconclusive=bool(undecided) and not failed, case_file=case_file,
                                       message=message))
    return out


def merge_run_reports(paths, reports) -> RunSummary:
    """The joined run summary of the shard reports of one fuzz or conform campaign (already checked)."""
    ordered = sorted(zip(paths, reports), key=lambda pr: pr[1]["shard"]["k"])
    first = ordered[0][1]
    merged = RunSummary(command=first.get("command", "fuzz"), seed=first.get("seed"),
                        policy=first.get("policy") or {})
    findings_seen = set()
    rows_by_shard = []
    for _path, r in ordered:
        k = r["shard"]["k"]
        try:
            checks = [Check(**_known(Check, c)) for c in r.get("checks", [])]
            findings = [Finding.from_report(f) for f in r.get("findings", [])]
        except TypeError as exc:
            raise UsageError(f"{FIELD}: {_path}: a check or finding lacks a field ({exc})") from None
        rows_by_shard.append((k, checks))
        for f in findings:
            key = json.dumps(f.report_dict(), sort_keys=True)
            if key not in findings_seen:
                findings_seen.add(key)
                merged.findings.append(f)
        merged.cases += int(r.get("cases") or 0)
        merged.failures += int(r.get("failures") or 0)
        merged.elapsed_s = max(merged.elapsed_s, float(r.get("elapsed_s") or 0.0))
        ff = r.get("first_failure_s")
        if isinstance(ff, (int, float)) and (merged.first_failure_s is None or ff < merged.first_failure_s):
            merged.first_failure_s = float(ff)
        merged.interrupted |= bool(r.get("interrupted"))
    merged.checks = join_checks(rows_by_shard)
    return merged


def merged_exit_code(own: int, reports) -> int:
    """The joined verdict's code, never better than a shard's own (a shard that failed or could not decide)."""
    codes = [r.get("exit_code") for r in reports]
    return exitcodes.combine([own, *[c for c in codes if c in exitcodes.NAMES]])


def merge_matrix_reports(paths, reports) -> list:
    """The engine-matrix rows of every shard, in release order (each release exactly once)."""
    from .engine_matrix import MatrixRow

    releases = reports[0]["shard"]["campaign"].get("releases") or []
    rows, where = {}, {}
    for path, r in zip(paths, reports):
        for row in r.get("rows", []):
            if not isinstance(row, dict) or "release" not in row:
                raise UsageError(f"{FIELD}: {path}: a row without a release")
            if row["release"] in rows:
                raise UsageError(f"{FIELD}: release {row['release']} is in {where[row['release']]} and {path}")
            try:
                rows[row["release"]] = MatrixRow(**_known(MatrixRow, row))
            except TypeError as exc:
                raise UsageError(f"{FIELD}: {path}: row {row['release']}: {exc}") from None
            where[row["release"]] = path
    missing = [r for r in releases if r not in rows]
    if missing:
        raise UsageError(f"{FIELD}: release(s) {', '.join(missing)} of the campaign are in no report")
    order = {r: i for i, r in enumerate(releases)}
    return sorted(rows.values(), key=lambda row: order.get(row.release, len(order)))


def merge_fixes(paths, reports) -> Optional[list]:
    """The fix-release entries of every shard (:mod:`fa3verify.matrix_fixes`), in the campaign's release order; None
    when no shard computed them (``--no-fixes``). A shard replays a failing row's case files only on its own later
    releases, so each entry says which later releases of the campaign were in another shard and never replayed
    (``not_replayed``); its ``first_pass`` stays the first replayed release where it passes, and an entry whose
    unreplayed releases come before that one says so. Shards that disagree on computing them are exit 2."""
    have = [("fixes" in r) for r in reports]
    if not any(have):
        return None
    if not all(have):
        without = next(p for p, h in zip(paths, have) if not h)
        raise UsageError(f"{FIELD}: {without} has no fix releases and other shards have them (one shard ran with "
                         f"--no-fixes): merge shards run the same way")
    from .matrix_fixes import unreplayed_before_first_pass

    releases = reports[0]["shard"]["campaign"].get("releases") or []
    order = {r: i for i, r in enumerate(releases)}
    entries = []
    for path, r in zip(paths, reports):
        fixes = r["fixes"]
        if not isinstance(fixes, list) or not all(isinstance(e, dict) and isinstance(e.get("found_on"), str)
                                                   and isinstance(e.get("replays"), dict) for e in fixes):
            raise UsageError(f"{FIELD}: {path}: fixes: expected a list of entries with found_on and replays")
        for e in fixes:
            found = e["found_on"]
            later = [x for x in releases[order[found] + 1:]] if found in order else []
            missing = [x for x in later if x not in e["replays"]]
            entries.append({**e, "not_replayed": missing,
                            **unreplayed_before_first_pass(missing, e.get("first_pass"), order)})
    return sorted(entries, key=lambda e: (order.get(e["found_on"], len(order)), str(e.get("family"))))


def matrix_as_summary(rows) -> RunSummary:
    """The matrix rows as run-summary checks (one per release), for JUnit."""
    summary = RunSummary(command="engine-matrix")
    for r in rows:
        summary.checks.append(Check(
            name=f"{r.engine} {r.release}", kind="engine-matrix", verdict=r.verdict, seconds=r.seconds,
            failed=r.verdict == MatrixVerdict.FAIL, inconclusive=r.verdict in (MatrixVerdict.INCONCLUSIVE,
                                                                               MatrixVerdict.UNAVAILABLE),
            case_file=r.case_files[0] if r.case_files else None,
            message=f"expected {r.expected}; {', '.join(r.invariants) or 'no violation'}"
                    + (f"; {r.message}" if r.message else "")))
        summary.cases += r.cases
    return summary


def merged_from(paths, reports) -> list:
    """Which report was which shard, for the merged report."""
    return [{"path": p, "k": r["shard"]["k"], "exit_code": r.get("exit_code"), "verdict": r.get("verdict")}
            for p, r in sorted(zip(paths, reports), key=lambda pr: pr[1]["shard"]["k"])]


def merge(paths, json_out: Optional[str] = None, junit_out: Optional[str] = None) -> int:
    """Merge the shard reports at ``paths``, print the joined table and verdict, write ``--json``/``--junit``;
    returns the joined exit code."""
    from .engine_matrix import SCHEMA as MATRIX_SCHEMA
    from .engine_matrix import matrix_exit_code, matrix_json, matrix_table, matrix_verdict_line
    from .summary import print_table, write_junit

    if not paths:
        raise UsageError(f"{FIELD}: give the shard reports to merge")
    reports = [load_shard_report(p) for p in paths]
    n = check_one_campaign(paths, reports)
    if reports[0]["schema"] == MATRIX_SCHEMA:
        rows = merge_matrix_reports(paths, reports)
        fixes = merge_fixes(paths, reports)
        code = merged_exit_code(matrix_exit_code(rows), reports)
        print(matrix_table(rows))
        if fixes is not None:
            from .matrix_fixes import fixes_table

            print(fixes_table(fixes))
        print(matrix_verdict_line(rows, code) + f" | merged from {n} shards")
        data = {**matrix_json(rows, fixes), "exit_code": code, "shards": n,
                "merged_from": merged_from(paths, reports)}
        return deliver(code, [("--json", json_out,
                               lambda: write_output(json_out, json.dumps(data, indent=2) + "\n", "--json")),
                              ("--junit", junit_out, lambda: write_junit(matrix_as_summary(rows), junit_out))],
                       "report merge")
    summary = merge_run_reports(paths, reports)
    own = summary.exit_code
    code = merged_exit_code(own, reports)
    print_table(summary)
    for f in summary.findings:
        print(f"  [{f.engine}] {f.invariant}: {f.message}" + (f"\n    replay: {f.replay}" if f.replay else ""))
    print(f"merged {n} shards: {summary.cases} cases, {summary.failures} failing, {len(summary.findings)} findings")
    if code != own:  # a shard's own verdict is worse than what its rows say: the merge never reads better
        print(f"verdict: {exitcodes.verdict_name(code).upper()} (a shard's own verdict; its rows alone read "
              f"{exitcodes.verdict_name(own)})")
    data = {**summary.to_dict(), "exit_code": code, "verdict": exitcodes.verdict_name(code), "shards": n,
            "merged_from": merged_from(paths, reports)}
    return deliver(code, [("--json", json_out,
                           lambda: write_output(json_out, json.dumps(data, indent=2) + "\n", "--json")),
                          ("--junit", junit_out, lambda: write_junit(summary, junit_out))], "report merge")
