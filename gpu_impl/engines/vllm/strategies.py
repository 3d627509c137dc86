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
           "vllm_paths_both_drafts_case",
           "vllm_v2_case", "vllm_paths_case", "vllm_paths_both_case", "vllm_layers_case", "vllm_diffkv_case",
           "vllm_decode_tile_case",
           "vllm_family_label", "model_tp_points", "LOCAL_SHARE", "CHUNK_SIZES", "LAYERS_SHARE", "DIFFKV_SHARE", "DIFFKV_BLOCK_SIZES"]

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
    uniform decode batches, PIECEWISE for the rest), half its FULL mode; a third of the cases draft 2..4 speculative
    tokens after each step (``vllm.draft_tokens``, the V2 runner's drafter; under a FULL mode through its FULL
    draft-decode graphs). A share of the cases is redrawn first as chunked local attention (:func:`_chunked_local_case`;
    a full-graph one takes FULL or FULL_AND_PIECEWISE, half each, as the others: the release resolves the mode), and
    as layers that differ from the config (:data:`LAYERS_SHARE`, under every CUDA-graph mode: the V2 runner's
    attention groups are the release's own) or, of the eager and piecewise cases, K/V head sizes that differ
    (:data:`DIFFKV_SHARE`; :func:`_differing_layers_case`); a redrawn case drafts nothing."""
    import dataclasses

    case = vllm_case(rng)
    if case is None:
        return case
    # drawn before any redraw, so that the cases after a redrawn one keep their draws
    full_and_piecewise = rng.random() < 0.5 if case.server.cuda_graph else None
    redrawn = _chunked_local_case(case) or _differing_layers_case(case, graphs=True)
    if redrawn is not None:
        if redrawn.server.cuda_graph:
            redrawn = dataclasses.replace(redrawn, options={
                OPTIONS_KEY: {**redrawn.options[OPTIONS_KEY], "full_and_piecewise": full_and_piecewise}})
        return redrawn
    options = dict(case.options[OPTIONS_KEY])
    if case.server.cuda_graph:
        options["full_and_piecewise"] = full_and_piecewise
    # the V2 runner's drafter (drafter_v2; under a FULL mode its FULL draft-decode graphs, drafter_graphs): in a
    # third of the cases, 2..4 speculative tokens (1..3 draft decode steps after each step), drawn from a second
    # generator seeded by the case's seed
    extra = random.Random(case.seed + 2)
    if extra.random() < 1 / 3:
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
    context empty: DCP's skipped context attention). A share of the cases is redrawn before that as chunked local
    attention (:func:`_chunked_local_case`) and, of the eager and piecewise ones, as layers that differ from the config
    or K/V head sizes that differ (:func:`_differing_layers_case`)."""
    import dataclasses

    case = vllm_case(rng)
    if case is None:
        return None
    local = _chunked_local_case(case)
    if local is not None:
        return local
    differing = _differing_layers_case(case)
    if differing is not None:
        return differing
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


#: Family ``vllm-paths``: the share of windowless, DCP-1 cases drawn as a model with chunked local layers
LOCAL_SHARE = 0.3
#: the local-attention chunk sizes drawn (Llama 4 Scout / Maverick: 8192; smaller ones make more virtual batches)
CHUNK_SIZES = (8192, 4096, 2048, 1024)
#: Llama 4 Scout's attention (config.json of meta-llama/Llama-4-Scout-17B-16E: 40 query heads, 8 KV heads, head
#: size 128, attention_chunk_size 8192, every 4th layer a global NoPE layer: ``no_rope_layers``)
LLAMA4_HEADS = (40, 8, 128)
#: the layers of a chunked-local case: three chunked local layers and a global one, as Llama 4 interleaves them
LLAMA4_LAYERS = 4


def _chunked_local_case(case: FuzzCase) -> Optional[FuzzCase]:
    """A ``vllm-paths`` case redrawn as a model with chunked local layers (vLLM's ``attention_chunk_size``), from a
    generator seeded by the case's seed + 2 (other cases keep their draws): in :data:`LOCAL_SHARE` of the windowless
    cases without DCP, Llama 4 Scout's attention heads on the drawn tp, four layers of which the first three are chunked
    local (``vllm.attention_chunk_size``, a size of :data:`CHUNK_SIZES`), no shared prefix and no drafter, and a last
    step of 1..8 requests longer than a chunk, one of them taking up to 2048 new tokens; a full-graph
    draw stays FULL in 3 of 10 (vLLM refuses FULL over the chunked local backend, whose CUDA-graph support is NEVER)
    and is PIECEWISE otherwise (what vLLM's default FULL_AND_PIECEWISE resolves to for such a model). None: not
    drawn."""
    import dataclasses

    options = dict(case.options[OPTIONS_KEY])
    draw = random.Random(case.seed + 2)
    if options.get("sliding_window") or case.server.attn_cp_size > 1 or draw.random() >= LOCAL_SHARE:
        return None
    chunk = draw.choice(CHUNK_SIZES)
    heads, kv_heads, dim = LLAMA4_HEADS
    model = dataclasses.replace(case.model, name="llama-4-scout", num_heads=heads, num_kv_heads=kv_heads,
                                head_dim=dim, head_dim_v=dim, is_mla=False, has_sliding_window_layers=False)
    server = case.server
    if server.cuda_graph and draw.random() >= 0.3:
        server = dataclasses.replace(server, cuda_graph=False)
        options["piecewise"] = True
    options.update(num_layers=LLAMA4_LAYERS, attention_chunk_size=[chunk] * (LLAMA4_LAYERS - 1) + [None])
    # and a step shaped for the virtual batches: 1..8 requests longer than a chunk (up to four chunks), the first
    # taking a chunk of up to 2048 new tokens that may cross chunk boundaries, the others one-token decodes
    n = draw.choice((1, 2, 4, 8))
    lens = [min(MAX_MODEL_LEN, draw.randint(chunk + 1, 4 * chunk)) for _ in range(n)]
    first = min(lens[0], draw.randint(2, 2048))
    step = {"mode": "mixed", "seq_lens": lens, "extend_lens": [first] + [1] * (n - 1)}
    return dataclasses.replace(case, model=model, server=server, options={OPTIONS_KEY: options},
                               steps=tuple(case.steps) + (step,))


#: Family ``vllm-diffkv``: K/V head sizes that differ as MiMo-V2's attention has them (vLLM's DiffKV backend:
#: ``vllm/model_executor/models/mimo_v2.py``, head_dim 192, v_head_dim 128)
DIFF_KV_HEAD_DIMS = (192, 128)
#: KV-head counts a layer of a heterogeneous (Nemotron-NAS) model draws from (those dividing its query heads, and
#: the query heads themselves)
LAYER_KV_HEADS = (1, 2, 4, 8, 16)


def _long_among_short(extra: random.Random, steps: list) -> list:
    """In 3 of 4 cases a first decode step with one long sequence among short ones (the skew that splits)."""
    if extra.random() >= 0.75:
        return steps
    n = extra.choice((3, 8, 33))
    return [{"mode": "decode", "seq_lens": [extra.choice((4097, 32768))] + [extra.choice((1, 17, 100))
                                                                           for _ in range(n - 1)],
             "extend_lens": None}] + steps


def vllm_layers_case(rng: random.Random) -> Optional[FuzzCase]:
    """Family ``vllm-layers``: a Nemotron-NAS model whose 2..4 attention layers take their own KV-head counts
    (``vllm.layer_kv_heads``, at least two different ones; the release's ``ModelConfig`` says the model-wide count,
    its KV-cache grouping the layers' groups), eager or piecewise, sliding windows off: the ``vllm`` draws from
    ``rng``, then a generator seeded by the case's seed (:func:`_long_among_short`)."""
    case = vllm_case(rng, graph_modes=("none", "piecewise"))
    if case is None:
        return None
    return _with_layer_kv_heads(case, random.Random(case.seed + 2))


def _with_layer_kv_heads(case: FuzzCase, extra: random.Random) -> FuzzCase:
    """``case`` (eager or piecewise) as a Nemotron-NAS model whose 2..4 layers take their own KV-head counts drawn
    from ``extra`` (sliding windows off), with :func:`_long_among_short`'s step."""
    import dataclasses

    options = {k: v for k, v in case.options[OPTIONS_KEY].items() if k not in ("sliding_window", "num_layers")}
    # the divisors of the query heads among LAYER_KV_HEADS, and the heads themselves (n_heads_in_group 1)
    counts = sorted({x for x in LAYER_KV_HEADS if case.model.num_heads % x == 0} | {case.model.num_heads})
    layers = extra.randint(2, 4)
    kv = [extra.choice(counts) for _ in range(layers)]
    while len(set(kv)) < 2:
        kv[extra.randrange(layers)] = extra.choice(counts)
    options.update(num_layers=layers, layer_kv_heads=kv)
    return dataclasses.replace(case, options={OPTIONS_KEY: options},
                               steps=tuple(_long_among_short(extra, list(case.steps))))


def vllm_diffkv_case(rng: random.Random) -> Optional[FuzzCase]:
    """Family ``vllm-diffkv``: K and V head sizes that differ (:data:`DIFF_KV_HEAD_DIMS`, the release's DiffKV
    backend; the driver refuses it on a release without one), eager or piecewise, on the ``vllm`` draws from
    ``rng`` with the model's head sizes replaced (a generator seeded by the case's seed adds the skewed step)."""
    case = vllm_case(rng, graph_modes=("none", "piecewise"))
    if case is None:
        return None
    return _with_diffkv(case, random.Random(case.seed + 2))


#: Family ``vllm-diffkv``: the KV-cache block sizes drawn beside the ``vllm`` family's 16 and 64, in half the cases: vLLM
#: accepts any block size its FlashAttention backend supports (a multiple of 16), and from 128 on FA3 reads a paged
#: KV cache through TMA where V's head size is 128 (kBlockN 128) but not where it is 192 (kBlockN 96): the tile, and so
#: the split count, of a precompute made for V 192 and a call with V 128 can differ (docs/engines-vllm.md)
DIFFKV_BLOCK_SIZES = (128, 256)


def _with_diffkv(case: FuzzCase, extra: random.Random) -> FuzzCase:
    """``case`` with K/V head sizes :data:`DIFF_KV_HEAD_DIMS`, :func:`_long_among_short`'s step, and in half the cases
    a block size of :data:`DIFFKV_BLOCK_SIZES` with a last step of 1..3 requests, the first taking 16..256 new tokens
    (the packed query rows exceed kBlockM, so FA3 reads the paged cache through TMA where kBlockN divides the block
    size, and the batch is small enough to split), all from ``extra``."""
    import dataclasses

    d, dv = DIFF_KV_HEAD_DIMS
    server, steps = case.server, _long_among_short(extra, list(case.steps))
    if extra.random() < 0.5:
        server = dataclasses.replace(server, page_size=extra.choice(DIFFKV_BLOCK_SIZES))
        # and a step where FA3 takes that path (more packed query rows than kBlockM: a query of 16..256 new tokens)
        # with few enough tiles to split: 1..3 requests, the others one-token decodes
        n = extra.randint(1, 3)
        lens = [extra.choice((300, 1000, 4097, 16384))] + [extra.choice((17, 100, 1000)) for _ in range(n - 1)]
        steps.append({"mode": "mixed", "seq_lens": lens, "extend_lens": [extra.randint(16, 256)] + [1] * (n - 1)})
    return dataclasses.replace(case, model=dataclasses.replace(case.model, head_dim=d, head_dim_v=dv), server=server,
                               steps=tuple(steps))


#: The gate's families (``vllm-paths``, ``vllm-paths-both``, ``vllm-v2``): the shares of their eager and piecewise
#: cases (those not drawn as chunked local attention) redrawn as ``vllm-layers`` and ``vllm-diffkv`` cases
LAYERS_SHARE = 0.1
DIFFKV_SHARE = 0.1


def _differing_layers_case(case: FuzzCase, graphs: bool = False) -> Optional[FuzzCase]:
    """A gate family's eager or piecewise case redrawn, from a generator seeded by the case's seed + 3 (other cases keep
    their draws), in :data:`LAYERS_SHARE` of them as a model whose layers take their own KV-head counts (as
    ``vllm-layers`` draws it; with ``graphs`` also a full-graph case: the V2 runner's family, whose attention groups
    drive FULL graphs over such layers) and in :data:`DIFFKV_SHARE` with K/V head sizes that differ (as
    ``vllm-diffkv`` draws it; the driver refuses it on a release without the DiffKV backend). None: not redrawn."""
    if case.server.cuda_graph and not graphs:
        return None
    draw = random.Random(case.seed + 3)
    u = draw.random()
    if u < LAYERS_SHARE:
        return _with_layer_kv_heads(case, draw)
    if u < LAYERS_SHARE + DIFFKV_SHARE and not case.server.cuda_graph:
        return _with_diffkv(case, draw)
    return None


def vllm_paths_both_case(rng: random.Random, v2_drafts: bool = False) -> Optional[FuzzCase]:
    """Family ``vllm-paths-both``: ``vllm-paths`` for a release that ships both model runners, half the cases on its
    V2 runner (``vllm.runner = "v2"``, drawn from a third generator seeded by the case's seed; there half the
    full-graph cases take vLLM's FULL_AND_PIECEWISE mode, as ``vllm-v2`` draws them; chunked local layers and layers
    that differ go to either runner). ``v2_drafts`` (family ``vllm-paths-both-drafts``): a V2 case drafts 2..4
    speculative tokens in two thirds of the cases, in every graph mode (the V2 runner's speculator, ``drafter_v2``,
    under a FULL mode its FULL draft-decode graphs; drawn from a generator seeded by the case's seed + 2, as
    ``vllm-v2`` draws them: 0.28 .. 0.31 update the draft metadata between draft steps only, so the update needs 3
    or 4), except over chunked local layers or layers that differ (not driven with a drafter on the V2 runner:
    paths.json); every other draw is the same as without."""
    import dataclasses

    case = vllm_paths_case(rng)
    if case is None:
        return None
    extra = random.Random(case.seed + 1)
    if extra.random() >= 0.5:
        return case
    # cascade is driven on the V1 runner only, the drafter on the V2 runner where the release's speculator is driven
    # (v2_drafts), not over chunked local layers or layers that differ: not asked of the V2 runner otherwise
    options = {k: v for k, v in case.options[OPTIONS_KEY].items() if k not in ("common_prefix", "draft_tokens")}
    if v2_drafts and not options.get("layer_kv_heads") and not options.get("attention_chunk_size"):
        draw = random.Random(case.seed + 2)
        if draw.random() < V2_DRAFT_SHARE:
            options["draft_tokens"] = draw.randint(2, 4)
    options["runner"] = "v2"
    if case.server.cuda_graph:
        options["full_and_piecewise"] = extra.random() < 0.5
    return dataclasses.replace(case, options={OPTIONS_KEY: options})


#: Family ``vllm-paths-both-drafts``: the share of its V2 cases that draft 2..4 tokens
V2_DRAFT_SHARE = 2 / 3


def vllm_paths_both_drafts_case(rng: random.Random) -> Optional[FuzzCase]:
    """Family ``vllm-paths-both-drafts``: ``vllm-paths-both`` for a release whose V2 runner's drafter is driven too
    (releases.json ``v2_runner.drafter``): two thirds of its V2 cases draft 2..4 tokens."""
    return vllm_paths_both_case(rng, v2_drafts=True)


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
    "vllm-paths-both-drafts": vllm_paths_both_drafts_case,
    "vllm-layers": vllm_layers_case,
    "vllm-diffkv": vllm_diffkv_case,
}
