"""The ``--engine`` option: the one place where a command line turns an engine name into a system under test.

Every command that runs scenarios (fuzz, gate, replay, run-ranks, prove's witness replay, conform) takes
``--engine FORM`` (the registry's forms, ``gpu_impl/engine_forms.json``) and opens it here, through
:func:`gpu_impl.sut.open_sut` only. What this module needs to know about an engine it asks the spec (its row of
``gpu_impl.sut.ENGINE_REGISTRY``) or the system under test, never the engine's kind.
A malformed name or an engine that cannot be opened (no environment, no ``gpu_impl.engines`` in this
checkout, a checkout that does not import) is a :class:`fa3verify.errors.UsageError` naming ``--engine``:
exit 2, never a traceback.

Policy options on a real engine (decided here, documented in docs/engines.md): ``--guard``,
``--metadata-heads``, ``--keep-stale-cp-metadata`` and ``--cp-decode-sharded-kv`` describe *our model's*
policy; where the spec says the engine's own code runs (``EnginePlugin.runs_scenario_policy`` False) its guard,
head counts and runner are whatever its code does. Giving any of them a
non-default value together with a real engine is refused (exit 2) rather than silently ignored.
"""

from __future__ import annotations

import sys

from typing import Optional

from .errors import UsageError

from gpu_impl.sut import ENGINE_HELP  # every form's words, from the registry (gpu_impl/engine_forms.json)
from gpu_impl.sut import spec_from_identity  # the EngineSpec a case file's engine object names, by the registry
from gpu_impl.plugin import engine_phrase, engine_phrases, profile_forms, release_forms, release_spec

#: ``--engine``'s default: what a command runs on when the option is not given.
DEFAULT_ENGINE = "model"

#: (argparse dest, option, default) of the model-policy options a real engine does not take.
POLICY_OPTIONS = (("guard", "--guard", "fixed"), ("metadata_heads", "--metadata-heads", "tp"),
                  ("keep_stale_cp_metadata", "--keep-stale-cp-metadata", False),
                  ("cp_decode_sharded_kv", "--cp-decode-sharded-kv", False))

def is_unsupported(exc: BaseException) -> bool:
    """True for an engine's "this scenario uses a feature the driver does not run" error (MLA, fp8 KV cache):
    the scenario is skipped and counted, never passed and never a violation."""
    from gpu_impl.sut import ScenarioUnsupported

    return isinstance(exc, ScenarioUnsupported)


def engine_validation(sut, server, model=None) -> tuple:
    """(accepted, message) from the engine's own validation of a configuration (e.g. a release's ServerArgs):
    True, False (with the release's message), or None when it has none or it cannot run on CPU."""
    check = getattr(sut, "validate", None)
    if check is None:
        return None, "the engine has no validation"
    ok, message = check(server, model)
    return (None if ok is None else bool(ok)), str(message or "")


def add_engine_argument(parser, default: Optional[str] = DEFAULT_ENGINE, help_extra: str = "") -> None:
    """Add ``--engine`` to a subcommand parser (default ``model``; None: the command picks, e.g. the case's)."""
    parser.add_argument("--engine", default=default, metavar="ENGINE", help=ENGINE_HELP + help_extra)


def parse_engine_option(text: str):
    """The EngineSpec ``--engine TEXT`` names; a malformed name is a UsageError naming --engine."""
    from gpu_impl.sut import EngineSpecError, parse_engine

    try:
        return parse_engine(text)
    except EngineSpecError as exc:
        msg = str(exc)
        raise UsageError(msg if msg.startswith("--engine") else f"--engine: {msg}") from None


def start_engine(sut, command: str, lines=None) -> None:
    """Start a real engine's worker (building its environment if needed) as its own progress stage; what it prints
    goes to stderr (progress never goes to stdout, which may carry a report). The model needs no start."""
    import contextlib

    from .progress import stage

    if not getattr(sut, "has_worker", False):
        return
    with stage(command, f"start {sut.spec} (its worker imports the engine)", lines), \
            contextlib.redirect_stdout(sys.stderr):
        sut.start()


