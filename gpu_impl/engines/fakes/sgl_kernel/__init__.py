"""A stand-in for the CUDA-only ``sgl_kernel`` package, so sglang's Python attention backend imports on CPU.

Only ``sgl_kernel.flash_attn`` does real work: it routes FA3's entry points to the implementation the engine
driver installs (``gpu_impl.engines.sglang_driver``: the recording and checking shim over the emulator). Every
other kernel sglang names at import time resolves to a stub that raises when called, naming the kernel, so
a code path that needs a real CUDA kernel fails loudly instead of computing something wrong.
"""

__version__ = "0.0.0+fa3verify.fake"


class FakeKernelCalled(RuntimeError):
    """A CUDA kernel of the fake ``sgl_kernel`` was called: that code path cannot run on CPU here."""


def _stub(name):
    def missing(*args, **kwargs):
        raise FakeKernelCalled(f"sgl_kernel.{name} is a CUDA kernel; the fa3-verify CPU driver does not provide it")

    missing.__name__ = name
    missing.__qualname__ = name
    return missing


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    stub = _stub(name)
    globals()[name] = stub
    return stub
