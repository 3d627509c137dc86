"""Theorem 8: FA3's own int arithmetic at its edges, as z3 queries over C++-width bit-vectors.

``int32-split-heuristic``: for every head-dim instance and dtype FA3 compiles, is there a KV length
(1 .. 2^31 - 1 tokens) at which the L2 branch of ``num_splits_heuristic`` (``hopper/heuristics.h`` lines 29-34
at 0251105a) returns a split count below 1? It is a statement about FA3 itself, not about a serving policy: z3
finds one for every instance (the 32-bit sum ``size_one_kv_head + 50 MiB - 1`` wraps), the witness is replayed
through refmodel (``get_num_splits`` < 1, and ``mha_fwd``'s call is rejected by ``run_mha_fwd``'s
``num_splits >= 1``, ``flash_api.cpp`` line 371), and the result is an expected refutation: loud and safe, but a
non-causal call over that band of context lengths cannot run. With 64-bit sizes (``int_bits=64``, the
counterfactual fix) the query is unsat. The branch's other conditions (at least 2 x num_SMs m-blocks, which
needs that many kBlockM-row tiles of queries, and not causal/local) are met by the replay's query length.
"""

from __future__ import annotations

import time

import z3

from refmodel.errors import FA3Rejected
from refmodel.fa3_scheduler import call_inputs, get_num_splits, resolve_schedule
from refmodel.l2_split_edges import int32_split_band, replay_rows

from spec.theorems.results import TheoremResult
from spec.theorems.z3ctx import checked
from spec.theorems.symbolic import bv, solver, sym_l2_split_count, var
from spec.theorems.z3ctx import BitVecVal
from spec.theorems.base import select
from spec.finding import Outcome, TheoremVerdict

__all__ = ["THEOREMS", "EDGE_HEAD_DIMS", "run_edge_theorems", "edge_jobs", "int32_split_band", "replay_rows"]

THEOREMS = ("int32-split-heuristic",)

#: (d, dv, element size) instances: FA3's head dims with bf16/fp16, and fp8 where dv <= 256 (flash_api.cpp 788-791).
EDGE_HEAD_DIMS = tuple((d, dv, e) for d, dv in ((64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128),
                                                (64, 256), (64, 512)) for e in (2, 1) if not (e == 1 and dv > 256))
SOURCE = "hopper/heuristics.h@0251105a:29-34; hopper/flash_api.cpp@0251105a:463 (size_one_kv_head), 371 (run_mha_fwd)"


def _replay(d: int, dv: int, elem: int, length: int, num_sm: int) -> dict:
    dtype = "bfloat16" if elem == 2 else "float8_e4m3fn"
    inp = call_inputs(1, replay_rows(num_sm), length, 1, 1, d, headdim_v=dv, qkv_dtype=dtype, num_sm=num_sm)
    s = get_num_splits(inp)
    try:
        resolve_schedule(inp)
        outcome = "accepted"
    except FA3Rejected as exc:
        outcome = f"{Outcome.REJECTED}: {exc.fa3_message}"
    return {"split_count": s, "call": outcome}


def _int32_split_heuristic(timeout_s: float, int_bits: int, num_sm: int = 132) -> TheoremResult:
    name = THEOREMS[0]
    start = time.perf_counter()
    found, unknown = {}, []
    for d, dv, elem in EDGE_HEAD_DIMS:
        bpt = (d + dv) * elem
        s = solver(timeout_s)
        length = var("seqlen_k")
        s.add(length >= 1, length <= bv(2**31 - 1))
        taken, count = sym_l2_split_count(length, bpt, width=int_bits)
        s.add(taken, count < BitVecVal(1, int_bits))
        r = checked(s)
        if r == z3.unknown:
            unknown.append(f"d={d} dv={dv} elem={elem}: {s.reason_unknown()}")
        elif r == z3.sat:
            L = s.model()[length].as_long()
            # report a canonical witness: the first band's lowest length, when z3 confirms it (deterministic)
            lo = int32_split_band(bpt)[0]
            if checked(s, length == bv(lo)) == z3.sat:
                L = lo
            found[f"d{d}-dv{dv}-e{elem}"] = {"headdim": d, "headdim_v": dv, "element_size": elem, "seqlen_k": L,
                                             "band": list(int32_split_band(bpt)), **_replay(d, dv, elem, L, num_sm)}
    secs = time.perf_counter() - start
    details = {"instances": len(EDGE_HEAD_DIMS), "int_bits": int_bits, "witnesses": found, "unknown": unknown,
               "fa3_source": SOURCE, "replay_query_rows": replay_rows(num_sm)}
    if unknown:
        return TheoremResult(name, TheoremVerdict.INCONCLUSIVE, secs, {}, None, f"z3 unknown: {unknown[:3]}",
                             expected=False,
                             details=details)
    if not found:
        return TheoremResult(name, TheoremVerdict.PROVED, secs, {}, None,
                             f"with {int_bits}-bit sizes the L2 branch never gives fewer than 1 split", details=details)
    bad = {k: w for k, w in found.items() if w["split_count"] >= 1 or not w["call"].startswith(Outcome.REJECTED)}
    first = found.get("d128-dv128-e2") or next(iter(found.values()))
    witness = {**first, "invariant": "SPLIT_COUNT_POSITIVE"}
    if bad:
        return TheoremResult(name, TheoremVerdict.INCONCLUSIVE, secs, witness, None,
                             f"z3 witness does not replay through refmodel: {bad}", expected=False, details=details)
    lo, hi = first["band"]
    return TheoremResult(
        name, TheoremVerdict.EXPECTED_REFUTATION, secs, witness, None,
        f"FA3's int L2 split branch gives {first['split_count']} splits for a non-causal call over {lo}..{hi} KV "
        f"tokens (d={first['headdim']}, bf16) with >= {replay_rows(num_sm)} query rows; the call is rejected "
        f"(run_mha_fwd: num_splits >= 1): loud and safe, but that band cannot run. {len(found)} of "
        f"{len(EDGE_HEAD_DIMS)} instances. Source: {SOURCE}", failed=False, expected=True, details=details)


def run_edge_theorems(timeout_s: float = 10.0, only=None, int_bits: int = 32) -> list[TheoremResult]:
    """Theorem 8's results (selected like every theorem group; `int_bits` 64 is the counterfactual FA3)."""
    from spec.theorems.jobs import run_jobs

    return run_jobs(edge_jobs(timeout_s, only, int_bits)).results


def edge_jobs(timeout_s: float = 10.0, only=None, int_bits: int = 32) -> list:
    """The jobs of :func:`run_edge_theorems` (spec.theorems.jobs): one per theorem."""
    from spec.theorems.jobs import Job

    names = select(only, THEOREMS, lambda t: t.split("-")[0])
    return [Job((name,), (lambda: [_int32_split_heuristic(timeout_s, int_bits)],), weight=0.25, light=True,
                key=(name, timeout_s, int_bits))
            for name in names]


def group_jobs(request) -> list:
    """FA3's int-edge theorems' jobs for a :class:`spec.theorems.base.ProveRequest` (spec.theorems.jobs_for)."""
    return edge_jobs(timeout_s=request.timeout_s, only=None if request.only is None else list(request.only))
