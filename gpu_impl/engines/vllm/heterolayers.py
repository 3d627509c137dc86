"""Models whose attention layers differ from their config (scenario field ``layer_kv_heads``), the vLLM release's
own code deciding: a Nemotron-NAS / DeciLM model (``model_type`` ``nemotron-nas``), whose ``block_configs`` give
each layer its own ``n_heads_in_group`` and so its own KV-head count
(``vllm/model_executor/models/nemotron_nas.py``: ``num_kv_heads = num_attention_heads // n_heads_in_group``).

Invariant: the model-wide numbers the metadata builder reads (``get_num_kv_heads``, ``get_num_attention_heads``,
``get_head_size``) are answered by the release's own ``ModelConfig`` methods run on the driver's model stand-in with
an hf_config-like object (:func:`nemotron_nas_hf_config`); the layers' KV-cache groups are the release's own
grouping (``get_kv_cache_groups`` / ``get_kv_cache_config``), and each group's builder is made from the group's
spec and layer names, as the V1 runner makes one per attention group. Nothing here copies vLLM's logic; what the
release's code cannot run on CPU (or is a nested function of the runner) is stood in and listed in
:data:`STOOD_IN`.
"""

from __future__ import annotations

import inspect
import types

from gpu_impl.engines.protocol import Unsupported

__all__ = ["STOOD_IN", "STOOD_IN_V2", "nemotron_nas_hf_config", "bind_model_config", "layer_kv_heads", "check_driven",
           "layer_groups", "kv_cache_groups", "release_kv_cache_groups", "runner_attention_groups", "GroupedBuilder"]

#: what the heterogeneous-layer driving stands in for (besides the driver's own stand-ins)
STOOD_IN = (
    "the model's hf_config: a namespace with the Nemotron-NAS fields vLLM reads (model_type nemotron-nas, "
    "num_attention_heads, block_configs[i].attention.{no_op, n_heads_in_group}, hidden_size, num_hidden_layers, "
    "head_dim, vocab_size), not a checkpoint's config; ModelConfig's own methods answer from it",
    "a module that vLLM's structured output imports and the release's environment lacks (diskcache on 0.10.1 .. "
    "0.19.1), when vllm/v1/core/kv_cache_utils.py is imported for the KV-cache grouping: a module of empty classes "
    "(no grouping code reads it; xgrammar as paths.STOOD_IN says)",
    "the KV-cache grouping itself where vllm/v1/core/kv_cache_utils.py still does not import: layers grouped by "
    "their own KV-cache spec (the response's kv_cache_grouping says so)",
    "the V1 runner's split of a KV-cache group into attention groups (initialize_attn_backend's nested "
    "get_attn_backends_for_group: one group per (backend, layer KV-cache spec)), which cannot be called without a "
    "runner: layers grouped by their own spec in the order vLLM lists them",
)


def nemotron_nas_hf_config(s: dict):
    """An hf_config-like object for a Nemotron-NAS model whose layer ``i`` has ``layer_kv_heads[i]`` KV heads."""
    heads = s["num_heads"]
    blocks = [types.SimpleNamespace(attention=types.SimpleNamespace(no_op=False, n_heads_in_group=heads // kv,
                                                                     replace_with_linear=False, sparsify=None),
                                    ffn=types.SimpleNamespace(no_op=False, replace_with_linear=False))
              for kv in s["layer_kv_heads"]]
    return types.SimpleNamespace(model_type="nemotron-nas", architectures=["DeciLMForCausalLM"],
                                 num_attention_heads=heads, num_hidden_layers=len(blocks), block_configs=blocks,
                                 hidden_size=heads * s["head_dim"], head_dim=s["head_dim"], vocab_size=32000,
                                 max_position_embeddings=s["max_model_len"], torch_dtype=s["dtype"])


def _model_config_class():
    try:
        from vllm.config.model import ModelConfig
    except ImportError:  # before 0.11 the class lives in vllm/config.py (or vllm/config/__init__.py)
        from vllm.config import ModelConfig
    return ModelConfig


