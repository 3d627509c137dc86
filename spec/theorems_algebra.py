"""Theorem 5 of issue 3: FA3's split-KV combine is the exact merge of partial softmax states.

Source modelled: the per-row math of ``hopper/flash_fwd_combine_kernel.h`` (steps 4 and 6 of its
``operator()``), the same semantics ``refmodel/combine.py`` implements concretely (FACTS.md section 2,
"Combine"). Written here in our own words, once, over an abstract arithmetic (:func:`combine_rows`), and
evaluated two ways: over IEEE floats (:class:`FloatArith`, used to replay witnesses and to check
agreement with ``refmodel.combine``) and symbolically over z3 (:class:`Z3Arith`).

Per row, for splits ``s = 0..n-1`` with partial log-sum-exp ``lse_s`` and partial output ``O_s``::

    M   = max_s lse_s                  (fmaxf: NaN operands ignored)
    Mc  = 0 if M == -inf else M        (the -inf guard)
    w_s = exp(lse_s - Mc);  Z = sum_s w_s;  LSE = log(Z) + M
    inv = 0 if Z == 0 or Z is NaN else 1/Z;  c_s = w_s * inv
    O   = sum_s c_s * O_s  over the splits with c_s > 0 (ascending)

What is proved (quantifier-free z3 queries, ``unsat`` of each negation):

* ``combine_exact_merge``: for every n in ``split_counts`` (default 1..8 and 16) and every assignment in which each
  split is either *empty* (``lse_s = -inf``, ``O_s`` arbitrary: any real, +-inf or NaN, because FA3 never
  writes it) or *non-empty* with unnormalised mass ``S_s > 0``, ``lse_s = log S_s`` and a finite ``O_s``:
  with ``T = sum_s S_s`` and ``u = 1/T``, (a) if ``T > 0``: O is finite and ``O = sum_s S_s * u * O_s``
  -- the exact merge ``sum_s S_s O_s / sum_s S_s`` (an empty split's term is 0 since ``S_s = 0``) -- and LSE
  is finite with ``exp(LSE) = T``; every weight ``w_s`` lies in ``(0, 1]`` and the max split's is 1, so
  ``Z >= 1`` and every scale ``w_s / Z`` is in ``[0, 1]`` (no overflow, no division by a tiny sum); (b) if
  ``T = 0``: ``O = 0`` and ``LSE = -inf``. The kernel always combines ``kMax`` slots (16 at least) and fills
  those past a row's split count with ``-inf``, i.e. empty splits: n = 16 therefore covers every row of the
  16-slot kernel; 1..8 are checked on their own as well (n = 32 also proves, in about 2 s).
* ``combine_all_empty``: all ``n`` splits empty (outputs of any kind) gives ``(O, LSE) = (0, -inf)``.
* ``merge_commutative`` / ``merge_associative``: the two-way merge (the combine with two splits) of states
  ``(O, LSE)`` is commutative and associative, as states: both results empty (``LSE = -inf``, ``O = 0``) or
  both non-empty with equal LSE and equal O.

How (so that each query stays within seconds): ``combine_exact_merge`` is a chain of lemmas, each a z3 query
that assumes only the lemmas proved before it on the same variables (see :func:`_exact_merge_case`); a query
that leaves constraints out is weaker, so its ``unsat`` is still a proof. Its nonlinear steps get *implied
product instances*: an equality already entailed (an exp-law instance, ``inv * Z = 1``, ``u * T = 1``)
multiplied by a term, which assumes nothing new and makes the identity linear over monomials. The merge
theorems instantiate the n = 2 exact-merge relation on every merge call (sound only because that theorem is
proved first, under the same defects; otherwise they run on the raw encoding, which can refute but not
prove) and finish with linear reasoning plus the true field fact ``x*T = y*T, T > 0 -> x = y``.

What is abstracted (and why the proof is still sound):

* Finite floats are exact reals: rounding, overflow and underflow of finite arithmetic are not modelled
  (FA3 builds with fast math; ``refmodel`` checks tolerances, not bits). Non-finite values are modelled
  exactly: every value is a kind (finite, +inf, -inf, NaN) plus a real, with IEEE rules for ``+``, ``*``,
  ``fmaxf``, comparisons (NaN compares false), ``exp``, ``log`` and the guarded inverse.
* ``exp`` and ``log`` are uninterpreted: each application gets a fresh real, constrained only by facts true
  of the real exponential, instantiated on the finitely many terms the combine creates: ``exp(x) > 0``,
  ``exp(-inf) = 0``; ``x <= 0 -> exp(x) <= 1``, ``x >= 0 -> exp(x) >= 1``, ``x = 0 -> exp(x) = 1``;
  ``exp(log Z) = Z``; the homomorphism ``exp(a) * exp(b) = exp(a + b)`` for ``a = lse_s - Mc, b = M``
  (every split s) and ``a = log Z, b = M``, each guarded by its premise ``a + b = lse_s`` resp.
  ``a + b = LSE``; and, where LSE values are compared, ``x = y -> exp x = exp y`` and
  ``x < y -> exp x < exp y``. Every added fact holds for the real exp/log, so ``unsat`` is a proof for
  them; a ``sat`` answer could in principle be spurious, so witnesses carry a concrete float replay
  (``witness["replay"]``: lse recomputed as ``log(mass)``).
* A partial LSE is never NaN or +inf (the epilogue writes ``-inf`` for an empty or NaN sum), and the
  combine acts coordinate-wise with the same scales, so one output coordinate stands for all ``dv``.
* The combine capacity ``kMax`` and split counts from metadata are theorems 1-4's concern, not modelled here.

A ``z3`` ``unknown`` (timeout) is reported ``"inconclusive"``, never ``"proved"``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Iterable, Optional, Sequence

import z3

from spec.results import TheoremResult


from spec.z3ctx import ctx as _ctx
from spec.theorems import own_defects, select, theorem_result
from spec.z3ctx import isolated as _isolated
from spec.z3ctx import solve as _solve
from spec.z3ctx import Int as _Int
from spec.z3ctx import Real as _Real
from spec.z3ctx import Bool as _Bool
from spec.z3ctx import IntVal as _IntVal
from spec.z3ctx import RealVal as _RealVal


__all__ = [
    "DEFECTS",
    "THEOREMS",
    "THEOREM_NUMBER",
    "DEFAULT_SPLIT_COUNTS",
    "FloatArith",
    "Z3Arith",
    "combine_rows",
    "combine_float",
    "exact_merge_float",
    "replay_row",
    "replay_merges",
    "run_algebra_theorems",
]

#: Seeded defects of the combine, for negative controls: name -> description.
DEFECTS: dict[str, str] = {
    "no-neg-inf-guard": "Mc = M even when M == -inf, so an all-empty row computes exp(-inf - -inf) = NaN",
    "no-skip-nonpositive": "accumulate every split, also those with scale <= 0 or NaN (reads garbage O_partial)",
    "wrong-normalisation": "scales are not divided by Z (inv = 1), so O = sum_s w_s * O_s",
    "lse-missing-max": "LSE = log(Z) without adding back the max M",
}

#: Theorem names in the order they run (all of them theorem 5 of issue 3).
THEOREMS = ("combine_exact_merge", "combine_all_empty", "merge_commutative", "merge_associative")
THEOREM_NUMBER = "5"

#: Split counts ``combine_exact_merge`` and ``combine_all_empty`` check by default (16 = the smallest kMax).
DEFAULT_SPLIT_COUNTS = (1, 2, 3, 4, 5, 6, 7, 8, 16)

# --------------------------------------------------------------------------------------------
# The combine, written once over an abstract arithmetic.
# --------------------------------------------------------------------------------------------


def combine_rows(lses: Sequence[Any], outs: Sequence[Any], A: Any,
                 defects: Iterable[str] = (), trace: Optional[dict] = None) -> tuple[Any, Any]:
    """FA3's per-row combine of ``n`` splits over arithmetic ``A``: ``(O, LSE)`` (hopper/flash_fwd_combine_kernel.h).

    Invariant: with no defect this is exactly the kernel's step 4 (max, guarded shift, weights, log-sum,
    guarded inverse) and step 6 (ascending accumulation skipping scales that are not > 0).
    ``defects`` may name entries of :data:`DEFECTS` to seed a bug; ``trace``, when given, receives the
    intermediate values (``M``, ``weights``, ``Z``, ``scales``).
    """
    defects = frozenset(defects)
    if not lses or len(lses) != len(outs):
        raise ValueError(f"lses/outs: need n >= 1 splits of equal count, got {len(lses)} and {len(outs)}")
    m = lses[0]
    for lse in lses[1:]:
        m = A.fmax(m, lse)
    mc = m if "no-neg-inf-guard" in defects else A.ite(A.is_ninf(m), A.const(0), m)
    weights = [A.exp(A.sub(lse, mc)) for lse in lses]
    z = A.const(0)
    for w in weights:
        z = A.add(z, w)
    log_z = A.log(z)
    lse_out = log_z if "lse-missing-max" in defects else A.add(log_z, m)
    inv = A.const(1) if "wrong-normalisation" in defects else A.inv_or_zero(z)
    scales = [A.mul(w, inv) for w in weights]
    out = A.const(0)
    for scale, o in zip(scales, outs):
        term = A.add(out, A.mul(scale, o))
        out = term if "no-skip-nonpositive" in defects else A.ite(A.gt0(scale), term, out)
    if trace is not None:
        trace.update(M=m, weights=weights, Z=z, inv=inv, scales=scales)
    return out, lse_out


class FloatArith:
    """IEEE float64 semantics for :func:`combine_rows` (the kernel's float32 math without rounding differences)."""

    @staticmethod
    def const(c: float) -> float:
        """The float constant ``c``."""
        return float(c)

    @staticmethod
    def add(a: float, b: float) -> float:
        """IEEE addition."""
        return a + b

    @staticmethod
    def sub(a: float, b: float) -> float:
        """IEEE subtraction."""
        return a - b

    @staticmethod
    def mul(a: float, b: float) -> float:
        """IEEE multiplication (0 * inf = NaN)."""
        return a * b

    @staticmethod
    def fmax(a: float, b: float) -> float:
        """CUDA ``fmaxf``: a NaN operand is ignored."""
        if math.isnan(a):
            return b
        if math.isnan(b):
            return a
        return max(a, b)

    @staticmethod
    def exp(a: float) -> float:
        """``expf`` with overflow to +inf."""
        try:
            return math.exp(a)
        except OverflowError:
            return math.inf

    @staticmethod
    def log(a: float) -> float:
        """``logf``: log 0 = -inf, log of a negative or NaN = NaN."""
        if math.isnan(a) or a < 0:
            return math.nan
        if a == 0:
            return -math.inf
        return math.log(a)

    @staticmethod
    def inv_or_zero(z: float) -> float:
        """``0 if z == 0 or z is NaN else 1/z`` (the kernel's ``inv_sum``)."""
        if z == 0 or math.isnan(z):
            return 0.0
        return 1.0 / z

    @staticmethod
    def gt0(a: float) -> bool:
        """``a > 0`` (False for NaN)."""
        return a > 0

    @staticmethod
    def is_ninf(a: float) -> bool:
        """``a == -inf``."""
        return a == -math.inf

    @staticmethod
    def ite(c: bool, a: float, b: float) -> float:
        """``a if c else b``."""
        return a if c else b


def combine_float(lses: Sequence[float], outs: Sequence[float], defects: Iterable[str] = ()) -> tuple[float, float]:
    """Concrete float evaluation of :func:`combine_rows` for one row and one output coordinate (flash_fwd_combine_kernel.h)."""
    return combine_rows([float(x) for x in lses], [float(x) for x in outs], FloatArith, defects)


def exact_merge_float(masses: Sequence[float], outs: Sequence[float]) -> tuple[float, float]:
    """The exact merge ``(sum S_s O_s / sum S_s, log sum S_s)``, ``(0, -inf)`` without mass (the combine's specification).

    Splits with zero mass contribute nothing, whatever their (possibly non-finite) output.
    """
    total = sum(float(s) for s in masses)
    if total == 0:
        return 0.0, -math.inf
    num = sum(float(s) * float(o) for s, o in zip(masses, outs) if s > 0)
    return num / total, math.log(total)


# --------------------------------------------------------------------------------------------
# Symbolic arithmetic: values are (kind, real) with IEEE rules for the non-finite kinds.
# --------------------------------------------------------------------------------------------

FIN, PINF, NINF, NAN = 0, 1, 2, 3
_KIND_NAMES = {FIN: "finite", PINF: "+inf", NINF: "-inf", NAN: "nan"}


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
class _Atom:
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
        self.exp_atoms: list[_Atom] = []
        self.log_atoms: list[_Atom] = []
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
        self.exp_atoms.append(_Atom(a.v, y, a.fin()))
        self.facts += [z3.Implies(a.fin(), y > 0), z3.Implies(a.is_kind(NINF), y == 0)]
        kind = z3.If(z3.Or(a.fin(), a.is_kind(NINF)), FIN, z3.If(a.is_kind(PINF), PINF, NAN))
        return XV(_simp(kind), y)

    def log(self, a: XV) -> XV:
        """``log``: log 0 = -inf, log(negative or -inf or NaN) = NaN, log(+inf) = +inf, finite > 0 -> atom."""
        ell = self.fresh_real("log")
        pos = z3.And(a.fin(), a.v > 0)
        self.log_atoms.append(_Atom(ell, a.v, pos))  # exp(ell) = a.v
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
class _State:
    """A symbolic partial softmax state: ``lse`` (XV), its mass ``exp(lse)`` (0 when empty) and output ``out`` (XV)."""

    lse: XV
    mass: Any
    out: XV


def _input_state(A: Z3Arith, name: str) -> tuple[_State, Any]:
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
    A.exp_atoms.append(_Atom(lse.v, mass, z3.Not(empty)))
    return _State(lse, mass, out), cons


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
    def state(self) -> _State:
        """The combined state."""
        return _State(self.lse, self.mass, self.out)


def _combine_z3(A: Z3Arith, states: Sequence[_State], defects: frozenset) -> _Combine:
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
    A.exp_atoms.append(_Atom(lse.v, mass_out, lse.fin()))
    exp_m = A.fresh_real("EM")
    A.exp_atoms.append(_Atom(m.v, exp_m, m.fin()))
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


def _product_instances(cb: _Combine, total: Any, u: Any, r: Any) -> list[Any]:
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


def _exp_facts(atoms: Sequence[_Atom], pairwise: Sequence[_Atom] = ()) -> list[Any]:
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


def _kind(model: z3.ModelRef, x: XV) -> int:
    return int(model.eval(x.k, model_completion=True).as_long())


def _xv_float(model: z3.ModelRef, x: XV) -> float:
    kind = _kind(model, x)
    if kind == FIN:
        return _num(model, x.v)
    return {PINF: math.inf, NINF: -math.inf, NAN: math.nan}[kind]


def _fmt(x: float) -> Any:
    """JSON-friendly float: non-finite values as the strings "nan", "inf", "-inf"."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _state_witness(model: z3.ModelRef, st: _State) -> dict[str, Any]:
    """A witness split: its mass, ``lse = log(mass)`` (concretised from the mass, not the atom) and output."""
    mass = _num(model, st.mass)
    lse = math.log(mass) if mass > 0 else -math.inf
    return {"mass": _fmt(mass), "lse": _fmt(lse), "out": _fmt(_xv_float(model, st.out))}


def _close(a: float, b: float, rel: float = 1e-9) -> bool:
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
    ok = _close(o, o_ref) and _close(lse, lse_ref)
    return {"O": _fmt(o), "LSE": _fmt(lse), "O_ref": _fmt(o_ref), "LSE_ref": _fmt(lse_ref), "violates": not ok}


# --------------------------------------------------------------------------------------------
# Theorem 5a: the combine is the exact merge (a chain of lemmas, each its own z3 query).
# --------------------------------------------------------------------------------------------


def _exact_merge_case(n: int, defects: frozenset, timeout_s: float) -> dict[str, Any]:
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
        st, c = _input_state(A, f"x{n}s{s}")
        states.append(st)
        cons.append(c)
    cb = _combine_z3(A, states, defects)
    total = z3.Sum([st.mass for st in states]) if n > 1 else states[0].mass
    u = _Real(f"x{n}_u")
    reference_def = z3.Implies(total > 0, u * total == 1)  # u = 1/T: the exact merge's normaliser
    base = cons + A.facts + cb.laws + _exp_facts(A.exp_atoms + A.log_atoms) + [reference_def]
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
    # or earlier lemmas by name)
    lemmas = [
        ("kinds", kinds, [], ["base"]),
        ("core", core, [], ["base"]),
        ("coefficients", z3.Implies(total > 0, coefficients), _product_instances(cb, total, u, r),
         ["reference", "core"]),
        ("output", z3.Implies(total > 0, o_v == reference),
         [z3.Implies(total > 0, st.out.v * (w.y * r - st.mass * u) == 0) for w, st in zip(cb.weights, states)],
         ["core", "coefficients"]),
    ]
    claim = z3.If(total > 0, z3.And(o.fin(), o_v == reference, lse.fin(), cb.mass == total, bounded), empty_result)
    steps: dict[str, Any] = {}
    proved: dict[str, Any] = {}
    for name, lemma, hints, deps in lemmas:
        t0 = time.perf_counter()
        # A query may leave constraints out (only weakening it), so an unsat answer is still a proof.
        pool = {"base": base, "reference": [reference_def, *cons]}
        assumed = [c for d in deps for c in pool.get(d, [proved.get(d)])]
        res, _ = _solve(assumed + hints + [z3.Not(lemma)], timeout_s)
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
        splits = [_state_witness(model, st) for st in states]
        out["witness"] = {
            "n_splits": n,
            "splits": splits,
            "combine": {"O": _fmt(_xv_float(model, o)), "LSE_kind": _KIND_NAMES[_kind(model, lse)]},
            "defects": sorted(defects),
            "replay": replay_row(splits, defects),
        }
    return out


def _counts(split_counts: Any) -> tuple[int, ...]:
    """Split counts to check; an int n means 1..n."""
    return tuple(range(1, split_counts + 1)) if isinstance(split_counts, int) else tuple(split_counts)


def _theorem_exact_merge(timeout_s: float, defects: frozenset, split_counts: Sequence[int]) -> TheoremResult:
    name = "combine_exact_merge"
    split_counts = _counts(split_counts)
    t0 = time.perf_counter()
    per_n: dict[int, Any] = {}
    verdict, witness, message = "proved", {}, ""
    for n in split_counts:
        case = _exact_merge_case(n, defects, timeout_s)
        per_n[n] = case["lemmas"]
        if case["result"] == "sat":
            verdict, witness = "refuted", case["witness"]
            message = f"the combine differs from the exact merge for n={n} splits"
            if not witness["replay"]["violates"]:
                verdict = "inconclusive"
                message = f"n={n}: z3's witness does not replay concretely (spurious under the exp abstraction)"
            break
        if case["result"] == "unknown":
            verdict, message = "inconclusive", f"z3 returned unknown for n={n} (timeout {timeout_s}s per query)"
            break
    if verdict == "proved":
        message = (f"FA3 combine == exact merge sum_s S_s*O_s / sum_s S_s, LSE = log sum_s S_s, for n in {list(split_counts)} "
                   "splits, any of them empty with garbage output; weights in (0,1], Z >= 1")
    return _result(name, verdict, t0, witness, message, {"per_n": per_n, "split_counts": list(split_counts)})


# --------------------------------------------------------------------------------------------
# Theorem 5b: all-empty rows.
# --------------------------------------------------------------------------------------------


def _theorem_all_empty(timeout_s: float, defects: frozenset, split_counts: Sequence[int]) -> TheoremResult:
    name = "combine_all_empty"
    split_counts = _counts(split_counts)
    t0 = time.perf_counter()
    per_n: dict[int, Any] = {}
    verdict, witness, message = "proved", {}, ""
    for n in split_counts:
        tq = time.perf_counter()
        A = Z3Arith(f"e{n}")
        states, cons = [], []
        for s in range(n):
            st, c = _input_state(A, f"e{n}s{s}")
            states.append(st)
            cons += [c, st.mass == 0]
        o, lse = combine_rows([st.lse for st in states], [st.out for st in states], A, defects)
        prop = z3.And(o.fin(), o.v == 0, lse.is_kind(NINF))
        res, model = _solve(cons + A.facts + _exp_facts(A.exp_atoms + A.log_atoms) + [z3.Not(prop)], timeout_s)
        per_n[n] = {"result": res, "seconds": round(time.perf_counter() - tq, 3)}
        if res == "sat":
            splits = [_state_witness(model, st) for st in states]
            witness = {
                "n_splits": n,
                "splits": splits,
                "combine": {"O": _fmt(_xv_float(model, o)), "LSE": _fmt(_xv_float(model, lse))},
                "defects": sorted(defects),
                "replay": replay_row(splits, defects),
            }
            verdict, message = "refuted", f"an all-empty row of n={n} splits does not combine to (0, -inf)"
            if not witness["replay"]["violates"]:
                verdict = "inconclusive"
                message = f"n={n}: z3's witness does not replay concretely (spurious under the exp abstraction)"
            break
        if res == "unknown":
            verdict, message = "inconclusive", f"z3 returned unknown for n={n} (timeout {timeout_s}s)"
            break
    if verdict == "proved":
        message = f"all-empty rows (n in {list(split_counts)} splits, outputs of any kind) combine to (0, -inf)"
    return _result(name, verdict, t0, witness, message, {"per_n": per_n, "split_counts": list(split_counts)})


# --------------------------------------------------------------------------------------------
# Theorem 5c/5d: the two-way merge is commutative and associative.
# --------------------------------------------------------------------------------------------


def _merge_spec(x: _State, y: _State, z: _State) -> list[Any]:
    """The exact-merge relation for a two-way merge ``z = merge(x, y)`` (``combine_exact_merge`` at n = 2).

    Multiplying the proved ``O = sum_s S_s * u * O_s`` by the total ``T = S_x + S_y`` gives
    ``O * T = S_x * O_x + S_y * O_y``, the form used here; ``z.mass`` is ``exp(LSE)`` (0 when LSE = -inf).
    """
    total = x.mass + y.mass
    return [z3.If(total > 0,
                  z3.And(z.out.fin(), z.lse.fin(), z.mass == total,
                         z.out.v * total == x.mass * x.out.v + y.mass * y.out.v),
                  z3.And(z.out.fin(), z.out.v == 0, z.lse.is_kind(NINF), z.mass == 0))]


def _merge_theorem(name: str, timeout_s: float, defects: frozenset) -> TheoremResult:
    """Commutativity / associativity of the two-way merge.

    When ``combine_exact_merge`` is proved for n = 2 under the same defects, every merge call is replaced by
    a state related to its inputs by that proved relation (:func:`_merge_spec`): the combine satisfies it on
    every input of the theorem's domain, and merged states are again in that domain (empty: mass 0, LSE
    -inf; non-empty: finite LSE with exp(LSE) = mass, finite O), so the identity proved for any merge
    satisfying the relation holds for the combine. Otherwise the query holds the combine's raw encoding,
    which can refute (witnesses are replayed concretely) but rarely prove.
    """
    t0 = time.perf_counter()
    pre = _exact_merge_case(2, defects, timeout_s)
    use_spec = pre["result"] == "unsat"
    tag = "mc" if name == "merge_commutative" else "ma"
    A = Z3Arith(tag)
    labels = ["a", "b"] if name == "merge_commutative" else ["a", "b", "c"]
    states, cons = [], []
    for lab in labels:
        st, c = _input_state(A, f"{tag}_{lab}")
        states.append(st)
        cons.append(c)
    facts: list[Any] = []
    merged: list[tuple[_State, _State, _State]] = []
    law_facts: list[Any] = []

    def merge(x: _State, y: _State) -> _State:
        if use_spec:
            k = len(merged)
            z = _State(XV(_Int(f"{tag}_z{k}_lk"), _Real(f"{tag}_z{k}_lse")), _Real(f"{tag}_z{k}_S"),
                       XV(_Int(f"{tag}_z{k}_ok"), _Real(f"{tag}_z{k}_o")))
            A.exp_atoms.append(_Atom(z.lse.v, z.mass, z.lse.fin()))
            facts.extend(_merge_spec(x, y, z))
        else:
            cb = _combine_z3(A, [x, y], defects)
            law_facts.extend(cb.laws)
            z = cb.state
        merged.append((x, y, z))
        return z

    if name == "merge_commutative":
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
        constraints = cons + facts + _exp_facts([], pairwise=outputs) + [z3.Not(equal)]
    else:
        # every exp/log application pairwise consistent and monotone: fewer spurious witnesses
        atoms = A.exp_atoms + A.log_atoms
        constraints = cons + A.facts + law_facts + _exp_facts(atoms, pairwise=atoms) + [z3.Not(equal)]
    res, model = _solve(constraints, timeout_s)
    witness: dict[str, Any] = {}
    details: dict[str, Any] = {"result": res, "uses_exact_merge_n2": use_spec, "exact_merge_n2": pre["lemmas"]}
    if res == "unsat":
        verdict = "proved"
        message = (f"{shape} as states (equal LSE and O, or both empty with O = 0), any state empty (with any "
                   "garbage output) or not; from the proved n = 2 exact merge")
    elif res == "sat":
        verdict, message = "refuted", f"{shape} fails"
        concrete = {lab: _state_witness(model, st) for lab, st in zip(labels, states)}
        witness = {
            "states": concrete,
            "symbolic_left": {"O": _fmt(_xv_float(model, left.out)), "LSE_kind": _KIND_NAMES[_kind(model, left.lse)]},
            "symbolic_right": {"O": _fmt(_xv_float(model, right.out)),
                               "LSE_kind": _KIND_NAMES[_kind(model, right.lse)]},
            "defects": sorted(defects),
            "replay": replay_merges(name, concrete, defects),
        }
        if not witness["replay"]["violates"]:
            verdict = "inconclusive"
            message = f"{shape}: z3's witness does not replay concretely (spurious under the exp abstraction)"
    else:
        verdict = "inconclusive"
        message = f"z3 returned unknown (timeout {timeout_s}s)" + (
            "" if use_spec else "; combine_exact_merge is not proved for n = 2 under these defects")
    return _result(name, verdict, t0, witness, message, details)


def replay_merges(name: str, states: dict[str, dict[str, Any]], defects: Iterable[str] = ()) -> dict[str, Any]:
    """Concrete float replay of a merge witness: both sides of the commutativity/associativity identity.

    Invariant checked: ``merge(a, b) == merge(b, a)`` resp. ``merge(merge(a, b), c) == merge(a, merge(b, c))``
    as states, where ``merge`` is :func:`combine_float` with two splits (flash_fwd_combine_kernel.h).
    """
    def merge(x: tuple[float, float], y: tuple[float, float]) -> tuple[float, float]:
        o, lse = combine_float([x[1], y[1]], [x[0], y[0]], defects)
        return o, lse

    st = {k: (float(v["out"]), float(v["lse"])) for k, v in states.items()}
    if name == "merge_commutative":
        left, right = merge(st["a"], st["b"]), merge(st["b"], st["a"])
    else:
        left = merge(merge(st["a"], st["b"]), st["c"])
        right = merge(st["a"], merge(st["b"], st["c"]))
    both_empty = left[1] == -math.inf and right[1] == -math.inf and left[0] == 0 and right[0] == 0
    same = both_empty or (_close(left[0], right[0]) and _close(left[1], right[1]))
    return {"left": {"O": _fmt(left[0]), "LSE": _fmt(left[1])},
            "right": {"O": _fmt(right[0]), "LSE": _fmt(right[1])}, "violates": not same}


def _atom_of(A: Z3Arith, y: Any) -> _Atom:
    for atom in A.exp_atoms:
        if atom.y is y:
            return atom
    raise KeyError("no exp atom for this term")


# --------------------------------------------------------------------------------------------
# Entry point.
# --------------------------------------------------------------------------------------------


_result = theorem_result


def _check_defects(defects: Iterable[str]) -> frozenset:
    return own_defects(defects, DEFECTS)


def _select(only: Optional[Iterable[str]]) -> list[str]:
    return select(only, THEOREMS, lambda _t: THEOREM_NUMBER)


def run_algebra_theorems(timeout_s: float = 10, only: Optional[Iterable[str]] = None,
                         defects: Iterable[str] = frozenset(),
                         split_counts: Sequence[int] = DEFAULT_SPLIT_COUNTS,
                         cases_dir: Optional[str] = None) -> list[TheoremResult]:
    """Check theorem 5: FA3's combine is the exact, commutative, associative merge of softmax states (hopper/flash_fwd_combine_kernel.h).

    ``timeout_s`` bounds each z3 query; ``only`` selects theorems by name, number ("5") or substring (entries
    matching nothing here are ignored); ``defects`` seeds entries of :data:`DEFECTS`
    (names from ``spec.theorems_cp.DEFECTS`` are accepted and ignored here); ``split_counts`` are the row split
    counts ``combine_exact_merge`` and ``combine_all_empty`` check (each >= 1; n = 64 times out).
    ``cases_dir`` is accepted for a uniform call signature; no case file is written: a refutation here exists
    only under a seeded combine defect, which a server scenario cannot replay (the witness carries its own
    float replay instead).
    """
    active = _check_defects(defects)
    split_counts = tuple(split_counts)
    if not split_counts or any(not isinstance(n, int) or n < 1 for n in split_counts):
        raise ValueError(f"split_counts: must be a non-empty sequence of ints >= 1, got {split_counts!r}")
    runners: dict[str, Callable[[], TheoremResult]] = {
        "combine_exact_merge": lambda: _theorem_exact_merge(timeout_s, active, split_counts),
        "combine_all_empty": lambda: _theorem_all_empty(timeout_s, active, split_counts),
        "merge_commutative": lambda: _merge_theorem("merge_commutative", timeout_s, active),
        "merge_associative": lambda: _merge_theorem("merge_associative", timeout_s, active),
    }
    return [_isolated(runners[name]) for name in _select(only)]
