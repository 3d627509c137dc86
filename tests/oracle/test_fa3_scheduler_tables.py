"""Pins of refmodel.fa3_scheduler: FA3's host-side tables and heuristics, value by value.

Sources: Dao-AILab/flash-attention `hopper/` at 0251105a: `tile_size.h` (tile_size_fwd_sm90, lines 10-54),
`heuristics.h` (should_pack_gqa 9-17, num_splits_heuristic 25-59), `flash_api.cpp` (run_mha_fwd_constexpr
256-360, get_pagedkv_tma 415-424, get_pack_gqa 426-440, get_num_splits 442-471, round_up_headdim 492-525,
mha_fwd_get_scheduler_metadata 576-661), `flash_fwd_combine_launch_template.h` (kMax). Each expected value is
read off those lines; the model only has to agree.
"""

import pytest

from refmodel import call_inputs, precompute_inputs, resolve_masking, resolve_schedule
from refmodel.fa3_scheduler import (
    combine_capacity,
    element_size,
    get_num_splits,
    kernel_headdims,
    num_splits_heuristic,
    pagedkv_tma,
    round_up_headdim,
    round_up_headdimv,
    rounded_headdims,
    should_pack_gqa,
    split_efficiencies,
    tile_size_fwd_sm90,
)

# (d, dv, causal, local, element_size, paged_kv_non_tma, softcap, v_colmajor) -> (kBlockM, kBlockN), tile_size.h
TILES = [
    ((64, 512, False, False, 2, False, False, False), (64, 64)),      # line 19
    ((64, 256, False, False, 2, False, False, False), (128, 96)),     # line 21
    ((64, 64, False, False, 2, False, False, False), (192, 192)),     # lines 24-25
    ((64, 128, False, False, 2, False, False, False), (192, 192)),
    ((64, 64, True, False, 2, False, False, False), (192, 128)),
    ((64, 64, False, True, 2, False, False, False), (192, 128)),
    ((64, 64, False, False, 2, True, False, False), (192, 128)),
    ((96, 96, False, False, 2, False, False, False), (192, 144)),     # line 30
    ((96, 96, True, False, 2, False, False, False), (192, 144)),      # causal does not matter at 96
    ((96, 96, False, True, 2, False, False, False), (192, 128)),
    ((96, 96, False, False, 2, True, False, False), (192, 128)),
    ((128, 128, False, False, 2, False, False, False), (128, 176)),   # lines 32-33
    ((128, 128, True, False, 2, False, False, False), (128, 128)),
    ((128, 128, False, True, 2, False, False, False), (128, 128)),
    ((128, 128, False, False, 2, True, False, False), (128, 128)),
    ((192, 128, False, False, 2, False, False, False), (128, 128)),   # line 37
    ((192, 192, False, False, 2, False, False, False), (128, 112)),
    ((192, 192, True, False, 2, False, False, False), (128, 112)),    # causal does not matter at 192
    ((192, 128, False, True, 2, False, False, False), (128, 96)),
    ((192, 192, False, False, 2, True, False, False), (128, 96)),
    ((256, 256, False, False, 2, False, False, False), (128, 80)),    # line 39
    ((256, 256, True, False, 2, False, False, False), (128, 80)),
    ((256, 256, False, True, 2, False, False, False), (128, 64)),
    ((256, 256, False, False, 2, True, False, False), (128, 80)),
    ((64, 64, False, False, 1, False, False, False), (192, 160)),     # line 43 (fp8)
    ((64, 64, True, True, 1, True, True, True), (192, 160)),
    ((96, 96, False, False, 1, False, False, False), (192, 128)),     # line 45
    ((96, 96, False, True, 1, True, True, False), (192, 128)),
    ((128, 128, False, False, 1, False, False, False), (128, 224)),   # line 47
    ((128, 128, False, False, 1, True, False, False), (128, 160)),
    ((128, 128, False, False, 1, True, True, True), (128, 160)),      # paged non-TMA wins
    ((128, 128, False, False, 1, False, False, True), (128, 192)),
    ((128, 128, False, True, 1, False, True, False), (128, 192)),     # softcap and local
    ((128, 128, False, False, 1, False, True, False), (128, 224)),    # softcap alone
    ((128, 128, False, True, 1, False, False, False), (128, 224)),    # local alone
    ((192, 192, False, False, 1, False, False, False), (128, 160)),   # line 49
    ((192, 192, False, True, 1, True, False, False), (128, 128)),
    ((192, 192, False, True, 1, False, True, False), (128, 128)),
    ((192, 192, False, False, 1, True, True, False), (128, 160)),     # not local
    ((192, 192, False, True, 1, False, False, False), (128, 160)),    # local alone
    ((256, 256, False, False, 1, False, False, False), (128, 128)),   # line 51
    ((256, 256, False, True, 1, False, False, False), (128, 64)),
]


@pytest.mark.parametrize("args, expected", TILES)
def test_sm90_tile_table(args, expected):
    d, dv, causal, local, elem, pnt, softcap, vcol = args
    assert tile_size_fwd_sm90(d, dv, causal, local, elem, paged_kv_non_tma=pnt, softcap=softcap,
                              v_colmajor=vcol) == expected


