"""Zigzag prefill context parallel (CP-v2) layout: which rank computes which query tokens.

Model of ``ZigzagCPStrategy`` in ``python/sglang/srt/layers/cp/zigzag.py`` and the CP-v2 gates in
``python/sglang/srt/layers/cp/utils.py`` (read, not copied).  For ``cp`` ranks each sequence's
extend tokens are cut into ``2*cp`` contiguous blocks; rank ``r`` owns block ``r`` (its "prev"
half) and block ``2*cp-1-r`` (its "next" half), pairing an early block with a late one so causal
work is balanced.  K/V are all-gathered, so each half attends the full causal prefix: FA3 sees
``cache_seqlens = kv_len_prev`` / ``kv_len_next`` with the half's tokens as the last queries.
Outputs are all-gathered and put back in global token order; there is no cross-rank LSE merge.

A rank's local token order is sglang's ``zigzag_index`` order: the prev block of every sequence
(in batch order), then the next block of every sequence.

Padding, two mechanisms (both read in upstream):

* ``build_metadata(num_tokens, seqs_len, extend_seqs_len)``: when ``num_tokens`` exceeds
  ``sum(extend_seqs_len)`` (a padded ``input_ids``), the surplus is added to the *last*
  sequence's extend length and, when lengths are given per sequence, its seq length too
  (:func:`pad_last_sequence`).  Newer ``prepare_cp_forward`` passes
  ``num_tokens = sum(extend_seq_lens_cpu)``, so this surplus is 0 there.
* ``pad_logical_token_to_physical`` (``python/sglang/srt/layers/cp/padding.py``): each rank's
  local tensors are padded with zero rows at the end up to ``ceil(max_rank_tokens / align) *
  align``, ``align = 2*cp`` for zigzag (``get_cp_padding_align_size``), so every rank sends equal
  rows to the all-gather (:func:`physical_rank_len`); the padding rows are dropped on gather.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

ZIGZAG = "zigzag"


def _check_cp(cp_size: int) -> None:
    if not isinstance(cp_size, int) or isinstance(cp_size, bool) or cp_size < 1:
        raise ValueError(f"cp_size must be an integer >= 1, got {cp_size!r}")


def _check_len(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def _check_rank(rank: int, cp_size: int) -> None:
    if not isinstance(rank, int) or not 0 <= rank < cp_size:
        raise ValueError(f"rank must be in [0, {cp_size}), got {rank!r}")


def zigzag_blocks(length: int, cp_size: int) -> list[int]:
    """Block sizes of one sequence cut into ``2*cp`` blocks (ZigzagCPStrategy.build_metadata, zigzag.py)."""
    _check_len("length", length)
    _check_cp(cp_size)
    segments = 2 * cp_size
    base, rem = divmod(length, segments)
    return [base + 1 if i < rem else base for i in range(segments)]


def block_bounds(length: int, cp_size: int) -> list[tuple[int, int]]:
    """Half-open token ranges ``[start, end)`` of the ``2*cp`` zigzag blocks of one sequence."""
    bounds, start = [], 0
    for size in zigzag_blocks(length, cp_size):
        bounds.append((start, start + size))
        start += size
    return bounds


def rank_blocks(rank: int, cp_size: int) -> tuple[int, int]:
    """The (prev, next) block indices rank ``r`` owns: ``(r, 2*cp-1-r)`` (zigzag.py module docstring)."""
    _check_cp(cp_size)
    _check_rank(rank, cp_size)
    return rank, 2 * cp_size - 1 - rank


def kv_lens(seq_len: int, extend_len: int, cp_size: int, rank: int) -> tuple[int, int]:
    """``(kv_len_prev, kv_len_next)`` FA3 sees on ``rank`` for one sequence (build_metadata, zigzag.py).

    ``prefix = seq_len - extend_len`` (clamped at 0 as upstream does); the prev half sees the
    prefix plus blocks ``0..r``, the next half the prefix plus blocks ``0..2cp-1-r``.
    """
    _check_len("seq_len", seq_len)
    _check_len("extend_len", extend_len)
    _check_cp(cp_size)
    _check_rank(rank, cp_size)
    blocks = zigzag_blocks(extend_len, cp_size)
    prefix = max(seq_len - extend_len, 0)
    return prefix + sum(blocks[: rank + 1]), prefix + sum(blocks[: 2 * cp_size - rank])


def rank_query_lens(extend_len: int, cp_size: int, rank: int) -> tuple[int, int]:
    """``(q_prev, q_next)``: query tokens of one sequence in rank ``r``'s two halves (zigzag.py)."""
    blocks = zigzag_blocks(extend_len, cp_size)
    prev, nxt = rank_blocks(rank, cp_size)
    return blocks[prev], blocks[nxt]


