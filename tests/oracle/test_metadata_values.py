"""Pins of refmodel.metadata: the metadata tensor of a hand-worked precompute, value by value, the
decoder, the length helpers and the call's own metadata.

Sources: Dao-AILab/flash-attention at 0251105a, `hopper/flash_api.cpp` `mha_fwd_get_scheduler_metadata`
(lines 623-661: b_rounded = round_multiple(b, 4), vectors num_splits_dynamic | num_m_blocks | varlen_batch_idx
(Sort) | num_nheads_in_l2 (Swizzle), then the semaphore), `hopper/flash_prepare_scheduler.cu` (the values),
`hopper/flash_fwd_launch_template.h` 163-165 (the call's own prepare with the kernel's tiles and PackGQA).
"""

import pytest
import torch

from refmodel import call_inputs, resolve_schedule
from refmodel.metadata import (
    UNWRITTEN,
    call_own_metadata,
    call_own_schedule,
    decode_metadata,
    get_scheduler_metadata,
    lengths_from_cu,
    schedule_and_prepare,
)

U = UNWRITTEN


def test_a_paged_causal_decode_precompute_tensor():
    # b 3, q 1, k 4096, 8/8 heads, d 128, paged (page 1: not TMA -> tile 128 x 128), causal kept (paged, d 128)
    # get_num_splits: 1 m-block, 32 n-blocks, total 8: best eff 0.97 (s = 16), smallest s >= 0.85 * 0.97: 14
    # prepare: n = (32, 1, 1), total 34, bps = ceil(34 * 1.1 * 8 / 132) = 3; splits (11, 1, 1) (min(ceil(32/3), 14))
    # n per split (3, 1, 1); causal keys (3*128 - 128, 0, 0): order (0, 1, 2); heads in L2: 16, PackGQA, min(16, 8)
    md = get_scheduler_metadata(3, 1, 4096, 8, 8, 128, torch.tensor([4096, 10, 100], dtype=torch.int32),
                                page_size=1, causal=True)
    assert md.dtype == torch.int32
    assert md.tolist() == [11, 1, 1, U, 1, 1, 1, U, 0, 1, 2, U, 8, 8, 8, U, 0]
    d = decode_metadata(md, 3, sort=True, swizzle=True)
    assert (d.num_splits, d.num_m_blocks, d.batch_idx, d.nheads_in_l2, d.semaphore) == \
        ([11, 1, 1, U], [1, 1, 1, U], [0, 1, 2, U], [8, 8, 8, U], 0)
    assert d.to_dict() == {"num_splits": [11, 1, 1, U], "num_m_blocks": [1, 1, 1, U], "batch_idx": [0, 1, 2, U],
                           "nheads_in_l2": [8, 8, 8, U], "semaphore": 0}
    assert (d.layout.b4, d.layout.size) == (4, 17)


def test_decoding_with_another_layout_reads_other_slots():
    md = get_scheduler_metadata(3, 1, 4096, 8, 8, 128, [4096, 10, 100], page_size=1, causal=True)
    d = decode_metadata(md, 3, sort=False, swizzle=True)     # 3 vectors: heads in L2 at 2 * b4 = 8
    assert d.batch_idx is None and d.nheads_in_l2 == [0, 1, 2, U] and d.semaphore == 8
    d = decode_metadata(md, 5, sort=False, swizzle=False)    # b4 8: m-blocks at 8
    assert d.num_m_blocks == [0, 1, 2, U, 8, 8, 8, U] and d.semaphore == 0
    d = decode_metadata(md[:16], 3, sort=True, swizzle=True)
    assert d.semaphore is None
    with pytest.raises(ValueError) as info:
        decode_metadata(md[:5], 3, sort=True, swizzle=True)
    assert str(info.value) == ("metadata: expected at least 16 int32 values for batch_size=3, sort=True, "
                               "swizzle=True; got 5")


