"""What FA3 does with inputs it does not run: reject them loudly, end the process, or (here) lie outside the model.

Three outcomes, kept apart because a server experiences them differently:

* :class:`FA3Rejected` -- a ``TORCH_CHECK`` in ``hopper/flash_api.cpp`` fails: the call (or precompute) raises a
  Python ``RuntimeError`` and nothing runs. Loud and safe: the server sees an exception for one request.
  The model raises it with FA3's own message (``fa3_message``).
* :class:`ProcessAbort` -- FA3 ends the process: ``CHECK_CUDA_KERNEL_LAUNCH()`` (``hopper/cuda_check.h``) calls
  ``exit(1)`` after a failed launch (a zero-block grid when batch_size == 0 at precompute), or the host divides by
  zero (``num_heads % num_heads_k`` with zero KV heads, SIGFPE). Loud but NOT safe for a server: every request
  in flight on that process is lost, and a restart loop can follow.
* :class:`OutsideModel` -- inputs FA3 may accept but this model does not cover (an architecture other than
  sm90, sizes outside C++ ``int``); refused with the field and the covered range rather than answered wrongly.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["FA3Rejected", "ProcessAbort", "OutsideModel"]


class FA3Rejected(ValueError):
    """FA3 refuses these inputs with a ``TORCH_CHECK`` (loud, safe); ``fa3_message`` is FA3's text, ``field`` the input."""

    def __init__(self, field: str, fa3_message: str, source: str, got=None):
        self.field = field
        self.fa3_message = fa3_message
        self.source = source
        self.got = got
        shown = "" if got is None else f" (got {got!r})"
        super().__init__(f"{field}: FA3 rejects this{shown}: \"{fa3_message}\" ({source})")


class ProcessAbort(RuntimeError):
    """FA3 would end the whole process here (``exit(1)`` after a launch check, or SIGFPE): loud, not safe for a server."""

    def __init__(self, field: str, reason: str, source: str, got=None):
        self.field = field
        self.reason = reason
        self.source = source
        self.got = got
        shown = "" if got is None else f" (got {got!r})"
        super().__init__(f"{field}: FA3 ends the process here{shown}: {reason} ({source}); "
                         f"loud, but not safe for a server: every request on the process is lost")


class OutsideModel(ValueError):
    """Inputs the model does not cover; names the field and the covered range."""

    def __init__(self, field: str, allowed: str, got=None, why: Optional[str] = None):
        self.field = field
        self.allowed = allowed
        self.got = got
        text = f"{field}: the model covers {allowed}, got {got!r}"
        if why:
            text += f" ({why})"
        super().__init__(text)