def rank_token_indices(extend_lens: Sequence[int], cp_size: int, rank: int) -> list[int]:
    """Global extend-token indices rank ``r`` holds, in local order (sglang's ``zigzag_index``).

    Indices count over the batch's concatenated extend tokens; prev blocks of all sequences come
    first, then next blocks of all sequences.
    """
    prev, nxt = rank_blocks(rank, cp_size)
    starts, offset = [], 0
    for length in extend_lens:
        _check_len("extend length", length)
        starts.append(offset)
        offset += length
    out: list[int] = []
    for which in (prev, nxt):
        for start, length in zip(starts, extend_lens):
            lo, hi = block_bounds(length, cp_size)[which]
            out.extend(range(start + lo, start + hi))
    return out


def rank_token_counts(extend_lens: Sequence[int], cp_size: int) -> list[int]:
    """Logical (unpadded) token count of every rank (``per_rank_actual_token`` before padding)."""
    counts = []
    for rank in range(cp_size):
        counts.append(sum(sum(rank_query_lens(length, cp_size, rank)) for length in extend_lens))
    return counts


def cp_padding_align(cp_size: int) -> int:
    """Row alignment of CP-local tensors for zigzag: ``2*cp`` (get_cp_padding_align_size, padding.py)."""
    _check_cp(cp_size)
    return 2 * cp_size