@pytest.mark.parametrize("d, dv, elem, expected", [
    # run_mha_fwd_constexpr, flash_api.cpp 260-292 (bf16/fp16) and 338-359 (fp8)
    (64, 512, 2, (64, 512)), (64, 257, 2, (64, 512)), (64, 256, 2, (64, 256)), (64, 65, 2, (64, 256)),
    (64, 64, 2, (64, 64)), (96, 96, 2, (96, 96)), (128, 128, 2, (128, 128)), (192, 128, 2, (192, 128)),
    (192, 129, 2, (192, 192)), (256, 256, 2, (256, 256)),
    (64, 512, 1, (64, 64)), (96, 96, 1, (96, 96)), (128, 128, 1, (128, 128)), (192, 128, 1, (192, 128)),
    (192, 192, 1, (192, 192)), (256, 256, 1, (256, 256)),
])
def test_kernel_head_dims(d, dv, elem, expected):
    assert kernel_headdims(d, dv, elem) == expected


def test_head_dim_rounding():
    # flash_api.cpp 492-525
    assert [round_up_headdim(x) for x in (1, 64, 65, 96, 97, 128, 129, 192, 193, 256, 300)] == \
        [64, 64, 96, 96, 128, 128, 192, 192, 256, 256, 256]
    assert [round_up_headdimv(x) for x in (64, 65, 96, 97, 128, 129, 192, 193, 256, 257, 512)] == \
        [64, 96, 96, 128, 128, 192, 192, 256, 256, 512, 512]
    # dv_rounded is d_rounded when dv == d (flash_api.cpp 563-564), else round_up_headdimv
    assert rounded_headdims(300, 300) == (256, 256)
    assert rounded_headdims(300, 257) == (256, 512)
    assert rounded_headdims(64, 512) == (64, 512)


def test_element_sizes_and_dtype_refusal():
    assert [element_size(t) for t in ("bfloat16", "float16", "torch.float16", "half", "bf16", "fp16")] == [2] * 6
    assert [element_size(t) for t in ("float8_e4m3fn", "float8_e4m3", "e4m3")] == [1, 1, 1]
    from refmodel import FA3Rejected
    with pytest.raises(FA3Rejected) as info:
        element_size("float32")
    assert info.value.field == "qkv_dtype" and info.value.got == "float32"
    assert info.value.fa3_message == "FlashAttention only supports fp16, bf16, and fp8_e4m3 data type"
    assert info.value.source == "hopper/flash_api.cpp@0251105a:548-549"


@pytest.mark.parametrize("varlen, sq, qhpk, bm, expected", [
    (True, 128, 1, 128, True),       # line 11: varlen always packs
    (False, 128, 4, 128, False),     # nopack 1.0 vs 0.9 * 1.0
    (False, 1, 4, 128, True),        # 1/128 < 0.9 * 4/128
    (False, 100, 2, 128, False),     # nopack 100/128 = 0.78125, pack 200/256 = 0.78125: not < 0.703
    (False, 10, 8, 64, True),        # nopack 10/64 = 0.156, pack 80/128 = 0.625 (line 15: rows rounded to 64)
])
def test_should_pack_gqa(varlen, sq, qhpk, bm, expected):
    assert should_pack_gqa(varlen, sq, qhpk, bm) is expected


def test_should_pack_gqa_boundary_is_strict_and_uses_rounded_rows():
    # sq 64, bm 128: nopack 0.5; qhpk 2: 128/128 = 1.0 -> 0.5 < 0.9 packs; qhpk 1 never packs (equal)
    assert should_pack_gqa(False, 64, 2, 128) is True
    assert should_pack_gqa(False, 64, 1, 128) is False
    # sq 120, qhpk 3, bm 128: nopack 120/128 = 0.9375; pack 360/384 = 0.9375: no
    assert should_pack_gqa(False, 120, 3, 128) is False


def test_split_heuristic_thresholds():
    # line 29: total >= 0.8f * num_SMs in float: 105.6 for 132 SMs -> 106 is full, 105 is not
    assert num_splits_heuristic(106, 132, 100, 1, 0, False) == 1
    assert num_splits_heuristic(105, 132, 100, 1, 0, False) > 1
    # line 40: n_blocks <= 4 never splits, 5 may
    assert num_splits_heuristic(1, 132, 4, 1, 0, False) == 1
    assert num_splits_heuristic(1, 132, 5, 1, 0, False) == 5        # eff(s) = s/132 grows: best at s=5, 0.85*5 -> 5
    # line 41: the cap is min(max_splits, SMs, n_blocks): 1 m-block on 132 SMs with 200 n-blocks -> cap 128,
    # best eff 128/132 = 0.97, smallest s with s/132 >= 0.824 is 109
    assert num_splits_heuristic(1, 132, 200, 1, 0, False) == 109
    assert num_splits_heuristic(1, 132, 200, 1, 0, False, max_splits=64) == 55   # 0.85 * 64 = 54.4
    assert num_splits_heuristic(1, 16, 200, 1, 0, False) == 14      # cap 16 SMs: 0.85 * 16 = 13.6
    assert num_splits_heuristic(1, 132, 50, 1, 0, False) == 43      # cap 50 n-blocks: 0.85 * 50 = 42.5


