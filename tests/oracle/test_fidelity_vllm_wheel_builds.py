"""The FA3 builds vLLM 0.10.1 .. 0.18.1 ship, read from their wheels: refmodel against the wheels' compiled host code.

The vectors (fa3verify/fidelity_vectors/vllm-fork-{2d3b7508,a8937124,1c81743f}.json) were produced once by
scripts/read_fa3_wheel.py, which calls each wheel's compiled ``tile_size_fwd_sm90``, ``get_num_splits`` and
``get_pack_gqa`` (commands in docs/fa3-builds.md). Each rule that differs between the builds is pinned with its fork
file:line and a negative control: the neighbouring build's rule on these vectors, or a seeded wrong rule, is caught.
"""

import pytest

from fa3verify.fidelity_builds import compare_wheel_build, load_vectors, wheel_builds
from refmodel import call_inputs, fa3_builds, precompute_inputs, resolve_schedule
from refmodel.fa3_builds import (VLLM_FORK, VLLM_FORK_1C81743F, VLLM_FORK_2D3B7508, VLLM_FORK_8798F277,
                                 VLLM_FORK_A8937124, build,
                                 build_for_engine, engine_sources, fork_host_rules, legacy_uses_dynamic_split,
                                 metadata_layout_kind, use_one_mma_wg)
from refmodel.metadata_layout import UNWRITTEN, MetadataLayout, decode_values_for_schedule, encode_metadata_values
from refmodel.prepare import prepare_scheduler

OLD_FORK_BUILDS = [VLLM_FORK_1C81743F, VLLM_FORK_2D3B7508, VLLM_FORK_A8937124]
RELEASES = {VLLM_FORK_2D3B7508: ["0.10.1", "0.10.2", "0.11.0"],
            VLLM_FORK_A8937124: ["0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0"],
            VLLM_FORK_1C81743F: ["0.17.0", "0.17.1", "0.18.0", "0.18.1"]}


def test_every_vllm_release_0_10_1_to_0_18_1_maps_to_the_build_read_from_its_own_wheel():
    assert set(OLD_FORK_BUILDS) <= set(wheel_builds())
    rows = {r["release"]: r for r in engine_sources() if r["engine"] == "vllm"}
    for name, releases in RELEASES.items():
        same = {w["version"]: w["sha256"] for w in load_vectors(name)["same_vectors_from"]}
        assert sorted(same) == sorted(releases)
        for v in releases:
            assert build_for_engine("vllm", v) == name
            # the release's own wheel gave exactly these vectors, and its sha256 is the one the mapping records
            assert rows[v]["wheel"]["sha256"] == same[v]
    assert build_for_engine("vllm", "0.19.0") == VLLM_FORK      # the newer releases keep the modelled fork build


@pytest.mark.parametrize("name", OLD_FORK_BUILDS)
def test_refmodel_matches_each_vllm_wheel_on_every_vector(name):
    r = compare_wheel_build(name)
    assert r["mismatches"] == {"tile": 0, "get_num_splits": 0, "get_pack_gqa": 0}, r["examples"]
    assert r["compared"] == {"tile": 3840, "get_num_splits": 3024, "get_pack_gqa": 4320}


def test_negative_control_the_neighbouring_builds_mismatch_on_each_wheels_vectors():
    # 617264c1 on 0.10.1's vectors: other bf16 tiles, and its decode tile refused for local attention
    r = compare_wheel_build(VLLM_FORK, vectors=load_vectors(VLLM_FORK_2D3B7508))
    assert r["mismatches"]["tile"] == 1804 and r["mismatches"]["get_num_splits"] == 181
    # 0.10.1's build on 0.11.1's vectors: only the fp8 decode tiles (tile_size.h@a8937124 55-59, 63-67) differ
    r = compare_wheel_build(VLLM_FORK_2D3B7508, vectors=load_vectors(VLLM_FORK_A8937124))
    assert r["mismatches"]["tile"] == 384 and r["mismatches"]["get_num_splits"] == 0
    # 617264c1 on 0.17.0's vectors: only the fp8 two-level-accumulation tiles (29210221) differ
    r = compare_wheel_build(VLLM_FORK, vectors=load_vectors(VLLM_FORK_1C81743F))
    assert r["mismatches"]["tile"] == 1284 and r["mismatches"]["get_num_splits"] == 0
    # 0.11.1's build on 0.17.0's vectors: bf16 tiles (1c81743f) and the local test of the decode tile
    r = compare_wheel_build(VLLM_FORK_A8937124, vectors=load_vectors(VLLM_FORK_1C81743F))
    assert r["mismatches"]["tile"] > 0 and r["mismatches"]["get_num_splits"] > 0


