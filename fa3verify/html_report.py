"""One-page, self-contained HTML rendering of a run summary (JSON schema fa3verify.run/1, see summary.py).

The page has a verdict banner, the counts and timings, the checks table and the findings with their
replay commands. It uses no scripts and no external resources (inline CSS only), and every value taken
from the JSON is HTML-escaped.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from typing import Any, Optional

from spec.finding import Verdict

from . import __version__
from .errors import UsageError
from .summary import SCHEMA, finding_lines, verdict_label

VERDICTS = tuple(Verdict)
_COLOURS = {Verdict.PASS: ("#1b7f3b", "#e8f5ec"), Verdict.FAIL: ("#b3261e", "#fdecea"),
            Verdict.INCONCLUSIVE: ("#8a6d00", "#fff8e1"), Verdict.USAGE_ERROR: ("#6b3fa0", "#f3ecfb")}

#: Keys of a run summary and the JSON types each may hold (None allowed where listed).
_TOP_LEVEL = {
    "verdict": (str,), "command": (str,), "exit_code": (int,), "cases": (int,), "failures": (int,),
    "elapsed_s": (int, float), "cases_per_s": (int, float), "first_failure_s": (int, float, type(None)),
    "seed": (int, type(None)), "policy": (dict,), "checks": (list,), "findings": (list,),
}
_CHECK = {"name": (str,), "kind": (str,), "verdict": (str,), "seconds": (int, float), "failed": (bool,),
          "inconclusive": (bool,), "case_file": (str, type(None)), "message": (str,), "expected": (str,)}
_FINDING = {"invariant": (str,), "case_file": (str, type(None)), "engine": (str,), "message": (str,),
            "replay": (str, type(None)), "check": (str,), "ran_on": (str,), "config": (str,), "path": (str,),
            "differs": (dict,), "seq_lens": (list, type(None)), "s_p": (int, type(None)), "s_c": (int, type(None)),
            "guard": (str,), "hint": (str,), "config_terms": (list,), "source": (dict,)}


def _type_names(types) -> str:
    names = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array",
             type(None): "null"}
    return " or ".join(names[t] for t in types)


def _check_fields(obj: Any, spec: dict, where: str, required: tuple) -> None:
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key in required:
        if key not in obj:
            raise UsageError(f"{where}: missing required key {key!r}")
    for key, types in spec.items():
        if key in obj:
            value = obj[key]
            ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
            if not ok:
                raise UsageError(f"{where}.{key}: expected {_type_names(types)}, got {json.dumps(value)[:60]}")


def validate_summary(data: Any, source: str = "run.json") -> dict:
    """Check a decoded run summary has the fa3verify.run/1 shape; UsageError names the first problem."""
    _check_fields(data, _TOP_LEVEL, source, required=("verdict",))
    schema = data.get("schema")
    if schema is not None and schema != SCHEMA:
        raise UsageError(f"{source}.schema: expected {SCHEMA!r}, got {schema!r}")
    if data["verdict"] not in VERDICTS:
        raise UsageError(f"{source}.verdict: must be one of {', '.join(VERDICTS)}, got {data['verdict']!r}")
    for i, check in enumerate(data.get("checks", [])):
        _check_fields(check, _CHECK, f"{source}.checks[{i}]", required=("name", "verdict"))
    for i, finding in enumerate(data.get("findings", [])):
        _check_fields(finding, _FINDING, f"{source}.findings[{i}]", required=("invariant",))
    for key in ("elapsed_s", "cases_per_s", "first_failure_s"):
        value = data.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{source}.{key}: must be a finite number, got {value}")
    return data


def load_summary(path: str) -> dict:
    """Read and validate a run summary file; every problem is a UsageError naming the file and the key."""
    from .outputs import read_json

    data = read_json(path, "RUN.json")
    return validate_summary(data, path)


def _e(value: Any) -> str:
    """HTML-escape any value (quotes included)."""
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: Any, digits: int = 2, unit: str = "") -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float):
        return _e(f"{value:.{digits}f}{unit}")
    return _e(f"{value}{unit}")


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1100px;margin:0 auto;padding:20px}
.banner{border-radius:8px;padding:16px 20px;margin-bottom:16px;border:2px solid}
.banner h1{margin:0;font-size:26px;letter-spacing:.5px}
.banner p{margin:4px 0 0}
h2{font-size:17px;margin:22px 0 8px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{border:1px solid #ddd;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.tag{display:inline-block;border-radius:4px;padding:0 6px;font-weight:600;font-size:12px}
.tag.bad{background:#fdecea;color:#b3261e}.tag.ok{background:#e8f5ec;color:#1b7f3b}
.tag.unk{background:#fff8e1;color:#8a6d00}
code,pre{font:12.5px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f4f4f4;border:1px solid #e0e0e0;padding:6px 8px;margin:4px 0;white-space:pre-wrap;word-break:break-all}
.finding{background:#fff;border:1px solid #ddd;border-left:4px solid #b3261e;border-radius:4px;padding:8px 12px;margin:8px 0}
.muted{color:#666}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0}
dl.kv dt{font-weight:600}dl.kv dd{margin:0}
footer{margin-top:24px;color:#888;font-size:12px}
"""


