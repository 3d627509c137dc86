"""Runtime checks of the metadata's life, on top of :class:`gpu_impl.fa3_calls.CheckingFA3` (the sanitizer's checker).

Two of spec.lifecycle_invariants can be seen from inside a process:

- **SEMAPHORE_STARTS_AT_ZERO** before a launch: the tile-count semaphore is the metadata's last int32 whenever the
  call's scheduler uses one (on sm90 every call that reads metadata: flash_api.cpp@0251105a 990-1002), and FA3 does
  not zero it before a launch that was given metadata (1015-1016). Reading it is one device-to-host copy (a sync on
  a GPU), so it runs only when asked (``semaphore=True``, the deep sanitizer) and never while a graph is captured;
  on sm8x (arch < 90) the last slot is a semaphore only when the call splits, so it is not read there.
- **READS_OWN_STEP_METADATA** before a replay: a CUDA graph that captured calls reading a persistent metadata buffer
  is replayed; the buffer must have been rewritten (a recompute copied in, ``note_copy``) since that graph's
  previous replay or capture. The graph-to-buffer map is taken at capture (buffers the checker saw captured calls
  read between ``capture_begin`` and ``capture_end``); a replay is seen by wrapping the graph class's ``replay``.
  With ``semaphore=True`` the buffer's semaphore slot is read before the replay too.

:class:`LifecycleWatch` installs both on one checker (wrapping its ``check`` and ``note_copy`` and the graph class's
``capture_begin``/``capture_end``/``replay``; ``uninstall`` restores them). A violation goes through the checker's
own path (its event list, ``on_violation``, raise / warn / record). Simplified: a graph is assumed to read every
buffer its capture read, and a write is any recorded copy into the buffer's first element's address.
"""

from __future__ import annotations

import collections
import weakref
from typing import Optional

import torch

from spec.violation import Violation

from .fa3_records import call_schedule_of
from .fa3_registry import tensor_address

__all__ = ["semaphore_violation", "replay_freshness", "LifecycleWatch"]


def semaphore_violation(metadata, arch: int = 90) -> Optional[Violation]:
    """SEMAPHORE_STARTS_AT_ZERO for a metadata tensor about to be launched over (None: holds, or not readable)."""
    if arch < 90 or not isinstance(metadata, torch.Tensor) or metadata.numel() == 0:
        return None
    value = int(metadata.reshape(-1)[-1].item())
    if value == 0:
        return None
    return Violation("SEMAPHORE_STARTS_AT_ZERO", None, {"semaphore": value},
                     f"the metadata's tile-count semaphore holds {value} before the launch: FA3 does not zero it when "
                     f"metadata is given (flash_api.cpp 1015-1016), so the dynamic scheduler skips up to {value} "
                     "tiles")


def replay_freshness(pre, made_at: dict, where) -> list:
    """READS_OWN_STEP_METADATA for a replayed call whose metadata is ``pre``'s: ``made_at`` maps id(precompute) to
    (precompute, the (step, dp_rank) it was made at); a replay at ``where`` must read one made there (an engine
    driver's replay, gpu_impl.engines.sglang.driver). Unknown metadata is METADATA_ORIGIN's, not reported here."""
    entry = made_at.get(id(pre)) if pre is not None else None
    if entry is None or entry[0] is not pre or tuple(entry[1]) == tuple(where):
        return []
    return [Violation("READS_OWN_STEP_METADATA", None, {"made_at": list(entry[1]), "replayed_at": list(where)},
                      f"the replayed call reads metadata precomputed at step {entry[1][0]} (DP rank {entry[1][1]}), "
                      f"not for this step {where[0]}: the replay-time recompute did not rewrite the graph's buffer")]


