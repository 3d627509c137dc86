"""Where each attention rank of a multi-process run sits, and the case file every rank reads.

Invariant: a deployment runs ``attn_dp_size * attn_cp_size`` attention ranks (attention-TP ranks only split
heads) and global rank ``r`` is DP rank ``r // attn_cp_size``, CP rank ``r % attn_cp_size``; every rank builds
the same :class:`gpu_impl.scenario.Scenario` from the same case file.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any, Mapping

from .config import ModelConfig, ServerConfig
from .scenario import Scenario, Step


# ------------------------------------------------------------------------------------------------
# Placement and case files
# ------------------------------------------------------------------------------------------------


def attention_world_size(server: ServerConfig) -> int:
    """Processes a deployment runs attention on: ``attn_dp_size * attn_cp_size`` (dp_attention.py world info)."""
    return server.attn_dp_size * server.attn_cp_size


@dataclass(frozen=True)
class RankPlacement:
    """Where one global rank sits: its DP rank, its CP rank, and the global ranks of its CP group."""

    rank: int
    world: int
    dp_rank: int
    cp_rank: int
    cp_group: tuple[int, ...]

    @property
    def is_cp_leader(self) -> bool:
        """CP rank 0 of its DP group (the one whose replicated records rank 0 reads)."""
        return self.cp_rank == 0


def rank_placement(server: ServerConfig, rank: int) -> RankPlacement:
    """DP-major, CP-minor placement of a global rank (CP groups are contiguous ranks, as sglang's attention
    groups are built in python/sglang/srt/layers/dp_attention.py)."""
    world = attention_world_size(server)
    if not 0 <= rank < world:
        raise ValueError(f"rank: must be in [0, {world}), got {rank}")
    cp = server.attn_cp_size
    dp_rank, cp_rank = divmod(rank, cp)
    return RankPlacement(rank, world, dp_rank, cp_rank, tuple(range(dp_rank * cp, dp_rank * cp + cp)))


def case_to_dict(case: Any) -> dict:
    """Plain-dict form of a case (a ``spec.model.cases.Case``, a mapping, or a JSON file path): the fields this
    worker reads (server, model, policy, batches, kernel, seed, expected)."""
    if isinstance(case, (str, os.PathLike)):
        try:
            from spec.model.cases import Case  # the project's case-file reader, when present
        except ImportError:
            with open(case, encoding="utf-8") as fh:
                return json.load(fh)
        case = Case.load(str(case))
    if isinstance(case, Mapping):
        return dict(case)
    if hasattr(case, "to_dict"):
        return dict(case.to_dict())
    return {name: getattr(case, name) for name in ("server", "model", "policy", "batches", "kernel", "seed",
                                                  "expected") if hasattr(case, name)}


def scenario_from_case(case: Any) -> Scenario:
    """The Scenario a case describes (server, model, policy, batches, seed); ValueError names a bad field."""
    from .guards import load_guard

    data = case_to_dict(case)
    for name in ("server", "model", "batches"):
        if name not in data:
            raise ValueError(f"{name}: missing from the case")
    policy = dict(data.get("policy") or {})
    if policy.get("cp_decode_kv", "replicated") != "replicated":
        raise ValueError(f"policy.cp_decode_kv: only 'replicated' is modelled by the scenario runner, "
                         f"got {policy['cp_decode_kv']!r}")
    for i, b in enumerate(data["batches"]):
        pinned = sorted(set(b) & {"dp_rank", "cp_metadata"})
        if pinned:
            raise ValueError(f"batches[{i}].{pinned[0]}: not modelled by the scenario runner (batches are split "
                             f"over DP ranks round-robin)")
    guard_spec = policy.get("guard", "fixed")
    steps = [Step(mode=b["mode"], seq_lens=list(b["seq_lens"]), extend_lens=b.get("extend_lens"))
             for b in data["batches"]]
    return Scenario(server=ServerConfig.from_dict(data["server"]), model=ModelConfig.from_dict(data["model"]),
                    guard=load_guard(guard_spec), steps=steps, guard_spec=guard_spec,
                    metadata_heads=policy.get("metadata_heads", "tp"),
                    clear_stale_cp_metadata=bool(policy.get("clear_stale_cp_metadata", True)),
                    seed=int(data.get("seed", 0)),
                    graph_replay_seqlen_k=str(policy.get("graph_replay_seqlen_k", "max_seq_len")),
                    fa3_build=str(policy.get("fa3_build", "upstream-0251105a")))


def kernel_spec(case: Any) -> tuple[str, str]:
    """``(name, mode)`` of the kernel adapter a case asks for (default: the emulator, strict)."""
    kernel = case_to_dict(case).get("kernel") or {}
    return kernel.get("name", "emulated"), kernel.get("mode", "strict")


def loopback_interface() -> str:
    """Name of the loopback network interface ("lo" on Linux), so gloo never binds another address."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        names = []
    for name in names:
        if name == "lo" or name.startswith("lo"):
            return name
    return "lo"