def test_negative_control_the_forks_local_test_in_the_older_builds_decode_tile_is_caught(monkeypatch):
    # heuristics.h@a8937124 10-14 has no `!params.is_local` (617264c1 adds it): the newer predicate mismatches
    real = fa3_builds.use_one_mma_wg

    def with_local_test(build_name, arch, headdim, is_local, seqlen_q, qhpk):
        return real(VLLM_FORK, arch, headdim, is_local, seqlen_q, qhpk)

    monkeypatch.setattr(fa3_builds, "use_one_mma_wg", with_local_test)
    for name in (VLLM_FORK_2D3B7508, VLLM_FORK_A8937124):
        assert compare_wheel_build(name)["mismatches"] == {"tile": 0, "get_num_splits": 150, "get_pack_gqa": 0}


@pytest.mark.parametrize("name, d, local, sq, qhpk, expected", [
    (VLLM_FORK_A8937124, 128, True, 1, 8, True),     # no local test (heuristics.h@a8937124 10-14)
    (VLLM_FORK_2D3B7508, 64, True, 8, 8, True),
    (VLLM_FORK_A8937124, 128, False, 9, 8, False),   # 72 rows > 64
    (VLLM_FORK_1C81743F, 128, True, 1, 8, False),    # the local test (heuristics.h@1c81743f 12)
    (VLLM_FORK_1C81743F, 64, False, 8, 8, True),
])
def test_the_older_builds_decode_tile_predicate(name, d, local, sq, qhpk, expected):
    assert use_one_mma_wg(name, 90, d, local, sq, qhpk) is expected


@pytest.mark.parametrize("name, d, dv, causal, local, e, pg, wg, tile", [
    # bf16 (tile_size.h@a8937124 18-45; @1c81743f the same lines)
    (VLLM_FORK_A8937124, 64, 256, 0, 0, 2, 0, 0, (128, 112)), (VLLM_FORK_1C81743F, 64, 256, 0, 0, 2, 0, 0, (128, 96)),
    (VLLM_FORK_A8937124, 128, 128, 0, 0, 2, 0, 0, (128, 176)), (VLLM_FORK_1C81743F, 128, 128, 0, 0, 2, 0, 0, (128, 160)),
    (VLLM_FORK_2D3B7508, 192, 192, 0, 0, 2, 0, 0, (128, 112)), (VLLM_FORK_1C81743F, 192, 192, 0, 0, 2, 0, 0, (128, 96)),
    (VLLM_FORK_A8937124, 64, 64, 0, 1, 2, 0, 1, (64, 192)),     # the decode tile with local attention
    (VLLM_FORK_A8937124, 128, 128, 1, 0, 2, 0, 1, (64, 128)),
    # fp8: no decode tile at 2d3b7508, 64 x 128 / 64 x 96 from 4695e6be / 07602adc (@a8937124 55-59, 63-67)
    (VLLM_FORK_2D3B7508, 64, 64, 0, 0, 1, 0, 1, (192, 160)), (VLLM_FORK_A8937124, 64, 64, 0, 0, 1, 0, 1, (64, 128)),
    (VLLM_FORK_2D3B7508, 128, 128, 0, 0, 1, 0, 1, (128, 224)), (VLLM_FORK_A8937124, 128, 128, 0, 0, 1, 0, 1, (64, 96)),
    (VLLM_FORK_1C81743F, 128, 128, 0, 0, 1, 1, 0, (128, 160)),   # before the two-level-accumulation tiles
    (VLLM_FORK_1C81743F, 64, 64, 0, 0, 1, 0, 0, (192, 160)),
])
def test_the_older_builds_tiles(name, d, dv, causal, local, e, pg, wg, tile):
    assert fa3_builds.tile_size_fwd_sm90_build(name, d, dv, bool(causal), bool(local), e, bool(pg),
                                               one_mma_wg=bool(wg)) == tile