def test_split_heuristic_l2_branch():
    # lines 29-37: full machine, KV head > 50 MiB, m-blocks >= 2 * SMs, not causal/local -> ceil(size / 50 MiB)
    mib = 2**20
    assert num_splits_heuristic(300, 132, 1000, 264, 101 * mib, False) == 3       # m-blocks == 2*SMs: splits
    assert num_splits_heuristic(300, 132, 1000, 263, 101 * mib, False) == 1       # one short
    assert num_splits_heuristic(300, 132, 1000, 300, 50 * mib, False) == 1        # exactly 50 MiB: not larger
    assert num_splits_heuristic(300, 132, 1000, 300, 50 * mib + 1, False) == 2
    assert num_splits_heuristic(300, 132, 1000, 300, 1900 * mib, False) == 38     # ceil(1900 / 50)
    assert num_splits_heuristic(300, 132, 1000, 300, 1900 * mib, False, max_splits=7) == 7   # min(38, 7)


def test_split_efficiencies_are_waves_over_their_ceiling():
    # line 46-47: n_waves = float(total * s) / SMs; eff = n_waves / ceil(n_waves)
    effs = [float(e) for e in split_efficiencies(48, 108, 4)]
    assert effs == pytest.approx([48 / 108, 96 / 108, 144 / 108 / 2, 192 / 108 / 2], rel=1e-6)
    assert len(split_efficiencies(48, 108, 3)) == 3


def test_masking_resolution_follows_the_precompute():
    # flash_api.cpp 576-597
    m = resolve_masking(100, 1000, False, (999, -1))          # left window >= seqlen_k - 1 -> -1: no mask
    assert (m.is_causal, m.is_local, m.window_left, m.window_right) == (False, False, 999, 99)
    m = resolve_masking(100, 1000, False, (998, -1))          # 998 < 999: local
    assert (m.is_causal, m.is_local, m.window_left, m.window_right) == (False, True, 998, 99)
    m = resolve_masking(100, 1000, False, (-1, 99))           # right window >= seqlen_q - 1 -> -1
    assert (m.is_causal, m.is_local) == (False, False)
    m = resolve_masking(100, 1000, False, (-1, 98))
    assert (m.is_causal, m.is_local, m.window_left, m.window_right) == (False, True, 999, 98)
    m = resolve_masking(100, 1000, False, (-1, 0))            # right 0 without causal is causal (line 587)
    assert (m.is_causal, m.is_local, m.window_right) == (True, False, 0)
    m = resolve_masking(100, 1000, True, (50, -1))            # causal with a left window is local
    assert (m.is_causal, m.is_local, m.window_left, m.window_right) == (False, True, 50, 0)
    m = resolve_masking(100, 1000, False, (-1, -1), attention_chunk=64)   # chunk: local, windows capped at 63
    assert (m.is_causal, m.is_local, m.window_left, m.window_right) == (False, True, 63, 63)
    m = resolve_masking(100, 1000, True, (-1, -1), attention_chunk=1)
    assert (m.is_causal, m.is_local, m.window_left, m.window_right) == (False, True, 0, 0)


@pytest.mark.parametrize("headdim, paged, causal_kept", [
    # line 579-583: decode without window drops causal unless paged with 64 < d <= 128
    (64, True, False), (65, True, True), (128, True, True), (129, True, False), (128, False, False),
])
def test_decode_drops_causal_except_paged_d_64_to_128(headdim, paged, causal_kept):
    m = resolve_masking(1, 1000, True, (-1, -1), headdim=headdim, paged=paged)
    assert m.is_causal is causal_kept
    assert resolve_masking(2, 1000, True, (-1, -1), headdim=headdim, paged=paged).is_causal is True
    assert resolve_masking(1, 1000, True, (-1, -1), attention_chunk=8, headdim=headdim, paged=paged).is_local


def test_paged_kv_tma_rule():
    # get_pagedkv_tma (415-424): page_size % kBlockN == 0 and seqlen_q * (h / h_k) > kBlockM; never with
    # leftpad or new KV. d 128 non-causal: 128 x 176.
    def tma(sq, h, hk, page, **kw):
        inp = precompute_inputs(4, sq, 4096, h, hk, 128, page_size=page, **kw)
        m = resolve_masking(sq, 4096, False, headdim=128, paged=True)
        return pagedkv_tma(inp, m, 128, 128)
    assert tma(129, 8, 8, 176) is True
    assert tma(128, 8, 8, 176) is False          # 128 rows is not > kBlockM
    assert tma(33, 32, 8, 352) is True           # 33 * 4 = 132 > 128
    assert tma(32, 32, 8, 352) is False          # 32 * 4 = 128
    assert tma(129, 8, 8, 128) is False          # 128 % 176 != 0
    assert tma(129, 8, 8, 176, has_leftpad=True) is False
    assert tma(129, 8, 8, 176, max_seqlen_k_new=1) is False
    assert tma(129, 8, 8, None) is False
    assert pagedkv_tma(precompute_inputs(4, 129, 4096, 8, 8, 128, page_size=176, arch=80),
                       resolve_masking(129, 4096, False), 128, 128) is False


