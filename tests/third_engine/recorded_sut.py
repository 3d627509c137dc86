"""A third system under test, for the tests only: it answers every scenario from a recorded FA3 event log.

Invariant: it answers exactly the scenarios its log holds (the ScenarioResult findings and trace recorded for
each), draws its configurations only from the log's own list (``domain()``), and an unrecorded scenario is
:class:`gpu_impl.sut.ScenarioUnsupported` (skipped and counted by the harness, never a pass). Its log carries one
seeded defect: the answers for the configurations listed under ``"defective"`` were recorded from our model under
the guard before sglang PR #30439 ("pre-fix"), so a check of it must find the hazard there.

It says what it conforms to (``conformance_profile()``: sglang 0.5.15's profile, which its log was recorded under,
and its own domain as conform's draws), and its log holds each answer's FA3 events in the engine shape, so conform
compares them. It is opened as ``--engine sut=third_engine.recorded_sut:RecordedSUT`` (``@PATH``: another log file) through the
generic registry form ``sut=MODULE:CLASS`` only; ``@record`` (or ``@record=PATH``) runs our model instead (its
own guard: the fixed one, "pre-fix" on the defective configurations) and writes what it answered into the log.
``recorded_log.json`` was made so, from the repository root: ``PYTHONPATH=. python tests/third_engine/recorded_sut.py``
(``configurations.json`` is its domain and names the defective configurations).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Optional

from gpu_impl.domain import ConfigDomain, DomainDraw
from gpu_impl.model_pairs import model_pairs
from gpu_impl.scenario import ScenarioResult, jsonable
from gpu_impl.sut import ScenarioUnsupported, SystemUnderTest
from gpu_impl.engines.model.sut import ModelSUT
from spec.model.config import ModelConfig, ServerConfig
from spec.violation import Violation

HERE = Path(__file__).resolve().parent
LOG = HERE / "recorded_log.json"
CONFIGS = HERE / "configurations.json"
TARGET = "third_engine.recorded_sut:RecordedSUT"


def scenario_key(scenario) -> str:
    """What identifies a scenario in the log: its configuration and its steps (a case file keeps both)."""
    text = json.dumps({"server": scenario.server.to_dict(), "model": scenario.model.to_dict(),
                       "steps": [s.to_dict() for s in scenario.steps]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def config_key(server, model) -> str:
    return json.dumps({"server": server.to_dict(), "model": model.to_dict()}, sort_keys=True)


class RecordedDomain(ConfigDomain):
    """Exactly the configurations of ``configurations.json``, each drawn for its target path."""

    def __init__(self, name: str, configurations: list):
        super().__init__(name)
        self.configurations = [(ServerConfig.from_dict(c["server"]), ModelConfig.from_dict(c["model"]),
                                c["target"]) for c in configurations]

    def draw_config(self, rng: random.Random) -> Optional[DomainDraw]:
        i = rng.randrange(len(self.configurations))
        server, model, target = self.configurations[i]
        self.accept()
        return DomainDraw(server, model, target, i)


class RecordedSUT(SystemUnderTest):
    """Answers scenarios from a recorded log (``arg``: its path, or ``record[=PATH]`` to record one)."""

    def __init__(self, arg: Optional[str] = None):
        self.recording = bool(arg) and arg.split("=", 1)[0] == "record"
        path = arg.split("=", 1)[1] if self.recording and "=" in arg else (None if self.recording else arg)
        self.path = Path(path) if path else LOG
        self.data = json.loads(CONFIGS.read_text())
        self.log = json.loads(self.path.read_text())["scenarios"] if self.path.exists() else {}
        self.asked = self.unrecorded = 0
        self._domain = None

    def domain(self):
        if self._domain is None:
            self._domain = RecordedDomain(str(self.spec), self.data["configurations"])
        return self._domain

    def run(self, scenario, kernel=None, numerics: bool = False, device: str = "cpu"):
        key = scenario_key(scenario)
        self.asked += 1
        if self.recording:
            self.log[key] = self._record(scenario, kernel)
        entry = self.log.get(key)
        if entry is None:
            self.unrecorded += 1
            raise ScenarioUnsupported(f"engine {self.spec}: scenario {key} is not in its recorded log")
        return ScenarioResult(findings=[Violation.from_dict({**f, "detail": dict(f["detail"])})
                                        for f in entry["findings"]],
                              trace=[dict(e) for e in entry["trace"]] + [dict(e) for e in entry["events"]])

    def conformance_profile(self) -> str:
        """What it conforms to: its log was recorded from our model under the fixed guard, H // tp_size heads and
        the graph replay's ``max_seq_len`` -- sglang 0.5.15's profile (spec/model/engine_profiles.json) -- except on the
        defective configurations (the seeded defect conform must find)."""
        return "sglang==0.5.15"

    def conformance_family(self) -> None:
        """conform draws from its own domain (the configurations its log holds), as fuzz does."""
        return None

    def _record(self, scenario, kernel) -> dict:
        from spec.model.guards import load_guard

        defective = {config_key(ServerConfig.from_dict(c["server"]), ModelConfig.from_dict(c["model"]))
                     for c in self.data["defective"]}
        guard = "pre-fix" if config_key(scenario.server, scenario.model) in defective else "fixed"
        scenario = dataclasses.replace(scenario, guard=load_guard(guard), guard_spec=guard)
        result = ModelSUT().run(scenario, kernel=kernel)
        # the model's own trace, and its FA3 events in the engine shape (gpu_impl.fa3_calls.pair_summary, what a
        # real engine's trace holds and conform compares); without the events conform finds every model event
        # missing on this engine ("event only in the model")
        return {"findings": [f.to_dict() for f in result.findings], "trace": jsonable(result.trace),
                "events": jsonable(model_pairs(scenario, result))}

    def identity(self) -> dict:
        return {"name": str(self.spec), "log": self.path.name}

    def close(self) -> None:
        if self.recording:
            self.path.write_text(json.dumps({"scenarios": dict(sorted(self.log.items()))}, sort_keys=True) + "\n")


class UnprofiledRecordedSUT(RecordedSUT):
    """The same log, naming no profile it conforms to (conform then needs ``--engine-profile``)."""

    def conformance_profile(self) -> None:
        return None


def record(cases_dir: str) -> None:
    """Write ``recorded_log.json``: every scenario the tests' commands ask, answered by our model (pre-fix guard
    on the defective configurations)."""
    from fa3verify.cli import main

    sys.path.insert(0, str(HERE.parent))
    engine = f"sut={TARGET}@record"
    main(["fuzz", "--engine", engine, "--cases", "12", "--seed", "0", "--cases-dir", f"{cases_dir}/fuzz"])
    main(["gate", "--engine", engine, "--cases", "12", "--seed", "0", "--cases-dir", f"{cases_dir}/gate"])
    main(["conform", "--engine", engine, "--cases", "12", "--seed", "0", "--cases-dir", f"{cases_dir}/conform"])


if __name__ == "__main__":
    import tempfile

    if LOG.exists():
        LOG.unlink()
    record(tempfile.mkdtemp())
