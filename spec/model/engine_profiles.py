"""Per-release model profiles: what each sglang release's FA3 backend does, as data the model can play.

Invariant: a release's profile names exactly the precompute head source (``tp``: ``H // tp_size``;
``attn_tp``: ``H // attn_tp_size``) and the guard (one of ``spec.model.guards.BUILTIN_GUARDS``) that the release's
``python/sglang/srt/layers/attention/flashattention_backend.py`` uses (table in docs/facts-engines.md section 1, data in
``spec/model/engine_profiles.json``); another engine's profiles live in its folder and are reached through its
plugin (``gpu_impl.plugin.engine_profile_for``: ``ENGINE==V`` -> the profile). ``prove --engine-profile
sglang==V`` proves that release's behaviour by running
the theorems under :meth:`EngineProfile.policy`; ``fa3verify conform`` checks the profile against the real code.

A profile also names the ``max_seqlen_k`` a CUDA-graph replay's precompute passes (``graph_replay_seqlen_k``:
0.5.16+ pass ``max_context_len``, having no CPU lengths), which the model's runs use and the theorems do not.
Simplification: a profile captures only these choices. Everything else the release does (argument
plumbing, the CUDA-graph buffers, the call) is taken to be what the model does; conformance is what checks it.
Releases before 0.5.11 never precompute scheduler metadata (nothing to prove); ``.postN`` releases are
byte-identical to their base release in this backend and share its profile.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

__all__ = ["EngineProfile", "ProfileError", "NoPrecompute", "RELEASES", "profile_for", "release_key",
           "releases_between", "GUARD_OF_KIND"]

_DATA = Path(__file__).with_name("engine_profiles.json")
_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?$")

#: profile guard kind -> the built-in guard of spec.model.guards that models it
GUARD_OF_KIND = {"none": "none", "dp-attention": "pre-fix", "prefill-cp-or-dp-attention": "fixed"}


class ProfileError(ValueError):
    """A release with no profile (malformed or unknown); the message names the allowed range."""


class NoPrecompute(ProfileError):
    """A release older than the first that precomputes FA3 scheduler metadata: nothing to prove or compare."""


@dataclass(frozen=True)
class EngineProfile:
    """One release's backend behaviour: precompute heads ("tp" | "attn_tp") and guard kind, with their sources."""

    release: str
    precompute_heads: str
    guard: str
    heads_source: str = ""
    guard_source: str = ""
    #: the ``max_seqlen_k`` a CUDA-graph replay's precompute passes: "max_seq_len" (the replayed rows' longest,
    #: from the runner's CPU lengths) or "context_length" (the backend's ``max_context_len`` bound)
    graph_replay_seqlen_k: str = "max_seq_len"

    @property
    def fa3_build(self) -> str:
        """The FA3 build the release ships (refmodel/fa3_builds.json: the build read from its kernel wheel), which
        the model's precompute and calls are scheduled under when it plays this release."""
        from refmodel.fa3_builds import build_for_engine

        return build_for_engine("sglang", self.release)

    @property
    def guard_spec(self) -> str:
        """The built-in guard (spec.model.guards.BUILTIN_GUARDS) that models this release's guard."""
        return GUARD_OF_KIND[self.guard]

    def policy(self) -> dict:
        """The model policy (case-file ``policy`` object) that plays this release."""
        policy = {"guard": self.guard_spec, "metadata_heads": self.precompute_heads, "clear_stale_cp_metadata": True}
        if self.graph_replay_seqlen_k != "max_seq_len":
            policy["graph_replay_seqlen_k"] = self.graph_replay_seqlen_k
        policy["fa3_build"] = self.fa3_build
        return policy

    def describe(self) -> str:
        return (f"sglang {self.release}: precompute heads {self.heads_source} ({self.precompute_heads}); "
                f"guard {self.guard_source} (model guard '{self.guard_spec}')")


def release_key(release: str) -> tuple:
    """A sortable key of a release number; ProfileError when it is not one."""
    m = _RELEASE.match(release or "")
    if not m:
        raise ProfileError(f"{release!r} is not a release number (want e.g. 0.5.23)")
    return tuple(int(g or 0) for g in m.groups())


@functools.lru_cache(maxsize=1)
def _load() -> dict:
    data = json.loads(_DATA.read_text(encoding="utf-8"))
    return {r["release"]: EngineProfile(r["release"], r["precompute_heads"], r["guard"], r.get("heads_source", ""),
                                        r.get("guard_source", ""), r.get("graph_replay_seqlen_k", "max_seq_len"))
            for r in data["releases"]}


def _first() -> str:
    return json.loads(_DATA.read_text(encoding="utf-8"))["first_precompute_release"]


#: Every release with a profile, oldest first.
RELEASES = tuple(sorted(_load(), key=release_key))


def profile_for(release: str) -> EngineProfile:
    """The profile of ``release`` (``.postN`` -> its base); NoPrecompute before 0.5.11, ProfileError if unknown."""
    key = release_key(release)
    base = ".".join(str(x) for x in key[:3])
    profiles = _load()
    if base in profiles:
        return profiles[base]
    allowed = f"{RELEASES[0]} .. {RELEASES[-1]}"
    if key[:3] < release_key(_first())[:3]:
        raise NoPrecompute(f"sglang {release} has no FA3 scheduler-metadata precompute (it first appears in "
                           f"{_first()}): nothing to prove or gate; releases with a profile: {allowed}")
    raise ProfileError(f"no profile for sglang {release}; releases with a profile: {allowed}")


def releases_between(first: Optional[str] = None, last: Optional[str] = None) -> list:
    """The profiled releases from ``first`` to ``last`` inclusive (default: all)."""
    lo = release_key(first) if first else release_key(RELEASES[0])
    hi = release_key(last) if last else release_key(RELEASES[-1])
    if lo > hi:
        raise ProfileError(f"release range {first}..{last} is empty (first is after last)")
    return [r for r in RELEASES if lo <= release_key(r) <= hi]


def profiles_markdown() -> str:
    """The profile table for docs/engines.md (generated: the JSON is the one source of truth)."""
    out = ["| release | precompute heads | model `--metadata-heads` | guard | model `--guard` | CUDA-graph replay "
           "`max_seqlen_k` |", "|---|---|---|---|---|---|"]
    for r in RELEASES:
        p = profile_for(r)
        replay = "`max_context_len`" if p.graph_replay_seqlen_k == "context_length" else "max(seq_lens)"
        out.append(f"| {r} | `{p.heads_source}` | `{p.precompute_heads}` | {p.guard_source} | `{p.guard_spec}` | "
                   f"{replay} |")
    return "\n".join(out)


def release_named(text: Optional[str], engine: str = "sglang") -> Optional[str]:
    """The V of a profile name ``ENGINE==V`` for ``engine`` (an engine kind such as "sglang"), or None when ``text``
    is another form (empty, another engine's, anything else); V itself is not checked here (:func:`profile_for` does)."""
    prefix = f"{engine}=="
    return text[len(prefix):] if text and text.startswith(prefix) else None
