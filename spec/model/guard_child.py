"""The child process that imports and evaluates a user guard, so the guard cannot end or hang the tool.

Invariant: the parent (spec.model.guard_isolation.IsolatedGuard) only ever learns a guard's verdict as a JSON line
{"ok": true|false} from this process; anything else (an exception, SystemExit, os._exit, a non-bool result, a
hang) reaches it as an error message, an EOF or a missed deadline, never as a verdict.

Protocol (one JSON object per line): the first line from the parent is {"sys_path": [...], "spec": SPEC};
the child answers {"loaded": true} or {"load_error": MESSAGE}. Then each {"call": {attribute: value}} gets
{"ok": BOOL}, {"raised": TYPE, "message": TEXT, "attr": NAME-or-null} or {"bad_return": TYPE-NAME}.
The guard's own prints go to stderr: fd 1 is kept for the protocol only.
Run as a script (`python guard_child.py`); it imports spec.model.guards only after the parent's sys.path is set.
"""

import inspect
import json
import os
import sys
from types import SimpleNamespace


def _send(out, obj) -> None:
    out.write((json.dumps(obj) + "\n").encode())
    out.flush()


def main() -> int:
    proto_fd = os.dup(1)
    os.dup2(2, 1)  # the guard's prints must not corrupt the protocol
    out = os.fdopen(proto_fd, "wb", buffering=0)
    inp = sys.stdin.buffer
    first = json.loads(inp.readline() or b"{}")
    sys.path[:0] = [p for p in first.get("sys_path", []) if p not in sys.path]
    try:
        from spec.model.guards import GuardSpecError, is_bool, load_guard_in_process

        guard = load_guard_in_process(first["spec"])
    except BaseException as exc:  # noqa: BLE001 - SystemExit at import is a load error, not an exit
        _send(out, {"load_error": str(exc) if isinstance(exc, GuardSpecError)
                    else f"guard spec {first.get('spec')!r}: importing it raised {type(exc).__name__}: {exc}"})
        return 0
    _send(out, {"loaded": True})
    for line in inp:
        req = json.loads(line)
        ns = SimpleNamespace(**req["call"])
        try:
            result = guard(ns)
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt in the guard are faults too
            _send(out, {"raised": type(exc).__name__, "message": str(exc),
                        "attr": getattr(exc, "name", None) if isinstance(exc, AttributeError) else None})
            continue
        if not is_bool(result):
            close = getattr(result, "close", None)
            if inspect.iscoroutine(result) and close:
                close()
            _send(out, {"bad_return": type(result).__name__})
            continue
        _send(out, {"ok": bool(result)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
