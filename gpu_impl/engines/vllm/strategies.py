"""vLLM's configuration families (family ``vllm``): the knobs vLLM's FlashAttention builder reads, x skewed batches.

A case is a ``FuzzCase`` (``gpu_impl.domain``) whose options under ``vllm`` (:data:`.options.OPTIONS_KEY`) say what
the sglang-shaped server and model cannot (:mod:`.options` validates them; ``gpu_impl.engines.vllm.host.scenario_to_vllm`` maps the whole case onto the
driver). The families, as ``vllm/v1/attention/backends/flash_attn.py`` (0.33.0) branches on them:

* CUDA graph: none, piecewise (attention runs eagerly between captured pieces) or full (``server.cuda_graph``:
  ``max_num_splits = flash_attn_max_num_splits_for_cuda_graph`` on both sides, batches padded to a capture size);
* ``VLLM_BATCH_INVARIANT`` (``server.enable_deterministic_inference``): no precompute, ``num_splits=1``;
* KV cache ``auto`` / ``fp8`` (both sides schedule with float8_e4m3fn);
* sliding window: none, one setting on every layer (the window on both sides), or mixed settings (no precompute);
* decode context parallel 1 or 2 (``server.attn_cp_size``; only without windows, as the old campaign ran it);
* the model/tp points: every non-MLA model of ``gpu_impl.config.MODELS`` x tp 1, 2, 4, 8 dividing its heads;
* steps: one or two skewed decode batches (1..100 sequences of 1..32768 tokens), 30 % of them chunked-prefill
  steps (up to three sequences take a chunk of up to 2048 tokens, within vLLM's 8192-token step budget).

Family ``vllm-decode-tile`` (:func:`vllm_decode_tile_case`) draws around the fork's decode-tile boundary instead.

:func:`vllm_family_label` names the family of a case (``cg=... bi=... kv=... sw=... dcp=...``) for per-family counts.
"""

from __future__ import annotations

import random
from typing import Optional

from gpu_impl.domain import SM_COUNTS, FuzzCase
from spec.model.assumption_facts import facts_for, not_enforced

from .options import OPTIONS_KEY
from .profiles import VLLM_RELEASES

__all__ = ["FAMILIES", "NOT_ASSUMED_BY_VLLM", "GRAPH_MODES", "WINDOWS", "LENGTHS", "BATCH_SIZES", "WINDOW", "vllm_case", "vllm_full_graph_case",
           "vllm_v2_case", "vllm_paths_case", "vllm_paths_both_case",
           "vllm_decode_tile_case",
           "vllm_family_label", "model_tp_points"]

#: sglang's domain assumptions (``spec.model.config``) a vLLM case need not meet, from the vLLM releases' facts
#: (``spec/model/assumption_facts.json``): under vLLM ``server.attn_cp_size`` is decode context parallel, which needs no
#: prefill CP (the family draws DCP 2 without it).
NOT_ASSUMED_BY_VLLM = tuple(sorted({name for release in VLLM_RELEASES
                                    for name in not_enforced(facts_for("vllm", release))}))

GRAPH_MODES = ("none", "piecewise", "full")
WINDOWS = ("none", "one", "mixed")
#: Sequence lengths the old campaign drew from (a long one among short ones is the overflow shape).
LENGTHS = (1, 17, 100, 1000, 4097, 32768)
BATCH_SIZES = (1, 2, 3, 8, 33, 100)
#: The sliding window of the "one" and "mixed" families (Gemma-2 / Mistral-style 4096).
WINDOW = 4096
#: vLLM's default max_model_len in the driver (gpu_impl/engines/vllm/driver.py scenario_defaults).
MAX_MODEL_LEN = 40960


def model_tp_points() -> list:
    """(model name, tp) for every non-MLA model of gpu_impl.config.MODELS and tp in 1, 2, 4, 8 dividing its heads."""
    from gpu_impl.config import MODELS

    return [(name, tp) for name, m in sorted(MODELS.items()) if not m.is_mla and m.head_dim <= 256
            for tp in (1, 2, 4, 8) if m.num_heads % tp == 0]


def _steps(rng: random.Random, n: int) -> tuple:
    steps = []
    for _ in range(rng.randint(1, 2)):
        k = [rng.choice(LENGTHS) for _ in range(n)]
        q = [1] * n
        if rng.random() < 0.3:  # chunked prefill: a few sequences take a chunk, within the token budget
            for i in rng.sample(range(n), min(n, 3)):
                q[i] = rng.randint(1, min(k[i], 2048))
        if max(q) == 1:
            steps.append({"mode": "decode", "seq_lens": k, "extend_lens": None})
        else:
            steps.append({"mode": "mixed", "seq_lens": k, "extend_lens": q})
    return tuple(steps)


