"""Version glue for driving sglang's FlashAttention backend on CPU: where each release reads its parallel layout,
and the CPU patches docs/facts-engines.md section 2 lists. Runs inside an engine environment (imports sglang lazily).

Invariant: a rank's layout is set only through that release's own reading points (docs/facts-engines.md section 2):
``model_runner.tp_size`` / ``attn_cp_size`` and server-args fields (<= 0.5.15), ``model_runner.ps``
(0.5.16 - 0.5.20), ``runtime_context.get_parallel()`` overrides (0.5.18+); the tables below are the only place
that says which release reads what. Nothing here computes a head count or a guard: the release's code does.
"""

from __future__ import annotations

import contextlib

from gpu_impl.engines.sglang import recipes

#: (first, last, places the release reads the layout from). "runner": attributes of the model runner;
#: "server_args": the runner's ServerArgs fields; "ps": attributes of ``model_runner.ps``; "parallel":
#: ``get_parallel().override(...)`` fields (only those the release declares are passed).
LAYOUT_READERS = (
    ("0.5.11", "0.5.15", ("runner", "server_args")),
    ("0.5.16", "0.5.17", ("runner", "server_args", "ps")),
    ("0.5.18", "0.5.20", ("runner", "ps", "parallel")),
    ("0.5.21", "0.5.23", ("parallel",)),
)

#: sglang attribute name -> the layout quantity it holds (see :func:`layout_values`), per reading place.
RUNNER_ATTRS = {"tp_size": "tp_size", "dp_size": "dp_size", "attn_cp_size": "attn_cp_size"}
SERVER_ARGS_FIELDS = {"tp_size": "tp_size", "dp_size": "dp_size", "attn_cp_size": "attn_cp_size",
                      "enable_dp_attention": "enable_dp_attention", "enable_prefill_cp": "enable_prefill_cp",
                      "cp_strategy": "cp_strategy", "enable_deterministic_inference": "enable_deterministic_inference",
                      "disable_cuda_graph": "disable_cuda_graph"}
#: Older names of a server-args switch (0.5.13 calls prefill CP ``enable_prefill_context_parallel``).
SERVER_ARGS_ALIASES = {"enable_prefill_cp": ("enable_prefill_context_parallel",)}
PS_ATTRS = {"tp_size": "tp_size", "tp_rank": "tp_rank", "attn_tp_size": "attn_tp_size",
            "attn_cp_size": "attn_cp_size", "attn_dp_size": "attn_dp_size", "attn_dp_rank": "attn_dp_rank",
            "dp_size": "dp_size", "moe_dp_size": "one", "moe_ep_size": "one"}
PARALLEL_FIELDS = {"tp_size": "tp_size", "dp_size": "dp_size", "attn_tp_size": "attn_tp_size",
                   "attn_cp_size": "attn_cp_size", "attn_dp_size": "attn_dp_size", "attn_dp_rank": "attn_dp_rank",
                   "attn_tp_rank": "zero", "attn_cp_rank": "zero", "attn_dcp_rank": "zero",
                   "enable_dp_attention": "enable_dp_attention", "attn_dp_enabled": "enable_dp_attention",
                   "enable_prefill_cp": "enable_prefill_cp", "cp_strategy": "cp_strategy", "tp_rank": "tp_rank",
                   "moe_tp_size": "tp_size", "moe_ep_size": "one", "moe_dp_size": "one",
                   "tp_group": "tp_group", "attn_tp_group": "attn_tp_group", "attn_cp_group": "attn_cp_group"}


def readers(release: str) -> tuple:
    key = recipes.release_key(release)
    for first, last, places in LAYOUT_READERS:
        if recipes.release_key(first) <= key[:3] + (0,) and key[:3] <= recipes.release_key(last)[:3]:
            return places
    return LAYOUT_READERS[-1][2]


def layout_values(server, dp_rank: int) -> dict:
    """The layout quantities of one attention rank (rank 0 of its attention-TP and CP groups).

    0.5.18+ validate a layout override against the process groups' widths; no process group exists here, so the
    groups are stand-ins that carry only ``world_size`` and ``rank_in_group`` (faked: no communication runs on
    the decode path driven).
    """
    from types import SimpleNamespace

    def group(n):
        return SimpleNamespace(world_size=n, rank_in_group=0, rank=0)

    return {"tp_rank": dp_rank * server.attn_cp_size * server.attn_tp_size, "one": 1,
            "tp_group": group(server.tp_size), "attn_tp_group": group(server.attn_tp_size),
            "attn_cp_group": group(server.attn_cp_size),"tp_size": server.tp_size, "dp_size": server.dp_size, "attn_tp_size": server.attn_tp_size,
            "attn_cp_size": server.attn_cp_size, "attn_dp_size": server.attn_dp_size, "attn_dp_rank": dp_rank,
            "enable_dp_attention": server.enable_dp_attention, "enable_prefill_cp": server.enable_prefill_cp,
            "cp_strategy": server.cp_strategy or ("zigzag" if server.enable_prefill_cp else None),
            "enable_deterministic_inference": server.enable_deterministic_inference,
            "disable_cuda_graph": not server.cuda_graph, "zero": 0}


