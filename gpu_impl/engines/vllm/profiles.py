"""vLLM's per-release model profile: which heads, KV extents and split counts each side of the FA3 hand-off passes.

Invariant: a :class:`VllmProfile` states, for one vLLM release, exactly what
``vllm/v1/attention/backends/flash_attn.py`` passes to ``get_scheduler_metadata`` (``FlashAttentionMetadataBuilder
._get_scheduler_metadata``) and to ``flash_attn_varlen_func`` (``FlashAttentionImpl.forward``), per CUDA-graph mode
in which the builder precomputes (data: ``gpu_impl/engines/vllm/profiles.json``, block ``model``); ``prove
--engine-profile vllm==V`` plays it (``gpu_impl.engines.vllm.theorems``) and ``conform --engine vllm==V`` checks each claim on
the released code (``gpu_impl.engines.vllm.conformance``). The plugin hands a profile to the harness
(``VllmPlugin.release_profile``, reached through ``gpu_impl.plugin.engine_profile_for``).

Simplification: a profile covers full-attention layers of one window setting (-1, -1) and a bf16/fp16 KV cache
with decode context parallel off; what it says about DCP, sliding windows and fp8 is descriptive text checked by
conformance, not played by the prover.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from spec.model.engine_profiles import ProfileError

__all__ = ["VllmProfile", "VllmProfileError", "VLLM_RELEASES", "vllm_profile_for", "vllm_profile_from_dict", "MODES"]

_DATA = Path(__file__).with_name("profiles.json")
#: vLLM's CUDA-graph modes (``CUDAGraphMode``: NONE, PIECEWISE, FULL; decode batches take FULL when captured).
MODES = ("none", "piecewise", "full")
HEADS = ("layer",)
SEQLEN_K = {"precompute": ("max_seq_len",), "call": ("page_table_width", "max_seq_len")}


class VllmProfileError(ProfileError):
    """A vLLM profile that is absent or malformed (the message names the field and the allowed values)."""


@dataclass(frozen=True)
class VllmProfile:
    """One vLLM release's FA3 hand-off as the prover plays it."""

    release: str
    modes: tuple                  # CUDA-graph modes in which the builder precomputes
    precompute_splits: tuple      # ((mode, num_splits), ...) the precompute passes
    call_splits: tuple            # ((mode, num_splits), ...) the call passes
    heads: tuple = ("layer", "layer")
    seqlen_k: tuple = ("max_seq_len", "page_table_width")
    headdim_v_passed: bool = False
    source: str = ""

    def splits(self, mode: str) -> tuple:
        """(precompute num_splits, call num_splits) in ``mode``."""
        return dict(self.precompute_splits)[mode], dict(self.call_splits)[mode]

    def describe(self) -> str:
        per_mode = ", ".join(f"{m}: {self.splits(m)[0]}/{self.splits(m)[1]}" for m in self.modes)
        return (f"vllm {self.release}: heads {self.heads[0]}/{self.heads[1]}; max_seqlen_k {self.seqlen_k[0]} vs "
                f"the call's {self.seqlen_k[1]}; num_splits precompute/call {per_mode}; headdim_v "
                f"{'passed' if self.headdim_v_passed else 'not passed'}")

    def to_dict(self) -> dict:
        return {"release": self.release, "precompute_modes": list(self.modes),
                "num_splits": {"precompute": dict(self.precompute_splits), "call": dict(self.call_splits)},
                "heads": {"precompute": self.heads[0], "call": self.heads[1]},
                "seqlen_k": {"precompute": self.seqlen_k[0], "call": self.seqlen_k[1]},
                "headdim_v_passed": self.headdim_v_passed}


def _need(cond: bool, field: str, allowed: str, got) -> None:
    if not cond:
        raise VllmProfileError(f"{field}: expected {allowed}, got {got!r}")


def vllm_profile_from_dict(release: str, model: dict, source: str = "") -> VllmProfile:
    """A profile from a ``model`` block (the JSON's, or a variant a test builds); VllmProfileError names the field."""
    _need(isinstance(model, dict), "model", "an object", model)
    modes = model.get("precompute_modes")
    _need(isinstance(modes, list) and modes and all(m in MODES for m in modes), "model.precompute_modes",
          f"a non-empty list of {', '.join(MODES)}", modes)
    splits = model.get("num_splits", {})
    sides = []
    for side in ("precompute", "call"):
        table = splits.get(side) if isinstance(splits, dict) else None
        _need(isinstance(table, dict), f"model.num_splits.{side}", "an object mode -> integer", table)
        for m in modes:
            v = table.get(m)
            _need(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 256,
                  f"model.num_splits.{side}.{m}", "an integer in [0, 256] (0: FA3's heuristic)", v)
        sides.append(tuple((m, table[m]) for m in modes))
    heads = model.get("heads", {"precompute": "layer", "call": "layer"})
    for side in ("precompute", "call"):
        _need(heads.get(side) in HEADS, f"model.heads.{side}", "'layer'", heads.get(side))
    seq = model.get("seqlen_k", {"precompute": "max_seq_len", "call": "page_table_width"})
    for side in ("precompute", "call"):
        _need(seq.get(side) in SEQLEN_K[side], f"model.seqlen_k.{side}", " or ".join(map(repr, SEQLEN_K[side])),
              seq.get(side))
    hv = model.get("headdim_v_passed", False)
    _need(isinstance(hv, bool), "model.headdim_v_passed", "true or false", hv)
    return VllmProfile(release, tuple(modes), sides[0], sides[1], (heads["precompute"], heads["call"]),
                       (seq["precompute"], seq["call"]), hv, source)


@functools.lru_cache(maxsize=1)
def _load() -> dict:
    data = json.loads(_DATA.read_text(encoding="utf-8"))
    return {r["release"]: vllm_profile_from_dict(r["release"], r["model"], data.get("source", ""))
            for r in data["releases"]}


def _releases() -> tuple:
    return tuple(sorted(_load()))


VLLM_RELEASES = _releases()


def vllm_profile_for(release: str) -> VllmProfile:
    """The profile of vLLM ``release``, or of the row it shares (``releases.json`` ``shares_row``: its driven files
    byte-identical to that release's); VllmProfileError naming the profiled releases otherwise."""
    from gpu_impl.engines.vllm.recipes import SHARES_ROW

    profiles = _load()
    release = release if release in profiles else SHARES_ROW.get(release, release)
    if release in profiles:
        return profiles[release]
    raise VllmProfileError(f"no profile for vllm {release}; releases with a profile: {', '.join(VLLM_RELEASES)}")


def raw_release(release: str) -> Optional[dict]:
    """The JSON entry of ``release`` (descriptive fields too: heads_equal, max_num_splits, ...), or None."""
    data = json.loads(_DATA.read_text(encoding="utf-8"))
    return next((r for r in data["releases"] if r["release"] == release), None)
