"""Theorems 6 and 7 of issue 3: the zigzag prefill-CP partition, and the eager runner's CP-metadata hygiene.

Sources modelled (read, not copied; FACTS.md section 3):

* ``ZigzagCPStrategy.build_metadata`` in sglang ``python/sglang/srt/layers/cp/zigzag.py``: a sequence's
  ``L`` extend tokens are cut into ``2*cp`` blocks, ``base = L // (2cp)``, ``rem = L % (2cp)``, block ``i`` has
  ``base + 1`` tokens if ``i < rem`` else ``base``; rank ``r`` owns blocks ``r`` and ``2cp-1-r``;
  ``kv_len_prev = prefix + sum(blocks[:r+1])``, ``kv_len_next = prefix + sum(blocks[:2cp-r])``.
  FA3 then runs each half causally with ``cache_seqlens = kv_len`` and the half's tokens as the last
  ``q_len`` queries (bottom-right aligned causal mask: query ``j`` of ``q_len`` sees keys ``[0, K - q_len + j + 1)``).
* The eager runner's extend step (sglang ``model_executor`` eager runner, ``prepare_cp_forward`` in
  ``python/sglang/srt/layers/cp/utils.py``, ``ForwardMode.is_context_parallel_extend`` in
  ``forward_batch_info.py`` -- EXTEND and MIXED -- and the FA3 backend's CP gate), with PR #30439's fix:
  clear ``attn_cp_metadata`` when CP-v2 is not active for the batch.

Theorem 6 (``zigzag_partition``, ``zigzag_balance``), for every ``cp`` in 2..8 and symbolic ``L >= 2cp``,
``prefix >= 0`` (z3 integers, unbounded): the blocks are non-empty and partition ``[0, L)`` (every position
lies in exactly one block); the ownership map is a bijection from (rank, half) to blocks; each half's
``kv_len`` is the causal extent of its block (``prefix + end``), so every query token sees exactly its causal
prefix and nothing past the sequence; and the per-rank token counts of one sequence differ by at most 1.
The bound is tight, the counts are equal iff ``rem`` is 0 or ``cp``, and over a batch of ``b`` sequences the
per-rank totals differ by at most ``b`` (tight) -- reported in ``details``.

Theorem 7 (``runner_hygiene``, ``runner_freshness``): bounded model checking (z3, unrolled up to ``k``
steps, default 6) of the runner as a transition system, plus a 1-step induction for every length:

* state: the ``attn_cp_metadata`` the forward-batch object holds: ``None`` (-1) or "built for step j" (j);
* input per step: a batch kind (CP-v2 extend; non-CP extend -- an EXTEND that CP-v2 cannot split, e.g. an
  extend length below ``2cp``; MIXED; DECODE) and how it arrives: ``fresh`` (a new object, no metadata),
  ``carried`` (a reused object still holding what the previous step left -- how a MIXED or short extend
  batch formed from the running batch can carry CP metadata) or ``built`` (metadata built with this batch;
  only a CP-v2 extend, since only ``prepare_cp_forward`` builds metadata and it asserts CP-v2 is active).
  By default a CP-v2 extend never arrives ``carried`` (sglang builds a new batch object for a new extend;
  ``gpu_impl.runner`` assumes the same); ``cp_v2_may_inherit=True`` drops that assumption;
* step: DECODE clears the field (``prepare_for_decode``); a CP-v2-active batch (mode EXTEND; MIXED never)
  runs ``prepare_cp_forward``, which builds metadata only if the field is None; an inactive batch has the field
  cleared iff the fix is in (``clear_stale``); the backend takes the CP path iff the mode is a CP extend
  (EXTEND or MIXED), the field is not None and ``attn_cp_size > 1`` (taken as given: CP-v2 needs it).

``runner_hygiene`` -- the CP path is taken iff the batch is CP-v2 active -- and ``runner_freshness`` --
whenever the CP path is taken, the metadata was built for the current batch -- are proved with the fix (for
every sequence length by induction; BMC up to ``k`` agrees) and refuted without it: the shortest witness is a
CP-v2 extend followed by a MIXED (or non-CP extend) batch carrying its metadata. Finding, in
``runner_freshness``'s details: if a CP-v2 extend could arrive on a reused object, two consecutive CP-v2
extends would share the first one's metadata even with the fix (``prepare_cp_forward`` keeps any non-None
object); clearing before every ``prepare_cp_forward``, as sglang's prefill CUDA-graph path does, closes that.

Layering: this module imports nothing from ``gpu_impl`` or ``fa3verify``; tests compare it with them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

import z3

from spec.results import TheoremResult


from spec.z3ctx import ctx as _ctx
from spec.theorems import own_defects, select, theorem_result
from spec.z3ctx import isolated as _isolated
from spec.z3ctx import solve as _solve
from spec.z3ctx import Int as _Int
from spec.z3ctx import Ints as _Ints
from spec.z3ctx import Bool as _Bool
from spec.z3ctx import IntVal as _IntVal
from spec.z3ctx import BoolVal as _BoolVal


__all__ = [
    "DEFECTS",
    "THEOREMS",
    "THEOREM_NUMBERS",
    "CP_SIZES",
    "KINDS",
    "ARRIVALS",
    "zigzag_terms",
    "zigzag_concrete",
    "runner_step",
    "runner_step_z3",
    "simulate_runner",
    "run_cp_theorems",
]

#: Seeded defects for negative controls: name -> description.
DEFECTS: dict[str, str] = {
    "zigzag-off-by-one": "block i gets base+1 tokens for i <= rem (instead of i < rem)",
    "zigzag-owner-off-by-one": "rank r owns blocks r and 2cp-r (instead of 2cp-1-r)",
    "zigzag-kvlen-off-by-one": "kv_len_next = prefix + sum(blocks[:2cp-1-r]) (one block short)",
}

#: Theorem names in the order they run, and their numbers in issue 3.
THEOREMS = ("zigzag_partition", "zigzag_balance", "runner_hygiene", "runner_freshness")
THEOREM_NUMBERS = {"zigzag_partition": "6", "zigzag_balance": "6", "runner_hygiene": "7", "runner_freshness": "7"}

#: The CP sizes theorem 6 covers.
CP_SIZES = tuple(range(2, 9))

#: Batch kinds of theorem 7, in encoding order.
KINDS = ("CP_V2_EXTEND", "NON_CP_EXTEND", "MIXED", "DECODE")
#: How a batch arrives at the runner, in encoding order.
ARRIVALS = ("fresh", "carried", "built")

_CP_V2, _NON_CP, _MIXED, _DECODE = range(4)
_FRESH, _CARRIED, _BUILT = range(3)
_NONE = -1


# --------------------------------------------------------------------------------------------
# Common plumbing.
# --------------------------------------------------------------------------------------------


def _int(model: z3.ModelRef, term: Any) -> int:
    return model.eval(term, model_completion=True).as_long()


_result = theorem_result


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
    """The named conjuncts of ``zigzag_partition`` for one cp, over symbolic length/prefix/position p/offset j."""
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
    concrete = zigzag_concrete(cp, _int(model, length), _int(model, prefix), defects)
    return {"cp": cp, "L": _int(model, length), "prefix": _int(model, prefix), "position": _int(model, p),
            "query_offset": _int(model, j), "violated": violated, "defects": sorted(defects), **concrete}


def _theorem_zigzag_partition(timeout_s: float, defects: frozenset) -> TheoremResult:
    name = "zigzag_partition"
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
            return _result(name, "refuted", t0, witness,
                           f"cp={cp}: {', '.join(violated)} fails at L={witness['L']}", {"per_cp": per_cp})
        if res == "unknown":
            return _result(name, "inconclusive", t0, {}, f"cp={cp}: z3 returned unknown (timeout {timeout_s}s)",
                           {"per_cp": per_cp})
    return _result(name, "proved", t0, {},
                   "cp 2..8, every L >= 2cp and prefix >= 0: the 2cp blocks are non-empty and partition [0, L), "
                   "(rank, half) -> block is a bijection, kv_len_prev/next are the causal extents of their blocks",
                   {"per_cp": per_cp})


def _theorem_zigzag_balance(timeout_s: float, defects: frozenset) -> TheoremResult:
    """Per-rank token counts of one sequence differ by <= 1; details: tightness, when equal, the batch bound."""
    name = "zigzag_balance"
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
            counts = [_int(model, x) for x in t.tokens]
            witness = {"cp": cp, "L": _int(model, length), "rank_tokens": counts,
                       "spread": max(counts) - min(counts), "defects": sorted(defects),
                       **zigzag_concrete(cp, _int(model, length), 0, defects)}
            per_cp[cp] = entry
            return _result(name, "refuted", t0, witness,
                           f"cp={cp}, L={witness['L']}: per-rank tokens {counts} differ by {witness['spread']} > 1",
                           {"per_cp": per_cp})
        if res == "unknown":
            per_cp[cp] = entry
            return _result(name, "inconclusive", t0, {}, f"cp={cp}: z3 returned unknown (timeout {timeout_s}s)",
                           {"per_cp": per_cp})
        # Tightness, and exactly when the counts are equal (rem in {0, cp}).
        equal = z3.And([t.tokens[a] == t.tokens[b] for a, b in pairs])
        r_tight, m_tight = _solve(domain + [z3.Or([t.tokens[a] - t.tokens[b] == 1 for a, b in pairs])], timeout_s)
        entry["bound_1_tight"] = r_tight == "sat"
        if m_tight is not None:
            entry["tight_example_L"] = _int(m_tight, length)
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
    return _result(name, "proved", t0, {},
                   "cp 2..8, every L >= 2cp: per-rank token counts of one sequence differ by at most 1 "
                   "(tight; equal iff L mod 2cp is 0 or cp); a batch of b sequences can differ by b",
                   {"per_cp": per_cp, "findings": findings})


# --------------------------------------------------------------------------------------------
# Theorem 7: the runner as a transition system.
# --------------------------------------------------------------------------------------------


class _Py:
    """Concrete operations for :func:`_step` (Python values)."""

    @staticmethod
    def ite(c, a, b):
        return a if c else b

    @staticmethod
    def and_(*xs):
        return all(xs)

    @staticmethod
    def or_(*xs):
        return any(xs)

    @staticmethod
    def not_(x):
        return not x


class _Z3:
    """Symbolic operations for :func:`_step` (z3 terms)."""

    @staticmethod
    def ite(c, a, b):
        if isinstance(c, bool):
            return a if c else b
        return z3.If(c, a, b)

    @staticmethod
    def and_(*xs):
        return z3.And(*xs)

    @staticmethod
    def or_(*xs):
        return z3.Or(*xs)

    @staticmethod
    def not_(x):
        return z3.Not(x)


def _step(ops: Any, state: Any, kind: Any, arrival: Any, t: Any, clear_stale: bool,
          clear_always: bool = False, mixed_active: bool = False) -> dict[str, Any]:
    """One eager-runner step, written once over ``ops`` (concrete or z3); see the module docstring."""
    carried = ops.ite(arrival == _FRESH, _NONE, ops.ite(arrival == _BUILT, t, state))
    loaded = ops.ite(kind == _DECODE, _NONE, carried)  # prepare_for_decode clears it
    active = ops.or_(kind == _CP_V2, kind == _MIXED) if mixed_active else (kind == _CP_V2)
    before_prepare = _NONE if clear_always else loaded
    after = ops.ite(active, ops.ite(before_prepare == _NONE, t, before_prepare),
                    _NONE if clear_stale else loaded)
    cp_extend_mode = ops.or_(kind == _CP_V2, kind == _NON_CP, kind == _MIXED)
    cp_path = ops.and_(cp_extend_mode, after != _NONE)
    return {"active": active, "metadata": after, "cp_path": cp_path}


def runner_step(state: int, kind: int, arrival: int, t: int, clear_stale: bool = True,
                clear_always: bool = False, mixed_active: bool = False) -> dict[str, Any]:
    """One concrete eager-runner step: the CP-v2 decision, the metadata afterwards, and whether the backend takes the CP path.

    Invariant modelled: ``prepare_cp_forward`` builds only when the field is None (cp/utils.py); the fix clears
    it on inactive steps; the backend's CP gate is CP-extend mode and metadata present (FACTS.md section 1).
    ``state``/``metadata`` are -1 for None or the step the metadata was built for; ``clear_always`` clears
    before every ``prepare_cp_forward`` (the stronger fix), ``mixed_active`` lets MIXED batches count as CP-v2
    active (the gate before MIXED was excluded).
    """
    if arrival == _BUILT and kind != _CP_V2:
        raise ValueError("only a CP-v2 extend can arrive with metadata built for itself")
    return _step(_Py, state, kind, arrival, t, clear_stale, clear_always, mixed_active)


def runner_step_z3(state: Any, kind: Any, arrival: Any, t: int, clear_stale: bool = True,
                   clear_always: bool = False, mixed_active: bool = False) -> dict[str, Any]:
    """The same step as :func:`runner_step` over z3 terms (the transition relation BMC unrolls; eager runner + cp/utils.py)."""
    return _step(_Z3, state, kind, arrival, _IntVal(t) if isinstance(t, int) else t, clear_stale,
                 clear_always, mixed_active)


def simulate_runner(steps: Sequence[tuple[int, int]], clear_stale: bool = True, clear_always: bool = False,
                    mixed_active: bool = False) -> list[dict[str, Any]]:
    """Run :func:`runner_step` over ``(kind, arrival)`` pairs from an empty state; one record per step (eager runner)."""
    state, out = _NONE, []
    for t, (kind, arrival) in enumerate(steps):
        rec = runner_step(state, kind, arrival, t, clear_stale, clear_always, mixed_active)
        out.append(rec)
        state = rec["metadata"]
    return out


def _arrival_domain(kind: Any, arrival: Any, cp_v2_may_inherit: bool) -> list[Any]:
    """Which arrivals a batch kind can have (see the module docstring)."""
    dom = [kind >= 0, kind <= _DECODE, arrival >= 0, arrival <= _BUILT, z3.Implies(arrival == _BUILT, kind == _CP_V2)]
    if not cp_v2_may_inherit:
        dom.append(z3.Implies(kind == _CP_V2, arrival != _CARRIED))
    return dom


def _inputs(k: int, tag: str, cp_v2_may_inherit: bool) -> tuple[list, list, list]:
    kinds = [_Int(f"{tag}_kind{t}") for t in range(k)]
    arrivals = [_Int(f"{tag}_arr{t}") for t in range(k)]
    dom = []
    for kd, ar in zip(kinds, arrivals):
        dom += _arrival_domain(kd, ar, cp_v2_may_inherit)
    return kinds, arrivals, dom


def _unroll(k: int, tag: str, cp_v2_may_inherit: bool = False, **policy) -> tuple[list, list, list, list]:
    kinds, arrivals, dom = _inputs(k, tag, cp_v2_may_inherit)
    state, recs = _IntVal(_NONE), []
    for t in range(k):
        rec = runner_step_z3(state, kinds[t], arrivals[t], t, **policy)
        recs.append(rec)
        state = rec["metadata"]
    return kinds, arrivals, dom, recs


def _prop(which: str, rec: dict[str, Any], t: Any):
    if which == "hygiene":
        return rec["cp_path"] == rec["active"]
    return z3.Implies(rec["cp_path"], rec["metadata"] == t)


def _bmc(which: str, max_k: int, timeout_s: float, prefer_kind: Optional[int] = None,
         cp_v2_may_inherit: bool = False, **policy) -> dict[str, Any]:
    """Shortest violation of the property at the last of k steps, k = 1..max_k; ``prefer_kind`` is tried first."""
    per_k: dict[int, str] = {}
    for k in range(1, max_k + 1):
        kinds, arrivals, dom, recs = _unroll(k, f"{which}{k}", cp_v2_may_inherit, **policy)
        bad = z3.Not(_prop(which, recs[-1], k - 1))
        model = None
        if prefer_kind is not None:
            res, model = _solve(dom + [bad, kinds[-1] == prefer_kind], timeout_s)
            if res != "sat":
                model = None
        if model is None:
            res, model = _solve(dom + [bad], timeout_s)
        per_k[k] = res
        if res == "sat":
            seq = [[KINDS[_int(model, kd)], ARRIVALS[_int(model, ar)]] for kd, ar in zip(kinds, arrivals)]
            trace = simulate_runner([(KINDS.index(a), ARRIVALS.index(b)) for a, b in seq], **policy)
            violating = []
            for kind in range(len(KINDS)):  # which kinds can be the violating step at this length
                r2, _ = _solve(dom + [bad, kinds[-1] == kind], timeout_s)
                if r2 == "sat":
                    violating.append(KINDS[kind])
            return {"result": "sat", "k": k, "per_k": per_k, "sequence": seq,
                    "trace": [{"cp_v2_active": r["active"], "cp_path": r["cp_path"],
                               "metadata_built_for_step": None if r["metadata"] == _NONE else r["metadata"]}
                              for r in trace],
                    "violating_kinds_at_this_length": violating}
        if res == "unknown":
            return {"result": "unknown", "k": k, "per_k": per_k}
    return {"result": "unsat", "k": max_k, "per_k": per_k}


def _induction(which: str, timeout_s: float, cp_v2_may_inherit: bool = False, **policy) -> str:
    """1-step induction: from any state of the reachable shape (None, or built for an earlier step) the
    property holds after one more step, so it holds for sequences of every length."""
    t = _Int(f"ind_{which}_t")
    state = _Int(f"ind_{which}_state")
    kind, arrival = _Ints(f"ind_{which}_kind ind_{which}_arr")
    dom = [t >= 0, z3.Or(state == _NONE, z3.And(state >= 0, state < t))]
    dom += _arrival_domain(kind, arrival, cp_v2_may_inherit)
    rec = runner_step_z3(state, kind, arrival, t, **policy)
    res, _ = _solve(dom + [z3.Not(_prop(which, rec, t))], timeout_s)
    return res


def _theorem_runner(which: str, timeout_s: float, clear_stale: bool, max_k: int,
                    cp_v2_may_inherit: bool) -> TheoremResult:
    name = f"runner_{which}"
    t0 = time.perf_counter()
    policy = {"clear_stale": clear_stale, "cp_v2_may_inherit": cp_v2_may_inherit}
    bmc = _bmc(which, max_k, timeout_s, prefer_kind=_MIXED if which == "hygiene" else None, **policy)
    details: dict[str, Any] = {"bmc": bmc, "policy": policy, "max_k": max_k}
    if which == "freshness" and clear_stale:
        # What the fix does not cover: a CP-v2 extend that inherits a previous CP-v2 step's metadata.
        inherit = _bmc(which, max_k, timeout_s, clear_stale=True, cp_v2_may_inherit=True)
        details["if_cp_v2_steps_may_inherit"] = {
            "result": inherit["result"], "sequence": inherit.get("sequence"),
            "fixed_by_clear_before_every_prepare": {
                "bmc": _bmc(which, max_k, timeout_s, clear_stale=True, clear_always=True,
                            cp_v2_may_inherit=True)["result"],
                "induction": _induction(which, timeout_s, clear_stale=True, clear_always=True,
                                        cp_v2_may_inherit=True)},
        }
    if bmc["result"] == "unknown":
        return _result(name, "inconclusive", t0, {}, f"BMC: z3 returned unknown at k={bmc['k']}", details)
    if bmc["result"] == "sat":
        witness = {"sequence": [kind for kind, _ in bmc["sequence"]], "arrivals": [a for _, a in bmc["sequence"]],
                   "length": bmc["k"], "trace": bmc["trace"],
                   "violating_kinds_at_this_length": bmc["violating_kinds_at_this_length"],
                   "clear_stale": clear_stale, "cp_v2_may_inherit": cp_v2_may_inherit}
        return _result(name, "refuted", t0, witness,
                       f"{which} fails after {bmc['k']} steps: "
                       + " -> ".join(f"{k} ({a})" for k, a in bmc["sequence"]), details)
    ind = _induction(which, timeout_s, **policy)
    details["induction"] = ind
    claim = ("the backend takes the CP path iff the batch is CP-v2 active" if which == "hygiene" else
             "whenever the backend takes the CP path, the metadata was built for the current batch")
    if ind == "unsat":
        return _result(name, "proved", t0, {},
                       f"{claim}: for every sequence length (1-step induction); BMC up to k={max_k} agrees", details)
    return _result(name, "proved", t0, {},
                   f"{claim}: for every sequence of up to {max_k} steps (bounded; induction {ind})", details)


# --------------------------------------------------------------------------------------------
# Entry point.
# --------------------------------------------------------------------------------------------


def _check_defects(defects: Iterable[str]) -> frozenset:
    return own_defects(defects, DEFECTS)


def _select(only: Optional[Iterable[str]]) -> list[str]:
    return select(only, THEOREMS, THEOREM_NUMBERS.get)


#: A replayable scenario per batch kind (attn_cp_size 4, so 2*cp = 8): what a runner case file holds.
CASE_SERVER = {"tp_size": 4, "dp_size": 1, "attn_cp_size": 4, "enable_dp_attention": False,
               "enable_prefill_cp": True, "cp_strategy": "zigzag", "page_size": 1, "num_splits": 0,
               "enable_deterministic_inference": False, "cuda_graph": False, "num_sm": 132, "context_length": 32768}
CASE_MODEL = {"name": "qwen3-30b-a3b", "num_heads": 32, "num_kv_heads": 4, "head_dim": 128, "head_dim_v": 128,
              "dtype": "bfloat16", "is_mla": False, "has_sliding_window_layers": False}
CASE_BATCHES = {
    "CP_V2_EXTEND": {"mode": "extend", "seq_lens": [64], "extend_lens": [64]},  # 64 >= 2cp: CP-v2 active
    "NON_CP_EXTEND": {"mode": "extend", "seq_lens": [70], "extend_lens": [6]},  # 6 < 2cp: inactive
    "MIXED": {"mode": "mixed", "seq_lens": [80, 33], "extend_lens": [16, 1]},
    "DECODE": {"mode": "decode", "seq_lens": [81, 34], "extend_lens": None},
}


def _write_runner_case(result: TheoremResult, cases_dir: Optional[str]) -> Optional[str]:
    """Write a refuted runner theorem's witness as a case file (schema fa3verify.case/1; spec/cases.py).

    Only witnesses whose arrivals a replay reproduces are written: a CP-v2 extend arrives on a fresh batch
    object (no ``built``/inherited arrival) and every other batch on the reused one, as ``gpu_impl.runner``
    steps them; the violated invariant is CP_PATH_MATCHES_ACTIVITY (the CP path without CP-v2 activity).
    """
    w = result.witness
    if cases_dir is None or not w:
        return None
    # the arrivals a replay gives: a fresh object for a CP-v2 extend, the reused one for everything else
    replay_steps = [(KINDS.index(k), _FRESH if k == "CP_V2_EXTEND" else _CARRIED) for k in w["sequence"]]
    last = simulate_runner(replay_steps, clear_stale=bool(w["clear_stale"]))[-1]
    if last["cp_path"] == last["active"]:
        return None
    from spec.cases import Case  # same layer

    case = Case.from_parts(
        source=f"prove:{result.name}", server=dict(CASE_SERVER), model=dict(CASE_MODEL),
        policy={"guard": "fixed", "metadata_heads": "tp", "clear_stale_cp_metadata": bool(w["clear_stale"])},
        batches=[dict(CASE_BATCHES[k]) for k in w["sequence"]],
        expected={"outcome": "violation", "invariant": "CP_PATH_MATCHES_ACTIVITY",
                  "detail": {"sequence": w["sequence"], "arrivals": w["arrivals"], "step": len(w["sequence"]) - 1}},
        notes=f"z3 BMC witness of {result.name}: " + " -> ".join(w["sequence"])
              + "; the last batch takes the CP path with metadata built for an earlier batch")
    return str(case.save(cases_dir))


def run_cp_theorems(timeout_s: float = 10, clear_stale: bool = True, only: Optional[Iterable[str]] = None,
                    defects: Iterable[str] = frozenset(), max_k: int = 6,
                    cp_v2_may_inherit: bool = False, cases_dir: Optional[str] = None) -> list[TheoremResult]:
    """Check theorems 6 (zigzag partition/balance, cp/zigzag.py) and 7 (runner CP-metadata hygiene, PR #30439's eager-runner fix).

    ``timeout_s`` bounds each z3 query; ``clear_stale`` selects the runner with (True) or without (False) the
    fix; ``only`` selects theorems by name, number ("6", "7") or substring (entries matching nothing here are
    ignored); ``defects`` seeds entries of :data:`DEFECTS` (algebra defects are accepted and ignored
    here); ``max_k`` is the BMC unrolling depth (1..12); ``cp_v2_may_inherit`` lets a CP-v2 extend arrive on a
    reused batch object (by default it arrives fresh or with its own metadata, as sglang builds a new batch
    for a new extend -- the assumption ``gpu_impl.runner`` makes too); with ``cases_dir``, a refuted runner
    theorem whose witness a replay reproduces is written there as a case file (``case_file``).
    """
    active = _check_defects(defects)
    if not 1 <= max_k <= 12:
        raise ValueError(f"max_k: must lie in [1, 12], got {max_k}")
    runners: dict[str, Callable[[], TheoremResult]] = {
        "zigzag_partition": lambda: _theorem_zigzag_partition(timeout_s, active),
        "zigzag_balance": lambda: _theorem_zigzag_balance(timeout_s, active),
        "runner_hygiene": lambda: _theorem_runner("hygiene", timeout_s, clear_stale, max_k, cp_v2_may_inherit),
        "runner_freshness": lambda: _theorem_runner("freshness", timeout_s, clear_stale, max_k, cp_v2_may_inherit),
    }
    results = [_isolated(runners[name]) for name in _select(only)]
    for r in results:
        if r.name.startswith("runner_") and r.verdict == "refuted":
            r.case_file = _write_runner_case(r, cases_dir)
    return results
