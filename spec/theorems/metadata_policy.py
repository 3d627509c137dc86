"""Theorems 3 and 4 (the prefill-CP hazard, guard soundness, the root-cause alternative, sharded-KV
decode): one search over the configuration domain under a backend policy.

Invariant: a policy is reported SAFE only when every group of its configurations is proved by the decode encoding
of :mod:`spec.theorems.metadata`; every refutation is replayed concretely and written as a case file naming the
policy (sglang ``flashattention_backend.py``'s precompute guard and head counts).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

from spec.model import domain as D
from spec.model.cases import Case
from spec.theorems.results import TheoremResult
from spec.theorems.symbolic import Heuristic
from spec.theorems.metadata import Budget, concrete_decode, family_groups, group_configs, prove_groups, stage1_search
from spec.finding import Outcome, TheoremVerdict


def _write_case(cases_dir, theorem: str, cfg: D.Config, guard_label: str, metadata_heads: str, w: dict,
                ev, notes: str) -> Optional[str]:
    if cases_dir is None:
        return None
    server = cfg.server
    longest = max(int(x) for x in w["seq_lens"])
    if longest > server.context_length:
        server = dataclasses.replace(server, context_length=1 << (longest - 1).bit_length())
    if not w.get("eager", True):
        server = dataclasses.replace(server, cuda_graph=True, context_length=int(w["call_seqlen_k"]))
    if not _GUARD_SPEC_RE(guard_label):
        # an unnamed callable: "none" replays the same precompute (this config precomputes under the guard too)
        notes += f" [guard {guard_label!r} is not a loadable spec; the case uses guard 'none', which also precomputes]"
        guard_label = "none"
    policy = {"guard": guard_label, "metadata_heads": metadata_heads, "clear_stale_cp_metadata": True}
    if cfg.sharded_kv:
        policy["cp_decode_kv"] = "sharded"
    first = ev.violations[0]
    case = Case.from_parts(
        source=f"prove:{theorem}", server=server.to_dict(), model=cfg.model.to_dict(), policy=policy,
        batches=[{"mode": "decode", "seq_lens": [int(x) for x in w["seq_lens"]], "extend_lens": None}],
        kernel={"name": "emulated", "mode": "strict"}, seed=0,
        expected={"outcome": "violation", "invariant": first.invariant,
                  "detail": {"S_p": w.get("S_p"), "S_c": w.get("S_c"), "splits": w.get("splits"),
                             "call_seqlen_k": w.get("call_seqlen_k"), "message": first.message}},
        notes=notes)
    return str(case.save(cases_dir))


#: Stage-1 family queries the trigger summary of a refutation may ask beyond those already answered in its job: a
#: count, not a time, so the summary is the same on every machine, loaded or not, and in a worker process.
TRIGGER_QUERIES = 8


def _trigger_summary(groups: list, budget: Budget, metadata_heads: str, max_queries: int = TRIGGER_QUERIES) -> dict:
    """Which configurations can reach S_p > S_c (stage 1 sat), as flag patterns with counts (query-capped).

    Families already answered in this job (cached) cost nothing; at most `max_queries` more are asked, in family
    order; `complete` says whether every family was covered.
    """
    patterns: dict = {}
    examples: list = []
    families = family_groups(groups)
    asked = covered = 0
    for fam in families:
        fkey = ("family", tuple(g.key for g in fam), False)
        if fkey not in budget.cache:
            if asked >= max_queries:
                break
            budget.cache[fkey] = stage1_search(fam, budget)[0]
            asked += 1
        covered += 1
        if budget.cache[fkey] == "unsat":
            continue
        for g in fam:
            for cfg in g.configs:
                sv = cfg.server
                pat = (f"dp_attention={sv.enable_dp_attention}, prefill_cp={sv.enable_prefill_cp}, "
                       f"attn_cp>1={sv.attn_cp_size > 1}, sharded_kv={cfg.sharded_kv}, "
                       f"kv_heads_differ={cfg.precompute_heads(metadata_heads)[1] != cfg.call_heads[1]}")
                patterns[pat] = patterns.get(pat, 0) + 1
                if len(examples) < 5 and cfg.label() not in examples:
                    examples.append(cfg.label())
    return {"candidate_patterns": patterns, "examples": examples, "complete": covered == len(families),
            "families": len(families), "families_covered": covered,
            "note": "configurations whose split counts can satisfy S_p > S_c > 1 (stage 1); a per-batch "
                    "witness was replayed for the first of them"}


def _GUARD_SPEC_RE(label: str) -> bool:
    import re
    return bool(re.match(r"^(fixed|pre-fix|none|[A-Za-z_][\w.]*:[A-Za-z_]\w*|.+\.py:[A-Za-z_]\w*)$", label))


# ------------------------------------------------------------------------------------------------------------
# Policy-level theorems (3, 4) share one loop
# ------------------------------------------------------------------------------------------------------------


def policy_search(name: str, configs: list, guard, guard_label: str, metadata_heads: str, dropped: frozenset,
                   budget: Budget, heuristic_p: Heuristic, heuristic_c: Heuristic, cases_dir, expect_hazard: bool,
                   what: str, invariant_filter: Optional[str] = None) -> TheoremResult:
    """Every precomputing config of `configs` is SAFE for every decode batch, or a validated witness."""
    start = time.perf_counter()
    try:
        pre = [c for c in configs if D.precomputes(c, guard, dropped)]
    except Exception as exc:  # noqa: BLE001 - a raising guard is itself the finding
        return TheoremResult(name, TheoremVerdict.REFUTED, time.perf_counter() - start, {"guard_error": repr(exc)},
                             None,
                             f"the guard raised while deciding the precompute: {exc!r}", failed=True,
                             expected=False)
    groups = group_configs(pre, metadata_heads, heuristic_p, heuristic_c)
    shape_errors = [g for g in groups if g.P.num_vectors != g.C.num_vectors
                    or g.P.has_semaphore != g.C.has_semaphore]  # FA3 raises on every call: loud, safe
    live = [g for g in groups if g not in shape_errors]
    # likely hazards first (fewer KV heads or sharded KV at the precompute), so a witness comes early
    live.sort(key=lambda g: (g.P.num_heads_k >= g.C.num_heads_k and not g.sharded_cp and not g.p_static_free))
    shape_errors = len(shape_errors)
    for g, verdict, w in prove_groups(live, budget):
        if verdict != "witness":
            continue
        for cfg in g.configs:  # replay on the first config of the group whose concrete run confirms it
            ev, cfg_w, *_ = concrete_decode(cfg, metadata_heads, w, heuristic_p)
            if ev.outcome == Outcome.VIOLATION and (invariant_filter is None or
                                              any(v.invariant == invariant_filter for v in ev.violations)):
                invs = sorted({v.invariant for v in ev.violations})
                witness = {"config": cfg_w.label(),
                           "invariant": invs[0] if invariant_filter is None else invariant_filter,
                           "b": w["b"], "seq_lens": w["seq_lens"], "S_p": w["S_p"], "S_c": w["S_c"],
                           "splits": w.get("splits"), "precompute_heads": list(cfg_w.precompute_heads(metadata_heads)),
                           "call_heads": list(cfg_w.call_heads), "invariants": invs,
                           "server": cfg_w.server.to_dict(include_fork_fields=True), "model": cfg_w.model.name,
                           **{k: v for k, v in w.items() if k not in ("b", "seq_lens", "S_p", "S_c", "splits")}}
                path = _write_case(cases_dir, name, cfg_w, guard_label, metadata_heads, w, ev,
                                   f"{what}: z3 witness of theorem {name}, replayed concretely through refmodel "
                                   f"(S_p={w['S_p']}, S_c={w['S_c']}, splits={w.get('splits')})")
                ph, ch = cfg_w.precompute_heads(metadata_heads), cfg_w.call_heads
                cause = (f"precomputes with heads {ph} but calls with {ch}" if ph != ch else
                         f"precomputes from global lengths {w['seq_lens']} (max_seqlen_k {w['precompute_seqlen_k']}) "
                         f"but calls over local lengths {w['call_seq_lens']} (page-table width {w['call_seqlen_k']})")
                triggers = _trigger_summary(live, budget, metadata_heads)
                return TheoremResult(
                    name, TheoremVerdict.REFUTED, time.perf_counter() - start, witness, path,
                    f"{what}: {cfg_w.label()} {cause}; b={w['b']} seq_lens={w['seq_lens']} gives splits "
                    f"{w.get('splits')} > S_c={w['S_c']} (S_p={w['S_p']}; {', '.join(invs)})",
                    failed=True, expected=expect_hazard,
                    details={"groups": len(groups), "precomputing_configs": len(pre), "queries": budget.queries,
                             "triggering": triggers})
        return TheoremResult(name, TheoremVerdict.INCONCLUSIVE, time.perf_counter() - start, {"symbolic_witness": w},
                             None,
                             "z3 witness did not replay concretely (encoding/refmodel disagreement): a bug to report",
                             failed=False, expected=False)
    secs = time.perf_counter() - start
    details = {"configs": len(configs), "precomputing_configs": len(pre), "groups": len(groups),
               "shape_error_groups": shape_errors, "queries": budget.queries, "unknown": list(budget.unknowns)}
    if budget.unknowns:
        return TheoremResult(name, TheoremVerdict.INCONCLUSIVE, secs, {}, None,
                             f"{what}: z3 returned unknown on {len(budget.unknowns)} queries", failed=False,
                             expected=False, details=details)
    msg = (f"{what}: no witness over {len(configs)} configurations ({len(pre)} precompute, {len(groups)} groups, "
           f"{budget.queries} queries)")
    if not pre:
        msg = f"{what}: vacuous -- the guard disables the precompute for all {len(configs)} configurations"
    return TheoremResult(name, TheoremVerdict.PROVED, secs, {}, None, msg, failed=False, expected=not expect_hazard,
                         details=details)
