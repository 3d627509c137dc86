"""The walk of one command: how many project files it passes through, and how often it goes back or up.

Usage: python scripts/call_walk.py ARGV...   (e.g. ``scripts/call_walk.py gate --cases 5 --seed 0 --cases-dir D``)

Runs ``fa3verify.cli.main(ARGV)`` in-process under ``sys.setprofile`` and counts, over project files only
(refmodel < spec < gpu_impl < fa3verify, the layering tests/robustness/test_layers.py enforces):

- files: distinct project files entered;
- stops: call events into a different project file than the caller's;
- climbs: stops from a lower layer into a higher one (e.g. gpu_impl calling back into fa3verify);
- re-entries: stops into a file already entered earlier in the walk, from a different file.

``CALL_WALK_ROOT=DIR`` walks another checkout (e.g. a worktree of main, to measure before a change).

A call from outside the project (the standard library, numpy, z3) into a project file counts as a stop from the
nearest project frame below it on the stack, so callbacks through a library are not lost.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(os.environ.get("CALL_WALK_ROOT") or Path(__file__).resolve().parents[1]).resolve()
LAYERS = ("refmodel", "spec", "gpu_impl", "fa3verify")


def project_file(filename: str):
    """(relative path, layer index) of a project source file, or None for anything else."""
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except (ValueError, OSError):
        return None
    top = rel.parts[0] if rel.parts else ""
    return (str(rel), LAYERS.index(top)) if top in LAYERS else None


def walk(argv: list) -> dict:
    """Run the command and return its walk counts (and its exit code)."""
    sys.path.insert(0, str(ROOT))
    from fa3verify.cli import main

    cache: dict = {}
    entered: set = set()
    counts = {"stops": 0, "climbs": 0, "re_entries": 0}

    def info(code):
        got = cache.get(code.co_filename, False)
        if got is False:
            got = cache[code.co_filename] = project_file(code.co_filename)
        return got

    def caller_project(frame):
        f = frame.f_back
        while f is not None:
            got = info(f.f_code)
            if got is not None:
                return got
            f = f.f_back
        return None

    def prof(frame, event, arg):
        if event != "call":
            return
        here = info(frame.f_code)
        if here is None:
            return
        caller = caller_project(frame)
        if caller is not None and caller[0] != here[0]:
            counts["stops"] += 1
            if caller[1] < here[1]:
                counts["climbs"] += 1
            if here[0] in entered:
                counts["re_entries"] += 1
        entered.add(here[0])

    sys.setprofile(prof)
    try:
        try:
            rc = main(list(argv))
        except SystemExit as exc:
            rc = exc.code
    finally:
        sys.setprofile(None)
    return {"argv": list(argv), "exit": rc, "files": len(entered), **counts}


if __name__ == "__main__":
    os.chdir(ROOT)
    result = walk(sys.argv[1:])
    print(json.dumps(result), file=sys.stderr)
