"""What the sanitizer writes: a JSON-lines log, one pair file per distinct mismatch, and a replayable case.

Invariant: nothing the sanitizer writes overwrites or deletes a user file (new names get a numeric suffix;
an identical pair or case file already there is kept), and everything is written into the one folder the
user chose (``FA3VERIFY_SANITIZE_DIR``, ``--fa3verify-sanitize-dir`` or ``install(out_dir=...)``).

* log ``sanitize-<pid>.jsonl`` (schema ``fa3verify.sanitize/1``): a ``start`` line, one ``violation`` line per
  event (the first :data:`MAX_LOG_VIOLATIONS`, then only new signatures), a ``summary`` line at uninstall.
  ``fa3verify report LOG.jsonl --html`` renders it.
* pair file ``pair-<invariant>-<hash>.json`` (schema ``fa3verify.sanitize-pair/1``): both sides' records, the
  violations and the pair summary; ``fa3verify sanitize replay PAIR.json`` re-runs the checks on it.
* case file (``spec.model.cases`` schema ``fa3verify.case/1``) when the pair is a head-count mismatch of a paged
  decode with known lengths -- the PR #30439 shape: model heads = the call's, ``tp_size`` = the factor the
  precompute divided them by, ``attn_cp_size = tp_size`` (so the layer keeps every head), guard "none"
  (as the modelled backend precomputes), one decode batch with the recorded lengths, eager or (the call's KV extent wider than
  the longest sequence, :func:`case_width`) a CUDA-graph replay over that context. ``fa3verify replay CASE``
  reruns it. Other mismatches (batch size, ``num_splits``, a KV extent neither path gives) have no case form:
  the backend model passes one batch, one ``num_splits`` and its own page-table width to both sides, and a case
  carries no seeded defect that would change that (docs/sanitize.md); their pair file replays them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from pathlib import Path
from typing import Optional

from spec.finding import Outcome, Verdict
from gpu_impl.fa3_calls import ARGUMENTS_INVARIANT, CallRecord, PrecomputeRecord, pair_summary

LOG_SCHEMA = "fa3verify.sanitize/1"
PAIR_SCHEMA = "fa3verify.sanitize-pair/1"
MAX_LOG_VIOLATIONS = 10000

__all__ = ["LOG_SCHEMA", "PAIR_SCHEMA", "SanitizeLog", "write_pair", "write_case", "case_for_pair", "load_pair",
           "new_path"]


def new_path(directory: Path, stem: str, suffix: str) -> Path:
    """``directory/stem{suffix}``, or ``stem-1``, ``stem-2``... when that name is taken (never overwrites)."""
    path = directory / f"{stem}{suffix}"
    n = 0
    while path.exists():
        n += 1
        path = directory / f"{stem}-{n}{suffix}"
    return path


def _event_dict(pre: Optional[PrecomputeRecord], call: CallRecord, violations) -> dict:
    return {"precompute": None if pre is None else pre.to_dict(), "call": call.to_dict(),
            "violations": [v.to_dict() for v in violations], "summary": pair_summary(pre, call)}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def write_pair(directory, pre, call, violations) -> Path:
    """Write the pair file for one mismatch (kept as is when the same pair was written before)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    body = {"schema": PAIR_SCHEMA, **_event_dict(pre, call, violations)}
    inv = violations[0].invariant.lower() if violations else "pass"
    path = d / f"pair-{inv}-{_digest(body)}.json"
    text = json.dumps(body, indent=2) + "\n"
    if path.exists():
        if path.read_text() == text:
            return path
        path = new_path(d, path.stem, ".json")
    path.write_text(text)
    return path


