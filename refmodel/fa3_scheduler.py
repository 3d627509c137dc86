"""FA3's host-side scheduling formulas for sm90, as plain functions.

Everything here follows FlashAttention-3's `hopper/` sources (commit 0251105a): the tile sizes of
`tile_size.h`, the split and pack heuristics of `heuristics.h`, and the parameter resolution of
`flash_api.cpp` (`mha_fwd`, `mha_fwd_get_scheduler_metadata`, `get_num_splits`, `get_pack_gqa`,
`get_pagedkv_tma`). Arithmetic that FA3 does in float32 is done here in numpy float32; comparisons
against double literals (`0.85 * max_eff`, `0.9 * pack_eff`) are done in float64 as C++ promotes them.

Integer arithmetic is C++ ``int`` (refmodel.cint): products and sums wrap, divisions truncate, as FA3's host
code does; the one place this matters on real inputs is the L2 branch of ``num_splits_heuristic`` (about four
million non-causal KV tokens at head dim 128 give a negative split count, which the call then rejects).

Simplifications (stated once, here): only arch 90 is modelled; other architectures are refused
(refmodel.validation). The float32 here is IEEE round-to-nearest; FA3's prepare kernel is built with fast math,
and refmodel.fastmath says where its <= 2-ulp division can change a split count.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import fa3_builds
from .cint import c_ceil_div, c_div, to_int32
from .combine_limits import combine_capacity  # noqa: F401 - re-exported (its callers import it from here)
from .validation import appends_kv, check_call, check_call_split_count, check_precompute, effective_num_splits_argument

F32 = np.float32

#: FA3 assumes 50 MiB of L2 when deciding to split a long, non-causal KV head (heuristics.h).
L2_SPLIT_BYTES = 50 * 1024 * 1024
#: The prepare step budgets 8 MiB of L2 for heads-in-L2 swizzling (flash_prepare_scheduler.cu).
L2_SWIZZLE_BYTES = 8 * 1024 * 1024
#: `get_num_splits` caps the heuristic at 128 splits (flash_api.cpp).
HEURISTIC_MAX_SPLITS = 128
#: `mha_fwd` rejects more than 256 splits (flash_api.cpp: "num_splits > 256 not supported").
CALL_MAX_SPLITS = 256
#: One prepare CTA handles 32 warps of 31 batches; beyond that every split count is 1.
PREPARE_MAX_BATCH_ONE_CTA = fa3_builds.MAX_BATCHES_1CTA


def ceil_div(a: int, b: int) -> int:
    """Integer ceil(a / b) for b > 0, as `cutlass::ceil_div`."""
    return -(-a // b)


def element_size(dtype) -> int:
    """Bytes per element of q/k/v: 1 for float8_e4m3, 2 for bf16/fp16 (flash_api.cpp `is_e4m3 ? 1 : 2`)."""
    name = str(dtype).replace("torch.", "")
    if name in ("float8_e4m3fn", "float8_e4m3", "e4m3"):
        return 1
    if name in ("bfloat16", "float16", "half", "bf16", "fp16"):
        return 2
    from .errors import FA3Rejected
    raise FA3Rejected("qkv_dtype", "FlashAttention only supports fp16, bf16, and fp8_e4m3 data type",
                      "hopper/flash_api.cpp@0251105a:548-549", str(dtype))


def round_up_headdim(head_size: int) -> int:
    """Head dim rounded to FA3's compiled sizes 64/96/128/192/256 (flash_api.cpp `round_up_headdim`)."""
    for size in (64, 96, 128, 192, 256):
        if head_size <= size:
            return size
    return 256


def round_up_headdimv(head_size_v: int) -> int:
    """V head dim rounded to 64/96/128/192/256/512 (flash_api.cpp `round_up_headdimv`)."""
    for size in (64, 96, 128, 192, 256):
        if head_size_v <= size:
            return size
    return 512


def rounded_headdims(headdim: int, headdim_v: int) -> tuple[int, int]:
    """(d_rounded, dv_rounded) as both `mha_fwd` and the precompute set them (flash_api.cpp)."""
    d_rounded = round_up_headdim(headdim)
    dv_rounded = d_rounded if headdim_v == headdim else round_up_headdimv(headdim_v)
    return d_rounded, dv_rounded


