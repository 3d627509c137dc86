"""vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT``) as the release reads it, set for one configuration.

A server sets the variable before it starts; the worker drives many configurations in one process, so it sets the
variable per configuration and makes the release read it again where the release reads it only once:

- 0.11.1 .. 0.11.2: ``vllm_is_batch_invariant()`` is a ``functools.cache`` of the variable
  (``vllm/model_executor/layers/batch_invariant.py`` line 788): its cache is cleared;
- 0.12.0 .. 0.18.1: ``vllm_is_batch_invariant()`` returns the module constant ``VLLM_BATCH_INVARIANT``, read once at
  import by ``_read_vllm_batch_invariant()`` (line 996 in 0.12.0, 997 in 0.17.0 .. 0.18.1): the constant is set again
  from the release's own reader;
- 0.19.0 on: ``vllm.envs.VLLM_BATCH_INVARIANT``, read on every access (``envs.__getattr__``): nothing to do;
- 0.11.0 and before: no batch-invariant mode; the variable is set and nothing reads it.

Without this, 0.11.1 .. 0.18.1 kept the first reading of the process for every configuration: every batch-invariant
configuration ran as the plain one (its precompute and call without ``num_splits=1``).
"""

from __future__ import annotations

import os
import sys

#: the release's module that holds its batch-invariant switch (0.11.1 .. 0.18.1 read it once)
MODULE = "vllm.model_executor.layers.batch_invariant"


def set_batch_invariance(on: bool) -> None:
    """Set ``VLLM_BATCH_INVARIANT`` for the next configuration, and have the release read it again (see the module)."""
    os.environ["VLLM_BATCH_INVARIANT"] = "1" if on else "0"
    bi = sys.modules.get(MODULE)   # not imported yet: its import reads the variable just set
    if bi is None:
        return
    read = getattr(bi, "vllm_is_batch_invariant", None)
    if hasattr(read, "cache_clear"):   # 0.11.1 .. 0.11.2
        read.cache_clear()
    reader = getattr(bi, "_read_vllm_batch_invariant", None)
    if reader is not None and hasattr(bi, "VLLM_BATCH_INVARIANT"):   # 0.12.0 .. 0.18.1
        bi.VLLM_BATCH_INVARIANT = reader()


def release_reads_batch_invariance() -> bool | None:
    """What the release answers now (``vllm_is_batch_invariant()``, or ``vllm.envs`` from 0.19.0); None: no such mode."""
    import importlib

    try:
        bi = importlib.import_module(MODULE)
    except ImportError:
        return None
    read = getattr(bi, "vllm_is_batch_invariant", None)
    if read is not None:
        return bool(read())
    import vllm.envs as envs

    return bool(getattr(envs, "VLLM_BATCH_INVARIANT", False))
