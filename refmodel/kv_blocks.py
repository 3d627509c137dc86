"""FA3's KV block ranges in plain ints: the key reach of a window, an m-block's KV blocks, one split's blocks.

``split_block_range`` and ``kv_block_bounds`` restate ``hopper/block.h`` (``BlockMN::get_n_block_min_max``);
``resolve_window`` restates ``mha_fwd``'s window resolution (``hopper/flash_api.cpp``). Every value is a C++ int
(refmodel.cint). No torch: the metadata invariants (spec.invariants) read these without loading it; refmodel.splitkv
and refmodel.attention re-export them.
"""

from __future__ import annotations

from typing import Sequence

from .cint import c_ceil_div, c_div

__all__ = ["resolve_window", "split_block_range", "kv_block_bounds"]


def resolve_window(causal: bool, window_size: Sequence[int]) -> tuple[int | None, int | None]:
    """Resolve ``(causal, window_size)`` into (left, right) key reach, ``None`` meaning unbounded, as mha_fwd does.

    Follows ``hopper/flash_api.cpp`` (``mha_fwd``): any negative window side is unbounded, and ``causal``
    forces the right side to 0 while keeping a given left window (causal + left window is FA3's "local").
    """
    if len(window_size) != 2:
        raise ValueError(f"window_size: must be a pair (left, right), got {window_size!r}")
    left, right = (int(w) for w in window_size)
    reach_left = left if left >= 0 else None
    reach_right = 0 if causal else (right if right >= 0 else None)
    return reach_left, reach_right


def split_block_range(n_block_min: int, n_block_max: int, num_splits: int, split_idx: int) -> tuple[int, int]:
    """KV block range ``[lo, hi)`` that split ``split_idx`` of ``num_splits`` covers, as ``hopper/block.h`` computes it.

    ``P = ceil((n_max - n_min) / S)`` (0 when the range is empty); split ``s`` covers
    ``[n_min + s*P, min(n_min + (s+1)*P, n_max))``, which may be empty (``hi <= lo``).
    """
    if num_splits < 1:
        raise ValueError(f"num_splits: must be >= 1, got {num_splits}")
    if not 0 <= split_idx < num_splits:
        raise ValueError(f"split_idx: must lie in [0, {num_splits}), got {split_idx}")
    per_split = 0 if n_block_max <= n_block_min else c_ceil_div(n_block_max - n_block_min, num_splits)
    lo = n_block_min + split_idx * per_split
    return lo, min(lo + per_split, n_block_max)


def kv_block_bounds(
    m_block: int,
    seqlen_q: int,
    seqlen_k: int,
    block_m: int,
    block_n: int,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    qhead_per_khead: int = 1,
    attention_chunk: int = 0,
) -> tuple[int, int]:
    """KV block range ``[n_min, n_max)`` a query m-block must visit before splitting, as in ``hopper/block.h``.

    ``n_max = ceil(Lk / kBN)``, clipped under causal/local by the right edge of the m-block's last row;
    ``n_min = 0``, raised under a left window by the left edge of its first row. With PackGQA
    (``qhead_per_khead > 1``) an m-block indexes packed rows ``row * qhpk + head_in_group``, so its
    sequence-row span is divided by ``qhpk``. The m-block's last row is not clipped to ``Lq`` (FA3 doesn't).
    ``attention_chunk > 0`` (a local kernel) also clips both ends to the chunk of the aligned key: the right edge
    ``n_idx`` to ``round_up(n_idx, chunk)``, the left edge to ``round_down(n_idx, chunk)`` (floor division, as
    ``flash::round_up``/``round_down`` in ``hopper/utils.h``).
    """
    if block_m < 1 or block_n < 1 or qhead_per_khead < 1:
        raise ValueError(
            f"block_m/block_n/qhead_per_khead: must be >= 1, got {block_m}, {block_n}, {qhead_per_khead}")
    if attention_chunk < 0:
        raise ValueError(f"attention_chunk: must be >= 0 (0 disables), got {attention_chunk}")
    reach_left, reach_right = resolve_window(causal, window_size)
    chunk = int(attention_chunk)
    n_block_max = c_ceil_div(seqlen_k, block_n)
    if reach_right is not None or chunk:
        row_end = (m_block + 1) * block_m
        if qhead_per_khead > 1:
            row_end = c_div(row_end - 1, qhead_per_khead) + 1
        n_idx = row_end + seqlen_k - seqlen_q
        right = n_idx + reach_right if reach_right is not None else None
        if chunk:
            chunk_end = ((n_idx - 1) // chunk) * chunk + chunk        # flash::round_up (floor division)
            right = chunk_end if right is None else min(right, chunk_end)
        n_block_max = min(n_block_max, c_ceil_div(right, block_n))
    n_block_min = 0
    if reach_left is not None or chunk:
        row_start = m_block * block_m
        if qhead_per_khead > 1:
            row_start = c_div(row_start, qhead_per_khead)
        n_idx = row_start + seqlen_k - seqlen_q
        left = n_idx - reach_left if reach_left is not None else None
        if chunk:
            chunk_start = (n_idx // chunk) * chunk                     # flash::round_down (floor division)
            left = chunk_start if left is None else max(left, chunk_start)
        n_block_min = max(0, c_div(left, block_n))
    return n_block_min, n_block_max
