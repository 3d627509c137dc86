"""The split tables of spec.theorems.symbolic come from refmodel `num_splits_over_lengths`, the one-pass form of
`get_num_splits`: both give the same split count at every static seqlen_k, and group_configs the same groups.

The oracle is the per-length construction as it was (`get_num_splits` at each length); a seeded defect (each
length given its neighbour's split count) must be caught by the same comparison. Which form a table is built by
is the heuristic's own choice (spec.theorems.symbolic `splits_over_lengths`: its `over_lengths` if it carries one, else a
call per length), never the identity of `get_num_splits`; an `over_lengths` off at one length must be caught.
"""
import dataclasses
import functools

import pytest

import refmodel.fa3_scheduler as fs
from refmodel.fa3_scheduler import HEURISTIC_MAX_SPLITS, get_num_splits, num_splits_over_lengths, resolve_schedule
from spec.model import domain as D
from spec.theorems import symbolic
from spec.theorems.metadata import group_configs


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


def _counting(over_lengths=None):
    """A heuristic equal to get_num_splits that counts its calls; with `over_lengths`, it carries that one-pass form."""
    calls = {"per_length": 0, "over_lengths": 0}

    def heuristic(inp):
        calls["per_length"] += 1
        return get_num_splits(inp)

    if over_lengths is not None:
        def over(inp, lengths):
            calls["over_lengths"] += 1
            return over_lengths(inp, lengths)
        heuristic.over_lengths = over
    return heuristic, calls


def _heuristic_inputs(table_inputs) -> list:
    """A few table inputs whose split count comes from the heuristic (no positive num_splits argument)."""
    out = [inp for inp in table_inputs if inp.num_splits <= 0][:6]
    assert len(out) == 6
    return out


def _table_size(inp) -> int:
    return min(HEURISTIC_MAX_SPLITS, inp.num_sm) + 1 + 3   # n-blocks 0..cap and the three far points


def test_refmodel_get_num_splits_carries_its_one_pass_form():
    assert get_num_splits.over_lengths is num_splits_over_lengths


def test_a_heuristic_carrying_over_lengths_builds_its_table_in_one_pass(table_inputs):
    heuristic, calls = _counting(num_splits_over_lengths)
    inputs = _heuristic_inputs(table_inputs)
    for inp in inputs:
        assert symbolic.side_params(inp, heuristic).table == symbolic.side_params(inp, get_num_splits).table
    assert calls == {"per_length": 0, "over_lengths": len(inputs)}


def test_a_plain_heuristic_is_called_per_length_and_gives_the_same_table(table_inputs):
    heuristic, calls = _counting()
    inputs = _heuristic_inputs(table_inputs)
    for inp in inputs:
        side = symbolic.side_params(inp, heuristic)
        assert (side.table, side.tail) == (symbolic.side_params(inp, get_num_splits).table,
                                           symbolic.side_params(inp, get_num_splits).tail)
    assert calls == {"per_length": sum(_table_size(inp) for inp in inputs), "over_lengths": 0}


def test_splits_over_lengths_gives_get_num_splits_by_either_form(table_inputs):
    one_pass, _ = _counting(num_splits_over_lengths)
    per_length, _ = _counting()
    for heuristic in (get_num_splits, one_pass, per_length):
        assert _disagreements(functools.partial(symbolic.splits_over_lengths, heuristic), table_inputs) == []


def _off_at_one_length(inp, lengths):
    # the defect: the one-pass form answers one length (the fifth, n-block 5 of a table) one split too many
    values = list(num_splits_over_lengths(inp, lengths))
    values[5] += 1
    return tuple(values)


def test_negative_control_an_over_lengths_off_at_one_length_is_caught(table_inputs):
    defective, calls = _counting(_off_at_one_length)
    assert _disagreements(functools.partial(symbolic.splits_over_lengths, defective), table_inputs) != []
    configs = tuple(D.enumerate_configs(frozenset()))
    per_length, _ = _counting()
    old = _group_rows(group_configs(configs, "tp", per_length, per_length))
    assert _group_rows(group_configs(configs, "tp", defective, defective)) != old
    assert calls["over_lengths"] > 0 and calls["per_length"] == 0
    symbolic.clear_caches()


def test_negative_control_a_wrapper_of_get_num_splits_is_not_given_its_one_pass_form(table_inputs):
    @functools.wraps(get_num_splits)   # copies get_num_splits.__dict__, over_lengths included
    def defective(inp):
        s = get_num_splits(inp)
        return s + 1 if inp.seqlen_k > 0 and inp.num_splits <= 0 else s

    assert defective.over_lengths is num_splits_over_lengths
    inputs = _heuristic_inputs(table_inputs)
    assert any(symbolic.side_params(inp, defective).table != symbolic.side_params(inp, get_num_splits).table
               for inp in inputs)
    symbolic.clear_caches()
