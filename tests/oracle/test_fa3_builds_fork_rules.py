"""Pins of refmodel.fa3_builds: the vLLM fork's host-side rules, read off vllm-project/flash-attention@617264c1.

Sources (fork, hopper/): heuristics.h 10-14 (use_one_mma_wg), tile_size.h 10-93, flash_api.cpp 466 (no paged TMA
for local), 485-488 (PackGQA override), 671/674 and 1063/1065 (PackGQA for Split and, under PACKGQA_ONLY, d == dv),
677/1068 (dynamic split vector), 689/1079 (Sort off), 692-699/1083-1090 (vectors), 835 (call seqlen_k), 1070.
Each negative control below is a value on which upstream's build gives another answer, so a model that ignored the
build (or judged the fork with upstream's rules) fails it.
"""

import pytest

from refmodel import call_inputs, precompute_inputs, resolve_schedule
from refmodel.fa3_builds import (SGLANG_KERNEL_042, SGLANG_KERNEL_045, UPSTREAM, VLLM_FORK, VLLM_FORK_1C81743F,
                                 VLLM_FORK_2D3B7508, VLLM_FORK_8798F277, VLLM_FORK_A8937124, build, build_for_engine,
                                 builds, engine_sources, fork_metadata_vectors, tile_size_fwd_sm90_vllm_fork,
                                 use_one_mma_wg)


def test_builds_are_named_with_their_source_commit():
    assert set(builds()) == {UPSTREAM, VLLM_FORK, SGLANG_KERNEL_042, SGLANG_KERNEL_045, VLLM_FORK_2D3B7508,
                             VLLM_FORK_A8937124, VLLM_FORK_1C81743F, VLLM_FORK_8798F277}
    for name in (VLLM_FORK_2D3B7508, VLLM_FORK_A8937124, VLLM_FORK_1C81743F, VLLM_FORK_8798F277):
        assert build(name).commit.startswith(name.rsplit("-", 1)[1])
        assert build(name).repo == "vllm-project/flash-attention"
    assert build(UPSTREAM).commit.startswith("0251105a") and build(UPSTREAM).repo == "Dao-AILab/flash-attention"
    assert build(VLLM_FORK).commit.startswith("617264c1") and "FLASHATTENTION_PACKGQA_ONLY" in \
        build(VLLM_FORK).compile_definitions
    with pytest.raises(ValueError, match="build: must be one of"):
        build("nope")
    with pytest.raises(ValueError, match="build: must be one of"):
        call_inputs(1, 1, 64, 8, 8, 128, build="nope")


def test_every_engine_release_the_suite_drives_has_a_recorded_fa3_source():
    rows = engine_sources()
    sglang = [r["release"] for r in rows if r["engine"] == "sglang"]
    assert sglang == [f"0.5.{n}" for n in range(11, 24)]
    assert build_for_engine("vllm", "0.33.0") == VLLM_FORK
    assert build_for_engine("sglang", "0.5.14") == SGLANG_KERNEL_042   # read from sglang-kernel 0.4.4's wheel
    assert build_for_engine("sglang", "0.5.16") == SGLANG_KERNEL_045   # read from sglang-kernel 0.4.5's wheel
    assert {r["kernel_version"] for r in rows if r["release"] in ("0.5.14", "0.5.15")} == {"0.4.4"}
    with pytest.raises(ValueError, match="no FA3 source recorded"):
        build_for_engine("sglang", "0.5.10")


@pytest.mark.parametrize("arch, d, local, sq, qhpk, expected", [
    (90, 128, False, 1, 8, True), (90, 64, False, 8, 8, True), (90, 128, False, 1, 64, True),
    (90, 128, False, 1, 65, False), (90, 128, False, 9, 8, False),          # seqlen_q * qhpk <= 64
    (90, 96, False, 1, 8, False), (90, 120, False, 1, 8, False),            # unrounded d must be 64 or 128
    (90, 128, True, 1, 8, False), (80, 128, False, 1, 8, False),
])
def test_use_one_mma_wg(arch, d, local, sq, qhpk, expected):
    assert use_one_mma_wg(VLLM_FORK, arch, d, local, sq, qhpk) is expected
    assert use_one_mma_wg(UPSTREAM, arch, d, local, sq, qhpk) is False


