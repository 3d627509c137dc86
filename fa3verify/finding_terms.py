"""Findings in a backend engineer's terms, read from one run of the case file that is saved.

Invariant: every term a finding carries -- the configuration (``spec.model.domain.Config.label``), the path (eager, or
a CUDA graph's capture or replay), the FA3 arguments that differ between ``get_scheduler_metadata`` and the call,
S_p and S_c, the guard's decision, the evidence message and the fix hint -- comes from running the saved case
once on the system under test that found it, so a finding and the replay of its case file show the same numbers.
The argument pairs are the normalised events of ``gpu_impl.fa3_calls.pair_summary`` (real engines' traces) or
``gpu_impl.model_pairs.model_pairs`` (the model's), what the backend's attention code passes to FA3.

The hints are data (``finding_hints.json``); :func:`replay_line` is the one place a replay command is written.

Backend terms of findings observed outside one scenario run of the harness: a sanitizer log's recorded pair
and a run-ranks verdict.

Invariant: such a finding carries the same terms as a fuzz, gate or replay finding (``fa3verify.finding_terms``:
configuration, path, the FA3 arguments that differ, S_p vs S_c, the guard's decision, a fix hint), each read from
data the finding has -- a sanitizer finding from the precompute/call pair it recorded (what the engine's
attention backend passed to FA3, normalised by ``gpu_impl.fa3_calls.pair_summary``) and, for the
configuration, its replayable case; a run-ranks finding from one run of its case file on the model, the scenario
every rank ran -- and a term the data does not give is left empty, never guessed.
"""

from __future__ import annotations

import json
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Optional

from .errors import UsageError
from .invocation import command_words
from .judge import judge
from .summary import finding_sentence


__all__ = ["TERM_FIELDS", "terms_from_run", "terms_of_finding", "run_terms", "case_file_terms", "apply_terms", "replay_line",
           "ran_on", "hint_for", "config_label", "configuration_terms", "WITNESS_SUBDIR", "differing_arguments",
           "sanitizer_terms", "run_ranks_terms", "print_backend_terms"]

#: Fields of :class:`fa3verify.summary.Finding` this module fills.
TERM_FIELDS = ("ran_on", "config", "config_terms", "path", "source", "differs", "seq_lens", "s_p", "s_c", "guard",
               "hint")

#: Where case files of rows whose refutation is expected go, under a run's case folder (informational).
WITNESS_SUBDIR = "witnesses"

#: (name in a finding, precompute key, call key) of the FA3 arguments compared; heads are one pair.
_ARGS = (("batch_size", "batch_size", "batch_size"), ("seqlen_k", "max_seqlen_k", "seqlen_k"),
         ("num_splits", "num_splits", "num_splits"), ("page_size", "page_size", "page_size"),
         ("causal", "causal", "causal"), ("window_size", "window_size", "window_size"),
         ("headdim", "headdim", "headdim"), ("headdim_v", "headdim_v", "headdim_v"))

#: The model's decode paths named as a real engine's trace names them (``gpu_impl.model_pairs``).
_PATHS = {"cuda_graph": "replay"}


@lru_cache(maxsize=1)
@lru_cache(maxsize=1)
def finding_hints() -> dict:
    """finding_hints.json, read once per process (callers only read it)."""
    return json.loads((Path(__file__).with_name("finding_hints.json")).read_text(encoding="utf-8"))


def hint_for(invariant: str, differs: Optional[dict] = None, server=None, model=None,
             guard_kept: Optional[str] = None) -> str:
    """The one-line fix hint: by the first differing argument (for metadata invariants), else by invariant. With
    the witness's ``server`` and ``model``, a head-count hint is made for that configuration and the guard that
    kept the precompute (``guard_kept``; :func:`fa3verify.config_terms.heads_hint`)."""
    from spec.invariants import INVARIANTS

    hints = finding_hints()
    if invariant in INVARIANTS or invariant in ("NO_NAN", "MATCHES_ORACLE"):
        for name, text in hints["arguments"]:
            if name in (differs or {}):
                if name == "heads" and server is not None and model is not None:
                    from .config_terms import heads_hint

                    try:
                        return heads_hint(server, model, guard_kept)
                    except Exception:  # a configuration the hint cannot read: the general words
                        return text
                return text
    return hints["invariants"].get(invariant, hints["default"])