def _tag(check: dict) -> str:
    verdict = verdict_label(check)
    cls = "bad" if check.get("failed") else ("unk" if check.get("inconclusive") else "ok")
    return f'<span class="tag {cls}">{_e(verdict)}</span>'


def render_html(data: dict, source: Optional[str] = None) -> str:
    """The report page for a validated run summary, as one HTML string."""
    verdict = data["verdict"]
    fg, bg = _COLOURS[verdict]
    checks = data.get("checks", [])
    findings = data.get("findings", [])
    policy = data.get("policy") or {}
    command = data.get("command", "run")
    failed = sum(1 for c in checks if c.get("failed"))
    inconclusive = sum(1 for c in checks if c.get("inconclusive") and not c.get("failed"))
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>fa3verify {_e(command)}: {_e(verdict.upper())}</title>", f"<style>{_CSS}</style></head>",
           "<body><main>"]
    out.append(f'<section class="banner" id="verdict" style="border-color:{fg};background:{bg};color:{fg}">'
               f"<h1>{_e(verdict.upper())}</h1>"
               f"<p>fa3verify {_e(command)} &middot; exit code {_num(data.get('exit_code'))} &middot; "
               f"{len(checks)} checks, {failed} failed, {inconclusive} inconclusive &middot; "
               f"{len(findings)} findings</p></section>")

    out.append("<h2>Run</h2><dl class=\"kv\">")
    rows = [("command", _e(command)),
            ("policy", ", ".join(f"{_e(k)}={_e(v)}" for k, v in policy.items()) or "&ndash;"),
            ("seed", _num(data.get("seed"))),
            ("fuzz cases", _num(data.get("cases"))),
            ("failing cases", _num(data.get("failures"))),
            ("elapsed", _num(data.get("elapsed_s"), 2, " s")),
            ("cases per second", _num(data.get("cases_per_s"), 1)),
            ("first failure after", _num(data.get("first_failure_s"), 2, " s")),
            ("source", _e(source) if source else "&ndash;")]
    out += [f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows]
    out.append("</dl>")

    out.append(f"<h2>Checks ({len(checks)})</h2>")
    if checks:
        out.append("<table><thead><tr><th>check</th><th>kind</th><th>verdict</th><th>seconds</th>"
                   "<th>case file / message</th></tr></thead><tbody>")
        for c in checks:
            note = ""
            if c.get("case_file"):
                note += f"<code>{_e(c['case_file'])}</code><br>"
            note += _e(c.get("message", ""))
            out.append(f"<tr><td>{_e(c.get('name'))}</td><td>{_e(c.get('kind', ''))}</td><td>{_tag(c)}</td>"
                       f"<td class=\"num\">{_num(c.get('seconds'))}</td><td>{note}</td></tr>")
        out.append("</tbody></table>")
    else:
        out.append('<p class="muted">No checks were recorded.</p>')

    out.append(f"<h2>Findings ({len(findings)})</h2>")
    if not findings:
        out.append('<p class="muted">No findings.</p>')
    for f in findings:  # the lines every surface prints (fa3verify.summary.finding_lines)
        first, *rest = finding_lines(f)
        out.append(f'<div class="finding"><strong>{_e(first)}</strong>')
        for line in rest:
            label, _, text = line.strip().partition(": ")
            if label == "replay":
                out.append(f"<div>replay:</div><pre>{_e(text)}</pre>")
            else:
                out.append(f"<div>{_e(label)}: {_e(text)}</div>")
        if f.get("case_file") and f.get("replay"):
            out.append(f"<div>case file: <code>{_e(f['case_file'])}</code></div>")
        out.append("</div>")

    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out.append(f"<footer>fa3-verify {_e(__version__)} &middot; schema {_e(data.get('schema', SCHEMA))} "
               f"&middot; rendered {_e(stamp)}</footer></main></body></html>")
    return "\n".join(out) + "\n"


def write_html(data: dict, path: str, source: Optional[str] = None) -> str:
    """Render and write the page; returns the path."""
    from .summary import write_atomic

    write_atomic(path, render_html(data, source), "--html")
    return path
