"""What FA3 accepts and rejects on each side of the metadata hand-off, with FA3's own messages.

The two sides check very different things (``hopper/flash_api.cpp`` at 0251105a):

* the precompute, ``mha_fwd_get_scheduler_metadata`` (lines 548-550), checks only the dtype and that the KV heads
  divide the query heads. Head dims over 256, split counts over 256, anything else: it produces metadata;
* the call, ``mha_fwd`` (lines 780-792, 854-856, 931-933, 1095, and ``run_mha_fwd`` line 371), checks the head
  dims, their alignment, appended KV, and the split count.

A failed check is :class:`~refmodel.errors.FA3Rejected` (loud, safe). ``h % 0`` is a host division by zero:
:class:`~refmodel.errors.ProcessAbort`. What this model does not cover raises
:class:`~refmodel.errors.OutsideModel`: an architecture other than sm90 and values outside
C++ ``int``, which FA3's ``int64_t`` -> ``int`` narrowing would silently truncate.

Checks read the ``ScheduleInputs`` fields by name (no import of ``fa3_scheduler``, which calls these).
"""

from __future__ import annotations

from .cint import fits_int32, to_int32
from .errors import FA3Rejected, OutsideModel, ProcessAbort

__all__ = ["MODELLED_ARCH", "appends_kv", "seqused_k_passed", "check_model_range", "check_precompute", "check_call", "check_call_split_count",
           "effective_num_splits_argument", "SRC"]

#: The only architecture modelled: sm90 (Hopper). FA3's sm8x path (tile_size_fwd_sm8x in tile_size.h, the sm8x
#: semaphore rule of mha_fwd line 992 and forced PackGQA) is refused, not approximated.
MODELLED_ARCH = 90

SRC = "hopper/flash_api.cpp@0251105a"

_HEADS_MSG = "Number of heads in key/value must divide number of heads in query"


def appends_kv(inp) -> bool:
    """Whether new KV is appended, FA3's ``params.knew_ptr`` (flash_api.cpp 575 at precompute, 929-961 at the call).

    The precompute sets it from ``max_seqlen_k_new > 0``; the call whenever ``k_new`` is passed
    (``k_new_.has_value()``), also a varlen ``k_new`` (``cu_seqlens_k_new``), whose ``params.seqlen_knew`` is 0.
    Simplification: a passed ``k_new`` with no elements has a null ``data_ptr`` in FA3 (so no paged-TMA veto
    there); the model counts any passed ``k_new`` as appending. Inputs without a ``has_k_new`` field pass none.
    """
    return bool(getattr(inp, "has_k_new", False)) or int(inp.seqlen_knew) > 0


def seqused_k_passed(inp) -> bool:
    """Whether the call passed ``seqused_k`` (``cache_seqlens``), as ``mha_fwd`` line 932 tests it.

    A passed ``seqused_k`` makes the call varlen (``is_varlen``, line 849), and a varlen call runs the prepare step
    (``use_prepare_varlen = is_varlen``, line 976): a call without the prepare step (``uses_prepare`` False) has
    passed none, whatever ``has_seqused_k`` says (its default, True, is for inputs that do not say). Inputs without
    either field count as passing it.
    """
    return bool(getattr(inp, "has_seqused_k", True)) and bool(getattr(inp, "uses_prepare", True))


def effective_num_splits_argument(num_splits: int) -> int:
    """The num_splits FA3 stores: ``num_splits <= 0`` is tested on int64, then the value narrows to int (flash_api.cpp 610, 983)."""
    return 0 if int(num_splits) <= 0 else to_int32(num_splits)