def apply_runner_layout(release: str, runner, values: dict) -> None:
    """Write the layout into the runner and its server args where this release reads them."""
    places = readers(release)
    if "runner" in places:
        for attr, q in RUNNER_ATTRS.items():
            setattr(runner, attr, values[q])
    if "server_args" in places and getattr(runner, "server_args", None) is not None:
        from gpu_impl.engines.sglang.validation import declared_fields

        declared = declared_fields(type(runner.server_args))
        for attr, q in SERVER_ARGS_FIELDS.items():
            set_field(runner.server_args, attr, values[q])
            for alias in SERVER_ARGS_ALIASES.get(attr, ()):
                if alias in declared:  # the release's own name for the same switch
                    set_field(runner.server_args, alias, values[q])
    if "ps" in places:
        _apply_ps(runner, values)


#: Server-args fields merged into the kit's ``get_context().override_server_args(...)`` (0.5.16+ kits publish a
#: ServerArgs that way; the backend then reads e.g. ``get_exec().deterministic``): only fields the release declares.
OVERRIDE_SERVER_ARGS = ("tp_size", "dp_size", "attn_cp_size", "enable_dp_attention", "enable_prefill_cp",
                        "cp_strategy", "enable_deterministic_inference")


@contextlib.contextmanager
def kit_server_args(dense, values: dict):
    """While the kit's MockModelRunner is built: its ``override_server_args(...)`` call also carries this rank's
    layout and determinism (where the kit publishes server args that way), else nothing changes."""
    get_context = getattr(dense, "get_context", None)
    if get_context is None:
        yield
        return
    from sglang.srt.server_args import ServerArgs

    from gpu_impl.engines.sglang.validation import declared_fields

    declared = declared_fields(ServerArgs)
    extra = {k: values[k] for k in OVERRIDE_SERVER_ARGS if k in declared and values.get(k) is not None}

    class _Context:
        def __init__(self, ctx):
            self._ctx = ctx

        def override_server_args(self, **fields):
            return self._ctx.override_server_args(**{**fields, **extra})

        def __getattr__(self, name):
            return getattr(self._ctx, name)

    dense.get_context = lambda: _Context(get_context())
    try:
        yield
    finally:
        dense.get_context = get_context


def _apply_ps(runner, values: dict) -> None:
    """``model_runner.ps``: rebuilt with the release's own ``ParallelState.trivial(**overrides)`` (0.5.16+) for
    the fields that class declares; a plain namespace where the runner has none."""
    import dataclasses
    from types import SimpleNamespace

    ps = getattr(runner, "ps", None)
    wanted = {attr: values[q] for attr, q in PS_ATTRS.items()}
    if ps is not None and hasattr(type(ps), "trivial"):
        declared = ({f.name for f in dataclasses.fields(ps)} if dataclasses.is_dataclass(ps)
                    else set(getattr(type(ps), "__annotations__", {})))
        runner.ps = type(ps).trivial(**{k: v for k, v in wanted.items() if k in declared})
        return
    ps = ps if ps is not None else SimpleNamespace()
    for attr, value in wanted.items():
        set_field(ps, attr, value)
    runner.ps = ps


def set_field(obj, name, value) -> None:
    try:
        setattr(obj, name, value)
    except (AttributeError, TypeError):  # a read-only property caching through _name (ServerArgs)
        setattr(obj, f"_{name}", value)


@contextlib.contextmanager
def parallel_layout(release: str, values: dict):
    """``get_parallel().override(...)`` with this rank's layout where the release reads it (0.5.18+), else a no-op."""
    if "parallel" not in readers(release):
        yield
        return
    from sglang.srt import runtime_context as rc

    # the fields the release's override accepts: ``_parallel_fields()`` (0.5.21+) or the ``_PARALLEL_FIELDS``
    # constant (0.5.18 - 0.5.20, where the DP-attention / prefill-CP switches are config leaves published from
    # the server args, not override fields)
    if hasattr(rc, "_parallel_fields"):
        declared = rc._parallel_fields()
    else:
        declared = getattr(rc, "_PARALLEL_FIELDS", None) or set(PARALLEL_FIELDS)
    kwargs = {name: values[q] for name, q in PARALLEL_FIELDS.items() if name in declared}
    with rc.get_parallel().override(**kwargs):
        yield


