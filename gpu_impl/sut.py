"""The system-under-test interface: run a configuration and its batches, return what FA3 was asked to do.

Every harness command (fuzz, gate, replay, conform, run-ranks, prove's witness replay) drives a system under
test through this one interface, so the same case runs on our model of sglang's backend and on real engine
code. A system under test returns a :class:`gpu_impl.scenario.ScenarioResult`: findings (invariant, step, DP
rank, message, detail) and a trace with one entry per FA3 event (every metadata precompute and every kernel
call that consumed it, per attention rank).

Each system under test also gives its configuration space (``SystemUnderTest.domain()``, ``gpu_impl.domain``):
the harness draws a campaign's configurations from it and never branches on the engine's kind.

Engines are named by a spec string (:func:`parse_engine`):

- ``model``: ``gpu_impl.engines.model.sut.ModelSUT``, our model (``gpu_impl.backend`` through ``gpu_impl.scenario.run_scenario``);
  the default, fast, and the only engine whose policy (guard, metadata heads, runner hygiene, seeded defects)
  is the harness's: given to its constructor (``ModelSUT(policy=...)``: the policy options, a case's policy on
  replay), else a scenario's policy fields.
- ``sglang==V``: sglang release V's own ``FlashAttentionBackend``, run in that release's cached engine
  environment (``gpu_impl.engines``). The guard is whatever that release's code does.
- ``vllm==V``: vLLM release V's FlashAttention metadata builder and impl (``gpu_impl.engines.vllm``), in its
  cached engine environment; record mode (metadata checks), numerics on the FA3 emulator on request.
- ``sglang-src=PATH``: an sglang source checkout (its ``python/`` directory, or a wheel file), run in the
  environment of the nearest release.
- ``vllm-src=PATH``: a vLLM source checkout (its root, holding ``vllm/``, or a wheel file), run in the environment
  of the nearest vLLM release; what a plain clone lacks until it is built (``vllm/vllm_flash_attn/``, compiled
  extensions) comes from that release.
- ``sut=MODULE:CLASS[@ARG]``: any :class:`SystemUnderTest` subclass the user names (:func:`open_named_sut`);
  like a checkout, a case found on it replays on it only when ``--engine`` names it again.

The forms are one table (``gpu_impl/engine_forms.json``, :data:`ENGINE_REGISTRY`): its prefix, the field its value
fills, the factory that opens it and every answer the harness needs about it (whose policy runs, whether a case
replays on it unasked, which FA3 build judges it, what conform checks), so the harness asks the spec and
never compares an engine's kind.

Real engines are imported lazily: nothing here imports sglang or creates an environment.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

__all__ = ["ENGINE_REGISTRY", "EngineSpec", "EngineSpecError", "ScenarioUnsupported", "SystemUnderTest",
           "open_named_sut", "open_sut", "parse_engine", "releases_of", "spec_from_identity"]

_RELEASE = re.compile(r"^\d+\.\d+\.\d+(\.\d+)?(\.post\d+)?$")


class EngineSpecError(ValueError):
    """An engine spec that names no engine this suite can drive (the message names the allowed forms)."""


class ScenarioUnsupported(EngineSpecError):
    """A scenario uses a feature this system under test does not run (MLA, fp8 KV cache on a driver without them):
    the harness skips and counts it, never a pass and never a violation (``fa3verify.judge``)."""


#: the keys a registry row may have (gpu_impl/engine_forms.json's ``_doc``)
FORM_KEYS = ("kind", "prefix", "takes", "plugin", "example", "help", "what", "path")

#: the environment variable naming more forms files (``os.pathsep``-separated): engines outside this package
FORMS_VARIABLE = "FA3VERIFY_ENGINE_FORMS"


def _read_forms(path: Path, source: str = FORMS_VARIABLE) -> list:
    """The rows of a forms file; ``source``: what named it, in errors (the package's own file is read with
    ``source=None``: its absence is a broken installation, raised as it is, not a user's bad input)."""
    import json

    if source is None:
        return json.loads(Path(path).read_text())["forms"]
    try:
        rows = json.loads(Path(path).read_text())["forms"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EngineSpecError(f"{source}: {path}: not a forms file ({{\"forms\": [rows]}}): {exc}") from None
    for row in rows:
        bad = sorted(set(row) - set(FORM_KEYS)) or [k for k in ("kind", "prefix", "takes", "plugin", "example",
                                                                  "help") if k not in row]
        if bad:
            raise EngineSpecError(f"{FORMS_VARIABLE}: {path}: row {row.get('kind')!r}: key {bad[0]!r} (allowed: "
                                  f"{', '.join(FORM_KEYS)}; kind, prefix, takes, plugin, example, help required)")
        if row["takes"] not in (None, "release", "path", "target"):
            raise EngineSpecError(f"{FORMS_VARIABLE}: {path}: row {row['kind']!r}: takes must be null, 'release', "
                                  f"'path' or 'target', got {row['takes']!r}")
    return rows


def register_forms(path) -> list:
    """Add the rows of a forms file (``{"forms": [rows]}``, the shape of gpu_impl/engine_forms.json) to
    :data:`ENGINE_REGISTRY`: an engine outside this package is one folder (its plugin and system under test) and
    this one file. A row's ``path`` (relative to the file) is put on ``sys.path`` so its ``plugin`` imports.
    Returns the kinds added; a kind already registered is an :class:`EngineSpecError`."""
    import sys

    from spec.model.cases import register_engine

    path = Path(path).resolve()
    rows = _read_forms(path)
    for row in rows:
        if row["kind"] in ENGINE_REGISTRY:
            raise EngineSpecError(f"{FORMS_VARIABLE}: {path}: engine kind {row['kind']!r} is registered already")
    for row in rows:
        if row.get("path") is not None:
            folder = str((path.parent / row["path"]).resolve())
            if folder not in sys.path:
                sys.path.insert(0, folder)
        ENGINE_REGISTRY[row["kind"]] = row
        register_engine(row["kind"], row["takes"])
    _describe_forms()
    return [row["kind"] for row in rows]


def unregister_forms(kinds) -> None:
    """Remove forms :func:`register_forms` added (the built-in ones stay)."""
    from spec.model.cases import unregister_engine

    for kind in kinds:
        if kind not in _BUILTIN:
            ENGINE_REGISTRY.pop(kind, None)
            unregister_engine(kind)
    _describe_forms()


#: Every engine form ``--engine`` accepts, by kind (gpu_impl/engine_forms.json, then the files
#: ``$FA3VERIFY_ENGINE_FORMS`` names): a new engine is a row naming its plugin plus the folder that holds it.
ENGINE_REGISTRY = {row["kind"]: row for row in _read_forms(Path(__file__).with_name("engine_forms.json"), None)}
_BUILTIN = frozenset(ENGINE_REGISTRY)


@dataclass(frozen=True)
class EngineSpec:
    """Which system under test: ``kind`` names a row of :data:`ENGINE_REGISTRY` ("model", a release "sglang" /
    "vllm", a checkout "sglang-src" / "vllm-src", or "sut", a SystemUnderTest class the user names), and the
    field that row ``takes`` holds its value; every question the harness asks about it is answered from that row."""

    kind: str
    release: Optional[str] = None
    path: Optional[str] = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    target: Optional[str] = None

    def __str__(self) -> str:
        form = self.form
        return form["prefix"] + (str(getattr(self, form["takes"])) if form["takes"] else "")

    @property
    def form(self) -> dict:
        """This spec's row of :data:`ENGINE_REGISTRY`."""
        return ENGINE_REGISTRY[self.kind]

    @property
    def plugin(self):
        """The engine's :class:`gpu_impl.plugin.EnginePlugin` (its row's ``plugin``): every question the harness
        asks about the engine is one of its methods."""
        from .plugin import load_plugin

        return load_plugin(self.form["plugin"])

    @property
    def is_model(self) -> bool:
        return self.kind == "model"

    @property
    def identity_field(self) -> Optional[str]:
        """The field a case file records beside the engine's name ("release", "path", "target"; None: the model)."""
        return self.form["takes"]

    @property
    def case_records_engine(self) -> bool:
        """Whether a case found on it records an ``engine`` object (the model's cases carry none)."""
        return self.form["takes"] is not None


def _describe_forms() -> None:
    global ENGINE_FORMS, ENGINE_HELP
    ENGINE_FORMS = ", ".join(f"'{row['example']}'" for row in ENGINE_REGISTRY.values())
    #: ``--engine``'s help: every form's words, from the registry.
    ENGINE_HELP = "system under test: " + ", ".join(row["help"] for row in ENGINE_REGISTRY.values())


ENGINE_FORMS = ENGINE_HELP = ""
_describe_forms()


def _register_from_environment() -> None:
    import os

    for name in filter(None, os.environ.get(FORMS_VARIABLE, "").split(os.pathsep)):
        register_forms(name)


_register_from_environment()


def parse_engine(text: str) -> EngineSpec:
    """Parse an ``--engine`` value by the registry's forms; raises :class:`EngineSpecError` naming them."""
    text = (text or "").strip()
    for kind, row in ENGINE_REGISTRY.items():
        prefix, takes = row["prefix"], row["takes"]
        if takes is None:
            if text == prefix:
                return EngineSpec(kind)
            continue
        if not text.startswith(prefix):
            continue
        value = text[len(prefix):]
        if takes == "release":
            if not _RELEASE.match(value):
                raise EngineSpecError(f"--engine: {text!r} is not a release number (want e.g. {row['example']})")
            return EngineSpec(kind, release=value)
        if not value:
            raise EngineSpecError(f"--engine: {prefix} needs a {'path' if takes == 'path' else 'value'} "
                                  f"({row['what']})")
        if takes == "path":
            return EngineSpec(kind, path=str(Path(value).expanduser().resolve()))
        return EngineSpec(kind, **{takes: value})
    raise EngineSpecError(f"--engine: unknown engine {text!r}; allowed: {ENGINE_FORMS}")


def releases_of(kind: str) -> list:
    """Every release of engine ``kind`` that the engine matrix gates, oldest first, as ``(release, runs_as)``
    (:meth:`gpu_impl.plugin.EnginePlugin.releases` of the form that takes a release); EngineSpecError naming the
    kinds that have releases otherwise."""
    from .plugin import load_plugin

    def listed(row):
        return row.get("takes") == "release" and load_plugin(row["plugin"]).releases() is not None

    row = ENGINE_REGISTRY.get(kind)
    if row is None or not listed(row):
        kinds = ", ".join(k for k, r in ENGINE_REGISTRY.items() if listed(r))
        raise EngineSpecError(f"--engine: {kind!r} names no engine whose releases are gated by the matrix "
                              f"(allowed: {kinds})")
    return list(load_plugin(row["plugin"]).releases())


def spec_from_identity(identity: Optional[dict]) -> EngineSpec:
    """The EngineSpec a case file's ``engine`` object names (None or absent: the model): its ``name`` is a
    registry kind and the field that kind takes holds the value, or ``name`` is a full spec string."""
    if not identity or identity.get("name") in (None, "model"):
        return EngineSpec("model")
    name = identity["name"]
    row = ENGINE_REGISTRY.get(name)
    if row is not None and row["takes"] and identity.get(row["takes"]):
        return parse_engine(row["prefix"] + str(identity[row["takes"]]))
    return parse_engine(name)


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
        (``spec.model.assumption_facts``). Empty (the default, and the model's) means it describes none, so the harness
        keeps every assumption; a release returns its facts, and the gate's witness search and ``prove`` drop the
        prover assumptions it does not enforce."""
        return {}

    #: the model policy it runs (guard, metadata heads, runner hygiene: a ``fa3verify.policy.Policy``), given to its
    #: constructor; None: its own code decides, and the harness's default policy fills a scenario's policy fields
    policy = None

    def proof_plan(self) -> tuple:
        """The proof stages its gate runs before fuzz, as data (``fa3verify.commands.gate.STAGES`` runs them): by default
        the witness searches on the model, replayed on it (``"witnesses"``), and its registry row's flow theorem
        under its release's profile (``"flow-theorem"``); the model's is every theorem under its policy."""
        return self.spec.plugin.proof_stages(self.spec)

    def conformance_profile(self) -> Optional[str]:
        """The release profile conform compares it with (``sglang==V``, spec/model/engine_profiles.json: the model under
        that profile must make the FA3 events it makes), or None when it names none. By default the release it
        runs or stands beside (a checkout's identity names its nearest release)."""
        return self.spec.plugin.conformance_profile(self.spec, self)

    def conformance_family(self) -> Optional[str]:
        """The strategy family (``fa3verify.strategies``) conform draws its configurations from: by default
        ``release`` (sglang's server arguments); None: its own domain (:meth:`domain`)."""
        return "release"

    def case_family(self, case) -> Optional[tuple]:
        """(configuration family, path) of a case found on it, in its own terms, for the engine matrix; None: the
        harness names it from the case's server configuration (DP attention, prefill CP, TP only; eager or graph)."""
        return None

    def family_probes(self) -> Optional[tuple]:
        """The family probes the engine matrix runs beside its gate (``(name, server configuration)`` pairs of the
        worked example); None: the harness's own (prefill CP and DP attention); (): none."""
        return None

    #: whether it has a worker to start before the first scenario (a real engine's process); the model has none
    has_worker = False

    def launch(self) -> None:
        """Start what the engine runs in without waiting for it (its import runs beside the caller's next work; the
        first use, or :meth:`start`, waits); by default nothing, and :meth:`start` does it all. Idempotent."""

    def start(self):
        """Start what the engine runs in (its worker process, the engine's import) before the first scenario, so a
        time budget measures scenarios, not start-up; the model has nothing to start. Idempotent."""

    def close(self) -> None:
        """Release what the engine holds (a worker process); the model holds nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_named_sut(spec: EngineSpec) -> SystemUnderTest:
    """``sut=MODULE:CLASS[@ARG]``: import the module and class the user named (a :class:`SystemUnderTest`
    subclass) and construct it with ARG (or nothing); anything else is an :class:`EngineSpecError` naming --engine."""
    import importlib

    target, _, arg = spec.target.partition("@")
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise EngineSpecError(f"--engine: sut={spec.target}: want sut=MODULE:CLASS or sut=MODULE:CLASS@ARG")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise EngineSpecError(f"--engine: sut={spec.target}: cannot import module {module!r} ({exc})") from None
    cls = getattr(mod, name, None)
    if not (isinstance(cls, type) and issubclass(cls, SystemUnderTest)):
        raise EngineSpecError(f"--engine: sut={spec.target}: {module}.{name} is not a SystemUnderTest subclass")
    try:
        sut = cls(arg) if arg else cls()
    except Exception as exc:  # the user's constructor: its failure is bad input, not the harness's crash
        called = f"{module}.{name}({arg!r})" if arg else f"{module}.{name}()"
        raise EngineSpecError(f"--engine: sut={spec.target}: {called} failed: {type(exc).__name__}: {exc}") from None
    sut.spec = spec
    return sut


def open_sut(spec, policy=None) -> SystemUnderTest:
    """The system under test an engine spec (or its text) names, opened by its engine's plugin
    (:meth:`gpu_impl.plugin.EnginePlugin.open`); ``policy`` (the model policy the options name) is used by an engine
    whose scenario policy runs (the model) and ignored by one whose own code decides. Real engines load lazily:
    they need their environments."""
    if isinstance(spec, str):
        spec = parse_engine(spec)
    return spec.plugin.open(spec, policy=policy)
