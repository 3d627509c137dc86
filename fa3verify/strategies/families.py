"""Focused scenario families: the configuration corners where a catalogue entry's defect can show.

Each family is ``family(rng) -> FuzzCase | None`` (None: the draw gave no valid configuration; the campaign
counts the draw and skips it). Configurations follow the modelled backend's validation (``gpu_impl.config.is_valid_config``);
the families are named in ``fa3verify/catalogue/entries.json`` through :data:`fa3verify.strategies.FAMILIES`.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from .scenarios import SM_COUNTS, FuzzCase


def _valid(model, server) -> bool:
    from gpu_impl.config import is_valid_config

    return is_valid_config(model, server)


def _pick_server(rng: random.Random, model, make: Callable[[random.Random], Any], tries: int = 50):
    for _ in range(tries):
        server = make(rng)
        if server is not None and _valid(model, server):
            return server
    return None


_GQA_MODELS = ("qwen3-30b-a3b", "llama-3-8b", "qwen3-235b-a22b", "llama-3.2-1b", "starcoder")
_SMS = SM_COUNTS


def _skewed_decode(rng: random.Random, max_len: int, rows: int) -> dict:
    long = rng.randint(max(1, max_len // 4), max_len)
    lens = [long] + [rng.randint(1, 512) for _ in range(rows - 1)]
    if rng.random() < 0.3:
        rng.shuffle(lens)
    return {"mode": "decode", "seq_lens": lens, "extend_lens": None}


def _fuzz_case(server, model, steps, seed):
    return FuzzCase(server=server, model=model, steps=tuple(steps), numerics=False, seed=seed)


def _zigzag_cp_server(r: random.Random, pages: tuple, vary_gpu: bool):
    """A prefill-CP (zigzag) configuration, tp 2..8 and attn_cp > 1 dividing it; with ``vary_gpu`` the SM count
    and the context length are drawn too (else the H200 and 32k)."""
    from gpu_impl.config import ServerConfig

    tp = r.choice((2, 4, 8))
    cp = r.choice([c for c in (2, 4, 8) if tp % c == 0])
    extra = {"page_size": r.choice(pages)}
    if vary_gpu:
        extra.update(num_sm=r.choice(_SMS), context_length=r.choice((32768, 131072)))
    else:
        extra.update(context_length=32768)
    return ServerConfig(tp_size=tp, attn_cp_size=cp, enable_prefill_cp=True, cp_strategy="zigzag", **extra)


def prefill_cp(rng: random.Random):
    """Prefill-CP configurations and one skewed decode batch (entry 01)."""
    from gpu_impl.config import MODELS

    model = MODELS[rng.choice(_GQA_MODELS)]
    server = _pick_server(rng, model, lambda r: _zigzag_cp_server(r, (1, 16, 64), vary_gpu=True))
    if server is None:
        return None
    return _fuzz_case(server, model, [_skewed_decode(rng, server.context_length, rng.randint(1, 8))],
                      rng.randrange(2 ** 31))


def dp_attention(rng: random.Random, cuda_graph: bool = False, rows_max: int = 16):
    from gpu_impl.config import MODELS, ServerConfig

    model = MODELS[rng.choice(_GQA_MODELS)]

    def make(r):
        tp = r.choice((2, 4, 8))
        dp = r.choice([d for d in (2, 4, 8) if tp % d == 0])
        return ServerConfig(tp_size=tp, dp_size=dp, enable_dp_attention=True, page_size=r.choice((1, 16, 64)),
                            num_sm=r.choice(_SMS), context_length=r.choice((32768, 131072)), cuda_graph=cuda_graph)
    server = _pick_server(rng, model, make)
    if server is None:
        return None
    rows = rng.randint(1, rows_max)
    return _fuzz_case(server, model, [_skewed_decode(rng, server.context_length, rows)], rng.randrange(2 ** 31))


def dp_attention_graph(rng: random.Random):
    return dp_attention(rng, cuda_graph=True, rows_max=24)


def cp_steps(rng: random.Random):
    """Prefill-CP configurations: a CP-v2 extend, then MIXED / short extends / idle / decode steps (entry 03)."""
    from gpu_impl.config import MODELS

    model = MODELS[rng.choice(_GQA_MODELS)]
    server = _pick_server(rng, model, lambda r: _zigzag_cp_server(r, (1, 16), vary_gpu=False))
    if server is None:
        return None
    cp2 = 2 * server.attn_cp_size
    n = rng.randint(1, 3)
    ext = [rng.randint(cp2, 4 * cp2 + 8) for _ in range(n)]
    steps = [{"mode": "extend", "seq_lens": [e + rng.randint(0, 64) for e in ext], "extend_lens": ext}]
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(("mixed", "mixed", "short-extend", "idle", "decode"))
        if kind == "idle":
            steps.append({"mode": "idle", "seq_lens": [], "extend_lens": None})
        elif kind == "decode":
            steps.append({"mode": "decode", "seq_lens": [rng.randint(1, 512) for _ in range(rng.randint(1, 4))],
                          "extend_lens": None})
        else:
            m = rng.randint(1, 4)
            seqs = [rng.randint(2, 256) for _ in range(m)]
            top = 1 if kind == "short-extend" else None
            exts = [rng.randint(1, min(s, cp2 - 1 if top else s)) for s in seqs]
            steps.append({"mode": "mixed" if kind == "mixed" else "extend", "seq_lens": seqs, "extend_lens": exts})
    return _fuzz_case(server, model, steps, rng.randrange(2 ** 31))


def _tp_server(rng: random.Random, model, cuda_graph: bool):
    """A tensor-parallel server for ``model`` (tp 1..8, page 1/16/64, a modelled SM count, 32K or 128K context) that
    ``_pick_server`` accepts, or None."""
    from gpu_impl.config import ServerConfig

    def make(r):
        return ServerConfig(tp_size=r.choice((1, 2, 4, 8)), page_size=r.choice((1, 16, 64)), num_sm=r.choice(_SMS),
                            context_length=r.choice((32768, 131072)), cuda_graph=cuda_graph)
    return _pick_server(rng, model, make)


def _tp_family(rng: random.Random, cuda_graph: bool, short_share: float = 0.0, odd_batches: bool = False):
    from gpu_impl.config import MODELS

    model = MODELS[rng.choice(_GQA_MODELS + ("llama-2-7b",))]

    server = _tp_server(rng, model, cuda_graph)
    if server is None:
        return None
    if odd_batches:
        rows = rng.choice([n for n in range(3, 41) if n not in (4, 8, 16, 24, 32, 40)])
        lens = [rng.randint(1, 8192) for _ in range(rows)]
        step = {"mode": "decode", "seq_lens": lens, "extend_lens": None}
    elif rng.random() < short_share:
        step = {"mode": "decode", "seq_lens": [rng.randint(1, 600) for _ in range(rng.randint(1, 8))],
                "extend_lens": None}
    else:
        step = _skewed_decode(rng, min(server.context_length, 65536), rng.randint(1, 8))
    return _fuzz_case(server, model, [step], rng.randrange(2 ** 31))


def graph_tp(rng):
    return _tp_family(rng, cuda_graph=True)


def eager_tp(rng):
    return _tp_family(rng, cuda_graph=False, short_share=0.5)


def graph_padding(rng):
    return _tp_family(rng, cuda_graph=True, odd_batches=True)


def tile_corner(rng: random.Random):
    from gpu_impl.config import ModelConfig, ServerConfig

    dv = rng.choice((96, 128, 192))
    hk = rng.choice((1, 2))
    qhpk = rng.randint(129, 192)
    model = ModelConfig(f"tile-corner-d64-dv{dv}-{qhpk * hk}x{hk}", qhpk * hk, hk, 64, dv)
    server = ServerConfig(tp_size=1, page_size=rng.choice((1, 16, 64)), num_sm=rng.choice(_SMS),
                          context_length=32768)
    if not _valid(model, server):
        return None
    lens = [rng.randint(1, 8192) for _ in range(rng.randint(1, 4))]
    return _fuzz_case(server, model, [{"mode": "decode", "seq_lens": lens, "extend_lens": None}],
                      rng.randrange(2 ** 31))


def large_decode_batch(rng: random.Random):
    """Decode batches of 16 to 256 rows (one long, the rest short), TP only, eager or CUDA graph: where the modelled backend's
    kernel builds from 0.4.5 bound a varlen call's split count by its real rows (refmodel.fa3_builds
    ``varlen_total_q_bound``), so their split counts part from upstream's and a precompute and a call that count
    rows differently can disagree (theorem ``total-q-drift``; hazard control ``precompute-max-seqlen-q-two``)."""
    from gpu_impl.config import MODELS

    model = MODELS[rng.choice(_GQA_MODELS)]
    cuda_graph = rng.random() < 0.5

    server = _tp_server(rng, model, cuda_graph)
    if server is None:
        return None
    step = _skewed_decode(rng, min(server.context_length, 65536), rng.choice((16, 24, 32, 64, 128, 256)))
    return _fuzz_case(server, model, [step], rng.randrange(2 ** 31))