def test_get_num_splits_worked_cases():
    # get_num_splits (442-471), d 128 non-causal 128 x 176, 132 SMs
    # decode, h_k 8, q 1, k 8192: m-blocks 1, n-blocks ceil(8192/176) = 47; precompute total = 1 * 8 * 1 = 8
    inp = precompute_inputs(16, 1, 8192, 8, 8, 128)
    # eff(s) = 8s/132 / ceil(8s/132); best 1.0 at s = 33 (264/132 = 2 waves); 0.85 -> smallest s with eff >= 0.85:
    # s = 14: 112/132 = 0.848 < 0.85; s = 15: 120/132 = 0.909 -> 15
    assert get_num_splits(inp) == 15
    # the call without varlen uses b = 16: total = 128 >= 105.6 -> 1 split
    call = call_inputs(16, 1, 8192, 8, 8, 128, has_cache_seqlens=False)
    assert get_num_splits(call) == 1
    # with cache_seqlens the call uses the prepare step: batch counted as 1
    assert get_num_splits(call_inputs(16, 1, 8192, 8, 8, 128)) == 15
    # sm_margin 32 leaves 100 SMs: s with 8s/100 >= 0.85 * best(1.0 at s = 25): s = 11 -> 0.88
    assert get_num_splits(precompute_inputs(16, 1, 8192, 8, 8, 128, sm_margin=32)) == 11
    # GQA: 32 q heads on 8 KV heads; seqlen_q * qhpk = 4 rows -> 1 m-block; same 15
    assert get_num_splits(precompute_inputs(16, 1, 8192, 32, 8, 128)) == 15
    # q 200 * qhpk 4 = 800 rows: ceil(800/128) = 7 m-blocks; total 56; eff(s) = 56s/132/ceil: s=2 -> 0.848,
    # s = 7 -> 392/132 = 2.97/3 = 0.99 (best is 1.0 at s = 33): smallest >= 0.85 is s = 7? check s = 3: 168/132 ->
    # 1.27/2 = 0.64; s = 4: 1.70/2 = 0.85 (0.8485 < 0.85); s = 5: 2.12/3 = 0.71; s = 6: 2.55/3 = 0.85 (0.8485);
    # s = 7: 0.9899 -> 7
    assert get_num_splits(precompute_inputs(16, 200, 8192, 32, 8, 128)) == 7


def test_local_window_limits_the_loaded_keys():
    # get_num_splits 459-461: local loads min(seqlen_k, wr + wl + 1 + kBlockM) keys. d 128 local: 128 x 128
    # window (1000, 0) on q 1: wr -> -1 -> seqlen_q - 1 = 0; loaded = 1000 + 0 + 1 + 128 = 1129 -> 9 n-blocks
    # total 8 m-blocks (h_k 8): eff(s) = 8s/132: best at cap 9 = 72/132 = 0.545 -> 0.85 * 0.545 = 0.46 -> s = 8
    inp = precompute_inputs(4, 1, 100000, 8, 8, 128, window_size=(1000, 0))
    assert get_num_splits(inp) == 8
    # without the window the same call has 100000/176 = 569 n-blocks: cap 128 -> best 1.0 (s=33) -> 15
    assert get_num_splits(precompute_inputs(4, 1, 100000, 8, 8, 128)) == 15


def test_semaphore_and_pack_decisions_of_both_sides():
    # precompute (623): semaphore when arch >= 90 or splits > 1
    p = resolve_schedule(precompute_inputs(4, 1, 8192, 8, 8, 128))
    assert p.needs_semaphore is True and p.pack_gqa is True           # 15 splits force PackGQA (612, 426-429)
    # call (990-992): ((causal or local) and 1 split) or varlen, on sm90
    c = resolve_schedule(call_inputs(4, 1, 8192, 8, 8, 128, has_cache_seqlens=False, num_splits=1))
    assert c.needs_semaphore is False
    c = resolve_schedule(call_inputs(4, 2, 8192, 8, 8, 128, has_cache_seqlens=False, num_splits=1, causal=True))
    assert c.needs_semaphore is True
    c = resolve_schedule(call_inputs(4, 2, 8192, 8, 8, 128, has_cache_seqlens=False, num_splits=2, causal=True))
    assert c.needs_semaphore is False
    c = resolve_schedule(call_inputs(4, 1, 8192, 8, 8, 128, num_splits=2))
    assert c.needs_semaphore is True
    # MHA without splits never packs (434); GQA decides by should_pack_gqa with the host kBlockM
    c = resolve_schedule(call_inputs(4, 1, 8192, 8, 8, 128, has_cache_seqlens=False, num_splits=1))
    assert c.pack_gqa is False and c.kernel_pack_gqa is False
    c = resolve_schedule(call_inputs(4, 1, 8192, 32, 8, 128, has_cache_seqlens=False, num_splits=1))
    assert c.pack_gqa is True
    c = resolve_schedule(call_inputs(4, 128, 8192, 32, 8, 128, has_cache_seqlens=False, num_splits=1))
    assert c.pack_gqa is False and c.kernel_pack_gqa is False      # 128 rows fill a 128 tile
    c = resolve_schedule(call_inputs(4, 128, 8192, 32, 8, 128, has_cache_seqlens=False, num_splits=1,
                                     pack_gqa=True))
    assert c.pack_gqa is True
    # paged without TMA forces PackGQA (428) and the kernel's PackGQA (377)
    c = resolve_schedule(call_inputs(4, 128, 8192, 32, 8, 128, page_size=16, num_splits=1))
    assert c.pagedkv_tma is False and c.pack_gqa is True and c.kernel_pack_gqa is True
    assert (c.block_m, c.block_n) == (128, 128)                    # paged non-TMA tile (tile_size.h 32)
    # Sort unless local, Swizzle when causal or local (994-995)
    c = resolve_schedule(call_inputs(4, 128, 8192, 8, 8, 128, window_size=(100, 0)))
    assert (c.sort, c.swizzle) == (False, True)
    c = resolve_schedule(call_inputs(4, 128, 8192, 8, 8, 128))
    assert (c.sort, c.swizzle) == (True, False)


