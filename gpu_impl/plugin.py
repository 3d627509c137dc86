"""One interface for every engine: :class:`EnginePlugin`, what the harness asks an engine, answered as methods.

An engine is a folder (``gpu_impl/engines/<engine>/``) whose ``plugin`` module holds one :class:`EnginePlugin`
subclass; a form of ``--engine`` is one row of ``gpu_impl/engine_forms.json`` naming that class (``plugin``:
``MODULE:CLASS``), its prefix and the field its value fills. Everything else the harness needs to know about an
engine (how to open it, whose policy runs, which FA3 build judges it, what conform checks, which seeded defects
and which case options it runs, the proof stages of its gate, how a message names where a case was found) is a
method here, answered by the engine's plugin: the harness calls the method and never compares an engine's kind.

The defaults are those of a real engine whose own code decides (its guard, head counts and runner): the model
(``gpu_impl/engines/model/plugin.py``) overrides what its policy changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

__all__ = ["EnginePlugin", "PolicyOptionRefused", "OwnProfileRefused", "ClaimCheck", "ClaimReport", "load_plugin",
           "case_options_schemas", "options_plugin", "engine_strategy_families", "engine_profile_for", "release_form",
           "engine_examples", "engine_phrase", "engine_phrases", "profile_forms", "release_forms", "release_spec",
           "sanitizer_targets"]


class PolicyOptionRefused(ValueError):
    """A model-policy option given for an engine whose own code decides (the message names the option)."""


class OwnProfileRefused(ValueError):
    """A profile an engine cannot be conformed against (``option``: the command-line option that named it)."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


@dataclass
class ClaimCheck:
    """One claim of an engine's own profile, checked on its code (``own-profile`` conformance): whether it held
    and what the code did."""

    name: str
    holds: bool
    message: str
    seconds: float = 0.0


@dataclass
class ClaimReport:
    """An ``own-profile`` conformance run: the policy it ran under, every claim checked, the findings
    (``spec.finding.Finding``) for the claims the code contradicts, and its duration."""

    policy: dict
    claims: list = field(default_factory=list)
    findings: list = field(default_factory=list)
    elapsed_s: float = 0.0


