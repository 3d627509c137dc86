"""A cache of the engine gate's z3 rows across runs: the witness searches and the engine's flow theorem.

Invariant: a cached row is given back only where the same computation would give it again. These z3 queries are
deterministic: each has a fixed seed and is bounded by z3's resource units, not by the clock (``prove --help``);
an entry is keyed by a hash of everything they read:

- what the stage asks (the search's guard, head counts and dropped assumptions, or the engine, the release's
  profile and the theorem; the timeout; a guard given as a file: its bytes);
- the code and data that compute the answer: every ``.py`` and ``.json`` file of refmodel, spec, gpu_impl and
  fa3verify (their bytes; any edit, a checkout of another commit, is a miss), the z3 and Python versions.

Rows that are inconclusive (a wall-clock deadline may have cut them short) are never stored, nor rows whose case
files lie outside the stage's directory or whose text names that directory, nor a flow theorem that found something (its rows go with findings). A hit
writes each row's case file under the run's cases directory at the name the computation gives it (same bytes; an
existing file is kept, as a save keeps it) and gives the rows with the seconds of the run that computed them.

Only the command line's ``gate`` uses it (``fa3verify.commands.gate.run``): a Python caller, the matrix and the
test suite, which may replace functions in-process (a monkeypatch the file hashes cannot see), compute every row.
``$FA3VERIFY_Z3_CACHE``: the directory (default ``~/.cache/fa3verify/z3``); ``off`` turns the cache off.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Optional

from .summary import Check

__all__ = ["ENV", "cache_dir", "code_hash", "entry_key", "load", "store"]

ENV = "FA3VERIFY_Z3_CACHE"
#: the packages whose files decide a z3 row (refmodel's formulas, spec's theorems and profiles, gpu_impl's engine data
#: such as a release's flow profile, fa3verify's stages)
PACKAGES = ("refmodel", "spec", "gpu_impl", "fa3verify")
FORMAT = 1
_CODE: dict = {}


def cache_dir() -> Optional[Path]:
    """The cache's directory, or None when ``$FA3VERIFY_Z3_CACHE`` is ``off``."""
    value = os.environ.get(ENV)
    if value is not None and value.strip().lower() in ("off", "0", "no", "false"):
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "fa3verify" / "z3"


def code_hash(root: Optional[Path] = None) -> str:
    """A hash of every ``.py`` and ``.json`` file of :data:`PACKAGES` under ``root`` (the project's folder), by
    path and bytes, with the z3 and Python versions; computed once per process and root."""
    root = Path(root) if root is not None else Path(__file__).resolve().parents[1]
    if root in _CODE:
        return _CODE[root]
    import z3

    h = hashlib.sha256()
    h.update(f"z3 {z3.get_full_version()} python {sys.version}".encode())
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.suffix in (".py", ".json") and "__pycache__" not in path.parts and path.is_file():
                h.update(path.relative_to(root).as_posix().encode() + b"\0")
                h.update(hashlib.sha256(path.read_bytes()).digest())
    _CODE[root] = h.hexdigest()
    return _CODE[root]


def _file_bytes(value) -> Optional[str]:
    """A guard or other input given as a file: the hash of its bytes (a path's text alone could hide an edit)."""
    text = str(value).split(":", 1)[0]
    if text and os.path.isfile(text):
        return hashlib.sha256(Path(text).read_bytes()).hexdigest()
    return None


def entry_key(kind: str, inputs: dict, root: Optional[Path] = None) -> str:
    """The entry's name: a hash of the stage's kind, its inputs (strings that name files: with those files' bytes)
    and :func:`code_hash`."""
    files = {str(v): _file_bytes(v) for v in inputs.values() if isinstance(v, str) and _file_bytes(v)}
    text = json.dumps({"format": FORMAT, "kind": kind, "inputs": inputs, "files": files, "code": code_hash(root)},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _rel(case_file: Optional[str], cases_dir: str) -> Optional[str]:
    rel = os.path.relpath(case_file, cases_dir)
    return None if rel.startswith(os.pardir) or os.path.isabs(rel) else rel


def store(kind: str, inputs: dict, rows: list, cases_dir: str) -> bool:
    """Keep ``rows`` (Checks) and their case files under the entry of (``kind``, ``inputs``); False (nothing kept) when
    the cache is off, a row is inconclusive, a case file is missing or outside ``cases_dir``, or the directory cannot
    be written."""
    where = cache_dir()
    if where is None or not rows or any(r.inconclusive for r in rows):
        return False
    if any(cases_dir in str(v) for r in rows for k, v in dataclasses.asdict(r).items() if k != "case_file"):
        return False  # a row that names the run's directory elsewhere would name it in another run too
    files = {}
    for r in rows:
        if r.case_file:
            rel = _rel(r.case_file, cases_dir)
            if rel is None or not os.path.isfile(r.case_file):
                return False
            files[rel] = Path(r.case_file).read_text(encoding="utf-8")
    entry = {"format": FORMAT, "kind": kind, "inputs": inputs, "files": files,
             "rows": [{**dataclasses.asdict(r), "verdict": str(r.verdict),
                       "case_file": _rel(r.case_file, cases_dir) if r.case_file else None} for r in rows]}
    try:
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"{entry_key(kind, inputs)}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entry, sort_keys=True, default=str), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        return False
    return True


def load(kind: str, inputs: dict, cases_dir: str) -> Optional[list]:
    """The rows kept for (``kind``, ``inputs``) under this code, their case files written under ``cases_dir``; None on
    a miss (no entry, the cache off, an entry that does not read back)."""
    where = cache_dir()
    if where is None:
        return None
    path = where / f"{entry_key(kind, inputs)}.json"
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        if entry.get("format") != FORMAT or entry.get("kind") != kind:
            return None
        rows = []
        for d in entry["rows"]:
            rel = d.pop("case_file")
            rows.append(Check(**d, case_file=os.path.join(cases_dir, rel) if rel else None))
        for rel, text in entry["files"].items():
            target = os.path.join(cases_dir, rel)
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            try:  # "x": a case file already there is kept, as a save keeps it
                with open(target, "x", encoding="utf-8") as out:
                    out.write(text)
            except FileExistsError:
                pass
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return rows
