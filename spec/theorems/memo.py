"""An opt-in memo of theorem parts within one process (the test suite runs the same theorems many times).

Invariant: a remembered value is given back only when it is certainly what the part would compute again:

- the part's key names every argument it depends on (:attr:`spec.theorems.jobs.Job.key`: theorem names, policy,
  guard and heuristic objects, defects, timeout, split counts...); a job without a key is never remembered;
- nothing the parts run has been replaced since: every module attribute and class attribute of refmodel, spec and
  z3 is the object it was (:func:`fingerprint`), so a monkeypatched or counterfactual function, a seeded defect
  swapped in, or a patched solver is a miss;
- a value with anything but proved results is given back only while its case files are there, to a run with the
  same cases directory, or to a run with another one once those files are written there at the same names, as the
  part writes them (:func:`relocated`; never when a directory is None or another string of the value names the
  first directory);
- the caller gets a deep copy (callers annotate results), and results keep the seconds of the run that computed
  them.

Only the suite enables it (tests/conftest.py); `fa3verify prove` never does. Tests of determinism compare real
runs inside :func:`suspended`.
"""

from __future__ import annotations

import copy
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator, Optional
from spec.finding import TheoremVerdict

__all__ = ["enable", "disable", "enabled", "suspended", "state", "fingerprint", "after_run", "lookup", "store",
           "stats", "relocated"]

MEMO: Optional[dict] = None
_PAUSED = 0
_STATS = {"hits": 0, "misses": 0}
_PREFIXES = ("refmodel", "spec", "z3")


def enable() -> None:
    """Remember part values from now on (in this process)."""
    global MEMO
    if MEMO is None:
        MEMO = {}


def disable() -> None:
    """Forget everything and remember nothing."""
    global MEMO
    MEMO = None


def enabled() -> bool:
    return MEMO is not None and not _PAUSED


@contextmanager
def suspended() -> Iterator[None]:
    """Within the block every part is computed (and nothing remembered): for tests that compare real runs."""
    global _PAUSED
    _PAUSED += 1
    try:
        yield
    finally:
        _PAUSED -= 1


def stats() -> dict:
    return dict(_STATS)


def state() -> dict:
    """The identity of every attribute of the refmodel, spec and z3 modules and of the classes they define."""
    items: dict = {}
    for name in sorted(sys.modules):
        if not name.startswith(_PREFIXES) or name.split(".")[0] not in _PREFIXES:
            continue
        module = sys.modules[name]
        if module is None:
            continue
        for attr, value in list(vars(module).items()):
            items[(name, attr)] = id(value)
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                for k, v in list(vars(value).items()):
                    if k != "__slotnames__":  # copyreg's cache, filled by the first copy of an instance
                        items[(name, attr, k)] = id(v)
    return items


def fingerprint(items: Optional[dict] = None) -> int:
    """A hash of :func:`state`."""
    items = state() if items is None else items
    return hash(tuple(sorted(items.items())))


def after_run(before: dict) -> Optional[int]:
    """The fingerprint to remember a run's values under: the state after it, when the run only added to the state
    it started from (modules it imported, names loaded on first use); None when it replaced something."""
    now = state()
    if any(now.get(k) != v for k, v in before.items()):
        return None
    return fingerprint(now)


def _nodes(value: Any) -> Iterator[Any]:
    """Every object in a part's value: the value, and what dataclasses (their fields), dicts (keys and values),
    lists, tuples and sets hold, searched depth first in a fixed order."""
    import dataclasses

    stack = [value]
    while stack:
        v = stack.pop()
        yield v
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            stack.extend(getattr(v, f.name) for f in dataclasses.fields(v))
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)


def _results(value: Any) -> list:
    """The TheoremResults in a part's value, in :func:`_nodes` order."""
    from spec.theorems.results import TheoremResult

    return [v for v in _nodes(value) if isinstance(v, TheoremResult)]


def lookup(key: Optional[tuple], cases_dir: Optional[str], fp: int) -> tuple[bool, Any]:
    """(True, a copy of the value) when the memo holds this part for this state of the code, else (False, None)."""
    if key is None or not enabled():
        return False, None
    try:
        entry = MEMO.get(key)
    except TypeError:  # an unhashable key: never remembered
        return False, None
    if entry is None or entry[0] != fp:
        _STATS["misses"] += 1
        return False, None
    _, stored_dir, stored = entry
    # only proved results are the same whatever the cases directory (a refutation writes its case there, or
    # has none without one): anything else is given back for the same directory, its case files still there, or
    # for another directory once its case files are written there as the part would write them (relocated)
    results = _results(stored)
    moves = None
    if any(r.verdict != TheoremVerdict.PROVED or r.case_file for r in results):
        if not all(os.path.isfile(r.case_file) for r in results if r.case_file):
            _STATS["misses"] += 1
            return False, None
        if stored_dir != cases_dir:
            moves = _moves(stored, stored_dir, cases_dir)
            if moves is None:
                _STATS["misses"] += 1
                return False, None
    value = copy.deepcopy(stored)  # only for a hit
    if moves is not None:
        _write_moves(value, moves, cases_dir)
    _STATS["hits"] += 1
    return True, value


def _moves(value: Any, stored_dir: Optional[str], cases_dir: Optional[str]) -> Optional[list]:
    """Each result's case file as a path relative to ``stored_dir`` (None for a result without one), in
    :func:`_results` order; None when the value cannot be relocated (see :func:`relocated`)."""
    if stored_dir is None or cases_dir is None:
        return None
    results = _results(value)
    rels = []
    for r in results:
        rel = None
        if r.case_file:
            rel = os.path.relpath(r.case_file, stored_dir)
            if rel.startswith(os.pardir) or os.path.isabs(rel):
                return None
        rels.append(rel)
    paths = {r.case_file for r in results if r.case_file}
    if any(stored_dir in v for v in _nodes(value) if isinstance(v, str) and v not in paths):
        return None
    return rels


def _write_moves(value: Any, rels: list, cases_dir: str) -> None:
    """Write each case file of ``value`` at its relative path under ``cases_dir`` and point its result there."""
    for r, rel in zip(_results(value), rels):
        if rel is None:
            continue
        target = os.path.join(cases_dir, rel)
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        with open(r.case_file, "rb") as src:
            data = src.read()
        try:  # "x": never replaces a file already there (its first finder's notes win), as a save does
            with open(target, "xb") as dst:
                dst.write(data)
        except FileExistsError:
            pass
        r.case_file = target


def relocated(value: Any, stored_dir: Optional[str], cases_dir: Optional[str]) -> Optional[Any]:
    """``value`` (a copy, changed in place) as the part computes it for ``cases_dir``: each case file it wrote
    into ``stored_dir`` is written at the same name under ``cases_dir`` (an existing file there is kept, as
    ``spec.model.cases.Case.save`` keeps it) and its result names that path; None when that is not certainly the same:
    either directory is None, a case file lies outside ``stored_dir``, or any other string of the value names
    ``stored_dir`` (a message with a path in it)."""
    rels = _moves(value, stored_dir, cases_dir)
    if rels is None:
        return None
    _write_moves(value, rels, cases_dir)
    return value


def store(key: Optional[tuple], cases_dir: Optional[str], fp: Optional[int], value: Any) -> None:
    """Remember a part's value (a copy) computed under fingerprint `fp` (None: not remembered)."""
    if key is None or fp is None or not enabled():
        return
    try:
        MEMO[key] = (fp, cases_dir, copy.deepcopy(value))
    except TypeError:  # an unhashable key or an uncopyable value: not remembered
        pass