class EnginePlugin:
    """What the harness asks an engine. One instance per engine (``gpu_impl.sut.EngineSpec.plugin``); every method
    takes the spec it is asked about (a release, a checkout or a named class of that engine)."""

    #: the key a case files this engine's own options under (``Case.options``, a case file's ``options`` object);
    #: None: the engine takes none. Their schema is the plugin's own (:meth:`check_options`).
    options_key: Optional[str] = None

    # -- case options: a schema the engine owns ---------------------------------------------------------------
    def check_options(self, value, server: dict, path: str) -> dict:
        """The validated options object of a case filed under :attr:`options_key` (``value``, at ``path`` in the
        file), given the case's validated ``server`` object; ``spec.model.case_bounds.CaseFormatError`` names the
        first bad field. An engine with an options key overrides it."""
        from spec.model.case_bounds import CaseFormatError

        raise CaseFormatError(path, "no options (the engine takes none)", value)

    def assumptions_not_required(self) -> tuple:
        """spec's domain assumptions (``spec.model.config`` names) a case carrying this engine's options need not
        meet (the shrinker keeps candidates outside them): none."""
        return ()

    def strategy_families(self) -> dict:
        """The engine's own strategy families (``name -> family(rng) -> gpu_impl.domain.FuzzCase | None``), which the
        suite's ``fa3verify.strategies.FAMILIES`` adds to its own: none."""
        return {}

    # -- profiles --------------------------------------------------------------------------------------------------
    def release_profile(self, release: str):
        """The profile of ``release`` (what the prover plays and conform checks); ``spec.model.engine_profiles
        .ProfileError`` naming the profiled releases otherwise. None from :meth:`profiled_releases`: no profiles."""
        from spec.model.engine_profiles import ProfileError

        raise ProfileError(f"no profile for {release}: the engine has no release profiles")

    def profiled_releases(self) -> Optional[str]:
        """The releases with a profile, in words for a message (``0.5.11 .. 0.5.23``); None: no profiles."""
        return None

    # -- words: what the command line says about the engine (``words.json`` in its folder) --------------------------
    def words(self) -> dict:
        """The engine's words (its folder's ``words.json``: ``examples`` per command, ``phrases`` by key), {} when
        it has none; read once."""
        cached = self.__dict__.get("_words")
        if cached is None:
            import json
            import sys
            from pathlib import Path

            path = Path(sys.modules[type(self).__module__].__file__).with_name("words.json")
            cached = self.__dict__["_words"] = json.loads(path.read_text()) if path.is_file() else {}
        return cached

    def phrase(self, key: str) -> str:
        """One of its phrases (``words.json`` ``phrases``); KeyError when it has none by that key."""
        return self.words()["phrases"][key]

    def examples(self, command: str) -> list:
        """The example lines a command's help gives for this engine (``words.json`` ``examples``)."""
        return list(self.words().get("examples", {}).get(command, ()))

    # -- opening ------------------------------------------------------------------------------------------------
    def open(self, spec, policy=None):
        """The system under test ``spec`` names (a :class:`gpu_impl.sut.SystemUnderTest`); ``policy`` (the model
        policy the options name) is used only by an engine whose scenario policy runs (:meth:`runs_scenario_policy`)."""
        raise NotImplementedError

    def open_options(self, spec, policy=None) -> dict:
        """The keyword arguments :meth:`open` takes from a command: none, its own code decides (the model takes
        ``policy``)."""
        return {}

    # -- policy: whose code decides the guard, head counts and runner ---------------------------------------------
    def runs_scenario_policy(self, spec) -> bool:
        """Whether the scenario's policy (guard, metadata heads, runner hygiene) is what runs (the model); a real
        engine's own code decides."""
        return False

    def policy_option_refusal(self, spec, option: str, replay: bool = False) -> Optional[str]:
        """The message refusing a model-policy option (``--guard`` ...) set away from its default with this engine,
        or None when the option applies (the model)."""
        if replay:
            return (f"{option}: does not apply when replaying on {spec} (the engine's own code decides); use "
                    f"--engine model to replay on the model under another policy")
        return (f"{option}: does not apply to --engine {spec}: a real engine's guard, head counts and runner are "
                f"its own code; drop {option} (or use --engine model)")

    def policy_record(self, policy, sut) -> dict:
        """The ``policy`` object a case file records: for a release the policy of its profile (so the case replays
        on ``--engine model`` as that release); a checkout without a profile records the model's policy."""
        from spec.model.engine_profiles import ProfileError, profile_for

        release = sut.spec.release or (sut.identity() or {}).get("release")
        if release:
            try:
                return profile_for(release).policy()
            except ProfileError:
                pass
        return policy.to_dict()

    def summary_policy(self, record: dict, spec) -> dict:
        """The policy a gate's summary shows: an engine's own code decided, so the summary names it."""
        return {**record, "engine": str(spec)}

    # -- words -----------------------------------------------------------------------------------------------------
    def found_on(self, spec) -> str:
        """Where a case was found, in a message: ``sglang==0.5.23``, ``the source checkout PATH``, ..."""
        takes = spec.form["takes"]
        if takes == "path":
            return f"the source checkout {spec.path}"
        if takes == "target":
            return f"the system under test {spec.target}"
        return str(spec)

    def ran_on(self, spec, scenario=None) -> str:
        """Which system under test ran, in a finding's terms."""
        return str(spec)

    def guard_words(self, spec, scenario) -> str:
        """Whose guard decided, in a finding's terms."""
        return f"{spec}'s own guard"

    def run_label(self, spec) -> str:
        """What a check's name adds after its command (``replay X on sglang==0.5.23``)."""
        return f" on {spec}"

    def fuzz_check_name(self, spec, kernel_name: str) -> str:
        """The name of fuzz's check on it."""
        return f"fuzz on {spec}: no OOB, matches FA3's rules"

    def replay_guard(self, spec, policy) -> Optional[str]:
        """The guard a printed replay command passes (``--guard``, when it is the user's code): none, the engine's
        own code decides."""
        return None

    def pairs(self, scenario, result) -> list:
        """The FA3 (precompute, call) events of a run, for a finding's terms: the engine's trace entries."""
        trace = list(getattr(result, "trace", None) or [])
        return [e for e in trace if isinstance(e, dict) and "call" in e]

    # -- what it runs ------------------------------------------------------------------------------------------------
    def named_only(self, spec) -> bool:
        """Whether a case found on it replays on it only when ``--engine`` names it (a checkout, a named class): a
        case file never makes the tool run code the user did not name."""
        return spec.form["takes"] != "release"

    def applies_defects(self, spec) -> bool:
        """Whether its driver applies seeded defects (``gpu_impl.defects``) handed to it from outside."""
        return False

    def check_defects(self, spec, defects) -> None:
        """Refuse seeded defects its driver does not apply (ValueError naming them)."""
        if defects and not self.applies_defects(spec):
            raise ValueError(f"defects: {sorted(defects)} cannot be seeded into {spec} (its driver applies none; "
                             f"seeded defects run on {seeding_engines()})")

    def check_case_options(self, spec, options: dict) -> None:
        """Refuse a case's engine-owned options this engine does not run (ValueError naming the key)."""
        for key in options or {}:
            if key != self.options_key:
                owner = options_owner(key)
                raise ValueError(f"{key}: the case carries options of another engine's configuration; {spec} does "
                                 f"not run them: replay it with --engine {owner}")

    def fa3_build(self, spec) -> str:
        """The FA3 build (refmodel.fa3_builds) that judges its runs: upstream's unless the engine records its own."""
        from refmodel.fa3_builds import UPSTREAM

        return UPSTREAM

    def judging_build(self, spec, scenario) -> str:
        """The FA3 build that judged a run of ``scenario`` on it: its own (:meth:`fa3_build`) where its code decides;
        the model judges under the scenario's policy (a case's, e.g. a release profile's build)."""
        return self.fa3_build(spec)

    def releases(self) -> Optional[list]:
        """Every release the engine matrix gates, oldest first, as ``(release, runs_as)``: ``runs_as`` is the release
        whose registered row runs it (itself; another release whose driven files are byte-identical; None: known but
        not runnable here, its open says why). None: the engine has no releases to gate (the model, a named SUT)."""
        return None

    def proof_stages(self, spec) -> tuple:
        """The proof stages its gate runs before fuzz (``fa3verify.commands.gate.STAGES``): the model's witness searches
        replayed on it."""
        return ("witnesses",)

    # -- profiles and facts --------------------------------------------------------------------------------------
    def assumption_facts(self, release: str) -> dict:
        """``{ASSUMPTION_*: fact}`` of ``release`` (spec/model/assumption_facts.json): which prover assumptions its
        own code enforces; {} when none are recorded."""
        return {}

    #: the name of its own theorem (the ``flow-theorem`` proof stage), or None when it has none
    flow_theorem: Optional[str] = None
    #: where its flow profiles are kept, for a message naming a release without one
    flow_profiles_file: str = ""

    def flow_results(self, profile, timeout_s: float = 10.0, cases_dir=None) -> list:
        """Its own theorem under ``profile``: the results (``spec.theorems`` result objects), a refutation's
        counterexample written into ``cases_dir`` as a case file that replays on the engine."""
        return []

    def profile_proof(self) -> Optional[str]:
        """How ``prove --engine-profile ENGINE==V`` proves its release's profile: ``"model-policy"`` (the model
        plays the profile's heads and guard under every theorem), ``"flow-theorem"`` (its own theorem,
        :attr:`flow_theorem`), or None (it has no release profiles)."""
        return None

    def check_setup_release(self, release: str) -> None:
        """Refuse, before an environment is built, a release it cannot gate (ValueError with what to run instead);
        by default the environment's own check decides."""

    def release_text(self, release) -> str:
        """``ENGINE==V`` for ``release``: this engine's form that takes a release."""
        for row in release_forms():
            if load_plugin(row["plugin"]) is self:
                return row["prefix"] + str(release)
        return str(release)

    def flow_ran_on(self, profile) -> str:
        """What ran its theorem, in a finding's terms."""
        return f"the model of {profile.release}"

    # -- the runtime sanitizer -------------------------------------------------------------------------------------
    def sanitizer_entry_points(self) -> dict:
        """``module -> {function: kind}`` of the FA3 fronts its own code defines (kind "precompute", "call" or
        "varlen"), which the runtime sanitizer wraps beside FA3's own (``fa3verify.sanitize.targets``)."""
        return dict(self.words().get("sanitizer", {}).get("entry_points", {}))

    def sanitizer_rebinders(self) -> tuple:
        """Modules of its code known to re-bind the FA3 entry points at import (a status report expects them)."""
        return tuple(self.words().get("sanitizer", {}).get("rebinders", ()))

    #: the module whose ``run_worker(stdin=, stdout=, fa3=, observer=)`` serves its worker protocol, or None
    driver_module: Optional[str] = None

    def open_worker(self, spec, worker: str, worker_env: dict, progress=print, root=None):
        """The system under test ``spec`` names with its worker run as ``python -m worker`` (which serves
        :attr:`driver_module`) and ``worker_env`` added to its environment: the runtime sanitizer's engine run."""
        raise ValueError(f"engine: {spec} has no worker driver to run under another worker")

    def runs_ranks_in_process(self, spec) -> bool:
        """Whether ``run-ranks`` runs it in this process (the model); a real engine's ranks run in its worker."""
        return False

    # -- conformance -------------------------------------------------------------------------------------------------
    def conformance(self, spec) -> Optional[str]:
        """How conform checks it: ``"model-profile"`` (the model under its release's profile makes the same FA3
        events on drawn configurations), ``"own-profile"`` (its profile's claims, checked one by one on its own
        code), or None (nothing to conform: it is the model)."""
        return "model-profile"

    def own_profile(self, spec, text: Optional[str], release: Optional[str]):
        """``own-profile`` conformance: the profile ``text`` (``--engine-profile``; None: the one of ``release``, the
        release it runs or stands beside) names for it; :class:`OwnProfileRefused` naming the option otherwise."""
        raise OwnProfileRefused("--engine", f"{spec} has no profile of its own to conform against")

    def check_own_profile(self, sut, profile) -> ClaimReport:
        """``own-profile`` conformance: every claim of ``profile`` checked on the code ``sut`` runs."""
        raise NotImplementedError

    def conformance_profile(self, spec, sut) -> Optional[str]:
        """The release profile conform compares it with (``sglang==V``), or None when it names none: by default the
        release it runs or stands beside (a checkout's identity names its nearest release)."""
        release = spec.release or (sut.identity() or {}).get("release")
        return f"sglang=={release}" if release else None


