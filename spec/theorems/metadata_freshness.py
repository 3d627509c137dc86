"""Theorem 1 (freshness): metadata precomputed with the call's own parameters is what the call needs.

Invariant: a precompute with the call's own heads, lengths and split count never overflows the call's buffers
nor leaves query rows uncovered, except where FA3's precompute and kernel disagree about query tiles
(:data:`FRESHNESS_CORNER_SOURCE`, ``hopper/flash_api.cpp``, ``hopper/tile_size.h``): the expected refutation.
"""

from __future__ import annotations

import dataclasses
import time
from functools import lru_cache
from typing import Optional

import z3

from refmodel.fa3_scheduler import ScheduleInputs, precompute_inputs, resolve_schedule, with_inputs
from refmodel.prepare import prepare_scheduler

from spec.model import domain as D
from spec.theorems.results import TheoremResult
from spec.theorems.symbolic import Heuristic, boolval, bv, solver, var
from spec.theorems.metadata import (Group, Q_MAX, SEED, Budget, concrete_decode, evaluate_metadata, group_configs,
                                prove_groups, val)
from spec.finding import Outcome, TheoremVerdict


#: FA3 head-dim instances theorem 1 ranges over: the real models' (d, d) plus FA3's asymmetric V dims
#: (flash_api.cpp mha_fwd allows dv != d for d <= 64 with dv <= 512, and d in (128, 192] with dv in (96, 128]).
FRESHNESS_HEAD_DIMS = ((64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128),
                       (64, 96), (64, 128), (64, 192), (64, 256), (64, 512))

#: Where FA3's precompute and its kernel disagree about query tiles (theorem 1's expected refutation).
FRESHNESS_CORNER_SOURCE = (
    "hopper/flash_api.cpp:563-564 (precompute: d_rounded = round_up_headdim(d), dv_rounded = round_up_headdimv(dv)); "
    "hopper/flash_api.cpp:653-658 (mha_fwd_get_scheduler_metadata: tile_size_fwd_sm90(d_rounded, dv_rounded, ...) "
    "and prepare_varlen_num_blocks(params, stream, params.pack_gqa, kBlockM, kBlockN)); "
    "hopper/flash_api.cpp:260-267 (run_mha_fwd_constexpr: d <= 64 and 64 < dv <= 256 runs the <64, 256> instance); "
    "hopper/tile_size.h:14-25 (d <= 64: dv == 256 -> kBlockM 128, otherwise kBlockM 192); "
    "hopper/flash_fwd_launch_template.h:163-164 (without metadata the call prepares with the kernel's kBlockM and "
    "forced PackGQA, so only the precompute path is affected); hopper/flash_api.cpp:373-377 (PackGQA forced for "
    "Split / paged non-TMA while an explicit pack_gqa=False reaches the precompute's prepare step)")


# ------------------------------------------------------------------------------------------------------------
# Theorem 1: freshness
# ------------------------------------------------------------------------------------------------------------


def fresh_decode_groups(heuristic_p: Heuristic, heuristic_c: Heuristic) -> list[Group]:
    """Theorem 1a: P == C, sglang's decode shapes, every per-rank head split of the real models, every SM count."""
    configs = []
    for model in D.MODELS.values():
        for tp in (1, 2, 4, 8):
            if model.num_heads % tp:
                continue
            for det, ns in ((False, 0), (False, D.FIXED_SPLITS_REPRESENTATIVE)):
                for sm in D.NUM_SMS:
                    configs.append(D.Config(D.Server(tp_size=tp, num_splits=ns, enable_deterministic_inference=det,
                                                     num_sm=sm), dataclasses.replace(model, is_mla=False)))
    return group_configs(configs, "tp", heuristic_p, heuristic_c)