def test_the_older_builds_host_rules_are_recorded_per_build():
    for name in OLD_FORK_BUILDS + [VLLM_FORK]:
        assert fork_host_rules(name)
    assert not fork_host_rules("upstream-0251105a") and not fork_host_rules("sglang-kernel-0.4.5")
    assert [metadata_layout_kind(n) for n in (VLLM_FORK_2D3B7508, VLLM_FORK_A8937124, VLLM_FORK_1C81743F, VLLM_FORK,
                                              "upstream-0251105a")] == \
        ["semaphore-splits", "semaphore-splits", "fork", "fork", "upstream"]
    assert [build(n).packgqa_only for n in (VLLM_FORK_2D3B7508, VLLM_FORK_A8937124, VLLM_FORK_1C81743F, VLLM_FORK)] \
        == [False, False, True, True]
    assert [build(n).one_mma_wg for n in OLD_FORK_BUILDS] == ["fork", "no-local-test", "no-local-test"]


@pytest.mark.parametrize("precompute, uses_prepare, b, arg, expected", [
    (True, True, 256, 0, True), (True, True, 256, 32, True), (True, True, 256, 1, False),   # the argument, not S
    (True, True, 992, 0, True), (True, True, 993, 0, False),
    (False, True, 8, 0, True), (False, False, 8, 0, False),   # the call: only varlen (flash_api.cpp@a8937124 994)
])
def test_the_older_builds_dynamic_split_vector(precompute, uses_prepare, b, arg, expected):
    assert legacy_uses_dynamic_split(precompute, uses_prepare, b, arg) is expected


def test_the_older_builds_metadata_is_the_semaphore_then_b_split_counts():
    # vLLM 0.11.1 .. 0.16.0 size the full-graph buffer max_num_seqs + 1 = 257 int32: a batch of 256 fits exactly
    pre = resolve_schedule(precompute_inputs(256, 1, 4096, 32, 8, 128, num_splits=32, build=VLLM_FORK_A8937124))
    call = resolve_schedule(call_inputs(256, 1, 4096, 32, 8, 128, varlen_q=True, num_splits=32, total_q=256,
                                        build=VLLM_FORK_A8937124))
    assert pre.metadata_size == call.metadata_size == 257
    # negative control: 617264c1's layout (prepare_seqlen_q and split vectors of b4 each) does not fit that buffer
    assert resolve_schedule(precompute_inputs(256, 1, 4096, 32, 8, 128, num_splits=32,
                                              build=VLLM_FORK)).metadata_size == 513
    # num_splits 1 passed: no split vector, the semaphore alone (flash_api.cpp@a8937124 624, 1011-1012)
    one = resolve_schedule(precompute_inputs(8, 1, 4096, 32, 8, 128, num_splits=1, build=VLLM_FORK_A8937124))
    assert one.metadata_size == 1
    # the layout: the semaphore at 0, the splits at 1..b (data_ptr + 1: 652, 1028), nothing else
    layout = MetadataLayout.for_schedule(pre)
    assert (layout.size, layout.semaphore_offset, layout.splits_offset, layout.m_blocks_offset,
            layout.batch_idx_offset, layout.nheads_in_l2_offset) == (257, 0, 1, None, None, None)
    assert not pre.sort


