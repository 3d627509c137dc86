"""The FA3 entry points of ``sgl_kernel.flash_attn``, routed to the implementation the engine driver installs.

sglang imports ``get_scheduler_metadata`` from here inside ``FlashAttentionBackend.__init__`` and its FA3
dispatcher (``flash_attention_v3.py``) loads ``flash_attn_with_kvcache`` / ``flash_attn_varlen_func`` from here,
so both sides of the metadata contract go through :func:`install`'s object (``gpu_impl.fa3_calls.CheckingFA3``).
"""

_IMPL = None


def install(impl) -> None:
    """Route every FA3 entry point below to ``impl`` (an object with the three FA3 functions)."""
    global _IMPL
    _IMPL = impl


def _impl():
    if _IMPL is None:
        raise RuntimeError("sgl_kernel.flash_attn (fake): no FA3 implementation installed by the driver")
    return _IMPL


def get_scheduler_metadata(*args, **kwargs):
    return _impl().get_scheduler_metadata(*args, **kwargs)


#: Positional order of sgl_kernel's ``flash_attn_with_kvcache`` (sgl-kernel 0.4.x; sglang <= 0.5.17 passes every
#: argument positionally): FA3's parameters, then ``sinks``. Positional arguments are handed on by name.
CALL_POSITIONAL = (
    "q", "k_cache", "v_cache", "k", "v", "qv", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx",
    "cache_leftpad", "page_table", "cu_seqlens_q", "cu_seqlens_k_new", "max_seqlen_q", "rotary_seqlens",
    "q_descale", "k_descale", "v_descale", "softmax_scale", "causal", "window_size", "attention_chunk", "softcap",
    "rotary_interleaved", "scheduler_metadata", "num_splits", "pack_gqa", "sm_margin", "return_softmax_lse",
    "sinks")


#: Arguments of sgl_kernel's Python front whose ``None`` stands for FA3's own default (sglang 0.5.23 passes
#: ``attention_chunk=None``): what the front hands FA3's ``mha_fwd``.
NONE_MEANS_FA3_DEFAULT = {"attention_chunk": 0, "softcap": 0.0, "window_size": (-1, -1), "num_splits": 0,
                          "sm_margin": 0}


def fa3_arguments(named: dict) -> dict:
    """The front's arguments as FA3 takes them: ``None`` defaults replaced (:data:`NONE_MEANS_FA3_DEFAULT`),
    ``only_qv=False`` dropped (FA3's plain path; sglang 0.5.23's wrapper always passes it), ``sinks`` and
    ``only_qv=True`` refused as not modelled; ``out`` is left to the caller."""
    named = dict(named)
    for name, default in NONE_MEANS_FA3_DEFAULT.items():
        if name in named and named[name] is None:
            named[name] = default
    if named.get("sinks") is not None:
        raise NotImplementedError("flash_attn_with_kvcache(sinks=...): attention sinks are not modelled")
    if named.pop("only_qv", False):
        raise NotImplementedError("flash_attn_with_kvcache(only_qv=True): the rope-free qv-only path is not modelled")
    named.pop("sinks", None)
    return named


def flash_attn_with_kvcache(*args, **kwargs):
    if len(args) > len(CALL_POSITIONAL):
        raise TypeError(f"flash_attn_with_kvcache: at most {len(CALL_POSITIONAL)} positional arguments, "
                        f"got {len(args)}")
    named = dict(zip(CALL_POSITIONAL, args))
    overlap = set(named) & set(kwargs)
    if overlap:
        raise TypeError(f"flash_attn_with_kvcache: {sorted(overlap)} given by position and by name")
    named.update(kwargs)
    named = fa3_arguments(named)
    out = named.pop("out", None)
    q, k_cache, v_cache = named.pop("q"), named.pop("k_cache"), named.pop("v_cache")
    result = _impl().flash_attn_with_kvcache(q, k_cache, v_cache, **named)
    if out is None:
        return result
    # sgl_kernel writes the attention output into ``out`` and returns it (with the LSE when asked for)
    first = result[0] if isinstance(result, (tuple, list)) else result
    out.copy_(first.reshape(out.shape).to(out.dtype))  # a view of the batch's buffer: same elements, its shape
    return (out, *result[1:]) if isinstance(result, (tuple, list)) else out


def flash_attn_varlen_func(*args, **kwargs):
    return _impl().flash_attn_varlen_func(*args, **kwargs)
