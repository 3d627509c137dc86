"""The backend policy under test: which guard, which precompute head counts, whether stale CP metadata is cleared."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from gpu_impl.plugin import engine_phrase

from .errors import UsageError

METADATA_HEADS = ("tp", "attn_tp")
#: the build a policy names when no release profile sets one (refmodel.fa3_builds.UPSTREAM)
UPSTREAM_BUILD = "upstream-0251105a"


@dataclass(frozen=True)
class Policy:
    """A backend policy: guard spec and callable, metadata head counts, runner hygiene (the modelled backend's
    PR #30439)."""

    guard_spec: str
    guard: Callable[[Any], Any]
    metadata_heads: str = "tp"
    clear_stale_cp_metadata: bool = True
    cp_decode_sharded_kv: bool = False
    #: the ``max_seqlen_k`` of a CUDA-graph replay's precompute (``gpu_impl.backend.GRAPH_REPLAY_SEQLEN_K``); set
    #: by a release profile (``spec.model.engine_profiles``), not by a command-line option
    graph_replay_seqlen_k: str = "max_seq_len"
    #: the FA3 build (refmodel.fa3_builds) whose rules the model's precompute and call are scheduled under; set by
    #: a release profile (the build its kernel wheel ships, refmodel/fa3_builds.json), else upstream's
    fa3_build: str = "upstream-0251105a"

    def to_dict(self) -> dict:
        d = {"guard": self.guard_spec, "metadata_heads": self.metadata_heads,
             "clear_stale_cp_metadata": self.clear_stale_cp_metadata}
        if self.cp_decode_sharded_kv:
            d["cp_decode_kv"] = "sharded"
        if self.graph_replay_seqlen_k != "max_seq_len":
            d["graph_replay_seqlen_k"] = self.graph_replay_seqlen_k
        if self.fa3_build != UPSTREAM_BUILD:
            d["fa3_build"] = self.fa3_build
        return d

    @property
    def label(self) -> str:
        stale = "" if self.clear_stale_cp_metadata else ", stale CP metadata kept"
        build = "" if self.fa3_build == UPSTREAM_BUILD else f", FA3 build {self.fa3_build}"
        return f"guard={self.guard_spec}, metadata_heads={self.metadata_heads}{stale}{build}"


def load_policy(guard: str = "fixed", metadata_heads: str = "tp", keep_stale_cp_metadata: bool = False,
                cp_decode_sharded_kv: bool = False, graph_replay_seqlen_k: str = "max_seq_len",
                fa3_build: str = "upstream-0251105a") -> Policy:
    """Resolve a guard spec ("fixed", "pre-fix", "none", module:function, file.py:function) into a Policy."""
    from gpu_impl.guards import GuardSpecError, load_guard

    if metadata_heads not in METADATA_HEADS:
        raise UsageError(f"--metadata-heads: must be one of {', '.join(METADATA_HEADS)}, got {metadata_heads!r}")
    try:
        fn = load_guard(guard)
    except GuardSpecError as exc:
        raise UsageError(f"--guard: {exc}") from None
    from refmodel.fa3_builds import check_build_name

    try:
        fa3_build = check_build_name(fa3_build)
    except ValueError as exc:
        raise UsageError(f"fa3_{exc}") from None
    return Policy(guard_spec=guard, guard=fn, metadata_heads=metadata_heads,
                  clear_stale_cp_metadata=not keep_stale_cp_metadata, cp_decode_sharded_kv=cp_decode_sharded_kv,
                  graph_replay_seqlen_k=graph_replay_seqlen_k, fa3_build=fa3_build)


def add_guard_timeout_argument(parser) -> None:
    """--guard-timeout-s: the deadline of one guard call (spec.model.guard_isolation.GUARD_TIMEOUT_S)."""
    parser.add_argument("--guard-timeout-s", type=float, default=None, metavar="S",
                        help="deadline of one call of your guard in seconds (default 10); a guard past it is "
                             "reported as GUARD_TIMEOUT")


def add_policy_arguments(parser) -> None:
    """The policy options shared by prove, fuzz and gate."""
    modelled = engine_phrase("modelled")
    add_guard_timeout_argument(parser)
    parser.add_argument("--guard", default="fixed", metavar="SPEC",
                        help="guard deciding whether the backend skips the metadata precompute: 'fixed' "
                             f"({modelled} PR #30439, default), 'pre-fix' (DP attention only), 'none', or your own "
                             "as package.module:function or path/to/file.py:function. "
                             "Example: --guard examples/guards/prefix_guard.py:should_disable")
    parser.add_argument("--metadata-heads", default="tp", choices=METADATA_HEADS,
                        help=f"head counts the precompute uses: 'tp' = H//tp_size as {modelled} does (default), "
                             "'attn_tp' = H//attn_tp_size, the root-cause fix")
    parser.add_argument("--keep-stale-cp-metadata", action="store_true",
                        help="model the runner before the fix: a batch keeps CP metadata left by an earlier step")
    parser.add_argument("--cp-decode-sharded-kv", action="store_true",
                        help="the backend decodes over CP-sharded KV (a fork's path: metadata from global lengths, "
                             "the call over each rank's local KV); its theorem then counts as a safety theorem")