def check_model_range(inp) -> None:
    """Refuse what the model does not cover: arch != 90, negative sizes, values outside C++ int."""
    if int(inp.arch) != MODELLED_ARCH:
        raise OutsideModel("arch", "sm90 (arch 90) only", inp.arch,
                           "FA3's sm8x tiles (tile_size_fwd_sm8x), semaphore and PackGQA rules are not modelled; "
                           "the sm90 kernel does not run on other architectures")
    for name, attr, low in (("batch_size", "batch_size", 0), ("max_seqlen_q", "seqlen_q", 0),
                            ("max_seqlen_k", "seqlen_k", 0), ("num_heads", "num_heads", 1),
                            ("num_heads_k", "num_heads_k", 0), ("headdim", "headdim", 1),
                            ("headdim_v", "headdim_v", 1), ("num_sm", "num_sm", 1), ("max_seqlen_k_new", "seqlen_knew", 0)):
        value = int(getattr(inp, attr))
        if value < low or not fits_int32(value):
            raise OutsideModel(name, f"{low}..{2**31 - 1}", value)
    if inp.page_size is not None and not 1 <= int(inp.page_size) <= 2**31 - 1:
        raise OutsideModel("page_size", f"1..{2**31 - 1} or None", inp.page_size)
    if not -(2**63) <= int(inp.num_splits) < 2**63:
        raise OutsideModel("num_splits", "an int64 value", inp.num_splits)


def _heads(inp, source: str) -> None:
    if int(inp.num_heads_k) == 0:
        raise ProcessAbort("num_heads_k", "num_heads % num_heads_k divides by zero on the host (SIGFPE)", source, 0)
    if int(inp.num_heads) % int(inp.num_heads_k) != 0:
        raise FA3Rejected("num_heads", _HEADS_MSG, source, (inp.num_heads, inp.num_heads_k))


def check_precompute(inp) -> None:
    """``mha_fwd_get_scheduler_metadata``'s checks: dtype (done by ``element_size``) and h % h_k (flash_api.cpp 548-550)."""
    check_model_range(inp)
    _heads(inp, f"{SRC}:550")


def check_call(inp) -> None:
    """``mha_fwd``'s checks on the shapes the model reads, in FA3's order (flash_api.cpp 780-792, 854-856, 931-933)."""
    check_model_range(inp)
    d, dv = int(inp.headdim), int(inp.headdim_v)
    if d > 256:
        raise FA3Rejected("headdim", "FlashAttention forward only supports head dimension at most 256", f"{SRC}:780", d)
    _heads(inp, f"{SRC}:781")
    if dv != d:
        if not ((128 < d <= 192 and 96 < dv <= 128) or (d <= 64 and dv <= 512)):
            raise FA3Rejected(
                "headdim_v", "If V headdim is different from Q/K dim, we only support Q/K headdim in (128, 192] and "
                "V headdim in (96, 128], or (Q/K <= 64 and V <= 512).", f"{SRC}:783-786", (d, dv))
        if dv > 256 and int(inp.element_size) == 1:
            raise FA3Rejected("headdim_v", "HeaddimV > 256 requires fp16 and bf16 data type", f"{SRC}:788-791", dv)
    alignment = 16 if int(inp.element_size) == 1 else 8
    if d % alignment:
        raise FA3Rejected("headdim", f"head_size should be a multiple of {alignment}", f"{SRC}:855", d)
    if dv % alignment:
        raise FA3Rejected("headdim_v", f"head_size_v should be a multiple of {alignment}", f"{SRC}:856", dv)
    if appends_kv(inp):  # `k_new_.has_value()`: also a varlen or empty k_new, whose seqlen_knew is 0
        if not seqused_k_passed(inp):
            raise FA3Rejected("cache_seqlens", "If k_new is supplied, seqlens_k must also be passed in", f"{SRC}:932")
        # FA3's test compares seqlen_q (not k_new's length) with the cache's seqlen_k, whatever its message says
        if int(inp.seqlen_q) > int(inp.seqlen_k):
            raise FA3Rejected("seqlen_q", "If k_new is supplied, it must have seqlen <= the seqlen of the KV cache",
                              f"{SRC}:933", (inp.seqlen_q, inp.seqlen_k))


def check_call_split_count(num_splits: int, kernel_runs: bool = True) -> None:
    """The call's resolved split count S_c: > 256 rejected when S_c > 1 (line 1095); < 1 rejected by run_mha_fwd (371).

    ``run_mha_fwd`` runs only when the call has queries and keys (line 1167); ``kernel_runs`` says whether it does.
    """
    if num_splits > 256:
        raise FA3Rejected("num_splits", "num_splits > 256 not supported", f"{SRC}:1095", num_splits)
    if num_splits < 1 and kernel_runs:
        raise FA3Rejected("num_splits", "Expected params.num_splits >= 1 to be true, but got false.",
                          f"{SRC}:371 (run_mha_fwd)", num_splits)
