"""Which FA3 entry points the sanitizer wraps, and how it replaces every binding of them (and puts them back).

Invariant: while installed, every reachable binding of a wrapped FA3 function (a module global, a class or
instance attribute, a value in a plain dict such as a kernel cache) is the wrapper; after uninstall each one is
the original again, identity-equal. Bindings that cannot be replaced (closure cells, default arguments,
tuples, partials) are reported by name, never skipped silently.

Entry points (docs/facts-engines.md sections 1, 3 and 4): FA3's own interfaces (:data:`FA3_ENTRY_POINTS`:
``sgl_kernel.flash_attn`` (sgl-kernel 0.4.10), ``flash_attn_interface`` (FA3 hopper build), ``fa3_fwd_interface``
(the fa3-fwd package)) and the FA3 fronts each engine's own code defines (an engine fork of FA3's interface, an
engine's own front that sees the call even when the kernel comes from a hub build), which its plugin lists
(``EnginePlugin.sanitizer_entry_points``, its folder's ``words.json``). Re-binding modules (:data:`KNOWN_REBINDERS`:
the engines' dispatchers, backends and helpers, ``EnginePlugin.sanitizer_rebinders``) need no list to be patched
-- every referrer of an original is found with ``gc`` -- the list only says which ones a status report expects.
"""

from __future__ import annotations

import functools
import gc
import importlib.abc
import inspect
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable, Optional

from gpu_impl.plugin import sanitizer_targets

#: FA3's own interfaces: module -> {function name: kind}; kind "precompute", "call" (flash_attn_with_kvcache),
#: "varlen" (flash_attn_varlen_func).
FA3_ENTRY_POINTS: dict[str, dict[str, str]] = {
    "sgl_kernel.flash_attn": {"get_scheduler_metadata": "precompute", "flash_attn_with_kvcache": "call"},
    "flash_attn_interface": {"get_scheduler_metadata": "precompute", "flash_attn_with_kvcache": "call"},
    "fa3_fwd_interface": {"get_scheduler_metadata": "precompute", "flash_attn_with_kvcache": "call"},
}

#: Every wrapped module -> {function name: kind}: FA3's own and the fronts the engines' code defines.
#: Modules known to re-bind the entry points at import (reported by :func:`status`; patched like any other).
_ENGINE_POINTS, KNOWN_REBINDERS = sanitizer_targets()
ENTRY_POINTS: dict[str, dict[str, str]] = {**FA3_ENTRY_POINTS, **_ENGINE_POINTS}

_depth = threading.local()