def tile_size_fwd_sm90(headdim: int, headdim_v: int, is_causal: bool, is_local: bool, element_size: int = 2,
                       paged_kv_non_tma: bool = False, softcap: bool = False, v_colmajor: bool = False) -> tuple[int, int]:
    """(kBlockM, kBlockN) of FA3's sm90 forward kernel for the given head dims (hopper/tile_size.h 10-54).

    Upstream's table is data (refmodel/tile_size_sm90.json), read by the one rule reader every build shares.
    """
    return fa3_builds.tile_size_fwd_sm90_build(fa3_builds.UPSTREAM, headdim, headdim_v, is_causal, is_local,
                                               element_size, paged_kv_non_tma, softcap, v_colmajor)


def kernel_headdims(headdim: int, headdim_v: int, element_size: int = 2) -> tuple[int, int]:
    """(kHeadDim, kHeadDimV) of the kernel template `run_mha_fwd` dispatches to on sm90 (flash_api.cpp).

    The host computes tiles from (d_rounded, dv_rounded); the kernel's tiles come from these template
    dims. They differ for d <= 64 with 64 < dv <= 192, where the kernel runs the (64, 256) instance.
    """
    if element_size == 2:
        if headdim <= 64:
            if headdim_v > 256:
                return 64, 512
            if headdim_v > 64:
                return 64, 256
            return 64, 64
        if headdim <= 96:
            return 96, 96
        if headdim <= 128:
            return 128, 128
        if headdim <= 192:
            return (192, 128) if headdim_v <= 128 else (192, 192)
        return 256, 256
    if headdim <= 64:
        return 64, 64
    if headdim <= 96:
        return 96, 96
    if headdim <= 128:
        return 128, 128
    if headdim <= 192:
        return (192, 128) if headdim_v <= 128 else (192, 192)
    return 256, 256


@dataclass(frozen=True)
class Masking:
    """Resolved causal/local flags and windows (flash_api.cpp, after the window/causal rewriting)."""

    is_causal: bool
    is_local: bool
    window_left: int
    window_right: int


def resolve_masking(seqlen_q: int, seqlen_k: int, causal: bool, window_size: tuple[int, int] = (-1, -1),
                    attention_chunk: int = 0, headdim: int = 128, paged: bool = False) -> Masking:
    """FA3's causal/local resolution, identical in `mha_fwd` and the precompute (flash_api.cpp).

    Windows that cover everything become -1; a decode (seqlen_q == 1) call without window or chunk
    drops causal unless it is paged with 64 < d <= 128; causal sets window_right = 0.
    """
    wl, wr = int(window_size[0]), int(window_size[1])
    if wl >= seqlen_k - 1:
        wl = -1
    if wr >= seqlen_q - 1:
        wr = -1
    if seqlen_q == 1 and wl == -1 and wr == -1 and attention_chunk == 0:
        if headdim <= 64 or headdim > 128 or not paged:
            causal = False
    if causal:
        wr = 0
    is_causal = wl < 0 and wr == 0 and attention_chunk == 0
    is_local = (wl >= 0 or wr >= 0 or attention_chunk >= 1) and not is_causal
    if wl < 0:
        wl = seqlen_k - 1
    if wr < 0:
        wr = seqlen_q - 1
    if attention_chunk > 0:
        wl = min(wl, attention_chunk - 1)
        wr = min(wr, attention_chunk - 1)
    return Masking(is_causal, is_local, wl, wr)


def should_pack_gqa(varlen_q: bool, seqlen_q: int, qhead_per_khead: int, block_m: int) -> bool:
    """FA3's PackGQA heuristic: pack when it raises m-tile efficiency by over 10% (heuristics.h)."""
    if varlen_q:
        return True
    nopack = F32(seqlen_q) / F32(to_int32(c_ceil_div(seqlen_q, block_m) * block_m))
    packed_rows = to_int32(seqlen_q * qhead_per_khead)  # int, as heuristics.h:15 computes it
    pack = F32(packed_rows) / F32(to_int32(c_ceil_div(packed_rows, block_m) * block_m))
    return float(nopack) < 0.9 * float(pack)


