"""The system-under-test interface: run a configuration and its batches, return what FA3 was asked to do.

Every harness command (fuzz, gate, replay, conform, run-ranks, prove's witness replay) drives a system under
test through this one interface, so the same case runs on our model of sglang's backend and on real engine
code. A system under test returns a :class:`gpu_impl.scenario.ScenarioResult`: findings (invariant, step, DP
rank, message, detail) and a trace with one entry per FA3 event (every metadata precompute and every kernel
call that consumed it, per attention rank).

Each system under test also gives its configuration space (``SystemUnderTest.domain()``, ``gpu_impl.domain``):
the harness draws a campaign's configurations from it and never branches on the engine's kind.

Engines are named by a spec string (:func:`parse_engine`):

- ``model``: :class:`ModelSUT`, our model (``gpu_impl.backend`` through ``gpu_impl.scenario.run_scenario``);
  the default, fast, and the only engine that honours a scenario's policy fields (guard, metadata heads,
  runner hygiene, seeded defects).
- ``sglang==V``: sglang release V's own ``FlashAttentionBackend``, run in that release's cached engine
  environment (``gpu_impl.engines``). The guard is whatever that release's code does.
- ``vllm==V``: vLLM release V's FlashAttention metadata builder and impl (``gpu_impl.engines.vllm``), in its
  cached engine environment; record mode (metadata checks), numerics on the FA3 emulator on request.
- ``sglang-src=PATH``: an sglang source checkout (its ``python/`` directory, or a wheel file), run in the
  environment of the nearest release.
- ``vllm-src=PATH``: a vLLM source checkout (its root, holding ``vllm/``, or a wheel file), run in the environment
  of the nearest vLLM release; what a plain clone lacks until it is built (``vllm/vllm_flash_attn/``, compiled
  extensions) comes from that release.

Real engines are imported lazily: nothing here imports sglang or creates an environment.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

__all__ = ["EngineSpec", "EngineSpecError", "ModelSUT", "ScenarioUnsupported", "SystemUnderTest", "open_sut",
           "parse_engine"]

_RELEASE = re.compile(r"^\d+\.\d+\.\d+(\.post\d+)?$")


class EngineSpecError(ValueError):
    """An engine spec that names no engine this suite can drive (the message names the allowed forms)."""


class ScenarioUnsupported(EngineSpecError):
    """A scenario uses a feature this system under test does not run (MLA, fp8 KV cache on a driver without them):
    the harness skips and counts it, never a pass and never a violation (``fa3verify.judge``)."""


@dataclass(frozen=True)
class EngineSpec:
    """Which system under test: ``kind`` is "model", "sglang" / "vllm" (a release) or "sglang-src" / "vllm-src"
    (a checkout)."""

    kind: str
    release: Optional[str] = None
    path: Optional[str] = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __str__(self) -> str:
        if self.kind == "model":
            return "model"
        if self.kind in SOURCE_KINDS:
            return f"{self.kind}={self.path}"
        return f"{self.kind}=={self.release}"

    @property
    def is_model(self) -> bool:
        return self.kind == "model"

    @property
    def engine(self) -> str:
        """Whose code runs: "model", "sglang" or "vllm" (a release and a checkout of one engine alike)."""
        return self.kind.split("-")[0]

    @property
    def is_source(self) -> bool:
        """A checkout or wheel (``sglang-src=PATH``, ``vllm-src=PATH``): code that is not a registered release."""
        return self.kind in SOURCE_KINDS


#: The checkout forms: kind -> what PATH names (the message of a missing path).
SOURCE_KINDS = {"sglang-src": "an sglang checkout's python/ or a wheel",
                "vllm-src": "a vLLM checkout's root (holding vllm/) or a wheel"}


ENGINE_FORMS = ("'model', 'sglang==V' (a release, e.g. sglang==0.5.23), 'sglang-src=PATH' (a checkout or wheel), "
                "'vllm==V' (a vLLM release, e.g. vllm==0.33.0) or 'vllm-src=PATH' (a vLLM checkout or wheel)")


def parse_engine(text: str) -> EngineSpec:
    """Parse an ``--engine`` value; raises :class:`EngineSpecError` naming the allowed forms."""
    text = (text or "").strip()
    if text == "model":
        return EngineSpec("model")
    if text.startswith("sglang=="):
        release = text[len("sglang=="):]
        if not _RELEASE.match(release):
            raise EngineSpecError(f"--engine: {text!r} is not a release number (want e.g. sglang==0.5.23)")
        return EngineSpec("sglang", release=release)
    if text.startswith("vllm=="):
        release = text[len("vllm=="):]
        if not _RELEASE.match(release):
            raise EngineSpecError(f"--engine: {text!r} is not a release number (want e.g. vllm==0.33.0)")
        return EngineSpec("vllm", release=release)
    for kind, what in SOURCE_KINDS.items():
        if text.startswith(kind + "="):
            path = text[len(kind) + 1:]
            if not path:
                raise EngineSpecError(f"--engine: {kind}= needs a path ({what})")
            return EngineSpec(kind, path=str(Path(path).expanduser().resolve()))
    raise EngineSpecError(f"--engine: unknown engine {text!r}; allowed: {ENGINE_FORMS}")


class SystemUnderTest(abc.ABC):
    """One system under test: runs scenarios and reports every FA3 precompute and call it made."""

    spec: EngineSpec

    @abc.abstractmethod
    def run(self, scenario, kernel=None, numerics: bool = False, device: str = "cpu"):
        """Run every step of ``scenario`` (a :class:`gpu_impl.scenario.Scenario`); return a ScenarioResult."""

    def identity(self) -> dict:
        """What a case file records about the engine so it replays on the same code (name, release, path, rev)."""
        return {"name": str(self.spec)}

    def describe(self) -> str:
        return str(self.spec)

    def domain(self):
        """The configuration space the harness draws this system's cases from (a :class:`gpu_impl.domain
        .ConfigDomain`); by default the suite's ``scenario`` family (the model's own domain is the suite's). A
        real engine gives its own (its arguments, filtered by its own checks) and keeps it for its lifetime."""
        from .domain import ConfigDomain

        return ConfigDomain(str(self.spec), family="scenario")

    def assumption_facts(self) -> dict:
        """Which of spec's domain assumptions this system's own code enforces: ``{ASSUMPTION_*: AssumptionFact}``
        (``spec.assumption_facts``). Empty (the default, and the model's) means it describes none, so the harness
        keeps every assumption; a release returns its facts, and the gate's witness search and ``prove`` drop the
        prover assumptions it does not enforce."""
        return {}

    def start(self):
        """Start what the engine runs in (its worker process, the engine's import) before the first scenario, so a
        time budget measures scenarios, not start-up; the model has nothing to start. Idempotent."""

    def close(self) -> None:
        """Release what the engine holds (a worker process); the model holds nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ModelSUT(SystemUnderTest):
    """Our model of sglang's backend (``gpu_impl.backend``), driven by ``gpu_impl.scenario.run_scenario``."""

    spec = EngineSpec("model")

    def run(self, scenario, kernel=None, numerics: bool = False, device: str = "cpu"):
        from .scenario import run_scenario

        if getattr(scenario, "vllm", None) is not None:
            raise ValueError("vllm: a vLLM configuration (sliding windows, KV dtype, piecewise graphs) is not "
                             "modelled by the model of sglang's backend; run it on vllm==V")
        return run_scenario(scenario, kernel=kernel, numerics=numerics, device=device)

    def identity(self) -> dict:
        return {"name": "model"}


def open_sut(spec) -> SystemUnderTest:
    """The system under test an engine spec (or its text) names; real engines load from ``gpu_impl.engines``."""
    if isinstance(spec, str):
        spec = parse_engine(spec)
    if spec.is_model:
        return ModelSUT()
    from .engines import open_engine  # lazy: real engines need their environments

    return open_engine(spec)
