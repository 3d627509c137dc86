"""The engine worker's wire format: one JSON object per line each way (scenarios out, results back).

Invariant: a scenario crosses the process boundary as plain data (server and model fields of spec.config, the
steps, the seed) and nothing else; the engine's own code decides the guard and the head counts, so the policy
fields of a :class:`gpu_impl.scenario.Scenario` (guard, metadata_heads, seeded defects) are not sent.
"""

from __future__ import annotations

import dataclasses
import json

__all__ = ["scenario_to_wire", "scenario_from_wire", "result_from_wire", "encode", "decode"]


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
    from ..scenario import Finding, ScenarioResult

    def finding(d):
        return Finding(d["invariant"], d["step"], d.get("dp_rank"), d["message"], d.get("detail", {}))

    return ScenarioResult(findings=[finding(d) for d in data.get("findings", [])],
                          shape_errors=[finding(d) for d in data.get("shape_errors", [])],
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
