"""The theorem catalogue: every theorem `fa3verify prove` runs, as :class:`Theorem` values, in the order they run.

A theorem is its name (what it proves; its former id, which began with its family number, is an alias),
its family number (what ``--only 3`` matches), the one-sentence claim its z3 query decides,
the FA3 (or engine) source its encoding models, and the group whose module builds its job. The catalogue is data
(catalogue.json); the queries live in this package's group modules: `metadata` (families 0-4, built by
`metadata_jobs`), `algebra` (5), `cp` (6-7), `edges` (8), `fork_tile` (9), `lifecycle` (10-11) and `wheel_builds` (12). Every group module has
``group_jobs(request: ProveRequest) -> list[Job]``; :func:`jobs_for` asks each in catalogue order. A test checks
that the catalogue and the theorems a prove run reports are the same set, so docs/invariants.md (generated from it)
cannot drift.

Layout (no import cycles): `base` (selection, timing, seeded defects, the request) and `results` are imported by
every group module; this catalogue imports group modules only when asked for jobs.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path

from spec.theorems.base import ProveRequest, known_defects, own_defects, select, theorem_result

__all__ = ["Theorem", "CATALOGUE", "THEOREMS", "ALIASES", "canonical_name", "GROUPS", "ProveRequest", "jobs_for", "known_defects",
           "own_defects", "select", "theorem_result"]


@dataclass(frozen=True)
class Theorem:
    """One theorem of the catalogue."""

    name: str
    number: str        #: the family it belongs to ("lemma" for the lemmas); ``--only`` matches it
    group: str         #: the module of spec.theorems that builds its job (a key of GROUPS)
    statement: str     #: the claim its z3 query decides
    models: tuple      #: the FA3 (or engine) sources the encoding is written from
    aliases: tuple = ()  #: former ids (``3-hazard`` for ``prefill-cp-hazard``), still accepted by ``--only``


def _load() -> tuple:
    data = json.loads(Path(__file__).with_name("catalogue.json").read_text())
    return tuple(Theorem(name=t["name"], number=t["number"], group=t["group"], statement=t["statement"],
                         models=tuple(t["models"]), aliases=tuple(t.get("aliases", ()))) for t in data["theorems"])


#: every theorem, in the order a prove run reports them
CATALOGUE: tuple = _load()
#: name -> Theorem
THEOREMS: dict = {t.name: t for t in CATALOGUE}
#: former id -> name (``3-hazard`` -> ``prefill-cp-hazard``): the ids theorems had when their names began with
#: their family number
ALIASES: dict = {a: t.name for t in CATALOGUE for a in t.aliases}


def canonical_name(name: str) -> str:
    """A theorem's name for ``name``, which may be a former id (``3-hazard``); other names are returned as given."""
    return ALIASES.get(name, name)


#: group -> the module (in this package) whose ``group_jobs(request)`` builds its jobs, in run order
GROUPS: dict = {"metadata": "metadata_jobs", "algebra": "algebra", "cp": "cp", "edges": "edges",
                "fork_tile": "fork_tile", "lifecycle": "lifecycle", "wheel_builds": "wheel_builds"}


def jobs_for(request: ProveRequest) -> list:
    """Every group's jobs for `request` (spec.theorems.jobs.Job), in catalogue order."""
    out = []
    for module in GROUPS.values():
        out += importlib.import_module(f"{__name__}.{module}").group_jobs(request)
    return out
