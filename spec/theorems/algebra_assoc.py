"""Theorems 5c and 5d: the two-way merge of softmax states (the combine with two splits) is commutative and
associative.

Invariant: as states, both results are empty (LSE = -inf, O = 0) or both non-empty with equal LSE and equal O;
the proof instantiates the n = 2 exact-merge relation of theorem 5a, proved first under the same defects.
"""

from __future__ import annotations

import math
import time
from typing import Any, Iterable

import z3

from spec.theorems.results import TheoremResult
from spec.theorems.z3ctx import solve as _solve
from spec.theorems.z3ctx import Int as _Int
from spec.theorems.z3ctx import Real as _Real

from spec.theorems.algebra_combine import combine_float
from spec.theorems.algebra_merge import exact_merge_case
from spec.theorems.base import theorem_result
from spec.theorems.algebra_z3 import (
    NINF,
    XV,
    Z3Arith,
    Atom,
    KIND_NAMES,
    State,
    close,
    combine_z3,
    exp_facts,
    fmt,
    input_state,
    model_kind,
    state_witness,
    xv_float,
)
from spec.finding import TheoremVerdict


# --------------------------------------------------------------------------------------------
# Theorem 5c/5d: the two-way merge is commutative and associative.
# --------------------------------------------------------------------------------------------


def _merge_spec(x: State, y: State, z: State) -> list[Any]:
    """The exact-merge relation for a two-way merge ``z = merge(x, y)`` (``combine-exact-merge`` at n = 2).

    Multiplying the proved ``O = sum_s S_s * u * O_s`` by the total ``T = S_x + S_y`` gives
    ``O * T = S_x * O_x + S_y * O_y``, the form used here; ``z.mass`` is ``exp(LSE)`` (0 when LSE = -inf).
    """
    total = x.mass + y.mass
    return [z3.If(total > 0,
                  z3.And(z.out.fin(), z.lse.fin(), z.mass == total,
                         z.out.v * total == x.mass * x.out.v + y.mass * y.out.v),
                  z3.And(z.out.fin(), z.out.v == 0, z.lse.is_kind(NINF), z.mass == 0))]