def test_leftpad_and_new_kv_reach_the_prepare_step():
    # d 128 non-causal: kBlockN 176; 1 split forced so n per split = n blocks and the sort shows them
    s, r = schedule_and_prepare(2, 1, 4096, 8, 8, 128, [177, 177], cache_leftpad=[1, 0], num_splits=1)
    assert s.block_n == 176 and r.batch_idx == [1, 0]          # n = (1, 2)
    _, r = schedule_and_prepare(2, 1, 4096, 8, 8, 128, [176, 150], cu_seqlens_k_new=[0, 0, 50], num_splits=1)
    assert r.batch_idx == [1, 0]                               # n = (1, ceil(200 / 176) = 2)
    _, r = schedule_and_prepare(2, 1, 4096, 8, 8, 128, [176, 150], num_splits=1)
    assert r.batch_idx == [0, 1]                               # n = (1, 1): a tie
    # cu_seqlens_q: per-batch rows 1 and 200 -> m-blocks 1 and 2 (kBlockM 128)
    _, r = schedule_and_prepare(2, 200, 4096, 8, 8, 128, [176, 176], cu_seqlens_q=[0, 1, 201], num_splits=1)
    assert sorted(r.num_m_blocks) == [1, 2]


def test_length_helpers_name_their_field():
    assert lengths_from_cu([0, 1, 3], "cu_seqlens_q", 2) == [1, 2]
    assert lengths_from_cu(torch.tensor([0, 4]), "cu_seqlens_q", 1) == [4]
    assert lengths_from_cu(None, "cu_seqlens_q", 2) is None
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: must be non-decreasing, got \[0, 2, 1\]$"):
        lengths_from_cu([0, 2, 1], "cu_seqlens_q", 2)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k_new: expected 3 entries, got 2$"):
        lengths_from_cu([0, 2], "cu_seqlens_k_new", 2)
    with pytest.raises(ValueError, match=r"^cache_seqlens: entries must be >= 0, got \[5, -1\]$"):
        schedule_and_prepare(2, 1, 4096, 8, 8, 128, [5, -1])
    with pytest.raises(ValueError, match=r"^cache_seqlens: expected 2 entries, got 1$"):
        schedule_and_prepare(2, 1, 4096, 8, 8, 128, [5])
    with pytest.raises(ValueError, match=r"^cache_leftpad: expected 2 entries, got 3$"):
        schedule_and_prepare(2, 1, 4096, 8, 8, 128, [5, 5], cache_leftpad=[0, 0, 0])


def test_the_calls_own_metadata_uses_the_kernels_tiles():
    # d 64, dv 128: host tile (192, 192) from the rounded dims, kernel instance <64, 256>: tile (128, 96)
    call = resolve_schedule(call_inputs(1, 150, 1000, 8, 8, 64, headdim_v=128, varlen_q=True, num_splits=1))
    assert (call.block_m, call.block_n, call.kernel_block_m, call.kernel_block_n) == (192, 192, 128, 96)
    own = call_own_schedule(call)
    assert (own.block_m, own.block_n, own.pack_gqa) == (128, 96, call.kernel_pack_gqa)
    sched, r = call_own_metadata(call, [1000], seqlens_q=[150])
    assert sched == own and r.num_m_blocks == [2]              # ceil(150 / 128)
    _, r = call_own_metadata(call, [1000], seqlens_q=[150], leftpad_k=[0], seqlens_new=[0])
    assert r.num_m_blocks == [2]
    pre = schedule_and_prepare(1, 150, 1000, 8, 8, 64, [1000], headdim_v=128)[0]
    with pytest.raises(ValueError, match=r"^call_schedule: must be a call's schedule \(inputs.precompute False\)"):
        call_own_schedule(pre)
    dense = resolve_schedule(call_inputs(1, 150, 1000, 8, 8, 64, headdim_v=128, has_cache_seqlens=False))
    with pytest.raises(ValueError, match=r"^call_schedule: the call is not varlen"):
        call_own_metadata(dense, [1000])


ARGS = dict(qkv_dtype="float8_e4m3fn", headdim_v=96, cu_seqlens_q=[0, 3, 5], cu_seqlens_k_new=[0, 2, 4],
            cache_leftpad=[1, 0], page_size=None, max_seqlen_k_new=2, causal=True, window_size=(50, 0),
            attention_chunk=0, has_softcap=True, num_splits=3, pack_gqa=False, sm_margin=4, num_sm=100, arch=90)


