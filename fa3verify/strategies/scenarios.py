"""The scenario space the fuzzer explores (family ``scenario``).

Server configurations follow the modelled backend's validation (tp = attn_tp * attn_cp * attn_dp; prefill CP with a
strategy; heads divisible by the attention-TP size); models are real shapes (gpu_impl.config.MODELS);
GPUs are real SM counts. Batches mix skewed decode batches (one long sequence with short companions: the
shape that overflows), uniform decode batches, prefills with prefix-cache hits, CP-v2 extends, MIXED
batches and idle steps. Lengths go up to 128k for metadata-level cases; a `numerics` case keeps every
length small so the emulated kernel and the oracle run in milliseconds.
"""

from __future__ import annotations

import dataclasses
import functools
import random

from gpu_impl.config import MODELS, ModelConfig, ServerConfig, is_valid_config
from gpu_impl.domain import SM_COUNTS, FuzzCase  # noqa: F401 - the strategies' case type, drawn by every family

PAGE_SIZES = (1, 16, 64)
CONTEXT_LENGTHS = (4096, 32768, 131072)
#: Split policies: mostly the heuristic (the modelled backend's default), sometimes fixed counts.
NUM_SPLITS_POLICIES = (0, 0, 0, 0, 0, 0, 1, 2, 4, 16)
#: Share of cases that run the kernel on tensors and compare with the oracle (the rest check metadata only).
NUMERICS_SHARE = 0.02
#: Longest sequence in a numerics case (kept small so a CPU case takes milliseconds).
NUMERICS_MAX_LEN = 64


