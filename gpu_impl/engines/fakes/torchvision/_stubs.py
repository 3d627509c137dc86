"""Stub names for the fake torchvision: attribute access works (``InterpolationMode.BICUBIC`` in a default
argument), subclassing works, and calling or instantiating raises, naming what was called."""


class TorchvisionNotInstalled(RuntimeError):
    """Code under the fa3-verify CPU driver called into torchvision, which is deliberately absent."""


class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return stub(f"{cls.__qualname__}.{name}")


def stub(name: str):
    def refuse(*args, **kwargs):
        raise TorchvisionNotInstalled(f"torchvision.{name}: torchvision is a stand-in under the fa3-verify driver")

    return _StubMeta(name.rsplit(".", 1)[-1], (), {"__init__": refuse, "__qualname__": name,
                                                   "__call__": refuse})


def module_getattr(prefix: str):
    """A module ``__getattr__`` that hands out stubs named ``prefix.NAME``."""

    def getattr_(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return stub(f"{prefix}.{name}" if prefix else name)

    return getattr_
