"""Theorems 0-4 as jobs (spec.theorems.jobs): what runs together in one z3 context with one query cache.

Invariant: a job holds the theorems that share work -- freshness and benign drift (the same fresh decode groups),
the hazard, guard soundness and the root-cause alternative (groups of the replicated-KV domain) -- and every other
theorem is a job of its own, so a parallel run splits the work where nothing is shared. Each job computes only the
theorems selected (`only`), in catalogue order (`spec.theorems.metadata.THEOREMS`).
"""

from __future__ import annotations

from typing import Any, Optional

from refmodel.fa3_scheduler import get_num_splits

from spec.model import domain as D
from spec.theorems.results import TheoremResult
from spec.theorems.symbolic import Heuristic
from spec.theorems.jobs import Job
from spec.theorems.metadata import THEOREMS, Budget, is_known_guard, matches
from spec.finding import TheoremVerdict

__all__ = ["metadata_jobs"]

#: Expected seconds of each job on one core (quiet machine), to start the long ones first in a parallel run.
_WEIGHTS = {"1a": 0.4, "1b": 1.9, "drift-breaks-h_k": 1.1, "drift-breaks-seqlen_k": 1.0, "batch-over-992": 0.1,
            "prefill-cp-hazard": 1.0, "guard-soundness": 1.5, "root-cause-alternative": 0.3, "sharded-kv-decode": 1.5}


def metadata_jobs(guard: Any = "fixed", metadata_heads: str = "tp", timeout_s: float = 10.0,
                  dropped_assumptions: frozenset = frozenset(), cases_dir=None, only=None,
                  guard_spec: Optional[str] = None, heuristic_precompute: Heuristic = get_num_splits,
                  heuristic_call: Heuristic = get_num_splits, kv_range: Optional[tuple] = None) -> list[Job]:
    """The jobs of :func:`run_metadata_theorems` (same arguments), in catalogue order."""
    from spec.theorems.metadata_drift import DRIFT_BREAKS, benign_drift
    from spec.theorems.metadata_freshness import fresh_decode, fresh_multirow, freshness_result
    from spec.theorems.metadata_lemmas import prepare_split_lemma, kv_cover_lemma
    from spec.theorems.metadata_policy import policy_search

    if metadata_heads not in D.METADATA_HEADS:
        raise ValueError(f"metadata_heads: must be one of {D.METADATA_HEADS}, got {metadata_heads!r}")
    dropped = D.check_names(dropped_assumptions)
    guard_fn, label = D.resolve_guard(guard)
    label = guard_spec or label
    known = is_known_guard(label)
    expect_hazard = known in ("pre-fix", "none") and metadata_heads == "tp"
    want = [n for n in THEOREMS if matches(n, only)]
    hp, hc = heuristic_precompute, heuristic_call
    jobs: list[Job] = []
    domain: list = []

    def _configs(dropped: frozenset) -> tuple:
        """The configuration domain without the dropped assumptions, built once for these jobs (on first use)."""
        if not domain:
            domain.append(tuple(D.enumerate_configs(dropped)))
        return domain[0]

    def job(names, part, key, weight=None):
        """A one-part job of the wanted `names`; `key` names what else the part depends on (spec.theorems.memo)."""
        names = tuple(n for n in names if n in want)
        if names:
            jobs.append(Job(names, (lambda: part(names),), weight=weight or _WEIGHTS.get(names[0], 0.05),
                            key=(names, timeout_s, *key), cases_dir=None if cases_dir is None else str(cases_dir)))

    # theorem 0: the lemmas
    if kv_range is None:
        job(["kv-cover"], lambda names: [kv_cover_lemma(timeout_s)], ())
    else:
        job(["kv-cover"], lambda names: [kv_cover_lemma(timeout_s, kv_range[0], kv_range[1])], kv_range)
    job(["batch-over-992"], lambda names: [prepare_split_lemma(timeout_s)], ())

    # theorems 1a and 2a share the fresh decode groups (one cache); 1b (multi-row) is a part of its own
    fresh_names = tuple(n for n in ("freshness", "benign-drift") if n in want)

    def fresh_decode_and_benign() -> dict:
        shared: dict = {}
        out = {"decode": None, "benign": None}
        if "freshness" in fresh_names:
            out["decode"] = fresh_decode(timeout_s, hp, hc, shared)
        if "benign-drift" in fresh_names:
            out["benign"] = benign_drift(timeout_s, hp, hc, shared)
        return out

    def fresh_finish(values: list) -> list:
        first, out = values[0], []
        if first["decode"] is not None:
            multirow = values[1] if len(values) > 1 else None
            secs = first["decode"]["seconds"] + (multirow["seconds"] if multirow else 0.0)
            out.append(freshness_result(first["decode"], multirow, secs))
        if first["benign"] is not None:
            out.append(first["benign"])
        return out

    if fresh_names:
        parts = (fresh_decode_and_benign,)
        if "freshness" in fresh_names:
            parts += (lambda: fresh_multirow(timeout_s),)
        jobs.append(Job(fresh_names, parts, finish=fresh_finish,
                        weight=(_WEIGHTS["1a"], _WEIGHTS["1b"])[:len(parts)], key=(fresh_names, timeout_s, hp, hc),
                        stop=lambda v: isinstance(v, dict) and v.get("decode") is not None
                        and v["decode"]["result"] is not None))
    for name, theorem in DRIFT_BREAKS.items():
        job([name], lambda names, theorem=theorem: [theorem(timeout_s)], ())

    # theorems 3 and 4 over the configuration domain
    def replicated() -> list:
        return [c for c in _configs(dropped) if not c.sharded_kv]

    def policy(names) -> list:
        shared: dict = {}
        out = []
        configs = replicated()
        if "prefill-cp-hazard" in names:
            pcp = [c for c in configs if c.server.enable_prefill_cp]
            r = policy_search("prefill-cp-hazard", pcp, guard_fn, label, metadata_heads, dropped,
                               Budget(timeout_s, cache=shared), hp, hc, cases_dir, expect_hazard, "prefill-CP hazard",
                               invariant_filter="SPLIT_BOUND")
            if r.verdict == TheoremVerdict.PROVED:
                r.expected = not expect_hazard
            out.append(r)
        if "guard-soundness" in names:
            out.append(policy_search("guard-soundness", configs, guard_fn, label, metadata_heads, dropped,
                                      Budget(timeout_s, cache=shared), hp, hc, cases_dir, expect_hazard,
                                      "guard soundness"))
        if "root-cause-alternative" in names:
            out.append(policy_search("root-cause-alternative", configs, D.prefix_guard, "pre-fix", "attn_tp",
                                      dropped, Budget(timeout_s, cache=shared), hp, hc, cases_dir, False,
                                      "root-cause alternative (pre-fix guard, attn_tp heads), sglang's replicated-KV "
                                      "decode"))
        return out

    policy_key = (guard_fn, label, metadata_heads, dropped, hp, hc)
    job(["prefill-cp-hazard", "guard-soundness", "root-cause-alternative"], policy, policy_key,
        weight=sum(_WEIGHTS[n] for n in ("prefill-cp-hazard", "guard-soundness", "root-cause-alternative") if n in want))
    job(["sharded-kv-decode"], lambda names: [policy_search(
        "sharded-kv-decode", [c for c in _configs(dropped) if c.sharded_kv], guard_fn, label, metadata_heads,
        dropped, Budget(timeout_s), hp, hc, cases_dir, known in ("pre-fix", "none"),
        "CP decode over sharded KV (metadata from global lengths, call over local KV)")], policy_key,
        weight=_WEIGHTS["sharded-kv-decode"] if known in ("pre-fix", "none") else 0.05)
    job(["guard-robustness"], lambda names: [_robustness(guard_fn, _configs(dropped))], (guard_fn, dropped))
    return jobs