@pytest.mark.parametrize("args, expected", [
    ((64, 64, False, False, 2, False, True), (64, 192)),     # tile_size.h 23-24
    ((64, 64, True, False, 2, False, False), (192, 128)),    # 30: causal 128
    ((64, 64, False, True, 2, False, False), (192, 160)),    # 30: local 160 (upstream 128)
    ((64, 64, False, False, 2, True, False), (192, 160)),    # 30: paged non-TMA 160 (upstream 128)
    ((64, 64, False, False, 2, False, False), (192, 192)),
    ((64, 256, False, False, 2, False, True), (128, 96)), ((64, 512, False, False, 2, False, True), (64, 64)),
    ((96, 96, False, False, 2, False, False), (192, 144)),
    ((128, 128, False, False, 2, False, True), (64, 176)),   # 41-42
    ((128, 128, True, False, 2, False, True), (64, 128)),
    ((128, 128, False, False, 2, False, False), (128, 160)),  # 44 (upstream 176)
    ((128, 128, True, False, 2, False, False), (128, 128)),
    ((192, 256, False, False, 2, False, False), (128, 96)),  # 49 (upstream 112)
    ((192, 128, False, False, 2, False, False), (128, 128)),
    ((256, 256, False, True, 2, False, False), (128, 64)), ((256, 256, False, False, 2, False, False), (128, 80)),
    ((64, 64, False, False, 1, False, True), (64, 128)), ((128, 128, False, False, 1, False, True), (64, 96)),
    ((64, 64, False, False, 1, False, False), (192, 128)), ((96, 96, False, False, 1, False, False), (128, 128)),
    ((128, 128, False, False, 1, False, False), (128, 192)), ((192, 128, False, False, 1, False, False), (128, 96)),
    ((256, 256, False, True, 1, False, False), (128, 64)), ((256, 256, False, False, 1, False, False), (128, 128)),
])
def test_fork_tile_table(args, expected):
    d, dv, causal, local, elem, non_tma, wg = args
    assert tile_size_fwd_sm90_vllm_fork(d, dv, causal, local, elem, non_tma, wg) == expected


def test_a_decode_schedule_differs_between_the_builds():
    # 8 query heads per KV head, one query row: the fork's one-MMA-WG tile 64 x 176 (upstream 128 x 176)
    up = resolve_schedule(call_inputs(4, 1, 8192, 32, 4, 128, has_cache_seqlens=True))
    fk = resolve_schedule(call_inputs(4, 1, 8192, 32, 4, 128, has_cache_seqlens=True, build=VLLM_FORK))
    assert (up.block_m, up.block_n) == (128, 176) and (fk.block_m, fk.block_n) == (64, 176)
    assert up.sort is True and fk.sort is False
    mha = dict(has_cache_seqlens=True, num_splits=1)
    assert resolve_schedule(call_inputs(4, 1, 8192, 8, 8, 128, **mha)).pack_gqa is False   # h == h_k: no pack
    assert resolve_schedule(call_inputs(4, 1, 8192, 8, 8, 128, build=VLLM_FORK, **mha)).pack_gqa is True  # d == dv
    # the fork's metadata: prepare_seqlen_q + dynamic splits (S > 1) + semaphore; upstream: 3 vectors (Sort)
    assert fk.num_splits > 1 and fk.metadata_size == 2 * 4 + 1 and up.metadata_size == 3 * 4 + 1


def test_the_fork_decides_its_decode_tile_from_seqlen_q_times_heads_per_kv_head():
    # a hazard class of its own: seqlen_q * qhpk 64 takes the 64-row tile, 72 the 128-row one
    def tiles(sq, h):
        s = resolve_schedule(precompute_inputs(1, sq, 8192, h, 1, 128, build=VLLM_FORK))
        return s.block_m, s.block_n
    assert tiles(8, 8) == (64, 176) and tiles(9, 8) == (128, 160)
    assert tiles(1, 64) == (64, 176) and tiles(1, 72) == (128, 160)


def test_fork_metadata_vectors_and_the_varlen_batch_cap():
    assert fork_metadata_vectors(True, 4, 1, False) == 1 and fork_metadata_vectors(True, 4, 2, True) == 3
    assert fork_metadata_vectors(True, 993, 2, True) == 2 and fork_metadata_vectors(False, 4, 2, True) == 1
    s = resolve_schedule(call_inputs(993, 1, 65536, 8, 1, 128, num_splits=4, build=VLLM_FORK))
    assert s.num_splits == 1          # flash_api.cpp 1070: a varlen call over 992 batches has one split
    assert resolve_schedule(call_inputs(993, 1, 65536, 8, 1, 128, num_splits=4)).num_splits == 4


