"""Family ``fidelity``: seeded random precompute configurations for the metadata fidelity check (``fa3verify.fidelity``).

Decode and small prefill shapes; head dims 64/128/256; per-rank head counts of real models under attention TP
1/2/4/8; batch 1..64; lengths up to 128k; causal or not; the split heuristic or a fixed split count; paged KV
where the adapter supports it. Unlike the campaign's families (one ``random.Random`` per campaign draw), each
configuration index has its own generator, so gpu-check's workers can take chunks of one stream independently.
"""

from __future__ import annotations

import functools
import random
from dataclasses import asdict, dataclass
from typing import Optional

__all__ = ["FidelityConfig", "random_config", "random_configs", "head_pairs", "HEAD_DIMS", "ATTN_TP_SIZES",
           "PAGE_SIZES", "FIXED_SPLITS", "MAX_SEQLEN_K", "MAX_PREFILL_Q"]

#: Head dims the configurations use (real models' head dims; FA3 compiles 64/96/128/192/256).
HEAD_DIMS = (64, 128, 256)
#: Attention-TP sizes the per-rank head counts come from.
ATTN_TP_SIZES = (1, 2, 4, 8)
#: Page sizes of paged configurations (the modelled backend's 1/16/64 and two that let paged KV use TMA).
PAGE_SIZES = (1, 16, 64, 128, 256)
#: Fixed split counts tried besides the heuristic (0).
FIXED_SPLITS = (1, 2, 3, 8, 16, 64, 128)
#: Longest KV length of a configuration.
MAX_SEQLEN_K = 131072
#: Longest query length of a "small prefill" configuration.
MAX_PREFILL_Q = 512


@dataclass(frozen=True)
class FidelityConfig:
    """One precompute (``get_scheduler_metadata`` arguments) and the call probed with the same shapes."""

    index: int
    model: str                 # where the head counts come from, e.g. "qwen3-30b-a3b/attn_tp=4"
    batch_size: int
    max_seqlen_q: int
    max_seqlen_k: int
    num_heads: int
    num_heads_k: int
    headdim: int
    headdim_v: int
    causal: bool
    num_splits: int
    page_size: Optional[int]
    varlen_q: bool             # cu_seqlens_q given
    cache_seqlens: tuple
    seqlens_q: tuple
    sm_margin: int = 0
    static_call: bool = False  # probe the call without cache_seqlens (no prepare step, S_c uses the batch size)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cache_seqlens"] = list(self.cache_seqlens)
        d["seqlens_q"] = list(self.seqlens_q)
        return d

    @classmethod
    def from_dict(cls, data: dict) -> "FidelityConfig":
        d = dict(data)
        d["cache_seqlens"] = tuple(d["cache_seqlens"])
        d["seqlens_q"] = tuple(d["seqlens_q"])
        return cls(**d)

    @property
    def kind(self) -> str:
        return "decode" if self.max_seqlen_q == 1 else "prefill"


@functools.lru_cache(maxsize=1)
def head_pairs() -> tuple[tuple[int, int, str], ...]:
    """(h, h_k, label) per-rank head counts of the real models in ``gpu_impl.config.MODELS`` under attention TP
    1/2/4/8, kept where the modelled backend's attention modules accept the split (heads divisible, KV heads split or
    replicated)."""
    from gpu_impl.config import MODELS

    out = []
    for name in sorted(MODELS):
        m = MODELS[name]
        for tp in ATTN_TP_SIZES:
            if m.num_heads % tp:
                continue
            if m.num_kv_heads >= tp and m.num_kv_heads % tp:
                continue
            if m.num_kv_heads < tp and tp % m.num_kv_heads:
                continue
            h, hk = m.num_heads // tp, max(1, m.num_kv_heads // tp)
            if h % hk == 0:
                out.append((h, hk, f"{name}/attn_tp={tp}"))
    return tuple(out)


def _lengths(rng: random.Random, b: int, max_len: int, lq: list[int]) -> list[int]:
    pattern = rng.choice(("uniform", "skewed", "skewed", "equal"))
    if pattern == "equal":
        lens = [max_len] * b
    elif pattern == "skewed":
        short_max = max(1, min(max_len, rng.choice((16, 128, 512))))
        lens = [rng.randint(1, short_max) for _ in range(b)]
        lens[rng.randrange(b)] = max_len
    else:
        lens = [rng.randint(1, max_len) for _ in range(b)]
    return [max(n, q) for n, q in zip(lens, lq)]  # the cache holds at least the new query tokens


def random_config(seed: int, index: int, paged: bool = True) -> FidelityConfig:
    """Configuration ``index`` of the stream ``seed`` (each index has its own generator: chunks are independent)."""
    rng = random.Random(f"fa3verify.fidelity:{seed}:{index}")
    pairs = head_pairs()
    h, hk, label = pairs[rng.randrange(len(pairs))]
    d = rng.choice(HEAD_DIMS)
    b = rng.randint(1, 8) if rng.random() < 0.5 else rng.randint(1, 64)
    decode = rng.random() < 0.7
    if decode:
        sq = 1
        lq = [1] * b
        varlen_q = rng.random() < 0.6
    else:
        sq = rng.choice((rng.randint(2, 32), rng.randint(2, MAX_PREFILL_Q)))
        varlen_q = rng.random() < 0.7
        lq = [rng.randint(1, sq) for _ in range(b)] if varlen_q else [sq] * b
        if varlen_q:
            lq[rng.randrange(b)] = sq
    max_len = max(1, min(MAX_SEQLEN_K, int(2 ** rng.uniform(0, 17))))
    cache = _lengths(rng, b, max_len, lq)
    page_size = rng.choice(PAGE_SIZES) if paged and rng.random() < 0.5 else None
    width = max(cache)
    roll = rng.random()
    if roll < 0.15:
        width = min(MAX_SEQLEN_K, max(width, 1 << (width - 1).bit_length()))  # a wider page table / graph width
    elif roll < 0.25 and page_size:
        width = -(-width // page_size) * page_size
    num_splits = 0 if rng.random() < 0.6 else rng.choice(FIXED_SPLITS)
    static_ok = max(cache) <= 2048 and b <= 8 and sq <= 64
    return FidelityConfig(
        index=index, model=label, batch_size=b, max_seqlen_q=sq, max_seqlen_k=width, num_heads=h, num_heads_k=hk,
        headdim=d, headdim_v=d, causal=rng.random() < 0.6, num_splits=num_splits, page_size=page_size,
        varlen_q=varlen_q, cache_seqlens=tuple(cache), seqlens_q=tuple(lq),
        sm_margin=0 if rng.random() < 0.85 else rng.choice((4, 8, 16)),
        static_call=static_ok and page_size is None and rng.random() < 0.3)


def random_configs(n: int, seed: int = 0, paged: bool = True, start: int = 0) -> list[FidelityConfig]:
    """Configurations ``start .. start+n-1`` of the stream ``seed``."""
    return [random_config(seed, i, paged) for i in range(start, start + n)]
