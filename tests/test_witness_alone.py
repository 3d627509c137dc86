"""A witness query's model is a function of the query alone (`spec.z3ctx.checked_alone`), not of earlier checks.

The real query: stage 2 (b = 1, eager page-table width, 32k context) of the first pre-fix hazard group, the query
whose model becomes 3-hazard's case file. It is asked once in a fresh theorem context, and once after that
context ran a stage-1 check (what the policy part does before it): the witness must be the same. The negative
controls ask the same query the two other ways and must see the model move, so this test can tell: in the
theorem's own context (how witnesses were asked before), and translated into a new context with ``translate``
(same term ids and declarations, still not independent; `checked_alone` re-parses SMT-LIB text instead).
"""

from __future__ import annotations

import z3

import spec.theorems_metadata as M
from refmodel.fa3_scheduler import get_num_splits
from spec import domain as D
from spec import z3ctx


class _Shared(M.Budget):
    """The negative control: the witness query checked in the theorem's own context."""

    def check_alone(self, s, label):
        self.queries += 1
        r = z3ctx.checked(s)
        return r, (s.model() if r == z3.sat else None)


class _Translated(M.Budget):
    """The negative control: a translated copy checked in a new context."""

    def check_alone(self, s, label):
        self.queries += 1
        target = z3.Context()
        own = z3.Solver(ctx=target)
        own.set("ctrl_c", False)
        z3ctx.bound(own, self.timeout_s)
        own.set("random_seed", M.SEED)
        own.add(*s.assertions().translate(target))
        r = z3ctx.checked(own)
        return r, (own.model().translate(s.ctx) if r == z3.sat else None)


def _hazard_groups() -> list:
    guard, _ = D.resolve_guard("pre-fix")
    pre = [c for c in D.enumerate_configs(frozenset()) if D.precomputes(c, guard)]
    groups = M.group_configs(pre, "tp", get_num_splits, get_num_splits)
    groups.sort(key=lambda g: (g.P.num_heads_k >= g.C.num_heads_k and not g.sharded_cp and not g.p_static_free))
    return groups


def _witness(budget_type, earlier_checks: int) -> dict:
    """The stage-2 witness of the first hazard group, after `earlier_checks` stage-1 checks in the same context."""
    def body():
        groups = _hazard_groups()
        budget = budget_type(10.0)
        for fam in M.family_groups(groups)[:earlier_checks]:
            M.stage1_search(fam, budget)
        assert budget.queries == earlier_checks
        verdict, w = M._stage2(groups[0], budget, 1, True, False, M.WITNESS_LEN)
        assert verdict == "sat" and not budget.unknowns
        return w
    return z3ctx.isolated(body)


def test_a_witness_query_checked_alone_ignores_the_checks_before_it():
    first = _witness(M.Budget, 0)
    assert _witness(M.Budget, 1) == first
    assert _witness(M.Budget, 3) == first
    # and the query itself, asked again and again in one context, keeps its answer
    def again():
        groups = _hazard_groups()
        return [M._stage2(groups[0], M.Budget(10.0), 1, True, False, M.WITNESS_LEN)[1] for _ in range(2)]
    assert z3ctx.isolated(again) == [first, first]


def test_negative_control_the_shared_context_moves_the_witness():
    assert _witness(_Shared, 0) != _witness(_Shared, 1)


def test_negative_control_a_translated_copy_still_moves_the_witness():
    assert _witness(_Translated, 0) != _witness(_Translated, 1)


def test_checked_alone_keeps_unknown_and_unsat():
    a = z3.BitVec("a", 32, z3ctx.ctx())
    s = z3.Solver(ctx=z3ctx.ctx())
    s.add(a * 3 == 7, z3.ULT(a, 5))
    assert z3ctx.checked_alone(s, 10.0)[:2] == (z3.unsat, None)
    from z3_puzzles import pigeonhole

    hard = z3.Solver(ctx=z3ctx.ctx())
    pigeonhole(hard, 14)
    r, model, why = z3ctx.checked_alone(hard, 0.03)
    assert r == z3.unknown and model is None and why
