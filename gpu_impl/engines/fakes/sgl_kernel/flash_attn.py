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


def flash_attn_with_kvcache(*args, **kwargs):
    return _impl().flash_attn_with_kvcache(*args, **kwargs)


def flash_attn_varlen_func(*args, **kwargs):
    return _impl().flash_attn_varlen_func(*args, **kwargs)