def test_combine_capacity_table():
    # flash_fwd_combine_launch_template.h: kBlockK 64 for dv <= 64 has a 16-split instance; then 32/64/128/256
    assert [combine_capacity(s, 64) for s in (1, 16, 17, 32, 33, 64, 65, 128, 129, 256)] == \
        [16, 16, 32, 32, 64, 64, 128, 128, 256, 256]
    assert [combine_capacity(s, 65) for s in (1, 16, 32, 33, 64, 65, 128, 129)] == [32, 32, 32, 64, 64, 128, 128, 256]
    assert combine_capacity(0, 0) == 16
    with pytest.raises(ValueError, match="num_splits_call/headdim_v: must be >= 0"):
        combine_capacity(-1, 64)
    with pytest.raises(ValueError, match="num_splits_call/headdim_v"):
        combine_capacity(1, -1)


def test_input_builders_carry_every_argument():
    inp = precompute_inputs(3, 5, 700, 16, 4, 96, qkv_dtype="float8_e4m3fn", headdim_v=64, varlen_q=True,
                            has_leftpad=True, page_size=32, max_seqlen_k_new=7, causal=True, window_size=(9, 2),
                            attention_chunk=4, has_softcap=True, num_splits=6, pack_gqa=False, sm_margin=12,
                            num_sm=100, arch=90)
    assert (inp.batch_size, inp.seqlen_q, inp.seqlen_k, inp.num_heads, inp.num_heads_k, inp.headdim,
            inp.headdim_v, inp.element_size) == (3, 5, 700, 16, 4, 96, 64, 1)
    assert (inp.causal, inp.window_size, inp.attention_chunk, inp.has_softcap, inp.page_size, inp.varlen_q,
            inp.has_leftpad, inp.seqlen_knew, inp.num_splits, inp.pack_gqa, inp.num_sm, inp.arch) == \
        (True, (9, 2), 4, True, 32, True, True, 7, 6, False, 88, 90)
    assert (inp.uses_prepare, inp.precompute, inp.paged) == (True, True, True)
    assert precompute_inputs(1, 1, 1, 1, 1, 80).headdim_v == 80
    call = call_inputs(3, 5, 700, 16, 4, 96, headdim_v=64, qkv_dtype="float16", varlen_q=False,
                       has_cache_seqlens=False, has_leftpad=False, page_size=None, seqlen_knew=3, causal=True,
                       window_size=(9, 2), attention_chunk=4, has_softcap=True, num_splits=6, pack_gqa=True,
                       sm_margin=2, num_sm=100, arch=90)
    assert (call.batch_size, call.seqlen_q, call.seqlen_k, call.num_heads, call.num_heads_k, call.headdim,
            call.headdim_v, call.element_size, call.seqlen_knew, call.num_sm, call.pack_gqa) == \
        (3, 5, 700, 16, 4, 96, 64, 2, 3, 98, True)
    assert (call.window_size, call.attention_chunk, call.has_softcap, call.causal) == ((9, 2), 4, True, True)
    assert (call.uses_prepare, call.precompute, call.has_seqused_k, call.paged) == (False, False, False, False)
    assert call_inputs(1, 1, 1, 1, 1, 80).headdim_v == 80
    assert call_inputs(1, 1, 1, 1, 1, 80, has_cache_seqlens=False, varlen_q=True).uses_prepare is True
    assert call_inputs(1, 1, 1, 1, 1, 80, has_cache_seqlens=False, has_leftpad=True).uses_prepare is True


def test_comparisons_at_their_exact_ties():
    # heuristics.h 16: nopack < 0.9 * pack, strict. sq 108, qhpk 10, kBlockM 128: nopack 108/128 = 0.84375,
    # pack 1080/1152 = 0.9375, 0.9 * 0.9375 = 0.84375 exactly: no pack
    assert should_pack_gqa(False, 108, 10, 128) is False
    # heuristics.h 29: total >= 0.8f * SMs in float: 0.8f * 5 rounds to 4.0f, so 4 m-blocks on 5 SMs is "full"
    assert num_splits_heuristic(4, 5, 100, 1, 0, False) == 1
    # heuristics.h 53: eff >= 0.85 * best, inclusive. 1 m-block on 128 SMs, 20 n-blocks: eff(s) = s/128,
    # best 20/128, 0.85 * 0.15625 = 0.1328125 = eff(17) exactly -> 17
    assert num_splits_heuristic(1, 128, 20, 1, 0, False) == 17


