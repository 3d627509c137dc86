"""The head-split checks an sglang release runs when it loads a model, run on CPU: the release's own attention
module's ``__init__`` (``srt/models/qwen3.py Qwen3Attention.__init__``, the architecture of the validation's
placeholder model) is constructed with the model's head counts on the configuration's attention-TP layout.

Invariant: a configuration is rejected at model load exactly when the release's own ``Qwen3Attention.__init__``
raises before it has set the layer's per-rank head counts (``num_heads`` and ``num_kv_heads``), and the message is
the release's own (a bare ``assert`` by its source line); only what needs CUDA or a process group is faked.
Runs inside an engine environment (imports sglang lazily).

Fakes (also in docs/engines.md, "The model-load head split"), replaced in the model module's namespace only
while one ``__init__`` runs and restored after:

- the layout readers the module imports (:data:`LAYOUT_READERS`: ``get_attention_tp_size`` / ``_rank``,
  ``get_tensor_model_parallel_world_size`` / ``_rank`` (<= 0.5.17), ``get_parallel()`` (0.5.18+)) return the
  rank-0 layout of the configuration: no process group exists on CPU;
- the first thing the constructor builds after the head split (:data:`STOP_AT`: the norms, the parallel linear
  layers, the rotary embedding, the attention layer, and the global server-args readers they consult) stops the
  constructor: those allocate weights or read a launched server's state, and decide nothing about the split.
"""

from __future__ import annotations

import contextlib
import inspect
from types import SimpleNamespace
from typing import Optional

__all__ = ["CHECK", "LAYOUT_READERS", "STOP_AT", "attention_tp_size", "head_split"]

#: The release check this runs (as ``spec/model/assumption_facts.json`` names it).
CHECK = "srt/models/qwen3.py Qwen3Attention.__init__"
MODULE, CLASS = "sglang.srt.models.qwen3", "Qwen3Attention"

#: Layout readers a release's model module imports -> the layout quantity each returns (rank 0 of every group).
LAYOUT_READERS = {"get_attention_tp_size": "attn_tp_size", "get_attention_tp_rank": "zero",
                  "get_tensor_model_parallel_world_size": "tp_size", "get_tensor_model_parallel_rank": "zero",
                  "get_parallel": "parallel"}
#: What the constructor builds or reads after its head split; the first one called ends the run. (A reader not
#: named here that raises after the split, e.g. 0.5.16's ``get_server_args`` before it was listed, decides nothing
#: either: the verdict is whether the head counts were set, see :func:`head_split`.)
STOP_AT = ("get_global_server_args", "get_server_args", "get_exec", "RMSNorm", "QKVParallelLinear", "RowParallelLinear", "get_rope",
           "RadixAttention")


class PastHeadSplit(Exception):
    """The constructor reached what it builds after the head split (a :data:`STOP_AT` name)."""


def attention_tp_size(sa) -> int:
    """The attention-TP width of a resolved ``ServerArgs``: ``tp_size // attn_dp_size // attn_cp_size``
    (``compute_dp_attention_world_info`` in ``srt/layers/dp_attention.py``; 0 when it does not divide)."""
    tp, dp, cp = _size(sa, "tp_size"), _size(sa, "dp_size"), _size(sa, "attn_cp_size")
    dp = dp if getattr(sa, "enable_dp_attention", False) else 1
    return tp // dp // cp if dp > 0 and cp > 0 else 0


def _size(sa, name: str) -> int:
    """A width of the resolved arguments (1 where the release has no such argument or leaves it None)."""
    value = getattr(sa, name, None)
    return 1 if value is None else int(value)


def _layout(sa, attn_tp: int) -> dict:
    tp, cp = _size(sa, "tp_size"), _size(sa, "attn_cp_size")
    dp = _size(sa, "dp_size") if getattr(sa, "enable_dp_attention", False) else 1
    parallel = SimpleNamespace(tp_size=tp, tp_rank=0, attn_tp_size=attn_tp, attn_tp_rank=0, attn_cp_size=cp,
                               attn_cp_rank=0, attn_dp_size=dp, attn_dp_rank=0)
    return {"attn_tp_size": attn_tp, "tp_size": tp, "zero": 0, "parallel": parallel}


@contextlib.contextmanager
def _faked(module, layout: dict):
    """The module's layout readers and :data:`STOP_AT` names replaced while the block runs (restored after)."""
    def stop(*_a, **_k):
        raise PastHeadSplit()

    saved = {}
    for name, quantity in LAYOUT_READERS.items():
        if hasattr(module, name):
            saved[name] = getattr(module, name)
            setattr(module, name, (lambda v: (lambda *_a, **_k: v))(layout[quantity]))
    for name in STOP_AT:
        if hasattr(module, name):
            saved[name] = getattr(module, name)
            setattr(module, name, stop)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def _attention_class():
    import importlib

    from gpu_impl.engines.protocol import quiet

    with quiet():
        return getattr(importlib.import_module(MODULE), CLASS)


def _split_done(layer) -> bool:
    """Whether the constructor has set the layer's per-rank head counts, i.e. got past every head-split check."""
    return layer is not None and all(hasattr(layer, a) for a in ("num_heads", "num_kv_heads"))


def head_split(sa, model: dict) -> Optional[dict]:
    """None when the release's attention module builds this model's heads on ``sa``'s layout; else
    ``{"accepted": False | None, "message": ..., "stage": "model_load", "check": CHECK}`` (False: the release
    refused, with its message; None: the constructor could not be run on CPU, which decides nothing)."""
    from gpu_impl.engines.sglang.validation import rejection_message

    attn_tp = attention_tp_size(sa)
    if attn_tp < 1:
        return None  # a layout that does not divide is ServerArgs' to judge (no attention module is built)
    h, hk, d = int(model["num_heads"]), int(model["num_kv_heads"]), int(model["head_dim"])
    answer = {"stage": "model_load", "check": CHECK}
    layer = None
    try:
        cls = _attention_class()
        params = inspect.signature(cls.__init__).parameters
        kwargs = {k: v for k, v in {"hidden_size": h * d, "num_heads": h, "num_kv_heads": hk, "head_dim": d,
                                    "layer_id": 0, "prefix": "model.layers.0.self_attn"}.items() if k in params}
        module = inspect.getmodule(cls)
        layer = cls.__new__(cls)
        with _faked(module, _layout(sa, attn_tp)):
            try:
                layer.__init__(**kwargs)
            except PastHeadSplit:
                pass
    except Exception as exc:  # noqa: BLE001 - judged below by how far the constructor got
        if _split_done(layer):
            return None  # raised after the head split (reading a launched server's state): the split passed
        if isinstance(exc, (AssertionError, ValueError)):
            return {**answer, "accepted": False, "message": rejection_message(exc)}
        return {**answer, "accepted": None, "message": f"inconclusive: {type(exc).__name__}: {exc}"}
    if not _split_done(layer):
        return {**answer, "accepted": None,
                "message": f"inconclusive: {CLASS}.__init__ stopped before it set the layer's head counts"}
    return None
