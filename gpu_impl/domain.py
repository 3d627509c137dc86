"""A system under test's own configuration space, and which of its metadata paths a run reached.

Invariant: the harness draws configurations from the domain the system under test gives
(``SystemUnderTest.domain()``) and never from a branch on the engine's kind; a domain counts every configuration
its system rejects, by the system's own reason, and lists each path its driver cannot reach as not covered
(with why) instead of leaving it out.

A :class:`ConfigDomain` either names a strategy family of the suite (``family``: the model's domain is the
suite's ``scenario`` space, vLLM's is its ``vllm`` family) or draws configurations itself
(:meth:`ConfigDomain.draw_config`, e.g. ``gpu_impl.engines.sglang.domain.ReleaseDomain``: a release's server
arguments, kept only where the release's own checks accept them). Batches are the suite's to choose.

Paths (:data:`PATHS`) are where a backend precomputes FA3 scheduler metadata and a call consumes it: the eager
decode, the CUDA-graph capture, the graph replay, and an idle DP-attention rank (under CUDA graph an idle rank
replays its graph with padding rows only); each is read from the trace entries a run returns
(``{"path": "eager"|"capture"|"replay", "precomputed", "call": {"metadata_passed"}, "idle"}``, docs/engines.md).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

__all__ = ["PATHS", "LAYER_TYPES", "SM_COUNTS", "ConfigDomain", "DomainDraw", "FuzzCase", "reached_paths",
           "reach_report"]

#: SM counts of real GPUs: H100/H200 SXM 132, H100 PCIe 114, A100 108, L40S-class 78
#: (H200: docs/facts-fa3.md section 1).
SM_COUNTS = (132, 114, 108, 78)


@dataclass(frozen=True)
class FuzzCase:
    """One generated scenario before the policy is applied: configuration, model, steps, tensor seed, and the
    engine-owned options (``{options key: object}``, ``gpu_impl.plugin.EnginePlugin.options_key``) that the
    server and model cannot say (empty for a case any engine runs). The strategy families (``fa3verify.strategies``
    and an engine folder's own) draw it."""

    server: Any
    model: Any
    steps: tuple
    numerics: bool
    seed: int
    options: dict = field(default_factory=dict)

#: Where metadata is precomputed and consumed (flashattention_backend.py: ``init_forward_metadata``, the
#: capture-time and replay-time metadata inits), plus an idle DP-attention rank on any of them.
PATHS = ("eager", "capture", "replay", "dp-idle")
#: Layer types a model can have, for the reach report: full attention consumes the precomputed metadata,
#: sliding-window layers never do (``forward_decode`` skips it for them).
LAYER_TYPES = ("layer:full-attention", "layer:sliding-window")


class DomainDraw(NamedTuple):
    """One configuration a domain drew: server, model, the path it was drawn for, and the domain's own key for
    it (given back to :meth:`ConfigDomain.observe` with what the case reached)."""

    server: Any
    model: Any
    target: str
    cell: Any = None


def reached_paths(trace) -> set:
    """The paths (sglang's :data:`PATHS`, vLLM's graph modes) and layer types on which a call consumed metadata
    the backend precomputed, read from a run's trace entries, and every path an entry's ``reached`` list names
    (a driver's own labels of where the call was, with or without metadata: vLLM's paths)."""
    out = set()
    for entry in trace or ():
        out.update(entry.get("reached") or ())  # the paths a driver labels its calls with, metadata or not
        call = entry.get("call") or {}
        if not (entry.get("precomputed") and call.get("metadata_passed")) or not isinstance(entry.get("path"), str):
            continue
        out.add(entry["path"])
        if entry.get("idle"):
            out.add("dp-idle")
        out.add(entry.get("layer") or "layer:full-attention")
    return out


class ConfigDomain:
    """A configuration space: a suite family by name, or one the domain draws itself (subclasses).

    ``not_covered``: path -> why the driver cannot reach it (reported, never silently absent); ``rejected``:
    the system's own reason -> how many drawn configurations it rejected; ``not_drawn``: arguments left at
    their default, with why.
    """

    #: whether the draw depends on what earlier cases reached (:meth:`observe`): such a campaign cannot be split
    #: into shards that together run the unsplit campaign's cases (fa3verify.sharding), so sharding refuses it.
    adapts = False

    def __init__(self, name: str, family: Optional[str] = None, not_covered: Optional[dict] = None,
                 not_drawn: Optional[dict] = None, check=None, reach_keys: tuple = PATHS + LAYER_TYPES):
        self.name, self.family = name, family
        #: for a family domain: ``check(case) -> None | reason`` (the system's own verdict on a drawn case)
        self.check = check
        #: the paths (and layer types) the reach report lists, each with its count
        self.reach_keys = tuple(reach_keys)
        self.not_covered = dict(not_covered or {})
        self.not_drawn = dict(not_drawn or {})
        self.drawn = 0
        self.accepted = 0
        self.rejected: collections.Counter = collections.Counter()

    @property
    def draws_itself(self) -> bool:
        """Whether the domain draws its configurations itself."""
        return self.family is None

    @property
    def reports(self) -> bool:
        """Whether a run reports this domain (draws, rejections, reach): it draws itself or checks its draws."""
        return self.family is None or self.check is not None

    def reset_counts(self) -> None:
        """Start counting a new run (what the system decided about each configuration is kept)."""
        self.drawn, self.accepted = 0, 0
        self.rejected = collections.Counter()

    def draw_config(self, rng) -> Optional[DomainDraw]:
        """A configuration the system accepts, or None (every try rejected); only for a domain without
        ``family``."""
        raise NotImplementedError(f"domain {self.name}: draws from the suite's family {self.family!r}")

    def observe(self, cell, reached) -> None:
        """A case drawn for ``cell`` ran and reached ``reached`` (None: it did not run); the default ignores it."""

    def reject(self, reason: str) -> None:
        self.drawn += 1
        self.rejected[reason] += 1

    def accept(self) -> None:
        self.drawn += 1
        self.accepted += 1

    def report(self, reach: dict, cases: int) -> dict:
        """The domain's part of a run summary: draws, rejections by reason, cases per path, what is not covered."""
        return {"name": self.name, "family": self.family, "drawn": self.drawn, "accepted": self.accepted,
                "rejected": dict(self.rejected.most_common()), "cases": cases,
                **reach_report(reach, self.not_covered, self.reach_keys), "not_drawn": self.not_drawn}


def reach_report(reach: dict, not_covered: dict, keys: tuple = PATHS + LAYER_TYPES) -> dict:
    """``reach`` (every path and layer type, 0 where no case reached it) and ``not_covered`` (path -> why: the
    driver's own reasons, and "reached by no case" for a reachable path no case reached)."""
    counts = {k: int(reach.get(k, 0)) for k in keys}
    missing = {k: not_covered.get(k, "reached by no case of this run") for k in keys if counts[k] == 0}
    missing.update({k: v for k, v in not_covered.items() if k not in missing and counts.get(k, 0) == 0})
    return {"reach": counts, "not_covered": missing}
