"""Pins of refmodel.fa3_builds at each boundary: what each build's FA3 source does on both sides of it.

Sources: upstream Dao-AILab/flash-attention ``hopper/tile_size.h`` at 0251105a (``headdim <= 64`` with
``headdim_v == 512`` / ``== 256``, ``headdim <= 192`` with ``headdim_v <= 128``); the vLLM fork
vllm-project/flash-attention ``hopper/flash_api.cpp`` at 617264c1: the PackGQA override (485-487:
``arch >= 90 && h / h_k == 8 && is_local && d == 64 && dv == d``), PackGQA for Split (671, 1063) and under
``FLASHATTENTION_PACKGQA_ONLY`` for ``d == dv`` (674, 1065), the dynamic split vector
(677: ``b <= PREPARE_VARLEN_MAX_BATCHES_1CTA && num_splits > 1``; 1068 adds ``use_prepare_varlen``; line 39: 992).

The tile lookup is memoised (``functools.lru_cache``); every test here clears the memo first, so the rules are
evaluated on this test's inputs, not recalled from an earlier test's.
"""

import pytest

from refmodel import fa3_builds
from refmodel.fa3_builds import (MAX_BATCHES_1CTA, SGLANG_KERNEL_042, SGLANG_KERNEL_045, UPSTREAM, VLLM_FORK, build,
                                 check_build_name, engine_sources, engine_sources_markdown, fork_packgqa,
                                 fork_packgqa_override, fork_uses_dynamic_split, rule_matches, tile_size_fwd_sm90_build,
                                 tile_size_fwd_sm90_vllm_fork)

NO_FLAGS = {"is_causal": False, "is_local": False, "paged_kv_non_tma": False, "softcap": False, "v_colmajor": False,
            "one_mma_wg": False}


@pytest.fixture(autouse=True)
def _fresh_tile_memo():
    tile_size_fwd_sm90_build.cache_clear()
    yield
    tile_size_fwd_sm90_build.cache_clear()


@pytest.mark.parametrize("rule, d, dv, expected", [
    ({"d_max": 64}, 64, 64, True), ({"d_max": 64}, 65, 64, False),
    ({"dv_eq": 512}, 64, 512, True), ({"dv_eq": 512}, 64, 256, False), ({"dv_eq": 512}, 64, 511, False),
    ({"dv_max": 128}, 192, 128, True), ({"dv_max": 128}, 192, 129, False), ({"dv_max": 128}, 192, 127, True),
    ({}, 256, 512, True),
    ({"d_max": 64, "dv_eq": 256}, 64, 256, True), ({"d_max": 64, "dv_eq": 256}, 96, 256, False),
])
def test_rule_bounds(rule, d, dv, expected):
    assert rule_matches(rule, d, dv, NO_FLAGS) is expected


def test_rule_when_groups_are_any_of_all():
    rule = {"when": [["is_causal"], ["is_local", "paged_kv_non_tma"]]}
    assert rule_matches(rule, 64, 64, NO_FLAGS) is False
    assert rule_matches(rule, 64, 64, {**NO_FLAGS, "is_causal": True}) is True
    assert rule_matches(rule, 64, 64, {**NO_FLAGS, "is_local": True}) is False        # half a group
    assert rule_matches(rule, 64, 64, {**NO_FLAGS, "is_local": True, "paged_kv_non_tma": True}) is True


@pytest.mark.parametrize("d, dv, tile", [
    (64, 512, (64, 64)),      # tile_size.h: d <= 64, dv == 512
    (64, 256, (128, 96)),     # d <= 64, dv == 256
    (64, 128, (192, 192)),    # neither: the plain d <= 64 tile
    (192, 128, (128, 128)),   # d <= 192, dv <= 128
    (192, 96, (128, 128)),
    (192, 192, (128, 112)),   # dv > 128
])
def test_upstream_tiles_on_both_sides_of_the_dv_rules(d, dv, tile):
    assert tile_size_fwd_sm90_build(UPSTREAM, d, dv, False, False) == tile


