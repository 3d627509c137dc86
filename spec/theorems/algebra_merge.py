"""Theorems 5a and 5b: FA3's combine is the exact merge of partial softmax states, and all-empty rows give
(0, -inf).

Invariant: for every split count checked, each split empty or non-empty with positive mass, the combine of
``hopper/flash_fwd_combine_kernel.h`` returns ``sum_s S_s O_s / sum_s S_s`` with ``exp(LSE) = sum_s S_s``
(proved as a chain of z3 lemmas, each its own query), and ``(0, -inf)`` when every split is empty.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import z3

from spec.theorems.results import TheoremResult
from spec.theorems.z3ctx import solve as _solve
from spec.theorems.z3ctx import Real as _Real
from spec.theorems.z3ctx import RealVal as _RealVal

from spec.theorems.algebra_combine import combine_rows
from spec.theorems.base import theorem_result
from spec.theorems.algebra_z3 import (
    NINF,
    Z3Arith,
    KIND_NAMES,
    combine_z3,
    exp_facts,
    fmt,
    input_state,
    model_kind,
    product_instances,
    state_witness,
    xv_float,
    replay_row,
)
from spec.finding import TheoremVerdict


# --------------------------------------------------------------------------------------------
# Theorem 5a: the combine is the exact merge (a chain of lemmas, each its own z3 query).
# --------------------------------------------------------------------------------------------


def exact_merge_case(n: int, defects: frozenset, timeout_s: float) -> dict[str, Any]:
    """Prove (or refute) the exact-merge claim for ``n`` splits; returns a dict with ``result`` and details.

    The claim is split into lemmas; each is checked with the previous ones as assumptions (they were proved
    on the same variables, so assuming them adds nothing): ``structure`` (kinds, selection of splits, the
    output as a linear form in the outputs, ``inv * Z = 1``, the exp laws' premises hold), ``mass``
    (``exp(LSE) = T``), ``bounded`` (weights in (0, 1], the max one 1), ``coefficients``
    (``w_s * inv = S_s / T``) and ``output`` (``O = sum_s S_s O_s / T``). If a lemma is not proved, the whole
    claim is checked in one query, which yields the witness (a failed lemma alone refutes nothing).
    """
    A = Z3Arith(f"x{n}")
    states, cons = [], []
    for s in range(n):
        st, c = input_state(A, f"x{n}s{s}")
        states.append(st)
        cons.append(c)
    cb = combine_z3(A, states, defects)
    total = z3.Sum([st.mass for st in states]) if n > 1 else states[0].mass
    u = _Real(f"x{n}_u")
    reference_def = z3.Implies(total > 0, u * total == 1)  # u = 1/T: the exact merge's normaliser
    base = cons + A.facts + cb.laws + exp_facts(A.exp_atoms + A.log_atoms) + [reference_def]
    o, lse = cb.out, cb.lse
    o_v = _Real(f"x{n}_O")  # names the combine's output value, so lemmas need not carry its term
    base.append(o_v == o.v)
    r = cb.inv_atoms[0][0] if cb.inv_atoms else _RealVal(1)
    empty_result = z3.And(o.fin(), o_v == 0, lse.is_kind(NINF))
    # Empty splits have w_s = 0 and S_s = 0, so their (arbitrary, real-valued) output adds 0 to these sums;
    # their non-finite kinds are handled by the structure lemma (O is finite).
    linear = z3.Sum([w.y * r * st.out.v for w, st in zip(cb.weights, states)])
    bounded = z3.And(z3.And([z3.Implies(w.guard, w.y <= 1) for w in cb.weights]),
                     z3.Or([z3.And(w.guard, w.y == 1) for w in cb.weights]))
    kinds = z3.If(total > 0, z3.And(o.fin(), lse.fin(), cb.mass == total, bounded), empty_result)
    core = z3.Implies(total > 0, z3.And(
        cb.z.v > 0, r * cb.z.v == 1, cb.exp_m > 0, o_v == linear,
        z3.And([w.y * cb.exp_m == st.mass for w, st in zip(cb.weights, states)])))
    reference = z3.Sum([st.mass * u * st.out.v for st in states])  # sum_s S_s * O_s / T
    coefficients = z3.And([w.y * r == st.mass * u for w, st in zip(cb.weights, states)])
    # (name, lemma, hints, what the query assumes: "base" = the combine's encoding, "reference" = u = 1/T,
    # or earlier lemmas by name, and whether z3 preprocesses it: kinds and core assume the whole encoding, whose
    # equalities define most variables, and z3's solve-eqs answers them 3-20x faster (1..16 splits, z3 5.4.1);
    # the two product lemmas are faster without it)
    lemmas = [
        ("kinds", kinds, [], ["base"], True),
        ("core", core, [], ["base"], True),
        ("coefficients", z3.Implies(total > 0, coefficients), product_instances(cb, total, u, r),
         ["reference", "core"], False),
        ("output", z3.Implies(total > 0, o_v == reference),
         [z3.Implies(total > 0, st.out.v * (w.y * r - st.mass * u) == 0) for w, st in zip(cb.weights, states)],
         ["core", "coefficients"], False),
    ]
    claim = z3.If(total > 0, z3.And(o.fin(), o_v == reference, lse.fin(), cb.mass == total, bounded), empty_result)
    steps: dict[str, Any] = {}
    proved: dict[str, Any] = {}
    for name, lemma, hints, deps, preprocess in lemmas:
        t0 = time.perf_counter()
        # A query may leave constraints out (only weakening it), so an unsat answer is still a proof.
        pool = {"base": base, "reference": [reference_def, *cons]}
        assumed = [c for d in deps for c in pool.get(d, [proved.get(d)])]
        res, _ = _solve(assumed + hints + [z3.Not(lemma)], timeout_s, preprocess=preprocess)
        steps[name] = {"result": res, "seconds": round(time.perf_counter() - t0, 3)}
        if res != "unsat":
            break
        proved[name] = lemma
    if len(proved) == len(lemmas):
        return {"result": "unsat", "lemmas": steps}
    t0 = time.perf_counter()
    res, model = _solve(base + [z3.Not(claim)], timeout_s)
    steps["direct"] = {"result": res, "seconds": round(time.perf_counter() - t0, 3)}
    out: dict[str, Any] = {"result": res, "lemmas": steps}
    if res == "sat":
        splits = [state_witness(model, st) for st in states]
        out["witness"] = {
            "n_splits": n,
            "splits": splits,
            "combine": {"O": fmt(xv_float(model, o)), "LSE_kind": KIND_NAMES[model_kind(model, lse)]},
            "defects": sorted(defects),
            "replay": replay_row(splits, defects),
        }
    return out


def _counts(split_counts: Any) -> tuple[int, ...]:
    """Split counts to check; an int n means 1..n."""
    return tuple(range(1, split_counts + 1)) if isinstance(split_counts, int) else tuple(split_counts)


def _exact_merge_part(n: int, defects: frozenset, timeout_s: float) -> dict[str, Any]:
    """One split count of theorem 5a (a part of its job: each n in its own z3 context), timed."""
    t0 = time.perf_counter()
    case = exact_merge_case(n, defects, timeout_s)
    case["n"] = n
    case["seconds"] = time.perf_counter() - t0
    return case


def _exact_merge_result(cases: Sequence[dict], split_counts: Sequence[int], defects: frozenset,
                        timeout_s: float) -> TheoremResult:
    """Theorem 5a from its per-n cases in order: the first n not proved decides (refuted or inconclusive)."""
    name = "combine-exact-merge"
    split_counts = _counts(split_counts)
    t0 = time.perf_counter() - sum(c["seconds"] for c in cases)  # the theorem's seconds: its parts' together
    per_n: dict[int, Any] = {}
    verdict, witness, message = TheoremVerdict.PROVED, {}, ""
    for case in cases:
        n = case["n"]
        per_n[n] = case["lemmas"]
        if case["result"] == "sat":
            verdict, witness = TheoremVerdict.REFUTED, case["witness"]
            message = f"the combine differs from the exact merge for n={n} splits"
            if not witness["replay"]["violates"]:
                verdict = TheoremVerdict.INCONCLUSIVE
                message = f"n={n}: z3's witness does not replay concretely (spurious under the exp abstraction)"
            break
        if case["result"] == "unknown":
            verdict = TheoremVerdict.INCONCLUSIVE
            message = f"z3 returned unknown for n={n} (timeout {timeout_s}s per query)"
            break
    if verdict == TheoremVerdict.PROVED and [c["n"] for c in cases] != list(split_counts):
        verdict, message = TheoremVerdict.INCONCLUSIVE, f"split counts {list(split_counts)} not all checked"
    if verdict == TheoremVerdict.PROVED:
        message = (f"FA3 combine == exact merge sum_s S_s*O_s / sum_s S_s, LSE = log sum_s S_s, for n in {list(split_counts)} "
                   "splits, any of them empty with garbage output; weights in (0,1], Z >= 1")
    return theorem_result(name, verdict, t0, witness, message, {"per_n": per_n, "split_counts": list(split_counts)})


def exact_merge_job(timeout_s: float, defects: frozenset, split_counts: Sequence[int]):
    """Theorem 5a as a job: one part per split count (the largest first in a parallel run), merged in order."""
    from spec.theorems.jobs import Job

    counts = _counts(split_counts)
    parts = tuple((lambda n=n: _exact_merge_part(n, defects, timeout_s)) for n in counts)
    return Job(("combine-exact-merge",), parts,
               finish=lambda cases: [_exact_merge_result(cases, counts, defects, timeout_s)],
               stop=lambda case: case["result"] != "unsat", weight=tuple(0.02 * n + 0.05 for n in counts), light=True,
               key=("combine-exact-merge", timeout_s, frozenset(defects), counts))


def _theorem_exact_merge(timeout_s: float, defects: frozenset, split_counts: Sequence[int]) -> TheoremResult:
    """Theorem 5a in this process (each split count in its own z3 context, as its job runs)."""
    from spec.theorems.jobs import run_jobs

    return run_jobs([exact_merge_job(timeout_s, defects, split_counts)]).results[0]


# --------------------------------------------------------------------------------------------
# Theorem 5b: all-empty rows.
# --------------------------------------------------------------------------------------------


def theorem_all_empty(timeout_s: float, defects: frozenset, split_counts: Sequence[int]) -> TheoremResult:
    name = "combine-all-empty"
    split_counts = _counts(split_counts)
    t0 = time.perf_counter()
    per_n: dict[int, Any] = {}
    verdict, witness, message = TheoremVerdict.PROVED, {}, ""
    for n in split_counts:
        tq = time.perf_counter()
        A = Z3Arith(f"e{n}")
        states, cons = [], []
        for s in range(n):
            st, c = input_state(A, f"e{n}s{s}")
            states.append(st)
            cons += [c, st.mass == 0]
        o, lse = combine_rows([st.lse for st in states], [st.out for st in states], A, defects)
        prop = z3.And(o.fin(), o.v == 0, lse.is_kind(NINF))
        res, model = _solve(cons + A.facts + exp_facts(A.exp_atoms + A.log_atoms) + [z3.Not(prop)], timeout_s)
        per_n[n] = {"result": res, "seconds": round(time.perf_counter() - tq, 3)}
        if res == "sat":
            splits = [state_witness(model, st) for st in states]
            witness = {
                "n_splits": n,
                "splits": splits,
                "combine": {"O": fmt(xv_float(model, o)), "LSE": fmt(xv_float(model, lse))},
                "defects": sorted(defects),
                "replay": replay_row(splits, defects),
            }
            verdict, message = TheoremVerdict.REFUTED, f"an all-empty row of n={n} splits does not combine to (0, -inf)"
            if not witness["replay"]["violates"]:
                verdict = TheoremVerdict.INCONCLUSIVE
                message = f"n={n}: z3's witness does not replay concretely (spurious under the exp abstraction)"
            break
        if res == "unknown":
            verdict, message = TheoremVerdict.INCONCLUSIVE, f"z3 returned unknown for n={n} (timeout {timeout_s}s)"
            break
    if verdict == TheoremVerdict.PROVED:
        message = f"all-empty rows (n in {list(split_counts)} splits, outputs of any kind) combine to (0, -inf)"
    return theorem_result(name, verdict, t0, witness, message, {"per_n": per_n, "split_counts": list(split_counts)})
