"""The project's one violation type: a check found this broken (spec's invariants, the domain assumptions, the
kernel model's plan checks and a scenario run's findings all report one).

Its own module, with no imports beyond the standard library, so that what only needs the type (``spec.model.config``'s
assumption checks, case validation, the command line's input checks) does not import ``spec.invariants``, which
pulls in refmodel's metadata and with it torch (5.6 s of import on this machine). ``spec.invariants`` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

__all__ = ["Violation"]


@dataclass(frozen=True)
class Violation:
    """A check found this broken: the invariant, the (actual) batch it concerns, the offending values and indices
    (``detail``), a sentence (``message``), and where a run found it (``step``, ``dp_rank``: None outside a run).

    The one violation type of the project: spec's invariants and domain assumptions (``spec.model.config``: the
    ``ASSUMPTION_*`` name, ``detail`` {"field": ...}), the kernel model's plan checks (``gpu_impl.kernels``) and
    a scenario run's findings (:meth:`at_step`, ``gpu_impl.scenario``) all report one.
    """

    invariant: str
    batch: Optional[int] = None
    detail: dict = field(default_factory=dict)
    message: str = ""
    step: Optional[int] = None  #: the scenario step (None outside a run, or for a fault that ended the run)
    dp_rank: Optional[int] = None  #: the attention DP rank (None outside a run, or for a fault that ended it)
    #: the signature of a finding that is not a step's (a fault that ended the run: its invariant alone)
    signature_key: Optional[str] = field(default=None, compare=False, repr=False)
    #: found by a scenario run (:meth:`at_step`): :meth:`to_dict` writes the run's keys (step, dp_rank)
    located: bool = field(default=False, compare=False, repr=False)

    @classmethod
    def at_step(cls, invariant: str, step: Optional[int], dp_rank: Optional[int], message: str,
                detail: Optional[dict] = None, signature_key: Optional[str] = None) -> "Violation":
        """A violation a scenario run found at ``step`` on DP rank ``dp_rank`` (both None: a fault ended the run)."""
        return cls(invariant, None, {} if detail is None else detail, message, step, dp_rank, signature_key,
                   located=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Violation":
        """The inverse of :meth:`to_dict` (a run's form when it has a ``step`` key)."""
        if "step" in data:
            return cls.at_step(data["invariant"], data["step"], data.get("dp_rank"), data["message"],
                               data.get("detail", {}))
        return cls(data["invariant"], data.get("batch"), dict(data.get("detail", {})), data.get("message", ""))

    @property
    def indices(self) -> dict:
        """Alias of `detail` (the offending indices and values)."""
        return self.detail

    @property
    def signature(self) -> str:
        """What makes two findings 'the same violation': invariant and step mode, not the lengths."""
        if self.signature_key is not None:
            return self.signature_key
        return f"{self.invariant}:{self.detail.get('mode', '')}:{self.detail.get('path', '')}"

    def to_dict(self) -> dict:
        """JSON-ready: {invariant, batch, detail, message}; found by a run: {invariant, step, dp_rank, message, detail}."""
        if self.located:
            return {"invariant": self.invariant, "step": self.step, "dp_rank": self.dp_rank, "message": self.message,
                    "detail": self.detail}
        return {"invariant": self.invariant, "batch": self.batch, "detail": dict(self.detail),
                "message": self.message}
