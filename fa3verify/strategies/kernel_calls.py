"""Kernel-level call families: FA3 calls (one ``flash_attn_with_kvcache``, optionally with precomputed metadata)
at the corners where a combine, masking, heuristic or caller defect shows.

Each family is ``family(rng) -> call`` (the ``call`` object of a kernel-level case, docs/case-format.md); the
calls are what a correct caller issues: a ``caller``-layer defect is applied to the call by the kernel-level
system under test (``fa3verify.kernel_cases.KernelCallSUT``), never baked in here.
"""

from __future__ import annotations

import random


def cascade_prefix_metadata(total_q: int, prefix: int, batch_size: int) -> dict:
    """``get_scheduler_metadata`` arguments for a cascade shared-prefix call (one batch: the prefix against every
    query token), built for ``batch_size`` batches (a serving engine's cascade attention, PR #17283: the fix builds
    it for 1, the bug for num_reqs; the catalogue's entry names the file)."""
    b = batch_size
    return {"batch_size": b, "max_seqlen_q": total_q, "max_seqlen_k": prefix,
            "cache_seqlens": [prefix] + [0] * (b - 1), "cu_seqlens_q": [0, total_q] + [total_q] * (b - 1),
            "causal": False, "num_splits": 0}


def cascade_prefix(rng: random.Random) -> dict:
    n = rng.randint(2, 12)
    q_lens = [rng.randint(1, 4) for _ in range(n)]
    total = sum(q_lens)
    prefix = rng.randint(160, 768)
    h, hk = rng.choice(((4, 1), (8, 2), (4, 4)))
    d = rng.choice((64, 128))
    md = cascade_prefix_metadata(total, prefix, 1)
    return {"seqlens_q": [total], "seqlens_k": [prefix], "heads": [h, hk], "head_dim": d, "head_dim_v": d,
            "causal": False, "num_splits": 0, "seed": rng.randrange(2 ** 31), "metadata": md,
            "num_reqs": n, "prefix_len": prefix}


def masked_rows(rng: random.Random) -> dict:
    b = rng.randint(1, 2)
    lk = [rng.randint(140, 300) for _ in range(b)]
    lq = [x + rng.randint(1, 8) if rng.random() < 0.7 else rng.randint(1, 16) for x in lk]
    if all(q <= k_ for q, k_ in zip(lq, lk)):
        lq[0] = lk[0] + 1
    h, hk = rng.choice(((2, 1), (2, 2), (4, 2)))
    d = rng.choice((64, 128))
    return {"seqlens_q": lq, "seqlens_k": lk, "heads": [h, hk], "head_dim": d, "head_dim_v": d, "causal": True,
            "num_splits": rng.randint(2, 6), "seed": rng.randrange(2 ** 31)}


def below_sentinel(rng: random.Random) -> dict:
    if rng.random() < 0.5:
        return masked_rows(rng)
    b = rng.randint(1, 3)
    lk = [rng.randint(8, 200) for _ in range(b)]
    lq = [rng.randint(1, 4) for _ in range(b)]
    h, hk = rng.choice(((2, 1), (4, 2)))
    return {"seqlens_q": lq, "seqlens_k": lk, "heads": [h, hk], "head_dim": 128, "head_dim_v": 128,
            "causal": False, "num_splits": rng.choice((0, 1, 2)), "seed": rng.randrange(2 ** 31),
            "logits": "below-sentinel"}


def empty_workload(rng: random.Random) -> dict:
    h, hk = rng.choice(((8, 1), (8, 2), (4, 4)))
    d = rng.choice((64, 128))
    cap = rng.choice((1024, 2048, 4096))
    if rng.random() < 0.5:
        b = rng.randint(1, 4)
        return {"seqlens_q": [0] * b, "seqlens_k": [rng.randint(1, cap) for _ in range(b)], "capacity_k": cap,
                "max_seqlen_q": 0, "heads": [h, hk], "head_dim": d, "head_dim_v": d,
                "causal": rng.random() < 0.5, "num_splits": 0, "seed": rng.randrange(2 ** 31)}
    return {"seqlens_q": [], "seqlens_k": [], "capacity_k": cap, "dense": True, "heads": [h, hk], "head_dim": d,
            "head_dim_v": d, "causal": rng.random() < 0.5, "num_splits": 0, "seed": rng.randrange(2 ** 31)}