def positional_names(fn: Callable) -> Optional[tuple]:
    """The names positional arguments of ``fn`` bind to (its own order: an engine's front may insert arguments,
    e.g. ``only_qv`` before ``sm_margin``, and a fork has its own), or None when ``fn`` has no Python signature."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    names = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            return None
    return tuple(names)


def make_wrapper(original: Callable, kind: str, checker) -> Callable:
    """A function that checks through ``checker`` (a :class:`gpu_impl.fa3_calls.CheckingFA3`) and runs ``original``.

    A wrapped FA3 front calling a wrapped kernel (an engine's own front -> the kernel module) is checked once,
    by the outermost wrapper.
    """
    names = positional_names(original)
    if kind == "precompute":
        def run(args, kwargs):
            return checker.checked_precompute(original, args, kwargs, names=names)
    elif kind in ("call", "varlen"):
        varlen = kind == "varlen"

        def run(args, kwargs):
            return checker.checked_call(original, args, kwargs, varlen=varlen, names=names)
    else:
        raise ValueError(f"kind: must be precompute, call or varlen, got {kind!r}")

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if getattr(_depth, "n", 0):
            return original(*args, **kwargs)
        _depth.n = 1
        try:
            return run(args, kwargs)
        finally:
            _depth.n = 0

    wrapper.__fa3verify_original__ = original
    wrapper.__fa3verify_kind__ = kind
    return wrapper


@dataclass
class Patch:
    """One replaced binding: ``where`` (a module, class, instance or plain dict) and its key."""

    container: Any
    key: str
    original: Callable
    wrapper: Callable
    description: str

    def restore(self) -> bool:
        c = self.container
        if isinstance(c, dict):
            if c.get(self.key) is self.wrapper:
                c[self.key] = self.original
                return True
            return False
        if getattr(c, self.key, None) is self.wrapper:
            setattr(c, self.key, self.original)
            return True
        return False


def _describe_owner(d: dict) -> tuple:
    """(owner object or None, kind, text) for a dict found holding an original."""
    for owner in gc.get_referrers(d):
        if isinstance(owner, types.ModuleType) and owner.__dict__ is d:
            return owner, "module", f"module {owner.__name__}"
        if isinstance(owner, type):  # a type refers directly to no dict but its own namespace
            return owner, "class", f"class {owner.__module__}.{owner.__qualname__}"
        if getattr(owner, "__dict__", None) is d:
            cls = type(owner)
            return owner, "instance", f"instance of {cls.__module__}.{cls.__qualname__}"
    return None, "dict", "a dict"


def _closure_owners(cell) -> list:
    """Functions (not the sanitizer's own wrappers) whose closure holds ``cell``."""
    owners = []
    for holder in gc.get_referrers(cell):
        if not isinstance(holder, tuple):
            continue
        for fn in gc.get_referrers(holder):
            if isinstance(fn, types.FunctionType) and fn.__closure__ is holder and not (
                    fn.__module__ == __name__ or hasattr(fn, "__fa3verify_original__")):
                owners.append(fn)
    return owners


def rebind_everywhere(original: Callable, wrapper: Callable, skip_ids: set) -> tuple:
    """Replace every reachable binding of ``original`` with ``wrapper``: ``(patches, unreachable descriptions)``."""
    patches, unreachable = [], []
    for ref in gc.get_referrers(original):
        if id(ref) in skip_ids or isinstance(ref, types.FrameType):
            continue
        if isinstance(ref, dict):
            if getattr(wrapper, "__dict__", None) is ref or ref.get("__fa3verify_original__") is original:
                continue
            keys = [k for k, v in list(ref.items()) if v is original]
            if not keys:
                continue
            owner, kind, text = _describe_owner(ref)
            for key in keys:
                if kind == "class":
                    setattr(owner, key, wrapper)
                    patches.append(Patch(owner, key, original, wrapper, f"{text}.{key}"))
                else:
                    ref[key] = wrapper
                    label = f"{text}: {key}" if kind in ("module", "instance") else f"{text}[{key!r}]"
                    patches.append(Patch(ref, key, original, wrapper, label))
        elif isinstance(ref, types.CellType):
            owners = _closure_owners(ref)
            if not owners:   # a running frame's cell (ours, or a caller's local): transient, not a binding
                continue
            unreachable.extend(f"a closure variable of {fn.__module__}.{fn.__qualname__} holding "
                               f"{original.__module__}.{original.__qualname__}" for fn in owners)
        elif isinstance(ref, functools.partial):
            unreachable.append(f"functools.partial over {original.__module__}.{original.__qualname__}")
        elif isinstance(ref, (list, tuple, set)):
            if id(ref) in skip_ids:
                continue
            unreachable.append(f"a {type(ref).__name__} holding {original.__module__}.{original.__qualname__}")
        elif isinstance(ref, types.MethodType):
            unreachable.append(f"a bound method over {original.__module__}.{original.__qualname__}")
        elif isinstance(ref, (staticmethod, classmethod)):
            unreachable.append(f"a {type(ref).__name__} over {original.__module__}.{original.__qualname__} "
                               f"(a class attribute)")
        elif isinstance(ref, types.FunctionType):
            if ref.__module__ != __name__:
                unreachable.append(f"default argument of function {ref.__module__}.{ref.__qualname__}")
        else:
            # an instance whose attributes live inline (no __dict__ object yet, CPython 3.11+)
            try:
                attrs = vars(ref)
            except TypeError:
                continue
            keys = [k for k, v in list(attrs.items()) if v is original and not k.startswith("__")]
            cls = type(ref)
            for key in keys:
                setattr(ref, key, wrapper)
                patches.append(Patch(ref, key, original, wrapper,
                                     f"instance of {cls.__module__}.{cls.__qualname__}: {key}"))
    return patches, unreachable


class _NotifyingLoader(importlib.abc.Loader):
    """Runs the real loader, then tells the sanitizer the module exists (to wrap its FA3 functions)."""

    def __init__(self, loader, callback: Callable):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._callback(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class EntryPointFinder(importlib.abc.MetaPathFinder):
    """A meta-path finder that notices when a watched module is imported and calls ``callback(module)``
    right after the module has executed (before the importer sees it), so later ``from m import f`` binds
    the wrapper. Other imports are untouched (one set lookup)."""

    def __init__(self, watched, callback: Callable):
        self.watched = set(watched)
        self.callback = callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.watched:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            try:
                spec = finder.find_spec(fullname, path, target)
            except Exception:
                continue
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _NotifyingLoader(spec.loader, self.callback)
            return spec
        return None


def install_finder(finder: EntryPointFinder) -> None:
    if finder not in sys.meta_path:
        sys.meta_path.insert(0, finder)


def remove_finder(finder: Optional[EntryPointFinder]) -> None:
    if finder is not None and finder in sys.meta_path:
        sys.meta_path.remove(finder)


__all__ = ["ENTRY_POINTS", "KNOWN_REBINDERS", "EntryPointFinder", "Patch", "install_finder", "make_wrapper",
           "rebind_everywhere", "remove_finder"]
