"""The catalogue's entries, read from ``entries.json`` (the data: one object per historical bug).

Each entry: the upstream reference and thread, what went wrong (and where the thread differs from the summary we
were given), the seeded defect (``gpu_impl.defects`` names), the invariant expected to catch it, the engines that
must catch it, and how each engine runs it -- ``fuzz_run`` (a strategy family of ``fa3verify.strategies``, the
policy and defects with the defect on and off, the invariants that count as a catch) and ``prove_run`` (a
theorem, the policy on and off, the verdict expected). ``silent_when_off``: nothing may fire with the defect off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

__all__ = ["Entry", "ENTRIES", "BUDGETS", "ENGINES", "FUZZ_SEED", "CORPUS_DIR", "REPO", "DATA_FILE", "corpus_name",
           "resolve_ids", "load_entries"]

ENGINES = ("prove", "fuzz")
FUZZ_SEED = 0
REPO = Path(__file__).resolve().parent.parent.parent
CORPUS_DIR = REPO / "tests" / "corpus"
DATA_FILE = Path(__file__).resolve().parent / "entries.json"


@dataclass(frozen=True)
class Entry:
    """One historical bug: where it was reported, what went wrong, how it is seeded, what must catch it."""

    id: str
    slug: str
    title: str
    reference: str
    url: str
    summary: str              # the one-line summary, as given to us
    what_went_wrong: str      # one sentence, as the upstream thread tells it
    thread_notes: str         # where the thread differs from the summary ("" when it agrees)
    defect: str               # the seeded defect, in words
    switches: tuple           # gpu_impl.defects names the defect-on run switches on
    invariant: str            # the invariant or property expected to catch it
    catchers: tuple           # engines that must catch it
    prove: str                # what the prove engine runs ("" when it has nothing for this entry)
    fuzz: str                 # what the fuzz engine runs
    off: str                  # what "defect off" means for this entry
    related: str = ""         # theorems that show the class without depending on the switch
    kernel_level: bool = False
    silent_when_off: bool = True
    fuzz_run: Optional[dict] = field(default=None, compare=False, hash=False)
    prove_run: Optional[dict] = field(default=None, compare=False, hash=False)

    @property
    def case_name(self) -> str:
        """File name of the entry's case in tests/corpus/."""
        return corpus_name(self)


def corpus_name(entry: Entry) -> str:
    """``catalogue-<id>-<slug>.json``."""
    return f"catalogue-{entry.id}-{entry.slug}.json"


def load_entries(path=DATA_FILE) -> tuple:
    """(entries, budgets) from the data file; ValueError names a malformed entry."""
    data = json.loads(Path(path).read_text())
    if data.get("schema") != "fa3verify.catalogue/1":
        raise ValueError(f"{path}: schema must be 'fa3verify.catalogue/1', got {data.get('schema')!r}")
    entries = []
    for i, raw in enumerate(data["entries"]):
        try:
            entries.append(Entry(**{**raw, "switches": tuple(raw["switches"]), "catchers": tuple(raw["catchers"])}))
        except (TypeError, KeyError) as exc:
            raise ValueError(f"{path}: entries[{i}]: {exc}") from None
    return tuple(entries), data["budgets"]


#: The entries, in catalogue order, and the budgets per mode (fuzz cases with the defect on -- the run stops at
#: the first catch -- and off -- all run --, kernel-level cases likewise, shrink seconds, z3 timeout per query).
ENTRIES, BUDGETS = load_entries()
#: the projects the entries' bugs come from, in words (docs/catalogue.md's first sentence)
PROJECTS: str = json.loads(Path(DATA_FILE).read_text())["projects"]
_BY_ID = {e.id: e for e in ENTRIES}


def resolve_ids(ids: Optional[Iterable[str]]) -> list:
    """Entries selected by id ("1", "01", or the slug); ValueError names unknown ids and the known ones."""
    if not ids:
        return list(ENTRIES)
    out = []
    for raw in ids:
        key = str(raw).strip()
        found = _BY_ID.get(key) or _BY_ID.get(key.zfill(2)) or next((e for e in ENTRIES if e.slug == key), None)
        if found is None:
            raise ValueError(f"--only: unknown entry {raw!r}; known: "
                             + ", ".join(f"{e.id} ({e.slug})" for e in ENTRIES))
        if found not in out:
            out.append(found)
    return out
