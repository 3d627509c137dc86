"""Theorem 9 (spec/theorems/fork_tile.py): the vLLM fork's tile choice across the metadata hand-off.

The agreement theorem is proved; its negative control (an encoding whose one-MMA-WG predicate reads h instead of
h / h_k) is refuted. The drift companion is an expected refutation under the fork with a replayable vLLM case, and
proved under upstream's build (the hazard class is the fork's own). The z3 encoding agrees with refmodel's
``resolve_schedule`` on a grid.
"""

import itertools

import pytest
import z3

from refmodel.errors import FA3Rejected
from refmodel.fa3_builds import UPSTREAM, VLLM_FORK
from refmodel.fa3_scheduler import call_inputs, precompute_inputs, resolve_masking, resolve_schedule
from spec.theorems import fork_tile as ft
from spec.model.cases import Case
from spec.theorems.z3ctx import isolated


def _one(**kw):
    (r,) = ft.run_fork_tile_theorems(**kw)
    return r


def test_agreeing_sides_choose_the_same_tile_under_the_fork():
    r = _one(only=["fork-tile-agree"])
    assert r.verdict == "proved" and not r.failed and r.details["instances"] == len(ft.TILE_INSTANCES)


def test_negative_control_an_encoding_reading_h_is_refuted():
    r = _one(only=["fork-tile-agree"], defects={"one-wg-reads-num-heads"})
    assert r.verdict == "refuted" and r.failed
    w = r.witness
    assert w["h_p"] // w["h_k_p"] == w["h_c"] // w["h_k_c"] and w["h_p"] != w["h_c"]
    assert (w["block_m_p"], w["block_n_p"]) != (w["block_m_c"], w["block_n_c"])
    with pytest.raises(ValueError, match="defects: unknown"):
        ft.fork_tile_jobs(defects={"no-such"})


def test_the_off_by_one_precompute_drifts_under_the_fork_with_a_replayable_case(tmp_path):
    r = _one(only=["fork-tile-drift"], cases_dir=str(tmp_path))
    assert r.verdict == "expected-refutation" and r.expected and not r.failed
    w = r.witness
    assert w["invariant"] == "SPLIT_BOUND" and w["S_p"] > w["S_c"]
    assert w["precompute_max_seqlen_q"] == w["call_seqlen_q"] + 1
    assert w["tiles"]["precompute"] != w["tiles"]["call"]
    case = Case.load(r.case_file)
    assert case.engine == {"name": "vllm", "release": "0.33.0"} and case.defects == [ft.OFF_BY_ONE_DEFECT]
    assert case.batches[0]["extend_lens"][0] == w["call_seqlen_q"]
    assert case.expected["invariant"] == "SPLIT_BOUND"


def test_control_upstream_has_no_off_by_one_drift_on_vllms_domain():
    r = isolated(lambda: ft._drift(10.0, None, build=UPSTREAM))
    assert r.verdict == "proved" and r.details["points"] == len(ft.vllm_tile_points())


def _witness_q(point):
    verdict, q, _ = isolated(lambda: ft._drift_witness(point, VLLM_FORK, 10.0))
    assert verdict == "sat"
    return q


def _point(label):
    return next(p for p in ft.vllm_tile_points() if p.label == label)


#: the drift's first replayable point, and two points before it whose scans find no overflow up to 32768 keys
_SCAN_POINTS = ("llama-3.2-1b tp=1 block_size=16 kv=auto num_sm=132",
                "falcon-7b tp=1 block_size=16 kv=auto num_sm=132",
                "llama-2-7b tp=1 block_size=16 kv=fp8 num_sm=132")


@pytest.mark.parametrize("label", _SCAN_POINTS)
def test_the_length_scan_that_skips_seen_block_counts_finds_the_full_scans_first_overflow(label):
    point = _point(label)
    q = _witness_q(point)
    full = ft.split_bound_case(point, q, length_key=lambda L: L)  # every length, as the scan was written
    assert ft.split_bound_case(point, q) == full
    if label == _SCAN_POINTS[0]:
        assert full is not None and full["invariant"] == "SPLIT_BOUND"
    else:
        assert full is None


