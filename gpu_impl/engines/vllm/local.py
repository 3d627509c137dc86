"""Chunked local attention (vLLM's ``attention_chunk_size``, Llama 4's chunked local layers) for the first driver
generation: the layers with a chunk size are built on the release's own wrapped backend
(``create_chunked_local_attention_backend``, ``vllm/attention/layers/chunked_local_attention.py`` 0.10.1 .. 0.13.0,
``vllm/model_executor/layers/attention/chunked_local_attention.py`` from 0.14.0), whose metadata builder turns each
batch into virtual batches (``make_local_attention_virtual_batches``) and then runs the FlashAttention builder.

Invariant: nothing of vLLM is re-typed here. The wrapped backend, its builder class, its ``build`` (virtual batches,
then the FlashAttention builder's precompute) and its CUDA-graph support are the release's; the layers' impl is the
wrapped backend's ``get_impl_cls()``. What the driver decides: which layers are chunked (the scenario's per-layer
``attention_chunk_size``), and one KV-cache group for all layers with the full-attention spec and block table, as
vLLM lays out a model with chunked local layers by default (from 0.10.1 ``VllmConfig`` disables the hybrid KV-cache
manager for such models unless ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE`` is set, and the KV-cache planner
then turns a ``ChunkedLocalAttentionSpec`` into a ``FullAttentionSpec``: one block table); the attention groups of
that KV-cache group differ by backend, so the chunked layers get a builder of their own over the same spec.

CUDA graphs, as the release's runner resolves them (``_check_and_update_cudagraph_mode``; from 0.20.0 the config's
``resolve_cudagraph_mode_and_sizes``): the wrapped builder declares ``AttentionCGSupport.NEVER`` from 0.11.0, and a
mode whose mixed batches run FULL graphs is then refused by vLLM ("please try cudagraph_mode=PIECEWISE"): such a
scenario is refused with vLLM's message. 0.10.1 .. 0.10.2's wrapped builder keeps the FlashAttention builder's
support (ALWAYS): full graphs over chunked local layers are accepted by those releases and driven (the capture
builds each chunked group with the release's ``build_for_cudagraph_capture``; a replay re-issues the captured calls).
Piecewise graphs run the attention eagerly on the batch's own metadata and are driven.
"""

from __future__ import annotations

import inspect

from gpu_impl.engines.protocol import Unsupported

__all__ = ["LOCAL_MODULES", "FAKED_LOCAL", "chunked_backend", "LocalGroups", "refuse_unsupported", "capture_layer_metadata",
           "release_stops_on_buffer_overflow", "runner_v2_mode"]

#: What the chunked local path fakes besides ``vllm_glue.FAKED`` (only in a scenario with chunked layers).
FAKED_LOCAL = (
    "vllm.utils.torch_utils.PIN_MEMORY: False (vLLM read it from the faked platform at import; a CPU torch has no "
    "pinned-memory allocator, and make_local_attention_virtual_batches stages its index arrays through "
    "async_tensor_h2d, which would pin them); where the release asks is_pin_memory_available() at each call "
    "instead (0.32.0: vllm.utils.torch_utils binds it from platform_utils), that name answers False",
)

#: where the release keeps ``create_chunked_local_attention_backend`` (it moved in 0.14.0); the first that imports
LOCAL_MODULES = ("vllm.model_executor.layers.attention.chunked_local_attention",
                 "vllm.attention.layers.chunked_local_attention")


def _create():
    """The release's ``create_chunked_local_attention_backend``; Unsupported naming the modules where it has none."""
    import importlib

    errors = []
    for name in LOCAL_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name} ({type(exc).__name__}: {exc})")
            continue
        if hasattr(module, "create_chunked_local_attention_backend"):
            return module.create_chunked_local_attention_backend
        errors.append(f"{name} (no create_chunked_local_attention_backend)")
    raise Unsupported("attention_chunk_size: this release has no wrapped chunked-local backend: " + "; ".join(errors))


def chunked_backend(base_backend, chunk: int, block_size: int):
    """The release's wrapped backend over ``base_backend`` for chunk size ``chunk`` (0.10.1 .. 0.10.2 take the block
    size as a third argument)."""
    create = _create()
    args = (base_backend, chunk, block_size)[:len(inspect.signature(create).parameters)]
    return create(*args)


def _support(builder_cls, vc, spec):
    """The wrapped builder's CUDA-graph support as the release declares it (a classmethod from 0.12.0, the class
    attribute ``cudagraph_support`` before)."""
    get = getattr(builder_cls, "get_cudagraph_support", None)
    if get is not None:
        try:
            return get(vc, spec)
        except TypeError:
            pass
    return getattr(builder_cls, "cudagraph_support", None) or getattr(builder_cls, "_cudagraph_support", None)


