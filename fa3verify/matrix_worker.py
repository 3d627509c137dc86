"""One lane of ``fa3verify engine matrix --jobs N``: a process that gates the releases it is handed, one at a time.

Protocol (JSON lines, :mod:`spec.process.worker_client`): ``{"op": "row", "release": V, "no_setup": bool,
"options": RowOptions}`` gates V as :func:`fa3verify.engine_matrix.gate_release` does, opening it as the command
line does (:func:`fa3verify.commands.engine.release_opener`), and answers ``{"row", "cases", "interrupted",
"open"}``, keeping V's engine open when ``open``; ``{"op": "replay", "files": [...]}`` replays those case files on
it, closes it and answers ``{"verdicts", "seconds", "interrupted"}``; ``{"op": "bye"}`` ends the lane. A request
that raises anything else answers ``{"raised", "traceback"}``. Its stdout carries only the answers (anything else
printed goes to stderr, with its progress lines); a SIGINT (forwarded by the matrix) ends the gate or the replays
in flight as it ends them in the matrix's own process.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import asdict


def main() -> int:
    from spec.process import interrupts

    answers = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # whatever the gate prints goes to stderr, never into the answers
    sys.stdout = sys.stderr
    held: list = []
    witness_cache: dict = {}  # witness searches shared by the releases this lane gates
    with interrupts.watching():
        try:
            for line in sys.stdin:
                request = json.loads(line)
                if request.get("op") == "bye":
                    break
                answers.write(json.dumps(_answer(request, held, witness_cache), default=str) + "\n")
        except KeyboardInterrupt:  # between requests: nothing in flight to end
            return 3
        finally:
            for sut in held:
                sut.close()
    return 0


def _answer(request: dict, held: list, witness_cache: dict) -> dict:
    from .commands.engine import progress_line, release_opener
    from .engine_matrix import RowOptions, gate_release
    from .matrix_lanes import replay_files

    try:
        if request["op"] == "row":
            options = RowOptions(**request["options"])
            run = gate_release(request["release"], release_opener(options.engine, bool(request["no_setup"])),
                               options, progress_line, witness_cache)
            if run.sut is not None:
                held.append(run.sut)
            return {"row": asdict(run.row), "cases": [asdict(c) for c in run.cases], "interrupted": run.interrupted,
                    "open": run.open}
        if request["op"] == "replay":
            sut = held.pop() if held else None
            try:
                verdicts, seconds, interrupted = replay_files(sut, list(request["files"])) if sut is not None \
                    else ({}, 0.0, False)
            finally:
                if sut is not None:
                    sut.close()
            return {"verdicts": verdicts, "seconds": seconds, "interrupted": interrupted}
        return {"raised": f"unknown request {request.get('op')!r}"}
    except Exception as exc:  # noqa: BLE001 - the matrix reports it as its internal error
        return {"raised": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


if __name__ == "__main__":
    sys.exit(main())
