"""A stand-in for ``torchvision`` (never installed: it would replace the CPU torch with a CUDA build).

transformers and sglang's multimodal modules import torchvision names (``torchvision.io``,
``torchvision.transforms.v2.functional``, ...) at import time and read its version; sglang's attention backend
uses none of them. Every submodule is made on demand and every name in it is a stub that raises when used.
"""

import importlib.abc
import importlib.machinery
import sys

from ._stubs import module_getattr

__version__ = "0.0.0+fa3verify.fake"
__getattr__ = module_getattr("")


class _StubModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every ``torchvision.X`` submodule as an empty package whose names are stubs."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = module_getattr(module.__name__[len(__name__) + 1:])


if not any(isinstance(f, _StubModules) for f in sys.meta_path):
    sys.meta_path.append(_StubModules())