def load_pair(path) -> tuple:
    """``(PrecomputeRecord | None, CallRecord, recorded violations as dicts)`` from a pair file; ValueError names the problem."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(data, dict) or data.get("schema") != PAIR_SCHEMA:
        raise ValueError(f"{path}: schema must be {PAIR_SCHEMA!r}, got {data.get('schema') if isinstance(data, dict) else type(data).__name__!r}")
    try:
        pre = None if data.get("precompute") is None else PrecomputeRecord.from_dict(data["precompute"])
        call = CallRecord.from_dict(data["call"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: precompute/call: {exc}") from None
    return pre, call, list(data.get("violations", []))


def run_layout() -> Optional[str]:
    """The layout of the sanitized run as far as this process can tell: ``"torch.distributed world N, rank R"``
    when a default process group is up, else None (unknown: a single process, or a group not started yet). How
    an engine splits that world into attention TP/CP/DP ranks is not visible to the sanitizer and not guessed."""
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return f"torch.distributed world {dist.get_world_size()}, rank {dist.get_rank()}"
    except Exception:  # a half-started group: the layout is unknown, never a crash in the user's process
        return None
    return None


def recorded_layout_text(case) -> Optional[str]:
    """For a case the sanitizer wrote (``expected.detail.run_layout`` present): what the run's layout was -- or
    that none was recorded -- next to the layout the model replays it with, which only reproduces the head
    counts. None for any other case (its configuration is the run's own)."""
    from fa3verify.finding_terms import config_label_of_case

    detail = (case.expected or {}).get("detail") or {}
    if "run_layout" not in detail:
        return None
    layout = detail.get("run_layout") or "none recorded"
    return (f"run layout: {layout} (the case replays the run's head counts as "
            f"{config_label_of_case(case) or 'the model'}, a layout the run did not have)")


def case_for_pair(pre: Optional[PrecomputeRecord], call: CallRecord, violations, layout: Optional[str] = None):
    """A ``spec.model.cases.Case`` reproducing a head-count mismatch of a paged decode, or None when the pair is not one.

    ``layout``: the run's own layout (:func:`run_layout`; None: unknown), kept in ``expected.detail.run_layout``
    so that a replay says which layout the run had rather than the model's stand-in (``tp = attn_cp``)."""
    from spec.model.cases import Case, CaseFormatError

    violations = [v for v in violations if v.invariant != ARGUMENTS_INVARIANT]   # the cause alone: its pair file
    if pre is None or not violations or pre.cache_seqlens is None or call.page_size is None:
        return None
    if call.seqlen_q != 1 or pre.max_seqlen_q != 1 or pre.batch_size != call.batch_size:
        return None
    if (pre.headdim, pre.headdim_v_resolved, pre.page_size, pre.num_splits, pre.causal) != \
            (call.headdim, call.headdim_v, call.page_size, call.num_splits, True) or not call.causal:
        return None
    H, Hk = call.num_heads, call.num_heads_k
    if pre.num_heads >= H or H % pre.num_heads:
        return None
    tp = H // pre.num_heads
    if max(1, Hk // tp) != pre.num_heads_k:
        return None
    graph = case_width(pre, call)
    if graph is None:
        return None
    dtype = {"float8_e4m3fn": "float8_e4m3"}.get(call.dtype, call.dtype)
    first = violations[0]
    try:
        return Case.from_parts(
            source="manual",
            server={"tp_size": tp, "attn_cp_size": tp, "enable_prefill_cp": True, "cp_strategy": "zigzag",
                    "page_size": call.page_size, "num_splits": call.num_splits, "num_sm": call.num_sm,
                    "context_length": call.seqlen_k if graph else max(max(pre.cache_seqlens), 1),
                    "cuda_graph": graph},
            model={"name": "sanitized-run", "num_heads": H, "num_kv_heads": Hk, "head_dim": call.headdim,
                   "head_dim_v": call.headdim_v, "dtype": dtype},
            policy={"guard": "none", "metadata_heads": "tp", "clear_stale_cp_metadata": True},
            batches=[{"mode": "decode", "seq_lens": list(pre.cache_seqlens), "extend_lens": None}],
            expected={"outcome": Outcome.VIOLATION, "invariant": first.invariant,
                      "detail": {"S_p": pair_summary(pre, call)["s_p"], "S_c": pair_summary(pre, call)["s_c"],
                                 "message": first.message, "pair": _event_dict(pre, call, violations),
                                 "run_layout": layout}},
            notes="written by fa3verify.sanitize: a call was given scheduler metadata precomputed with "
                  f"heads ({pre.num_heads}, {pre.num_heads_k}) while the layer has ({H}, {Hk}); this case "
                  "replays that decode batch through the backend model with the same head-count mismatch "
                  f"(server tp_size = attn_cp_size = {tp} only reproduces those head counts; the run's layout: "
                  f"{layout or 'none recorded'})")
    except CaseFormatError:
        return None


def case_width(pre: PrecomputeRecord, call: CallRecord) -> Optional[bool]:
    """How the backend model plays the call's KV extent (``seqlen_k``: page-table width x page size), or None
    when it cannot: False (eager) when it is the longest sequence rounded up to a page -- the eager page table;
    True (CUDA graph) when it is wider and the batch is a captured graph size -- the graph's page table spans the
    whole context, so the case's ``context_length`` is that width (``gpu_impl.backend``: eager
    ``ceil(max / page) * page``, graph ``ceil(context_length / page) * page``)."""
    from gpu_impl.backend import CUDA_GRAPH_BATCH_SIZES

    page = call.page_size
    eager = -(-max(max(pre.cache_seqlens), 1) // page) * page
    if call.seqlen_k == eager:
        return False
    if call.seqlen_k > eager and call.seqlen_k % page == 0 and call.batch_size in CUDA_GRAPH_BATCH_SIZES:
        return True
    return None


def write_case(directory, pre, call, violations, layout: Optional[str] = None) -> Optional[Path]:
    """Save the replayable case for this pair into ``directory/cases`` (None when the pair has no case form)."""
    case = case_for_pair(pre, call, violations, layout=layout)
    if case is None:
        return None
    return case.save(Path(directory) / "cases")


class SanitizeLog:
    """The JSON-lines log of one process; created on the first line written."""

    def __init__(self, directory, mode: str):
        self.directory = Path(directory)
        self.mode = mode
        self.path: Optional[Path] = None
        self.violation_lines = 0
        self.signatures: dict = {}

    def _write(self, record: dict) -> None:
        if self.path is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.path = new_path(self.directory, f"sanitize-{os.getpid()}", ".jsonl")
            with open(self.path, "x") as fh:
                fh.write(json.dumps({"schema": LOG_SCHEMA, "type": "start", "pid": os.getpid(), "mode": self.mode,
                                     "time": time.time()}) + "\n")
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record, default=str) + "\n")

    def violation(self, signature, pre, call, violations, pair_path=None, case_path=None, where="call",
                  path=None) -> None:
        key = _digest(repr(signature))
        seen = self.signatures.get(key)
        self.signatures[key] = (seen or 0) + 1
        if seen is not None and self.violation_lines >= MAX_LOG_VIOLATIONS:
            return
        self.violation_lines += 1
        self._write({"schema": LOG_SCHEMA, "type": "violation", "signature": key, "where": where,
                     **({"path": path} if path else {}),
                     "pair_file": None if pair_path is None else str(pair_path),
                     "case_file": None if case_path is None else str(case_path), **_event_dict(pre, call, violations)})

    def summary(self, stats: dict, force: bool = False) -> None:
        if self.path is None and not force and not self.signatures:
            return
        self._write({"schema": LOG_SCHEMA, "type": "summary", "signatures": dict(self.signatures), **stats})


def is_log(path) -> bool:
    """Whether ``path`` is a sanitizer JSON-lines log (its first line names schema fa3verify.sanitize/1)."""
    try:
        with open(path, encoding="utf-8") as fh:
            first = fh.readline()
        return json.loads(first).get("schema") == LOG_SCHEMA
    except (OSError, ValueError, AttributeError, UnicodeDecodeError, RecursionError):
        return False


def log_to_run_summary(path) -> dict:
    """A sanitizer log as a run summary (schema fa3verify.run/1) for ``fa3verify report``: one check per distinct
    mismatch signature, one finding per signature with its case or pair file and replay command."""
    from ..finding_terms import apply_terms, replay_line
    from ..invocation import command_words
    from ..finding_terms import sanitizer_terms
    from ..summary import Check, Finding, RunSummary

    lines = []
    with open(path, encoding="utf-8") as fh:
        for n, text in enumerate(fh, 1):
            if not text.strip():
                continue
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {n} is not valid JSON ({exc.msg})") from None
    summaries = [x for x in lines if x.get("type") == "summary"]
    stats = summaries[-1] if summaries else {}
    start = next((x for x in lines if x.get("type") == "start"), {})
    run = RunSummary(command="sanitize", policy={"mode": start.get("mode"), "deep": stats.get("deep"),
                                                 "wrapped": stats.get("wrapped", []),
                                                 "not_checked": stats.get("unreachable", [])})
    first = {}
    for x in lines:
        if x.get("type") == "violation":
            first.setdefault(x["signature"], x)
    counts = stats.get("signatures", {})
    for sig, x in first.items():
        v = x["violations"][0]
        case, pair = x.get("case_file"), x.get("pair_file")
        s = x.get("summary", {})
        msg = (f"{v['message']} (S_p={s.get('s_p')}, S_c={s.get('s_c')}; precompute {s.get('precompute')}; "
               f"call {s.get('call')}; seen {counts.get(sig, 1)} time(s))")
        run.checks.append(Check(name=f"{v['invariant']} {sig}", kind="property", verdict=Verdict.FAIL, seconds=0.0,
                                failed=True, case_file=case or pair, message=msg))
        replay = (replay_line(case) if case
                  else shlex.join([*command_words(), "sanitize", "replay", str(pair)]) if pair else None)
        run.findings.append(apply_terms(Finding(invariant=v["invariant"], case_file=case or pair, engine="sanitize",
                                                message=v["message"], replay=replay),
                                        sanitizer_terms(x, start.get("mode")), keep_message=True))
    run.cases = int(stats.get("checked_calls", 0)) + int(stats.get("graph_checks", 0))
    run.failures = sum(counts.values()) if counts else len(first)
    if not first:
        run.checks.append(Check(name="metadata reuse", kind="property", verdict=Verdict.PASS, seconds=0.0,
                                message=f"{run.cases} checked FA3 calls, no mismatch"))
    return run.to_dict()
