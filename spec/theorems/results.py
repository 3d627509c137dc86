"""The result record every theorem in `spec` returns (spec.theorems: the metadata theorems in `metadata`, the others in their group modules).

A theorem is a bounded z3 query (or a small family of queries) about FA3's split-KV scheduler metadata as a
serving backend reuses it. Its verdict is a :class:`spec.finding.TheoremVerdict`, which serialises as its word:

- ``"proved"``: z3 answered ``unsat`` for the negation of the property on the whole stated domain;
- ``"refuted"``: z3 found a witness (``sat``); the witness is kept in ``witness`` and, for metadata
  theorems, written as a replayable case file (``case_file``);
- ``"inconclusive"``: z3 answered ``unknown`` (timeout or incompleteness); never counted as proved;
- ``"expected-refutation"``: a documented, expected witness (for example FA3's own host/kernel tile
  inconsistency for d <= 64 with 64 < dv <= 192); the property is still proved on the rest of the domain.

``failed`` is the verdict *for the policy under test*: True exactly when a safety property was refuted for
that policy (for the hazard theorem 3 under the pre-fix policy, finding the hazard is the expected outcome,
so it is refuted but reported with ``expected=True``; the guard-soundness theorem 4 then fails).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from spec.finding import TheoremVerdict

#: The verdicts a theorem may report (:class:`spec.finding.TheoremVerdict`, serialised as their words).
VERDICTS = tuple(TheoremVerdict)


@dataclass
class TheoremResult:
    """Outcome of one theorem: verdict, wall time, witness and case file.

    `failed` is True when a safety property was refuted for the policy under test; `expected` is True when the
    verdict is the one the policy predicts (so a CLI exits 0 iff every result is expected and none unknown).
    """

    name: str
    verdict: TheoremVerdict  #: a word of VERDICTS is accepted and stored as its member
    seconds: float
    witness: dict = field(default_factory=dict)
    case_file: Optional[str] = None
    message: str = ""
    failed: bool = False
    expected: bool = True
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict: must be one of {VERDICTS}, got {self.verdict!r}")
        self.verdict = TheoremVerdict(self.verdict)

    @property
    def inconclusive(self) -> bool:
        """True when z3 returned unknown (never treated as proved)."""
        return self.verdict == TheoremVerdict.INCONCLUSIVE

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field."""
        return asdict(self)

    def summary(self) -> str:
        """One line: name, verdict, seconds and a short witness summary."""
        wit = ", ".join(f"{k}={v}" for k, v in list(self.witness.items())[:6]) if self.witness else ""
        flag = " FAILED" if self.failed else ""
        return f"{self.name}: {self.verdict}{flag} ({self.seconds:.2f}s){' ' + wit if wit else ''}"
