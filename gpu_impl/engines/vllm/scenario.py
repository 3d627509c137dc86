"""One vLLM driver scenario: its fields, their defaults and their allowed ranges (the request schema of
``gpu_impl.engines.vllm.driver``; checked before any vLLM code runs).

Invariant: :func:`check_scenario` returns every field of :func:`scenario_defaults` filled in, or raises ValueError
naming the field and its allowed range; nothing here imports vLLM.
"""

from __future__ import annotations

#: ``full_and_piecewise`` (vLLM's default for FA3: FULL graphs for uniform decode, PIECEWISE otherwise) is driven by
#: the second generation only (``vllm_driver_v2``)
CUDA_GRAPH_MODES = ("none", "piecewise", "full", "full_and_piecewise")
#: the driver generation this worker runs: ``v1`` (the V1 model runner's conventions, vLLM <= 0.33) or ``v2`` (the
#: V2 runner's own code, ``vllm_driver_v2``); set by the client from ``vllm_recipes.DRIVER_GENERATIONS``
GENERATION_VARIABLE = "FA3VERIFY_VLLM_DRIVER"
#: the fields a seeded defect may set (``seed_defect``)
DEFECT_FIELDS = frozenset({"precompute_num_splits", "precompute_max_seqlen_q_delta"})
KV_CACHE_DTYPES = ("auto", "fp8")


def scenario_defaults() -> dict:
    """Every scenario field and its default (a request may give any subset)."""
    return {"num_heads": 32, "num_kv_heads": 4, "head_dim": 128, "head_dim_v": None, "num_layers": 1,
            "sliding_window": None, "attention_chunk_size": None, "layer_kv_heads": None,
            "logits_soft_cap": 0.0, "dtype": "bfloat16", "tp": 1, "dcp": 1, "cuda_graph": "none",
            "capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], "max_num_seqs": 256, "batch_invariant": False,
            "kv_cache_dtype": "auto", "block_size": 16, "max_model_len": 40960, "num_sm": 132,
            "max_num_splits_for_cuda_graph": 32, "max_num_batched_tokens": 8192, "steps": [], "defect": None,
            "common_prefix": 0, "draft_tokens": 0, "runner": None,
            "lifecycle_defect": None, "seed": 0}


def _chunk_sizes(out: dict):
    """The layers' local-attention chunk sizes (vLLM's ``attention_chunk_size``; Llama 4's chunked local layers): null
    (no chunked layer), or one (null | size) per layer; an integer gives every layer that size. A size is a multiple of
    ``block_size`` (vLLM's ``make_local_attention_virtual_batches`` asserts it), and a chunked layer has no sliding
    window (vLLM's chunked local layers take none)."""
    chunk = out["attention_chunk_size"]
    if chunk is None:
        return None
    layers = out["num_layers"]
    sizes = [chunk] * layers if isinstance(chunk, int) and not isinstance(chunk, bool) else chunk
    if (not isinstance(sizes, list) or len(sizes) != layers
            or any(c is not None and (not isinstance(c, int) or isinstance(c, bool) or not 1 <= c < 2 ** 31)
                   for c in sizes)):
        raise ValueError(f"attention_chunk_size: must be null, an integer in [1, 2^31), or one (null | integer in "
                         f"[1, 2^31)) per layer ({layers}), got {chunk!r}")
    if any(c is not None and c % out["block_size"] for c in sizes):
        raise ValueError(f"attention_chunk_size: each size a multiple of block_size ({out['block_size']}; vLLM's "
                         f"make_local_attention_virtual_batches asserts it), got {chunk!r}")
    windows = out["sliding_window"] or [None] * layers
    if any(c is not None and w is not None for c, w in zip(sizes, windows)):
        raise ValueError(f"attention_chunk_size: a layer with a chunk size has no sliding_window (vLLM's chunked "
                         f"local layers take none), got chunks {sizes!r} and windows {windows!r}")
    return sizes if any(c is not None for c in sizes) else None