def test_the_fork_refuses_paged_tma_for_local_and_overrides_pack_for_hdim_64_gqa_8_local():
    kw = dict(page_size=128, window_size=(100, 0), num_splits=1)
    assert resolve_schedule(call_inputs(2, 300, 4096, 8, 8, 64, **kw)).pagedkv_tma is True
    assert resolve_schedule(call_inputs(2, 300, 4096, 8, 8, 64, build=VLLM_FORK, **kw)).pagedkv_tma is False
    kw = dict(window_size=(100, 0), num_splits=1, has_cache_seqlens=False, headdim_v=64)
    from refmodel.fa3_scheduler import get_pack_gqa, resolve_masking
    inp = call_inputs(2, 576, 4096, 64, 8, 64, build=VLLM_FORK, **kw)
    masking = resolve_masking(576, 4096, False, (100, 0), 0, 64, False)
    assert masking.is_local and get_pack_gqa(inp, 1, masking, False) is True
    up = call_inputs(2, 576, 4096, 64, 8, 64, **kw)
    assert get_pack_gqa(up, 1, masking, False) is False


def test_the_fork_metadata_layout_and_its_prepare_vectors():
    # flash_api.cpp@617264c1 703-707: prepare_seqlen_q at 0, dynamic splits at b4 (S > 1), heads-in-L2 last;
    # flash_prepare_scheduler.cu 203-205 (no Sort): per batch Lq * qhpk (PackGQA), the split, heads-in-L2 with the
    # 32 MiB / 8 budget for qhpk 8 (220-225)
    from refmodel.metadata import decode_for_schedule, get_scheduler_metadata, schedule_and_prepare
    from refmodel.prepare import fork_l2_budget
    lens = [17, 100, 30000, 5]
    md = get_scheduler_metadata(4, 1, 30000, 8, 1, 128, cache_seqlens=lens, causal=True, page_size=16,
                                build=VLLM_FORK)
    sched, res = schedule_and_prepare(4, 1, 30000, 8, 1, 128, lens, causal=True, page_size=16, build=VLLM_FORK)
    assert sched.num_splits > 1 and sched.pack_gqa and md.numel() == 3 * 4 + 1
    v = md.tolist()
    assert v[0:4] == [8, 8, 8, 8]                     # Lq 1 * qhpk 8
    assert v[4:8] == res.num_splits and v[8:12] == res.nheads_in_l2 and v[12] == 0
    assert res.batch_idx is None and fork_l2_budget(8) == 4 * 1024 * 1024 and fork_l2_budget(16) == 2 * 1024 * 1024
    assert fork_l2_budget(1) == 32 * 1024 * 1024 and fork_l2_budget(3) == 8 * 1024 * 1024
    dec = decode_for_schedule(md, sched)
    assert dec.num_m_blocks[:4] == [1, 1, 1, 1] and dec.batch_idx is None and dec.num_splits[:4] == res.num_splits
    up = get_scheduler_metadata(4, 1, 30000, 8, 1, 128, cache_seqlens=lens, causal=True, page_size=16)
    assert up.numel() == 4 * 4 + 1                    # upstream: splits, m-blocks, batch order, heads-in-L2


def test_sliding_window_case_under_the_fork_raises_nothing():
    # tests/corpus_vllm/sliding-window-short-batch-causal-vs-local.json, per rank: h 8, h_k 1, d 128, page 16,
    # causal with window (4095, 0), lengths (17, 100). The fork's mha_fwd takes seqlen_k = max_seqlen_k when given
    # (flash_api.cpp 835) and vLLM's wrapper passes it (100): the window drops on both sides, both are causal with
    # S = 1, so both expect prepare_seqlen_q + heads-in-L2 + semaphore = 9 int32 and CHECK_SHAPE (1096) passes.
    w = (4095, 0)
    pre = resolve_schedule(precompute_inputs(2, 1, 100, 8, 1, 128, varlen_q=True, page_size=16, causal=True,
                                             window_size=w, build=VLLM_FORK))
    call = resolve_schedule(call_inputs(2, 1, 100, 8, 1, 128, varlen_q=True, page_size=16, causal=True,
                                        window_size=w, build=VLLM_FORK))
    assert pre.masking.is_causal and call.masking.is_causal and pre.num_splits == call.num_splits == 1
    assert pre.metadata_size == call.metadata_size == 9
    # upstream's call reads seqlen_k off the block table (40960): local, S_c 29, 13 int32 vs the precompute's 17
    up_pre = resolve_schedule(precompute_inputs(2, 1, 100, 8, 1, 128, varlen_q=True, page_size=16, causal=True,
                                                window_size=w))
    up_call = resolve_schedule(call_inputs(2, 1, 40960, 8, 1, 128, varlen_q=True, page_size=16, causal=True,
                                           window_size=w))
    assert up_call.masking.is_local and (up_pre.metadata_size, up_call.metadata_size) == (17, 13)


