"""refmodel: the oracle of fa3-verify.

Exact attention, FA3's split-KV decomposition and combine semantics, and a faithful model of FA3's
scheduler (tile sizes, split and pack heuristics, prepare step, metadata layout). Every formula lives
in exactly one function here; `spec` encodes the same functions symbolically.

The names below are loaded on first use (PEP 562): the scheduler's integer model imports no torch, so a
process that only proves theorems (``fa3verify prove``) does not pay torch's import; the tensor modules
(attention, combine, metadata, splitkv) load it when one of their names is first read.
"""

from __future__ import annotations

import importlib
import sys
import types

#: public name -> the submodule that defines it
_NAMES = {
    "attention": "attention",
    "combine_capacity": "combine", "flash_attn_combine": "combine",
    **dict.fromkeys(("Masking", "Schedule", "ScheduleInputs", "call_inputs", "get_num_splits", "kernel_headdims",
                     "num_splits_heuristic", "precompute_inputs", "resolve_masking", "resolve_schedule",
                     "tile_size_fwd_sm90"), "fa3_scheduler"),
    **dict.fromkeys(("FA3Rejected", "OutsideModel", "ProcessAbort"), "errors"),
    **dict.fromkeys(("UNWRITTEN", "DecodedMetadata", "MetadataLayout", "call_own_metadata", "call_own_schedule",
                     "decode_metadata", "encode_metadata", "get_scheduler_metadata", "metadata_size",
                     "schedule_and_prepare"), "metadata"),
    "PrepareResult": "prepare", "prepare_scheduler": "prepare",
    "split_block_range": "splitkv", "split_kv": "splitkv",
}

__all__ = [
    "attention", "split_kv", "split_block_range", "flash_attn_combine", "combine_capacity",
    "get_scheduler_metadata", "get_num_splits", "num_splits_heuristic", "metadata_size", "decode_metadata",
    "encode_metadata", "schedule_and_prepare", "prepare_scheduler", "PrepareResult", "resolve_schedule",
    "resolve_masking", "Masking", "Schedule", "ScheduleInputs", "call_inputs", "precompute_inputs",
    "tile_size_fwd_sm90", "kernel_headdims", "MetadataLayout", "DecodedMetadata", "UNWRITTEN",
    "call_own_metadata", "call_own_schedule", "FA3Rejected", "ProcessAbort", "OutsideModel",
]


class _Package(types.ModuleType):
    """The package: `refmodel.attention` stays the function when its submodule is imported (as it always was)."""

    def __setattr__(self, name, value):
        if name == "attention" and isinstance(value, types.ModuleType):
            return  # the import system binding the submodule: the name means the oracle function
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
