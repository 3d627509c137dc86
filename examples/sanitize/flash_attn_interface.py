"""A CPU stand-in for FA3's Python module ``flash_attn_interface`` (the hopper build's), for this example only.

It serves FA3's two functions from fa3-verify's emulated kernel (``gpu_impl.kernels.load("emulated")``: refmodel's
metadata and FA3's host steps, 132 SMs, sm90) in its "gpu-like" mode, which trusts the metadata it is given as
the real kernel does -- so the sanitizer is the only thing that checks the hand-off. On a GPU, delete this file:
the real ``flash_attn_interface`` is imported instead, and the sanitizer wraps it the same way.
"""

from gpu_impl.kernels import load

_KERNEL = load("emulated", mode="gpu-like")

get_scheduler_metadata = _KERNEL.get_scheduler_metadata
flash_attn_with_kvcache = _KERNEL.flash_attn_with_kvcache