def test_a_recorded_varlen_call_takes_max_seqlen_k_under_the_fork_and_the_block_table_upstream():
    # fork flash_api.cpp 835: seqlen_k = max_seqlen_k when passed; upstream (0251105a 768) reads the block table
    import torch

    from gpu_impl.fa3_records import call_schedule_of, record_varlen_call

    q = torch.zeros(2, 8, 128, dtype=torch.bfloat16)
    kv = torch.zeros(10, 16, 1, 128, dtype=torch.bfloat16)
    kw = dict(q=q, k=kv, v=kv, max_seqlen_q=1, cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32),
              max_seqlen_k=100, seqused_k=torch.tensor([17, 100], dtype=torch.int32),
              block_table=torch.zeros(2, 2560, dtype=torch.int32), causal=True, window_size=(4095, 0))
    fork = record_varlen_call(build=VLLM_FORK, **kw)
    up = record_varlen_call(**kw)
    assert (fork.seqlen_k, fork.build, up.seqlen_k, up.build) == (100, VLLM_FORK, 40960, UPSTREAM)
    assert call_schedule_of(fork).masking.is_causal and call_schedule_of(up).masking.is_local
    assert call_schedule_of(fork).metadata_size == 9


def test_the_vllm_driver_judges_under_the_build_recorded_for_its_release():
    from gpu_impl.engines.vllm.driver import VLLM_BUILD

    assert VLLM_BUILD == build_for_engine("vllm", "0.33.0")
    from fa3verify.engine_choice import fa3_build_of
    from gpu_impl.sut import parse_engine
    assert fa3_build_of(parse_engine("vllm==0.33.0")) == VLLM_FORK
    # an sglang release is judged under the build read from its kernel wheel; no release (the model's default, a
    # checkout) under upstream's
    assert fa3_build_of(parse_engine("sglang==0.5.14")) == SGLANG_KERNEL_042 and fa3_build_of(None) == UPSTREAM
    assert fa3_build_of(parse_engine("sglang==0.5.23")) == SGLANG_KERNEL_045
    assert fa3_build_of(parse_engine("sglang-src=/tmp/x")) == UPSTREAM


def test_an_engine_matrix_row_names_the_build_that_judged_it():
    from fa3verify.engine_matrix import MatrixRow

    assert MatrixRow(release="0.5.14", verdict="pass", exit_code=0).fa3_build == SGLANG_KERNEL_042
    assert MatrixRow(release="0.5.14", verdict="pass", exit_code=0, fa3_build=VLLM_FORK).fa3_build == VLLM_FORK
    assert MatrixRow(release="not-a-version", verdict="pass", exit_code=0).fa3_build == UPSTREAM


def test_the_docs_table_of_engine_sources_is_the_data():
    from pathlib import Path

    from refmodel.fa3_builds import engine_sources_markdown

    text = (Path(__file__).resolve().parents[2] / "docs" / "fa3-builds.md").read_text()
    start = text.index("<!-- engine-sources-table:")
    block = text[text.index("\n", start) + 1:text.index("<!-- end engine-sources-table -->")].strip()
    assert block == engine_sources_markdown()


def test_the_decode_tile_choice_is_a_hazard_class_of_its_own_under_the_fork():
    # a precompute of max_seqlen_q 9 (9 * 8 = 72 > 64 rows: the 192 x 160 tile) and a call of seqlen_q 1 (8 rows: the
    # one-MMA-WG 64 x 192 tile), d 64, h/h_k 8, 832 keys: the tiles' kBlockN differ, so S_p = 6 > S_c = 5 and the
    # long batch's 6 splits overflow 5 partial buffers. Upstream (no such choice) schedules both sides alike.
    from spec.invariants import CallLengths, check_all, metadata_for

    lens = [832, 1, 1, 1]
    seen = {}
    for name in (VLLM_FORK, UPSTREAM):
        P, R = metadata_for(precompute_inputs(4, 9, 832, 8, 1, 64, varlen_q=True, page_size=16, build=name), lens,
                            [9, 1, 1, 1])
        C = resolve_schedule(call_inputs(4, 1, 832, 8, 1, 64, varlen_q=True, page_size=16, build=name))
        seen[name] = (P.num_splits, C.num_splits, [(v.invariant, v.batch) for v in
                                                   check_all(P, R, C, CallLengths(tuple(lens), (1, 1, 1, 1)))])
    assert seen[VLLM_FORK] == (6, 5, [("SPLIT_BOUND", 0)])
    assert seen[UPSTREAM] == (6, 6, [])
