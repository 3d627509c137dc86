"""The runtime sanitizer: FA3 entry points wrapped with gpu_impl.fa3_calls' checks, in the user's own process.

Invariant: while installed, every call that passes ``scheduler_metadata`` to a wrapped FA3 entry point is
checked against the recorded inputs of the precompute that produced the tensor (or the one that last wrote
the persistent buffer it lives in), before the kernel runs; metadata of unknown origin is reported.

The checks are :class:`gpu_impl.fa3_calls.CheckingFA3`'s (``quick_check`` by default: shapes and scalars, no
device sync; ``deep``: the full ``spec.invariants`` on a host copy). Copies are followed by wrapping
``torch.Tensor.copy_`` and ``torch.Tensor.__setitem__`` (one engine writes ``buf[:n] = md``; another copies into a
persistent buffer); only int32 destinations and recorded sources cost more than one comparison.
"""

from __future__ import annotations

import atexit
import sys
import warnings
from pathlib import Path
from typing import Optional

import torch

from gpu_impl.fa3_calls import CheckingFA3, MetadataMismatch, violation_signature

from . import DEFAULT_DIR, MODES, records
from .targets import (ENTRY_POINTS, KNOWN_REBINDERS, EntryPointFinder, Patch, install_finder, make_wrapper,
                      rebind_everywhere, remove_finder)

__all__ = ["Sanitizer", "MODES", "DEFAULT_DIR", "MetadataMismatch"]


