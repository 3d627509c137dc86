"""C++ ``int`` arithmetic as FA3's host code and prepare kernel do it: 32-bit two's complement.

FA3 (``hopper/flash_api.cpp``, ``hopper/heuristics.h``, ``hopper/flash_prepare_scheduler.cu``) computes sizes,
block counts and split counts in ``int``. Its host code is built without overflow checks, so a sum or product
past 2^31 - 1 wraps; integer division truncates toward zero (C++), not toward -inf (Python ``//``); a float
converted to ``int`` on the GPU (``cvt.rzi.s32.f32``) saturates at the int range and maps NaN to 0.
"""

from __future__ import annotations

import math

__all__ = ["INT32_MAX", "INT32_MIN", "to_int32", "c_div", "c_ceil_div", "f32_to_int_sat", "fits_int32"]

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


def to_int32(x: int) -> int:
    """Wrap a Python int to C++ ``int`` (two's complement 32-bit)."""
    return ((int(x) + 2**31) % 2**32) - 2**31


def fits_int32(x: int) -> bool:
    """True when x is representable as a C++ ``int``."""
    return INT32_MIN <= int(x) <= INT32_MAX


def c_div(a: int, b: int) -> int:
    """C++ ``a / b`` on ints: truncation toward zero (b != 0), result wrapped (INT_MIN / -1)."""
    a, b = int(a), int(b)
    if b == 0:
        raise ZeroDivisionError("c_div: integer division by zero")
    q = abs(a) // abs(b)
    return to_int32(q if (a >= 0) == (b > 0) else -q)


def c_ceil_div(a: int, b: int) -> int:
    """FA3's ``(a + b - 1) / b`` in int: the sum wraps, then the quotient truncates (``cutlass::ceil_div``)."""
    return c_div(to_int32(to_int32(a + b) - 1), b)


def f32_to_int_sat(x: float) -> int:
    """``static_cast<int>`` of a float on the GPU: saturating (PTX cvt), NaN -> 0; x is already integral here."""
    x = float(x)
    if math.isnan(x):
        return 0
    if x >= INT32_MAX:
        return INT32_MAX
    if x <= INT32_MIN:
        return INT32_MIN
    return int(x)