def launch_engine(sut) -> None:
    """Start a real engine's worker process without waiting for it, where the system under test can
    (``launch``): its import runs beside the caller's next work and :func:`start_engine` waits for the rest. An
    environment build's lines go to stderr. Nothing for the model or an engine without ``launch``."""
    import contextlib

    launch = getattr(sut, "launch", None)
    if not getattr(sut, "has_worker", False) or launch is None:
        return
    with contextlib.redirect_stdout(sys.stderr):
        launch()


def open_engine(spec_or_text, policy=None):
    """Open the system under test an ``--engine`` value (or EngineSpec) names (``policy``: the model policy it is
    constructed with, where the scenario's policy runs); unavailable -> UsageError."""
    from gpu_impl.sut import EngineSpecError, open_sut

    import contextlib

    spec = parse_engine_option(spec_or_text) if isinstance(spec_or_text, str) else spec_or_text
    try:
        with contextlib.redirect_stdout(sys.stderr):  # an environment build's lines are progress: stderr
            # what the engine's plugin takes when opened: the policy where the scenario's policy runs, else nothing
            return open_sut(spec, **spec.plugin.open_options(spec, policy))
    except EngineSpecError as exc:
        msg = str(exc)
        raise UsageError(msg if msg.startswith("--engine") else f"--engine: {msg}") from None
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("gpu_impl.engines"):
            raise UsageError(f"--engine: {spec}: real engines are not available in this checkout "
                             f"(no module {exc.name}); use --engine model") from None
        raise


def refuse_policy_options(args, spec) -> None:
    """Where the engine's own code decides (not the scenario's policy), a model-policy option set away from its
    default is a UsageError (exit 2)."""
    for dest, option, default in POLICY_OPTIONS:
        value = getattr(args, dest, default)
        refusal = spec.plugin.policy_option_refusal(spec, option) if value is not None and value != default else None
        if refusal:
            raise UsageError(refusal)


def fa3_build_of(spec) -> str:
    """The FA3 build (refmodel.fa3_builds) that judges runs of this engine spec (``EnginePlugin.fa3_build``):
    recorded per release, else upstream; no spec (numerics on the emulator) is judged under upstream's."""
    from refmodel.fa3_builds import UPSTREAM

    return UPSTREAM if spec is None else spec.plugin.fa3_build(spec)


def identity_of(sut) -> dict:
    """What a case file records about a system under test: ``{name, release|path|target, revision}``, normalised
    (the field is the one the spec's registry row takes; the model records its name only)."""
    spec = sut.spec
    ident = dict(sut.identity() or {})
    out = {"name": spec.kind}
    if spec.identity_field is None:
        return out
    out[spec.identity_field] = getattr(spec, spec.identity_field)
    for key in ("release", "path", "revision"):
        if ident.get(key) is not None and key not in out:
            out[key] = str(ident[key])
    return out


def profile_of(spec):
    """The model profile (spec.model.engine_profiles) of the release an engine spec runs, or None (model, unknown)."""
    from spec.model.engine_profiles import ProfileError, profile_for

    if spec is None or not spec.release:
        return None
    try:
        return profile_for(spec.release)
    except ProfileError:
        return None


def case_policy(policy, sut=None) -> dict:
    """The ``policy`` object a case file records: the model's policy, or for a real release the policy of its
    profile (so the case replays on ``--engine model`` as that release); a checkout records the model's policy."""
    return policy.to_dict() if sut is None else sut.spec.plugin.policy_record(policy, sut)


def sut_from_args(args, policy=None):
    """The system under test of a command's ``--engine`` (policy options checked), opened; use it as a context.
    Where the scenario's policy runs (the model) it is constructed with ``policy`` (default: the one the options
    name; ``ModelSUT(policy=...)``), which fuzz and the gate read from it."""
    from .policy import load_policy

    if policy is None:
        policy = load_policy(args.guard, args.metadata_heads, args.keep_stale_cp_metadata, args.cp_decode_sharded_kv)
    spec = parse_engine_option(args.engine)
    refuse_policy_options(args, spec)
    return open_engine(spec, policy=policy)  # the plugin uses it where the scenario's policy runs


