"""A stand-in for the CUDA-only ``sgl_kernel`` package, so sglang's Python attention backend imports on CPU.

Only ``sgl_kernel.flash_attn`` does real work: it routes FA3's entry points to the implementation the engine
driver installs (``gpu_impl.engines.sglang.driver``: the recording and checking shim over the emulator). Every
other kernel sglang names at import time resolves to a stub that raises when called, naming the kernel, so
a code path that needs a real CUDA kernel fails loudly instead of computing something wrong.
"""

__version__ = "0.0.0+fa3verify.fake"


class FakeKernelCalled(RuntimeError):
    """A CUDA kernel of the fake ``sgl_kernel`` was called: that code path cannot run on CPU here."""


class _StubMeta(type):
    """Stub names support attribute access (``scalar_types.uint4b8`` at import time) and subclassing."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(f"{cls.__qualname__}.{name}")


def _stub(name):
    def refuse(*args, **kwargs):
        raise FakeKernelCalled(f"sgl_kernel.{name} is a CUDA kernel; the fa3-verify CPU driver does not provide it")

    return _StubMeta(name.rsplit(".", 1)[-1], (), {"__init__": refuse, "__call__": refuse, "__qualname__": name})


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    import importlib.util

    if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a real fake submodule (flash_attn)
        return importlib.import_module(f"{__name__}.{name}")
    stub = _stub(name)
    globals()[name] = stub
    return stub


class _StubSubmodules:
    """Finds every other ``sgl_kernel.X`` submodule (``sparse_flash_attn``, ``kvcacheio``, ...) as an empty
    package whose names are stubs, so modules that import CUDA kernels at import time still import."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        import importlib.machinery

        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, _StubSubmodules, is_package=True)

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        prefix = module.__name__[len(__name__) + 1:]
        module.__path__ = []

        def getattr_(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _stub(f"{prefix}.{name}")

        module.__getattr__ = getattr_


def _install_finder():
    import sys

    if not any(f is _StubSubmodules for f in sys.meta_path):
        sys.meta_path.append(_StubSubmodules)


_install_finder()