def load_plugin(target: str) -> EnginePlugin:
    """The plugin a registry row names (``MODULE:CLASS``), constructed once per process."""
    plugin = _PLUGINS.get(target)
    if plugin is None:
        import importlib

        module, _, name = target.partition(":")
        plugin = _PLUGINS[target] = getattr(importlib.import_module(module), name)()
    return plugin


_PLUGINS: dict = {}


def _plugins() -> list:
    from .sut import ENGINE_REGISTRY

    return [(row, load_plugin(row["plugin"])) for row in ENGINE_REGISTRY.values()]


def _distinct_plugins() -> list:
    """Every registered plugin once, in registry order."""
    out: list = []
    for _row, plugin in _plugins():
        if all(plugin is not p for p in out):
            out.append(plugin)
    return out


def engine_examples(command: str, indent: str = "  ") -> str:
    """The example lines of ``command``'s help that name an engine: every plugin's, in registry order, one per line
    (each ending in a newline; "" when none has any)."""
    return "".join(f"{indent}{line}\n" for plugin in _distinct_plugins() for line in plugin.examples(command))


def engine_phrases(key: str) -> list:
    """Every plugin's phrase ``key`` (``words.json`` ``phrases``), in registry order, skipping those without it."""
    return [p.words()["phrases"][key] for p in _distinct_plugins() if key in p.words().get("phrases", {})]


