"""What every theorem module shares: selecting theorems by name, timing a result, and the seeded defects.

Nothing here imports a theorem module, so every theorem module can import it (spec/theorems has no import cycle).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from spec.theorems.results import TheoremResult
from spec.finding import TheoremVerdict

#: group -> seeded-defect name -> what it changes (negative controls of theorems 5-7 and 9); data in
#: seeded_defects.json
SEEDED_DEFECTS: dict[str, dict[str, str]] = {
    group: dict(defects)
    for group, defects in json.loads(Path(__file__).with_name("seeded_defects.json").read_text()).items()
    if not group.startswith("_")
}


def known_defects() -> set:
    """Every seeded-defect name the algebra and CP theorem groups accept (a run passes one set to both)."""
    return set(SEEDED_DEFECTS["algebra"]) | set(SEEDED_DEFECTS["cp"])


def own_defects(defects, own) -> frozenset:
    """The defects in `defects` that belong to a module (`own`); an unknown name is a ValueError listing all."""
    defects = frozenset(defects)
    unknown = defects - known_defects()
    if unknown:
        raise ValueError(f"defects: unknown names {sorted(unknown)}; known: {sorted(known_defects())}")
    return defects & frozenset(own)


@lru_cache(maxsize=1)
def catalogue_tags() -> dict:
    """name -> (family, former ids) of every catalogued theorem (catalogue.json, read once)."""
    rows = json.loads(Path(__file__).with_name("catalogue.json").read_text())["theorems"]
    return {t["name"]: (t["number"], tuple(t.get("aliases", ()))) for t in rows}


def select(only, names, number_of=None) -> list:
    """Theorems among `names` matching `only`: exact names, the family number, substrings, or a former id (the
    catalogue's ``aliases``: exactly, or a part of one, as the id matched before it was renamed); None selects all.
    A theorem the catalogue does not hold is matched by name and by ``number_of(name)``.

    Names that match nothing are not an error: the command line passes one `only` list to every group.
    """
    if only is None:
        return list(names)
    tags = catalogue_tags()
    wanted = [str(o) for o in only]

    def matches(t: str, o: str) -> bool:
        family, former = tags.get(t, (number_of(t) if number_of else None, ()))
        return o == t or o == family or o in t or any(o in a for a in former)

    return [t for t in names if any(matches(t, o) for o in wanted)]


def theorem_result(name: str, verdict: str, t0: float, witness: dict, message: str, details: dict,
                   failed=None):
    """A TheoremResult timed from `t0`: failed when refuted (unless told), expected when neither failed nor unknown."""
    failed = (verdict == TheoremVerdict.REFUTED) if failed is None else failed
    return TheoremResult(name=name, verdict=verdict, seconds=round(time.perf_counter() - t0, 3), witness=witness,
                         case_file=None, message=message, failed=failed,
                         expected=not failed and verdict != TheoremVerdict.INCONCLUSIVE, details=details)


def unrefuted_result(name: str, start: float, unknown: list, proved_message: str, details: dict):
    """The verdict of a per-instance z3 search that refuted no instance: inconclusive while any query came back
    unknown ("unknown" is never "proved", the first three named), else proved with ``proved_message`` and
    ``details``; timed from ``start``."""
    secs = time.perf_counter() - start
    if unknown:
        return TheoremResult(name, TheoremVerdict.INCONCLUSIVE, secs, {}, None, f"z3 unknown: {unknown[:3]}",
                             expected=False)
    return TheoremResult(name, TheoremVerdict.PROVED, secs, {}, None, proved_message, details=details)


@dataclass(frozen=True)
class ProveRequest:
    """What a prove run asks of every theorem group: the backend's policy, the budget, where cases go.

    Every group's ``group_jobs(request)`` takes this one value (spec.theorems.jobs_for), so the prover never knows
    which group needs which argument.
    """

    guard: Any = "fixed"                 #: the guard: a callable or "fixed" / "pre-fix" / "none"
    metadata_heads: str = "tp"           #: the precompute's head counts ("tp" or "attn_tp")
    guard_spec: Optional[str] = None     #: the guard's label in case files
    clear_stale_cp_metadata: bool = True  #: the runner clears stale CP metadata (theorem 7)
    timeout_s: float = 10.0              #: each z3 query's budget
    cases_dir: Optional[str] = None      #: where refutations write case files (None: nowhere)
    only: Optional[tuple] = None         #: theorem names, family numbers or substrings (None: all)
    dropped_assumptions: frozenset = frozenset()  #: prover assumptions the engine's facts drop