def refuse_unsupported(vc, s: dict, builder_cls, spec) -> None:
    """Refuses, as the release's runner would or with the reason it is not driven, a chunked-local scenario under a
    CUDA-graph mode with FULL graphs (module doc); the other paths it is not driven with."""
    if s["dcp"] > 1:
        raise Unsupported("dcp: decode context parallel over chunked local layers is not driven")
    if s["draft_tokens"]:
        raise Unsupported("draft_tokens: a drafter over chunked local layers is not driven")
    if s["cuda_graph"] not in ("full", "full_and_piecewise"):
        return
    support = _support(builder_cls, vc, spec)
    name = getattr(support, "name", str(support))
    if name != "NEVER":
        # 0.10.1 .. 0.10.2: the wrapped builder keeps the FlashAttention builder's support (ALWAYS) and the runner
        # accepts the mode: driven (the capture builds each group with its build_for_cudagraph_capture, the
        # wrapped build's virtual batches included; LocalGroups.build_for_capture)
        return
    if s["cuda_graph"] == "full_and_piecewise":
        raise Unsupported("cuda_graph: full_and_piecewise: the chunked local builder declares NEVER, and the runner's "
                          "downgrade of the mode (to PIECEWISE or NONE) is not imitated by this driver generation")
    resolve = getattr(vc.compilation_config, "resolve_cudagraph_mode_and_sizes", None)
    if resolve is None:  # before 0.20.0 the same rule is inline in the runner's _check_and_update_cudagraph_mode
        raise Unsupported(f"cuda_graph: full: vLLM refuses CUDAGraphMode.FULL with the chunked local attention "
                          f"backend (support: {name}; gpu_model_runner._check_and_update_cudagraph_mode raises "
                          "ValueError: 'please try cudagraph_mode=PIECEWISE')")
    params = inspect.signature(resolve).parameters
    given = {"min_cg_support": support, "min_cg_attn_backend": builder_cls.__name__,
             "uniform_decode_query_len": 1, "use_v2_model_runner": False}
    try:
        resolve(**{k: v for k, v in given.items() if k in params})
    except ValueError as exc:
        raise Unsupported(f"cuda_graph: full: vLLM's resolve_cudagraph_mode_and_sizes refuses it: {exc}") from exc
    raise Unsupported("cuda_graph: full: vLLM resolved another mode for the chunked local backend "
                      f"({vc.compilation_config.cudagraph_mode}); not driven")


def no_pinned_memory() -> None:
    """:data:`FAKED_LOCAL`: no pinned staging on a CPU torch."""
    import torch

    try:
        import vllm.utils.torch_utils as torch_utils
    except ImportError:  # releases before the module (0.10.x) take pin_memory as an argument
        return
    if torch.cuda.is_available():
        return
    if getattr(torch_utils, "PIN_MEMORY", False):
        torch_utils.PIN_MEMORY = False
    if callable(getattr(torch_utils, "is_pin_memory_available", None)):
        torch_utils.is_pin_memory_available = lambda: False


class LocalGroups:
    """The chunked layers' attention groups: per chunk size the release's wrapped backend, its builder over the
    KV-cache group's spec, and the layers it builds for."""

    def __init__(self, vc, s: dict, base_backend, spec, layer_chunks: dict, device):
        no_pinned_memory()
        self.groups = []
        by_chunk: dict = {}
        for name, chunk in layer_chunks.items():
            by_chunk.setdefault(chunk, []).append(name)
        for chunk, names in sorted(by_chunk.items()):
            backend = chunked_backend(base_backend, chunk, s["block_size"])
            builder_cls = backend.get_builder_cls()
            refuse_unsupported(vc, s, builder_cls, spec)
            self.groups.append((chunk, backend, builder_cls(spec, names, vc, device), names))

    def backend_for(self, chunk: int):
        return next(backend for c, backend, _, _ in self.groups if c == chunk)

    def build_for_capture(self, cam) -> dict:
        """Each chunked layer's metadata for a FULL graph's capture batch: its group's ``build_for_cudagraph_capture``,
        as the V1 runner's ``_dummy_run`` builds every attention group (0.10.1 ``gpu_model_runner.py`` 2338-2340; the
        base class's calls the wrapped ``build``, so the capture's virtual batches are made as new tensors)."""
        out = {}
        for _, _, builder, names in self.groups:
            md = builder.build_for_cudagraph_capture(cam)
            out.update({name: md for name in names})
        return out

    def build(self, prefix: int, cam) -> dict:
        """Each chunked layer's metadata for one batch: its group's ``build`` (the release's virtual batches, then
        the FlashAttention builder's precompute), once per group as the runner builds once per attention group."""
        if prefix:
            raise Unsupported("common_prefix: cascade attention over chunked local layers is not driven")
        out = {}
        for _, _, builder, names in self.groups:
            with release_stops_on_buffer_overflow(builder):
                md = builder.build(prefix, cam)
            out.update({name: md for name in names})
        return out


