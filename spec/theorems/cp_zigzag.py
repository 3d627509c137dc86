"""Theorem 6: sglang's zigzag prefill-CP split (``python/sglang/srt/layers/cp/zigzag.py``,
``ZigzagCPStrategy.build_metadata``) as z3 terms.

Invariant: for every cp in 2..8 and every L >= 2cp, the 2cp blocks are non-empty and partition the sequence, the
ownership map is a bijection, each half's kv_len is the causal extent of its block, and the per-rank token
counts of one sequence differ by at most 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable

import z3

from spec.theorems.results import TheoremResult
from spec.theorems.z3ctx import solve as _solve
from spec.theorems.z3ctx import Ints as _Ints
from spec.theorems.z3ctx import IntVal as _IntVal
from spec.theorems.z3ctx import BoolVal as _BoolVal

from spec.theorems.base import theorem_result
from spec.theorems.cp_common import CP_SIZES, model_int
from spec.finding import TheoremVerdict


# --------------------------------------------------------------------------------------------
# Theorem 6: the zigzag split, as z3 terms (concrete values give concrete terms).
# --------------------------------------------------------------------------------------------


@dataclass
class ZigzagTerms:
    """The zigzag layout of one sequence as z3 integer terms (``ZigzagCPStrategy.build_metadata``).

    ``blocks[i]``, ``starts[i]``, ``ends[i]`` per block; ``owned[r] = (prev_block, next_block)`` (Python ints,
    possibly out of range under a defect); ``kv_prev[r]``, ``kv_next[r]``, ``q_prev[r]``, ``q_next[r]`` and
    ``tokens[r]`` per rank.
    """

    cp: int
    length: Any
    prefix: Any
    base: Any
    rem: Any
    blocks: list
    starts: list
    ends: list
    owned: list
    kv_prev: list
    kv_next: list
    q_prev: list
    q_next: list
    tokens: list


def zigzag_terms(cp: int, length: Any, prefix: Any = 0, defects: Iterable[str] = ()) -> ZigzagTerms:
    """The zigzag split of one sequence of ``length`` extend tokens over ``cp`` ranks, as z3 terms (zigzag.py build_metadata).

    Invariant: with no defect, block ``i`` has ``L // 2cp + (i < L % 2cp)`` tokens, rank r owns blocks
    ``(r, 2cp-1-r)`` and its kv lengths are ``prefix + sum(blocks[:r+1])`` / ``prefix + sum(blocks[:2cp-r])``.
    ``length``/``prefix`` may be ints or z3 Int terms; a block index outside ``[0, 2cp)`` owns 0 tokens.
    """
    defects = frozenset(defects)
    if not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp: must be an int >= 1, got {cp!r}")
    seg = 2 * cp
    length = _IntVal(length) if isinstance(length, int) else length
    prefix = _IntVal(prefix) if isinstance(prefix, int) else prefix
    base, rem = length / seg, length % seg  # z3 Int div/mod: floor semantics for a positive divisor
    if "zigzag-off-by-one" in defects:
        blocks = [base + z3.If(i <= rem, 1, 0) for i in range(seg)]
    else:
        blocks = [base + z3.If(i < rem, 1, 0) for i in range(seg)]
    starts, ends, acc = [], [], _IntVal(0)
    for b in blocks:
        starts.append(acc)
        acc = acc + b
        ends.append(acc)

    def size(i: int):
        return blocks[i] if 0 <= i < seg else _IntVal(0)

    def prefix_sum(count: int):  # sum(blocks[:count]) with Python slice semantics
        count = max(0, min(count, seg))
        return z3.Sum(blocks[:count]) if count else _IntVal(0)

    owned, kv_prev, kv_next, q_prev, q_next, tokens = [], [], [], [], [], []
    for r in range(cp):
        nxt = seg - r if "zigzag-owner-off-by-one" in defects else seg - 1 - r
        owned.append((r, nxt))
        kv_prev.append(prefix + prefix_sum(r + 1))
        next_count = seg - 1 - r if "zigzag-kvlen-off-by-one" in defects else seg - r
        kv_next.append(prefix + prefix_sum(next_count))
        q_prev.append(size(r))
        q_next.append(size(nxt))
        tokens.append(size(r) + size(nxt))
    return ZigzagTerms(cp, length, prefix, base, rem, blocks, starts, ends, owned, kv_prev, kv_next,
                       q_prev, q_next, tokens)


def zigzag_concrete(cp: int, length: int, prefix: int = 0, defects: Iterable[str] = ()) -> dict[str, Any]:
    """:func:`zigzag_terms` evaluated at concrete ``length``/``prefix`` (Python ints), for comparison with implementations."""
    t = zigzag_terms(cp, int(length), int(prefix), defects)

    def ev(x):
        return z3.simplify(x).as_long()

    return {
        "blocks": [ev(b) for b in t.blocks],
        "bounds": [(ev(s), ev(e)) for s, e in zip(t.starts, t.ends)],
        "owned": list(t.owned),
        "kv_prev": [ev(k) for k in t.kv_prev],
        "kv_next": [ev(k) for k in t.kv_next],
        "q_prev": [ev(q) for q in t.q_prev],
        "q_next": [ev(q) for q in t.q_next],
        "tokens": [ev(x) for x in t.tokens],
    }


def _causal_ok(t: ZigzagTerms, block: int, kv: Any, q_len: Any, j: Any):
    """Query ``j`` of a half (bottom-right causal: sees ``[0, kv - q_len + j + 1)``) sees exactly its causal prefix."""
    seg = 2 * t.cp
    if not 0 <= block < seg:
        return _BoolVal(False)
    start = t.starts[block]
    in_block = z3.And(j >= 0, j < q_len)
    return z3.And(
        kv <= t.prefix + t.length,  # never reads past the gathered sequence
        z3.Implies(in_block, kv - q_len + j + 1 == t.prefix + start + j + 1),
    )


def _partition_claims(t: ZigzagTerms, p: Any, j: Any) -> dict[str, Any]:
    """The named conjuncts of ``zigzag-partition`` for one cp, over symbolic length/prefix/position p/offset j."""
    seg = 2 * t.cp
    claims: dict[str, Any] = {}
    claims["blocks_nonempty"] = z3.And([b >= 1 for b in t.blocks])
    claims["blocks_cover_L"] = z3.And(t.starts[0] == 0, t.ends[-1] == t.length)
    in_range = z3.And(p >= 0, p < t.length)
    claims["each_position_in_one_block"] = z3.Implies(
        in_range, z3.Sum([z3.If(z3.And(s <= p, p < e), 1, 0) for s, e in zip(t.starts, t.ends)]) == 1)
    owner_count = [sum(1 for pair in t.owned for x in pair if x == i) for i in range(seg)]
    in_bounds = all(0 <= x < seg for pair in t.owned for x in pair)
    claims["ownership_bijective"] = _BoolVal(in_bounds and all(c == 1 for c in owner_count))
    claims["kv_prev_causal"] = z3.And([_causal_ok(t, prv, kv, q, j)
                                       for (prv, _), kv, q in zip(t.owned, t.kv_prev, t.q_prev)])
    claims["kv_next_causal"] = z3.And([_causal_ok(t, nxt, kv, q, j)
                                       for (_, nxt), kv, q in zip(t.owned, t.kv_next, t.q_next)])
    claims["rank_tokens_sum_to_L"] = z3.Sum(t.tokens) == t.length
    return claims


def _zigzag_witness(model: z3.ModelRef, cp: int, length: Any, prefix: Any, p: Any, j: Any,
                    defects: frozenset, violated: list[str]) -> dict[str, Any]:
    concrete = zigzag_concrete(cp, model_int(model, length), model_int(model, prefix), defects)
    return {"cp": cp, "L": model_int(model, length), "prefix": model_int(model, prefix),
            "position": model_int(model, p), "query_offset": model_int(model, j), "violated": violated, "defects": sorted(defects), **concrete}


def theorem_zigzag_partition(timeout_s: float, defects: frozenset) -> TheoremResult:
    name = "zigzag-partition"
    t0 = time.perf_counter()
    per_cp: dict[int, Any] = {}
    for cp in CP_SIZES:
        tq = time.perf_counter()
        length, prefix, p, j = _Ints(f"L{cp} prefix{cp} p{cp} j{cp}")
        t = zigzag_terms(cp, length, prefix, defects)
        claims = _partition_claims(t, p, j)
        domain = [length >= 2 * cp, prefix >= 0]
        res, model = _solve(domain + [z3.Not(z3.And(list(claims.values())))], timeout_s)
        per_cp[cp] = {"result": res, "seconds": round(time.perf_counter() - tq, 3)}
        if res == "sat":
            violated = [k for k, c in claims.items() if z3.is_false(model.eval(c, model_completion=True))]
            witness = _zigzag_witness(model, cp, length, prefix, p, j, defects, violated)
            return theorem_result(name, TheoremVerdict.REFUTED, t0, witness,
                           f"cp={cp}: {', '.join(violated)} fails at L={witness['L']}", {"per_cp": per_cp})
        if res == "unknown":
            return theorem_result(name, TheoremVerdict.INCONCLUSIVE, t0, {},
                                  f"cp={cp}: z3 returned unknown (timeout {timeout_s}s)",
                           {"per_cp": per_cp})
    return theorem_result(name, TheoremVerdict.PROVED, t0, {},
                   "cp 2..8, every L >= 2cp and prefix >= 0: the 2cp blocks are non-empty and partition [0, L), "
                   "(rank, half) -> block is a bijection, kv_len_prev/next are the causal extents of their blocks",
                   {"per_cp": per_cp})


def theorem_zigzag_balance(timeout_s: float, defects: frozenset) -> TheoremResult:
    """Per-rank token counts of one sequence differ by <= 1; details: tightness, when equal, the batch bound."""
    name = "zigzag-balance"
    t0 = time.perf_counter()
    per_cp: dict[int, Any] = {}
    findings: dict[str, Any] = {}
    max_batch = 3
    for cp in CP_SIZES:
        tq = time.perf_counter()
        length, prefix = _Ints(f"bL{cp} bprefix{cp}")
        t = zigzag_terms(cp, length, prefix, defects)
        domain = [length >= 2 * cp, prefix >= 0]
        pairs = [(a, b) for a in range(cp) for b in range(cp) if a != b]
        bound = z3.And([t.tokens[a] - t.tokens[b] <= 1 for a, b in pairs])
        res, model = _solve(domain + [z3.Not(bound)], timeout_s)
        entry: dict[str, Any] = {"result": res}
        if res == "sat":
            counts = [model_int(model, x) for x in t.tokens]
            witness = {"cp": cp, "L": model_int(model, length), "rank_tokens": counts,
                       "spread": max(counts) - min(counts), "defects": sorted(defects),
                       **zigzag_concrete(cp, model_int(model, length), 0, defects)}
            per_cp[cp] = entry
            return theorem_result(name, TheoremVerdict.REFUTED, t0, witness,
                           f"cp={cp}, L={witness['L']}: per-rank tokens {counts} differ by {witness['spread']} > 1",
                           {"per_cp": per_cp})
        if res == "unknown":
            per_cp[cp] = entry
            return theorem_result(name, TheoremVerdict.INCONCLUSIVE, t0, {},
                                  f"cp={cp}: z3 returned unknown (timeout {timeout_s}s)",
                           {"per_cp": per_cp})
        # Tightness, and exactly when the counts are equal (rem in {0, cp}).
        equal = z3.And([t.tokens[a] == t.tokens[b] for a, b in pairs])
        r_tight, m_tight = _solve(domain + [z3.Or([t.tokens[a] - t.tokens[b] == 1 for a, b in pairs])], timeout_s)
        entry["bound_1_tight"] = r_tight == "sat"
        if m_tight is not None:
            entry["tight_example_L"] = model_int(m_tight, length)
        r_eq, _ = _solve(domain + [equal != z3.Or(t.rem == 0, t.rem == cp)], timeout_s)
        entry["equal_iff_rem_in_0_or_cp"] = r_eq == "unsat"
        # A batch of b sequences: per-rank totals differ by at most b, and b is reached.
        batch: dict[int, Any] = {}
        for b in range(1, max_batch + 1):
            lens = _Ints(" ".join(f"bb{cp}_{b}_{i}" for i in range(b)))
            terms = [zigzag_terms(cp, x, 0, defects) for x in lens]
            totals = [z3.Sum([tt.tokens[r] for tt in terms]) for r in range(cp)]
            dom = [x >= 2 * cp for x in lens]
            r_le, _ = _solve(dom + [z3.Or([totals[a] - totals[c] > b for a, c in pairs])], timeout_s)
            r_at, _ = _solve(dom + [z3.Or([totals[a] - totals[c] == b for a, c in pairs])], timeout_s)
            batch[b] = {"spread_le_b": r_le == "unsat", "spread_b_reached": r_at == "sat"}
        entry["batch_spread"] = batch
        entry["seconds"] = round(time.perf_counter() - tq, 3)
        per_cp[cp] = entry
    findings["per_sequence_bound"] = 1
    findings["tight"] = all(e.get("bound_1_tight") for e in per_cp.values())
    findings["equal_iff_rem_in_0_or_cp"] = all(e.get("equal_iff_rem_in_0_or_cp") for e in per_cp.values())
    findings["batch_spread_bound"] = (
        f"b sequences: per-rank totals differ by at most b (checked b = 1..{max_batch}, all cp), and b is reached"
        if all(v["spread_le_b"] and v["spread_b_reached"] for e in per_cp.values()
               for v in e["batch_spread"].values()) else "see per_cp")
    return theorem_result(name, TheoremVerdict.PROVED, t0, {},
                   "cp 2..8, every L >= 2cp: per-rank token counts of one sequence differ by at most 1 "
                   "(tight; equal iff L mod 2cp is 0 or cp); a batch of b sequences can differ by b",
                   {"per_cp": per_cp, "findings": findings})