def num_splits_heuristic(total_mblocks: int, num_sms: int, num_n_blocks: int, num_m_blocks: int,
                         size_one_kv_head: int, is_causal_or_local: bool, max_splits: int = HEURISTIC_MAX_SPLITS) -> int:
    """FA3's split count: the smallest split reaching 85% of the best wave efficiency (heuristics.h).

    Example from FA3's own comment: 48 m-blocks on 108 SMs gives 2 splits (efficiency 0.89).
    The L2 branch computes ``(size_one_kv_head + 50 MiB - 1) / 50 MiB`` in int: for a head of more than
    2^31 - 50 MiB bytes the sum wraps and the split count is negative (heuristics.h line 34).
    """
    if F32(total_mblocks) >= F32(0.8) * F32(num_sms):
        if size_one_kv_head > L2_SPLIT_BYTES and num_m_blocks >= to_int32(num_sms * 2) and not is_causal_or_local:
            return min(c_ceil_div(size_one_kv_head, L2_SPLIT_BYTES), max_splits)
        return 1
    if num_n_blocks <= 4:
        return 1
    return _efficient_split(total_mblocks, num_sms, min(max_splits, num_sms, num_n_blocks))


@functools.lru_cache(maxsize=1 << 16)
def _efficient_split(total_mblocks: int, num_sms: int, cap: int) -> int:
    # The smallest s <= cap whose efficiency reaches 85% of the best up to cap; a function of its three ints alone,
    # so it is remembered (a prover's length scan asks it again for every length with the same block counts).
    efficiency = split_efficiencies(total_mblocks, num_sms, cap)
    best = F32(0.0)
    for eff in efficiency:
        if eff > best:
            best = eff
    for s, eff in enumerate(efficiency, start=1):
        if float(eff) >= 0.85 * float(best):
            return s
    return 1


def split_efficiencies(total_mblocks: int, num_sms: int, cap: int) -> list:
    """float32 wave efficiency w/ceil(w), w = total_mblocks*s/num_sms, for s = 1..cap (heuristics.h)."""
    return list(_efficiency_table(total_mblocks, num_sms, max(cap, HEURISTIC_MAX_SPLITS))[:cap])


@functools.lru_cache(maxsize=1 << 16)
def _efficiency_table(total_mblocks: int, num_sms: int, length: int) -> tuple:
    # Each entry depends on its own s only, so one table per (total, SMs) serves every cap (a memo, same values).
    out = []
    for s in range(1, length + 1):
        n_waves = F32(to_int32(total_mblocks * s)) / F32(num_sms)
        out.append(F32(n_waves / F32(np.ceil(n_waves))))
    return tuple(out)


@dataclass(frozen=True)
class ScheduleInputs:
    """The inputs FA3's host code schedules from, on either side of the metadata hand-off.

    `batch_size`, `seqlen_q`, `seqlen_k` are the static sizes (max_seqlen_q / max_seqlen_k at precompute;
    q's and the cache's shapes at call time). `uses_prepare` is True when FA3 runs (or would run) the
    prepare step: always at precompute, and at call time when the call is varlen (cache_seqlens given).
    """

    batch_size: int
    seqlen_q: int
    seqlen_k: int
    num_heads: int
    num_heads_k: int
    headdim: int
    headdim_v: int
    element_size: int = 2
    causal: bool = False
    window_size: tuple[int, int] = (-1, -1)
    attention_chunk: int = 0
    has_softcap: bool = False
    page_size: Optional[int] = None
    varlen_q: bool = False
    has_leftpad: bool = False
    seqlen_knew: int = 0
    num_splits: int = 0
    pack_gqa: Optional[bool] = None
    num_sm: int = 132
    arch: int = 90
    uses_prepare: bool = True
    precompute: bool = True
    has_seqused_k: bool = True
    has_k_new: bool = False
    build: str = fa3_builds.UPSTREAM
    #: FA3's ``params.total_q``: the call's query rows (b * seqlen_q, or q.size(0) when varlen); the precompute
    #: (``mha_fwd_get_scheduler_metadata``) leaves it 0. Read only by builds whose get_num_splits bounds a varlen
    #: call by it (refmodel.fa3_builds ``varlen_total_q_bound``); None means 0.
    total_q: Optional[int] = None

    @property
    def paged(self) -> bool:
        return self.page_size is not None

    @property
    def appends_kv(self) -> bool:
        """Whether new KV is appended (FA3's ``params.knew_ptr``; refmodel.validation ``appends_kv``)."""
        return appends_kv(self)


#: ScheduleInputs' field names (``with_inputs`` accepts exactly these, as ``dataclasses.replace`` does).
_INPUT_FIELDS = frozenset(f.name for f in dataclasses.fields(ScheduleInputs))


