"""The eager runner's extend step and CP-v2 metadata lifetime, as the second part of PR #30439 fixes it.

Read in sglang (not copied):

* ``python/sglang/srt/model_executor/runner/eager_runner.py`` ``forward_extend``:
  ``cp_v2_active = is_cp_v2_active(forward_batch)``; when active it calls
  ``prepare_cp_forward(forward_batch)`` and shards the inputs.  PR #30439 adds: when not active,
  ``forward_batch.attn_cp_metadata = None`` (the stored upstream copies read here predate or
  postdate that line; its wording is from the PR description and docs/facts-fa3.md section 1).
* ``python/sglang/srt/layers/cp/utils.py`` ``prepare_cp_forward``: builds metadata only
  ``if forward_batch.attn_cp_metadata is None`` -- a stale object is reused silently.
* ``python/sglang/srt/model_executor/forward_batch_info.py``: ``ForwardMode.
  is_context_parallel_extend()`` is true for EXTEND and MIXED (DRAFT_EXTEND_V2 only on request);
  the FA3 backend enters its CP path when that holds, ``attn_cp_metadata is not None`` and
  ``attn_cp_size > 1``.
* How a stale object reaches a later batch: ``ForwardBatch.attn_cp_metadata`` is a plain field
  that nothing but ``ScheduleBatch.prepare_for_decode`` (``python/sglang/srt/managers/
  schedule_batch.py``, "CP is only for prefill, not decode") and the prefill CUDA-graph replay
  (``python/sglang/srt/layers/cp/bcg.py``: "Replay batches may reuse a ForwardBatch object whose
  metadata was built for a different request layout. Always rebuild before sharding.") resets.
  The exact eager-path carrier was not pinned down in the stored upstream copies; this model makes
  the carrier explicit: with ``reuse_forward_batch=True`` the runner's forward-batch object is
  reused across steps, so its ``attn_cp_metadata`` survives into the next step unless the step is
  a DECODE (cleared as ``prepare_for_decode`` does), a new extend that CP-v2 runs (sglang builds a
  fresh ForwardBatch for it), or the runner clears it.

Modelling choice: an earlier version let two consecutive CP-v2 extends share the first one's metadata;
that made the fixed runner fail on plain chunked prefill, which the PR's validation (96 rounds on
4xH200) did not see, so a CP-v2-active batch starts without inherited metadata. Batches formed from
the running batch (MIXED, short non-CP extends) inherit, which is the path the fix closes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Optional

from gpu_impl.config import ServerConfig
from gpu_impl.zigzag import ZigzagLayout, cp_v2_active, zigzag_layout

_batch_ids = itertools.count()


class ForwardMode(Enum):
    """sglang's ``ForwardMode`` values relevant here (forward_batch_info.py)."""

    EXTEND = "extend"
    DECODE = "decode"
    MIXED = "mixed"
    IDLE = "idle"
    TARGET_VERIFY = "target_verify"
    DRAFT_EXTEND = "draft_extend"
    DRAFT_EXTEND_V2 = "draft_extend_v2"
    SPLIT_PREFILL = "split_prefill"

    def is_context_parallel_extend(self, include_draft_extend_v2: bool = False) -> bool:
        """EXTEND or MIXED (and DRAFT_EXTEND_V2 on request), as ``is_context_parallel_extend`` in forward_batch_info.py."""
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED) or (
            include_draft_extend_v2 and self is ForwardMode.DRAFT_EXTEND_V2
        )

    def has_extend_lens(self) -> bool:
        """Whether batches of this mode carry per-sequence extend lengths."""
        return self not in (ForwardMode.DECODE, ForwardMode.IDLE)


@dataclass(frozen=True)
class CPMetadata:
    """A CP-v2 zigzag metadata object (``ZigzagContextParallelMetadata``, cp/zigzag.py) for all ranks.

    ``built_for`` is the id of the batch it was built from, so a later batch can tell it is stale.
    """

    built_for: int
    strategy: str
    layout: ZigzagLayout

    @property
    def cp_size(self) -> int:
        """Number of CP ranks the layout splits over."""
        return self.layout.cp_size