def physical_rank_len(per_rank_counts: Sequence[int], cp_size: int) -> int:
    """Padded rows every rank sends: max count rounded up to ``2*cp`` (pad_logical_token_to_physical)."""
    align = cp_padding_align(cp_size)
    longest = max(per_rank_counts, default=0)
    return -(-longest // align) * align


def pad_last_sequence(
    extend_lens: Sequence[int], seq_lens: Optional[Sequence[int]], num_tokens: int
) -> tuple[list[int], Optional[list[int]]]:
    """Add ``num_tokens - sum(extend_lens)`` padding tokens to the last sequence (build_metadata, zigzag.py).

    Seq lengths are padded too when given one per sequence; a surplus <= 0 changes nothing.
    """
    extend = [int(x) for x in extend_lens]
    seqs = None if seq_lens is None else [int(x) for x in seq_lens]
    pad = int(num_tokens) - sum(extend)
    if pad > 0 and extend:
        extend[-1] += pad
        if seqs is not None and len(seqs) == len(extend):
            seqs[-1] += pad
    return extend, seqs


def _mode_name(forward_mode: Any) -> str:
    return str(getattr(forward_mode, "name", forward_mode)).upper()


def cp_v2_active(
    forward_mode: Any,
    strategy: Optional[str],
    cp_size: int,
    extend_lens: Optional[Sequence[int]],
    num_tokens: Optional[int] = None,
    allow_mixed: bool = False,
) -> bool:
    """Whether zigzag CP-v2 runs this batch (``is_cp_v2_active`` / ``ZigzagCPStrategy.can_apply``, cp/utils.py).

    Active iff the mode is EXTEND (MIXED only with ``allow_mixed``, the behaviour before sglang PR
    #30439 kept zigzag out of MIXED), a strategy exists, ``cp_size > 1``, the batch has at least
    ``2*cp`` tokens (``num_tokens`` = ``len(input_ids)``, default ``sum(extend_lens)``) and every
    extend length is at least ``2*cp``.  Upstream treats missing extend lengths as "no per-sequence
    check"; this model needs them for an EXTEND batch and returns False without them.
    """
    mode = _mode_name(forward_mode)
    if mode != "EXTEND" and not (allow_mixed and mode == "MIXED"):
        return False
    if strategy is None or cp_size <= 1 or extend_lens is None:
        return False
    tokens = sum(extend_lens) if num_tokens is None else num_tokens
    if tokens < 2 * cp_size:
        return False
    return all(int(length) >= 2 * cp_size for length in extend_lens)


def shard_for_rank(items: Sequence[Any], extend_lens: Sequence[int], cp_size: int,
                   rank: int) -> list[Any]:
    """Rank ``r``'s local slice of per-token ``items`` (``shard_hidden_states`` order, zigzag.py)."""
    total = sum(extend_lens)
    if len(items) < total:
        raise ValueError(f"{len(items)} items for {total} extend tokens")
    return [items[i] for i in rank_token_indices(extend_lens, cp_size, rank)]


def gather_reorder(per_rank_outputs: Sequence[Any], extend_lens: Sequence[int],
                   cp_size: int) -> Any:
    """Put every rank's local outputs back in global token order (``gather_hidden_states``, zigzag.py).

    ``per_rank_outputs[r]`` is rank r's output in local order, possibly followed by physical
    padding rows (dropped).  Torch tensors (indexed on dim 0) give a tensor; anything else a list.
    """
    if len(per_rank_outputs) != cp_size:
        raise ValueError(f"expected {cp_size} per-rank outputs, got {len(per_rank_outputs)}")
    total = sum(extend_lens)
    placement: list[tuple[int, int]] = [(-1, -1)] * total  # global index -> (rank, local row)
    for rank in range(cp_size):
        indices = rank_token_indices(extend_lens, cp_size, rank)
        if len(per_rank_outputs[rank]) < len(indices):
            raise ValueError(
                f"rank {rank} output has {len(per_rank_outputs[rank])} rows, needs {len(indices)}"
            )
        for local, global_index in enumerate(indices):
            placement[global_index] = (rank, local)
    first = per_rank_outputs[0]
    if hasattr(first, "index_select") and hasattr(first, "new_tensor"):
        import torch

        offsets, start = [], 0
        for out in per_rank_outputs:
            offsets.append(start)
            start += out.shape[0]
        flat = torch.cat(list(per_rank_outputs), dim=0)
        order = torch.tensor([offsets[r] + j for r, j in placement], dtype=torch.long,
                             device=flat.device)
        return flat.index_select(0, order)
    return [per_rank_outputs[r][j] for r, j in placement]


@dataclass(frozen=True)
class ZigzagLayout:
    """The zigzag split of one batch over all ``cp_size`` ranks (what every rank's metadata holds).

    ``extend_lens``/``seq_lens`` are after :func:`pad_last_sequence`.  ``kv_len_prev[r][i]`` and
    ``kv_len_next[r][i]`` are FA3's ``cache_seqlens`` for sequence ``i`` on rank ``r``.
    """

    cp_size: int
    seq_lens: tuple[int, ...]
    extend_lens: tuple[int, ...]
    blocks: tuple[tuple[int, ...], ...]
    kv_len_prev: tuple[tuple[int, ...], ...]
    kv_len_next: tuple[tuple[int, ...], ...]
    q_len_prev: tuple[tuple[int, ...], ...]
    q_len_next: tuple[tuple[int, ...], ...]
    rank_tokens: tuple[int, ...]
    physical_rank_tokens: int

    @property
    def prefix_lens(self) -> tuple[int, ...]:
        """Cached prefix of every sequence (``seq_len - extend_len``, clamped at 0)."""
        return tuple(max(s - e, 0) for s, e in zip(self.seq_lens, self.extend_lens))


def zigzag_layout(seq_lens: Sequence[int], extend_lens: Sequence[int], cp_size: int,
                  num_tokens: Optional[int] = None) -> ZigzagLayout:
    """Build the zigzag layout of a batch for every rank (``ZigzagCPStrategy.build_metadata`` +
    ``pad_logical_token_to_physical``); ``num_tokens`` defaults to ``sum(extend_lens)``."""
    _check_cp(cp_size)
    if len(seq_lens) != len(extend_lens):
        raise ValueError(
            f"seq_lens has {len(seq_lens)} entries, extend_lens {len(extend_lens)}"
        )
    for s, e in zip(seq_lens, extend_lens):
        _check_len("extend length", e)
        _check_len("seq length", s)
        if e > s:
            raise ValueError(f"extend length {e} exceeds seq length {s}")
    tokens = sum(extend_lens) if num_tokens is None else num_tokens
    extend, seqs = pad_last_sequence(extend_lens, seq_lens, tokens)
    assert seqs is not None
    kv_prev, kv_next, q_prev, q_next = [], [], [], []
    for rank in range(cp_size):
        kv = [kv_lens(s, e, cp_size, rank) for s, e in zip(seqs, extend)]
        q = [rank_query_lens(e, cp_size, rank) for e in extend]
        kv_prev.append(tuple(a for a, _ in kv))
        kv_next.append(tuple(b for _, b in kv))
        q_prev.append(tuple(a for a, _ in q))
        q_next.append(tuple(b for _, b in q))
    counts = rank_token_counts(extend, cp_size)
    return ZigzagLayout(
        cp_size=cp_size,
        seq_lens=tuple(seqs),
        extend_lens=tuple(extend),
        blocks=tuple(tuple(zigzag_blocks(e, cp_size)) for e in extend),
        kv_len_prev=tuple(kv_prev),
        kv_len_next=tuple(kv_next),
        q_len_prev=tuple(q_prev),
        q_len_next=tuple(q_next),
        rank_tokens=tuple(counts),
        physical_rank_tokens=physical_rank_len(counts, cp_size),
    )