@functools.lru_cache(maxsize=None)
def rank_layouts(model_name: str) -> tuple:
    """Every (tp, attn_cp, dp_attention, dp) that the modelled backend accepts for the model, with tp in 1..8."""
    model = MODELS[model_name]
    out = []
    for tp in (1, 2, 4, 8):
        for attn_cp in (c for c in (1, 2, 4, 8) if tp % c == 0):
            for dp_attention in (False, True):
                dps = [d for d in (1, 2, 4, 8) if (tp // attn_cp) % d == 0] if dp_attention else [1, 2]
                for dp in dps:
                    server = ServerConfig(tp_size=tp, dp_size=dp, attn_cp_size=attn_cp,
                                          enable_dp_attention=dp_attention, enable_prefill_cp=attn_cp > 1,
                                          cp_strategy="zigzag" if attn_cp > 1 else None)
                    if is_valid_config(model, server):
                        out.append((tp, attn_cp, dp_attention, dp))
    return tuple(out)


def random_server_config(rng: random.Random, model: ModelConfig) -> ServerConfig:
    """A valid server configuration of the modelled backend for `model`: tp in 1..8 = attn_tp * attn_cp (* DP size with DP attention)."""
    tp, attn_cp, dp_attention, dp = rng.choice(rank_layouts(model.name))
    prefill_cp = attn_cp > 1 or rng.random() < 0.5
    return ServerConfig(
        tp_size=tp, dp_size=dp, attn_cp_size=attn_cp, enable_dp_attention=dp_attention,
        enable_prefill_cp=prefill_cp, cp_strategy="zigzag" if prefill_cp else None,
        page_size=rng.choice(PAGE_SIZES), num_splits=rng.choice(NUM_SPLITS_POLICIES),
        enable_deterministic_inference=rng.random() < 0.1, cuda_graph=rng.random() < 0.5,
        num_sm=rng.choice(SM_COUNTS), context_length=rng.choice(CONTEXT_LENGTHS))


def decode_step(rng: random.Random, max_len: int, max_batch: int = 16) -> dict:
    """A decode batch: skewed (one long, many short) half the time, else arbitrary lengths."""
    if rng.random() < 0.5:
        companions = rng.randint(0, max_batch - 1)
        lens = [rng.randint(1, max_len)] + [rng.randint(1, min(max_len, 512)) for _ in range(companions)]
        if rng.random() < 0.5:
            lens.reverse()
    else:
        lens = [rng.randint(1, max_len) for _ in range(rng.randint(1, max_batch))]
    return {"mode": "decode", "seq_lens": lens, "extend_lens": None}


def extend_step(rng: random.Random, max_len: int, mode: str = "extend", max_batch: int = 4) -> dict:
    """A prefill/extend (or MIXED) batch with prefix-cache hits: 1 <= extend_len <= seq_len."""
    seqs, extends = [], []
    for _ in range(rng.randint(1, max_batch)):
        seq = rng.randint(1, max_len)
        ext = 1 if (mode == "mixed" and rng.random() < 0.5) else rng.randint(1, seq)  # MIXED: running requests
        seqs.append(seq)
        extends.append(ext)
    return {"mode": mode, "seq_lens": seqs, "extend_lens": extends}


STEP_KINDS = ("decode", "decode", "decode", "extend", "mixed", "idle")


def random_steps(rng: random.Random, max_len: int, numerics: bool) -> tuple:
    """1..4 steps; decode-heavy, with CP-v2 extends, non-CP extends, MIXED and idle steps mixed in."""
    out = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(STEP_KINDS)
        if kind == "decode":
            out.append(decode_step(rng, max_len, max_batch=4 if numerics else 16))
        elif kind == "idle":
            out.append({"mode": "idle", "seq_lens": [], "extend_lens": None})
        else:
            out.append(extend_step(rng, min(max_len // 2 if numerics else max_len, 4096), mode=kind))
    return tuple(out)


def random_fuzz_case(rng: random.Random, numerics_share: float = NUMERICS_SHARE) -> FuzzCase:
    """One scenario of the space: configuration x model x batch sequence, plus a tensor seed."""
    model = MODELS[rng.choice(sorted(MODELS))]
    server = random_server_config(rng, model)
    numerics = rng.random() < numerics_share
    if numerics:  # a short context keeps CUDA-graph page tables (and so the call's split count) small
        server = dataclasses.replace(server, context_length=min(CONTEXT_LENGTHS))
    max_len = NUMERICS_MAX_LEN if numerics else server.context_length
    return FuzzCase(server=server, model=model, steps=random_steps(rng, max_len, numerics),
                    numerics=numerics, seed=rng.randrange(2**31))


def release_fuzz_case(rng: random.Random) -> FuzzCase:
    """A configuration a real release can be run with (family ``release``, what ``conform`` draws): a metadata-level
    case of the ``scenario`` space with ``num_splits`` 0. A fixed ``num_splits`` > 0 is the model's what-if
    (spec.model.config.ServerConfig): the modelled backend has no such server option and passes 0 (1 under deterministic inference)."""
    case = random_fuzz_case(rng, numerics_share=0.0)
    return dataclasses.replace(case, server=dataclasses.replace(case.server, num_splits=0))


def gpu_decode_case(rng: random.Random, num_sm: int = 132, max_len: int = 16384,
                    contexts: tuple = (4096, 16384, 32768)) -> FuzzCase:
    """A case for a real GPU (gpu-check's fuzz stage): a valid configuration of a real model on the GPU's SM
    count, a context from ``contexts``, and one decode batch (skewed half the time, the worked example's overflow shape) of
    up to 12 rows per attention-DP rank and lengths up to ``max_len``, every call run on tensors."""
    for _ in range(500):
        model = MODELS[rng.choice(sorted(MODELS))]
        server = dataclasses.replace(random_server_config(rng, model), num_sm=int(num_sm),
                                     context_length=rng.choice(tuple(contexts)))
        if is_valid_config(model, server):
            break
    cap = min(max_len, server.context_length)
    step = decode_step(rng, cap, max_batch=12 * server.attn_dp_size)
    return FuzzCase(server=server, model=model, steps=(step,), numerics=True, seed=rng.randrange(2**31))
