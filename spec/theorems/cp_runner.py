"""Theorem 7: the eager runner's CP-metadata hygiene as a transition system (bounded model checking
plus a 1-step induction).

Invariant: with PR #30439's fix (clear ``attn_cp_metadata`` when CP-v2 is not active) the backend takes the CP
path iff the batch is CP-v2 active, and only with metadata built for the current batch (sglang
``python/sglang/srt/layers/cp/utils.py`` ``prepare_cp_forward``, ``forward_batch_info.py``).
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import z3

from spec.theorems.results import TheoremResult
from spec.theorems.z3ctx import solve as _solve
from spec.theorems.z3ctx import Int as _Int
from spec.theorems.z3ctx import Ints as _Ints
from spec.theorems.z3ctx import IntVal as _IntVal

from spec.theorems.base import theorem_result
from spec.theorems.cp_common import (
    ARRIVALS,
    KINDS,
    BUILT,
    CARRIED,
    CP_V2,
    DECODE_ROWS,
    FRESH,
    MIXED_ROWS,
    NONE,
    NON_CP,
    model_int,
)
from spec.finding import TheoremVerdict


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
    carried = ops.ite(arrival == FRESH, NONE, ops.ite(arrival == BUILT, t, state))
    loaded = ops.ite(kind == DECODE_ROWS, NONE, carried)  # prepare_for_decode clears it
    active = ops.or_(kind == CP_V2, kind == MIXED_ROWS) if mixed_active else (kind == CP_V2)
    before_prepare = NONE if clear_always else loaded
    after = ops.ite(active, ops.ite(before_prepare == NONE, t, before_prepare),
                    NONE if clear_stale else loaded)
    cp_extend_mode = ops.or_(kind == CP_V2, kind == NON_CP, kind == MIXED_ROWS)
    cp_path = ops.and_(cp_extend_mode, after != NONE)
    return {"active": active, "metadata": after, "cp_path": cp_path}


def runner_step(state: int, kind: int, arrival: int, t: int, clear_stale: bool = True,
                clear_always: bool = False, mixed_active: bool = False) -> dict[str, Any]:
    """One concrete eager-runner step: the CP-v2 decision, the metadata afterwards, and whether the backend takes the CP path.

    Invariant modelled: ``prepare_cp_forward`` builds only when the field is None (cp/utils.py); the fix clears
    it on inactive steps; the backend's CP gate is CP-extend mode and metadata present (docs/facts-fa3.md section 1).
    ``state``/``metadata`` are -1 for None or the step the metadata was built for; ``clear_always`` clears
    before every ``prepare_cp_forward`` (the stronger fix), ``mixed_active`` lets MIXED batches count as CP-v2
    active (the gate before MIXED was excluded).
    """
    if arrival == BUILT and kind != CP_V2:
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
    state, out = NONE, []
    for t, (kind, arrival) in enumerate(steps):
        rec = runner_step(state, kind, arrival, t, clear_stale, clear_always, mixed_active)
        out.append(rec)
        state = rec["metadata"]
    return out


def _arrival_domain(kind: Any, arrival: Any, cp_v2_may_inherit: bool) -> list[Any]:
    """Which arrivals a batch kind can have (see the module docstring)."""
    dom = [kind >= 0, kind <= DECODE_ROWS, arrival >= 0, arrival <= BUILT, z3.Implies(arrival == BUILT, kind == CP_V2)]
    if not cp_v2_may_inherit:
        dom.append(z3.Implies(kind == CP_V2, arrival != CARRIED))
    return dom


def _inputs(k: int, tag: str, cp_v2_may_inherit: bool) -> tuple[list, list, list]:
    kinds = [_Int(f"{tag}model_kind{t}") for t in range(k)]
    arrivals = [_Int(f"{tag}_arr{t}") for t in range(k)]
    dom = []
    for kd, ar in zip(kinds, arrivals):
        dom += _arrival_domain(kd, ar, cp_v2_may_inherit)
    return kinds, arrivals, dom


def _unroll(k: int, tag: str, cp_v2_may_inherit: bool = False, **policy) -> tuple[list, list, list, list]:
    kinds, arrivals, dom = _inputs(k, tag, cp_v2_may_inherit)
    state, recs = _IntVal(NONE), []
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
            seq = [[KINDS[model_int(model, kd)], ARRIVALS[model_int(model, ar)]] for kd, ar in zip(kinds, arrivals)]
            trace = simulate_runner([(KINDS.index(a), ARRIVALS.index(b)) for a, b in seq], **policy)
            violating = []
            for kind in range(len(KINDS)):  # which kinds can be the violating step at this length
                r2, _ = _solve(dom + [bad, kinds[-1] == kind], timeout_s)
                if r2 == "sat":
                    violating.append(KINDS[kind])
            return {"result": "sat", "k": k, "per_k": per_k, "sequence": seq,
                    "trace": [{"cp_v2_active": r["active"], "cp_path": r["cp_path"],
                               "metadata_built_for_step": None if r["metadata"] == NONE else r["metadata"]}
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
    kind, arrival = _Ints(f"ind_{which}model_kind ind_{which}_arr")
    dom = [t >= 0, z3.Or(state == NONE, z3.And(state >= 0, state < t))]
    dom += _arrival_domain(kind, arrival, cp_v2_may_inherit)
    rec = runner_step_z3(state, kind, arrival, t, **policy)
    res, _ = _solve(dom + [z3.Not(_prop(which, rec, t))], timeout_s)
    return res


def theorem_runner(which: str, timeout_s: float, clear_stale: bool, max_k: int,
                    cp_v2_may_inherit: bool) -> TheoremResult:
    name = f"runner-{which}"
    t0 = time.perf_counter()
    policy = {"clear_stale": clear_stale, "cp_v2_may_inherit": cp_v2_may_inherit}
    bmc = _bmc(which, max_k, timeout_s, prefer_kind=MIXED_ROWS if which == "hygiene" else None, **policy)
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
        return theorem_result(name, TheoremVerdict.INCONCLUSIVE, t0, {}, f"BMC: z3 returned unknown at k={bmc['k']}",
                              details)
    if bmc["result"] == "sat":
        witness = {"sequence": [kind for kind, _ in bmc["sequence"]], "arrivals": [a for _, a in bmc["sequence"]],
                   "length": bmc["k"], "trace": bmc["trace"],
                   "violating_kinds_at_this_length": bmc["violating_kinds_at_this_length"],
                   "clear_stale": clear_stale, "cp_v2_may_inherit": cp_v2_may_inherit}
        return theorem_result(name, TheoremVerdict.REFUTED, t0, witness,
                       f"{which} fails after {bmc['k']} steps: "
                       + " -> ".join(f"{k} ({a})" for k, a in bmc["sequence"]), details)
    ind = _induction(which, timeout_s, **policy)
    details["induction"] = ind
    claim = ("the backend takes the CP path iff the batch is CP-v2 active" if which == "hygiene" else
             "whenever the backend takes the CP path, the metadata was built for the current batch")
    if ind == "unsat":
        return theorem_result(name, TheoremVerdict.PROVED, t0, {},
                       f"{claim}: for every sequence length (1-step induction); BMC up to k={max_k} agrees", details)
    return theorem_result(name, TheoremVerdict.PROVED, t0, {},
                   f"{claim}: for every sequence of up to {max_k} steps (bounded; induction {ind})", details)