def _robustness(guard_fn, configs: tuple) -> TheoremResult:
    """guard-robustness: the guard returns on every configuration (a sample of the domain) and on old ServerArgs."""
    import time

    start = time.perf_counter()
    raised = D.guard_robustness(guard_fn, list(configs[:: max(1, len(configs) // 400)]) or
                                [D.Config(D.Server(), D.MODELS["llama-3-8b"])])
    secs = time.perf_counter() - start
    if raised:
        return TheoremResult("guard-robustness", TheoremVerdict.REFUTED, secs,
                             {"invariant": "GUARD_RAISED", **raised[0]}, None,
                             raised[0]["message"], failed=True, expected=False, details={"raised": raised})
    return TheoremResult("guard-robustness", TheoremVerdict.PROVED, secs, {}, None,
                         f"the guard returns on every configuration and on ServerArgs lacking any of "
                         f"{', '.join(D.GUARD_FLAGS)}")


def run_metadata_theorems(guard: Any = "fixed", metadata_heads: str = "tp", timeout_s: float = 10.0,
                          dropped_assumptions: frozenset = frozenset(), cases_dir=None, only=None,
                          guard_spec: Optional[str] = None, heuristic_precompute: Heuristic = get_num_splits,
                          heuristic_call: Heuristic = get_num_splits,
                          kv_range: Optional[tuple] = None) -> list[TheoremResult]:
    """Theorems 1-4 for a backend policy (guard, metadata_heads); each result names its verdict.

    `guard`: a callable `guard(server_args) -> bool` or "fixed" / "pre-fix" / "none"; `guard_spec` is the label
    written into case files (defaults to the name or the callable's qualname). `only`: theorem names, numbers
    ("3") or substrings. `heuristic_*` and `kv_range` (a (symbolic, concrete) split-range pair) exist for the
    negative controls in the tests. Expected verdicts: under a sound policy every safety theorem is "proved" and
    theorem 3 reports "proved" (no hazard); under the pre-fix policy with "tp" heads theorem 3 and 4 are
    "refuted" (`failed=True`) and write case files.
    """
    from spec.theorems.jobs import run_jobs

    jobs = metadata_jobs(guard=guard, metadata_heads=metadata_heads, timeout_s=timeout_s,
                         dropped_assumptions=dropped_assumptions, cases_dir=cases_dir, only=only, guard_spec=guard_spec,
                         heuristic_precompute=heuristic_precompute, heuristic_call=heuristic_call, kv_range=kv_range)
    return run_jobs(jobs).results


def group_jobs(request) -> list[Job]:
    """The metadata group's jobs for a :class:`spec.theorems.base.ProveRequest` (spec.theorems.jobs_for)."""
    return metadata_jobs(guard=request.guard, metadata_heads=request.metadata_heads, timeout_s=request.timeout_s,
                         dropped_assumptions=frozenset(request.dropped_assumptions), cases_dir=request.cases_dir,
                         only=None if request.only is None else list(request.only), guard_spec=request.guard_spec)
