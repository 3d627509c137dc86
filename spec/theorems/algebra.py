"""Theorem 5: FA3's split-KV combine is the exact merge of partial softmax states.

Source modelled: the per-row math of ``hopper/flash_fwd_combine_kernel.h`` (steps 4 and 6 of its
``operator()``), the same semantics ``refmodel/combine.py`` implements concretely (docs/facts-fa3.md section 2,
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

* ``combine-exact-merge``: for every n in ``split_counts`` (default 1..8 and 16) and every assignment in which each
  split is either *empty* (``lse_s = -inf``, ``O_s`` arbitrary: any real, +-inf or NaN, because FA3 never
  writes it) or *non-empty* with unnormalised mass ``S_s > 0``, ``lse_s = log S_s`` and a finite ``O_s``:
  with ``T = sum_s S_s`` and ``u = 1/T``, (a) if ``T > 0``: O is finite and ``O = sum_s S_s * u * O_s``
  -- the exact merge ``sum_s S_s O_s / sum_s S_s`` (an empty split's term is 0 since ``S_s = 0``) -- and LSE
  is finite with ``exp(LSE) = T``; every weight ``w_s`` lies in ``(0, 1]`` and the max split's is 1, so
  ``Z >= 1`` and every scale ``w_s / Z`` is in ``[0, 1]`` (no overflow, no division by a tiny sum); (b) if
  ``T = 0``: ``O = 0`` and ``LSE = -inf``. The kernel always combines ``kMax`` slots (16 at least) and fills
  those past a row's split count with ``-inf``, i.e. empty splits: n = 16 therefore covers every row of the
  16-slot kernel; 1..8 are checked on their own as well (n = 32 also proves, in about 2 s).
* ``combine-all-empty``: all ``n`` splits empty (outputs of any kind) gives ``(O, LSE) = (0, -inf)``.
* ``merge-commutative`` / ``merge-associative``: the two-way merge (the combine with two splits) of states
  ``(O, LSE)`` is commutative and associative, as states: both results empty (``LSE = -inf``, ``O = 0``) or
  both non-empty with equal LSE and equal O.

How (so that each query stays within seconds): ``combine-exact-merge`` is a chain of lemmas, each a z3 query
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

Modules: the combine over an abstract arithmetic and IEEE floats (``algebra_combine``), the z3
arithmetic, states and witnesses (``algebra_z3``), theorems 5a/5b (``algebra_merge``) and
5c/5d (``algebra_assoc``); this module is the entry point and re-exports their public names.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence

from spec.theorems.results import TheoremResult
from spec.theorems.base import SEEDED_DEFECTS, own_defects, select
from spec.theorems.jobs import Job, run_jobs

from spec.theorems.algebra_assoc import merge_theorem, replay_merges
from spec.theorems.algebra_combine import FloatArith, combine_float, combine_rows, exact_merge_float
from spec.theorems.algebra_merge import theorem_all_empty, exact_merge_job
from spec.theorems.algebra_z3 import Z3Arith, replay_row


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
    "algebra_jobs",
]

#: Seeded defects of the combine, for negative controls: name -> description.
DEFECTS: dict[str, str] = SEEDED_DEFECTS["algebra"]

#: Theorem names in the order they run (all of them theorem 5).
THEOREMS = ("combine-exact-merge", "combine-all-empty", "merge-commutative", "merge-associative")
THEOREM_NUMBER = "5"

#: Split counts ``combine-exact-merge`` and ``combine-all-empty`` check by default (16 = the smallest kMax).
DEFAULT_SPLIT_COUNTS = (1, 2, 3, 4, 5, 6, 7, 8, 16)


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
    (names from ``spec.theorems.cp.DEFECTS`` are accepted and ignored here); ``split_counts`` are the row split
    counts ``combine-exact-merge`` and ``combine-all-empty`` check (each >= 1; n = 64 times out).
    ``cases_dir`` is accepted for a uniform call signature; no case file is written: a refutation here exists
    only under a seeded combine defect, which a server scenario cannot replay (the witness carries its own
    float replay instead).
    """
    return run_jobs(algebra_jobs(timeout_s, only, defects, split_counts)).results


def algebra_jobs(timeout_s: float = 10, only: Optional[Iterable[str]] = None, defects: Iterable[str] = frozenset(),
                 split_counts: Sequence[int] = DEFAULT_SPLIT_COUNTS) -> list[Job]:
    """The jobs of :func:`run_algebra_theorems` (spec.theorems.jobs): the exact merge one part per split count."""
    active = _check_defects(defects)
    split_counts = tuple(split_counts)
    if not split_counts or any(not isinstance(n, int) or n < 1 for n in split_counts):
        raise ValueError(f"split_counts: must be a non-empty sequence of ints >= 1, got {split_counts!r}")
    runners: dict[str, Callable[[], TheoremResult]] = {
        "combine-all-empty": lambda: theorem_all_empty(timeout_s, active, split_counts),
        "merge-commutative": lambda: merge_theorem("merge-commutative", timeout_s, active),
        "merge-associative": lambda: merge_theorem("merge-associative", timeout_s, active),
    }
    weights = {"combine-all-empty": 0.35, "merge-commutative": 0.1, "merge-associative": 0.25}
    jobs = []
    for name in _select(only):
        if name == "combine-exact-merge":
            jobs.append(exact_merge_job(timeout_s, active, split_counts))
        else:
            jobs.append(Job((name,), (lambda fn=runners[name]: [fn()],), weight=weights[name], light=True,
                            key=(name, timeout_s, active, split_counts)))
    return jobs


def group_jobs(request) -> list[Job]:
    """The combine algebra's jobs for a :class:`spec.theorems.base.ProveRequest` (spec.theorems.jobs_for)."""
    return algebra_jobs(timeout_s=request.timeout_s, only=None if request.only is None else list(request.only))