def test_the_older_builds_metadata_round_trips_and_a_shorter_precompute_leaves_unwritten_splits():
    pre = resolve_schedule(precompute_inputs(4, 1, 32768, 32, 8, 128, num_splits=16, build=VLLM_FORK_A8937124))
    result = prepare_scheduler(pre, [32768, 100, 100, 100])
    values = encode_metadata_values(pre, result)
    assert len(values) == 5 and values[0] == 0 and values[1:] == result.num_splits
    assert values[1] > 1
    md = decode_values_for_schedule(values, pre)
    assert md.num_splits[:4] == result.num_splits and md.semaphore == 0
    # a call of 6 sequences reads splits 1..6: the precompute of 4 wrote none past slot 4
    call = resolve_schedule(call_inputs(6, 1, 32768, 32, 8, 128, varlen_q=True, num_splits=16, total_q=6,
                                        build=VLLM_FORK_A8937124))
    md = decode_values_for_schedule(values, call)
    assert md.num_splits[4] == UNWRITTEN and md.num_splits[5] == UNWRITTEN
    # the kernel counts its own m-blocks (no m-block vector): one m-block of the kernel's tile for decode
    assert md.num_m_blocks[:6] == [1] * 6


def test_the_older_builds_pack_gqa_is_not_forced_for_equal_head_dims():
    # no FLASHATTENTION_PACKGQA_ONLY in the FA3 target of CMakeLists.txt@a8937124 267-278: d == dv is not OR-ed in
    # (617264c1 674, 1065 is); h/h_k 2 with 128 query rows per sequence and one split: the heuristic keeps it off
    args = (2, 128, 4096, 16, 8, 128)
    for name, expected in ((VLLM_FORK_A8937124, False), (VLLM_FORK_2D3B7508, False), (VLLM_FORK, True),
                           (VLLM_FORK_1C81743F, True)):
        assert resolve_schedule(precompute_inputs(*args, num_splits=1, build=name)).pack_gqa is expected
    # with a split the older builds OR it in (631, 1003)
    assert resolve_schedule(precompute_inputs(*args, num_splits=2, build=VLLM_FORK_A8937124)).pack_gqa is True


def test_the_older_builds_veto_paged_tma_for_local_attention():
    # flash_api.cpp@a8937124 427 (617264c1 466): the fork builds refuse paged TMA for local attention
    from refmodel.fa3_scheduler import Masking, ScheduleInputs, pagedkv_tma

    masking = Masking(is_causal=False, is_local=True, window_left=100, window_right=0)
    for name, expected in ((VLLM_FORK_A8937124, False), (VLLM_FORK_2D3B7508, False), ("upstream-0251105a", True)):
        inp = ScheduleInputs(batch_size=1, seqlen_q=4096, seqlen_k=4096, num_heads=8, num_heads_k=8, headdim=128,
                             headdim_v=128, page_size=128 * 176, precompute=False, build=name)
        assert pagedkv_tma(inp, masking, 128, 128) is expected


def test_the_older_builds_bound_splits_by_the_whole_batch_above_992():
    # num_splits_dynamic_ptr is null for b > 992 (flash_api.cpp@a8937124 624-625, 994-996), so get_num_splits counts
    # every batch's m-blocks; 617264c1's model pretends batch 1 for any varlen call
    def splits(b, name):
        return resolve_schedule(precompute_inputs(b, 1, 32768, 8, 1, 128, build=name)).num_splits
    assert splits(992, VLLM_FORK_A8937124) == splits(992, VLLM_FORK) > 1
    assert splits(993, VLLM_FORK_A8937124) == 1 and splits(993, VLLM_FORK) > 1
    s = resolve_schedule(precompute_inputs(993, 1, 32768, 8, 1, 128, build=VLLM_FORK_A8937124))
    assert (s.legacy_dynamic_split, s.num_vectors, s.metadata_size) == (False, 0, 1)
    s = resolve_schedule(precompute_inputs(992, 1, 32768, 8, 1, 128, build=VLLM_FORK_A8937124))
    assert (s.legacy_dynamic_split, s.num_vectors, s.metadata_size) == (True, 1, 993)
    # every other layout keeps legacy_dynamic_split False
    assert resolve_schedule(precompute_inputs(8, 1, 4096, 8, 1, 128, build=VLLM_FORK)).legacy_dynamic_split is False