def merge_theorem(name: str, timeout_s: float, defects: frozenset) -> TheoremResult:
    """Commutativity / associativity of the two-way merge.

    When ``combine-exact-merge`` is proved for n = 2 under the same defects, every merge call is replaced by
    a state related to its inputs by that proved relation (:func:`_merge_spec`): the combine satisfies it on
    every input of the theorem's domain, and merged states are again in that domain (empty: mass 0, LSE
    -inf; non-empty: finite LSE with exp(LSE) = mass, finite O), so the identity proved for any merge
    satisfying the relation holds for the combine. Otherwise the query holds the combine's raw encoding,
    which can refute (witnesses are replayed concretely) but rarely prove.
    """
    t0 = time.perf_counter()
    pre = exact_merge_case(2, defects, timeout_s)
    use_spec = pre["result"] == "unsat"
    tag = "mc" if name == "merge-commutative" else "ma"
    A = Z3Arith(tag)
    labels = ["a", "b"] if name == "merge-commutative" else ["a", "b", "c"]
    states, cons = [], []
    for lab in labels:
        st, c = input_state(A, f"{tag}_{lab}")
        states.append(st)
        cons.append(c)
    facts: list[Any] = []
    merged: list[tuple[State, State, State]] = []
    law_facts: list[Any] = []

    def merge(x: State, y: State) -> State:
        if use_spec:
            k = len(merged)
            z = State(XV(_Int(f"{tag}_z{k}_lk"), _Real(f"{tag}_z{k}_lse")), _Real(f"{tag}_z{k}_S"),
                       XV(_Int(f"{tag}_z{k}_ok"), _Real(f"{tag}_z{k}_o")))
            A.exp_atoms.append(Atom(z.lse.v, z.mass, z.lse.fin()))
            facts.extend(_merge_spec(x, y, z))
        else:
            cb = combine_z3(A, [x, y], defects)
            law_facts.extend(cb.laws)
            z = cb.state
        merged.append((x, y, z))
        return z

    if name == "merge-commutative":
        a, b = states
        left, right = merge(a, b), merge(b, a)
        shape = "merge(a, b) == merge(b, a)"
    else:
        a, b, c = states
        left = merge(merge(a, b), c)
        right = merge(a, merge(b, c))
        shape = "merge(merge(a, b), c) == merge(a, merge(b, c))"
    total = z3.Sum([st.mass for st in states])
    o_l, o_r = left.out.v, right.out.v
    equal = z3.Or(
        z3.And(left.lse.is_kind(NINF), right.lse.is_kind(NINF), left.out.fin(), right.out.fin(), o_l == 0, o_r == 0),
        z3.And(left.lse.fin(), right.lse.fin(), left.lse.v == right.lse.v, left.out.fin(), right.out.fin(), o_l == o_r),
    )
    if use_spec:
        # The relation gives mass_z = mass_x + mass_y for every merge; these are its products with the outputs.
        outs = [st.out.v for st in states] + [z.out.v for _, _, z in merged]
        for x, y, z in merged:
            facts += [v * (z.mass - x.mass - y.mass) == 0 for v in outs]
        # no zero divisors in the reals (a true fact), for the final cancellation
        facts.append(z3.Implies(z3.And(total > 0, o_l * total == o_r * total), o_l == o_r))
        outputs = [_atom_of(A, left.mass), _atom_of(A, right.mass)]
        constraints = cons + facts + exp_facts([], pairwise=outputs) + [z3.Not(equal)]
    else:
        # every exp/log application pairwise consistent and monotone: fewer spurious witnesses
        atoms = A.exp_atoms + A.log_atoms
        constraints = cons + A.facts + law_facts + exp_facts(atoms, pairwise=atoms) + [z3.Not(equal)]
    res, model = _solve(constraints, timeout_s)
    witness: dict[str, Any] = {}
    details: dict[str, Any] = {"result": res, "uses_exact_merge_n2": use_spec, "exact_merge_n2": pre["lemmas"]}
    if res == "unsat":
        verdict = TheoremVerdict.PROVED
        message = (f"{shape} as states (equal LSE and O, or both empty with O = 0), any state empty (with any "
                   "garbage output) or not; from the proved n = 2 exact merge")
    elif res == "sat":
        verdict, message = TheoremVerdict.REFUTED, f"{shape} fails"
        concrete = {lab: state_witness(model, st) for lab, st in zip(labels, states)}
        witness = {
            "states": concrete,
            "symbolic_left": {"O": fmt(xv_float(model, left.out)), "LSE_kind": KIND_NAMES[model_kind(model, left.lse)]},
            "symbolic_right": {"O": fmt(xv_float(model, right.out)),
                               "LSE_kind": KIND_NAMES[model_kind(model, right.lse)]},
            "defects": sorted(defects),
            "replay": replay_merges(name, concrete, defects),
        }
        if not witness["replay"]["violates"]:
            verdict = TheoremVerdict.INCONCLUSIVE
            message = f"{shape}: z3's witness does not replay concretely (spurious under the exp abstraction)"
    else:
        verdict = TheoremVerdict.INCONCLUSIVE
        message = f"z3 returned unknown (timeout {timeout_s}s)" + (
            "" if use_spec else "; combine-exact-merge is not proved for n = 2 under these defects")
    return theorem_result(name, verdict, t0, witness, message, details)


def replay_merges(name: str, states: dict[str, dict[str, Any]], defects: Iterable[str] = ()) -> dict[str, Any]:
    """Concrete float replay of a merge witness: both sides of the commutativity/associativity identity.

    Invariant checked: ``merge(a, b) == merge(b, a)`` resp. ``merge(merge(a, b), c) == merge(a, merge(b, c))``
    as states, where ``merge`` is :func:`combine_float` with two splits (flash_fwd_combine_kernel.h).
    """
    def merge(x: tuple[float, float], y: tuple[float, float]) -> tuple[float, float]:
        o, lse = combine_float([x[1], y[1]], [x[0], y[0]], defects)
        return o, lse

    st = {k: (float(v["out"]), float(v["lse"])) for k, v in states.items()}
    if name == "merge-commutative":
        left, right = merge(st["a"], st["b"]), merge(st["b"], st["a"])
    else:
        left = merge(merge(st["a"], st["b"]), st["c"])
        right = merge(st["a"], merge(st["b"], st["c"]))
    both_empty = left[1] == -math.inf and right[1] == -math.inf and left[0] == 0 and right[0] == 0
    same = both_empty or (close(left[0], right[0]) and close(left[1], right[1]))
    return {"left": {"O": fmt(left[0]), "LSE": fmt(left[1])},
            "right": {"O": fmt(right[0]), "LSE": fmt(right[1])}, "violates": not same}


def _atom_of(A: Z3Arith, y: Any) -> Atom:
    for atom in A.exp_atoms:
        if atom.y is y:
            return atom
    raise KeyError("no exp atom for this term")
