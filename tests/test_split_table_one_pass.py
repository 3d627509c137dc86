"""The split tables of spec.symbolic come from refmodel `num_splits_over_lengths`, the one-pass form of
`get_num_splits`: both give the same split count at every static seqlen_k, and group_configs the same groups.

The oracle is the per-length construction as it was (`get_num_splits` at each length); a seeded defect (each
length given its neighbour's split count) must be caught by the same comparison.
"""
import dataclasses

import pytest

import refmodel.fa3_scheduler as fs
from refmodel.fa3_scheduler import HEURISTIC_MAX_SPLITS, get_num_splits, num_splits_over_lengths, resolve_schedule
from spec import domain as D
from spec import symbolic
from spec.theorems_metadata import group_configs


def _table_inputs() -> list:
    """Every distinct input a split table of group_configs is built from, over the theorems' domain (both head modes)."""
    seen = {}
    for cfg in D.enumerate_configs(frozenset()):
        for inp in (cfg.precompute_inputs("tp"), cfg.precompute_inputs("attn_tp"), cfg.call_inputs()):
            base = dataclasses.replace(inp, precompute=True, seqlen_k=0, num_splits=0)
            seen.setdefault(base, None)
    return list(seen)


@pytest.fixture(scope="module")
def table_inputs():
    return _table_inputs()


def _lengths(inp) -> list:
    """The lengths a table reads (n-blocks 0..cap and the far points), plus lengths off the block grid."""
    bn = resolve_schedule(dataclasses.replace(inp, num_splits=1)).block_n
    cap = min(HEURISTIC_MAX_SPLITS, inp.num_sm)
    grid = [n * bn for n in (*range(cap + 1), cap + 1, cap + 7, (2 ** 20) // bn)]
    return grid + list(range(0, 3 * bn, 5))


def _disagreements(one_pass, inputs) -> list:
    out = []
    for inp in inputs:
        lengths = _lengths(inp)
        want = tuple(int(get_num_splits(dataclasses.replace(inp, seqlen_k=L))) for L in lengths)
        got = tuple(one_pass(inp, lengths))
        if got != want:
            out.append(inp)
    return out


def test_one_pass_equals_get_num_splits_at_every_length(table_inputs):
    assert len(table_inputs) > 100
    assert _disagreements(num_splits_over_lengths, table_inputs) == []


def test_one_pass_honours_a_positive_argument():
    inp = fs.ScheduleInputs(batch_size=4, seqlen_q=1, seqlen_k=0, num_heads=32, num_heads_k=8, headdim=128,
                            headdim_v=128, num_splits=3)
    assert num_splits_over_lengths(inp, [0, 128, 4096]) == (3, 3, 3)


def test_negative_control_a_table_off_by_one_length_is_caught(table_inputs):
    def shifted(inp, lengths):
        # the defect: each length answered with the next length's split count (an off-by-one n-block index)
        values = num_splits_over_lengths(inp, lengths)
        return values[1:] + values[-1:]

    assert _disagreements(shifted, table_inputs) != []


def _group_rows(groups) -> list:
    return [(g.P.key, g.C.key, g.sharded_cp, g.page_size, g.fixed, list(g.configs)) for g in groups]


def test_group_configs_gives_the_per_length_groups_and_tables():
    configs = tuple(D.enumerate_configs(frozenset()))

    def per_length(inp):   # the old construction: another function object, so the per-length path runs
        return get_num_splits(inp)

    for heads in ("tp", "attn_tp"):
        new = _group_rows(group_configs(configs, heads, get_num_splits, get_num_splits))
        old = _group_rows(group_configs(configs, heads, per_length, per_length))
        assert new == old


def test_negative_control_group_comparison_sees_one_wrong_table_entry():
    configs = tuple(D.enumerate_configs(frozenset()))

    def defective(inp):    # every heuristic split count off by one
        s = get_num_splits(inp)
        return s + 1 if inp.seqlen_k > 0 and inp.num_splits <= 0 else s

    new = _group_rows(group_configs(configs, "tp", get_num_splits, get_num_splits))
    assert _group_rows(group_configs(configs, "tp", defective, defective)) != new
    symbolic.clear_caches()