def engine_for_case(case, override: Optional[str] = None):
    """The EngineSpec a replay runs on: ``--engine`` if given, else the case's own engine (absent: the model).

    A case file never makes the tool run code the user did not name: a case found on a source checkout (or a
    ``sut=MODULE:CLASS``) replays on it only when ``--engine`` names it on the command line (``EnginePlugin.named_only``).
    """
    if override:
        return parse_engine_option(override)
    try:
        spec = spec_from_identity(case.engine)
    except Exception as exc:  # a malformed engine object already fails case validation; belt and braces
        raise UsageError(f"engine: {exc}") from None
    if spec.plugin.named_only(spec):
        raise UsageError(f"engine: the case was found on {spec.plugin.found_on(spec)}; replay runs code only "
                         f"you name: pass --engine {spec} (or --engine model)")
    return spec


def add_profile_argument(parser) -> None:
    """``--engine-profile ENGINE==V``: run the model as release V's backend, or (prove, conform) an engine's own
    flow profile; the forms and their words are the engines' (``gpu_impl.plugin.profile_forms``)."""
    parser.add_argument("--engine-profile", metavar="|".join(profile_forms() + profile_forms("flow-theorem")),
                        help="; ".join(engine_phrases("profile help")))


def profile_policy_args(args):
    """(guard, metadata_heads, profile) for ``--engine-profile`` (None when not given); UsageError otherwise."""
    text = getattr(args, "engine_profile", None)
    if not text:
        return args.guard, args.metadata_heads, None
    spec = release_spec(text)
    if spec is None or spec.plugin.profile_proof() != "model-policy":
        raise UsageError(f"--engine-profile: want {' or '.join(profile_forms())} (or, for prove, "
                         f"{' or '.join(profile_forms('flow-theorem'))}) with V in a profiled release, got {text!r}")
    for dest, option, default in POLICY_OPTIONS[:2]:
        if getattr(args, dest, default) != default:
            raise UsageError(f"{option}: cannot be combined with --engine-profile (the profile sets it)")
    try:
        profile = spec.plugin.release_profile(spec.release)
    except ValueError as exc:
        raise UsageError(f"--engine-profile: {exc}") from None
    return profile.guard_spec, profile.precompute_heads, profile


def profile_proof_of(args) -> str:
    """How ``prove`` proves the ``--engine-profile`` it is given (its engine's ``profile_proof``); without one, or
    for a name no engine profiles, ``"model-policy"`` (the model's theorems under the policy options, which refuse
    a bad name)."""
    spec = release_spec(getattr(args, "engine_profile", None))
    return (spec.plugin.profile_proof() if spec is not None else None) or "model-policy"


def flow_profile_arg(args):
    """(spec, profile) of ``--engine-profile ENGINE==V`` for an engine with a theorem of its own; UsageError when it
    is combined with a policy option (the profile sets both sides) or names no profiled release."""
    text = getattr(args, "engine_profile", None)
    spec = release_spec(text)
    for dest, option, default in POLICY_OPTIONS:
        if getattr(args, dest, default) != default:
            raise UsageError(f"{option}: does not apply to --engine-profile {text} ("
                             f"{spec.plugin.phrase('name')}'s profile says what each side passes; "
                             f"{engine_phrase('modelled')}'s guard and head options do not exist there)")
    try:
        return spec, spec.plugin.release_profile(spec.release)
    except ValueError as exc:
        raise UsageError(f"--engine-profile: {exc}") from None


def conform_profile(text: Optional[str], sut):
    """The profile conformance checks: ``--engine-profile`` if given, else the one the system under test says it
    conforms to (``sut.conformance_profile()``: by default its release; a checkout: the release its identity
    names); UsageError when there is none."""
    def played(spec):
        return spec if spec is not None and spec.plugin.profile_proof() == "model-policy" else None

    named = None
    if text:
        named = played(release_spec(text))
        if named is None:
            raise UsageError(f"--engine-profile: want {' or '.join(profile_forms())}, got {text!r}")
    else:
        own = sut.conformance_profile()
        named = played(release_spec(own)) if own else None
    if named is None or not named.release:
        example = next(row["example"] for row in release_forms() if played(release_spec(row["example"])))
        raise UsageError(f"--engine-profile: {sut.spec} names no release; say which profile to check "
                         f"(e.g. --engine-profile {example})")
    try:
        return named.plugin.release_profile(named.release)
    except ValueError as exc:
        raise UsageError(f"--engine-profile: {exc}") from None