def test_every_argument_reaches_the_schedule():
    # mha_fwd_get_scheduler_metadata's arguments (flash_api.cpp 538-550) each land in the resolved inputs
    s, r = schedule_and_prepare(2, 3, 300, 16, 8, 128, [300, 200], **ARGS)
    i = s.inputs
    assert (i.element_size, i.headdim_v, i.varlen_q, i.has_leftpad, i.seqlen_knew, i.causal, i.window_size,
            i.has_softcap, i.num_splits, i.pack_gqa, i.num_sm, i.page_size) == \
        (1, 96, True, True, 2, True, (50, 0), True, 3, False, 96, None)
    md = get_scheduler_metadata(2, 3, 300, 16, 8, 128, torch.tensor([300, 200], dtype=torch.int32), **ARGS)
    from refmodel.metadata import encode_metadata
    assert md.tolist() == encode_metadata(s, r).tolist()
    # the defaults are FA3's: bf16, dv = d, no mask, no softcap, heuristic splits, no sm margin, 132 SMs
    s0, _ = schedule_and_prepare(2, 3, 300, 16, 8, 128, [300, 200])
    i = s0.inputs
    assert (i.element_size, i.headdim_v, i.varlen_q, i.has_leftpad, i.seqlen_knew, i.causal, i.window_size,
            i.attention_chunk, i.has_softcap, i.num_splits, i.pack_gqa, i.num_sm, i.arch) == \
        (2, 128, False, False, 0, False, (-1, -1), 0, False, 0, None, 132, 90)
    assert get_scheduler_metadata(2, 3, 300, 16, 8, 128, [300, 200]).tolist() == \
        get_scheduler_metadata(2, 3, 300, 16, 8, 128, [300, 200], qkv_dtype=torch.bfloat16, causal=False,
                               window_size=(-1, -1), attention_chunk=0, has_softcap=False, num_splits=0,
                               pack_gqa=None, sm_margin=0, num_sm=132, arch=90).tolist()
    chunked, _ = schedule_and_prepare(2, 3, 300, 16, 8, 128, [300, 200], attention_chunk=64, page_size=16)
    assert chunked.inputs.attention_chunk == 64 and chunked.inputs.page_size == 16


def test_metadata_size_of_inputs_and_schedules():
    from refmodel import metadata_size
    from refmodel.fa3_scheduler import precompute_inputs
    inp = precompute_inputs(3, 1, 4096, 8, 8, 128, page_size=1, causal=True)
    assert metadata_size(inp) == 17 == metadata_size(resolve_schedule(inp))     # 4 vectors * 4 + 1


def test_argument_checks_name_their_field_and_accept_empty_caches():
    s, r = schedule_and_prepare(2, 1, 4096, 8, 8, 128, [0, 5])      # an empty cache is a valid length
    assert r.num_splits and len(r.num_m_blocks) == 2
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: expected 3 entries, got 2$"):
        schedule_and_prepare(2, 1, 4096, 8, 8, 128, [5, 5], cu_seqlens_q=[0, 1])
    with pytest.raises(ValueError, match=r"^cu_seqlens_k_new: expected 3 entries, got 2$"):
        schedule_and_prepare(2, 1, 4096, 8, 8, 128, [5, 5], cu_seqlens_k_new=[0, 1])


def test_the_calls_own_prepare_gets_its_lengths_and_the_kernels_pack():
    # paged without TMA forces the kernel's PackGQA (flash_api.cpp 377) even against pack_gqa=False
    call = resolve_schedule(call_inputs(2, 200, 4096, 32, 8, 128, page_size=16, pack_gqa=False, num_splits=1))
    assert call.pack_gqa is False and call.kernel_pack_gqa is True
    own = call_own_schedule(call)
    assert own.pack_gqa is True
    # lengths: rows (1, 200) * qhpk 4 -> m-blocks (1, 7); leftpad and new KV move batch 1 ahead in the sort
    _, r = call_own_metadata(call, [177, 177], seqlens_q=[1, 200])
    assert sorted(r.num_m_blocks) == [1, 7]
    _, r = call_own_metadata(call, [129, 128], seqlens_q=[1, 1], leftpad_k=[1, 0], seqlens_new=[0, 1])
    assert r.batch_idx == [1, 0]                                      # n = (1, 2) with kBlockN 128
    dense = resolve_schedule(call_inputs(1, 150, 1000, 8, 8, 64, headdim_v=128, has_cache_seqlens=False))
    with pytest.raises(ValueError) as info:
        call_own_metadata(dense, [1000])
    assert str(info.value) == ("call_schedule: the call is not varlen (no cache_seqlens/cu_seqlens_q/leftpad), so FA3 "
                               "runs no prepare step and reads no per-batch metadata")