def patch_for_cpu(fb_module) -> list:
    """The patches docs/facts-engines.md section 2 lists, applied once; returns what was patched (for the trace).

    - FA3 "supported" probe of the dispatcher -> True (it asks the CUDA device);
    - ``get_device_capability`` in the attention registry and the backend module -> (9, 0) (an H100/H200);
    - the Triton kernel ``normal_decode_set_metadata`` (CUDA-graph replay) -> :func:`torch_decode_set_metadata`.
    """
    import importlib

    patched = []
    for name in ("sglang.kernels.ops.attention.flash_attention_v3", "sglang.jit_kernel.flash_attention_v3",
                 "sglang.srt.layers.attention.flash_attention_v3"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        for probe in ("_is_fa3_supported", "is_fa3_supported"):
            if hasattr(mod, probe):
                fn = getattr(mod, probe)
                setattr(mod, probe, lambda *a, **k: True)
                patched.append(f"{name}.{probe}")
                if hasattr(fn, "cache_clear"):
                    fn.cache_clear()
    for name in ("sglang.srt.layers.attention.attention_registry", fb_module.__name__):
        mod = importlib.import_module(name)
        if hasattr(mod, "get_device_capability"):
            mod.get_device_capability = lambda *a, **k: (9, 0)
            patched.append(f"{name}.get_device_capability")
    if hasattr(fb_module, "normal_decode_set_metadata"):
        fb_module.normal_decode_set_metadata = torch_decode_set_metadata_for(fb_module.normal_decode_set_metadata)
        patched.append(f"{fb_module.__name__}.normal_decode_set_metadata")
    return patched


def torch_decode_set_metadata_for(original):
    """A torch stand-in for sglang's Triton ``normal_decode_set_metadata`` (a Triton launch fails on CPU), taking
    the arguments of ``original`` (its signature changed between releases) by name."""
    import functools
    import inspect

    sig = inspect.signature(original)

    @functools.wraps(original)
    def stand_in(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return torch_decode_set_metadata(**bound.arguments)

    return stand_in


def torch_decode_set_metadata(cache_seqlens_int32, cu_seqlens_k, page_table, req_to_token, req_pool_indices,
                              max_seq_pages, seq_lens, seq_len_delta=0, page_size=1, swa_page_table=None,
                              token_to_kv_pool=None, strided_indices=None, full_to_swa_index_mapping=None,
                              skip_page_table=False, full_v2p=None, swa_v2p=None, zero_tail=False, **_unused):
    """What sglang's Triton ``normal_decode_set_metadata`` writes, from its docstrings (``triton_ops/metadata.py``
    0.5.13, ``kernels/ops/attention/metadata.py`` 0.5.23): for every row of ``cache_seqlens_int32``,
    ``cache_seqlens = seq_lens + delta`` (int32) and ``cu_seqlens_k[1:] = cumsum``; page table columns
    ``< max_seq_pages`` become ``req_to_token[req, col * page_size] // page_size`` (with ``strided_indices``
    (0.5.13) the gather columns are ``strided_indices[col]``; 0.5.23 rewrites only each row's live prefix,
    ``ceil(len / page_size)`` columns, and with ``zero_tail`` zeroes the rest up to ``max_seq_pages``;
    ``skip_page_table`` leaves the table alone). Simplified: the sliding-window page table and the unified-memory
    page maps are not modelled (the driver runs no SWA layer and no unified memory); such a call raises.
    """
    import torch

    if (swa_page_table is not None and (token_to_kv_pool is not None or full_to_swa_index_mapping is not None
                                        or swa_v2p is not None)) or full_v2p is not None:
        raise NotImplementedError("torch_decode_set_metadata: SWA page tables / v2p translation are not modelled")
    bs = int(cache_seqlens_int32.shape[0])
    lens = seq_lens[:bs].to(torch.int64) + int(seq_len_delta or 0)
    cache_seqlens_int32.copy_(lens.to(cache_seqlens_int32.dtype))
    cu_seqlens_k[1:bs + 1].copy_(torch.cumsum(lens, 0).to(cu_seqlens_k.dtype))
    width = min(int(max_seq_pages), page_table.shape[1])
    if skip_page_table or width == 0:
        return
    page = int(page_size)
    if strided_indices is not None:
        cols = strided_indices[:width].to(torch.int64)
    else:
        cols = torch.arange(width, device=req_to_token.device) * page
    cols = cols.clamp(max=req_to_token.shape[1] - 1)
    rows = (req_to_token[req_pool_indices[:bs].to(torch.int64)][:, cols] // page).to(page_table.dtype)
    if strided_indices is not None:  # 0.5.13: every column below max_seq_pages
        page_table[:bs, :width].copy_(rows)
        return
    live = torch.arange(width)[None, :] < ((lens + page - 1) // page)[:, None]
    old = page_table[:bs, :width]
    fill = torch.zeros_like(old) if zero_tail else old
    page_table[:bs, :width].copy_(torch.where(live, rows, fill))


def kit_modules(release: str) -> dict:
    """The release's attention test kit (``sglang.test.kits.attention_unittest``, from 0.5.13), or for a release
    without one (0.5.11, 0.5.12) our stand-in for it (``sglang_standin``). A kit that exists but does not import
    raises (the ImportError names the module)."""
    import importlib
    import importlib.util

    try:
        present = importlib.util.find_spec("sglang.test.kits.attention_unittest") is not None
    except ImportError:
        present = False
    if not present:
        from gpu_impl.engines.sglang import standin as sglang_standin

        return {**sglang_standin.load(), "standin": True}
    dense = importlib.import_module("sglang.test.kits.attention_unittest.attention_methods.dense_attention")
    graph = importlib.import_module("sglang.test.kits.attention_unittest.runner_modes.cuda_graph_decode_runner")
    return {"dense": dense, "graph": graph, "standin": False}
