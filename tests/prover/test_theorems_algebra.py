"""Theorem 5 (FA3 combine algebra): verdicts, seeded-defect negative controls with concrete replays, and
agreement of the float evaluation of the spec's combine with refmodel.combine."""

import math
import random

import pytest
import torch

from spec.theorems import algebra as ta
from spec.theorems import memo as theorem_memo
from spec.theorems.results import TheoremResult


@pytest.fixture(scope="module")
def results():
    return {r.name: r for r in ta.run_algebra_theorems(timeout_s=10)}


def test_every_theorem_proved(results):
    assert list(results) == list(ta.THEOREMS)
    for r in results.values():
        assert isinstance(r, TheoremResult)
        assert r.verdict == "proved", f"{r.name}: {r.message} {r.details}"
        assert not r.failed and r.expected and r.witness == {}


def test_exact_merge_covers_one_to_eight_and_sixteen_splits_by_lemma_chain(results):
    per_n = results["combine-exact-merge"].details["per_n"]
    assert sorted(per_n) == [1, 2, 3, 4, 5, 6, 7, 8, 16]
    for n, lemmas in per_n.items():
        assert list(lemmas) == ["kinds", "core", "coefficients", "output"], n
        assert all(v["result"] == "unsat" for v in lemmas.values()), (n, lemmas)


def test_merge_theorems_rest_on_the_two_split_exact_merge(results):
    for name in ("merge-commutative", "merge-associative"):
        assert results[name].details["uses_exact_merge_n2"] is True


# --------------------------------------------------------------------------------------------
# Negative controls: each seeded defect is refuted with a witness that replays concretely.
# --------------------------------------------------------------------------------------------


def test_negative_control_no_neg_inf_guard_refutes_all_empty():
    (r,) = ta.run_algebra_theorems(only=["combine-all-empty"], defects={"no-neg-inf-guard"})
    assert r.verdict == "refuted" and r.failed and not r.expected
    w = r.witness
    assert all(s["lse"] == "-inf" and s["mass"] == 0 for s in w["splits"])
    assert w["combine"]["LSE"] == "nan"  # exp(-inf - -inf) = NaN poisons Z and the LSE
    assert w["replay"]["violates"] and w["replay"]["LSE"] == "nan" and w["replay"]["LSE_ref"] == "-inf"
    # the guarded combine gets the same row right
    lses = [float(s["lse"]) for s in w["splits"]]
    outs = [float(s["out"]) for s in w["splits"]]
    assert ta.combine_float(lses, outs) == (0.0, -math.inf)


def test_negative_control_no_skip_nonpositive_reads_garbage():
    (r,) = ta.run_algebra_theorems(only=["combine-exact-merge"], defects={"no-skip-nonpositive"})
    assert r.verdict == "refuted" and r.failed
    w = r.witness
    garbage = [s for s in w["splits"] if s["mass"] == 0]
    assert garbage and any(s["out"] in ("nan", "inf", "-inf") for s in garbage)
    assert w["replay"]["violates"] and w["replay"]["O"] == "nan"


@pytest.mark.parametrize("defect", ["wrong-normalisation", "lse-missing-max"])
def test_negative_control_wrong_normalisation_is_refuted(defect):
    (r,) = ta.run_algebra_theorems(only=["combine-exact-merge"], defects={defect})
    assert r.verdict == "refuted" and r.failed
    replay = r.witness["replay"]
    assert replay["violates"]
    key = "O" if defect == "wrong-normalisation" else "LSE"
    assert not math.isclose(float(replay[key]), float(replay[key + "_ref"]), rel_tol=1e-6)


def test_negative_control_lse_missing_max_breaks_associativity():
    (r,) = ta.run_algebra_theorems(only=["merge-associative"], defects={"lse-missing-max"})
    assert r.verdict == "refuted"
    assert r.witness["replay"]["violates"]


def test_defect_and_name_validation():
    with pytest.raises(ValueError, match="unknown"):
        ta.run_algebra_theorems(defects={"no-such-defect"})
    # `only` is shared by every theorem group: names matching nothing here select nothing
    assert ta.run_algebra_theorems(only=["no_such_theorem"]) == []
    assert [r.name for r in ta.run_algebra_theorems(only=["merge_"])] == ["merge-commutative", "merge-associative"]
    with pytest.raises(ValueError):
        ta.run_algebra_theorems(split_counts=[0])
    # names owned by the CP module are accepted and ignored here
    assert ta.run_algebra_theorems(only=["zigzag-partition"], defects={"zigzag-off-by-one"}) == []
    (r,) = ta.run_algebra_theorems(only=["combine-all-empty"], defects={"zigzag-off-by-one"}, split_counts=[2])
    assert r.verdict == "proved"


