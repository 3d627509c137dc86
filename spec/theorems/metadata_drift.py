"""Theorem 2 (benign drift) and the single changes that break SAFE.

Invariant: decode metadata stays safe when only the sequence lengths drift below what it was computed for,
and each single change of h_k, seqlen_k, seqlen_q, pack-GQA or b between precompute and call has a concrete
witness of a violation (``hopper/flash_api.cpp``, ``hopper/flash_prepare_scheduler.cu``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

import z3

from refmodel.fa3_scheduler import call_inputs, precompute_inputs, resolve_schedule
from refmodel.prepare import prepare_scheduler

from spec.theorems.results import TheoremResult
from spec.theorems.z3ctx import checked
from spec.theorems.symbolic import Heuristic, boolval, bv, ceil_div_const, side_params, solver, sym_m_blocks, var
from spec.theorems.metadata import B_MAX, Group, SEED, Budget, evaluate_metadata, find_witness, prove_groups, val
from spec.theorems.metadata_freshness import fresh_decode_groups, qc_params
from spec.finding import Outcome, TheoremVerdict


# ------------------------------------------------------------------------------------------------------------
# Theorem 2: benign drift, and the single changes that break SAFE
# ------------------------------------------------------------------------------------------------------------


_DRIFT_BASE = dict(h=32, hk=4, d=128, sm=132, page=1)   # qwen3-30b-a3b at attn_tp 1 (docs/facts-fa3.md's worked example)


def _decode_inputs(pre: bool, h: int, hk: int, seqlen_q: int = 1, pack_gqa=None, d=128, sm=132, page=1):
    kw = dict(varlen_q=True, page_size=page, causal=True, num_sm=sm, pack_gqa=pack_gqa)
    if pre:
        return precompute_inputs(1, seqlen_q, 0, h, hk, d, **kw)
    return call_inputs(1, seqlen_q, 0, h, hk, d, has_cache_seqlens=True, **kw)


def benign_drift(timeout_s: float, heuristic_p: Heuristic, heuristic_c: Heuristic,
                  shared: Optional[dict] = None) -> TheoremResult:
    """benign-drift: same b and static shapes on both sides, any cache_seqlens: SAFE (shares freshness's groups)."""
    start = time.perf_counter()
    budget = Budget(timeout_s, cache=shared if shared is not None else {})
    # the proof: same static inputs on both sides, per-batch cache_seqlens free on the call side
    bad = None
    groups = fresh_decode_groups(heuristic_p, heuristic_c)
    for g, verdict, w2 in prove_groups(groups, budget, fresh=True):
        if verdict == "witness":
            bad = (g, w2)
            break
    secs = time.perf_counter() - start
    if bad is not None:
        g, w = bad
        return TheoremResult("benign-drift", TheoremVerdict.REFUTED, secs, {"config": g.example.label(), **w,
                                                                  "invariant": "SPLIT_BOUND"}, None,
                             "changing only cache_seqlens breaks SAFE (the precompute's split count exceeds the "
                             "call's for equal static shapes: the two heuristics differ)", failed=True,
                             expected=False)
    if budget.unknowns:
        return TheoremResult("benign-drift", TheoremVerdict.INCONCLUSIVE, secs, {}, None, str(budget.unknowns[:3]),
                             expected=False)
    return TheoremResult(
        "benign-drift", TheoremVerdict.PROVED, secs, {}, None,
        f"same b and static shapes, any cache_seqlens on either side: S_p == S_c on all {len(groups)} decode "
        "groups, per-batch splits <= S_p (prepare-split-bound), m-blocks unchanged, KV ranges from the call's "
        "own lengths (kv-cover), batch order a permutation of the same b")


def _drift_h_k(timeout_s: float) -> TheoremResult:
    """h_k: fewer KV heads at the precompute (the PR #30439 path)."""
    base = _DRIFT_BASE
    return _drift_decode("drift-breaks-h_k", "h_k", timeout_s,
                         [(_decode_inputs(True, base["h"], hk_p), _decode_inputs(False, base["h"], base["hk"]))
                          for hk_p in (1, 2)], p_static_free=False)


def _drift_seqlen_k(timeout_s: float) -> TheoremResult:
    """seqlen_k: the precompute's static max_seqlen_k larger than the call's page-table width, same lengths."""
    base = _DRIFT_BASE
    return _drift_decode("drift-breaks-seqlen_k", "seqlen_k", timeout_s,
                         [(_decode_inputs(True, h, hk), _decode_inputs(False, h, hk))
                          for h, hk in ((base["h"], base["hk"]), (8, 1), (32, 8))], p_static_free=True)


#: One witness per single change that breaks SAFE (docs/facts-fa3.md section 2 mismatch classes), replayed concretely:
#: theorem name -> function of the per-query timeout. seqlen_q: metadata for one row per sequence, a call with
#: more (e.g. speculative verify); pack: precompute with pack_gqa=False, call with FA3's own (forced for Split)
#: PackGQA; b: the call has more sequences than the metadata (same b4), so it reads unwritten slots.
DRIFT_BREAKS = {
    "drift-breaks-h_k": _drift_h_k,
    "drift-breaks-seqlen_k": _drift_seqlen_k,
    "drift-breaks-seqlen_q": lambda timeout_s: _drift_rows("drift-breaks-seqlen_q", timeout_s, pack_p=None),
    "drift-breaks-pack": lambda timeout_s: _drift_rows("drift-breaks-pack", timeout_s, pack_p=False),
    "drift-breaks-b": lambda timeout_s: _drift_batch("drift-breaks-b", timeout_s),
}


def _drift_breaks(timeout_s: float) -> list[TheoremResult]:
    """Every theorem of DRIFT_BREAKS, in order."""
    return [theorem(timeout_s) for theorem in DRIFT_BREAKS.values()]


def _drift_decode(name, what, timeout_s, pairs, p_static_free: bool) -> TheoremResult:
    start = time.perf_counter()
    budget = Budget(timeout_s)
    for pin, cin in pairs:
        g = Group(side_params(pin), side_params(cin), 0, 1, False, p_static_free=p_static_free)
        verdict, w = find_witness(g, budget)
        if verdict != "witness":
            continue
        b = w["b"]
        P = resolve_schedule(dataclasses.replace(pin, batch_size=b, seqlen_k=w["precompute_seqlen_k"]))
        R = prepare_scheduler(P, w["seq_lens"], seqlens_q=[1] * b)
        C = resolve_schedule(dataclasses.replace(cin, batch_size=b, seqlen_k=w["call_seqlen_k"]))
        ev = evaluate_metadata(P, R, C, {"seqused_k": w["call_seq_lens"], "seqlens_q": [1] * b})
        if ev.outcome != Outcome.VIOLATION:
            continue
        wit = {"change": what, "precompute_heads": [pin.num_heads, pin.num_heads_k],
               "call_heads": [cin.num_heads, cin.num_heads_k], "invariant": ev.violations[0].invariant, **w}
        return TheoremResult(name, TheoremVerdict.REFUTED, time.perf_counter() - start, wit, None,
                             f"changing only {what}: {ev.violations[0].message} (FA3-level witness: no server "
                             f"configuration, so no case file)", failed=False, expected=True)
    return TheoremResult(name, TheoremVerdict.INCONCLUSIVE if budget.unknowns else TheoremVerdict.PROVED,
                         time.perf_counter() - start, {}, None,
                         f"no witness for a change of {what} on the representative shapes", expected=False)


def _drift_rows(name, timeout_s, pack_p) -> TheoremResult:
    """Metadata with Lq_p rows (1, or pack_gqa=False) vs a call with Lq_c rows: a QUERY_COVER gap."""
    start = time.perf_counter()
    h, hk = _DRIFT_BASE["h"], _DRIFT_BASE["hk"]
    saw_unknown = False  # a z3 unknown is never "no witness": the verdict is then inconclusive
    for q_c in (1, 2, 4, 8, 64):
        if pack_p is None and q_c == 1:
            continue
        q_p = 1 if pack_p is None else q_c
        pin = _decode_inputs(True, h, hk, seqlen_q=q_p, pack_gqa=pack_p, page=1)
        cin = _decode_inputs(False, h, hk, seqlen_q=q_c, page=1)
        s = solver(timeout_s, SEED)
        lq_c, lq_p, S = var("Lq_c"), var("Lq_p"), var("S")
        s.add(lq_c >= 1, lq_c <= q_c, lq_p >= 1, lq_p <= q_p, S >= 1, S <= 256)
        if pack_p is False:
            s.add(lq_p == lq_c)
        P, C = qc_params(dataclasses.replace(pin, num_splits=2)), qc_params(dataclasses.replace(cin, num_splits=2))
        pack = z3.If(S > 1, boolval(P[4]), boolval(P[3]))
        kpack = z3.If(S > 1, boolval(C[6]), boolval(C[5]))
        m_p = sym_m_blocks(lq_p, P[0], pack, P[1])
        rows = z3.If(kpack, lq_c * bv(C[0]), lq_c)
        s.add(m_p * bv(C[2]) < rows)
        r = checked(s)
        saw_unknown |= r == z3.unknown
        if r != z3.sat:
            continue
        m = s.model()
        w = {"seqlen_q_precompute": val(m, lq_p), "seqlen_q_call": val(m, lq_c), "num_splits": val(m, S)}
        Pin = dataclasses.replace(pin, seqlen_q=max(q_p, w["seqlen_q_precompute"]), seqlen_k=64,
                                  num_splits=w["num_splits"])
        Ps = resolve_schedule(Pin)
        R = prepare_scheduler(Ps, [64], seqlens_q=[w["seqlen_q_precompute"]])
        Cs = resolve_schedule(dataclasses.replace(cin, seqlen_q=q_c, seqlen_k=64, num_splits=w["num_splits"]))
        ev = evaluate_metadata(Ps, R, Cs, {"seqused_k": [64], "seqlens_q": [w["seqlen_q_call"]]})
        if ev.outcome == Outcome.VIOLATION:
            what = "pack_gqa (False at the precompute)" if pack_p is False else "seqlen_q"
            return TheoremResult(name, TheoremVerdict.REFUTED, time.perf_counter() - start,
                                 {"change": what, "invariant": ev.violations[0].invariant, **w}, None,
                                 f"changing only {what}: {ev.violations[0].message} (FA3-level witness, no case file)",
                                 expected=True)
    if saw_unknown:
        return TheoremResult(name, TheoremVerdict.INCONCLUSIVE, time.perf_counter() - start, {}, None,
                             f"z3 returned unknown (timeout {timeout_s}s) before any witness", expected=False)
    return TheoremResult(name, TheoremVerdict.PROVED, time.perf_counter() - start, {}, None, "no witness found",
                         expected=False)


def _drift_batch(name, timeout_s) -> TheoremResult:
    """b_c != b_p with the same b4: the call reads unwritten slots (b_c > b_p) or a non-permutation."""
    start = time.perf_counter()
    s = solver(timeout_s, SEED)
    bp, bc = var("b_p"), var("b_c")
    s.add(bp >= 1, bp <= B_MAX, bc >= 1, bc <= B_MAX, ceil_div_const(bp, 4) == ceil_div_const(bc, 4), bc > bp)
    r = checked(s)
    if r == z3.unknown:
        return TheoremResult(name, TheoremVerdict.INCONCLUSIVE, time.perf_counter() - start, {}, None,
                             f"z3 returned unknown (timeout {timeout_s}s)", expected=False)
    if r != z3.sat:
        return TheoremResult(name, TheoremVerdict.PROVED, time.perf_counter() - start, {}, None, "no witness",
                             expected=False)
    m = s.model()
    b_p, b_c = val(m, bp), val(m, bc)
    pin = _decode_inputs(True, 32, 4)
    P = resolve_schedule(dataclasses.replace(pin, batch_size=b_p, seqlen_k=4096))
    R = prepare_scheduler(P, [4096] * b_p, seqlens_q=[1] * b_p)
    C = resolve_schedule(dataclasses.replace(_decode_inputs(False, 32, 4), batch_size=b_c, seqlen_k=4096))
    ev = evaluate_metadata(P, R, C, {"seqused_k": [4096] * b_c, "seqlens_q": [1] * b_c})
    return TheoremResult(name,
                         TheoremVerdict.REFUTED if ev.outcome == Outcome.VIOLATION else TheoremVerdict.INCONCLUSIVE,
                         time.perf_counter() - start,
                         {"change": "b", "b_precompute": b_p, "b_call": b_c,
                          "invariant": ev.violations[0].invariant if ev.violations else None}, None,
                         f"changing only b ({b_p} -> {b_c}, same b4): "
                         f"{ev.violations[0].message if ev.violations else ev.outcome} (no case file)",
                         expected=ev.outcome == Outcome.VIOLATION)