def vllm_case(rng: random.Random, graph_modes: tuple = GRAPH_MODES) -> Optional[FuzzCase]:
    """One configuration of vLLM's families (module doc) and its batches."""
    from gpu_impl.config import MODELS, ServerConfig

    name, tp = rng.choice(model_tp_points())
    model = MODELS[name]
    graph = rng.choice(graph_modes)
    window = rng.choice(WINDOWS)
    dcp = rng.choice((1, 2)) if window == "none" and tp % 2 == 0 else 1
    server = ServerConfig(tp_size=tp, attn_cp_size=dcp, page_size=rng.choice((16, 64)), num_sm=rng.choice(SM_COUNTS),
                          cuda_graph=graph == "full", enable_deterministic_inference=rng.random() < 0.5,
                          context_length=MAX_MODEL_LEN)
    options: dict = {"kv_cache_dtype": rng.choice(("auto", "fp8")), "piecewise": graph == "piecewise"}
    if window == "one":
        options.update(num_layers=2, sliding_window=WINDOW)
    elif window == "mixed":
        options.update(num_layers=2, sliding_window=[WINDOW, None])
    steps = _steps(rng, rng.choice(BATCH_SIZES))
    return FuzzCase(server=server, model=model, steps=steps, numerics=False, seed=rng.randrange(2 ** 31),
                    options={OPTIONS_KEY: options})


def vllm_full_graph_case(rng: random.Random) -> Optional[FuzzCase]:
    """Family ``vllm-full-graph``: the ``vllm`` families under full CUDA graph only (where vLLM #20301 lived)."""
    return vllm_case(rng, graph_modes=("full",))


def vllm_v2_case(rng: random.Random) -> Optional[FuzzCase]:
    """Family ``vllm-v2``: the ``vllm`` families for a release the V2 runner drives (0.34.0 on); half the
    full-graph draws take vLLM's default FULL_AND_PIECEWISE mode (``vllm.full_and_piecewise``: FULL graphs for
    uniform decode batches, PIECEWISE for the rest), half its FULL mode; a third of the cases without a FULL graph
    draft 2..4 speculative tokens after each step (``vllm.draft_tokens``, the V2 runner's drafter)."""
    import dataclasses

    case = vllm_case(rng)
    if case is None:
        return case
    options = dict(case.options[OPTIONS_KEY])
    if case.server.cuda_graph:
        options["full_and_piecewise"] = rng.random() < 0.5
    # the V2 runner's drafter (drafter_v2): in a third of the cases without a FULL graph, 2..4 speculative tokens
    # (1..3 draft decode steps after each step), drawn from a second generator seeded by the case's seed
    extra = random.Random(case.seed + 2)
    if (not case.server.cuda_graph or options.get("piecewise")) and extra.random() < 1 / 3:
        options["draft_tokens"] = extra.randint(2, 4)
    return dataclasses.replace(case, options={OPTIONS_KEY: options})


#: Family ``vllm-paths``: the shared-prefix lengths drawn (cascade attention needs at least 256 tokens shared)
SHARED_PREFIXES = (256, 4096, 16384)


def vllm_paths_case(rng: random.Random) -> Optional[FuzzCase]:
    """Family ``vllm-paths``: the ``vllm`` families (the same draws from ``rng``) plus the paths a release's V1 runner
    reaches from a batch alone, drawn from a second generator seeded by the case's seed (so the ``vllm`` draws stay
    as they are): in 4 of 5 cases without sliding windows every request shares a prefix (``vllm.common_prefix``,
    added to every sequence, and a last step of 8..33 requests with one chunk; the release's cascade rule decides;
    vLLM's rule refuses windows), in a quarter a drafter builds metadata for 1..4 draft tokens
    after each step (``vllm.draft_tokens``), and under DCP a tenth start with a step of fresh prefills (every
    context empty: DCP's skipped context attention)."""
    import dataclasses

    case = vllm_case(rng)
    if case is None:
        return None
    extra = random.Random(case.seed)
    options, steps = dict(case.options[OPTIONS_KEY]), list(case.steps)
    if extra.random() < 0.8 and not options.get("sliding_window"):
        prefix = extra.choice(SHARED_PREFIXES)
        options["common_prefix"] = prefix
        steps = [{**st, "seq_lens": [min(MAX_MODEL_LEN, k + prefix) for k in st["seq_lens"]]} for st in steps]
        steps = [st if st["extend_lens"] is None else
                 {**st, "extend_lens": [min(q, k) for q, k in zip(st["extend_lens"], st["seq_lens"])]} for st in steps]
        # and a step shaped for vLLM's cascade rule: at least 8 requests, one of them taking a chunk (a batch that
        # is not all one-token decodes, so FlashDecoding's cost model does not decide)
        n = extra.choice((8, 16, 33))
        own = [extra.choice((1, 17, 100, 1000)) for _ in range(n)]
        chunk = extra.randint(2, 64)
        steps.append({"mode": "mixed", "seq_lens": [prefix + k + (chunk if i == 0 else 0) for i, k in enumerate(own)],
                      "extend_lens": [chunk] + [1] * (n - 1)})
    if extra.random() < 0.25:
        options["draft_tokens"] = extra.randint(1, 4)
    if case.server.attn_cp_size > 1 and extra.random() < 0.1:
        fresh = [extra.choice((17, 100, 1000)) for _ in range(extra.randint(1, 8))]
        steps = [{"mode": "mixed", "seq_lens": fresh, "extend_lens": list(fresh)}] + steps
    return dataclasses.replace(case, options={OPTIONS_KEY: options}, steps=tuple(steps))


