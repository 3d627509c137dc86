"""The combine over z3 for theorem 5: values as (kind, real) with IEEE rules for the non-finite kinds, symbolic
softmax states, the z3 combine with its exp facts, and the witnesses a ``sat`` answer gives.

Invariant: every fact added about ``exp`` and ``log`` holds for the real functions, so ``unsat`` is a proof;
a witness always carries its concrete float replay (:func:`replay_row`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable, Sequence

import z3

from spec.theorems.base import theorem_result
from spec.theorems.z3ctx import Int as _Int
from spec.theorems.z3ctx import Real as _Real
from spec.theorems.z3ctx import Bool as _Bool
from spec.theorems.z3ctx import IntVal as _IntVal
from spec.theorems.z3ctx import RealVal as _RealVal

from spec.theorems.algebra_combine import combine_float, combine_rows, exact_merge_float


# --------------------------------------------------------------------------------------------
# Symbolic arithmetic: values are (kind, real) with IEEE rules for the non-finite kinds.
# --------------------------------------------------------------------------------------------


FIN, PINF, NINF, NAN = 0, 1, 2, 3

KIND_NAMES = {FIN: "finite", PINF: "+inf", NINF: "-inf", NAN: "nan"}


@dataclass(frozen=True)
class XV:
    """A symbolic extended float: ``k`` is the kind (FIN, PINF, NINF, NAN), ``v`` the real value when finite."""

    k: Any
    v: Any

    def fin(self):
        """z3 condition: the value is finite."""
        return self.k == FIN

    def is_kind(self, kind: int):
        """z3 condition: the value has the given kind."""
        return self.k == kind


def _simp(term: Any) -> Any:
    """Light simplification of a built term (constant folding), keeping terms small."""
    return z3.simplify(term)


@dataclass
class Atom:
    """``y = exp(x)`` whenever ``guard`` holds (one instance of the uninterpreted exponential)."""

    x: Any
    y: Any
    guard: Any


class Z3Arith:
    """z3 semantics for :func:`combine_rows`: IEEE kinds exactly, finite values as reals, exp/log as atoms.

    Kinds and finite values are built as terms; only ``exp``, ``log`` and the guarded inverse introduce fresh
    variables, with their defining facts in ``self.facts``. Their applications are recorded in
    ``self.exp_atoms`` / ``self.log_atoms`` / ``self.inv_atoms`` so that the caller can instantiate the
    exponential's laws on them (see the module docstring).
    """

    def __init__(self, prefix: str = "c"):
        self.prefix = prefix
        self.facts: list[Any] = []
        self.exp_atoms: list[Atom] = []
        self.log_atoms: list[Atom] = []
        self.inv_atoms: list[tuple[Any, XV]] = []  # (r, z): r * z = 1 whenever z is finite and non-zero
        self._n = 0

    # -- construction helpers ---------------------------------------------------------------
    def fresh_real(self, tag: str):
        """A fresh real variable."""
        self._n += 1
        return _Real(f"{self.prefix}_{tag}{self._n}")

    def const(self, c) -> XV:
        """The finite constant ``c``."""
        return XV(_IntVal(FIN), _RealVal(c))

    def ninf(self) -> XV:
        """The value ``-inf``."""
        return XV(_IntVal(NINF), _RealVal(0))

    # -- IEEE operations (kinds and finite values are built as terms; only exp/log/inv add variables) --
    def add(self, a: XV, b: XV) -> XV:
        """IEEE addition: NaN if either is NaN or inf + -inf; else an infinity dominates."""
        nan = z3.Or(a.is_kind(NAN), b.is_kind(NAN), z3.And(a.is_kind(PINF), b.is_kind(NINF)),
                    z3.And(a.is_kind(NINF), b.is_kind(PINF)))
        kind = z3.If(nan, NAN, z3.If(z3.Or(a.is_kind(PINF), b.is_kind(PINF)), PINF,
                                     z3.If(z3.Or(a.is_kind(NINF), b.is_kind(NINF)), NINF, FIN)))
        return XV(_simp(kind), _simp(a.v + b.v))

    def neg(self, a: XV) -> XV:
        """IEEE negation."""
        return XV(_simp(z3.If(a.is_kind(PINF), NINF, z3.If(a.is_kind(NINF), PINF, a.k))), _simp(-a.v))

    def sub(self, a: XV, b: XV) -> XV:
        """IEEE subtraction ``a + (-b)``."""
        return self.add(a, self.neg(b))

    def mul(self, a: XV, b: XV) -> XV:
        """IEEE multiplication: NaN if either is NaN or 0 * inf; inf * nonzero/inf by sign; finite product."""

        def sign(x: XV):  # +1, -1 or 0 for non-NaN values
            return z3.If(x.is_kind(PINF), 1, z3.If(x.is_kind(NINF), -1,
                                                   z3.If(x.v > 0, 1, z3.If(x.v < 0, -1, 0))))

        inf_a = z3.Or(a.is_kind(PINF), a.is_kind(NINF))
        inf_b = z3.Or(b.is_kind(PINF), b.is_kind(NINF))
        nan = z3.Or(a.is_kind(NAN), b.is_kind(NAN), z3.And(inf_a, sign(b) == 0), z3.And(inf_b, sign(a) == 0))
        kind = z3.If(nan, NAN, z3.If(z3.Or(inf_a, inf_b),
                                     z3.If(sign(a) * sign(b) > 0, PINF, NINF), FIN))
        return XV(_simp(kind), _simp(a.v * b.v))

    def _less(self, a: XV, b: XV):
        """``a < b`` for non-NaN values (order -inf < finite < +inf)."""
        return z3.Or(z3.And(a.is_kind(NINF), z3.Not(b.is_kind(NINF))),
                     z3.And(a.fin(), b.is_kind(PINF)),
                     z3.And(a.fin(), b.fin(), a.v < b.v))

    def fmax(self, a: XV, b: XV) -> XV:
        """CUDA ``fmaxf``: ignores a NaN operand."""
        pick_b = z3.Or(a.is_kind(NAN), z3.And(z3.Not(b.is_kind(NAN)), self._less(a, b)))
        return self.ite(pick_b, b, a)

    def exp(self, a: XV) -> XV:
        """``exp``: exp(-inf) = 0, exp(+inf) = +inf, exp(NaN) = NaN, finite -> fresh positive atom."""
        y = self.fresh_real("exp")
        self.exp_atoms.append(Atom(a.v, y, a.fin()))
        self.facts += [z3.Implies(a.fin(), y > 0), z3.Implies(a.is_kind(NINF), y == 0)]
        kind = z3.If(z3.Or(a.fin(), a.is_kind(NINF)), FIN, z3.If(a.is_kind(PINF), PINF, NAN))
        return XV(_simp(kind), y)

    def log(self, a: XV) -> XV:
        """``log``: log 0 = -inf, log(negative or -inf or NaN) = NaN, log(+inf) = +inf, finite > 0 -> atom."""
        ell = self.fresh_real("log")
        pos = z3.And(a.fin(), a.v > 0)
        self.log_atoms.append(Atom(ell, a.v, pos))  # exp(ell) = a.v
        kind = z3.If(pos, FIN, z3.If(z3.And(a.fin(), a.v == 0), NINF, z3.If(a.is_kind(PINF), PINF, NAN)))
        return XV(kind, ell)

    def inv_or_zero(self, z: XV) -> XV:
        """``0 if z == 0 or z is NaN else 1/z`` (1/inf = 0)."""
        r = self.fresh_real("inv")
        nonzero_fin = z3.And(z.fin(), z.v != 0)
        self.facts += [z3.Implies(nonzero_fin, r * z.v == 1), z3.Implies(z3.Not(nonzero_fin), r == 0)]
        self.inv_atoms.append((r, z))
        return XV(_IntVal(FIN), r)

    def gt0(self, a: XV):
        """``a > 0`` (False for NaN)."""
        return z3.Or(a.is_kind(PINF), z3.And(a.fin(), a.v > 0))

    def is_ninf(self, a: XV):
        """``a == -inf``."""
        return a.is_kind(NINF)

    def ite(self, c, a: XV, b: XV) -> XV:
        """``a if c else b``."""
        if isinstance(c, bool):
            return a if c else b
        return XV(_simp(z3.If(c, a.k, b.k)), _simp(z3.If(c, a.v, b.v)))


# --------------------------------------------------------------------------------------------
# Symbolic states and the z3 combine with its exp facts.
# --------------------------------------------------------------------------------------------


@dataclass
class State:
    """A symbolic partial softmax state: ``lse`` (XV), its mass ``exp(lse)`` (0 when empty) and output ``out`` (XV)."""

    lse: XV
    mass: Any
    out: XV


def input_state(A: Z3Arith, name: str) -> tuple[State, Any]:
    """A split's state as the main kernel leaves it; returns it and the constraints tying it together.

    Empty (mass 0): ``lse = -inf`` and an output of any kind and value (FA3 never writes it).
    Non-empty: mass ``S > 0``, ``lse`` finite with ``exp(lse) = S`` (an exp atom), finite output.
    """
    empty = _Bool(f"{name}_empty")
    mass = _Real(f"{name}_S")
    lse = XV(z3.If(empty, NINF, FIN), _Real(f"{name}_lse"))
    out = XV(_Int(f"{name}_ok"), _Real(f"{name}_o"))
    cons = z3.And(
        z3.If(empty, mass == 0, mass > 0),
        out.k >= FIN, out.k <= NAN,
        z3.Implies(z3.Not(empty), out.fin()),
    )
    A.exp_atoms.append(Atom(lse.v, mass, z3.Not(empty)))
    return State(lse, mass, out), cons


@dataclass
class _Combine:
    """One symbolic combine: inputs, outputs (``out``, ``lse``, ``mass`` = exp(LSE)), the weight atoms,
    ``exp(M)``, Z, the inverse atoms it created, the exp-law premises and the law instances."""

    states: list
    out: XV
    lse: XV
    mass: Any
    weights: list
    exp_m: Any
    z: XV
    inv_atoms: list
    premises: list
    laws: list

    @property
    def state(self) -> State:
        """The combined state."""
        return State(self.lse, self.mass, self.out)


def combine_z3(A: Z3Arith, states: Sequence[State], defects: frozenset) -> _Combine:
    """Run :func:`combine_rows` symbolically on ``states`` and instantiate the exponential's laws on its terms.

    The output mass is a fresh atom ``exp(LSE)`` (0 when LSE is -inf); ``exp(M)`` is another atom.
    Law instances (``exp(a) * exp(b) = exp(a + b)`` guarded by ``a + b = c``): ``a = lse_s - Mc, b = M,
    c = lse_s`` for every split s, and ``a = log Z, b = M, c = LSE``.
    """
    n_exp, n_log, n_inv = len(A.exp_atoms), len(A.log_atoms), len(A.inv_atoms)
    trace: dict[str, Any] = {}
    out, lse = combine_rows([s.lse for s in states], [s.out for s in states], A, defects, trace)
    m = trace["M"]
    weights = A.exp_atoms[n_exp:n_exp + len(states)]
    (log_atom,) = A.log_atoms[n_log:]
    mass_out = A.fresh_real("Eout")
    A.exp_atoms.append(Atom(lse.v, mass_out, lse.fin()))
    exp_m = A.fresh_real("EM")
    A.exp_atoms.append(Atom(m.v, exp_m, m.fin()))
    laws: list[Any] = [z3.Implies(z3.Not(lse.fin()), mass_out == 0)]
    premises = []
    for w, st in zip(weights, states):
        premise = z3.And(w.guard, m.fin(), st.lse.fin(), w.x + m.v == st.lse.v)
        premises.append(premise)
        laws.append(z3.Implies(premise, w.y * exp_m == st.mass))
    laws.append(z3.Implies(z3.And(log_atom.guard, m.fin(), lse.fin(), log_atom.x + m.v == lse.v),
                           log_atom.y * exp_m == mass_out))
    return _Combine(list(states), out, lse, mass_out, weights, exp_m, trace["Z"], A.inv_atoms[n_inv:],
                    premises, laws)


def product_instances(cb: _Combine, total: Any, u: Any, r: Any) -> list[Any]:
    """Implied product instances linking a combine to the exact merge with total ``total`` and ``u = 1/total``.

    Under ``total > 0`` the ``structure`` lemma gives ``w_j * exp(M) = S_j`` for every split and
    ``r * Z = 1`` for the combine's inverse ``r``, and the reference defines ``u * total = 1``. Each instance
    multiplies one of these equalities by a term, so it is implied and assumes nothing; with them
    ``w_s * r = S_s * u`` is linear over monomials (z3's own nonlinear search times out from 3-5 splits on).
    """
    hints: list[Any] = []
    e, z_v = cb.exp_m, cb.z.v
    for w, st in zip(cb.weights, cb.states):
        terms = [w.y * r * (u * total - 1), w.y * e * u * (r * z_v - 1), u * (w.y * e - st.mass)]
        terms += [w.y * r * u * (wj.y * e - other.mass) for wj, other in zip(cb.weights, cb.states)]
        hints += [z3.Implies(total > 0, t == 0) for t in terms]
    return hints


def exp_facts(atoms: Sequence[Atom], pairwise: Sequence[Atom] = ()) -> list[Any]:
    """Facts of the real exponential: on every atom positivity and the position relative to exp(0) = 1;
    on every pair of ``pairwise`` atoms monotonicity and injectivity (``x < y -> exp x < exp y``)."""
    facts: list[Any] = []
    for a in atoms:
        facts += [
            z3.Implies(a.guard, a.y > 0),
            z3.Implies(z3.And(a.guard, a.x <= 0), a.y <= 1),
            z3.Implies(z3.And(a.guard, a.x >= 0), a.y >= 1),
            z3.Implies(z3.And(a.guard, a.x == 0), a.y == 1),
        ]
    pw = list(pairwise)
    for i, a in enumerate(pw):
        for b in pw[i + 1:]:
            both = z3.And(a.guard, b.guard)
            facts += [
                z3.Implies(z3.And(both, a.x == b.x), a.y == b.y),
                z3.Implies(z3.And(both, a.x < b.x), a.y < b.y),
                z3.Implies(z3.And(both, b.x < a.x), b.y < a.y),
            ]
    return facts


# --------------------------------------------------------------------------------------------
# Solving and witnesses.
# --------------------------------------------------------------------------------------------


def _num(model: z3.ModelRef, term: Any) -> float:
    """A model value as a float (rationals exactly, algebraic numbers approximately)."""
    val = model.eval(term, model_completion=True)
    if z3.is_int_value(val):
        return float(val.as_long())
    if z3.is_rational_value(val):
        return float(Fraction(val.numerator_as_long(), val.denominator_as_long()))
    if z3.is_algebraic_value(val):
        return float(val.approx(20).as_fraction())
    return float(str(val))


def model_kind(model: z3.ModelRef, x: XV) -> int:
    return int(model.eval(x.k, model_completion=True).as_long())


def xv_float(model: z3.ModelRef, x: XV) -> float:
    kind = model_kind(model, x)
    if kind == FIN:
        return _num(model, x.v)
    return {PINF: math.inf, NINF: -math.inf, NAN: math.nan}[kind]


def fmt(x: float) -> Any:
    """JSON-friendly float: non-finite values as the strings "nan", "inf", "-inf"."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def state_witness(model: z3.ModelRef, st: State) -> dict[str, Any]:
    """A witness split: its mass, ``lse = log(mass)`` (concretised from the mass, not the atom) and output."""
    mass = _num(model, st.mass)
    lse = math.log(mass) if mass > 0 else -math.inf
    return {"mass": fmt(mass), "lse": fmt(lse), "out": fmt(xv_float(model, st.out))}


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    if math.isnan(a) or math.isnan(b):
        return False
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def replay_row(splits: Sequence[dict[str, Any]], defects: Iterable[str] = ()) -> dict[str, Any]:
    """Concrete float replay of a witness row: the combine (with ``defects``) versus the exact merge.

    Invariant checked: the combine of the splits' ``(lse, out)`` equals ``exact_merge_float`` of their
    ``(mass, out)`` within 1e-9 relative (flash_fwd_combine_kernel.h vs its specification).
    """
    lses = [float(s["lse"]) for s in splits]
    outs = [float(s["out"]) for s in splits]
    masses = [float(s["mass"]) for s in splits]
    o, lse = combine_float(lses, outs, defects)
    o_ref, lse_ref = exact_merge_float(masses, outs)
    ok = close(o, o_ref) and close(lse, lse_ref)
    return {"O": fmt(o), "LSE": fmt(lse), "O_ref": fmt(o_ref), "LSE_ref": fmt(lse_ref), "violates": not ok}


# --------------------------------------------------------------------------------------------
# Entry point.
# --------------------------------------------------------------------------------------------


_result = theorem_result
