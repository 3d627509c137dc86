"""Theorem 12: the decode-tile drift and the varlen total-q bound of the sglang kernel wheels' builds.

Each theorem with its negative control: ``sglang-tile-cover`` is proved on a sample of instances and refuted under
the seeded defect ``call-one-wg-rows-128``; ``total-q-drift`` finds its SPLIT_BOUND witness under 0.4.5 (checked
again with refmodel and spec.invariants) and nothing under 0.4.2, upstream, or with ``total-q-read-by-both``.
The full domains run in ``fa3verify prove --only 12``.
"""

from __future__ import annotations

import pytest

from refmodel.fa3_builds import SGLANG_KERNEL_042, SGLANG_KERNEL_045, UPSTREAM
from spec.theorems import THEOREMS, jobs_for
from spec.theorems import wheel_builds as wb
from spec.theorems.base import ProveRequest
from spec.theorems.jobs import run_part

# the d 64 bf16 instances (dense and page 16, each masking) and a d 128 fp8 one: the decode tile's cases
SAMPLE = tuple(i for i in wb.COVER_INSTANCES if i.headdim == 64 and i.headdim_v == 64 and i.element_size == 2
               and i.page_size in (None, 16))[:6] + tuple(
    i for i in wb.COVER_INSTANCES if i.headdim == 128 and i.element_size == 1 and i.causal and i.page_size == 64)
# the point of the witness (h 6 / h_k 1, d 128): the search's first
WITNESS_POINT = ((6, 1, 128),)


def test_the_theorems_are_catalogued_in_family_12():
    for name in wb.THEOREMS:
        assert THEOREMS[name].number == "12" and THEOREMS[name].group == "wheel_builds"
    assert set(wb.DEFECTS) == {"call-one-wg-rows-128", "total-q-read-by-both"}
    names = [n for job in jobs_for(ProveRequest(only=("12",))) for n in job.names]
    assert names == list(wb.THEOREMS)


@pytest.mark.parametrize("build", [SGLANG_KERNEL_042, SGLANG_KERNEL_045])
def test_the_decode_tile_drift_leaves_no_query_row_uncovered(build):
    r = run_part(lambda: wb.tile_cover(build, instances=SAMPLE))
    assert r.verdict == "proved", r.message


def test_a_call_tile_bound_other_than_the_precompute_s_is_refuted():
    # negative control: a 64-row call tile for up to 128 rows against the precompute's m-blocks of 128 or 192
    r = run_part(lambda: wb.tile_cover(SGLANG_KERNEL_045, defects={"call-one-wg-rows-128"}, instances=SAMPLE))
    assert r.verdict == "refuted" and r.failed and r.witness["invariant"] == "QUERY_COVER"
    w = r.witness
    assert w["m_blocks"] * w["block_m_c"] < w["rows"] <= 128 and w["block_m_c"] == 64 < w["block_m_p"]


def test_the_refuted_cover_is_a_query_cover_violation_in_refmodel():
    # the same shape as refmodel and spec.invariants see it: the defect's call tile (64 rows) on 96 packed rows whose
    # metadata counts one 192-row m-block (d 64, bf16, non-causal, dense; precompute max_seqlen_q 48, call 64, qhpk 2)
    import dataclasses

    from refmodel.fa3_scheduler import call_inputs, precompute_inputs, resolve_schedule
    from spec.invariants import CallLengths, check_query_cover, metadata_for

    P, R = metadata_for(precompute_inputs(1, 48, 1024, 2, 1, 64, varlen_q=True, build=SGLANG_KERNEL_045), [1024], [48])
    C = resolve_schedule(call_inputs(1, 64, 1024, 2, 1, 64, varlen_q=True, build=SGLANG_KERNEL_045))
    assert (P.block_m, C.kernel_block_m, R.num_m_blocks[0]) == (192, 192, 1)
    assert check_query_cover(P, R, C, CallLengths((1024,), (48,))) == []
    seeded = dataclasses.replace(C, kernel_block_m=64)   # the defect's tile
    assert [v.invariant for v in check_query_cover(P, R, seeded, CallLengths((1024,), (48,)))] == ["QUERY_COVER"]


def test_the_total_q_bound_gives_a_split_bound_witness_under_0_4_5():
    r = wb.total_q_drift(SGLANG_KERNEL_045, points=WITNESS_POINT)
    assert r.verdict == "expected-refutation" and not r.failed
    w = r.witness
    assert w["invariant"] == "SPLIT_BOUND" and w["S_p"] > w["S_c"] and w["call_rows"] < w["precompute_rows"]
    assert sum(w["query_lens"]) == w["call_rows"] and max(w["query_lens"]) <= w["max_seqlen_q"]
    # the witness again, from its own numbers
    again = wb.total_q_witness(SGLANG_KERNEL_045, w["h"], w["h_k"], w["d"], w["page_size"], w["batch"],
                               w["max_seqlen_q"], w["call_rows"])
    assert again == {k: v for k, v in w.items() if k != "build"}


@pytest.mark.parametrize("build,defects", [(SGLANG_KERNEL_042, ()), (UPSTREAM, ()),
                                           (SGLANG_KERNEL_045, ("total-q-read-by-both",))])
def test_no_total_q_witness_where_both_sides_bound_alike(build, defects):
    # negative controls: builds whose get_num_splits does not read total_q, and 0.4.5 with the precompute given the
    # call's rows, schedule both sides alike on the same points
    r = wb.total_q_drift(build, frozenset(defects), points=WITNESS_POINT)
    assert r.verdict == "proved", r.message


def test_unknown_defects_are_refused():
    with pytest.raises(ValueError, match="defects: unknown names"):
        wb.wheel_build_jobs(defects={"nope"})
