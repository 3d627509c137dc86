"""Where an engine's own code called FA3: the function and file of each precompute and call, read from the
running engine's stack (a release or a source checkout), for a finding to name (``Finding.source``).

Invariant: a location names frames of the engine's package only (``sglang/...``, ``vllm/...``: the path from
the package folder on, the same for an installed release and a checkout), past FA3's own wrappers (this
project's fake FA3 fronts and drivers, and the engine's dispatcher functions of the same name as the FA3 entry);
nothing found is None, never a guess.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

__all__ = ["caller_location"]

#: The engine packages whose frames a location names (by the frame's module name).
PACKAGES = ("sglang", "vllm")
#: Innermost frames searched for FA3 wrappers (the fake front, the engine's dispatcher and its helpers).
WRAPPER_FRAMES = 8


def caller_location(entry: str, depth: int = 2) -> Optional[str]:
    """Where the engine's own code called FA3's ``entry``: the first ``depth`` frames of the engine's package
    (a module named ``sglang.*`` or ``vllm.*``) past the outermost function named ``entry`` among the innermost
    :data:`WRAPPER_FRAMES` (the fake FA3 front; sglang's dispatcher ``jit_kernel/flash_attention_v3.py``, vLLM's
    ``vllm_flash_attn`` interface), as ``Class.function (sglang/srt/.../file.py:line)``, joined by ``, from ``;
    None when no such frame is found."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    wrappers = [i for i, f in enumerate(frames[:WRAPPER_FRAMES]) if f.f_code.co_name == entry]
    found: list = []
    for f in frames[(wrappers[-1] + 1) if wrappers else 0:]:
        shown = _package_path(f)
        if shown is None:  # this project's drivers, torch's dispatch, runpy: not the engine's code
            continue
        found.append(f"{getattr(f.f_code, 'co_qualname', f.f_code.co_name)} ({shown}:{f.f_lineno})")
        if len(found) == depth:
            break
    return ", from ".join(found) or None


def _package_path(frame) -> Optional[str]:
    """The frame's source as a path from its package folder on (``sglang/srt/layers/attention/
    flashattention_backend.py``: the same for an installed release and a checkout), from its module's name; None
    when the module is not one of :data:`PACKAGES`."""
    module = frame.f_globals.get("__name__") or ""
    if module.split(".", 1)[0] not in PACKAGES:
        return None
    stem = module.replace(".", "/")
    return stem + ("/__init__.py" if os.path.basename(frame.f_code.co_filename) == "__init__.py" else ".py")