def bind_model_config(standin) -> None:
    """Give ``standin`` (the driver's model stand-in, its ``hf_config`` set) the release's own ``ModelConfig``
    answers for the head counts and head size: the methods are vLLM's, called on the stand-in; releases with a
    model-architecture config (0.14 on) get theirs from vLLM's own convertor."""
    mc = _model_config_class()
    standin.use_mla = False  # not an MLA model (ModelConfig.use_mla reads the architecture)
    standin.is_attention_free = False
    standin.is_deepseek_mla = False
    if hasattr(mc, "get_model_arch_config"):
        params = inspect.signature(mc.get_model_arch_config).parameters
        if "self" in params and len(params) == 1:
            standin._supports_multimodal_for_mm_prefix = lambda: False
            standin.revision = None
            standin.model_arch_config = mc.get_model_arch_config(standin)
    for name in ("get_total_num_kv_heads", "get_num_kv_heads", "get_num_attention_heads", "get_head_size",
                 "get_total_num_attention_heads"):
        fn = getattr(mc, name, None)
        if fn is not None:
            setattr(standin, name, types.MethodType(fn, standin))


def layer_kv_heads(s: dict, index: int, tp: int) -> int:
    """KV heads per rank of layer ``index``: the model's attention layer divides its own total as vLLM's
    ``LlamaAttention`` does (``max(1, total // tp)``, replicated below tp)."""
    return max(1, s["layer_kv_heads"][index] // tp)


def check_driven(s: dict, numerics: bool, runner: str = "v1") -> bool:
    """True where the driver generation of ``runner`` drives these layers; Unsupported naming the field where not
    (the V2 runner's attention groups are the release's own, FULL graphs included: :func:`runner_attention_groups`)."""
    if runner == "v2" and not numerics:
        return True
    if numerics or s["cuda_graph"] in ("full", "full_and_piecewise"):
        raise Unsupported(f"layer_kv_heads: driven eager and under piecewise graphs in record mode (the FULL graphs "
                          f"of several attention groups and numerics are not), got cuda_graph {s['cuda_graph']!r}"
                          f"{' with numerics' if numerics else ''}")
    return True


def layer_groups(vc, layers: dict, windows: list, spec_args: dict, how: list, raw: list = None) -> list:
    """[(spec, layer names)]: each layer's own KV-cache spec (its KV heads; its window: vLLM's
    ``SlidingWindowSpec`` or ``FullAttentionSpec``, as ``Attention.get_kv_cache_spec`` makes them), grouped by
    :func:`kv_cache_groups`; ``raw`` (a list) gets the release's own KV-cache groups (its ``KVCacheGroupSpec``
    objects, what the V2 runner's ``init_attn_backend`` is given), or nothing where the grouping was stood in."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    specs = {}
    for (name, layer), w in zip(layers.items(), windows):
        own = dict(spec_args, num_kv_heads=layer.impl.num_kv_heads)
        specs[name] = SlidingWindowSpec(sliding_window=w, **own) if w is not None else FullAttentionSpec(**own)
    groups = release_kv_cache_groups(vc, specs, how)
    if raw is not None and groups is not None:
        raw.extend(groups)
    return kv_cache_groups(vc, specs, [], groups=groups) if groups is not None else _by_spec(specs, list(specs))


def kv_cache_groups(vc, specs: dict, how: list = None, groups: list = None) -> list:
    """[(spec, layer names)]: the release's own KV-cache grouping of ``specs`` (layer name -> spec), split as the V1
    runner splits a group into attention groups (STOOD_IN); Unsupported, naming vLLM's refusal, where the release's
    grouping refuses these layers. ``how`` (a list) gets the grouping function's name, or why it was stood in;
    ``groups``: the release's groups already made for ``specs`` (:func:`release_kv_cache_groups`)."""
    groups = release_kv_cache_groups(vc, specs, how) if groups is None else groups
    if groups is None:
        return _by_spec(specs, list(specs))
    out = []
    for group in groups:
        spec = group.kv_cache_spec
        per_layer = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs: one attention group per spec
        if per_layer is None:
            out.append((spec, list(group.layer_names)))
            continue
        out.extend(_by_spec(per_layer, group.layer_names))
    return out


def release_kv_cache_groups(vc, specs: dict, how: list = None):
    """The release's own KV-cache groups (its ``KVCacheGroupSpec`` objects, as the engine core hands them to the model
    runner) for ``specs`` (layer name -> spec); None where ``vllm.v1.core.kv_cache_utils`` does not import (``how``
    says why, STOOD_IN); Unsupported, naming vLLM's refusal, where the release's grouping refuses these layers."""
    how = [] if how is None else how
    try:
        utils = _import_kv_cache_utils()
    except Exception as exc:  # noqa: BLE001 - a dependency the release's environment lacks or mismatches (STOOD_IN)
        how.append(f"stood in (vllm.v1.core.kv_cache_utils does not import: {type(exc).__name__}: {exc}): layers "
                   f"grouped by their spec")
        return None
    try:
        import vllm.v1.core.kv_cache_planning as planning  # 0.33 on
    except ImportError:
        planning = None
    grouping = getattr(planning, "get_kv_cache_groups", None) or getattr(utils, "get_kv_cache_groups", None)
    specs = dict(specs)
    how.append(f"{grouping.__module__}.{grouping.__name__}" if grouping else f"{utils.__name__}.get_kv_cache_config")
    try:
        if grouping is not None:
            params = inspect.signature(grouping).parameters
            given = {"vllm_config": vc, "kv_cache_spec": specs, "kv_cache_specs": specs}
            groups = grouping(**{k: v for k, v in given.items() if k in params})
        else:  # up to 0.10: the groups come with the whole KV-cache config
            fn = utils.get_kv_cache_config
            params = inspect.signature(fn).parameters
            given = {"vllm_config": vc, "kv_cache_spec": specs, "available_memory": 1 << 40}
            groups = fn(**{k: v for k, v in given.items() if k in params}).kv_cache_groups
    except (NotImplementedError, ValueError) as exc:  # the release's own refusal of these layers
        import traceback

        frame = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{frame.filename[frame.filename.rfind('vllm/'):]}:{frame.lineno}"
        name = grouping.__name__ if grouping else "get_kv_cache_config"
        raise Unsupported(f"layer_kv_heads: vLLM's KV-cache grouping ({name}) refuses layers whose KV-cache page "
                          f"sizes differ: {type(exc).__name__} {exc} ({where})".replace("  ", " ")) from exc
    return list(groups)


def _import_kv_cache_utils():
    """vLLM's ``vllm.v1.core.kv_cache_utils``. It imports ``vllm.v1.request``, which imports structured output; where
    a module structured output imports is missing from the release's environment (``diskcache``, 0.10.1 .. 0.19.1)
    a stand-in module takes its place, as ``paths.STOOD_IN`` does for ``xgrammar`` (no grouping code reads either),
    and the import is retried; any other failure is raised as it was."""
    import sys
    import traceback

    from gpu_impl.engines.vllm.paths import import_with_xgrammar_stand_in, stand_in_module

    for _ in range(4):
        try:
            return import_with_xgrammar_stand_in("vllm.v1.core.kv_cache_utils")
        except ModuleNotFoundError as exc:
            frames = "".join(traceback.format_exception(exc))
            if not exc.name or exc.name.startswith("vllm") or "vllm/v1/structured_output" not in frames:
                raise
            sys.modules[exc.name] = stand_in_module(exc.name)
    return import_with_xgrammar_stand_in("vllm.v1.core.kv_cache_utils")


def _by_spec(specs: dict, names: list) -> list:
    """[(spec, layer names)]: ``names`` grouped by equal spec, in order (specs of some releases are unhashable)."""
    out: list = []
    for name in names:
        for spec, members in out:
            if spec == specs[name]:
                members.append(name)
                break
        else:
            out.append((specs[name], [name]))
    return out


class GroupedBuilder:
    """The metadata builders of several attention groups, stepped together as the V1 runner steps them: each
    ``build*`` builds every group's metadata for the same batch and returns the first group's (what the driver's
    step code reads: paths, traces); :meth:`metadata_for` gives each layer its own group's."""

    def __init__(self, groups: list):
        #: [(builder, layer names)], the first group's builder first
        self.groups = groups
        self.first = groups[0][0]
        self._by_layer: dict = {}
        self._first_md = None

    def __getattr__(self, name):
        return getattr(self.first, name)

    def _each(self, method: str, *args, **kwargs):
        mds = [(getattr(b, method)(*args, **kwargs), names) for b, names in self.groups]
        self._first_md = mds[0][0]
        self._by_layer = {name: md for md, names in mds for name in names}
        return self._first_md

    def build(self, *args, **kwargs):
        return self._each("build", *args, **kwargs)

    def build_for_cudagraph_capture(self, *args, **kwargs):
        return self._each("build_for_cudagraph_capture", *args, **kwargs)

    def build_for_drafting(self, *args, **kwargs):
        return self._each("build_for_drafting", *args, **kwargs)

    def metadata_for(self, layer_name: str, md):
        """The metadata layer ``layer_name`` runs with for the step whose first group's metadata is ``md``."""
        if md is self._first_md and layer_name in self._by_layer:
            return self._by_layer[layer_name]
        return md


#: what the V2 runner's attention groups stand in for (:func:`runner_attention_groups`)
STOOD_IN_V2 = (
    "the fields the V2 runner's init_attn_backend reads of the constructor-less Attention layers: attn_backend (what "
    "Attention.__init__ selects: the FlashAttention backend, or for a chunked local layer the release's wrapped "
    "backend, as ChunkedLocalAttention.__init__ passes it), kv_sharing_target_layer_name None (no KV sharing), "
    "num_heads (the impl's), is_draft_layer False",
    "the engine core's KV-cache config handed to the V2 runner: the release's own KV-cache groups (layers that differ: "
    "get_kv_cache_groups over the layers' own specs; chunked local layers: one group of full-attention layers, as the "
    "release lays out a model with chunked local layers when it disables the hybrid KV-cache manager), num_blocks 1, "
    "no KV-cache tensors",
)


def runner_attention_groups(cfg, raw_groups=None):
    """(KVCacheConfig, attention groups, CUDA-graph support or None) as the V2 runner makes them
    (``initialize_kv_cache`` -> ``vllm/v1/worker/gpu/attn_utils.py`` ``init_attn_backend``: per KV-cache group, one
    attention group per (backend, layer KV-cache spec[, query heads]), each with its own metadata builder; the
    weakest builder's CUDA-graph support from 0.20), for a scenario whose layers differ from the config or include
    chunked local layers. ``raw_groups``: the release's own KV-cache groups of the layers (layers that differ; None:
    one group of every layer over ``cfg.spec``). The layers get the fields ``init_attn_backend`` reads
    (:data:`STOOD_IN_V2`)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    import vllm.v1.worker.gpu.attn_utils as attn_utils

    s = cfg.s
    chunks = s["attention_chunk_size"] or [None] * len(cfg.layers)
    if any(chunks):
        from gpu_impl.engines.vllm.local import no_pinned_memory

        no_pinned_memory()  # local.FAKED_LOCAL
    for (name, layer), chunk in zip(cfg.layers.items(), chunks):
        if chunk is not None:
            from gpu_impl.engines.vllm.local import chunked_backend

            layer.attn_backend = chunked_backend(cfg.backend, chunk, s["block_size"])
        else:
            layer.attn_backend = cfg.backend
        layer.kv_sharing_target_layer_name = None
        layer.num_heads = layer.impl.num_heads
        layer.is_draft_layer = False
    groups = list(raw_groups) if raw_groups else [KVCacheGroupSpec(list(cfg.layers), cfg.spec)]
    kv_cache_config = KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=groups)
    with set_current_vllm_config(cfg.vc):
        out = attn_utils.init_attn_backend(kv_cache_config, cfg.vc, torch.device("cpu"))
    # (backends, groups) 0.18 .. 0.19; (backends, groups, support[, kernel block sizes]) 0.20 .. 0.25;
    # (groups, support, kernel block sizes) from 0.26
    attn_groups = next(x for x in out if isinstance(x, list))
    support = next((x for x in out if hasattr(x, "min_cg_support")), None)
    return kv_cache_config, attn_groups, support