def test_split_forces_packgqa_and_the_pack_heuristic_uses_the_host_tile():
    # get_pack_gqa 428: num_splits > 1 forces PackGQA even for MHA; 1 split of MHA never packs
    assert resolve_schedule(call_inputs(2, 1, 8192, 8, 8, 128, has_cache_seqlens=False, num_splits=2)).pack_gqa
    assert not resolve_schedule(call_inputs(2, 1, 8192, 8, 8, 128, has_cache_seqlens=False, num_splits=1)).pack_gqa
    # get_pack_gqa 436-438: kBlockM from tile_size_fwd_sm90(d_rounded, dv_rounded, ..., element_size)
    # d 64, dv 512 bf16: kBlockM 64; sq 64, qhpk 2: nopack 64/64 = 1.0, pack 128/128 = 1.0 -> no pack
    # (with dv taken as anything but 512 the tile would be 192 rows: 64/192 < 0.9 * 128/192 would pack)
    c = resolve_schedule(call_inputs(2, 64, 8192, 16, 8, 64, headdim_v=512, has_cache_seqlens=False,
                                     num_splits=1))
    assert c.block_m == 64 and c.pack_gqa is False
    # fp8 d 64, dv 256: kBlockM 192 (tile_size.h 43); sq 96, qhpk 2: nopack 0.5, pack 192/192 -> pack
    # (the bf16 tile for (64, 256) would be 128 rows: 96/128 = 0.75 vs 192/256 = 0.75 -> no pack)
    c = resolve_schedule(call_inputs(2, 96, 8192, 16, 8, 64, headdim_v=256, qkv_dtype="float8_e4m3fn",
                                     has_cache_seqlens=False, num_splits=1))
    assert c.block_m == 192 and c.pack_gqa is True
    # varlen_q (cu_seqlens_q) always packs (heuristics.h 11): 128 rows of GQA 32/8 would not otherwise
    assert resolve_schedule(call_inputs(2, 128, 8192, 32, 8, 128, varlen_q=True, num_splits=1)).pack_gqa
    assert not resolve_schedule(call_inputs(2, 128, 8192, 32, 8, 128, num_splits=1)).pack_gqa


def test_input_builder_defaults():
    # flash_attn_interface.py get_scheduler_metadata / flash_attn_with_kvcache defaults; 132 SMs (H100/H200)
    p = precompute_inputs(1, 1, 1, 1, 1, 80)
    assert (p.varlen_q, p.causal, p.has_softcap, p.has_leftpad, p.window_size, p.attention_chunk, p.num_splits,
            p.pack_gqa, p.num_sm, p.arch, p.element_size, p.page_size, p.seqlen_knew) == \
        (False, False, False, False, (-1, -1), 0, 0, None, 132, 90, 2, None, 0)
    c = call_inputs(1, 1, 1, 1, 1, 80)
    assert (c.varlen_q, c.causal, c.has_softcap, c.has_leftpad, c.window_size, c.attention_chunk, c.num_splits,
            c.pack_gqa, c.num_sm, c.arch, c.element_size, c.page_size, c.seqlen_knew, c.has_seqused_k) == \
        (False, False, False, False, (-1, -1), 0, 0, None, 132, 90, 2, None, 0, True)
    c = call_inputs(1, 1, 1, 1, 1, 80, has_softcap=True, varlen_q=True, has_leftpad=True, causal=True)
    assert (c.has_softcap, c.varlen_q, c.has_leftpad, c.causal) == (True, True, True, True)
    for value in (c.has_softcap, c.varlen_q, c.has_leftpad, c.causal, c.has_seqused_k, c.uses_prepare):
        assert type(value) is bool


def test_masking_boundaries_at_zero_windows():
    # flash_api.cpp 587-588: causal needs window_left < 0; a left window of 0 is local (the diagonal only)
    m = resolve_masking(100, 1000, False, (0, 0))
    assert (m.is_causal, m.is_local, m.window_left, m.window_right) == (False, True, 0, 0)
    m = resolve_masking(100, 1000, False, (0, -1))
    assert (m.is_causal, m.is_local, m.window_left, m.window_right) == (False, True, 0, 99)
    # attention_chunk >= 1 alone makes it local; windows capped at chunk - 1 = 0 (589-592)
    m = resolve_masking(100, 1000, False, (-1, -1), attention_chunk=1)
    assert (m.is_causal, m.is_local, m.window_left, m.window_right) == (False, True, 0, 0)
    # decode (q 1): a left window covering all keys becomes -1 (576), so causal is dropped (579-583) ...
    assert resolve_masking(1, 1000, True, (999, -1), headdim=128).is_causal is False
    # ... and so is a right window >= q - 1 = 0 (577)
    assert resolve_masking(1, 1000, True, (-1, 5), headdim=128).is_causal is False
    # the function's defaults: head dim 128, not paged
    assert resolve_masking(1, 1000, True).is_causal is False
    assert resolve_masking(1, 1000, True, paged=True).is_causal is True


def test_get_num_splits_follows_the_tile_of_each_case():
    # one KV head, 2 m-blocks (q 129 or 200 over kBlockM 128): total 2, eff(s) = 2s/132 rises up to the cap of
    # n-blocks, so the split count is the smallest s >= 0.85 * n: n 21 -> 18 (17.85), n 29 -> 25 (24.65)
    # (heuristics.h 41-57; n chosen so that 0.85 * n is no float tie)
    # paged with TMA (page 176 % kBlockN 176 == 0, 129 rows > 128): kBlockN 176 -> 3696 / 176 = 21 n-blocks
    assert get_num_splits(precompute_inputs(1, 129, 3696, 1, 1, 128, page_size=176)) == 18
    # paged without TMA (page 1): kBlockN 128 -> 29 n-blocks
    assert get_num_splits(precompute_inputs(1, 129, 3696, 1, 1, 128, page_size=1)) == 25
    # not paged: 176 -> 21
    assert get_num_splits(precompute_inputs(1, 129, 3696, 1, 1, 128)) == 18
    # causal (q 200 > 1 keeps it): kBlockN 128 -> 29
    assert get_num_splits(precompute_inputs(1, 200, 3696, 1, 1, 128, causal=True)) == 25


