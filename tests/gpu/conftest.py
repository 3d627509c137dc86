"""GPU tests: run only where CUDA and an FA3 module (fa3_fwd_interface, flash_attn_interface, sgl_kernel.flash_attn)
are both available; everywhere else every test here is skipped with the reason."""

from __future__ import annotations

import functools

import pytest
import torch


@functools.lru_cache(maxsize=1)
def fa3_unavailable_reason():
    """None when the real FA3 adapter can load, else why not."""
    if not torch.cuda.is_available():
        return f"CUDA not available (torch {torch.__version__}, CUDA build {torch.version.cuda})"
    from gpu_impl.errors import KernelUnavailable
    from gpu_impl.kernels.fa3 import find_fa3_module
    try:
        find_fa3_module()
    except KernelUnavailable as exc:
        return f"no FA3 module: {exc}"
    return None


def pytest_collection_modifyitems(config, items):
    """Mark every test under tests/gpu `gpu`, and skip them all (with the reason) when FA3 cannot run here."""
    for item in items:
        if "/tests/gpu/" not in str(item.fspath).replace("\\", "/"):
            continue
        item.add_marker(pytest.mark.gpu)
        reason = fa3_unavailable_reason()
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"needs CUDA and a real FA3 build: {reason}"))


@pytest.fixture(scope="session")
def fa3_strict():
    from gpu_impl.kernels import load
    return load("fa3", mode="strict")
