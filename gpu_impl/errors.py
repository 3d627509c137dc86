"""Errors raised by the system under test (the kernel adapters and the backend built on them).

* :class:`OutOfBoundsAccess` -- an access FA3 would make outside the call's buffers (or a read of memory
  nobody wrote): split index past the partial buffers, batch index outside the call, rows no tile covers,
  splits past the combine's capacity. Silent on a GPU (NaN, garbage, illegal memory access); loud here.
* :class:`MetadataShapeError` -- FA3's own loud and safe check (``CHECK_SHAPE(scheduler_metadata, ...)`` and the
  dtype/contiguity/device checks next to it in ``hopper/flash_api.cpp``): the metadata tensor has the wrong
  length for the call.
* :class:`KernelUnavailable` -- the requested kernel cannot run here (no CUDA, no FA3 module).
* :class:`FA3Rejected`, :class:`ProcessAbort`, :class:`OutsideModel` -- refmodel's (``refmodel/errors.py``), re-exported:
  FA3's own ``TORCH_CHECK`` refusal (loud, safe), FA3 ending the process (``exit(1)`` after a failed launch, a host
  SIGFPE: loud, not safe for a server), and inputs outside the model (an architecture other than sm90).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from refmodel.errors import FA3Rejected, OutsideModel, ProcessAbort

__all__ = ["OutOfBoundsAccess", "MetadataShapeError", "KernelUnavailable", "FA3Rejected", "ProcessAbort",
           "OutsideModel", "format_indices"]


def _fmt_value(value: Any) -> str:
    """Short rendering of an index value: consecutive int lists as ``a..b``."""
    if isinstance(value, range):
        value = list(value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        ints = list(value)
        if len(ints) > 2 and ints == list(range(ints[0], ints[0] + len(ints))):
            return f"{ints[0]}..{ints[-1]}"
    return repr(value)


def format_indices(indices: Mapping[str, Any]) -> str:
    """``name=value`` pairs, integer runs shown as ``a..b``."""
    return ", ".join(f"{k}={_fmt_value(v)}" for k, v in indices.items())


class OutOfBoundsAccess(RuntimeError):
    """An access FA3 would make out of bounds, detected before it happens.

    Attributes:
      * ``invariant`` -- the violated invariant's name: ``"SPLIT_BOUND"``, ``"BATCH_PERMUTATION"``,
        ``"QUERY_COVER"``, ``"COMBINE_CAPACITY"``;
      * ``batch`` -- the call's batch index concerned (the real batch; the virtual batch when the real one is
        itself out of range -- ``indices["virtual_batch"]`` always says which);
      * ``indices`` -- the offending indices and the bounds they break (e.g. ``{"virtual_batch": 0, "splits":
        [29, ..., 85], "buffer_splits": 29, "metadata_splits": 86}``);
      * ``violations`` -- every violation found in the same call (this one first), as ``spec.violation.Violation``
        records (the indices in ``detail``, the sentence in ``message``); a single fault usually breaks several
        invariants (a split count above the capacity is also above the buffers).
    """

    def __init__(self, invariant: str, batch: Optional[int], indices: Mapping[str, Any], detail: str = "",
                 violations: Sequence[Any] = ()):
        self.invariant = str(invariant)
        self.batch = batch
        self.indices = dict(indices)
        self.detail = detail
        self.violations = list(violations)
        message = f"{self.invariant}: batch {batch}: indices {format_indices(self.indices)}"
        if detail:
            message += f": {detail}"
        others = [v for v in self.violations[1:]]
        if others:
            names = sorted({getattr(v, "invariant", str(v)) for v in others})
            message += f" (+{len(others)} more violation(s): {', '.join(names)})"
        super().__init__(message)


class MetadataShapeError(RuntimeError):
    """FA3's loud, safe rejection of a scheduler-metadata tensor that does not fit the call (``CHECK_SHAPE``).

    ``expected`` and ``got`` hold the expected and actual sizes (or dtype/device/contiguity descriptions).
    """

    def __init__(self, message: str, expected: Any = None, got: Any = None):
        self.expected = expected
        self.got = got
        super().__init__(message)


class KernelUnavailable(RuntimeError):
    """The requested kernel cannot run in this process; ``reason`` says why (and what would fix it)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)