class release_stops_on_buffer_overflow:  # noqa: N801 - a context manager, named for what it reports
    """Around a chunked group's build under a full CUDA graph: the FlashAttention builder copies its precompute into
    its persistent buffer of ``max_num_seqs + 1`` int32 (``self.scheduler_metadata[:n] = scheduler_metadata``,
    ``vllm/v1/attention/backends/flash_attn.py`` 296 in 0.10.0, 330 in 0.10.1, 329 in 0.10.2), while the virtual
    batches of a batch may outnumber ``max_num_seqs`` (one per request and chunk its new tokens touch): the release
    itself raises there (RuntimeError, loud, before any FA3 call), so it does not run the step; Unsupported naming
    that. Other errors pass."""

    def __init__(self, builder):
        self.builder = builder

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        buffer = getattr(self.builder, "scheduler_metadata", None)
        if kind is not RuntimeError or buffer is None or "must match" not in str(exc):
            return False
        raise Unsupported(
            f"attention_chunk_size: the chunked local builder copies its metadata over the step's virtual batches into "
            f"its persistent buffer of max_num_seqs + 1 = {buffer.numel()} int32 under a full CUDA graph, and the "
            f"step has more virtual batches than max_num_seqs: vLLM raises there (flash_attn.py "
            f"'self.scheduler_metadata[:n] = scheduler_metadata': {' '.join(str(exc).split())[:120]})") from exc


def capture_layer_metadata(rule: str, layer_names: list, chunks, local_md: dict) -> dict:
    """The chunked groups' capture metadata by layer (a layer absent: the global group's), as the release's
    ``_dummy_run`` assigns it (``rule``, graphs.json ``capture_metadata_layers``): 'attention_group', each layer its own
    group's; 'kv_cache_group' (0.10.1 .. 0.10.2), every layer of the KV-cache group the metadata of its last attention
    group, the groups made in the order of their backend's first layer (``chunks``: each layer's chunk size, None for
    a global layer; one group per chunk size, as one wrapped backend per size)."""
    if rule == "attention_group":
        return local_md
    order: list = []
    for chunk in chunks:
        if chunk not in order:
            order.append(chunk)
    if order[-1] is None:
        return {}   # the global layers' group is the last: every layer reads its capture metadata
    last = next(local_md[name] for name, chunk in zip(layer_names, chunks) if chunk == order[-1])
    return {name: last for name in layer_names}


def runner_v2_mode(vc, s: dict, attn_groups, support):
    """The CUDA-graph mode name (``NONE``, ``PIECEWISE``, ``FULL``, ``FULL_AND_PIECEWISE``) under which the V2 runner
    runs a model with chunked local layers, decided by the release's own code: from 0.20 its ``initialize_kv_cache``
    passes the weakest attention group's support (``support``, from ``init_attn_backend``; the wrapped builder
    declares NEVER) to ``CompilationConfig.resolve_cudagraph_mode_and_sizes``, which raises for a mode whose mixed
    batches run FULL graphs ("please try cudagraph_mode=PIECEWISE": refused here with vLLM's text) and downgrades
    FULL_AND_PIECEWISE (its decode graphs FULL) to PIECEWISE or NONE; resolved on a copy of the compilation config
    (only the mode is taken), with ``piecewise_capture_available`` True (the model compiled by vLLM, as a GPU run
    compiles it). Before 0.20 the V2 runner takes the configured mode without asking the backends, so FULL graphs
    over chunked local layers are accepted by the release and are refused here as not driven (paths.json
    ``local_attention.not_covered`` "v2 full graph@no-resolve")."""
    import copy

    from gpu_impl.engines.vllm.paths import local_not_driven

    if s["dcp"] > 1:
        raise Unsupported("dcp: decode context parallel over chunked local layers is not driven")
    if s["draft_tokens"]:
        raise Unsupported("draft_tokens: a drafter over chunked local layers is not driven")
    mode = vc.compilation_config.cudagraph_mode
    if s["cuda_graph"] == "none":
        return mode.name
    if support is None:
        if mode.has_full_cudagraphs():
            raise Unsupported(f"cuda_graph: {s['cuda_graph']}: " + local_not_driven("v2 full graph@no-resolve"))
        return mode.name
    compilation = copy.copy(vc.compilation_config)
    resolve = compilation.resolve_cudagraph_mode_and_sizes
    params = inspect.signature(resolve).parameters
    given = {"min_cg_support": support.min_cg_support, "min_cg_attn_backend": support.min_cg_attn_backend,
             "uniform_decode_query_len": 1, "use_v2_model_runner": True,
             "tensor_parallel_size": s["tp"], "piecewise_capture_available": True}
    try:
        resolved = resolve(**{k: v for k, v in given.items() if k in params})
    except ValueError as exc:
        raise Unsupported(f"cuda_graph: {s['cuda_graph']}: vLLM's resolve_cudagraph_mode_and_sizes refuses it: "
                          f"{exc}") from exc
    return resolved.name