def config_label(server, model) -> str:
    """model/tp/dp/cp/SM count/split policy of a configuration (``spec.model.domain.Config.label``), or ''."""
    from spec.model.domain import Config

    try:
        return Config(server=server, model=model).label()
    except Exception:  # a configuration the label cannot read (an engine's own shape): no label, never a crash
        return ""


def configuration_terms(server, model) -> dict:
    """``{"config": label, "config_terms": [[token, meaning], ...]}`` of a configuration (both empty when it is not
    a configuration of the model's shape): the one place a finding's configuration is written."""
    from .config_terms import config_terms

    return {"config": config_label(server, model), "config_terms": config_terms(server, model)}


def ran_on(spec, scenario=None) -> str:
    """Which system under test ran: ``ENGINE==V``, or ``the model (guard 'pre-fix', heads tp)``."""
    return _spec(spec).plugin.ran_on(_spec(spec), scenario)


def replay_line(case_file: Optional[str], guard: Optional[str] = None, engine=None) -> Optional[str]:
    """The replay command of a case file, with what it needs to run as typed: ``--guard`` when the case names a
    guard that is the user's code (a case file cannot make the tool run it, ``fa3verify.trust``), ``--engine`` when
    it was found on code replay runs only when the command line names it (a checkout, a ``sut=MODULE:CLASS``)."""
    from spec.model.guards import is_builtin_guard

    if not case_file:
        return None

    parts = [*command_words(), "replay", str(case_file)]  # as typed: the script the user ran, or `fa3verify`
    if guard and not is_builtin_guard(guard):
        parts += ["--guard", guard]
    if engine is not None and getattr(engine, "plugin", None) is not None and engine.plugin.named_only(engine):
        parts += ["--engine", str(engine)]
    return shlex.join(parts)


def _pairs(scenario, result, spec) -> list:
    return _spec(spec).plugin.pairs(scenario, result)


def _pair_for(pairs: list, finding) -> Optional[dict]:
    path = _PATHS.get(finding.detail.get("path"), finding.detail.get("path"))
    same = [p for p in pairs if p.get("step") == finding.step
            and (finding.dp_rank is None or p.get("dp_rank") in (None, finding.dp_rank))]
    for want in (lambda p: p.get("path") == path and p.get("precomputed"), lambda p: p.get("path") == path,
                 lambda p: p.get("precomputed"), lambda p: True):
        hits = [p for p in same if want(p)]
        if hits:
            return hits[-1]
    return None


def differing_arguments(pair: dict) -> dict:
    """The FA3 arguments that differ between a normalised pair's precompute and call
    (``gpu_impl.fa3_calls.pair_summary``): name -> [precompute's, call's]; {} without a precompute."""
    pre, call = pair.get("precompute"), pair.get("call") or {}
    if not pre:
        return {}
    out = {}
    heads_p, heads_c = [pre.get("num_heads"), pre.get("num_heads_k")], [call.get("num_heads"), call.get("num_heads_k")]
    if heads_p != heads_c:
        out["heads"] = [heads_p, heads_c]
    for name, pk, ck in _ARGS:
        if pk in pre and ck in call and pre[pk] != call[ck]:
            if name == "headdim_v" and pre[pk] is None:
                continue  # not passed: FA3 takes headdim
            out[name] = [pre[pk], call[ck]]
    return out


def _guard_who(scenario, spec) -> str:
    return _spec(spec).plugin.guard_words(_spec(spec), scenario)


def _spec(spec):
    """The spec a term is asked of: None is the model's (a run without a system under test)."""
    from gpu_impl.sut import EngineSpec

    return EngineSpec("model") if spec is None else spec


def _guard_decision(scenario, spec, pair: Optional[dict]) -> str:
    who = _guard_who(scenario, spec)
    if pair is None:
        return ""
    return f"{who} kept the precompute" if pair.get("precomputed") else f"{who} disabled the precompute"


