"""Our domain assumptions as per-release facts: which ``ASSUMPTION_*`` of :mod:`spec.model.config` each engine release
enforces itself, and where.

Invariant: for every ``ASSUMPTION_*`` and every profiled sglang release (``spec.model.engine_profiles.RELEASES``) the data
(``spec/model/assumption_facts.json``) holds exactly one fact: "enforced", naming the release's own check (a file and a
function inside the wheel's ``sglang/`` package: ``srt/server_args.py ServerArgs._handle_context_parallelism``, a
model-load assert, the backend) and when it runs, or "not enforced"; vLLM 0.33.0 has facts where an assumption
applies to it. Each assumption has a probe (a configuration the assumption excludes) where the release can
be asked, and a vLLM fact may carry vLLM's own: ``tests/prover/test_assumption_facts_real.py`` shows each release rejecting
the probe of an "enforced" fact checked in ServerArgs or at model load and accepting the probe of a "not enforced"
one (vLLM 0.33.0: its config validation accepting its probe); ``fa3verify conform`` puts the same probes.

What the facts decide: ``prove --engine-profile sglang==V`` and the gate's witness search drop the prover's
assumptions (``spec.model.domain.ASSUMPTIONS``) V does not enforce (:func:`prover_drops`): a prover assumption is dropped
when every ``ASSUMPTION_*`` that maps onto it is "not enforced" (``ASSUMPTION_HEADS_DIVISIBLE`` holds the two head
splits enforced at model load, so it stays; ``ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL``, which no release enforces, is
its own prover assumption and is dropped). An assumption with no prover
counterpart (``prover`` null) restricts case files and the fuzzer, not the prover's domain.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import NamedTuple, Optional

__all__ = ["AssumptionFact", "Probe", "FactsError", "STATUSES", "STAGES", "ENGINES", "facts_for", "probes",
           "enforced", "not_enforced", "prover_drops", "facts_markdown", "prover_name", "reload", "DATA_PATH"]

DATA_PATH = Path(__file__).with_name("assumption_facts.json")
STATUSES = ("enforced", "not enforced")
#: when an enforcing check runs: ServerArgs validation, the model's attention modules at load, the backend itself
STAGES = ("server_args", "model_load", "backend")
ENGINES = ("sglang", "vllm")


class FactsError(ValueError):
    """A release with no facts, or facts data that breaks the schema (the message names what and where)."""


class AssumptionFact(NamedTuple):
    """One assumption on one release: its status, the release's check(s) enforcing it (file and function) and when."""

    assumption: str
    engine: str
    release: str
    status: str
    stage: Optional[str]
    checks: tuple
    note: str

    @property
    def is_enforced(self) -> bool:
        return self.status == "enforced"


class Probe(NamedTuple):
    """A configuration the assumption excludes, to put to a release's own validation."""

    assumption: str
    description: str
    server: dict
    model: object  # spec.model.config.ModelConfig


def _release_key(text: str) -> tuple:
    from spec.model.engine_profiles import release_key

    return release_key(text)


def _expand(span: str, engine: str) -> list:
    """``"0.5.11..0.5.18"`` -> the profiled releases in that range (sglang); a single release as itself."""
    if ".." not in span:
        return [span]
    first, last = span.split("..", 1)
    if engine != "sglang":
        raise FactsError(f"assumption facts: a range {span!r} is only for sglang releases")
    from spec.model.engine_profiles import releases_between

    return releases_between(first, last)


@functools.lru_cache(maxsize=1)
def _load() -> tuple:
    """(facts by (engine, release) -> {assumption: fact}, probes by assumption, prover names) from the JSON, checked."""
    from spec.model.config import ASSUMPTION_NAMES
    from spec.model.domain import ASSUMPTIONS as PROVER_ASSUMPTIONS
    from spec.model.engine_profiles import RELEASES

    data = json.loads(DATA_PATH.read_text(encoding="utf-8"))
    table = data.get("assumptions") or {}
    if set(table) != set(ASSUMPTION_NAMES):
        raise FactsError(f"{DATA_PATH.name}: assumptions {sorted(set(table) ^ set(ASSUMPTION_NAMES))} are missing or "
                         f"unknown; want every ASSUMPTION_* of spec/model/config.py")
    facts: dict = {}
    probe_of: dict = {}
    prover: dict = {}
    for name, entry in table.items():
        p = entry.get("prover")
        if p is not None and p not in PROVER_ASSUMPTIONS:
            raise FactsError(f"{DATA_PATH.name}: {name}.prover {p!r} is not a prover assumption "
                             f"({sorted(PROVER_ASSUMPTIONS)})")
        prover[name] = p
        probe_of[name] = entry.get("probe")
        for engine in ENGINES:
            for row in entry.get(engine) or []:
                status, stage, checks = row.get("status"), row.get("stage"), tuple(row.get("checks") or ())
                if status not in STATUSES:
                    raise FactsError(f"{DATA_PATH.name}: {name} {engine} {row.get('releases')}: status {status!r} not "
                                     f"in {STATUSES}")
                if status == "enforced" and (stage not in STAGES or not checks):
                    raise FactsError(f"{DATA_PATH.name}: {name} {engine} {row.get('releases')}: an enforced fact names "
                                     f"its checks and a stage in {STAGES}")
                if row.get("probe") is not None:  # the engine's own probe of this assumption (vLLM's DCP rules)
                    if probe_of.get((engine, name), row["probe"]) != row["probe"]:
                        raise FactsError(f"{DATA_PATH.name}: {name} {engine}: two different probes")
                    probe_of[(engine, name)] = row["probe"]
                for release in _expand(row["releases"], engine):
                    slot = facts.setdefault((engine, release), {})
                    if name in slot:
                        raise FactsError(f"{DATA_PATH.name}: {name} has two facts for {engine}=={release}")
                    slot[name] = AssumptionFact(name, engine, release, status, stage if status == "enforced" else None,
                                                checks, row.get("note", ""))
    for release in RELEASES:
        missing = sorted(set(ASSUMPTION_NAMES) - set(facts.get(("sglang", release), {})))
        if missing:
            raise FactsError(f"{DATA_PATH.name}: sglang=={release} has no fact for {missing}")
    return facts, probe_of, prover