def test_local_loaded_keys_count_the_window_plus_one_plus_a_tile():
    # get_num_splits 459-461: min(seqlen_k, wr + wl + 1 + kBlockM); local d 128: 128 x 128; q 1 -> wr 0, total 1
    # wl 2559: 2559 + 0 + 1 + 128 = 2688 = 21 blocks -> 18 splits; wl 2560: 2689 -> 22 blocks -> ceil(18.7) = 19
    assert get_num_splits(precompute_inputs(1, 1, 100000, 1, 1, 128, window_size=(2559, 0))) == 18
    assert get_num_splits(precompute_inputs(1, 1, 100000, 1, 1, 128, window_size=(2560, 0))) == 19


def test_paged_tma_uses_the_causal_and_local_tile():
    # get_pagedkv_tma 417: the tile of the resolved mask; causal or local d 128: kBlockN 128, so page 128 is TMA
    for window, causal in (((-1, -1), True), ((100, 0), False)):
        inp = precompute_inputs(4, 200, 4096, 8, 8, 128, page_size=128, causal=causal, window_size=window)
        m = resolve_masking(200, 4096, causal, window, headdim=128, paged=True)
        assert pagedkv_tma(inp, m, 128, 128) is True
    inp = precompute_inputs(4, 200, 4096, 8, 8, 128, page_size=128)
    assert pagedkv_tma(inp, resolve_masking(200, 4096, False, paged=True), 128, 128) is False   # 128 % 176


@pytest.mark.parametrize("d, elem, expected", [
    # the dispatch compares the raw head dim (flash_api.cpp 260-292, 338-359): 65 runs the 96 kernel, etc.
    (65, 2, (96, 96)), (97, 2, (128, 128)), (129, 2, (192, 192)), (193, 2, (256, 256)),
    (65, 1, (96, 96)), (97, 1, (128, 128)), (129, 1, (192, 192)), (193, 1, (256, 256)),
])
def test_kernel_head_dim_boundaries(d, elem, expected):
    assert kernel_headdims(d, d, elem) == expected
    assert kernel_headdims(192, 129, 1) == (192, 192)


@pytest.mark.parametrize("d, dv, elem, expected", [
    # tile_size.h compares headdim <= 64 / 96 / 128 / 192 (lines 14-38, 42-48)
    (65, 65, 2, (192, 144)), (97, 97, 2, (128, 176)), (129, 129, 2, (128, 112)), (193, 193, 2, (128, 80)),
    (65, 65, 1, (192, 128)), (97, 97, 1, (128, 224)), (129, 129, 1, (128, 160)), (193, 193, 1, (128, 128)),
    (192, 129, 2, (128, 112)),                                  # dv 129 > 128 (line 37)
])
def test_tile_boundaries(d, dv, elem, expected):
    assert tile_size_fwd_sm90(d, dv, False, False, elem) == expected


def test_tile_defaults_are_no_softcap_and_row_major_v():
    # tile_size.h 10-12: v_colmajor=false, paged_kv_non_TMA=false, softcap=false
    assert tile_size_fwd_sm90(128, 128, False, True, 1) == (128, 224)     # softcap would make it 192 (local)
    assert tile_size_fwd_sm90(128, 128, False, False, 1) == (128, 224)    # v_colmajor would make it 192
    assert tile_size_fwd_sm90(128, 128, False, False) == (128, 176)       # element size 2


def test_resolved_tiles_of_host_and_kernel():
    def tiles(**kw):
        s = resolve_schedule(call_inputs(2, 200, 4096, 8, 8, kw.pop("d", 128), **kw))
        return s.block_m, s.block_n, s.kernel_block_m, s.kernel_block_n
    assert tiles() == (128, 176, 128, 176)
    assert tiles(causal=True) == (128, 128, 128, 128)
    assert tiles(window_size=(100, 0)) == (128, 128, 128, 128)
    assert tiles(page_size=16) == (128, 128, 128, 128)              # paged, not TMA
    assert tiles(qkv_dtype="float8_e4m3fn", has_softcap=True, window_size=(100, 0)) == (128, 192, 128, 192)
    assert tiles(qkv_dtype="float8_e4m3fn") == (128, 224, 128, 224)
    # d 64, dv 128: host (64, 128) -> 192 x 192; kernel instance (64, 256) -> 128 x 96
    assert tiles(d=64, headdim_v=128) == (192, 192, 128, 96)
    s = resolve_schedule(call_inputs(2, 200, 4096, 8, 8, 64, headdim_v=104))
    assert (s.d_rounded, s.dv_rounded) == (64, 128)


def test_kernel_packgqa_is_forced_for_split_and_paged_non_tma():
    # flash_api.cpp 377: PackGQA for the kernel when pack_gqa, or Split, or paged KV without TMA
    def kp(**kw):
        return resolve_schedule(call_inputs(2, 200, 4096, 8, 8, 128, has_cache_seqlens=False, **kw)).kernel_pack_gqa
    assert kp(num_splits=1, pack_gqa=False) is False
    assert kp(num_splits=1, pack_gqa=True) is True
    assert kp(num_splits=2, pack_gqa=False) is True
    assert kp(num_splits=1, pack_gqa=False, page_size=16) is True
    # with TMA paged KV an MHA call does not pack at all (get_pack_gqa 428 needs paged *without* TMA)
    s = resolve_schedule(call_inputs(2, 200, 4096, 8, 8, 128, page_size=176, num_splits=1))
    assert s.pagedkv_tma is True and s.pack_gqa is False and s.kernel_pack_gqa is False


