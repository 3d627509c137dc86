"""Pins of refmodel.cint: C++ ``int`` arithmetic at its edges, each value worked out by hand.

FA3 computes sizes, block and split counts in ``int`` (hopper/flash_api.cpp, heuristics.h,
flash_prepare_scheduler.cu at 0251105a): sums wrap at 2^31, ``/`` truncates toward zero, and the GPU's
``static_cast<int>(float)`` (PTX ``cvt.rzi.s32.f32``) saturates and maps NaN to 0.
"""

import math

import pytest

from refmodel.cint import INT32_MAX, INT32_MIN, c_ceil_div, c_div, f32_to_int_sat, fits_int32, to_int32


def test_int32_range_is_twos_complement_32_bit():
    assert INT32_MAX == 2147483647 and INT32_MIN == -2147483648


@pytest.mark.parametrize("x, wrapped", [
    (0, 0), (1, 1), (-1, -1),
    (2**31 - 1, 2**31 - 1),        # INT_MAX stays
    (2**31, -(2**31)),             # INT_MAX + 1 wraps to INT_MIN
    (2**31 + 5, -(2**31) + 5),
    (-(2**31), -(2**31)),          # INT_MIN stays
    (-(2**31) - 1, 2**31 - 1),     # INT_MIN - 1 wraps to INT_MAX
    (2**32, 0), (2**32 + 7, 7), (3 * 2**32 - 2, -2),
])
def test_to_int32_wraps_modulo_2_to_the_32(x, wrapped):
    assert to_int32(x) == wrapped


def test_to_int32_accepts_integral_floats_and_numpy_style_values():
    assert to_int32(True) == 1 and to_int32(3.0) == 3


@pytest.mark.parametrize("x, fits", [(2**31 - 1, True), (2**31, False), (-(2**31), True), (-(2**31) - 1, False),
                                     (0, True)])
def test_fits_int32_is_the_closed_int_range(x, fits):
    assert fits_int32(x) is fits


@pytest.mark.parametrize("a, b, q", [
    (7, 2, 3), (-7, 2, -3), (7, -2, -3), (-7, -2, 3),   # truncation toward zero, not floor (-7 // 2 == -4)
    (6, 3, 2), (-6, 3, -2), (0, 5, 0), (0, -5, 0),
    (1, 2, 0), (-1, 2, 0),                             # |a| < |b|: 0 either sign
    (-(2**31), -1, -(2**31)),                          # INT_MIN / -1 wraps back to INT_MIN
    (-(2**31), 1, -(2**31)),
])
def test_c_div_truncates_toward_zero(a, b, q):
    assert c_div(a, b) == q


def test_c_div_by_zero_raises_and_names_itself():
    with pytest.raises(ZeroDivisionError, match=r"^c_div: integer division by zero$"):
        c_div(1, 0)


@pytest.mark.parametrize("a, b, q", [
    (0, 128, 0), (1, 128, 1), (128, 128, 1), (129, 128, 2), (256, 128, 2), (257, 128, 3),
    (10, 1, 10), (5, 2, 3),
    # (a + b - 1) overflows: INT_MAX + 128 - 1 wraps negative, and the truncating quotient is negative
    (2**31 - 1, 128, -16777215),   # to_int32(2^31 - 1 + 127) = -2^31 + 126; / 128 -> -16777215 (toward zero)
    (2**31 - 128, 128, 16777215),  # 2^31 - 1 exactly: no wrap, 16777215.99 -> 16777215
])
def test_c_ceil_div_is_the_int_sum_then_the_truncating_quotient(a, b, q):
    assert c_ceil_div(a, b) == q


@pytest.mark.parametrize("x, i", [
    (0.0, 0), (5.0, 5), (-5.0, -5),
    (float("nan"), 0),
    (2.0**31, INT32_MAX), (2.0**31 - 1, INT32_MAX), (1e30, INT32_MAX), (math.inf, INT32_MAX),
    (-(2.0**31), INT32_MIN), (-1e30, INT32_MIN), (-math.inf, INT32_MIN),
    (2.0**31 - 2, 2**31 - 2), (-(2.0**31) + 1, -(2**31) + 1),
])
def test_f32_to_int_saturates_and_maps_nan_to_zero(x, i):
    assert f32_to_int_sat(x) == i