def test_negative_control_a_scan_key_coarser_than_the_block_counts_misses_the_first_overflow():
    point = _point(_SCAN_POINTS[0])
    q = _witness_q(point)
    full = ft.split_bound_case(point, q, length_key=lambda L: L)
    exact = ft.scan_length_key(point, q)
    coarse = ft.split_bound_case(point, q, length_key=lambda L: exact(L)[0] // 4)  # skips 3 of 4 breakpoints
    assert full is not None and coarse != full


def _inputs_for(inst, seqlen_q, h, hk, side):
    """ScheduleInputs whose resolved masking is the instance's (a local window is (W, 0) with W < seqlen_k - 1)."""
    seqlen_k = 4096
    window = (100, 0) if inst.local else (-1, -1)
    dtype = "float8_e4m3fn" if inst.element_size == 1 else "bfloat16"
    kw = dict(headdim_v=inst.headdim_v, qkv_dtype=dtype, page_size=inst.page_size, causal=inst.causal or inst.local,
              window_size=window, build=VLLM_FORK)
    if side == "p":
        return precompute_inputs(2, seqlen_q, seqlen_k, h, hk, inst.headdim, varlen_q=True, **kw)
    return call_inputs(2, seqlen_q, seqlen_k, h, hk, inst.headdim, varlen_q=True, **kw)


def test_the_z3_tile_agrees_with_refmodels_schedule_on_a_grid():
    def run():
        compared = 0
        side = ft.side_vars("g")
        for inst in ft.TILE_INSTANCES:
            terms = ft.sym_tile(inst, side, VLLM_FORK)
            for sq, (h, hk) in itertools.product((1, 2, 7, 8, 9, 16, 17, 64, 65, 300),
                                                 ((8, 1), (32, 8), (64, 1), (48, 1), (4, 4), (71, 1))):
                got = None  # the z3 tile at (sq, h, hk): the same terms for both sides, evaluated once
                for which in ("p", "c"):
                    inp = _inputs_for(inst, sq, h, hk, which)
                    m = resolve_masking(inp.seqlen_q, inp.seqlen_k, inp.causal, inp.window_size, 0, inp.headdim,
                                        inp.paged)
                    assert m.is_local == inst.local
                    try:
                        sched = resolve_schedule(inp)
                    except FA3Rejected:
                        continue
                    if got is None:
                        subst = [(side.seqlen_q, z3.BitVecVal(sq, 32, side.h.ctx)),
                                 (side.h, z3.BitVecVal(h, 32, side.h.ctx)), (side.h_k, z3.BitVecVal(hk, 32, side.h.ctx))]
                        got = tuple(z3.simplify(z3.substitute(t, *subst)).as_long() for t in terms)
                    assert got == (sched.block_m, sched.block_n), (inst.label, sq, h, hk, which)
                    compared += 1
        return compared

    assert isolated(run) > 10000


def test_the_catalogue_lists_both_theorems():
    from spec.theorems import THEOREMS

    assert set(ft.THEOREMS) <= set(THEOREMS) and all(THEOREMS[t].number == "9" for t in ft.THEOREMS)


def _witnesses_both_ways(build, query_cls=ft.DriftQuery):
    def run():
        query = query_cls(build, 10.0)
        return [(query.witness(p), ft._drift_witness(p, build, 10.0)) for p in ft.vllm_tile_points()]

    return isolated(run)


@pytest.mark.parametrize("build", [VLLM_FORK, UPSTREAM])
def test_the_shared_incremental_drift_query_answers_every_point_as_its_own_solver_does(build):
    pairs = _witnesses_both_ways(build)
    assert all(shared == own for shared, own in pairs)
    assert any(own[0] == "sat" for _, own in pairs) == (build == VLLM_FORK)
    assert all(own[0] in ("sat", "unsat") for _, own in pairs)


def test_negative_control_a_shared_query_that_keeps_a_points_heads_disagrees():
    class Leaky(ft.DriftQuery):
        """Seeded defect: a point's heads stay asserted for the next point (no pop)."""

        def witness(self, point):
            self.solver.pop = lambda: None
            return super().witness(point)

    pairs = _witnesses_both_ways(VLLM_FORK, Leaky)
    assert any(shared != own for shared, own in pairs)
