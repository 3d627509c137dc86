"""The engine worker's wire format (one JSON object per line each way: scenarios out, results back) and the one
worker loop every engine driver runs (:func:`serve`).

Invariant: a scenario crosses the process boundary as plain data (server and model fields of spec.model.config, the
steps, the seed) and nothing else; the engine's own code decides the guard and the head counts, so the policy
fields of a :class:`gpu_impl.scenario.Scenario` (guard, metadata_heads, seeded defects) are not sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import traceback

__all__ = ["scenario_to_wire", "scenario_from_wire", "result_from_wire", "encode", "decode", "serve", "quiet",
           "Unsupported"]


def scenario_to_wire(scn) -> dict:
    """The part of a Scenario a real engine runs: configuration, model, steps, seed."""
    return {"server": dataclasses.asdict(scn.server), "model": dataclasses.asdict(scn.model),
            "steps": [s.to_dict() for s in scn.steps], "seed": int(scn.seed)}


def scenario_from_wire(data: dict):
    """(ServerConfig, ModelConfig, [Step], seed) of a wire scenario (raises ValueError naming the field)."""
    from ..config import ModelConfig, ServerConfig
    from ..scenario import Step

    server = ServerConfig.from_dict(data["server"])
    model = ModelConfig.from_dict(data["model"])
    steps = [Step(mode=s["mode"], seq_lens=list(s["seq_lens"]), extend_lens=s.get("extend_lens"))
             for s in data["steps"]]
    return server, model, steps, int(data.get("seed", 0))


def result_from_wire(data: dict):
    """A gpu_impl.scenario.ScenarioResult from the worker's answer."""
    from spec.violation import Violation

    from ..scenario import ScenarioResult

    return ScenarioResult(findings=[Violation.from_dict(d) for d in data.get("findings", [])],
                          shape_errors=[Violation.from_dict(d) for d in data.get("shape_errors", [])],
                          trace=list(data.get("trace", [])))


def encode(obj) -> str:
    return json.dumps(obj, default=_default, separators=(",", ":")) + "\n"


def decode(line: str):
    return json.loads(line)


def _default(x):
    if isinstance(x, (set, frozenset, tuple)):
        return list(x)
    if hasattr(x, "tolist"):
        return x.tolist()
    if dataclasses.is_dataclass(x):
        return dataclasses.asdict(x)
    return str(x)


# -- the worker loop (both drivers) ----------------------------------------------------------------------------


class Unsupported(Exception):
    """A scenario feature a driver does not run on a real engine (answered with kind "unsupported")."""


@contextlib.contextmanager
def quiet():
    """Keep an engine's prints off the protocol stream (stdout is the response channel) while it runs."""
    saved = sys.stdout
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stdout = saved


def exit_worker(code: int) -> None:
    """End a worker process at once with ``code`` once :func:`serve` returned: its answers are flushed and nothing
    else is left to say, so the interpreter's teardown (seconds with an engine's modules loaded: measured 5-8 s
    for vLLM's) is skipped."""
    import os

    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)


def serve(engine, stdin, stdout, observer=None) -> int:
    """The worker loop: make the engine once, answer requests until "quit" or end of input; 0, or 3 when the
    engine could not be made (that failure is the one answer, kind "import").

    ``engine``: a callable making the engine object (imported under :func:`quiet`). The object answers ``hello()``
    and every op named in its ``OPS``: the request's other fields are its keyword arguments and the dict it
    returns is merged into the answer. Every request gets exactly one answer line with ``ok``; failures carry
    ``error`` and ``kind``: "unsupported" (:class:`Unsupported`), "bad_request" (unknown op, missing or bad
    field), "crash" (anything else the engine's code raised).

    ``observer`` (optional): an object with ``engine_started(engine)``, called once the engine is made, and
    ``status() -> dict``, sent as ``observer`` on every successful answer but "bye" (a checker installed from
    outside the engine reports through it, e.g. ``fa3verify.sanitize.engine_worker``).
    """
    def send(obj) -> None:
        stdout.write(encode(obj))
        stdout.flush()

    try:
        with quiet():
            eng = engine()
    except ImportError as exc:
        send({"ok": False, "kind": "import", "error": f"import failed: {exc!r} (module {getattr(exc, 'name', None)})",
              "traceback": traceback.format_exc(limit=8)})
        return 3
    except Exception as exc:  # noqa: BLE001 - any import-time crash is reported, never a pass
        send({"ok": False, "kind": "import", "error": f"import failed: {exc!r}",
              "traceback": traceback.format_exc(limit=8)})
        return 3
    if observer is not None:
        observer.engine_started(eng)

    def observed(resp: dict) -> dict:
        if observer is not None and resp.get("ok"):
            resp["observer"] = observer.status()
        return resp

    send(observed({"ok": True, "hello": eng.hello()}))
    ops = tuple(getattr(eng, "OPS", ()))
    for line in stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError(f"a request is a JSON object, got {type(req).__name__}")
            op = req.get("op")
            if op == "quit":
                send({"ok": True, "bye": True})
                return 0
            with quiet():
                if op == "hello":
                    resp = {"ok": True, "hello": eng.hello()}
                elif op in ops:
                    resp = {"ok": True, **getattr(eng, op)(**{k: v for k, v in req.items() if k != "op"})}
                else:
                    resp = {"ok": False, "kind": "bad_request",
                            "error": f"unknown op {op!r} (allowed: hello, {', '.join(ops + ('quit',))})"}
        except Unsupported as exc:
            resp = {"ok": False, "kind": "unsupported", "error": str(exc)}
        except (KeyError, ValueError, TypeError) as exc:
            resp = {"ok": False, "kind": "bad_request", "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(limit=12)}
        except Exception as exc:  # noqa: BLE001 - a crash in the engine's code is reported as a crash
            resp = {"ok": False, "kind": "crash", "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(limit=16)}
        send(observed(resp))
    return 0