def test_the_fork_tile_defaults_are_bf16_tma_and_two_warp_groups():
    # d = dv = 128 under the fork: bf16 (128, 160); fp8 (128, 192); paged non-TMA (128, 128); one MMA WG (64, 176)
    assert tile_size_fwd_sm90_vllm_fork(128, 128, False, False) == (128, 160)
    assert tile_size_fwd_sm90_vllm_fork(128, 128, False, False, 2, False, False) == (128, 160)
    assert tile_size_fwd_sm90_vllm_fork(128, 128, False, False, 1) == (128, 192)
    assert tile_size_fwd_sm90_vllm_fork(128, 128, False, False, 2, True) == (128, 128)
    assert tile_size_fwd_sm90_vllm_fork(128, 128, False, False, 2, False, True) == (64, 176)
    assert tile_size_fwd_sm90_build(UPSTREAM, 128, 128, False, False) == (128, 176)


def test_the_build_tile_defaults_are_bf16():
    assert tile_size_fwd_sm90_build(UPSTREAM, 128, 128, False, False) == \
        tile_size_fwd_sm90_build(UPSTREAM, 128, 128, False, False, 2)
    assert tile_size_fwd_sm90_build(UPSTREAM, 128, 128, False, False, 1) != (128, 176)


@pytest.mark.parametrize("arch, qhpk, local, d, dv, expected", [
    (90, 8, True, 64, 64, True),
    (89, 8, True, 64, 64, False), (100, 8, True, 64, 64, True),        # arch >= 90
    (90, 7, True, 64, 64, False), (90, 16, True, 64, 64, False),        # h / h_k == 8
    (90, 8, False, 64, 64, False),                                      # local only
    (90, 8, True, 128, 64, False), (90, 8, True, 64, 128, False),       # d == 64, dv == d
    (90, 8, True, 128, 128, False),
])
def test_the_forks_packgqa_override_on_both_sides_of_each_condition(arch, qhpk, local, d, dv, expected):
    assert fork_packgqa_override(arch, qhpk, local, d, dv) is expected


@pytest.mark.parametrize("pack, splits, d, dv, expected", [
    (False, 1, 128, 64, False),
    (True, 1, 128, 64, True),                                           # the heuristic's or the argument's pack
    (False, 2, 128, 64, True), (True, 2, 128, 64, True),                # Split (671, 1063)
    (False, 0, 128, 64, False),
    (False, 1, 64, 64, True), (False, 1, 128, 128, True),               # PACKGQA_ONLY: d == dv (674, 1065)
])
def test_the_forks_packgqa_after_the_heuristic(pack, splits, d, dv, expected):
    assert fork_packgqa(pack, splits, d, dv) is expected


@pytest.mark.parametrize("uses_prepare, b, splits, expected", [
    (True, MAX_BATCHES_1CTA, 2, True), (True, MAX_BATCHES_1CTA + 1, 2, False), (True, 1, 2, True),
    (True, 4, 1, False), (False, 4, 2, False),
])
def test_the_forks_dynamic_split_vector(uses_prepare, b, splits, expected):
    assert MAX_BATCHES_1CTA == 992
    assert fork_uses_dynamic_split(uses_prepare, b, splits) is expected


def test_build_names_and_the_refusal_message():
    assert check_build_name(None) == UPSTREAM and check_build_name(VLLM_FORK) == VLLM_FORK
    with pytest.raises(ValueError) as info:
        build("nope")
    assert str(info.value) == ("build: must be one of sglang-kernel-0.4.2, sglang-kernel-0.4.5, "
                               f"{UPSTREAM}, vllm-fork-1c81743f, vllm-fork-2d3b7508, {VLLM_FORK}, "
                               "vllm-fork-a8937124, got 'nope'")
    with pytest.raises(ValueError):
        check_build_name("nope")


def test_engine_source_rows_carry_the_sources_fields():
    data = fa3_builds._data()
    for row in engine_sources():
        src = data["sources"][row["kernel_package"]]
        for key in ("fa3_repo", "fa3_commit", "verified", "interface"):
            assert row[key] == src[key], key
        # the build is the kernel version's where the wheels were read (sglang-kernel), else the source's
        assert row["build"] == (src.get("builds_by_version") or {}).get(row["kernel_version"], src["build"])
        assert row["wheel"] == (src.get("wheels") or {}).get(row["kernel_version"])