def test_a_non_varlen_call_of_the_older_builds_has_no_split_vector():
    # the call keeps the vector only when varlen (994); causal non-varlen on sm90 still needs the semaphore (1008-1010)
    call = resolve_schedule(call_inputs(4, 8, 4096, 8, 1, 128, has_cache_seqlens=False, causal=True, num_splits=1,
                                        build=VLLM_FORK_A8937124))
    assert (call.legacy_dynamic_split, call.metadata_size) == (False, 1)
    # the same call varlen (cache_seqlens given) with num_splits 0 keeps it: the semaphore and 4 split counts
    call = resolve_schedule(call_inputs(4, 8, 4096, 8, 1, 128, causal=True, build=VLLM_FORK_A8937124))
    assert (call.legacy_dynamic_split, call.metadata_size) == (True, 5)


# -- vLLM 0.8.5 .. 0.10.0: vllm-fork-8798f277 (the fork commit 0.8.5 pins; host files unchanged to b99f8c82^) --

EARLY_RELEASES = ["0.8.5", "0.8.5.post1", "0.9.0", "0.9.0.1", "0.9.1", "0.9.2", "0.10.0"]


def test_vllm_0_8_5_to_0_10_0_map_to_the_build_read_from_their_own_wheels():
    same = {w["version"]: w for w in load_vectors(VLLM_FORK_8798F277)["same_vectors_from"]}
    assert sorted(same) == sorted(EARLY_RELEASES)
    # four distinct libraries (0.8.5 = 0.8.5.post1, 0.9.0 = 0.9.0.1 = 0.9.1), one set of vectors
    assert len({w["library_sha256"] for w in same.values()}) == 4
    rows = {r["release"]: r for r in engine_sources() if r["engine"] == "vllm"}
    for v in EARLY_RELEASES:
        if v in rows:                       # 0.9.0.1 shares 0.9.0's engine row
            assert build_for_engine("vllm", v) == VLLM_FORK_8798F277
            assert rows[v]["wheel"]["sha256"] == same[v]["sha256"] and rows[v]["verified"] is True
    assert not [r for r in engine_sources() if "not derived" in str(r)]


def test_refmodel_matches_the_vllm_0_8_5_wheels_on_every_vector():
    r = compare_wheel_build(VLLM_FORK_8798F277)
    assert r["mismatches"] == {"tile": 0, "get_num_splits": 0, "get_pack_gqa": 0}, r["examples"]
    assert r["compared"] == {"tile": 3840, "get_num_splits": 3024, "get_pack_gqa": 4320}


def test_negative_control_other_builds_and_a_d64_decode_tile_mismatch_the_0_8_5_vectors(monkeypatch):
    vectors = load_vectors(VLLM_FORK_8798F277)
    assert compare_wheel_build(VLLM_FORK_2D3B7508, vectors=vectors)["mismatches"] == \
        {"tile": 176, "get_num_splits": 673, "get_pack_gqa": 0}
    assert compare_wheel_build("upstream-0251105a", vectors=vectors)["mismatches"] == \
        {"tile": 288, "get_num_splits": 389, "get_pack_gqa": 0}
    # the later forks' predicate (d 64 too, rows counted with h / h_k whatever pack_gqa): get_num_splits mismatches
    real = fa3_builds.use_one_mma_wg

    def later_predicate(build_name, arch, headdim, is_local, seqlen_q, qhpk, pack_gqa=False):
        return real(VLLM_FORK_2D3B7508, arch, headdim, is_local, seqlen_q, qhpk)

    monkeypatch.setattr(fa3_builds, "use_one_mma_wg", later_predicate)
    assert compare_wheel_build(VLLM_FORK_8798F277)["mismatches"]["get_num_splits"] > 0


@pytest.mark.parametrize("d, sq, qhpk, pack, expected", [
    (128, 1, 8, True, True), (128, 8, 8, True, True), (128, 9, 8, True, False),   # 72 rows under PackGQA
    (128, 9, 8, False, True), (128, 64, 8, False, True), (128, 65, 1, False, False),
    (64, 1, 8, True, False),                                                       # d == 128 only
])
def test_the_0_8_5_decode_tile_predicate_counts_rows_with_h_over_h_k_only_under_packgqa(d, sq, qhpk, pack, expected):
    # heuristics.h@8798f277 10-13: arch >= 90 && d == 128 && seqlen_q * (!pack_gqa ? 1 : h / h_k) <= 64, no local test
    assert use_one_mma_wg(VLLM_FORK_8798F277, 90, d, True, sq, qhpk, pack_gqa=pack) is expected