def release_forms() -> list:
    """The registry rows whose form takes a release (``sglang==V``-like), in registry order."""
    from .sut import ENGINE_REGISTRY

    return [row for row in ENGINE_REGISTRY.values() if row["takes"] == "release"]


def release_spec(text):
    """The EngineSpec of ``ENGINE==V`` (a form that takes a release; V not checked here), or None for any other
    text."""
    from .sut import EngineSpec

    for row in release_forms():
        if text and text.startswith(row["prefix"]):
            return EngineSpec(row["kind"], release=text[len(row["prefix"]):])
    return None


def profile_forms(proof: str = "model-policy") -> list:
    """``ENGINE==V`` of every engine whose profiles ``prove`` proves by ``proof`` (:meth:`EnginePlugin.profile_proof`:
    by default the engines the model plays)."""
    return [row["prefix"] + "V" for row in release_forms() if load_plugin(row["plugin"]).profile_proof() == proof]


def sanitizer_targets() -> tuple:
    """(entry points, re-binding modules) of every registered engine's own code, for the runtime sanitizer."""
    points: dict = {}
    rebinders: list = []
    for plugin in _distinct_plugins():
        points.update(plugin.sanitizer_entry_points())
        rebinders.extend(plugin.sanitizer_rebinders())
    return points, tuple(rebinders)