def terms_from_run(scenario, result, invariant: Optional[str] = None, spec=None, signature: Optional[str] = None,
                   guard_raised: Optional[str] = None) -> dict:
    """The terms of one run of a case (``result``: its ScenarioResult; ``guard_raised``: the message when the
    guard raised instead): the first finding with ``signature`` (else ``invariant``, else the first), its
    configuration, path, differing arguments, S_p/S_c, guard decision, message and hint."""
    terms = {"ran_on": ran_on(spec, scenario), **configuration_terms(scenario.server, scenario.model)}
    if guard_raised is not None:
        return {**terms, "guard": f"the guard raised: {guard_raised}", "message": guard_raised,
                "hint": hint_for(invariant or "GUARD_RAISED")}
    found = list(getattr(result, "findings", None) or [])
    pick = next((f for f in found if signature and f.signature == signature), None) \
        or next((f for f in found if invariant and f.invariant == invariant), None) or (found[0] if found else None)
    if pick is None:
        return {**terms, "hint": hint_for(invariant or "")}
    return {**terms, **terms_of_finding(scenario, result, pick, spec)}


def terms_of_finding(scenario, result, pick, spec=None) -> dict:
    """The terms of one finding (a ``spec.violation.Violation`` of ``result``), without the configuration."""
    pair = _pair_for(_pairs(scenario, result, spec), pick) if pick.detail.get("mode") == "decode" else None
    differs = differing_arguments(pair) if pair else {}
    path = (pair or {}).get("path") or _PATHS.get(pick.detail.get("path"), pick.detail.get("path")) or ""
    if pick.detail.get("mode") in ("extend", "mixed"):
        path = f"eager {pick.detail['mode']}"
    s_p = pick.detail.get("s_p", (pair or {}).get("s_p"))
    s_c = pick.detail.get("s_c", (pair or {}).get("s_c"))
    lens = pick.detail.get("seq_lens")
    source = {k: v for k, v in ((pair or {}).get("source") or {}).items() if v}
    return {"path": path, "source": source, "differs": differs, "seq_lens": list(lens) if lens is not None else None,
            "s_p": s_p, "s_c": s_c, "guard": _guard_decision(scenario, spec, pair), "message": pick.message,
            "invariant": pick.invariant,
            "hint": hint_for(pick.invariant, differs, getattr(scenario, "server", None), getattr(scenario, "model", None),
                             _guard_who(scenario, spec) if (pair or {}).get("precomputed") else None)}


def run_terms(sut, scenario, kernel=None, numerics: bool = False, invariant: Optional[str] = None,
              signature: Optional[str] = None) -> Optional[dict]:
    """Run ``scenario`` once on ``sut`` (:func:`fa3verify.judge.judge`) and read its terms; None when it cannot
    run (the finding keeps what it has: a case the engine no longer runs is not a new failure)."""
    try:
        verdict = judge(sut, scenario, kernel=kernel, numerics=numerics)
    except Exception:
        return None
    if verdict.unsupported:
        return None
    return terms_of_verdict(scenario, verdict, invariant, getattr(sut, "spec", None), signature)


def terms_of_verdict(scenario, verdict, invariant: Optional[str] = None, spec=None,
                     signature: Optional[str] = None) -> dict:
    """The terms of a judged run (:class:`fa3verify.judge.Verdict`): a guard fault's, a fault's message, or
    :func:`terms_from_run` of the finished run."""
    if verdict.result is None and verdict.findings:
        fault = verdict.findings[0]
        if fault.invariant in ("GUARD_RAISED", "GUARD_TIMEOUT"):
            return terms_from_run(scenario, None, fault.invariant, spec, guard_raised=fault.message)
        return {"ran_on": ran_on(spec, scenario), **configuration_terms(scenario.server, scenario.model),
                "message": fault.message, "invariant": fault.invariant, "hint": hint_for(fault.invariant)}
    return terms_from_run(scenario, verdict.result, invariant, spec, signature)


