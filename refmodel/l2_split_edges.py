"""Where FA3's L2 split branch meets its int arithmetic: the KV lengths whose 32-bit size wraps, and the query length
that puts a call in the branch (``hopper/heuristics.h`` lines 29-34 at 0251105a; ``flash_api.cpp`` line 463).

Concrete formulas only (plain ints): spec.theorems.edges proves with z3 that the band is where the heuristic returns a
split count below 1, and tests/gpu checks the real kernel at its edge; both read these.
"""

from __future__ import annotations

from .fa3_scheduler import L2_SPLIT_BYTES

__all__ = ["int32_split_band", "replay_rows"]


def replay_rows(num_sm: int) -> int:
    """A query length that puts every head-dim instance in the L2 branch: 2 x num_SMs tiles of 192 rows."""
    return 2 * num_sm * 192


def int32_split_band(bytes_per_token: int) -> tuple[int, int]:
    """The first band of KV lengths whose 32-bit size + 50 MiB - 1 wraps: [lo, hi] tokens (refmodel decides).

    size = L * bytes_per_token lies in (2^31 - 50 MiB, 2^31 - 1]; the band repeats every 2^32 / bytes_per_token.
    """
    lo = -(-(2**31 - L2_SPLIT_BYTES + 1) // bytes_per_token)
    hi = (2**31 - 1) // bytes_per_token
    return lo, hi
