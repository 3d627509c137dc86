"""Theorem 0: the lemmas the metadata theorems rest on (KV cover of the split ranges; every split is 1
above 992 batches).

Invariant: the per-split KV block ranges of ``hopper/block.h`` tile the key range exactly, and the prepare step
(``hopper/flash_prepare_scheduler.cu``) gives one split per batch when b > 992.
"""

from __future__ import annotations

import time

import z3

from spec.theorems.results import TheoremResult
from spec.theorems.symbolic import bv, solver, sym_dynamic_split, sym_split_block_range, var
from spec.theorems.metadata import SEED
from spec.theorems.z3ctx import Bool, IntVal, Ints, checked
from spec.finding import TheoremVerdict


# ------------------------------------------------------------------------------------------------------------
# Lemmas
# ------------------------------------------------------------------------------------------------------------


def kv_cover_lemma(timeout_s: float = 10.0, sym_range=sym_split_block_range,
                   concrete_range=None, name: str = "kv-cover") -> TheoremResult:
    """KV_COVER by design: for 0 <= n_min <= n_max <= 2^23 and S in 1..256, the S split ranges cover [n_min, n_max) (block.h).

    Three quantifier-free obligations, each an unsat query (the union of intervals [lo(s), hi(s)) for s < S is
    [n_min, n_max) by induction on s): (a) lo(0) = n_min; (b) contiguity hi(s) = min(lo(s+1), n_max) for every
    s < S; (c) the last split reaches the end, hi(S-1) = n_max. Encoded over z3 Ints (nonlinear S*P stays an atom;
    the bit-vector encoding of S*ceil(R/S) >= R times out), valid because every value is a non-negative C int below
    2^31 (n_max <= 2^31/256). A witness is replayed with `concrete_range` over every split (default refmodel's
    `split_block_range`).
    """
    if concrete_range is None:
        from refmodel.kv_blocks import split_block_range as concrete_range
    start = time.perf_counter()
    c = IntVal
    n_min, n_max, S, sv = Ints("n_min n_max S s")
    base = [n_min >= 0, n_min <= n_max, n_max <= 2 ** 31 // 256, S >= 1, S <= 256]
    lo0, _ = sym_range(n_min, n_max, S, c(0))
    lo_s, hi_s = sym_range(n_min, n_max, S, sv)
    lo_s1, _ = sym_range(n_min, n_max, S, sv + 1)
    _, hi_last = sym_range(n_min, n_max, S, S - 1)
    obligations = [
        ("lo(0) = n_min", [n_max > n_min, lo0 != n_min]),  # noqa: E501
        ("hi(s) = min(lo(s+1), n_max)", [sv >= 0, sv < S - 1,
                                          hi_s != z3.If(lo_s1 < n_max, lo_s1, n_max), lo_s < n_max]),
        ("hi(S-1) = n_max", [n_max > n_min, hi_last < n_max]),
    ]
    for label, neg in obligations:
        s = solver(timeout_s, SEED)
        s.add(*base, *neg)
        r = checked(s)
        if r == z3.unknown:
            return TheoremResult(name, TheoremVerdict.INCONCLUSIVE, time.perf_counter() - start,
                                 {"obligation": label}, None,
                                 f"z3 {s.reason_unknown()} on obligation {label}", expected=False)
        if r == z3.sat:
            m = s.model()
            w = {k: m.eval(v, model_completion=True).as_long() for k, v in
                 (("n_min", n_min), ("n_max", n_max), ("num_splits", S))}
            if w["n_max"] - w["n_min"] > 2 ** 16:  # replay on a small instance of the same failure if possible
                s.add(n_max - n_min <= 2 ** 12)
                if checked(s) == z3.sat:
                    m = s.model()
                    w = {k: m.eval(v, model_completion=True).as_long() for k, v in
                         (("n_min", n_min), ("n_max", n_max), ("num_splits", S))}
            covered = set()
            for i in range(w["num_splits"]):
                lo_, hi_ = concrete_range(w["n_min"], w["n_max"], w["num_splits"], i)
                covered.update(range(lo_, hi_))
            missing = sorted(set(range(w["n_min"], w["n_max"])) - covered)
            secs = time.perf_counter() - start
            if not missing:
                return TheoremResult(name, TheoremVerdict.INCONCLUSIVE, secs, {**w, "obligation": label}, None,
                                     f"obligation {label} fails but the ranges still cover concretely", expected=False)
            return TheoremResult(name, TheoremVerdict.REFUTED, secs,
                                 {**w, "uncovered_block": missing[0], "obligation": label,
                                                         "invariant": "KV_COVER"}, None,
                                 f"{label} fails: KV block {missing[0]} of [{w['n_min']}, {w['n_max']}) is in none of "
                                 f"the {w['num_splits']} split ranges", failed=True, expected=False)
    return TheoremResult(name, TheoremVerdict.PROVED, time.perf_counter() - start, {}, None,
                         "the split ranges start at n_min, are contiguous and end at n_max, for every n_max <= 2^23 "
                         "KV blocks and 1..256 splits (hopper/block.h); they use the call's own lengths, so stale "
                         "cache_seqlens never leave keys uncovered")


def prepare_split_lemma(timeout_s: float) -> TheoremResult:
    """The prepare step's split count is in [1, S_static] (and 1 when b > 992), for every n, blocks_per_sm, S."""
    start = time.perf_counter()
    s = solver(timeout_s, SEED)
    n, bps, S = (var(x) for x in ("n", "bps", "S"))
    big_b = Bool("b_over_992")
    s.add(n >= 0, n <= 2 ** 16, bps >= 0, bps <= 2 ** 24, S >= 1, S <= 256)
    split = z3.If(z3.Or(big_b, S == 1), bv(1), sym_dynamic_split(n, bps, S))
    s.add(z3.Or(split < 1, split > S, z3.And(big_b, split != 1)))
    r = checked(s)
    secs = time.perf_counter() - start
    verdict = (TheoremVerdict.PROVED if r == z3.unsat else TheoremVerdict.REFUTED if r == z3.sat
               else TheoremVerdict.INCONCLUSIVE)
    return TheoremResult("batch-over-992", verdict, secs, {}, None,
                         "prepare-split-bound: 1 <= split <= S_static for every n, blocks_per_sm and S; and b > 992 "
                         "(more than one prepare CTA) gives split 1 everywhere (flash_prepare_scheduler.cu): so for "
                         "b > 992 SPLIT_BOUND and COMBINE_CAPACITY hold for any S_c >= 1, and QUERY_COVER is "
                         "per-batch, so the b <= 8 results carry over", failed=verdict == TheoremVerdict.REFUTED,
                         expected=verdict == TheoremVerdict.PROVED)
