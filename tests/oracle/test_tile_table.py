"""The sm90 tile tables as data (refmodel/tile_size_sm90.json), read by refmodel.fa3_builds.tile_size_fwd_sm90_build.

Invariants: each build's table answers every head-dim pair in FA3's domain (its last rule has no condition); the
rule reader is the one both builds use (upstream's ``tile_size_fwd_sm90`` and the fork's wrapper agree with it);
and kBlockM reads no flag but ``one_mma_wg`` (Dao-AILab/flash-attention@0251105a tile_size.h 10-54,
vllm-project/flash-attention@617264c1 tile_size.h 10-93: no first element of a return reads causal, local,
paged_kv_non_TMA, softcap or v_colmajor). get_pack_gqa uses only kBlockM, so that last property is why the
mutants of its ``build_tile`` call that change only its ``paged_kv_non_tma`` argument are equivalent;
the negative controls seed a table that breaks each property and check it is caught.
"""

import copy
import itertools

import pytest

from refmodel import fa3_builds
from refmodel.fa3_builds import UPSTREAM, VLLM_FORK, tile_size_fwd_sm90_build, tile_size_fwd_sm90_vllm_fork
from refmodel.fa3_scheduler import tile_size_fwd_sm90

FLAGS = ("is_causal", "is_local", "paged_kv_non_tma", "softcap", "v_colmajor")
DIMS = (32, 64, 80, 96, 128, 160, 192, 224, 256)
DVS = (64, 96, 128, 192, 256, 512)


def block_m_readers(rules_by_build) -> list:
    """(build, element size, d, dv, one_mma_wg) at which kBlockM changes with a flag other than one_mma_wg."""
    found = []
    for name, tables in rules_by_build.items():
        for key, rules in tables.items():
            if not key.startswith("element_size_"):
                continue
            for d, dv, wg in itertools.product(DIMS, DVS, (False, True)):
                bms = set()
                for values in itertools.product((False, True), repeat=len(FLAGS)):
                    flags = dict(zip(FLAGS, values), one_mma_wg=wg)
                    rule = next(r for r in rules if fa3_builds.rule_matches(r, d, dv, flags))
                    bms.add(rule["tile"][0])
                if len(bms) > 1:
                    found.append((name, key, d, dv, wg))
    return found


def test_every_table_ends_in_an_unconditional_rule():
    for name, tables in fa3_builds.tile_rules().items():
        for key in ("element_size_2", "element_size_1"):
            last = tables[key][-1]
            assert set(last) == {"tile"}, (name, key, last)


def test_block_m_reads_no_flag_but_one_mma_wg_in_either_build():
    assert block_m_readers(fa3_builds.tile_rules()) == []


def test_negative_control_a_block_m_that_reads_causal_is_caught():
    seeded = copy.deepcopy(fa3_builds.tile_rules())
    rules = seeded[UPSTREAM]["element_size_2"]
    i = next(i for i, r in enumerate(rules) if r.get("d_max") == 128 and "when" in r)
    rules[i] = {**rules[i], "tile": [64, rules[i]["tile"][1]]}    # kBlockM 64 when causal/local/non-TMA
    assert (UPSTREAM, "element_size_2", 128, 128, False) in block_m_readers(seeded)


@pytest.mark.parametrize("d,dv,causal,local,elem,non_tma,wg,expected", [
    (128, 128, False, False, 2, False, False, (128, 176)),   # upstream tile_size.h: 176 non-causal
    (64, 64, False, True, 2, False, False, (192, 128)),     # the fork: 192 x 160 local
    (128, 128, False, True, 1, False, False, (128, 224)),
])
def test_upstream_wrapper_is_the_shared_reader(d, dv, causal, local, elem, non_tma, wg, expected):
    assert tile_size_fwd_sm90(d, dv, causal, local, elem, non_tma) == expected
    assert tile_size_fwd_sm90_build(UPSTREAM, d, dv, causal, local, elem, non_tma) == expected
    # negative control: the fork's table answers otherwise on each of these
    assert tile_size_fwd_sm90_build(VLLM_FORK, d, dv, causal, local, elem, non_tma) != expected


def test_fork_wrapper_is_the_shared_reader_and_one_mma_wg_changes_nothing_upstream():
    assert tile_size_fwd_sm90_vllm_fork(128, 128, False, False, 2, False, True) == (64, 176)
    assert tile_size_fwd_sm90_build(VLLM_FORK, 128, 128, False, False, 2, one_mma_wg=True) == (64, 176)
    assert tile_size_fwd_sm90_build(UPSTREAM, 128, 128, False, False, 2, one_mma_wg=True) == (128, 176)


def test_unknown_build_names_the_field():
    with pytest.raises(ValueError, match="build: must be one of"):
        tile_size_fwd_sm90_build("nope", 128, 128, False, False)