class Sanitizer:
    """One installation: the wrapped entry points, the replaced bindings, the checker and the output folder."""

    def __init__(self, mode: str = "raise", deep: bool = False, out_dir=None, num_sm: Optional[int] = None,
                 arch: Optional[int] = None, follow_copies: bool = True, import_hook: bool = True,
                 write_files: bool = True, max_events: int = 1000, entry_points: Optional[dict] = None,
                 capturing=None, num_sm_source: Optional[str] = None, causes: bool = True):
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.deep = bool(deep)
        self.out_dir = Path(out_dir if out_dir is not None else DEFAULT_DIR)
        self.write_files = bool(write_files)
        self.follow_copies = bool(follow_copies)
        self.import_hook = bool(import_hook)
        self.entry_points = dict(ENTRY_POINTS if entry_points is None else entry_points)
        self.checker = CheckingFA3(None, mode=mode, deep=deep, on_violation=self._on_violation, num_sm=num_sm,
                                   arch=arch, max_events=max_events, capturing=capturing,
                                   report_causes=causes)
        if num_sm_source is not None:
            self.checker.num_sm_source = num_sm_source
        self.log = records.SanitizeLog(self.out_dir, mode)
        self.patches: list[Patch] = []
        self.unreachable: list[str] = []
        self.wrapped: dict = {}          # "module.name" -> wrapper
        self._originals: dict = {}       # id(original) -> wrapper
        self._finder: Optional[EntryPointFinder] = None
        self._tensor_methods: dict = {}
        self.installed = False
        self.files_written: list = []
        self._seen_paths: dict = {}      # violation signature -> (pair file, case file)
        self._atexit = False

    # -- install / uninstall ------------------------------------------------------------------------------
    def install(self) -> "Sanitizer":
        if self.installed:
            return self
        self.installed = True
        for name in self.entry_points:
            module = sys.modules.get(name)
            if module is not None:
                self._wrap_module(module, late=True)
        if self.import_hook:
            self._finder = EntryPointFinder([n for n in self.entry_points if n not in sys.modules],
                                            self._on_import)
            install_finder(self._finder)
        if self.follow_copies:
            self._patch_tensor_methods()
        if self.mode == "record":
            self.log.summary(self.stats(), force=True)
        if not self._atexit:
            self._atexit = True
            atexit.register(self._at_exit)
        if self.unreachable:
            warnings.warn("fa3verify.sanitize: installed after these bindings of FA3 functions were made; calls "
                          "through them are NOT checked: " + "; ".join(self.unreachable), RuntimeWarning,
                          stacklevel=3)
        return self

    def uninstall(self) -> "Sanitizer":
        if not self.installed:
            return self
        remove_finder(self._finder)
        self._finder = None
        for patch in reversed(self.patches):
            patch.restore()
        self.patches.clear()
        self._restore_tensor_methods()
        self.installed = False
        self.log.summary(self.stats(), force=self.mode == "record")
        return self

    def _at_exit(self) -> None:
        """The log's summary line when the process ends with the sanitizer still installed."""
        if self.installed:
            self.log.summary(self.stats(), force=self.mode == "record")

    def _on_import(self, module) -> None:
        if self.installed:
            self._wrap_module(module, late=False)

    def _wrap_module(self, module, late: bool) -> None:
        for fname, kind in self.entry_points.get(module.__name__, {}).items():
            fn = module.__dict__.get(fname)
            if fn is None or getattr(fn, "__fa3verify_original__", None) is not None:
                continue
            wrapper = self._originals.get(id(fn))
            if wrapper is None:
                wrapper = make_wrapper(fn, kind, self.checker)
                self._originals[id(fn)] = wrapper
            self.wrapped[f"{module.__name__}.{fname}"] = wrapper
            if late:
                patches, unreachable = rebind_everywhere(fn, wrapper, skip_ids={id(self._originals), id(self.patches)})
                self.patches.extend(patches)
                self.unreachable.extend(u for u in unreachable if u not in self.unreachable)
            else:  # just imported: nobody else holds it yet
                module.__dict__[fname] = wrapper
                self.patches.append(Patch(module.__dict__, fname, fn, wrapper, f"module {module.__name__}: {fname}"))

    # -- following copies into persistent buffers -------------------------------------------------------
    def _patch_tensor_methods(self) -> None:
        registry, checker = self.checker.registry, self.checker
        int32 = torch.int32
        orig_copy = torch.Tensor.copy_
        orig_setitem = torch.Tensor.__setitem__

        def copy_(self_, src, *args, **kwargs):
            out = orig_copy(self_, src, *args, **kwargs)
            if registry.knows(src) or (self_.dtype is int32 and registry.tracks(self_)):
                checker.note_copy(self_, src)
            return out

        def __setitem__(self_, index, value):
            orig_setitem(self_, index, value)
            if isinstance(value, torch.Tensor) and _basic_index(index):
                # only basic indexing writes into a view whose start is an address (advanced indexing would
                # make self_[index] a copy, possibly a large one)
                if registry.knows(value) or (self_.dtype is int32 and registry.may_hold(self_)
                                             and registry.tracks(self_[index])):
                    checker.note_copy(self_[index], value)

        for name, fn in (("copy_", copy_), ("__setitem__", __setitem__)):
            self._tensor_methods[name] = torch.Tensor.__dict__.get(name, _MISSING)
            setattr(torch.Tensor, name, fn)

    def _restore_tensor_methods(self) -> None:
        for name, previous in self._tensor_methods.items():
            if previous is _MISSING:
                try:
                    delattr(torch.Tensor, name)
                except AttributeError:
                    pass
            else:
                setattr(torch.Tensor, name, previous)
        self._tensor_methods.clear()

    # -- violations ---------------------------------------------------------------------------------------
    def _on_violation(self, event) -> Optional[str]:
        pre, call, violations = event
        if not self.write_files:
            return None
        signature = violation_signature(pre, call, violations)
        first_time = signature not in self._seen_paths
        pair_path = case_path = None
        if first_time:
            pair_path = records.write_pair(self.out_dir, pre, call, violations)
            case_path = records.write_case(self.out_dir, pre, call, violations, layout=records.run_layout())
            self.files_written.extend(p for p in (pair_path, case_path) if p is not None)
            self._seen_paths[signature] = (pair_path, case_path)
        else:
            pair_path, case_path = self._seen_paths.get(signature, (None, None))
        self.log.violation(signature, pre, call, violations, pair_path, case_path,
                           path=getattr(self.checker, "violation_path", None))
        return str(case_path or pair_path) if (case_path or pair_path) else None

    # -- reporting ----------------------------------------------------------------------------------------
    def stats(self) -> dict:
        return {"mode": self.mode, "deep": self.deep, "checked_calls": self.checker.checked_calls,
                "unrecordable_calls": len(self.checker.unrecordable),
                "graph_checks": self.checker.graph_checks, "graph_unmatched": self.checker.graph_unmatched,
                "graph_padded": self.checker.graph_padded, "num_sm": self.checker.num_sm,
                "num_sm_source": self.checker.num_sm_source, "arch": self.checker.arch,
                "violation_events": sum(1 for e in self.checker.events if e[2]),
                "wrapped": sorted(self.wrapped), "unreachable": list(self.unreachable)}

    def rebinder_bindings(self) -> dict:
        """For each loaded module of :data:`KNOWN_REBINDERS`: its globals that hold an FA3 entry point, each as
        ``"checked"`` (the sanitizer's wrapper) or ``"NOT CHECKED"`` (an original it did not replace).

        This is what a dispatcher that bound the entry points at import (an engine's ``flash_attention`` dispatcher) holds now,
        whichever way it got there (bound after the import hook wrapped the function, or replaced through gc).
        """
        wrappers = {id(w) for w in self._originals.values()}
        originals = {id(getattr(w, "__fa3verify_original__", None)) for w in self._originals.values()}
        out = {}
        for name in KNOWN_REBINDERS:
            module = sys.modules.get(name)
            if module is None:
                continue
            held = {key: ("checked" if id(value) in wrappers else "NOT CHECKED")
                    for key, value in list(vars(module).items())
                    if id(value) in wrappers or id(value) in originals}
            if held:
                out[name] = dict(sorted(held.items()))
        return out

    def status(self) -> dict:
        """What is wrapped, which bindings were replaced, which could not be reached, and the counts."""
        loaded_rebinders = [m for m in KNOWN_REBINDERS if m in sys.modules]
        return {"installed": self.installed, **self.stats(),
                "patched_bindings": [p.description for p in self.patches],
                "known_rebinders_loaded": loaded_rebinders,
                "rebinder_bindings": self.rebinder_bindings(),
                "watching_imports": sorted(self._finder.watched) if self._finder else [],
                "log": None if self.log.path is None else str(self.log.path), "out_dir": str(self.out_dir),
                "files": [str(p) for p in self.files_written]}


_MISSING = object()


def _basic_index(index) -> bool:
    """An index made of slices and ints only (a view, not a gather)."""
    if isinstance(index, (slice, int)) and not isinstance(index, bool):
        return True
    return isinstance(index, tuple) and all(isinstance(i, (slice, int)) and not isinstance(i, bool) for i in index)
