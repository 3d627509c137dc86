"""FA3's split-KV combine written once over an abstract arithmetic, and evaluated over IEEE floats.

Invariant: :func:`combine_rows` is the per-row math of ``hopper/flash_fwd_combine_kernel.h`` (steps 4 and 6 of
its ``operator()``), the same semantics ``refmodel/combine.py`` implements; :class:`FloatArith` evaluates it
with IEEE rules (used to replay witnesses and to check agreement with ``refmodel.combine``).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence


# --------------------------------------------------------------------------------------------
# The combine, written once over an abstract arithmetic.
# --------------------------------------------------------------------------------------------


def combine_rows(lses: Sequence[Any], outs: Sequence[Any], A: Any,
                 defects: Iterable[str] = (), trace: Optional[dict] = None) -> tuple[Any, Any]:
    """FA3's per-row combine of ``n`` splits over arithmetic ``A``: ``(O, LSE)`` (hopper/flash_fwd_combine_kernel.h).

    Invariant: with no defect this is exactly the kernel's step 4 (max, guarded shift, weights, log-sum,
    guarded inverse) and step 6 (ascending accumulation skipping scales that are not > 0).
    ``defects`` may name entries of :data:`spec.theorems.algebra.DEFECTS` to seed a bug; ``trace``, when given, receives the
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