def engine_phrase(key: str, **values) -> str:
    """A phrase of the command line's words that an engine owns (``words.json`` ``phrases``: the first plugin in
    registry order that has ``key``), formatted with ``values``; KeyError when none has it."""
    for plugin in _distinct_plugins():
        text = plugin.words().get("phrases", {}).get(key)
        if text is not None:
            return text.format(**values) if values else text
    raise KeyError(f"no engine has the phrase {key!r}")


def seeding_engines() -> str:
    """The forms whose drivers apply seeded defects, for a message."""
    from .sut import EngineSpec

    out = []
    for row, plugin in _plugins():
        spec = EngineSpec(row["kind"], release="0.0.0" if row["takes"] == "release" else None)
        if not plugin.applies_defects(spec):
            continue
        if row["takes"] is None:
            out.append(f"the {row['prefix']}")
        elif row["takes"] == "release":
            out.append(row["prefix"] + "V")
    return " or on ".join(out)


def options_owner(key: str) -> str:
    """The ``--engine`` form that runs a case's options filed under ``key`` (``vllm==V``)."""
    for row, plugin in _plugins():
        if plugin.options_key == key and row["takes"] == "release":
            return row["prefix"] + "V"
    return "the engine that wrote it"


def options_plugin(key: str) -> Optional[EnginePlugin]:
    """The plugin whose case options are filed under ``key`` (None: no registered engine's)."""
    return next((plugin for _, plugin in _plugins() if plugin.options_key == key), None)


def case_options_schemas() -> dict:
    """``{options key: check(value, server, path)}`` for every registered engine that takes case options: the
    schemas ``spec.model.cases`` validates a case's ``options`` with (it names no engine)."""
    return {plugin.options_key: plugin.check_options for _, plugin in _plugins() if plugin.options_key}


def engine_strategy_families() -> dict:
    """Every registered engine's own strategy families (:meth:`EnginePlugin.strategy_families`), by name."""
    out: dict = {}
    for plugin in dict.fromkeys(plugin for _, plugin in _plugins()):
        out.update(plugin.strategy_families())
    return out


def release_form(spec) -> Optional[dict]:
    """The registry row of the release form of ``spec``'s engine (the row with ``takes`` "release" and the same
    plugin: ``vllm==`` for ``vllm-src=PATH``), or None."""
    from .sut import ENGINE_REGISTRY

    return next((row for row in ENGINE_REGISTRY.values()
                 if row["takes"] == "release" and row["plugin"] == spec.form["plugin"]), None)


def engine_profile_for(text: str) -> tuple:
    """``(kind, profile)`` for a profile name ``ENGINE==V`` (a release form's prefix and V), the profile being the
    engine's plugin's (:meth:`EnginePlugin.release_profile`); ProfileError naming the allowed forms and releases
    otherwise."""
    from spec.model.engine_profiles import ProfileError

    text = text or ""
    forms = [(row, plugin) for row, plugin in _plugins()
             if row["takes"] == "release" and plugin.profiled_releases() is not None]
    for row, plugin in forms:
        if text.startswith(row["prefix"]):
            profile = plugin.release_profile(text[len(row["prefix"]):])
            return row["kind"], profile
    allowed = " or ".join(f"{row['prefix']}V ({plugin.profiled_releases()})" for row, plugin in forms)
    raise ProfileError(f"want {allowed}, got {text!r}")