def _multirow_groups() -> list[tuple]:
    """Theorem 1b: P == C multi-row varlen calls over the FA3 head-dim grid; (P_inputs, SideParams, q_lo, q_hi, tags)."""
    qhpks = sorted({(m.num_heads // t) // max(1, m.num_kv_heads // t)
                    for m in D.MODELS.values() for t in (1, 2, 4, 8) if m.num_heads % t == 0})
    out: dict[tuple, tuple] = {}
    for qhpk in qhpks:
        for d, dv in FRESHNESS_HEAD_DIMS:
            for page in (None, 1, 128):
                for causal in (True, False):
                    for pack_arg in (None, False):
                        base = precompute_inputs(1, 1, 0, qhpk, 1, d, headdim_v=dv, varlen_q=True,
                                                 page_size=page, causal=causal, pack_gqa=pack_arg, num_splits=2)
                        for lo, hi in _q_classes(base):
                            inp = with_inputs(base, seqlen_q=lo)
                            sp = qc_params(inp)
                            # the query only reads sp and Lq <= hi: keep the widest range per sp (a superset)
                            if sp not in out or out[sp][3] < hi:
                                out[sp] = (inp, sp, lo, hi)
    return list(out.values())


@lru_cache(maxsize=None)
def qc_params(inp: ScheduleInputs) -> tuple:
    """(qhpk, block_m, kernel_block_m, pack S==1, pack S>1, kernel pack S==1, kernel pack S>1) from refmodel.

    Tiles and pack do not read the precompute flag (`resolve_schedule`), so one side's schedule serves both.
    """
    s1 = resolve_schedule(with_inputs(inp, num_splits=1))
    s2 = resolve_schedule(with_inputs(inp, num_splits=2))
    return (s1.qhead_per_khead, s1.block_m, s1.kernel_block_m, s1.pack_gqa, s2.pack_gqa, s1.kernel_pack_gqa,
            s2.kernel_pack_gqa)


def _q_classes(base: ScheduleInputs) -> list[tuple[int, int]]:
    """Intervals of max_seqlen_q on which every FA3 decision is constant (checked at both ends with refmodel).

    `base`: the precompute's inputs (one batch, qhpk query heads over one KV head, num_splits 2) at any seqlen_q.
    """
    qhpk, page = base.num_heads, base.page_size
    points = {1, 2, Q_MAX}
    if page is not None and page % 64 == 0:
        # paged KV may use TMA when seqlen_q * qhpk > kBlockM (flash_api.cpp get_pagedkv_tma): split there too
        for bm in (64, 128, 192):
            points |= {max(1, bm // qhpk), bm // qhpk + 1}
    pts = sorted(p for p in points if 1 <= p <= Q_MAX)
    classes = []
    for a, b in zip(pts, pts[1:] + [Q_MAX + 1]):
        lo, hi = a, b - 1
        if lo > hi:
            continue
        ends = {qc_params(with_inputs(base, seqlen_q=q)) for q in (lo, hi)}
        if len(ends) != 1:
            raise NotImplementedError(f"FA3 decisions vary inside max_seqlen_q in [{lo}, {hi}] "
                                      f"(qhpk={qhpk}, d={base.headdim}, dv={base.headdim_v})")
        if classes and classes[-1][2] == next(iter(ends)):
            classes[-1] = (classes[-1][0], hi, classes[-1][2])
        else:
            classes.append((lo, hi, next(iter(ends))))
    return [(lo, hi) for lo, hi, _ in classes]


def _multirow_query(sp: tuple, q_hi: int, budget: Budget) -> tuple[str, Optional[dict]]:
    """P == C, one batch of Lq <= q_hi rows, S abstract in 1..256 (same on both sides): QUERY_COVER gap?

    m-blocks = ceil(rows_p / kBlockM_host) is encoded as (m-1)*kBM < rows_p <= m*kBM (refmodel `m_blocks_for`).
    Small witnesses are searched first (Lq <= 1024), then the whole range.
    """
    qhpk, bm, kbm, p1, p2, kp1, kp2 = sp
    for bound in sorted({min(q_hi, 256), q_hi}):
        s = solver(budget.timeout_s, SEED)
        lq, S, m_p = var("Lq"), var("S"), var("m")
        s.add(lq >= 1, lq <= bound, S >= 1, S <= 256)
        pack = z3.If(S > 1, boolval(p2), boolval(p1))
        kpack = z3.If(S > 1, boolval(kp2), boolval(kp1))
        rows_p = z3.If(pack, lq * bv(qhpk), lq)
        s.add(m_p >= 0, m_p <= 2 ** 23, (m_p - 1) * bv(bm) < rows_p, rows_p <= m_p * bv(bm))
        rows = z3.If(kpack, lq * bv(qhpk), lq)
        s.add(m_p * bv(kbm) < rows)
        r = budget.check(s, "freshness multi-row")
        if r == z3.sat:
            m = s.model()
            return "sat", {"seqlen_q": val(m, lq), "num_splits": val(m, S), "m_blocks": val(m, m_p),
                           "rows": val(m, rows)}
        if r == z3.unknown:
            return "unknown", None
    return "unsat", None


def _corner_kind(inp: ScheduleInputs, sp: tuple) -> Optional[str]:
    qhpk, bm, kbm, p1, p2, kp1, kp2 = sp
    if bm != kbm:
        return "host-kernel-tile"
    if inp.pack_gqa is False and (kp1 != p1 or kp2 != p2):
        return "explicit-pack_gqa-false"
    return None


def _freshness(timeout_s: float, heuristic_p: Heuristic, heuristic_c: Heuristic,
               shared: Optional[dict] = None) -> TheoremResult:
    """Theorem 1 in one z3 context: its decode half, then its multi-row half (spec.theorems.metadata_jobs runs the
    two halves as separate parts)."""
    start = time.perf_counter()
    decode = fresh_decode(timeout_s, heuristic_p, heuristic_c, shared)
    multirow = None if decode["result"] is not None else fresh_multirow(timeout_s)
    return freshness_result(decode, multirow, time.perf_counter() - start)


def fresh_decode(timeout_s: float, heuristic_p: Heuristic, heuristic_c: Heuristic,
                  shared: Optional[dict] = None) -> dict:
    """Theorem 1a (decode, real split tables): a refuting TheoremResult in "result", or None, and the counts."""
    name = "freshness"
    start = time.perf_counter()
    budget = Budget(timeout_s, cache=shared if shared is not None else {})
    decode_groups = fresh_decode_groups(heuristic_p, heuristic_c)
    out = {"result": None, "decode_groups": len(decode_groups)}
    for g, verdict, w in prove_groups(decode_groups, budget, fresh=True):
        if verdict == "witness":
            cfg = g.example
            ev, cfg_w, *_ = concrete_decode(cfg, "tp", w, heuristic_p)
            witness = {"config": cfg_w.label(), "invariants": sorted({v.invariant for v in ev.violations}),
                       "invariant": (ev.violations[0].invariant if ev.violations else None), **w}
            out["result"] = TheoremResult(
                name, TheoremVerdict.REFUTED if ev.outcome == Outcome.VIOLATION else TheoremVerdict.INCONCLUSIVE,
                time.perf_counter() - start,
                witness, None, f"fresh decode metadata violates SAFE for {cfg_w.label()}: splits {w.get('splits')} "
                               f"> S_c={w['S_c']} (precompute and call heuristics differ)",
                failed=ev.outcome == Outcome.VIOLATION, expected=False)
            break
    out.update(queries=budget.queries, unknown=list(budget.unknowns), seconds=time.perf_counter() - start)
    return out


def fresh_multirow(timeout_s: float) -> dict:
    """Theorem 1b (multi-row varlen calls over the FA3 head-dim grid, S abstract): corners met, the first unexpected
    witness (the search stops there), and the counts."""
    start = time.perf_counter()
    budget = Budget(timeout_s)
    corners: dict[str, dict] = {}
    unexpected = None
    checked = 0
    for inp, sp, lo, hi in _multirow_groups():
        checked += 1
        r, w = _multirow_query(sp, hi, budget)
        if r != "sat":
            continue
        kind = _corner_kind(inp, sp)
        ev = _concrete_multirow(inp, w)
        own = _concrete_multirow(inp, w, own=True)
        wit = {"kind": kind, "headdim": inp.headdim, "headdim_v": inp.headdim_v, "qhead_per_khead": sp[0],
               "page_size": inp.page_size, "causal": inp.causal, "pack_gqa": inp.pack_gqa,
               "precompute_block_m": sp[1], "kernel_block_m": sp[2], **w,
               "replayed": ev.outcome, "call_own_metadata": own.outcome, "invariant": "QUERY_COVER"}
        # the corner is the precompute's: what the call computes for itself (refmodel call_own_metadata) is SAFE
        if kind is None or ev.outcome != Outcome.VIOLATION or own.outcome != Outcome.PASS:
            unexpected = wit
            break
        corners.setdefault(kind, wit)
    return {"corners": corners, "unexpected": unexpected, "multirow_groups": checked, "queries": budget.queries,
            "unknown": list(budget.unknowns), "seconds": time.perf_counter() - start}


def freshness_result(decode: dict, multirow: Optional[dict], secs: float) -> TheoremResult:
    """Theorem 1 from its halves: a decode refutation decides; else the multi-row corners and unknowns."""
    name = "freshness"
    if decode["result"] is not None:
        return decode["result"]
    corners, unexpected = multirow["corners"], multirow["unexpected"]
    unknowns = decode["unknown"] + multirow["unknown"]
    details = {"decode_groups": decode["decode_groups"], "multirow_groups": multirow["multirow_groups"],
               "queries": decode["queries"] + multirow["queries"], "unknown": unknowns,
               "expected_corners": corners, "fa3_source": FRESHNESS_CORNER_SOURCE}
    if unexpected is not None:
        return TheoremResult(name, TheoremVerdict.REFUTED, secs, unexpected, None,
                             "fresh metadata violates QUERY_COVER outside the documented corners: a new FA3 finding",
                             failed=True, expected=False, details=details)
    if unknowns:
        return TheoremResult(name, TheoremVerdict.INCONCLUSIVE, secs, {}, None, f"z3 unknown: {unknowns[:3]}",
                             expected=False, details=details)
    if corners:
        first = corners.get("host-kernel-tile") or next(iter(corners.values()))
        return TheoremResult(
            name, TheoremVerdict.EXPECTED_REFUTATION, secs, first, None,
            "P == C is SAFE for sglang decode (every real model, SM count, split policy) and for multi-row varlen "
            "calls except FA3's own corners: " + "; ".join(
                f"{k}: d={v['headdim']}, dv={v['headdim_v']}, qhpk={v['qhead_per_khead']}, Lq={v['seqlen_q']}, "
                f"S={v['num_splits']}: {v['m_blocks']} m-blocks of {v['kernel_block_m']} < {v['rows']} rows"
                for k, v in corners.items()) + ". Proved on every other group. Source: " + FRESHNESS_CORNER_SOURCE,
            failed=False, expected=True, details=details)
    return TheoremResult(name, TheoremVerdict.PROVED, secs, {}, None, "P == C implies SAFE on the whole domain",
                         details=details)


def _concrete_multirow(inp: ScheduleInputs, w: dict, own: bool = False):
    """Replay a multi-row freshness witness: one batch with Lq rows and 1 KV token, num_splits = S fixed.

    `own`: compare the call with the metadata it computes for itself (refmodel `call_own_metadata`,
    flash_fwd_launch_template.h 163-165) instead of a precompute from the same inputs.
    """
    lq = int(w["seqlen_q"])
    pin = dataclasses.replace(inp, batch_size=1, seqlen_q=max(lq, inp.seqlen_q), seqlen_k=lq + 1,
                              num_splits=int(w["num_splits"]))
    C = resolve_schedule(dataclasses.replace(pin, precompute=False, uses_prepare=True))
    if own:
        from refmodel.metadata_layout import call_own_metadata

        P, R = call_own_metadata(C, [lq + 1], seqlens_q=[lq])
    else:
        P = resolve_schedule(pin)
        R = prepare_scheduler(P, [lq + 1], seqlens_q=[lq])
    return evaluate_metadata(P, R, C, {"seqused_k": [lq + 1], "seqlens_q": [lq]})
