"""Where a scheduler-metadata tensor came from: device address -> the precompute that last wrote it.

Invariant: a lookup returns the PrecomputeRecord of the last recorded write into that memory while the tensor
(or the buffer a view belongs to) is alive, and nothing once it died -- its memory may be reused by a tensor
nobody recorded. Used by :class:`gpu_impl.fa3_calls.CheckingFA3` and the runtime sanitizer.
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch

from .fa3_records import PrecomputeRecord

__all__ = ["MetadataRegistry"]


def tensor_address(t: torch.Tensor) -> Optional[tuple]:
    """(device ordinal (-1 on the host), address of the first element) of a tensor with storage, else None."""
    if not isinstance(t, torch.Tensor) or t.is_meta or t.numel() == 0:
        return None
    return (t.get_device(), t.data_ptr())


class MetadataRegistry:
    """Metadata tensor (by device address) -> the PrecomputeRecord that last wrote it, held weakly.

    Keyed by the address of the first element, so a view ``buf[:n]`` of a persistent buffer finds the buffer's
    entry; each entry keeps a weak reference to the storage's owner (the base tensor of a view), and is dropped
    when that owner dies (its memory may be reused by a tensor nobody recorded). :meth:`note_copy` records
    ``dst.copy_(src)``: the buffer's last writer becomes ``src``'s precompute (or unknown, when ``src`` is unknown).
    """

    def __init__(self):
        self._entries: dict = {}
        self._ids: dict = {}      # id(tensor remembered) -> weakref, for a cheap "is this a recorded tensor?"

    def __len__(self) -> int:
        self._purge()
        return len(self._entries)

    def _purge(self) -> None:
        for key in [k for k, (ref, _) in self._entries.items() if ref() is None]:
            del self._entries[key]

    def knows(self, tensor) -> bool:
        """Whether ``tensor`` itself was remembered (one dict lookup; used on every copy)."""
        ref = self._ids.get(id(tensor))
        return ref is not None and ref() is tensor

    def may_hold(self, tensor) -> bool:
        """Whether a remembered metadata tensor or buffer starts inside ``tensor``'s memory (a cheap pre-check
        before making a view of it)."""
        if not self._entries or tensor.is_meta:
            return False
        dev, start = tensor.get_device(), tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        return any(d == dev and start <= a < end for d, a in self._entries)

    def tracks(self, tensor) -> bool:
        """Whether ``tensor``'s first element is the start of a remembered metadata tensor or buffer."""
        key = tensor_address(tensor)
        return key is not None and key in self._entries

    def remember(self, tensor, record: Optional[PrecomputeRecord]) -> None:
        key = tensor_address(tensor)
        if key is None:
            return
        if record is None:
            self._entries.pop(key, None)
            return
        owner = tensor._base if tensor._base is not None else tensor
        try:
            ref = weakref.ref(owner, lambda r, key=key, entries=self._entries: (
                entries.pop(key, None) if entries.get(key, (None,))[0] is r else None))
            ids, tid = self._ids, id(tensor)
            ids[tid] = weakref.ref(tensor, lambda _r, ids=ids, tid=tid: ids.pop(tid, None))
        except TypeError:  # not weak-referenceable: hold it (rare tensor subclasses)
            ref = (lambda t: (lambda: t))(owner)
        self._entries[key] = (ref, record)

    def lookup(self, tensor) -> Optional[PrecomputeRecord]:
        key = tensor_address(tensor)
        if key is None:
            return None
        entry = self._entries.get(key)
        if entry is None:
            return None
        ref, record = entry
        if ref() is None:
            del self._entries[key]
            return None
        return record

    def note_copy(self, dst, src) -> None:
        """``dst.copy_(src)`` happened: dst now holds src's metadata (unknown origin when src is unknown)."""
        self.remember(dst, self.lookup(src))