def test_the_0_8_5_build_replaces_packgqa_by_split_and_the_kernel_tile_follows():
    # flash_api.cpp@8798f277 589-592: get_pack_gqa (varlen: True) feeds get_num_splits, then pack_gqa = splits > 1
    one = resolve_schedule(precompute_inputs(4, 16, 512, 32, 4, 128, varlen_q=True, build=VLLM_FORK_8798F277))
    assert one.num_splits == 1 and one.pack_gqa is False
    # the split count read the tile with PackGQA (16 * 8 rows > 64: 128 rows), the kernel without (16 rows: 64)
    assert one.block_m == 64 and one.kernel_block_m == 64
    older = resolve_schedule(precompute_inputs(4, 16, 512, 32, 4, 128, varlen_q=True, build=VLLM_FORK_A8937124))
    assert older.pack_gqa is True                  # negative control: the older forks OR PackGQA with Split
    many = resolve_schedule(precompute_inputs(1, 1, 32768, 8, 1, 128, varlen_q=True, build=VLLM_FORK_8798F277))
    assert many.num_splits > 1 and many.pack_gqa is True


def test_the_0_8_5_build_keeps_the_split_vector_whatever_num_splits_is_passed():
    # flash_api.cpp@8798f277 584, 605: b <= 992 alone decides at the precompute; 257 int32 for 256 rows, the size of
    # 0.9.1 .. 0.10.0's full-graph buffer (max_num_seqs + 1)
    for arg in (0, 1, 32):
        pre = resolve_schedule(precompute_inputs(256, 1, 4096, 32, 8, 128, num_splits=arg, build=VLLM_FORK_8798F277))
        assert pre.legacy_dynamic_split and pre.metadata_size == 257
    # negative control: a8937124 drops it when num_splits 1 is passed (@a8937124 624)
    assert resolve_schedule(precompute_inputs(256, 1, 4096, 32, 8, 128, num_splits=1,
                                              build=VLLM_FORK_A8937124)).metadata_size == 1
    assert resolve_schedule(precompute_inputs(993, 1, 4096, 32, 8, 128, build=VLLM_FORK_8798F277)).metadata_size == 1
    call = resolve_schedule(call_inputs(256, 1, 4096, 32, 8, 128, varlen_q=True, num_splits=1, total_q=256,
                                        build=VLLM_FORK_8798F277))
    assert call.metadata_size == 257


def test_the_0_8_5_builds_tma_choice_uses_no_decode_tile():
    # get_pagedkv_tma@8798f277 397 calls tile_size_fwd_sm90 without the decode-tile argument: 128 x 176 here, so 80
    # packed rows (10 x h/h_k 8) do not exceed kBlockM and a page of 176 keeps TMA off
    from refmodel.fa3_scheduler import Masking, ScheduleInputs, pagedkv_tma

    masking = Masking(is_causal=False, is_local=False, window_left=-1, window_right=-1)
    inp = ScheduleInputs(batch_size=1, seqlen_q=10, seqlen_k=4096, num_heads=8, num_heads_k=1, headdim=128,
                         headdim_v=128, page_size=176, precompute=False, build=VLLM_FORK_8798F277)
    assert pagedkv_tma(inp, masking, 128, 128) is False
    # negative control: with the decode tile (64 x 176) the same rows would exceed kBlockM and take TMA
    assert fa3_builds.tile_size_fwd_sm90_build(VLLM_FORK_8798F277, 128, 128, False, False, 2, False,
                                               one_mma_wg=True) == (64, 176)
    assert fa3_builds.decode_tile(VLLM_FORK_8798F277, 90, 128, False, 10, 8, pack_gqa=False) is True
    assert fa3_builds.decode_tile(VLLM_FORK_8798F277, 90, 128, False, 10, 8, pack_gqa=None) is False