def with_inputs(inp: ScheduleInputs, **changes) -> ScheduleInputs:
    """``dataclasses.replace(inp, **changes)`` for ScheduleInputs, without running ``__init__`` again.

    ScheduleInputs is a frozen dataclass of plain fields (no ``__post_init__``, no cached properties), so the copy
    with the changed fields set is the object ``replace`` builds: equal, with the same hash. The provers build
    tens of thousands of these (one per table point, per side, per query class); ``replace`` was most of their cost.
    tests/oracle/test_with_inputs.py checks the two agree.
    """
    if type(inp) is not ScheduleInputs or hasattr(inp, "__post_init__"):
        return dataclasses.replace(inp, **changes)
    unknown = changes.keys() - _INPUT_FIELDS
    if unknown:
        raise TypeError(f"with_inputs: ScheduleInputs has no field(s) {sorted(unknown)}")
    out = object.__new__(ScheduleInputs)
    state = out.__dict__
    state.update(inp.__dict__)
    state.update(changes)
    return out


@dataclass(frozen=True)
class Schedule:
    """FA3's resolved scheduling decisions for one side (flash_api.cpp), derived by `resolve_schedule`."""

    inputs: ScheduleInputs
    masking: Masking
    d_rounded: int
    dv_rounded: int
    pagedkv_tma: bool
    block_m: int
    block_n: int
    num_splits: int
    pack_gqa: bool
    sort: bool
    swizzle: bool
    needs_semaphore: bool
    kernel_block_m: int
    kernel_block_n: int
    kernel_pack_gqa: bool

    @property
    def b4(self) -> int:
        return ceil_div(self.inputs.batch_size, 4) * 4

    @property
    def num_vectors(self) -> int:
        """Per-batch vectors in the metadata: 2 (+1 Sort, +1 Swizzle) with the prepare step (the fork: fa3_builds)."""
        kind = fa3_builds.metadata_layout_kind(self.inputs.build)
        if kind != "upstream":   # the fork's vectors; the older fork's split vector alone
            return int(self.legacy_dynamic_split) if kind == "semaphore-splits" else fa3_builds.fork_metadata_vectors(
                self.inputs.uses_prepare, self.inputs.batch_size, self.num_splits, self.swizzle)
        base = 2 if self.inputs.uses_prepare else 0
        return base + int(self.sort) + int(self.swizzle)

    @property
    def metadata_size(self) -> int:
        """Length of the int32 metadata tensor this side produces or expects (flash_api.cpp)."""
        if fa3_builds.metadata_layout_kind(self.inputs.build) == "semaphore-splits":   # sem + b splits, no b4
            return int(self.needs_semaphore) + int(self.legacy_dynamic_split) * self.inputs.batch_size  # @a8937124 1012
        if not (self.needs_semaphore or self.inputs.uses_prepare):
            return 0
        return int(self.needs_semaphore) + self.b4 * self.num_vectors

    @property
    def legacy_dynamic_split(self) -> bool:
        """The older fork's split vector (fa3_builds ``legacy_uses_dynamic_split``); False for other layouts."""
        return fa3_builds.metadata_layout_kind(self.inputs.build) == "semaphore-splits" and \
            fa3_builds.legacy_uses_dynamic_split(self.inputs.precompute, self.inputs.uses_prepare,
                                                 self.inputs.batch_size, self.inputs.num_splits, self.inputs.build)

    @property
    def qhead_per_khead(self) -> int:
        return ceil_div(self.inputs.num_heads, self.inputs.num_heads_k)

    @property
    def prepare_num_heads(self) -> int:
        """Head count the prepare step multiplies by: h_k when PackGQA, else h."""
        return self.inputs.num_heads_k if self.pack_gqa else self.inputs.num_heads


def one_mma_wg(inp: ScheduleInputs, masking: Masking, pack_gqa: Optional[bool] = None) -> bool:
    """The build's decode tile choice (refmodel.fa3_builds ``decode_tile``; ``pack_gqa`` read by 8798f277 only)."""
    return fa3_builds.decode_tile(inp.build, inp.arch, inp.headdim, masking.is_local, inp.seqlen_q,
                                  c_div(inp.num_heads, inp.num_heads_k), pack_gqa)


