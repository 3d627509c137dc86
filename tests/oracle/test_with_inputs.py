"""refmodel `with_inputs` is `dataclasses.replace` for ScheduleInputs: the same object (equal, same hash, same
fields), the original untouched, unknown fields refused, over every input the metadata theorems build.

The oracle is `dataclasses.replace` itself; seeded defects (a change dropped, the original's state shared and
mutated, a field left out) must be caught by the same comparison.
"""
import dataclasses

import pytest

import refmodel.fa3_scheduler as fs
from refmodel.fa3_scheduler import ScheduleInputs, call_inputs, precompute_inputs, with_inputs
from spec.model import domain as D

#: The changes the provers make (symbolic tables, query classes, fixed split counts, replays), and a few more.
CHANGES = ({"seqlen_k": 0}, {"seqlen_k": 4096}, {"num_splits": 0}, {"num_splits": 1}, {"num_splits": 2},
           {"precompute": True}, {"seqlen_q": 7}, {"seqlen_q": 2 ** 16, "num_splits": 2},
           {"batch_size": 3, "seqlen_k": 129, "num_splits": 5}, {"precompute": False, "uses_prepare": True},
           {"pack_gqa": False}, {"page_size": None}, {})


def _inputs() -> list:
    seen = {}
    for cfg in list(D.enumerate_configs(frozenset()))[::7]:
        for inp in (cfg.precompute_inputs("tp"), cfg.precompute_inputs("attn_tp"), cfg.call_inputs()):
            seen.setdefault(inp, None)
    for d, dv in ((64, 256), (192, 128), (128, 128)):
        seen.setdefault(precompute_inputs(1, 5, 0, 8, 1, d, headdim_v=dv, varlen_q=True, page_size=128, causal=True,
                                          pack_gqa=False, num_splits=2), None)
        seen.setdefault(call_inputs(2, 1, 256, 32, 4, d, headdim_v=dv, page_size=1, causal=True), None)
    return list(seen)


def _disagreements(fast, inputs) -> list:
    out = []
    for inp in inputs:
        before = dict(vars(inp))
        for change in CHANGES:
            want = dataclasses.replace(inp, **change)
            got = fast(inp, **change)
            if (type(got) is not ScheduleInputs or got != want or hash(got) != hash(want)
                    or vars(got) != vars(want) or got is inp and change):
                out.append((inp, change))
        if vars(inp) != before:
            out.append((inp, "original changed"))
    return out


@pytest.fixture(scope="module")
def inputs():
    return _inputs()


def test_with_inputs_equals_dataclasses_replace(inputs):
    assert len(inputs) > 100
    assert _disagreements(with_inputs, inputs) == []


def test_with_inputs_refuses_unknown_fields_as_replace_does():
    inp = precompute_inputs(1, 1, 0, 32, 8, 128)
    with pytest.raises(TypeError):
        dataclasses.replace(inp, seqlen=3)
    with pytest.raises(TypeError):
        with_inputs(inp, seqlen=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        with_inputs(inp, seqlen_q=2).seqlen_q = 3  # still frozen


def _drops_a_change(inp, **changes):
    out = with_inputs(inp)
    for name in list(changes)[1:]:
        object.__setattr__(out, name, changes[name])
    return out


def _shares_state(inp, **changes):
    out = object.__new__(ScheduleInputs)
    object.__setattr__(out, "__dict__", inp.__dict__)  # aliasing: the "copy" writes into the original
    out.__dict__.update(changes)
    return out


def _forgets_a_field(inp, **changes):
    out = with_inputs(inp, **changes)
    del out.__dict__["build"]
    return out


@pytest.mark.parametrize("defect", [_drops_a_change, _shares_state, _forgets_a_field])
def test_negative_control_a_defective_copy_is_caught(inputs, defect):
    assert _disagreements(defect, inputs[:20])


def test_a_subclass_or_post_init_falls_back_to_replace():
    @dataclasses.dataclass(frozen=True)
    class Checked(ScheduleInputs):
        def __post_init__(self):
            if self.seqlen_q < 0:
                raise ValueError("seqlen_q")

    inp = Checked(batch_size=1, seqlen_q=1, seqlen_k=0, num_heads=8, num_heads_k=1, headdim=128, headdim_v=128)
    with pytest.raises(ValueError):
        with_inputs(inp, seqlen_q=-1)
    assert type(with_inputs(inp, seqlen_q=2)) is Checked
    assert fs.with_inputs is with_inputs
