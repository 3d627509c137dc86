"""Fake FA3 modules for the sanitizer tests: ``sgl_kernel.flash_attn`` backed by the emulator, and a backend.

``write_fakes(dir)`` writes a package ``sgl_kernel`` (sgl_kernel 0.4.10's names: ``num_heads``, ``num_heads_k``,
``leftpad_k``) whose functions delegate to :class:`gpu_impl.kernels.emulated.EmulatedKernel` on a 16-SM
device (strict by default, gpu-like with ``FAKE_FA3_GPU_LIKE=1``), and a module ``fake_backend`` that re-binds them the ways
sglang does: a module global at import, an instance attribute (``self._get_scheduler_metadata``), and a kernel
cache dict (``_KERNELS``), plus a closure and a staticmethod that the sanitizer reports as unreachable.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

FLASH_ATTN = '''
"""Fake sgl_kernel.flash_attn (tests only): FA3's Python entry points over the emulator."""
import os

import torch

from gpu_impl.kernels.emulated import EmulatedKernel

# a 16-SM GPU keeps the worked example's shape (S_p > S_c, one long sequence) at CPU-sized lengths
_KERNEL = EmulatedKernel(mode="gpu-like" if os.environ.get("FAKE_FA3_GPU_LIKE") else "strict", num_sm=16)


def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads, num_heads_k, headdim, cache_seqlens,
                           qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None, cu_seqlens_k=None,
                           cu_seqlens_k_new=None, seqused_q=None, leftpad_k=None, page_size=None, max_seqlen_k_new=0,
                           causal=False, window_size=(-1, -1), attention_chunk=0, has_softcap=False, num_splits=0,
                           pack_gqa=None, sm_margin=0):
    return _KERNEL.get_scheduler_metadata(
        batch_size, max_seqlen_q, max_seqlen_k, num_heads, num_heads_k, headdim, cache_seqlens, qkv_dtype=qkv_dtype,
        headdim_v=headdim_v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k_new=cu_seqlens_k_new, cache_leftpad=leftpad_k,
        page_size=page_size, max_seqlen_k_new=max_seqlen_k_new, causal=causal, window_size=window_size,
        attention_chunk=attention_chunk, has_softcap=has_softcap, num_splits=num_splits, pack_gqa=pack_gqa,
        sm_margin=sm_margin)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                            cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                            scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                            return_softmax_lse=False):
    return _KERNEL.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=cache_seqlens, cache_leftpad=cache_leftpad, page_table=page_table,
        cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, softmax_scale=softmax_scale, causal=causal,
        window_size=window_size, softcap=softcap, scheduler_metadata=scheduler_metadata, num_splits=num_splits,
        pack_gqa=pack_gqa, sm_margin=sm_margin, return_softmax_lse=return_softmax_lse)


def flash_attn_combine(*args, **kwargs):
    raise NotImplementedError("not faked")
'''

BACKEND = '''
"""Fake backend (tests only): re-binds the FA3 functions as sglang's backend and dispatcher do."""
from sgl_kernel.flash_attn import flash_attn_with_kvcache

_KERNELS = {}


def _load_kernels():
    if not _KERNELS:
        from sgl_kernel.flash_attn import flash_attn_with_kvcache as fa3
        _KERNELS["flash_attn_with_kvcache"] = fa3
    return _KERNELS


def _closure_over_the_original():
    from sgl_kernel.flash_attn import get_scheduler_metadata as captured

    def precompute(*args, **kwargs):
        return captured(*args, **kwargs)

    return precompute


class StaticKernels:
    """A staticmethod over the original: a binding no sanitizer can replace without touching the class."""

    kvcache = staticmethod(flash_attn_with_kvcache)


class Backend:
    """Precomputes with H // tp heads (the pre-fix head counts) and calls with the layer's heads."""

    def __init__(self, precompute_heads):
        from sgl_kernel.flash_attn import get_scheduler_metadata

        self._get_scheduler_metadata = get_scheduler_metadata
        self.precompute_heads = precompute_heads

    def metadata(self, cache_seqlens, cu_seqlens_q, max_seqlen_k, page_size, headdim=128):
        h, hk = self.precompute_heads
        return self._get_scheduler_metadata(
            batch_size=len(cache_seqlens), max_seqlen_q=1, max_seqlen_k=max_seqlen_k, num_heads=h, num_heads_k=hk,
            headdim=headdim, cache_seqlens=cache_seqlens, cu_seqlens_q=cu_seqlens_q, page_size=page_size,
            causal=True, num_splits=0)

    def decode(self, q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, metadata, via_cache=False):
        fn = _load_kernels()["flash_attn_with_kvcache"] if via_cache else flash_attn_with_kvcache
        return fn(q=q, k_cache=k_cache, v_cache=v_cache, page_table=page_table, cache_seqlens=cache_seqlens,
                  cu_seqlens_q=cu_seqlens_q, max_seqlen_q=1, causal=True, scheduler_metadata=metadata, num_splits=0)
'''

FAKE_MODULES = ("sgl_kernel", "sgl_kernel.flash_attn", "fake_backend")


def write_fakes(directory) -> Path:
    d = Path(directory)
    (d / "sgl_kernel").mkdir(parents=True, exist_ok=True)
    (d / "sgl_kernel" / "__init__.py").write_text('"""Fake sgl_kernel (tests only)."""\n')
    (d / "sgl_kernel" / "flash_attn.py").write_text(textwrap.dedent(FLASH_ATTN))
    (d / "fake_backend.py").write_text(textwrap.dedent(BACKEND))
    return d


def forget_fakes() -> None:
    for name in FAKE_MODULES:
        sys.modules.pop(name, None)


import pytest  # noqa: E402 - the fixture below is shared by the sanitizer's test modules


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    """The fake modules on sys.path (not imported yet); everything is forgotten and uninstalled afterwards."""
    from fa3verify import sanitize

    root = write_fakes(tmp_path / "fakes")
    monkeypatch.syspath_prepend(str(root))
    forget_fakes()
    yield root
    sanitize.uninstall()
    forget_fakes()