def build_tile(inp: ScheduleInputs, masking: Masking, headdim: int, headdim_v: int,
               paged_kv_non_tma: bool, pack_gqa: Optional[bool] = None) -> tuple[int, int]:
    """(kBlockM, kBlockN) under the inputs' build: that build's table (refmodel.fa3_builds ``tile_size_fwd_sm90_build``)."""
    return fa3_builds.tile_size_fwd_sm90_build(inp.build, headdim, headdim_v, masking.is_causal, masking.is_local,
                                               inp.element_size, paged_kv_non_tma, softcap=inp.has_softcap,
                                               one_mma_wg=one_mma_wg(inp, masking, pack_gqa))


def pagedkv_tma(inp: ScheduleInputs, masking: Masking, d_rounded: int, dv_rounded: int) -> bool:
    """Whether paged KV uses TMA: page_size % kBlockN == 0 and seqlen_q*qhpk > kBlockM (flash_api.cpp).

    The vLLM fork also refuses TMA for local attention (vllm-project/flash-attention@617264c1 flash_api.cpp 466).
    """
    if inp.arch < 90 or not inp.paged or inp.has_leftpad or inp.appends_kv:
        return False
    if fa3_builds.fork_host_rules(inp.build) and masking.is_local:
        return False
    bm, bn = build_tile(inp, masking, d_rounded, dv_rounded, paged_kv_non_tma=False)
    # `params.seqlen_q * (params.h / params.h_k)` is a C++ int product: it wraps past 2^31 - 1
    return inp.page_size % bn == 0 and to_int32(inp.seqlen_q * (inp.num_heads // inp.num_heads_k)) > bm


def get_num_splits(inp: ScheduleInputs, masking: Optional[Masking] = None) -> int:
    """Split count FA3 chooses: the argument when positive, else the heuristic (flash_api.cpp `get_num_splits`).

    With the prepare step (varlen) total_mblocks pretends batch = 1, an upper bound for dynamic splits.
    Every intermediate is a C++ int (flash_api.cpp lines 456-468): seqlen_q * qhpk, the block counts, the KV
    head's byte size and total_mblocks wrap past 2^31 - 1. The argument is FA3's int64 narrowed to int.
    """
    if inp.num_splits > 0:
        return effective_num_splits_argument(inp.num_splits)
    masking = masking or resolve_masking(inp.seqlen_q, inp.seqlen_k, inp.causal, inp.window_size,
                                         inp.attention_chunk, inp.headdim, inp.paged)
    return _heuristic_at(inp, inp.seqlen_k, masking, _split_tiles(inp, masking))


def num_splits_over_lengths(inp: ScheduleInputs, seqlen_ks) -> tuple[int, ...]:
    """`get_num_splits` of `inp` at each static seqlen_k of `seqlen_ks`, in one pass.

    The same function as ``get_num_splits(replace(inp, seqlen_k=L))`` for every L (the same two helpers): only
    the masking's window and the lengths read seqlen_k; the tiles, TMA choice and m-blocks read the masking's
    causal/local flags alone (`_split_tiles`), so they are worked out once per flag pair instead of per length.
    """
    if inp.num_splits > 0:
        return tuple(effective_num_splits_argument(inp.num_splits) for _ in seqlen_ks)
    per_flags: dict = {}
    out = []
    for seqlen_k in seqlen_ks:
        masking = resolve_masking(inp.seqlen_q, seqlen_k, inp.causal, inp.window_size, inp.attention_chunk,
                                  inp.headdim, inp.paged)
        flags = (masking.is_causal, masking.is_local)
        tiles = per_flags.get(flags)
        if tiles is None:
            tiles = per_flags[flags] = _split_tiles(inp, masking)
        out.append(_heuristic_at(inp, seqlen_k, masking, tiles))
    return tuple(out)


#: `get_num_splits` carries its own one-pass form (spec.theorems.symbolic `splits_over_lengths` reads it; a heuristic
#: without the attribute is called once per length).
get_num_splits.over_lengths = num_splits_over_lengths


def get_num_splits_resolved(inp: ScheduleInputs, masking: Masking, tma: bool) -> int:
    """`get_num_splits`'s heuristic on already-resolved masking and a given paged-KV TMA choice (FA3's
    ``params`` fields as the function reads them: the form a wheel's compiled get_num_splits is called in)."""
    return _heuristic_at(inp, inp.seqlen_k, masking, _split_tiles(inp, masking, tma=tma))


def _split_tiles(inp: ScheduleInputs, masking: Masking, tma: Optional[bool] = None) -> tuple[int, int, int, int]:
    """(kBlockM, kBlockN, m_blocks, total_mblocks) of `get_num_splits` (flash_api.cpp 456-466): they read the
    masking's causal/local flags, never seqlen_k or the window. ``tma`` replaces the paged-KV TMA choice (a
    vector that gives ``params.pagedkv_tma`` directly)."""
    d_r, dv_r = rounded_headdims(inp.headdim, inp.headdim_v)
    if tma is None:
        tma = pagedkv_tma(inp, masking, d_r, dv_r)
    pre_pack = bool(fa3_builds.build(inp.build).pack_gqa_is_split and get_pack_gqa(inp, 0, masking, tma))  # @8798f277 589
    bm, bn = build_tile(inp, masking, d_r, dv_r, paged_kv_non_tma=inp.paged and not tma, pack_gqa=pre_pack)
    qhpk = c_div(inp.num_heads, inp.num_heads_k)
    m_blocks = c_ceil_div(to_int32(inp.seqlen_q * qhpk), bm)
    if inp.uses_prepare and fa3_builds.build(inp.build).varlen_total_q_bound:
        # the sglang kernels from 0.4.5: h_k * ceil(rows * qhpk / kBlockM), rows = params.total_q when > 0, else
        # b * seqlen_q (read from their compiled get_num_splits; 32-bit int products)
        rows = int(inp.total_q or 0)
        if rows <= 0:
            rows = to_int32(inp.batch_size * inp.seqlen_q)
        total_mblocks = to_int32(c_ceil_div(to_int32(rows * qhpk), bm) * inp.num_heads_k)
    else:
        one = inp.uses_prepare if fa3_builds.metadata_layout_kind(inp.build) != "semaphore-splits" else \
            fa3_builds.legacy_uses_dynamic_split(inp.precompute, inp.uses_prepare, inp.batch_size, inp.num_splits,
                                                 inp.build)
        total_mblocks = to_int32((1 if one else inp.batch_size) * inp.num_heads_k * m_blocks)
    return bm, bn, m_blocks, total_mblocks


def _heuristic_at(inp: ScheduleInputs, seqlen_k: int, masking: Masking, tiles: tuple[int, int, int, int]) -> int:
    """The heuristic's call of `get_num_splits` at static length `seqlen_k` under `masking` (flash_api.cpp
    459-468): the loaded length (a local window caps it), its block count and the KV head's byte size."""
    bm, bn, m_blocks, total_mblocks = tiles
    if masking.is_local:
        window = to_int32(to_int32(to_int32(masking.window_right + masking.window_left) + 1) + bm)
        seqlen_k_loaded = max(0, min(seqlen_k, window))
    else:
        seqlen_k_loaded = seqlen_k
    n_blocks = c_ceil_div(seqlen_k_loaded, bn)
    size_one_kv_head = to_int32(seqlen_k * (inp.headdim + inp.headdim_v) * inp.element_size)
    return num_splits_heuristic(total_mblocks, inp.num_sm, n_blocks, m_blocks, size_one_kv_head,
                                masking.is_causal or masking.is_local, HEURISTIC_MAX_SPLITS)


def forced_pack_gqa(arch: int, paged_kv_non_tma: bool, num_splits: int) -> bool:
    """FA3 always packs GQA below sm90, for paged KV without TMA and for Split (flash_api.cpp 427-429, 377).

    ``get_pack_gqa`` returns True for these before any heuristic; the kernel template forces PackGQA for the same
    three (``PackGQA_ || Arch < 90 || PagedKVNonTMA || Split``), whatever ``pack_gqa`` was passed.
    """
    return int(arch) < 90 or bool(paged_kv_non_tma) or int(num_splits) > 1


def get_pack_gqa(inp: ScheduleInputs, num_splits: int, masking: Masking, tma: bool) -> bool:
    """FA3's PackGQA decision: forced for sm8x, paged-non-TMA or Split; else the heuristic (flash_api.cpp)."""
    if inp.pack_gqa is not None:
        return bool(inp.pack_gqa)
    if forced_pack_gqa(inp.arch, inp.paged and not tma, num_splits):
        return True
    if fa3_builds.fork_host_rules(inp.build) and fa3_builds.fork_packgqa_override(
            inp.arch, c_div(inp.num_heads, inp.num_heads_k), masking.is_local, inp.headdim, inp.headdim_v):
        return True
    if inp.num_heads == inp.num_heads_k:
        return False
    d_r, dv_r = rounded_headdims(inp.headdim, inp.headdim_v)
    bm, _ = build_tile(inp, masking, d_r, dv_r, paged_kv_non_tma=inp.paged and not tma)
    return should_pack_gqa(inp.varlen_q, inp.seqlen_q, inp.num_heads // inp.num_heads_k, bm)


def scheduler_needs_semaphore(arch: int, precompute: bool, is_causal: bool, is_local: bool, num_splits: int,
                              varlen: bool) -> bool:
    """Whether the metadata ends in the tile-count semaphore slot (flash_api.cpp@0251105a 623 and 990-992).

    The precompute: ``arch >= 90 || num_splits > 1``. The call: on sm90 ``((causal || local) && num_splits == 1) ||
    varlen``; on sm8x ``(causal && !varlen) || (varlen && num_splits > 1)``. So on sm90 a varlen call's metadata size
    never depends on the split count, and on sm8x both sides' sizes do (only sm90 is modelled otherwise:
    refmodel.validation).
    """
    if precompute:
        return arch >= 90 or num_splits > 1
    if arch >= 90:
        return ((is_causal or is_local) and num_splits == 1) or bool(varlen)
    return (is_causal and not varlen) or (bool(varlen) and num_splits > 1)


def resolve_schedule(inp: ScheduleInputs) -> Schedule:
    """All of FA3's host-side decisions for one side of the hand-off, in FA3's order (flash_api.cpp)."""
    validate_schedule_inputs(inp)
    masking = resolve_masking(inp.seqlen_q, inp.seqlen_k, inp.causal, inp.window_size, inp.attention_chunk,
                              inp.headdim, inp.paged)
    d_r, dv_r = rounded_headdims(inp.headdim, inp.headdim_v)
    tma = pagedkv_tma(inp, masking, d_r, dv_r)
    non_tma = inp.paged and not tma
    num_splits = get_num_splits(inp, masking)
    pack = get_pack_gqa(inp, num_splits, masking, tma)
    layout = fa3_builds.metadata_layout_kind(inp.build)
    fork = layout == "fork"
    if fork:
        pack = fa3_builds.fork_packgqa(pack, num_splits, inp.headdim, inp.headdim_v)
        if not inp.precompute and inp.uses_prepare and inp.batch_size > PREPARE_MAX_BATCH_ONE_CTA:
            num_splits = 1   # the fork's call: no split for a varlen batch over 992 (flash_api.cpp 1070)
    elif fa3_builds.build(inp.build).pack_gqa_is_split:
        pack = num_splits > 1   # replaced by Split (flash_api.cpp@8798f277 592, 947)
    elif layout == "semaphore-splits":
        pack = bool(pack) or num_splits > 1   # OR-ed with Split only (flash_api.cpp@a8937124 631, 1003)
    bm, bn = build_tile(inp, masking, d_r, dv_r, paged_kv_non_tma=non_tma, pack_gqa=pack)
    kd, kdv = kernel_headdims(inp.headdim, inp.headdim_v, inp.element_size)
    kbm, kbn = build_tile(inp, masking, kd, kdv, paged_kv_non_tma=non_tma, pack_gqa=pack)
    needs_sem = scheduler_needs_semaphore(inp.arch, inp.precompute, masking.is_causal, masking.is_local, num_splits,
                                          inp.uses_prepare)
    kernel_pack = pack or forced_pack_gqa(inp.arch, non_tma, num_splits)
    if not inp.precompute:
        check_call_split_count(num_splits, kernel_runs=inp.batch_size > 0 and inp.seqlen_q > 0)
    return Schedule(inputs=inp, masking=masking, d_rounded=d_r, dv_rounded=dv_r, pagedkv_tma=tma,
                    block_m=bm, block_n=bn, num_splits=num_splits, pack_gqa=pack,
                    sort=not masking.is_local and layout == "upstream", swizzle=masking.is_causal or masking.is_local,
                    needs_semaphore=needs_sem, kernel_block_m=kbm, kernel_block_n=kbn, kernel_pack_gqa=kernel_pack)


def validate_schedule_inputs(inp: ScheduleInputs) -> None:
    """Accept and reject exactly what FA3 does for this side (refmodel.validation; flash_api.cpp TORCH_CHECKs).

    The precompute checks only h % h_k (and the dtype); the call checks head dims, alignment and appended KV.
    """
    (check_precompute if inp.precompute else check_call)(inp)


def precompute_inputs(batch_size: int, max_seqlen_q: int, max_seqlen_k: int, num_heads_q: int, num_heads_kv: int,
                      headdim: int, qkv_dtype="bfloat16", headdim_v: Optional[int] = None, varlen_q: bool = False,
                      has_leftpad: bool = False, page_size: Optional[int] = None, max_seqlen_k_new: int = 0,
                      causal: bool = False, window_size=(-1, -1), attention_chunk: int = 0, has_softcap: bool = False,
                      num_splits: int = 0, pack_gqa: Optional[bool] = None, sm_margin: int = 0,
                      num_sm: int = 132, arch: int = 90, build: str = fa3_builds.UPSTREAM) -> ScheduleInputs:
    """ScheduleInputs for `get_scheduler_metadata`'s arguments (flash_attn_interface.py, flash_api.cpp)."""
    return ScheduleInputs(
        batch_size=int(batch_size), seqlen_q=int(max_seqlen_q), seqlen_k=int(max_seqlen_k),
        num_heads=int(num_heads_q), num_heads_k=int(num_heads_kv), headdim=int(headdim),
        headdim_v=int(headdim if headdim_v is None else headdim_v), element_size=element_size(qkv_dtype),
        causal=bool(causal), window_size=(int(window_size[0]), int(window_size[1])),
        attention_chunk=int(attention_chunk), has_softcap=bool(has_softcap),
        page_size=None if page_size is None else int(page_size), varlen_q=bool(varlen_q),
        has_leftpad=bool(has_leftpad), seqlen_knew=int(max_seqlen_k_new), num_splits=int(num_splits),
        pack_gqa=pack_gqa, num_sm=int(num_sm) - int(sm_margin), arch=int(arch), uses_prepare=True, precompute=True,
        build=fa3_builds.check_build_name(build))


def call_inputs(batch_size: int, seqlen_q: int, seqlen_k: int, num_heads: int, num_heads_k: int, headdim: int,
                headdim_v: Optional[int] = None, qkv_dtype="bfloat16", varlen_q: bool = False,
                has_cache_seqlens: bool = True, has_leftpad: bool = False, page_size: Optional[int] = None,
                seqlen_knew: int = 0, causal: bool = False, window_size=(-1, -1), attention_chunk: int = 0,
                has_softcap: bool = False, num_splits: int = 0, pack_gqa: Optional[bool] = None,
                sm_margin: int = 0, num_sm: int = 132, arch: int = 90,
                has_k_new: Optional[bool] = None, build: str = fa3_builds.UPSTREAM,
                total_q: Optional[int] = None) -> ScheduleInputs:
    """ScheduleInputs for a `flash_attn_with_kvcache` call, from its shapes (flash_api.cpp `mha_fwd`).

    `seqlen_k` is the cache's size(1), or page_table.size(1) * page_size when paged; the call is varlen
    (runs the prepare step) when cache_seqlens, cu_seqlens_q or leftpad is given. `has_k_new` says whether
    `k_new` is passed (default: `seqlen_knew > 0`); a varlen `k_new` is passed with `seqlen_knew` 0.
    """
    uses_prepare = bool(varlen_q or has_cache_seqlens or has_leftpad)
    return ScheduleInputs(
        batch_size=int(batch_size), seqlen_q=int(seqlen_q), seqlen_k=int(seqlen_k), num_heads=int(num_heads),
        num_heads_k=int(num_heads_k), headdim=int(headdim), headdim_v=int(headdim if headdim_v is None else headdim_v),
        element_size=element_size(qkv_dtype), causal=bool(causal),
        window_size=(int(window_size[0]), int(window_size[1])), attention_chunk=int(attention_chunk),
        has_softcap=bool(has_softcap), page_size=None if page_size is None else int(page_size),
        varlen_q=bool(varlen_q), has_leftpad=bool(has_leftpad), seqlen_knew=int(seqlen_knew),
        num_splits=int(num_splits), pack_gqa=pack_gqa, num_sm=int(num_sm) - int(sm_margin), arch=int(arch),
        uses_prepare=uses_prepare, precompute=False, has_seqused_k=bool(has_cache_seqlens),
        has_k_new=bool(int(seqlen_knew) > 0 if has_k_new is None else has_k_new),
        build=fa3_builds.check_build_name(build),
        total_q=int(batch_size) * int(seqlen_q) if total_q is None and not varlen_q else total_q)