@dataclass
class Batch:
    """One forward batch (``ForwardBatch`` fields of forward_batch_info.py that CP-v2 reads).

    ``extend_lens`` is required for extend-like modes (MIXED rows from running requests extend by
    1) and ignored for DECODE/IDLE.  ``num_tokens`` is ``len(input_ids)`` when padded, default the
    sum of extend lengths.
    """

    mode: ForwardMode
    seq_lens: tuple[int, ...]
    extend_lens: Optional[tuple[int, ...]] = None
    batch_id: int = field(default_factory=lambda: next(_batch_ids))
    attn_cp_metadata: Optional[CPMetadata] = None
    num_tokens: Optional[int] = None

    def __post_init__(self):
        if not isinstance(self.mode, ForwardMode):
            raise ValueError(f"Batch.mode must be a ForwardMode, got {self.mode!r}")
        self.seq_lens = tuple(int(s) for s in self.seq_lens)
        if any(s < 1 for s in self.seq_lens):
            raise ValueError(f"Batch.seq_lens must all be >= 1, got {self.seq_lens}")
        if self.mode.has_extend_lens():
            if self.extend_lens is None:
                raise ValueError(f"Batch.extend_lens is required for mode {self.mode.name}")
            self.extend_lens = tuple(int(e) for e in self.extend_lens)
            if len(self.extend_lens) != len(self.seq_lens):
                raise ValueError(
                    f"Batch.extend_lens has {len(self.extend_lens)} entries, "
                    f"seq_lens {len(self.seq_lens)}"
                )
            bad = [(e, s) for e, s in zip(self.extend_lens, self.seq_lens) if not 1 <= e <= s]
            if bad:
                raise ValueError(f"Batch.extend_lens must satisfy 1 <= extend <= seq, got {bad}")
        else:
            self.extend_lens = None

    @property
    def prefix_lens(self) -> Optional[tuple[int, ...]]:
        """Cached prefix of each sequence (``seq_len - extend_len``); None for DECODE/IDLE."""
        if self.extend_lens is None:
            return None
        return tuple(s - e for s, e in zip(self.seq_lens, self.extend_lens))

    @property
    def token_count(self) -> int:
        """``len(input_ids)``: ``num_tokens`` if set, else extend tokens (one per sequence in decode)."""
        if self.num_tokens is not None:
            return self.num_tokens
        return sum(self.extend_lens) if self.extend_lens is not None else len(self.seq_lens)


def active_cp_strategy(cfg: ServerConfig) -> Optional[str]:
    """The CP strategy sglang binds: ``cp_strategy`` when prefill CP is on, else None (``init_cp_strategy``, cp/base.py)."""
    return cfg.cp_strategy if cfg.enable_prefill_cp else None


def batch_is_cp_v2_active(batch: Batch, cfg: ServerConfig, allow_mixed: bool = False) -> bool:
    """Whether CP-v2 runs ``batch`` under ``cfg`` (``is_cp_v2_active``, cp/utils.py; MIXED only with ``allow_mixed``)."""
    return cp_v2_active(
        batch.mode,
        active_cp_strategy(cfg),
        cfg.attn_cp_size,
        batch.extend_lens,
        num_tokens=batch.token_count,
        allow_mixed=allow_mixed,
    )


def build_cp_metadata(batch: Batch, cfg: ServerConfig) -> CPMetadata:
    """Build fresh zigzag metadata for ``batch`` (``ZigzagCPStrategy.build_metadata``, cp/zigzag.py)."""
    if batch.extend_lens is None:
        raise ValueError(f"cannot build CP metadata for a {batch.mode.name} batch")
    strategy = active_cp_strategy(cfg)
    if strategy is None:
        raise ValueError("cannot build CP metadata: no CP strategy (enable_prefill_cp/cp_strategy)")
    layout = zigzag_layout(batch.seq_lens, batch.extend_lens, cfg.attn_cp_size,
                           num_tokens=sum(batch.extend_lens))
    return CPMetadata(built_for=batch.batch_id, strategy=strategy, layout=layout)