def reload() -> None:
    """Read :data:`DATA_PATH` again on next use (the data is read once and cached)."""
    _load.cache_clear()


def prover_name(assumption: str) -> Optional[str]:
    """The prover assumption (``spec.model.domain.ASSUMPTIONS``) an ``ASSUMPTION_*`` maps onto, or None."""
    return _load()[2][assumption]


def facts_for(engine: str, release: str) -> dict:
    """``{ASSUMPTION_*: AssumptionFact}`` of ``engine`` (``sglang`` | ``vllm``) release ``release`` (``.postN``: its
    base); a vLLM release has facts only where an assumption applies. FactsError for an sglang release with none."""
    facts = _load()[0]
    if engine == "sglang":
        base = ".".join(str(x) for x in _release_key(release)[:3])
        if ("sglang", base) not in facts:
            from spec.model.engine_profiles import RELEASES

            raise FactsError(f"no assumption facts for sglang {release}; releases with facts: "
                             f"{RELEASES[0]} .. {RELEASES[-1]}")
        return dict(facts[("sglang", base)])
    if engine == "vllm":
        return dict(facts.get(("vllm", release), {}))
    raise FactsError(f"no assumption facts for engine {engine!r}; engines: {ENGINES}")


def enforced(facts: dict) -> list:
    """The assumptions a release enforces, in spec.model.config order."""
    return [n for n in _ordered() if n in facts and facts[n].is_enforced]


def not_enforced(facts: dict) -> list:
    """The assumptions a release does not enforce, in spec.model.config order."""
    return [n for n in _ordered() if n in facts and not facts[n].is_enforced]


def prover_drops(facts: dict) -> frozenset:
    """The prover assumptions to drop for a release: those whose every mapped ``ASSUMPTION_*`` has a fact for the
    release and is "not enforced" (an assumption with no fact, as vLLM's, keeps its prover assumption)."""
    prover = _load()[2]
    groups: dict = {}
    for name, target in prover.items():
        if target is not None:
            groups.setdefault(target, []).append(name)
    return frozenset(t for t, names in groups.items()
                     if all(n in facts and not facts[n].is_enforced for n in names))


def _ordered() -> list:
    from spec.model.config import DOMAIN_ASSUMPTIONS

    return [a.name for a in DOMAIN_ASSUMPTIONS]


def probes(engine: str = "sglang") -> tuple:
    """Every assumption's probe (those with one), in spec.model.config order. ``engine`` "vllm": only the assumptions
    vLLM has facts for, each with vLLM's own probe where its fact gives one (a configuration vLLM's other rules
    accept), else the shared one."""
    from spec.model.config import ModelConfig, get_model

    if engine not in ENGINES:
        raise FactsError(f"no assumption facts for engine {engine!r}; engines: {ENGINES}")
    table = _load()[1]
    with_facts = {n for (e, _r), slot in _load()[0].items() if e == engine for n in slot}
    out = []
    for name in _ordered():
        if name not in with_facts:
            continue
        p = table.get((engine, name)) or table[name]
        if not p:
            continue
        model = p["model"]
        model = get_model(model) if isinstance(model, str) else ModelConfig(**model)
        out.append(Probe(name, p["description"], dict(p["server"]), model))
    return tuple(out)


def facts_markdown() -> str:
    """The facts as a table (docs/engines.md): one row per assumption, one column per range of equal facts."""
    from spec.model.engine_profiles import RELEASES

    out = ["| assumption | prover name | " + " | ".join(RELEASES) + " |",
           "|---|---|" + "---|" * len(RELEASES)]
    for name in _ordered():
        cells = []
        for r in RELEASES:
            f = facts_for("sglang", r)[name]
            cells.append(f"enforced ({f.stage})" if f.is_enforced else "**not**")
        out.append(f"| `{name}` | {prover_name(name) or '-'} | " + " | ".join(cells) + " |")
    return "\n".join(out)