def case_file_terms(path: str, guard: Optional[str] = None, invariant: Optional[str] = None) -> Optional[dict]:
    """The terms of a saved scenario case replayed on the model, under ``guard`` (the guard the user named on
    the command line; None: the case's own when it is this project's). None when the case is not a scenario the
    model runs (a case carrying an engine's own options, a kernel-level case, a sharded-KV witness)."""
    from gpu_impl.kernels import load
    from gpu_impl.engines.model.sut import ModelSUT

    from .commands.replay import load_case, scenario_from_case, unmodelled

    try:
        case = load_case(path)
        if case.options or unmodelled(case) or not case.batches:
            return {"config": config_label_of_case(case)} if case is not None else None
        scenario = scenario_from_case(case, guard_override=guard)
        kernel = load(case.kernel.get("name", "emulated"), mode=case.kernel.get("mode", "strict"))
    except (UsageError, ValueError, KeyError, TypeError):
        return None
    return run_terms(ModelSUT(), scenario, kernel=kernel, invariant=invariant)


def config_label_of_case(case) -> str:
    """The configuration label of a case file's server and model ('' when they are not of the model's shape)."""
    from spec.model.config import ModelConfig, ServerConfig

    try:
        return config_label(ServerConfig.from_dict(case.server), ModelConfig.from_dict(case.model))
    except Exception:
        return ""


def apply_terms(finding, terms: Optional[dict], keep_message: bool = False, note: str = ""):
    """The finding with ``terms`` filled in (and its message, with ``note`` after it, unless ``keep_message``):
    a new :class:`spec.finding.Finding` (findings are values), or ``finding`` itself when there are no terms."""
    if not terms:
        return finding
    report = {name: terms[name] for name in TERM_FIELDS if terms.get(name) is not None}
    if terms.get("message") and not keep_message:
        report["message"] = terms["message"] + (f" ({note})" if note else "")
    return finding.reported(**report)


def _guard(pair: dict) -> str:
    if pair.get("precomputed"):
        return "the engine's guard kept the precompute (the call was passed its scheduler_metadata)"
    return "the call was passed scheduler_metadata of no recorded precompute"


def sanitizer_terms(line: dict, mode: Optional[str] = None) -> dict:
    """The terms of one sanitizer log ``violation`` line (``fa3verify.sanitize.records``): the recorded pair's
    differing arguments, S_p/S_c, the call's cache lengths when read, the path (a log written before it was
    recorded: none), the guard's decision, the configuration of its case file (when one was written), a hint."""
    pair = line.get("summary") or {}
    violations = line.get("violations") or [{}]
    invariant = violations[0].get("invariant", "")
    differs = differing_arguments(pair) if pair.get("precompute") else {}
    lens = (line.get("call") or {}).get("cache_seqlens")
    terms = {"ran_on": "the sanitized process" + (f" (sanitizer mode {mode})" if mode else ""),
             "path": line.get("path") or "", "differs": differs, "seq_lens": list(lens) if lens else None,
             "s_p": pair.get("s_p"), "s_c": pair.get("s_c"), "guard": _guard(pair) if pair else "",
             "hint": hint_for(invariant, differs)}
    config = _case_config(line.get("case_file"))
    if config:
        terms["config"] = config
    return terms


def _case_config(path: Optional[str]) -> str:
    from .commands.replay import load_case

    if not path:
        return ""
    from .sanitize.records import recorded_layout_text

    try:
        case = load_case(path)
        return recorded_layout_text(case) or config_label_of_case(case)
    except (UsageError, ValueError, KeyError, TypeError, OSError):
        return ""


def run_ranks_terms(case_path: str, invariant: str, world: int, backend: str) -> dict:
    """The terms of a run-ranks finding: its case file run once on the model (the scenario every rank ran), the
    finding of the same invariant; and which system ran it ({world} processes over {backend})."""
    terms = dict(case_file_terms(case_path, invariant=invariant) or {})
    terms.pop("message", None)  # the evidence is the ranks' own message
    terms["ran_on"] = f"the model, one process per attention rank ({world} ranks, {backend})"
    terms.setdefault("hint", hint_for(invariant))
    return terms


def print_backend_terms(finding) -> None:
    """A finding's backend-terms sentence and fix hint as two indented lines (as ``replay`` prints them)."""
    sentence = finding_sentence(finding)
    if sentence:
        print(f"  in backend terms: {sentence}")
    if finding.hint:
        print(f"  fix: {finding.hint}")