def prepare_cp_forward(batch: Batch, cfg: ServerConfig, allow_mixed: bool = False) -> bool:
    """Attach CP metadata only if none is attached (``prepare_cp_forward``, cp/utils.py); True if it built one.

    A stale object already on the batch is kept silently, as upstream does.
    """
    if not batch_is_cp_v2_active(batch, cfg, allow_mixed=allow_mixed):
        raise AssertionError("prepare_cp_forward called on a batch where CP-v2 is not active")
    if batch.attn_cp_metadata is None:
        batch.attn_cp_metadata = build_cp_metadata(batch, cfg)
        return True
    return False


def backend_takes_cp_path(batch: Batch, cfg: ServerConfig) -> bool:
    """Whether the FA3 backend's extend enters CP mode: CP-extend mode, metadata present, ``attn_cp_size > 1``
    (flashattention_backend.py ``forward_extend``, docs/facts-fa3.md section 1)."""
    return (
        batch.mode.is_context_parallel_extend()
        and batch.attn_cp_metadata is not None
        and cfg.attn_cp_size > 1
    )


@dataclass(frozen=True)
class StepTrace:
    """What one runner step did with CP-v2 metadata."""

    batch_id: int
    mode: ForwardMode
    cp_v2_active: bool
    took_cp_path: bool
    metadata_was_stale: bool
    built_metadata: bool
    metadata_built_for: Optional[int]


class EagerRunner:
    """The eager runner's per-step CP-v2 handling (``forward_extend`` in runner/eager_runner.py).

    ``clear_stale_cp_metadata=True`` is PR #30439's fix (clear when CP-v2 is inactive); False is
    the pre-fix runner.  ``reuse_forward_batch`` makes the field survive between steps (see the
    module docstring); ``mixed_counts_as_cp_v2`` restores the pre-fix gate that let MIXED batches
    run CP-v2.
    """

    def __init__(
        self,
        server_cfg: ServerConfig,
        clear_stale_cp_metadata: bool = True,
        reuse_forward_batch: bool = True,
        mixed_counts_as_cp_v2: bool = False,
    ):
        self.cfg = server_cfg
        self.clear_stale_cp_metadata = clear_stale_cp_metadata
        self.reuse_forward_batch = reuse_forward_batch
        self.mixed_counts_as_cp_v2 = mixed_counts_as_cp_v2
        self._carried: Optional[CPMetadata] = None
        self.traces: list[StepTrace] = []

    def _load(self, batch: Batch) -> None:
        # Scheduler side: prepare_for_decode clears the field. A batch that CP-v2 runs starts from a
        # fresh forward batch (sglang builds one per new extend), so it never inherits. A batch formed
        # from the running one (MIXED, a short non-CP extend) still holds what the previous step left.
        if batch.mode is ForwardMode.DECODE:
            batch.attn_cp_metadata = None
        elif (self.reuse_forward_batch and batch.attn_cp_metadata is None
              and not batch_is_cp_v2_active(batch, self.cfg, allow_mixed=self.mixed_counts_as_cp_v2)):
            batch.attn_cp_metadata = self._carried

    def step(self, batch: Batch) -> StepTrace:
        """Run one forward step's CP-v2 decisions on ``batch`` and record them."""
        self._load(batch)
        active = batch_is_cp_v2_active(batch, self.cfg, allow_mixed=self.mixed_counts_as_cp_v2)
        built = False
        if active:
            built = prepare_cp_forward(batch, self.cfg, allow_mixed=self.mixed_counts_as_cp_v2)
        elif self.clear_stale_cp_metadata:
            batch.attn_cp_metadata = None
        md = batch.attn_cp_metadata
        trace = StepTrace(
            batch_id=batch.batch_id,
            mode=batch.mode,
            cp_v2_active=active,
            took_cp_path=backend_takes_cp_path(batch, self.cfg),
            metadata_was_stale=md is not None and md.built_for != batch.batch_id,
            built_metadata=built,
            metadata_built_for=None if md is None else md.built_for,
        )
        self._carried = md
        self.traces.append(trace)
        return trace

    def run(self, batches: Iterable[Batch]) -> list[StepTrace]:
        """Step through ``batches`` in order and return their traces."""
        return [self.step(b) for b in batches]


def cp_path_matches_activity(traces: Iterable[StepTrace]) -> bool:
    """The fix's property: the backend took the CP path exactly on the CP-v2-active steps."""
    return all(t.took_cp_path == t.cp_v2_active for t in traces)
