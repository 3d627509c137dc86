"""attention_chunk in refmodel: the mask (hopper/mask.h) and the KV block bounds (hopper/block.h) agree.

Every key a row of an m-block sees lies inside the block range ``kv_block_bounds`` gives that m-block (else a split
would miss it), and the range is not wider than the visible keys' blocks plus what FA3's bounds include.
"""

from __future__ import annotations

import random

import pytest
import torch

from refmodel.attention import visibility_mask
from refmodel.kv_blocks import kv_block_bounds


def _row_blocks(m, lq, block_m, qhpk):
    rows = set()
    for packed in range(m * block_m, (m + 1) * block_m):
        row = packed // qhpk
        if row < lq:
            rows.add(row)
    return sorted(rows)


def _missed_keys(bounds, seed: int) -> list:
    """Cases where a key some row of an m-block sees lies outside the blocks ``bounds`` gives that m-block."""
    rng = random.Random(seed)
    missed = []
    for _ in range(40):
        lq, lk = rng.randint(1, 70), rng.randint(1, 200)
        chunk = rng.randint(1, 2 * lk)
        causal = rng.random() < 0.5
        window = (rng.choice([-1, rng.randint(0, lk)]), rng.choice([-1, rng.randint(0, lk)]))
        block_m, block_n, qhpk = rng.choice([16, 64]), rng.choice([16, 48]), rng.choice([1, 3])
        visible = visibility_mask(lq, lk, causal, window, chunk)
        for m in range((lq * qhpk + block_m - 1) // block_m):
            rows = _row_blocks(m, lq, block_m, qhpk)
            if not rows:
                continue
            n_min, n_max = bounds(m, lq, lk, block_m, block_n, causal, window, qhpk, chunk)
            keys = torch.nonzero(visible[rows].any(dim=0)).flatten()
            if keys.numel() and not (n_min * block_n <= int(keys.min()) and int(keys.max()) < n_max * block_n):
                missed.append((lq, lk, chunk, causal, window, block_m, block_n, qhpk, m))
    return missed


@pytest.mark.parametrize("seed", range(6))
def test_chunked_mask_keys_lie_in_the_blocks_the_split_kernel_visits(seed):
    assert _missed_keys(kv_block_bounds, seed) == []


def test_bounds_clipped_to_the_next_chunk_are_caught():
    """Negative control: a left bound one chunk too far right (a seeded defect) misses keys the mask shows."""
    def one_chunk_late(m, lq, lk, block_m, block_n, causal, window, qhpk, chunk):
        n_min, n_max = kv_block_bounds(m, lq, lk, block_m, block_n, causal, window, qhpk, chunk)
        return n_min + max(1, chunk // block_n), n_max

    assert any(_missed_keys(one_chunk_late, seed) for seed in range(6))


def test_chunk_restricts_each_row_to_its_chunk():
    visible = visibility_mask(4, 10, False, (-1, -1), attention_chunk=4)
    # row i aligns with key i + 6: keys 6, 7 -> chunk [4, 8); keys 8, 9 -> chunk [8, 12)
    assert visible[0].nonzero().flatten().tolist() == [4, 5, 6, 7]
    assert visible[3].nonzero().flatten().tolist() == [8, 9]
    assert torch.equal(visibility_mask(4, 10, False, (-1, -1), 0), torch.ones(4, 10, dtype=torch.bool))