def vllm_paths_both_case(rng: random.Random) -> Optional[FuzzCase]:
    """Family ``vllm-paths-both``: ``vllm-paths`` for a release that ships both model runners, half the cases on its
    V2 runner (``vllm.runner = "v2"``, drawn from a third generator seeded by the case's seed; there half the
    full-graph cases take vLLM's FULL_AND_PIECEWISE mode, as ``vllm-v2`` draws them)."""
    import dataclasses

    case = vllm_paths_case(rng)
    if case is None:
        return None
    extra = random.Random(case.seed + 1)
    if extra.random() >= 0.5:
        return case
    # cascade and the drafter's build_for_drafting are driven on the V1 runner only: not asked of the V2 runner
    options = {k: v for k, v in case.options[OPTIONS_KEY].items() if k not in ("common_prefix", "draft_tokens")}
    options["runner"] = "v2"
    if case.server.cuda_graph:
        options["full_and_piecewise"] = extra.random() < 0.5
    return dataclasses.replace(case, options={OPTIONS_KEY: options})


def vllm_decode_tile_case(rng: random.Random) -> Optional[FuzzCase]:
    """Family ``vllm-decode-tile``: the fork's decode-tile boundary (theorem 9, ``use_one_mma_wg``).

    Head dims 64 and 128 only, half the draws each (the fork's one-MMA-WG tiles), bf16 KV twice as often as fp8, eager or piecewise attention, full-attention layers, no
    DCP; one step whose first sequence takes ``q`` query tokens with ``q * (h / h_k)`` at or next to 64 (the
    boundary a precompute and a call that disagree on ``max_seqlen_q`` straddle), a KV length log-uniform in
    16..16384, and up to 7 short decodes beside it.
    """
    from gpu_impl.config import MODELS, ServerConfig

    dim = rng.choice((64, 128))  # half the draws at d 64, where the one-MMA-WG tile changes kBlockN too
    name, tp = rng.choice([(n, t) for n, t in model_tp_points() if MODELS[n].head_dim == dim])
    model = MODELS[name]
    h, hk = model.num_heads // tp, max(1, model.num_kv_heads // tp)
    edge = max(1, 64 // (h // hk))
    q = max(1, rng.choice((edge, edge, edge + 1, edge - 1, rng.randint(1, 2 * edge + 1))))
    kv = max(q, 16, int(2 ** rng.uniform(4, 14)))
    b = rng.choice((1, 2, 4, 8))
    lens = [kv] + [rng.choice((1, 17, 100)) for _ in range(b - 1)]
    qlens = [q] + [1] * (b - 1)
    step = ({"mode": "decode", "seq_lens": lens, "extend_lens": None} if q == 1 else
            {"mode": "mixed", "seq_lens": lens, "extend_lens": qlens})
    server = ServerConfig(tp_size=tp, page_size=rng.choice((16, 64)), num_sm=rng.choice(SM_COUNTS), cuda_graph=False,
                          context_length=MAX_MODEL_LEN)
    options = {"kv_cache_dtype": rng.choice(("auto", "auto", "fp8")), "piecewise": rng.random() < 0.5}
    return FuzzCase(server=server, model=model, steps=(step,), numerics=False, seed=rng.randrange(2 ** 31),
                    options={OPTIONS_KEY: options})


def vllm_family_label(case: FuzzCase) -> str:
    """The configuration family of a ``vllm`` case: ``cg=none|piecewise|full bi=0|1 kv=auto|fp8 sw=... dcp=N``."""
    opts = case.options.get(OPTIONS_KEY) or {}
    graph = (("full_and_piecewise" if opts.get("full_and_piecewise") else "full") if case.server.cuda_graph
             else ("piecewise" if opts.get("piecewise") else "none"))
    sw = opts.get("sliding_window")
    window = "none" if sw is None else ("mixed" if isinstance(sw, list) and len(set(sw)) > 1 else "one")
    return (f"cg={graph} bi={int(case.server.enable_deterministic_inference)} kv={opts.get('kv_cache_dtype', 'auto')} "
            f"sw={window} dcp={case.server.attn_cp_size}")


#: vLLM's strategy families, by name (what its plugin gives the suite's ``fa3verify.strategies.FAMILIES``).
FAMILIES = {
    "vllm": vllm_case,
    "vllm-full-graph": vllm_full_graph_case,
    "vllm-decode-tile": vllm_decode_tile_case,
    "vllm-v2": vllm_v2_case,
    "vllm-paths": vllm_paths_case,
    "vllm-paths-both": vllm_paths_both_case,
}
