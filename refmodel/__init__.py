"""refmodel: the oracle of fa3-verify.

Exact attention, FA3's split-KV decomposition and combine semantics, and a faithful model of FA3's
scheduler (tile sizes, split and pack heuristics, prepare step, metadata layout). Every formula lives
in exactly one function here; `spec` encodes the same functions symbolically.
"""

from .attention import attention
from .combine import combine_capacity, flash_attn_combine
from .fa3_scheduler import (
    Masking,
    Schedule,
    ScheduleInputs,
    call_inputs,
    get_num_splits,
    kernel_headdims,
    num_splits_heuristic,
    precompute_inputs,
    resolve_masking,
    resolve_schedule,
    tile_size_fwd_sm90,
)
from .errors import FA3Rejected, OutsideModel, ProcessAbort
from .metadata import (
    UNWRITTEN,
    DecodedMetadata,
    MetadataLayout,
    call_own_metadata,
    call_own_schedule,
    decode_metadata,
    encode_metadata,
    get_scheduler_metadata,
    metadata_size,
    schedule_and_prepare,
)
from .prepare import PrepareResult, prepare_scheduler
from .splitkv import split_block_range, split_kv

__all__ = [
    "attention", "split_kv", "split_block_range", "flash_attn_combine", "combine_capacity",
    "get_scheduler_metadata", "get_num_splits", "num_splits_heuristic", "metadata_size", "decode_metadata",
    "encode_metadata", "schedule_and_prepare", "prepare_scheduler", "PrepareResult", "resolve_schedule",
    "resolve_masking", "Masking", "Schedule", "ScheduleInputs", "call_inputs", "precompute_inputs",
    "tile_size_fwd_sm90", "kernel_headdims", "MetadataLayout", "DecodedMetadata", "UNWRITTEN",
    "call_own_metadata", "call_own_schedule", "FA3Rejected", "ProcessAbort", "OutsideModel",
]
