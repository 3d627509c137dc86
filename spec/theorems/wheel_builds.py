"""Theorem 12: the classes the sglang kernel wheels' builds add to the metadata hand-off.

The builds read from sglang's kernel wheels (refmodel.fa3_builds ``sglang-kernel-0.4.2``, ``sglang-kernel-0.4.5``;
docs/fa3-builds.md) differ from upstream in two host rules a precompute and a call can evaluate differently:

* ``sglang-tile-cover`` (a safety theorem, z3): the decode tile. Both builds choose a one-warp-group 64-row tile
  when ``seqlen_q * (h / h_k) <= 64`` (d 64 or 128, local or not), so a precompute and a call whose
  ``max_seqlen_q`` differ can choose different kBlockM. The metadata stores each batch's m-blocks counted with the
  precompute's kBlockM (``flash_prepare_scheduler.cu``; refmodel.prepare) and the kernel walks them with its own
  (``tile_scheduler.hpp``). Claim: for every tile instance of theorem 9 with d 64 or 128 (the head dims the decode
  tile exists for; 105: dv x dtype x causal/local x paging), sides with the same ``h / h_k`` (1..256) and any
  ``max_seqlen_q`` in 1..2^20, and every batch of R packed query rows with ``1 <= R <= `` the call's
  ``max_seqlen_q * (h / h_k)`` (a relaxation of R = Lq * (h / h_k)), ``ceil(R / kBlockM_p) * kBlockM_c >= R``: the
  stored m-blocks cover every packed query row (QUERY_COVER cannot fail from the tile drift alone; a drift of the
  heads is theorem 2's class). Why: a smaller call tile is the 64-row one, chosen only when the call's rows are at
  most 64, which one m-block of 64 covers. The drift still moves split counts (kBlockN and the m-block total
  differ): the fuzz family ``sglang-decode-tile`` reaches that. Negative control: the seeded defect
  ``call-one-wg-rows-128`` (the call's predicate tests ``<= 128``, the precompute's ``<= 64``) is refuted.
* ``total-q-drift`` (an expected refutation, bounded search with refmodel): from 0.4.5 ``get_num_splits`` bounds a
  varlen call's m-blocks by ``params.total_q`` (the call's real rows) while ``mha_fwd_get_scheduler_metadata``
  leaves it 0, so the precompute bounds by ``b * max_seqlen_q``. The split heuristic is not monotone in m-blocks:
  fewer rows at the call can give fewer splits than the precompute's, and the precomputed per-batch split counts
  then overflow the call's partial buffers (SPLIT_BOUND). The search walks the domain below (each call total that
  changes the call's m-blocks, lengths in steps of the KV tile) and turns the first S_p > S_c into lengths whose
  metadata spec.invariants rejects. Under 0.4.2 and upstream neither side reads ``total_q`` and the same search
  finds nothing (``proved`` on the domain). Negative control: the seeded defect ``total-q-read-by-both`` (the
  precompute also bounded by the call's real rows) leaves no witness under 0.4.5.

Domain of ``total-q-drift``: head pairs (h, h_k) of the non-MLA models of spec.model.config under tp 1, 2, 4, 8,
d 64 and 128 (as the model), bf16, paged (page 1 and 16), causal, 132 SMs; b in {4, 8, 16}; ``max_seqlen_q`` in
{2, 4, 8, 16, 64}; one long sequence of L <= 32768 keys (steps of 256) beside b - 1 sequences of 100 keys.
Simplifications: sm90, no left padding, no appended KV, no softcap; ``sglang-tile-cover`` counts packed rows on
both sides (an unpacked side has fewer rows, and a PackGQA drift is theorem 2's class).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Optional

import z3

from refmodel.fa3_builds import SGLANG_KERNEL_042, SGLANG_KERNEL_045

from spec.theorems.base import SEEDED_DEFECTS, select, unrefuted_result
from spec.theorems.fork_tile import MAX_SEQLEN_Q, TILE_INSTANCES, SideVars, sym_tile, tile_table
from spec.theorems.results import TheoremResult
from spec.theorems.symbolic import bv, solver, var
from spec.theorems.z3ctx import checked
from spec.finding import TheoremVerdict

__all__ = ["THEOREMS", "DEFECTS", "SGLANG_BUILDS", "COVER_INSTANCES", "tile_cover", "total_q_drift", "total_q_points",
           "total_q_witness", "wheel_build_jobs", "group_jobs"]

THEOREMS = ("sglang-tile-cover", "total-q-drift")
#: Seeded defects of this group (negative controls), seeded_defects.json.
DEFECTS: dict[str, str] = SEEDED_DEFECTS["wheel_builds"]
SGLANG_BUILDS = (SGLANG_KERNEL_042, SGLANG_KERNEL_045)
#: theorem 9's tile instances with d 64 or 128, the head dims the sglang builds' decode tile exists for (105)
COVER_INSTANCES = tuple(i for i in TILE_INSTANCES if i.headdim in (64, 128))
SOURCE_TILE = ("sglang-kernel 0.4.2-0.4.10 flash_ops.abi3.so: tile_size_fwd_sm90 and the decode-tile predicate in "
               "get_num_splits (scripts/read_fa3_wheel.py); hopper/flash_prepare_scheduler.cu (m-blocks with the "
               "precompute's kBlockM), tile_scheduler.hpp (the kernel's kBlockM)")
SOURCE_TOTAL_Q = ("sglang-kernel 0.4.5-0.4.10 get_num_splits (params.total_q, offset 0x114, read in the listing); "
                  "hopper/flash_api.cpp mha_fwd (total_q set) and mha_fwd_get_scheduler_metadata (left 0)")
#: Longest sequence the total-q search scans (keys) and its step.
MAX_SCAN_KV, SCAN_STEP = 32768, 256


def _ceil_rows(rows, block_m, table: dict):
    """``ceil(rows / block_m)`` as a z3 term: one division by a constant per kBlockM the instance's table holds (a
    division by the symbolic tile would bit-blast a divider)."""
    values = sorted({bm for bm, _ in table.values()})
    term = z3.UDiv(rows + bv(values[-1] - 1), bv(values[-1]))
    for v in values[:-1]:
        term = z3.If(block_m == bv(v), z3.UDiv(rows + bv(v - 1), bv(v)), term)
    return term


def _times_block(m_blocks, block_m, table: dict):
    """``m_blocks * block_m`` with one product by a constant per kBlockM of the table (no symbolic multiplier)."""
    values = sorted({bm for bm, _ in table.values()})
    term = m_blocks * bv(values[-1])
    for v in values[:-1]:
        term = z3.If(block_m == bv(v), m_blocks * bv(v), term)
    return term


def tile_cover(build: str, timeout_s: float = 10.0, defects=frozenset(), instances=COVER_INSTANCES) -> TheoremResult:
    """``sglang-tile-cover`` under ``build`` (module doc)."""
    name = THEOREMS[0]
    start = time.perf_counter()
    # the tiles read h and h_k only as h / h_k: one variable g for it on both sides (h = g, h_k = 1), 1..256
    g = var("qhpk")
    p, c = (SideVars(var(f"{x}_seqlen_q"), g, bv(1), z3.And(z3.UGE(var(f"{x}_seqlen_q"), bv(1)),
                                                                 z3.ULE(var(f"{x}_seqlen_q"), bv(MAX_SEQLEN_Q))))
            for x in ("p", "c"))
    rows = var("rows")   # a batch's packed query rows: 1 <= rows <= the call's max_seqlen_q * qhpk (< 2^28)
    s = solver(timeout_s)
    s.add(p.domain, c.domain, z3.UGE(g, bv(1)), z3.ULE(g, bv(256)), z3.UGE(rows, bv(1)),
          z3.ULE(rows, c.seqlen_q * g))
    call_rows = 128 if "call-one-wg-rows-128" in defects else 64
    unknown = []
    for inst in instances:
        (pm, _), (cm, _) = sym_tile(inst, p, build), sym_tile(inst, c, build, wg_rows=call_rows)
        table = tile_table(inst, build)
        m_blocks = _ceil_rows(rows, pm, table)
        s.push()
        s.add(z3.ULT(_times_block(m_blocks, cm, table), rows))
        r = checked(s)
        if r == z3.unknown:
            unknown.append(f"{inst.label}: {s.reason_unknown()}")
        elif r == z3.sat:
            m = s.model()
            val = {k: m.eval(t, model_completion=True).as_long() for k, t in
                   (("seqlen_q_p", p.seqlen_q), ("seqlen_q_c", c.seqlen_q), ("qhpk", g), ("rows", rows),
                    ("block_m_p", pm), ("block_m_c", cm), ("m_blocks", m_blocks))}
            s.pop()
            covered = val["m_blocks"] * val["block_m_c"]
            return TheoremResult(name, TheoremVerdict.REFUTED, time.perf_counter() - start,
                                 {"instance": inst.label, "build": build, **val, "invariant": "QUERY_COVER"}, None,
                                 f"under {build}, {inst.label}: max_seqlen_q {val['seqlen_q_p']} vs "
                                 f"{val['seqlen_q_c']} (h / h_k {val['qhpk']}), a batch of {val['rows']} packed "
                                 f"query rows gets {val['m_blocks']} m-blocks of {val['block_m_p']} but the kernel "
                                 f"tiles {val['block_m_c']}: rows {covered}.. are never computed (encoding defects "
                                 f"{sorted(defects)})", failed=True, expected=False)
        s.pop()
    return unrefuted_result(name, start, unknown,
                            f"under {build}, on {len(instances)} instances, max_seqlen_q <= {MAX_SEQLEN_Q} on either "
                            f"side and equal heads: the m-blocks counted with the precompute's kBlockM cover every "
                            f"query row at the call's kBlockM. Source: {SOURCE_TILE}",
                            details={"instances": len(instances), "build": build})


@functools.lru_cache(maxsize=1)
def total_q_points() -> tuple:
    """(h, h_k, d) per rank of the domain's models under tp 1, 2, 4, 8 (module doc), distinct, in order."""
    from spec.model.config import MODELS

    out = set()
    for m in MODELS.values():
        if m.is_mla or m.head_dim not in (64, 128):
            continue
        for tp in (1, 2, 4, 8):
            if m.num_heads % tp == 0:
                out.add((m.num_heads // tp, max(1, m.num_kv_heads // tp), m.head_dim))
    return tuple(sorted(out))


def _schedules(build: str, h: int, hk: int, d: int, page: int, b: int, msq: int, total: int, length: int,
               defects=frozenset()):
    """(precompute inputs, call schedule) of one point: the precompute bounded by ``b * msq`` (``total_q`` unset),
    the call by its ``total`` real rows; the defect ``total-q-read-by-both`` gives the precompute the call's rows."""
    import dataclasses

    from refmodel.fa3_scheduler import call_inputs, precompute_inputs, resolve_schedule

    common = dict(page_size=page, causal=True, varlen_q=True, build=build)
    pin = precompute_inputs(b, msq, length, h, hk, d, **common)
    if "total-q-read-by-both" in defects:
        pin = dataclasses.replace(pin, total_q=total)
    return pin, resolve_schedule(call_inputs(b, msq, length, h, hk, d, total_q=total, **common))


def total_q_witness(build: str, h: int, hk: int, d: int, page: int, b: int, msq: int, total: int,
                    defects=frozenset()) -> Optional[dict]:
    """Lengths at which the precompute's per-batch splits overflow the call's buffers at ``total`` real rows, or None.

    One sequence of L keys (L from ``SCAN_STEP`` to ``MAX_SCAN_KV``) and b - 1 of 100; the rows spread as evenly as
    ``max_seqlen_q`` allows, the long sequence taking the remainder.
    """
    from refmodel.fa3_scheduler import num_splits_over_lengths

    from spec.invariants import CallLengths, check_all, metadata_for

    lengths = list(range(SCAN_STEP, MAX_SCAN_KV + 1, SCAN_STEP))
    pin, csched = _schedules(build, h, hk, d, page, b, msq, total, SCAN_STEP, defects)
    s_p = num_splits_over_lengths(pin, lengths)
    s_c = num_splits_over_lengths(csched.inputs, lengths)
    base, extra = divmod(total, b)
    qlens = [base + (1 if i < extra else 0) for i in range(b)][::-1]
    if min(qlens) < 1 or max(qlens) > msq:
        return None
    for L, sp, sc in zip(lengths, s_p, s_c):
        if sp <= sc:
            continue
        pin, csched = _schedules(build, h, hk, d, page, b, msq, total, L, defects)
        lens = [L] + [100] * (b - 1)
        P, R = metadata_for(pin, lens, qlens)
        found = check_all(P, R, csched, CallLengths(tuple(lens), tuple(qlens)))
        if found:
            return {"h": h, "h_k": hk, "d": d, "page_size": page, "batch": b, "max_seqlen_q": msq,
                    "precompute_rows": b * msq, "call_rows": total, "seq_lens": lens, "query_lens": qlens,
                    "S_p": P.num_splits, "S_c": csched.num_splits, "invariant": found[0].invariant,
                    "message": found[0].detail}
    return None


def _call_totals(h: int, hk: int, d: int, b: int, msq: int, build: str) -> list:
    """The smallest call total (b <= T < b * msq) of each m-block count below the precompute's, largest first."""
    from refmodel.fa3_scheduler import call_inputs, resolve_schedule

    bm = resolve_schedule(call_inputs(b, msq, 4096, h, hk, d, page_size=1, causal=True, varlen_q=True,
                                      total_q=b, build=build)).block_m
    qhpk = h // hk
    top = -(-(b * msq * qhpk) // bm)
    out = []
    for mb in range(top - 1, 0, -1):
        t = max(b, ((mb - 1) * bm) // qhpk + 1)
        if -(-(t * qhpk) // bm) == mb and t < b * msq:
            out.append(t)
    return out


def total_q_drift(build: str, defects=frozenset(), points=None) -> TheoremResult:
    """``total-q-drift`` under ``build`` (module doc): the first witness found, or none on the domain."""
    name = THEOREMS[1]
    start = time.perf_counter()
    points = total_q_points() if points is None else points
    searched = 0
    for h, hk, d in points:
        for page in (1, 16):
            for b in (4, 8, 16):
                for msq in (2, 4, 8, 16, 64):
                    for total in _call_totals(h, hk, d, b, msq, build):
                        searched += 1
                        found = total_q_witness(build, h, hk, d, page, b, msq, total, defects)
                        if found is None:
                            continue
                        return TheoremResult(
                            name, TheoremVerdict.EXPECTED_REFUTATION, time.perf_counter() - start, {"build": build,
                                                                                        **found},
                            None,
                            f"under {build}: h {h}, h_k {hk}, d {d}, page {page}, b {b}, max_seqlen_q {msq}: the "
                            f"precompute bounds by {b * msq} rows (S_p {found['S_p']}), a call of {total} real rows "
                            f"chooses S_c {found['S_c']}; lengths {found['seq_lens'][:2]}.. give "
                            f"{found['invariant']}. sglang precomputes for decode only, where the call's rows are "
                            f"b * max_seqlen_q: the class, not a finding of a release. Source: {SOURCE_TOTAL_Q}",
                            failed=False, expected=True, details={"points_searched": searched, "build": build})
    return TheoremResult(name, TheoremVerdict.PROVED, time.perf_counter() - start, {}, None,
                         f"under {build}, on {searched} (heads, page, b, max_seqlen_q, call total) points, no call "
                         f"total below b * max_seqlen_q makes the precompute's splits overflow the call's "
                         f"(encoding defects {sorted(defects)})",
                         details={"points_searched": searched, "build": build})


def distinct_tile_builds() -> list:
    """The sglang builds whose tile rules differ (refmodel/tile_size_sm90.json and ``Build.one_mma_wg``): the cover
    query reads nothing else, so builds with equal rules share one answer."""
    from refmodel.fa3_builds import build, tile_rules

    out, seen = [], []
    for name in SGLANG_BUILDS:
        rules = (tile_rules()[name], build(name).one_mma_wg)
        if rules not in seen:
            seen.append(rules)
            out.append(name)
    return out


def wheel_build_jobs(timeout_s: float = 10.0, only=None, defects=frozenset()) -> list:
    """The jobs of theorem 12 (spec.theorems.jobs): the cover theorem under both sglang builds, the total-q search
    under 0.4.5 (whose rule it is)."""
    from spec.theorems.jobs import Job

    defects = frozenset(defects)
    unknown = defects - set(DEFECTS)
    if unknown:
        raise ValueError(f"defects: unknown names {sorted(unknown)}; known: {sorted(DEFECTS)}")
    names = select(only, THEOREMS, lambda t: t.split("-")[0])

    def cover():
        results = [tile_cover(b, timeout_s, defects) for b in distinct_tile_builds()]
        bad = [r for r in results if r.verdict != TheoremVerdict.PROVED]
        if bad:
            return [bad[0]]
        last = results[-1]
        return [dataclasses.replace(last, seconds=sum(r.seconds for r in results),
                                    message=last.message.replace(f"under {last.details['build']}",
                                                                 "under " + " and ".join(SGLANG_BUILDS), 1)
                                    + ("" if len(results) == len(SGLANG_BUILDS) else
                                       " (the builds share their tile table and decode-tile predicate: one query)"))]

    run = {THEOREMS[0]: cover, THEOREMS[1]: lambda: [total_q_drift(SGLANG_KERNEL_045, defects)]}
    weights = {THEOREMS[0]: 0.5, THEOREMS[1]: 2.0}
    return [Job((n,), (run[n],), weight=weights[n], light=n == THEOREMS[0],
                key=(n, timeout_s, tuple(sorted(defects)))) for n in names]


def group_jobs(request) -> list:
    """Theorem 12's jobs for a :class:`spec.theorems.base.ProveRequest` (spec.theorems.jobs_for)."""
    return wheel_build_jobs(timeout_s=request.timeout_s, only=None if request.only is None else list(request.only))

