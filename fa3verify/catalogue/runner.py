"""The catalogue's runner: each entry through its engines (the campaign and the prover), defect on and off.

* defect **on**: each engine that can see the entry runs; the entry passes when every engine it names caught it;
* defect **off** (the same engines, the same seed, the switch removed, or for FA3's own inconsistency a
  counterfactual fix switched on): nothing may fire. A finding there is a false alarm and fails the entry.

The engines of an entry come from its data (``fuzz_run``, ``prove_run``); :data:`FUZZ` and :data:`PROVE` hold
them by entry id (tests swap one in to show that a blind or leaky engine fails the entry).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable, Optional

from spec.finding import CatalogueStatus

from ..case_files import write_case
from . import fuzz_engine, prove_engine
from .entries import BUDGETS, ENGINES, ENTRIES, Entry, resolve_ids
from .results import EngineOutcome, EntryResult

__all__ = ["FUZZ", "PROVE", "run_entry", "run_catalogue"]

#: entry id -> fuzz engine ``run(entry, on, budgets)``, from each entry's ``fuzz_run``.
FUZZ: dict = {e.id: fuzz_engine.engine_from_data(e.fuzz_run) for e in ENTRIES if e.fuzz_run}
#: entry id -> prove engine ``run(on, budgets)``, from each entry's ``prove_run``.
PROVE: dict = {e.id: prove_engine.engine_from_data(e.prove_run) for e in ENTRIES if e.prove_run}


def _guarded(fn: Callable[[], EngineOutcome], engine: str) -> EngineOutcome:
    start = time.perf_counter()
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - never a crash of the suite: report the engine's failure
        return EngineOutcome(engine, CatalogueStatus.ERROR, time.perf_counter() - start,
                             detail=f"{type(exc).__name__}: {exc}")


def run_entry(entry: Entry, mode: str = "fast", cases_dir: Optional[str] = None,
              engines: Iterable[str] = ENGINES) -> EntryResult:
    """Run one entry's engines with the defect on and off; save the catching case into ``cases_dir``."""
    if mode not in BUDGETS:
        raise ValueError(f"mode: must be one of {sorted(BUDGETS)}, got {mode!r}")
    b = BUDGETS[mode]
    start = time.perf_counter()
    on: dict = {}
    off: dict = {}
    for engine in engines:
        fn = (PROVE if engine == "prove" else FUZZ).get(entry.id)
        if fn is None:
            on[engine] = EngineOutcome(engine, CatalogueStatus.NOT_APPLICABLE)
            off[engine] = EngineOutcome(engine, CatalogueStatus.NOT_APPLICABLE)
            continue
        if engine == "prove":
            on[engine] = _guarded(lambda: fn(True, b), engine)
            off[engine] = _guarded(lambda: fn(False, b), engine)
        else:
            on[engine] = _guarded(lambda: fn(entry, True, b), engine)
            off[engine] = _guarded(lambda: fn(entry, False, b), engine)
        if cases_dir and on[engine].case is not None:
            on[engine].case_file = str(write_case(on[engine].case, Path(cases_dir) / entry.case_name))
    return EntryResult(entry, on, off, time.perf_counter() - start)


def run_catalogue(ids: Optional[Iterable[str]] = None, mode: str = "fast", cases_dir: Optional[str] = None,
                  progress: Optional[Callable[[EntryResult], None]] = None) -> list:
    """Run the selected entries (all by default); a list of EntryResult in catalogue order."""
    results = []
    for entry in resolve_ids(ids):
        res = run_entry(entry, mode, cases_dir)
        results.append(res)
        if progress:
            progress(res)
    return results