def test_paged_tma_at_head_dim_192_reads_dv():
    # tile_size.h 37 needs dv for d 192: (192, 128) -> 128 x 128, so page 128 is TMA with 200 rows
    s = resolve_schedule(precompute_inputs(2, 200, 4096, 8, 8, 192, headdim_v=128, page_size=128))
    assert s.pagedkv_tma is True and (s.block_m, s.block_n) == (128, 128)
    s = resolve_schedule(precompute_inputs(2, 200, 4096, 8, 8, 192, page_size=128))     # (192, 192): 112
    assert s.pagedkv_tma is False


def test_a_call_without_queries_never_checks_its_split_count():
    # run_mha_fwd (flash_api.cpp 371) checks num_splits >= 1 only when the kernel runs (1167: queries and keys);
    # an int64 num_splits of 2^32 - 1 narrows to -1
    from refmodel import FA3Rejected
    resolve_schedule(call_inputs(1, 0, 100, 8, 8, 128, num_splits=2**32 - 1))
    with pytest.raises(FA3Rejected):
        resolve_schedule(call_inputs(1, 1, 100, 8, 8, 128, num_splits=2**32 - 1))


def test_fp8_tiles_reach_the_split_count_and_the_tma_rule():
    # fp8 d 128: kBlockN 224 (tile_size.h 47). 2 m-blocks, 4704 keys: 21 n-blocks -> 18 splits (bf16's 176 would
    # give 27 -> 23)
    assert get_num_splits(precompute_inputs(1, 129, 4704, 1, 1, 128, qkv_dtype="float8_e4m3fn")) == 18
    # page 224 is TMA for fp8 (224 % 224), not for bf16 (224 % 176)
    m = resolve_masking(200, 4096, False, headdim=128, paged=True)
    fp8 = precompute_inputs(4, 200, 4096, 8, 8, 128, qkv_dtype="float8_e4m3fn", page_size=224)
    assert pagedkv_tma(fp8, m, 128, 128) is True
    assert pagedkv_tma(precompute_inputs(4, 200, 4096, 8, 8, 128, page_size=224), m, 128, 128) is False


def test_paged_decode_keeps_causal_in_the_split_count():
    # flash_api.cpp 579-583: q 1, paged, d 128 keeps causal, so the L2 branch (heuristics.h 33, not causal) is off.
    # 33792 q heads on 1 KV head: 33792 rows / 128 = 264 m-blocks = 2 * 132; KV head 204800 * 256 * 2 = 100 MiB
    causal = precompute_inputs(1, 1, 204800, 33792, 1, 128, page_size=1, causal=True)
    assert get_num_splits(causal) == 1
    # the same without causal splits by L2: ceil(100 MiB / 50 MiB) = 2
    assert get_num_splits(precompute_inputs(1, 1, 204800, 33792, 1, 128, page_size=1)) == 2


def test_fp8_softcap_local_tile_reaches_the_split_count_and_the_tma_rule():
    # tile_size.h 47: fp8 d 128 with softcap and local: kBlockN 192 (224 without softcap)
    # local q 1, wl 2559: 2559 + 0 + 1 + 128 = 2688 keys -> 14 blocks of 192 -> ceil(0.85 * 14 = 11.9) = 12 splits
    inp = precompute_inputs(1, 1, 100000, 1, 1, 128, qkv_dtype="float8_e4m3fn", window_size=(2559, 0),
                            has_softcap=True)
    assert get_num_splits(inp) == 12
    inp = precompute_inputs(1, 1, 100000, 1, 1, 128, qkv_dtype="float8_e4m3fn", window_size=(2559, 0))
    assert get_num_splits(inp) == 11                                   # 224: 12 blocks -> ceil(10.2) = 11
    # get_pagedkv_tma passes softcap (flash_api.cpp 417): page 192 is TMA only with the 192 tile
    m = resolve_masking(200, 4096, False, (100, 0), headdim=128, paged=True)
    inp = precompute_inputs(4, 200, 4096, 8, 8, 128, qkv_dtype="float8_e4m3fn", page_size=192, window_size=(100, 0),
                            has_softcap=True)
    assert pagedkv_tma(inp, m, 128, 128) is True


@pytest.mark.parametrize("arch, paged_non_tma, splits, forced", [
    (80, False, 1, True), (86, False, 1, True), (89, False, 0, True),      # sm8x: always (flash_api.cpp 429, 377)
    (90, False, 1, False), (100, False, 1, False), (120, False, 1, False),  # sm90 and newer: only for the two below
    (90, True, 1, True), (90, False, 2, True), (100, False, 2, True), (90, False, 0, False),
])
def test_packgqa_is_forced_below_sm90_for_paged_non_tma_and_for_split(arch, paged_non_tma, splits, forced):
    from refmodel.fa3_scheduler import forced_pack_gqa

    assert forced_pack_gqa(arch, paged_non_tma, splits) is forced


def test_a_varlen_k_new_vetoes_paged_tma():
    # get_pagedkv_tma (flash_api.cpp 416) reads params.knew_ptr, set whenever k_new is passed (961)
    base = dict(batch_size=2, seqlen_q=200, seqlen_k=4096, num_heads=8, num_heads_k=8, headdim=128, headdim_v=128)
    assert pagedkv_tma(call_inputs(*base.values(), page_size=176, num_splits=1),
                       resolve_masking(200, 4096, False, (-1, -1), 0, 128, True), 128, 128) is True
    s = resolve_schedule(call_inputs(*base.values(), page_size=176, num_splits=1, has_k_new=True))
    assert s.pagedkv_tma is False and s.kernel_pack_gqa is True