class LifecycleWatch:
    """The two runtime lifecycle checks, installed on one :class:`gpu_impl.fa3_calls.CheckingFA3`."""

    def __init__(self, checker, semaphore: bool = False, graph_cls=None):
        self.checker = checker
        self.semaphore = bool(semaphore)
        self.graph_cls = graph_cls if graph_cls is not None else getattr(torch.cuda, "CUDAGraph", None)
        self.writes: collections.Counter = collections.Counter()   # buffer address -> recorded writes
        self.buffers: dict = {}      # buffer address -> weak reference to the tensor written there (its base)
        #: graph -> {buffer address: (metadata length, writes at its capture or last replay)}
        self.graphs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._before_capture: dict = {}
        self._saved: list = []
        self.replays_checked = 0
        self.semaphores_read = 0
        self.installed = False

    # -- install / uninstall ------------------------------------------------------------------------------
    def install(self) -> "LifecycleWatch":
        if self.installed:
            return self
        self.installed = True
        checker = self.checker
        check, note_copy = checker.check, checker.note_copy

        def checked(call, metadata, deep=None):
            pre, violations = check(call, metadata, deep)
            if self.semaphore and metadata is not None and not checker.capturing():
                self.semaphores_read += 1
                v = semaphore_violation(metadata, checker.arch)
                if v is not None:
                    violations = list(violations) + [v]
            return pre, violations

        def noted(dst, src):
            note_copy(dst, src)
            key = tensor_address(dst)
            if key is not None:
                self.writes[key] += 1
                self.buffers[key] = weakref.ref(dst._base if dst._base is not None else dst)

        self._saved.append((checker, "check", checker.__dict__.get("check")))
        self._saved.append((checker, "note_copy", checker.__dict__.get("note_copy")))
        checker.check, checker.note_copy = checked, noted
        if self.graph_cls is not None:
            cls = self.graph_cls
            begin, end, replay = cls.capture_begin, cls.capture_end, cls.replay
            watch = self

            def capture_begin(graph, *args, **kwargs):
                watch._before_capture[id(graph)] = {k: len(v) for k, v in checker.captured.items()}
                return begin(graph, *args, **kwargs)

            def capture_end(graph, *args, **kwargs):
                out = end(graph, *args, **kwargs)
                before = watch._before_capture.pop(id(graph), {})
                read = {k: (call_schedule_of(v[-1]).metadata_size, watch.writes[k])
                        for k, v in checker.captured.items() if len(v) > before.get(k, 0)}
                if read:
                    watch.graphs[graph] = read
                return out

            def replay_(graph, *args, **kwargs):
                watch._before_replay(graph)
                return replay(graph, *args, **kwargs)

            for name, fn in (("capture_begin", capture_begin), ("capture_end", capture_end), ("replay", replay_)):
                self._saved.append((cls, name, cls.__dict__.get(name)))
                setattr(cls, name, fn)
        return self

    def uninstall(self) -> "LifecycleWatch":
        for owner, name, original in reversed(self._saved):
            if original is None:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
            else:
                setattr(owner, name, original)
        self._saved.clear()
        self.installed = False
        return self

    # -- the replay check ---------------------------------------------------------------------------------
    def _before_replay(self, graph) -> None:
        read = self.graphs.get(graph)
        if not read:
            return
        checker = self.checker
        for key, (length, seen) in list(read.items()):
            self.replays_checked += 1
            calls = checker.captured.get(key) or [None]
            found = []
            if self.writes[key] == seen:
                found.append(Violation(
                    "READS_OWN_STEP_METADATA", None, {"buffer": list(key), "writes": self.writes[key]},
                    "a CUDA graph is replayed over a persistent metadata buffer that nothing rewrote since its "
                    "capture or previous replay: the captured calls read the previous step's metadata"))
            if self.semaphore:
                buffer = self._buffer(key, length)
                if buffer is not None:
                    self.semaphores_read += 1
                    v = semaphore_violation(buffer, checker.arch)
                    if v is not None:
                        found.append(v)
            read[key] = (length, self.writes[key])
            if found:
                buffer = self._buffer(key, length)
                pre = checker.registry.lookup(buffer) if buffer is not None else None
                checker.report(pre, calls[-1], found, where="CUDA-graph replay")

    def _buffer(self, key, length) -> Optional[torch.Tensor]:
        """The ``length`` ints a graph reads at ``key``, from the live tensor last written there (None if dead)."""
        ref = self.buffers.get(key)
        owner = ref() if ref is not None else None
        if owner is None:
            return None
        start = (key[1] - owner.data_ptr()) // owner.element_size()
        flat = owner.reshape(-1)
        return flat[start:start + length] if 0 <= start and start + length <= flat.numel() else None
