"""`fuzz --family NAME` (repeatable): the campaign draws every case from the named strategy families
(fa3verify.strategies.families_strategy), not from the system under test's own domain; an unknown name is exit 2
naming the families there are, before any work starts (fa3verify/commands/fuzz.py)."""

from __future__ import annotations

import json
import random

import pytest

from fa3verify import cli, strategies
from fa3verify.strategies import FAMILIES, families_strategy


def test_an_unknown_family_is_exit_2_naming_the_allowed_ones_before_work_starts(monkeypatch, capsys):
    import fa3verify.engine_choice as engine_choice

    def no_engine(*args, **kwargs):
        raise AssertionError("the system under test was opened before --family was checked")

    monkeypatch.setattr(engine_choice, "sut_from_args", no_engine)
    assert cli.main(["fuzz", "--family", "large-decode-batch", "--family", "no-such-family", "--cases", "3"]) == 2
    err = capsys.readouterr().err
    assert "--family" in err and "'no-such-family'" in err
    assert all(name in err for name in FAMILIES)


def _tagging(tag: str, seen: list):
    def draw(rng: random.Random):
        seen.append(tag)
        return FAMILIES["scenario"](rng)
    return draw


def test_several_families_each_draw_from_one_of_them_by_the_seed():
    seen: list = []
    fams = {"a": _tagging("a", seen), "b": _tagging("b", seen)}
    original = dict(FAMILIES)
    try:
        FAMILIES.update(fams)
        gen = families_strategy(["a", "b", "a"])
        first = [gen(random.Random(i)) for i in range(40)]
        tags = list(seen)
        seen.clear()
        again = [gen(random.Random(i)) for i in range(40)]
    finally:
        FAMILIES.clear()
        FAMILIES.update(original)
    assert set(tags) == {"a", "b"} and len(tags) == 40
    assert seen == tags and [repr(c) for c in again] == [repr(c) for c in first]  # same seed, same cases


def test_the_cli_runs_only_the_named_family(monkeypatch, tmp_path):
    """Negative control: the same campaign without --family never draws from it."""
    seen: list = []
    monkeypatch.setitem(FAMILIES, "tile-corner", _tagging("tile-corner", seen))
    out = tmp_path / "fuzz.json"
    assert cli.main(["fuzz", "--family", "tile-corner", "--cases", "5", "--cases-dir", str(tmp_path / "c"),
                     "--json", str(out)]) in (0, 1)
    assert len(seen) == 5
    assert json.loads(out.read_text())["checks"][-1]["message"].endswith("family tile-corner")
    seen.clear()
    assert cli.main(["fuzz", "--cases", "5", "--cases-dir", str(tmp_path / "d")]) in (0, 1)
    assert seen == []


@pytest.mark.parametrize("name", ["large-decode-batch", "vllm-full-graph"])
def test_every_scenario_family_is_a_choice(name):
    assert strategies.family(name) is families_strategy([name])