def test_layouts_carry_batch_and_semaphore():
    from refmodel.metadata import MetadataLayout
    d = decode_metadata(torch.zeros(17, dtype=torch.int32), 3, sort=True, swizzle=True)
    assert (d.layout.batch_size, d.layout.has_semaphore) == (3, True)
    # a non-varlen split call without mask needs no semaphore (flash_api.cpp 990-992)
    s = resolve_schedule(call_inputs(2, 1, 4096, 8, 8, 128, has_cache_seqlens=False, num_splits=2))
    assert MetadataLayout.for_schedule(s).has_semaphore is False


def _md(**kw):
    args = dict(batch_size=2, max_seqlen_q=1, max_seqlen_k=7000, num_heads_q=32, num_heads_kv=1, headdim=128,
                cache_seqlens=torch.tensor([7000, 100], dtype=torch.int32))
    args.update(kw)
    return get_scheduler_metadata(**args).tolist()


# Each pair: an argument's value and the same call without it, chosen where FA3's metadata differs
# (flash_api.cpp 538-640: each argument reaches the tile choice, the split heuristic or the prepare step).
ARGUMENT_EFFECTS = [
    ("headdim_v", dict(headdim=64, headdim_v=512), dict(headdim=64)),                 # tiles (tile_size.h)
    ("cu_seqlens_q", dict(max_seqlen_q=64, cu_seqlens_q=[0, 64, 65]), dict(max_seqlen_q=64)),   # per-batch m-blocks
    ("cu_seqlens_k_new", dict(max_seqlen_k_new=200, cu_seqlens_k_new=[0, 200, 200]), dict(max_seqlen_k_new=200)),
    ("cache_leftpad", dict(cache_leftpad=torch.tensor([3000, 0], dtype=torch.int32)), dict()),
    ("max_seqlen_k_new", dict(max_seqlen_k=22000, num_heads_kv=4, max_seqlen_k_new=1,
                              cache_seqlens=torch.tensor([22000, 100], dtype=torch.int32)),
     dict(max_seqlen_k=22000, num_heads_kv=4, cache_seqlens=torch.tensor([22000, 100], dtype=torch.int32))),
    ("attention_chunk", dict(attention_chunk=256, causal=True), dict(causal=True)),
    ("has_softcap", dict(has_softcap=True, headdim=192, window_size=(1000, 0), max_seqlen_k=100000,
                         qkv_dtype="float8_e4m3fn", cache_seqlens=torch.tensor([99000, 300], dtype=torch.int32)),
     dict(headdim=192, window_size=(1000, 0), max_seqlen_k=100000, qkv_dtype="float8_e4m3fn",
          cache_seqlens=torch.tensor([99000, 300], dtype=torch.int32))),     # fp8, local, d 192: kBlockN 128 vs 160
    ("sm_margin", dict(sm_margin=1), dict()),                                  # 131 SMs: another split count
    ("num_sm", dict(num_sm=133), dict()),
]


@pytest.mark.parametrize("name, with_it, without_it", ARGUMENT_EFFECTS, ids=[e[0] for e in ARGUMENT_EFFECTS])
def test_each_argument_changes_the_metadata_where_fa3_s_does(name, with_it, without_it):
    assert _md(**with_it) != _md(**without_it)
    s, r = schedule_and_prepare(**{**dict(batch_size=2, max_seqlen_q=1, max_seqlen_k=7000, num_heads_q=32,
                                          num_heads_kv=1, headdim=128,
                                          cache_seqlens=torch.tensor([7000, 100], dtype=torch.int32)), **with_it})
    from refmodel.metadata import encode_metadata
    assert _md(**with_it) == encode_metadata(s, r).tolist()


def test_the_defaults_are_fa3_s_where_they_matter():
    # flash_attn_interface.get_scheduler_metadata: max_seqlen_k_new 0, has_softcap False, sm_margin 0; 132 SMs (H100/H200)
    for name, with_it, without_it in ARGUMENT_EFFECTS:
        if name in ("max_seqlen_k_new", "has_softcap", "sm_margin", "num_sm"):
            explicit = {"max_seqlen_k_new": 0, "has_softcap": False, "sm_margin": 0, "num_sm": 132}[name]
            assert _md(**without_it) == _md(**{**without_it, name: explicit}), name


def test_arch_reaches_the_model_range_check():
    from refmodel import OutsideModel
    with pytest.raises(OutsideModel, match="^arch: "):
        get_scheduler_metadata(2, 1, 7000, 32, 1, 128, torch.tensor([7000, 100], dtype=torch.int32), arch=80)
    with pytest.raises(OutsideModel, match="^arch: "):
        schedule_and_prepare(2, 1, 7000, 32, 1, 128, [7000, 100], arch=80)