def test_the_docs_table_names_a_read_pin_and_a_wheel_as_evidence(monkeypatch):
    data = fa3_builds._data()
    pinned = [e for e in data["engines"] if not (data["sources"][e["kernel_package"]].get("wheels") or {})]
    pkg = pinned[0]["kernel_package"]
    changed = {**data, "sources": {**data["sources"], pkg: {**data["sources"][pkg], "verified": True}}}
    monkeypatch.setattr(fa3_builds, "_data", lambda: changed)
    rows = engine_sources_markdown().splitlines()[2:]
    marks = {r.rsplit("|", 2)[-2].strip() for r in rows}
    assert {m for m in marks if not m.startswith("wheel ")} == {"source pin read", "pin not read"}
    assert any(m.startswith("wheel sglang_kernel-") and ", sha256 " in m for m in marks)
    row = next(r for r in rows if r.startswith(f"| {pinned[0]['engine']}=={pinned[0]['release']} |"))
    assert row.endswith("| source pin read |")


def test_each_build_record_is_its_json_row_field_by_field():
    # the record every caller reads (build(name)) carries the provenance written in fa3_builds.json: the repository,
    # commit and files read, the compile definitions, the note (empty where the row has none), the decode-tile
    # predicate and the varlen total_q bound (False where the row does not say)
    rows = fa3_builds._data()["builds"]
    assert set(rows) == set(fa3_builds.builds())
    for name, row in rows.items():
        b = build(name)
        assert b.name == name and b.repo == row["repo"] and b.commit == row["commit"]
        assert b.files == tuple(row["files"]) and isinstance(b.files, tuple) and b.files
        assert b.compile_definitions == tuple(row["compile_definitions"])
        assert b.note == row.get("note", "") and isinstance(b.note, str)
        assert b.one_mma_wg == row.get("one_mma_wg")
        assert b.varlen_total_q_bound is bool(row.get("varlen_total_q_bound"))
    assert build(UPSTREAM).note == ""                       # the upstream row has no note
    assert "b273a02" in build(VLLM_FORK).note               # the fork's row says which commit vLLM 0.33.0 pins


def test_only_the_later_sglang_kernel_wheels_bound_a_varlen_split_by_total_q():
    # get_num_splits of sglang-kernel 0.4.5 .. 0.4.10 reads params.total_q (scripts/read_fa3_wheel.py's listing,
    # docs/fa3-builds.md); upstream 0251105a, the fork and sglang-kernel 0.4.2 .. 0.4.4 bound a varlen call by batch 1,
    # and so do the fork builds of vLLM 0.10.1-0.18.1's wheels (their get_num_splits vectors,
    # tests/oracle/test_fidelity_vllm_wheel_builds.py)
    assert {n: build(n).varlen_total_q_bound for n in fa3_builds.builds()} == {
        UPSTREAM: False, VLLM_FORK: False, SGLANG_KERNEL_042: False, SGLANG_KERNEL_045: True,
        fa3_builds.VLLM_FORK_2D3B7508: False, fa3_builds.VLLM_FORK_A8937124: False,
        fa3_builds.VLLM_FORK_1C81743F: False}


def test_the_tile_lookup_defaults_to_two_mma_warp_groups():
    # tile_size.h of the fork (10-12) and of the sglang kernel wheels: ``use_one_mma_wg=false`` unless passed
    for name in (VLLM_FORK, SGLANG_KERNEL_042, SGLANG_KERNEL_045):
        two_wg = tile_size_fwd_sm90_build(name, 128, 128, False, False, one_mma_wg=False)
        assert tile_size_fwd_sm90_build(name, 128, 128, False, False) == two_wg
        assert tile_size_fwd_sm90_build(name, 128, 128, False, False, one_mma_wg=True) != two_wg
    assert tile_size_fwd_sm90_build(VLLM_FORK, 128, 128, False, False) == (128, 160)
    assert tile_size_fwd_sm90_build(VLLM_FORK, 128, 128, False, False, one_mma_wg=True) == (64, 176)


def test_a_tile_table_without_a_matching_rule_is_refused_naming_the_build_and_head_dim(monkeypatch):
    # every shipped table ends in an unconditional rule (tile_size.h's last ``else``); a table that does not is
    # refused with the build and the head dim, not answered with a tile
    rules = {UPSTREAM: {"element_size_2": [{"d_max": 64, "tile": [192, 192]}], "element_size_1": []}}
    monkeypatch.setattr(fa3_builds, "tile_rules", lambda: rules)
    assert tile_size_fwd_sm90_build(UPSTREAM, 64, 64, False, False) == (192, 192)
    with pytest.raises(ValueError) as info:
        tile_size_fwd_sm90_build(UPSTREAM, 96, 96, False, False)
    assert str(info.value) == f"tile_size_sm90.json: build {UPSTREAM!r} has no rule for headdim 96"
