"""What theorems 6 and 7 share: the CP sizes and batch kinds they range over, and the z3 plumbing.

Invariant: one definition of the theorem names, the CP sizes (2..8), the batch kinds and arrivals of the
runner model and their encodings, used by :mod:`spec.theorems.cp_zigzag`, :mod:`spec.theorems.cp_runner` and
the entry point :mod:`spec.theorems.cp`.
"""

from __future__ import annotations

from typing import Any

import z3

from spec.theorems.base import theorem_result


#: Theorem names in the order they run, and their family numbers.
THEOREMS = ("zigzag-partition", "zigzag-balance", "runner-hygiene", "runner-freshness")

THEOREM_NUMBERS = {"zigzag-partition": "6", "zigzag-balance": "6", "runner-hygiene": "7", "runner-freshness": "7"}

#: The CP sizes theorem 6 covers.
CP_SIZES = tuple(range(2, 9))

#: Batch kinds of theorem 7, in encoding order.
KINDS = ("CP_V2_EXTEND", "NON_CP_EXTEND", "MIXED", "DECODE")

#: How a batch arrives at the runner, in encoding order.
ARRIVALS = ("fresh", "carried", "built")

CP_V2, NON_CP, MIXED_ROWS, DECODE_ROWS = range(4)

FRESH, CARRIED, BUILT = range(3)

NONE = -1


# --------------------------------------------------------------------------------------------
# Common plumbing.
# --------------------------------------------------------------------------------------------


def model_int(model: z3.ModelRef, term: Any) -> int:
    return model.eval(term, model_completion=True).as_long()


_result = theorem_result