def check_scenario(s: dict) -> dict:
    """The scenario with defaults filled in; ValueError naming the field and its allowed range."""
    out = scenario_defaults()
    unknown = sorted(set(s) - set(out))
    if unknown:
        raise ValueError(f"scenario: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(out))}")
    out.update(s)
    for name in ("num_heads", "num_kv_heads", "head_dim", "num_layers", "tp", "dcp", "max_num_seqs", "block_size",
                 "max_model_len", "num_sm", "max_num_splits_for_cuda_graph", "max_num_batched_tokens"):
        if not isinstance(out[name], int) or isinstance(out[name], bool) or out[name] < 1:
            raise ValueError(f"{name}: must be an integer >= 1, got {out[name]!r}")
    if out["num_heads"] % out["tp"] or out["num_heads"] % out["num_kv_heads"]:
        raise ValueError(f"num_heads: must be divisible by tp ({out['tp']}) and num_kv_heads "
                         f"({out['num_kv_heads']}), got {out['num_heads']}")
    if out["head_dim"] > 256:
        raise ValueError(f"head_dim: FA3 takes 1..256, got {out['head_dim']}")
    dv = out["head_dim_v"]
    if dv is not None and (not isinstance(dv, int) or isinstance(dv, bool) or not 1 <= dv <= 512):
        raise ValueError(f"head_dim_v: null (= head_dim) or an integer in 1..512 (V's head size: vLLM's DiffKV "
                         f"backend), got {dv!r}")
    lk = out["layer_kv_heads"]
    if lk is not None:
        if (not isinstance(lk, list) or len(lk) != out["num_layers"] or out["num_layers"] < 2
                or any(not isinstance(x, int) or isinstance(x, bool) or x < 1 or out["num_heads"] % x for x in lk)):
            raise ValueError(f"layer_kv_heads: null, or one KV-head count per layer (num_layers {out['num_layers']}, "
                             f"at least 2), each an integer >= 1 dividing num_heads ({out['num_heads']}): a "
                             f"Nemotron-NAS model's per-layer n_heads_in_group, got {lk!r}")
        if out["common_prefix"]:
            raise ValueError(f"common_prefix: 0 with layer_kv_heads (cascade over several attention groups is not "
                             f"driven), got {out['common_prefix']!r}")
        if out["lifecycle_defect"] == "shared-precompute-heterogeneous-heads":
            raise ValueError("lifecycle_defect: shared-precompute-heterogeneous-heads seeds its own heterogeneous "
                             "layer; null with layer_kv_heads")
    if out["cuda_graph"] not in CUDA_GRAPH_MODES:
        raise ValueError(f"cuda_graph: must be one of {CUDA_GRAPH_MODES}, got {out['cuda_graph']!r}")
    if out["kv_cache_dtype"] not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype: must be one of {KV_CACHE_DTYPES}, got {out['kv_cache_dtype']!r}")
    if out["dtype"] not in ("bfloat16", "float16"):
        raise ValueError(f"dtype: must be bfloat16 or float16, got {out['dtype']!r}")
    sw = out["sliding_window"]
    if sw is not None:
        sw = [sw] * out["num_layers"] if isinstance(sw, int) else list(sw)
        if len(sw) != out["num_layers"] or any(w is not None and (not isinstance(w, int) or w < 1) for w in sw):
            raise ValueError(f"sliding_window: must be null, an integer >= 1, or one (null | integer >= 1) per "
                             f"layer ({out['num_layers']}), got {out['sliding_window']!r}")
        out["sliding_window"] = sw
    out["attention_chunk_size"] = _chunk_sizes(out)
    sizes = out["capture_sizes"]
    if not sizes or any(not isinstance(x, int) or x < 1 for x in sizes):
        raise ValueError(f"capture_sizes: must be a non-empty list of integers >= 1, got {sizes!r}")
    out["capture_sizes"] = sorted(set(sizes))
    for i, st in enumerate(out["steps"]):
        q, k = st.get("query_lens"), st.get("seq_lens")
        if not isinstance(k, list) or not k or any(not isinstance(x, int) or x < 1 for x in k):
            raise ValueError(f"steps[{i}].seq_lens: must be a non-empty list of integers >= 1, got {k!r}")
        q = [1] * len(k) if q is None else q
        if len(q) != len(k) or any(not isinstance(x, int) or not 1 <= x <= y for x, y in zip(q, k)):
            raise ValueError(f"steps[{i}].query_lens: one integer per sequence, 1 <= query_len <= seq_len, got {q!r}")
        if max(k) > out["max_model_len"]:
            raise ValueError(f"steps[{i}].seq_lens: at most max_model_len ({out['max_model_len']}), got {max(k)}")
        if len(k) > out["max_num_seqs"]:
            raise ValueError(f"steps[{i}].seq_lens: at most max_num_seqs ({out['max_num_seqs']}) sequences, "
                             f"got {len(k)}")
        if sum(q) > out["max_num_batched_tokens"]:
            raise ValueError(f"steps[{i}].query_lens: at most max_num_batched_tokens ({out['max_num_batched_tokens']}) "
                             f"query tokens in a step (vLLM's scheduler budget), got {sum(q)}")
        st["query_lens"] = q
    if out["runner"] not in (None, "v1", "v2"):
        raise ValueError(f"runner: null (the release's driver generation), 'v1' or 'v2' (a release that ships both "
                         f"model runners), got {out['runner']!r}")
    cp, dt = out["common_prefix"], out["draft_tokens"]
    if not isinstance(cp, int) or isinstance(cp, bool) or not 0 <= cp < 2 ** 31:
        # the runner's rule caps it by the shortest computed context of each step (a shrunk case may shorten those)
        raise ValueError(f"common_prefix: tokens every request of a step shares (cascade attention), an integer in "
                         f"[0, 2^31), got {cp!r}")
    if not isinstance(dt, int) or isinstance(dt, bool) or not 0 <= dt <= 8:
        raise ValueError(f"draft_tokens: draft steps after each step (a drafter's metadata), an integer in [0, 8], "
                         f"got {dt!r}")
    if not isinstance(out["seed"], int) or isinstance(out["seed"], bool) or not 0 <= out["seed"] < 2 ** 63:
        raise ValueError(f"seed: must be an integer in [0, 2^63), got {out['seed']!r}")
    from gpu_impl.engines.lifecycle_judge import check_engine_defect

    check_engine_defect(out["lifecycle_defect"])
    if out["lifecycle_defect"] == "shared-precompute-heterogeneous-heads" and out["num_layers"] < 2:
        raise ValueError("num_layers: at least 2 with lifecycle_defect shared-precompute-heterogeneous-heads (its last "
                         f"layer differs from the others), got {out['num_layers']}")
    d = out["defect"]
    if d is not None and (not isinstance(d, dict) or not d or not set(d) <= DEFECT_FIELDS
                          or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1024
                                     for v in d.values())):
        raise ValueError(f"defect: null or an object of {sorted(DEFECT_FIELDS)} (integers in [0, 1024]), "
                         f"got {d!r}")
    return out
