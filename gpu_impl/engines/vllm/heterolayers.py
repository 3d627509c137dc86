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

__all__ = ["STOOD_IN", "nemotron_nas_hf_config", "bind_model_config", "layer_kv_heads", "check_driven",
           "layer_groups", "kv_cache_groups", "GroupedBuilder"]

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


def check_driven(s: dict, numerics: bool) -> bool:
    """True where the first driver generation drives these layers; Unsupported naming the field where not."""
    if numerics or s["cuda_graph"] in ("full", "full_and_piecewise"):
        raise Unsupported(f"layer_kv_heads: driven eager and under piecewise graphs in record mode (the FULL graphs "
                          f"of several attention groups and numerics are not), got cuda_graph {s['cuda_graph']!r}"
                          f"{' with numerics' if numerics else ''}")
    return True


def layer_groups(vc, layers: dict, windows: list, spec_args: dict, how: list) -> list:
    """[(spec, layer names)]: each layer's own KV-cache spec (its KV heads; its window: vLLM's
    ``SlidingWindowSpec`` or ``FullAttentionSpec``, as ``Attention.get_kv_cache_spec`` makes them), grouped by
    :func:`kv_cache_groups`."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    specs = {}
    for (name, layer), w in zip(layers.items(), windows):
        own = dict(spec_args, num_kv_heads=layer.impl.num_kv_heads)
        specs[name] = SlidingWindowSpec(sliding_window=w, **own) if w is not None else FullAttentionSpec(**own)
    return kv_cache_groups(vc, specs, how)


def kv_cache_groups(vc, specs: dict, how: list = None) -> list:
    """[(spec, layer names)]: the release's own KV-cache grouping of ``specs`` (layer name -> spec), split as the V1
    runner splits a group into attention groups (STOOD_IN); Unsupported, naming vLLM's refusal, where the release's
    grouping refuses these layers. ``how`` (a list) gets the grouping function's name, or why it was stood in."""
    how = [] if how is None else how
    try:
        utils = _import_kv_cache_utils()
    except Exception as exc:  # noqa: BLE001 - a dependency the release's environment lacks or mismatches (STOOD_IN)
        how.append(f"stood in (vllm.v1.core.kv_cache_utils does not import: {type(exc).__name__}: {exc}): layers "
                   f"grouped by their spec")
        return _by_spec(specs, list(specs))
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
    out = []
    for group in groups:
        spec = group.kv_cache_spec
        per_layer = getattr(spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs: one attention group per spec
        if per_layer is None:
            out.append((spec, list(group.layer_names)))
            continue
        out.extend(_by_spec(per_layer, group.layer_names))
    return out


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
