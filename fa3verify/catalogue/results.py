"""What one catalogue entry's run found: per engine and side (defect on / off), and the entry's verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from spec.finding import CatalogueStatus

from .entries import CORPUS_DIR, ENGINES, Entry

__all__ = ["EngineOutcome", "EntryResult"]


@dataclass
class EngineOutcome:
    """One engine on one entry, defect on or off.

    ``status``: with the defect on ``caught`` / ``missed``; off ``silent`` / ``fired`` (a false alarm); either way
    ``n/a`` (the engine has nothing for this entry), ``inconclusive`` (z3 unknown) or ``error`` (the engine
    itself failed; the message says how).
    """

    engine: str
    status: str
    seconds: float = 0.0
    invariants: list = field(default_factory=list)
    cases: int = 0
    detail: str = ""
    case: Any = None            # a spec.model.cases.Case or a kernel-level case dict, when one was found
    case_file: Optional[str] = None

    def to_dict(self) -> dict:
        return {"engine": self.engine, "status": self.status, "seconds": round(self.seconds, 3),
                "invariants": list(self.invariants), "cases": self.cases, "detail": self.detail,
                "case_file": self.case_file}


@dataclass
class EntryResult:
    """Both runs of one entry and the verdict."""

    entry: Entry
    on: dict
    off: dict
    seconds: float

    @property
    def caught_by(self) -> list:
        return [e for e in ENGINES if self.on.get(e) and self.on[e].status == CatalogueStatus.CAUGHT]

    @property
    def false_alarms(self) -> list:
        return [e for e in ENGINES if self.off.get(e) and self.off[e].status == CatalogueStatus.FIRED]

    @property
    def errors(self) -> list:
        return [f"{side}:{e}" for side, runs in (("on", self.on), ("off", self.off)) for e, o in runs.items()
                if o.status == CatalogueStatus.ERROR]

    @property
    def ok(self) -> bool:
        return (all(e in self.caught_by for e in self.entry.catchers) and not self.false_alarms
                and not self.errors)

    @property
    def inconclusive(self) -> bool:
        return not self.ok and any(self.on.get(e) and self.on[e].status == CatalogueStatus.INCONCLUSIVE
                                   for e in self.entry.catchers) and not self.false_alarms

    @property
    def case_file(self) -> Optional[str]:
        for e in ENGINES:
            o = self.on.get(e)
            if o and o.case_file:
                return o.case_file
        return None

    def to_dict(self) -> dict:
        e = self.entry
        return {"id": e.id, "slug": e.slug, "reference": e.reference, "url": e.url, "expected": list(e.catchers),
                "caught_by": self.caught_by, "false_alarms": self.false_alarms, "errors": self.errors, "ok": self.ok,
                "seconds": round(self.seconds, 3), "case_file": self.case_file,
                "corpus_file": str(CORPUS_DIR / e.case_name) if (CORPUS_DIR / e.case_name).exists() else None,
                "on": {k: v.to_dict() for k, v in self.on.items()},
                "off": {k: v.to_dict() for k, v in self.off.items()}}
