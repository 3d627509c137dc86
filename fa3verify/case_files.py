"""Writing case files: the one place a campaign's finding becomes a replayable ``fa3verify.case/1`` file.

Scenario cases (``spec.model.cases.Case``) carry their seeded defects in the ``defects`` field; kernel-level cases are
``fa3verify.case/1`` objects with a ``call`` (``fa3verify.kernel_cases.kernel_case``). ``fuzz``/``gate`` save a
failure under a name made from its signature (:meth:`spec.model.cases.Case.save`, never replacing a file); the catalogue
writes each entry's catching case under a fixed name (:func:`write_case`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Optional

__all__ = ["scenario_case", "write_case"]


def scenario_case(case, *, source: str, policy: dict, expected: dict, notes: str, kernel: Optional[dict] = None,
                  engine: Optional[dict] = None, defects: Iterable[str] = ()):
    """The ``spec.model.cases.Case`` of a generated scenario (a ``fa3verify.strategies.FuzzCase``)."""
    from spec.model.cases import Case

    return Case.from_parts(source=source, server=case.server.to_dict(), model=case.model.to_dict(), policy=policy,
                           engine=engine, batches=[dict(s) for s in case.steps],
                           kernel=kernel or {"name": "emulated", "mode": "strict"}, seed=case.seed,
                           expected=expected, notes=notes, defects=sorted(defects),
                           options=getattr(case, "options", None))


def write_case(case: Any, path) -> Path:
    """Write a case (a ``spec.model.cases.Case`` or a kernel-level case dict) to ``path``; the parent is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(case, dict):
        path.write_text(json.dumps(case, indent=2) + "\n")
    else:
        path.write_text(case.to_json())
    return path