def test_deterministic_witness():
    with theorem_memo.suspended():  # two real runs, not a remembered one
        a = ta.run_algebra_theorems(only=["combine-exact-merge"], defects={"wrong-normalisation"})[0].witness
        b = ta.run_algebra_theorems(only=["combine-exact-merge"], defects={"wrong-normalisation"})[0].witness
    assert a == b


# --------------------------------------------------------------------------------------------
# The spec's combine (float evaluation) against refmodel's and against the exact merge.
# --------------------------------------------------------------------------------------------


def _random_rows(rng: random.Random, count: int, splits: int):
    rows = []
    for _ in range(count):
        lses, outs = [], []
        for _ in range(splits):
            if rng.random() < 0.3:
                lses.append(-math.inf)
                outs.append(rng.choice([math.nan, math.inf, -math.inf, 1e30, rng.uniform(-5, 5)]))  # garbage
            else:
                lses.append(rng.uniform(-20, 20))
                outs.append(rng.uniform(-5, 5))
        rows.append((lses, outs))
    return rows


@pytest.mark.parametrize("guard,skip,defects", [
    (True, True, ()),
    (False, True, ("no-neg-inf-guard",)),
    (True, False, ("no-skip-nonpositive",)),
])
def test_float_combine_agrees_with_refmodel_combine(guard, skip, defects):
    combine = pytest.importorskip("refmodel.combine", reason="refmodel.combine is not importable yet")
    rng = random.Random(0)
    splits = 6
    rows = _random_rows(rng, 400, splits) + [([-math.inf] * splits, [math.nan] * splits)]
    lse = torch.tensor([r[0] for r in rows], dtype=torch.float32).T.reshape(splits, len(rows), 1, 1)
    out = torch.tensor([r[1] for r in rows], dtype=torch.float32).T.reshape(splits, len(rows), 1, 1, 1)
    ref_out, ref_lse = combine.flash_attn_combine(out, lse, guard_neg_inf=guard, skip_nonpositive=skip)
    for i, (lses, outs) in enumerate(rows):
        # evaluate on the float32-rounded inputs refmodel saw
        lses32 = [float(x) for x in lse[:, i, 0, 0]]
        outs32 = [float(x) for x in out[:, i, 0, 0, 0]]
        o, l_ = ta.combine_float(lses32, outs32, defects)
        ro, rl = float(ref_out[i, 0, 0, 0]), float(ref_lse[i, 0, 0])
        for mine, theirs in ((o, ro), (l_, rl)):
            if math.isnan(mine) or math.isnan(theirs):
                assert math.isnan(mine) and math.isnan(theirs), (i, lses32, outs32, mine, theirs)
            else:
                assert math.isclose(mine, theirs, rel_tol=1e-4, abs_tol=1e-4), (i, lses32, outs32, mine, theirs)


def test_float_combine_is_the_exact_merge_on_random_rows():
    rng = random.Random(1)
    for lses, outs in _random_rows(rng, 2000, 8):
        masses = [0.0 if l_ == -math.inf else math.exp(l_) for l_ in lses]
        o, lse = ta.combine_float(lses, outs)
        ro, rl = ta.exact_merge_float(masses, outs)
        assert math.isclose(o, ro, rel_tol=1e-9, abs_tol=1e-12)
        assert (lse == rl == -math.inf) or math.isclose(lse, rl, rel_tol=1e-12, abs_tol=1e-12)


def test_replay_helpers_on_hand_made_rows():
    good = [{"mass": 2.0, "lse": math.log(2.0), "out": 1.0}, {"mass": 0.0, "lse": "-inf", "out": "nan"}]
    assert not ta.replay_row(good)["violates"]
    assert ta.replay_row(good, {"no-skip-nonpositive"})["violates"]
    states = {"a": good[0], "b": {"mass": 1.0, "lse": 0.0, "out": -2.0}, "c": good[1]}
    assert not ta.replay_merges("merge-associative", states)["violates"]
    assert not ta.replay_merges("merge-commutative", states)["violates"]
