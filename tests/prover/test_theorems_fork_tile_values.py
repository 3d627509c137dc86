"""Pins of spec/theorems/fork_tile.py's helpers: the drift query's domain, the length key of an fp8 point, the case
file's expected detail, and the drift theorem's verdict when z3 answers unknown.

The drift query (module doc) bounds the call's seqlen_q by vLLM's per-step budget (8192) and the precompute's by
one more; an fp8 point reads the fp8 tiles (the fork's tile_size.h 66-93: falcon-7b's d 64, h/h_k 71, page 16
decode takes kBlockN 128 in fp8, 160 in bf16).
"""

import itertools
import json

import z3

import spec.theorems.fork_tile as ft
from refmodel.fa3_scheduler import call_inputs, resolve_schedule


def test_the_drift_query_admits_the_budget_and_one_more_on_the_precompute():
    q = ft.DriftQuery(ft.VLLM_FORK, 10.0)
    s = q.solver
    s.push()
    s.add(q.p.domain, q.c.domain, q.c.seqlen_q == ft.bv(ft.VLLM_MAX_QUERY))
    assert s.check() == z3.sat
    s.pop()
    s.push()
    s.add(q.p.domain, q.c.domain, q.c.seqlen_q == ft.bv(ft.VLLM_MAX_QUERY + 1))
    assert s.check() == z3.unsat
    s.pop()


def test_an_fp8_points_length_key_uses_the_fp8_tile():
    point = ft.VllmTilePoint("falcon-7b", 1, 16, 1, 132)
    h, hk = point.heads()
    bn = {dt: resolve_schedule(call_inputs(1, 1, 16, h, hk, 64, qkv_dtype=dt, varlen_q=True, page_size=16,
                                           causal=True, build=ft.VLLM_FORK)).block_n
          for dt in ("float8_e4m3fn", "bfloat16")}
    assert bn == {"float8_e4m3fn": 128, "bfloat16": 160}
    key = ft.scan_length_key(point, 1)
    assert key(1000) == (8, 8) and key(1000) != (7, 7)     # ceil(1000 / 128), not ceil(1000 / 160)


def test_the_drift_case_file_carries_the_witness_detail(tmp_path):
    point = ft.VllmTilePoint("falcon-7b", 1, 16, 1, 132)
    found = {"seq_lens": [900, 17], "query_lens": [3, 1], "invariant": "SPLIT_BOUND", "S_p": 6, "S_c": 5,
             "tiles": {"precompute": [192, 160], "call": [64, 192]}, "message": "batch 0: 6 splits > 5"}
    path = ft.write_drift_case(str(tmp_path), point, found)
    data = json.loads(open(path).read())
    text = json.dumps(data)
    assert '"tiles": {"precompute": [192, 160], "call": [64, 192]}' in text
    assert '"S_p": 6' in text and '"S_c": 5' in text and "float8_e4m3" in text
    assert ft.write_drift_case(None, point, found) is None


def test_an_unknown_z3_answer_makes_the_drift_inconclusive_naming_the_first_three_points(monkeypatch):
    points = ft.vllm_tile_points()[:4]
    monkeypatch.setattr(ft.DriftQuery, "witness", lambda self, point: ("unknown", None, None))
    r = ft._drift(1.0, points=points)
    assert r.verdict == "inconclusive" and r.expected is False
    assert r.message == f"z3 unknown at {[p.label for p in points[:3]]}"


def test_an_instance_label_names_its_head_dims_element_size_mask_and_paging():
    assert ft.TileInstance(128, 128, 2, True, False, None).label == "d=128 dv=128 elem=2 causal dense"
    assert ft.TileInstance(64, 256, 1, False, False, 16).label == "d=64 dv=256 elem=1 non-causal page 16"
    assert ft.TileInstance(192, 128, 2, True, True, 256).label == "d=192 dv=128 elem=2 local page 256"


def test_the_agreement_theorem_names_itself_and_an_unknown_answer_makes_it_inconclusive(monkeypatch):
    insts = ft.TILE_INSTANCES[:4]
    r = ft._agree(10.0, instances=insts[:1])
    assert (r.name, r.verdict) == ("fork-tile-agree", "proved") and r.details == {"instances": 1}
    monkeypatch.setattr(ft, "checked", lambda s: z3.unknown)
    r = ft._agree(10.0, instances=insts)
    assert (r.name, r.verdict, r.expected) == ("fork-tile-agree", "inconclusive", False)
    assert r.message.startswith(f"z3 unknown: ['{insts[0].label}: ") and insts[3].label not in r.message


def test_the_agreement_witness_lies_in_fa3_s_domain_on_both_sides():
    # flash_api.cpp 781: h % h_k == 0; the theorem's domain: 1 <= h_k <= h <= 256, 1 <= seqlen_q
    r = ft._agree(10.0, defects={"one-wg-reads-num-heads"})
    w = r.witness
    assert r.verdict == "refuted" and w["seqlen_q"] >= 1
    for side in ("p", "c"):
        h, hk = w[f"h_{side}"], w[f"h_k_{side}"]
        assert 1 <= hk <= h <= 256 and h % hk == 0, w


AGREE_KEYS = {"instance", "seqlen_q", "h_p", "h_k_p", "h_c", "h_k_c", "block_m_p", "block_n_p", "block_m_c",
              "block_n_c", "invariant"}


def test_the_agreement_theorem_s_three_results_field_by_field(monkeypatch):
    # proved: no witness, the statement with its scope and source
    insts = ft.TILE_INSTANCES[:2]
    r = ft._agree(10.0, instances=insts)
    assert (r.name, r.verdict, r.witness, r.case_file, r.failed, r.expected) == (
        "fork-tile-agree", "proved", {}, None, False, True)
    assert 0 <= r.seconds < 600 and r.details == {"instances": 2}
    assert r.message == (f"under {ft.VLLM_FORK}, on 2 instances (head dims x dtype x causal/local x paging), "
                         f"seqlen_q <= 2^20 and heads <= {ft.MAX_HEADS}: equal seqlen_q and h/h_k give the same "
                         f"tile. Source: {ft.SOURCE}")
    # refuted (the negative control: one MMA warpgroup read from h instead of h / h_k): the first instance whose
    # tiles differ is d 64 dense, where only kBlockM differs (192 against 64; the fork's tile_size.h, one-WG rows)
    r = ft._agree(10.0, defects={"one-wg-reads-num-heads"})
    w = r.witness
    assert (r.name, r.verdict, r.case_file, r.failed, r.expected) == ("fork-tile-agree", "refuted", None, True, False)
    assert 0 <= r.seconds < 600 and set(w) == AGREE_KEYS and w["invariant"] == "TILE_AGREE"
    assert w["instance"] == "d=64 dv=64 elem=2 non-causal dense" and w["block_n_p"] == w["block_n_c"]
    assert r.message == (f"{w['instance']}: sides agreeing on seqlen_q {w['seqlen_q']} and h/h_k choose "
                         f"{w['block_m_p']}x{w['block_n_p']} vs {w['block_m_c']}x{w['block_n_c']} "
                         f"(encoding defects ['one-wg-reads-num-heads'])")
    # inconclusive: no witness, the first three unknown instances with z3's reason
    monkeypatch.setattr(ft, "checked", lambda s: z3.unknown)
    r = ft._agree(10.0, instances=ft.TILE_INSTANCES[:4])
    assert (r.verdict, r.witness, r.case_file, r.failed, r.expected) == ("inconclusive", {}, None, False, False)
    assert 0 <= r.seconds < 600
    reasons = [f"{i.label}: " for i in ft.TILE_INSTANCES[:3]]
    assert r.message.startswith("z3 unknown: [") and all(x in r.message for x in reasons)
    assert ft.TILE_INSTANCES[3].label not in r.message


def test_pick_takes_each_constant_flag_s_branch_without_a_condition():
    # the table's eight rows distinct: a constant flag picks its row, and the term is that row's constant itself
    from spec.theorems.symbolic import bv
    table = {key: (64 + 16 * i, 96 + 16 * i) for i, key in enumerate(sorted(ft._table(ft.TILE_INSTANCES[0],
                                                                                       ft.VLLM_FORK)))}
    T, F = z3.BoolVal(True), z3.BoolVal(False)
    for causal, wg, non_tma in table:
        bm, bn = ft._pick(table, T if causal else F, T if wg else F, T if non_tma else F)
        want = table[(causal, wg, non_tma)]
        assert bm.eq(bv(want[0])) and bn.eq(bv(want[1])), (causal, wg, non_tma)
    # a symbolic flag: one If over it
    x = z3.Bool("x")
    bm, _ = ft._pick(table, x, F, T)
    assert z3.simplify(z3.substitute(bm, (x, T))).eq(bv(table[(True, False, True)][0]))


def test_the_upstream_table_holds_upstream_s_tiles():
    # hopper/tile_size.h@0251105a, sm90, d = dv = 128: bf16 128 x (causal or local or paged non-TMA ? 128 : 176)
    # (lines 32-33), fp8 128 x 224 (line 47) and 128 x 160 paged non-TMA; d 192 / dv 128 bf16 128 x 128 (line 37),
    # 128 x 96 paged non-TMA (the same rows as tests/oracle/test_fa3_scheduler_tables.py's).
    # Rows are (causal, one MMA warpgroup, paged non-TMA); upstream has no one-WG tile, so wg is not read.
    bf16 = ft._table(ft.TileInstance(128, 128, 2, False, False, None), ft.UPSTREAM)
    assert [bf16[(c, False, n)] for c, n in ((False, False), (True, False), (False, True))] == \
        [(128, 176), (128, 128), (128, 128)]
    local = ft._table(ft.TileInstance(128, 128, 2, False, True, None), ft.UPSTREAM)
    assert local[(False, False, False)] == (128, 128)
    fp8 = ft._table(ft.TileInstance(128, 128, 1, False, False, None), ft.UPSTREAM)
    assert (fp8[(False, False, False)], fp8[(False, False, True)]) == ((128, 224), (128, 160))
    wide = ft._table(ft.TileInstance(192, 128, 2, False, False, None), ft.UPSTREAM)
    assert (wide[(False, False, False)], wide[(False, False, True)]) == ((128, 128), (128, 96))
    assert all(bf16[(c, True, n)] == bf16[(c, False, n)] for c in (False, True) for n in (False, True))


def test_tile_table_is_the_instance_s_table_under_the_named_build():
    # the fork's tile_size.h 10-93 at 617264c1, d = dv = 128 bf16: 128 x 160, one MMA warpgroup 64 x 176;
    # upstream's (0251105a lines 32-33) 128 x 176 and no one-WG tile
    inst = ft.TileInstance(128, 128, 2, False, False, None)
    fork = ft.tile_table(inst, ft.VLLM_FORK)
    assert (fork[(False, False, False)], fork[(False, True, False)]) == ((128, 160), (64, 176))
    up = ft.tile_table(inst, ft.UPSTREAM)
    assert (up[(False, False, False)], up[(False, True, False)]) == ((128, 176), (128, 176))
    assert len(fork) == len(up) == 8


def _sym_tile_at(inst, build, seqlen_q, h, hk):
    from spec.theorems.z3ctx import isolated

    def run():
        side = ft.side_vars("g")
        subst = [(side.seqlen_q, z3.BitVecVal(seqlen_q, 32, side.h.ctx)), (side.h, z3.BitVecVal(h, 32, side.h.ctx)),
                 (side.h_k, z3.BitVecVal(hk, 32, side.h.ctx))]
        return tuple(z3.simplify(z3.substitute(t, *subst)).as_long() for t in ft.sym_tile(inst, side, build))
    return isolated(run)


def test_the_z3_tile_keeps_causal_where_a_page_size_tells_it_apart():
    # The theorem's pages (16..256) never tell a kept causal from a dropped one for 64 < d <= 128: paged non-TMA
    # takes kBlockN 128 either way. A page that is a multiple of the non-causal kBlockN (upstream 176, tile_size.h
    # 32-33 at 0251105a; the fork 160, its tile_size.h at 617264c1) does: paged TMA (flash_api.cpp 466: page %
    # kBlockN == 0 and rows > kBlockM) then holds without causal only, so a causal call of more than 128 rows keeps
    # 128 x 128 and a non-causal one gets 128 x bn. A decode (seqlen_q 1) keeps causal when paged with 64 < d <= 128
    # (flash_api.cpp 579-581), so h/h_k 256 at seqlen_q 1 is still 128 x 128; d 112 is rounded up to the 128 tile.
    for build, bn, pages in ((ft.UPSTREAM, 176, (176, 352)), (ft.VLLM_FORK, 160, (160, 320))):
        for d, page in itertools.product((128, 112), pages):
            inst = ft.TileInstance(d, d, 2, True, False, page)
            for sq, h, hk in ((200, 1, 1), (1, 256, 1), (2, 128, 1)):
                want = resolve_schedule(call_inputs(2, sq, 4096, h, hk, d, page_size=page, causal=True, build=build))
                got = _sym_tile_at(inst, build, sq, h, hk)
                assert got == (want.block_m, want.block_n) == (128, 128), (build, d, page, sq, h, hk)
            non_causal = resolve_schedule(call_inputs(2, 200, 4096, 1, 1, d, page_size=page, build=build))
            assert (non_causal.block_m, non_causal.block_n) == (128, bn)
            assert _sym_tile_at(ft.TileInstance(d, d, 2, False, False, page), build, 200, 1, 1) == (128, bn)


def test_vllms_drift_domain_is_each_non_mla_model_at_each_dividing_tp_block_size_and_kv_dtype():
    # the module doc: the models of spec.model.config without MLA (deepseek-v2-lite left out; gemma-2-9b's d 256
    # kept: FA3 compiles d <= 256), tp 1, 2, 4, 8 where it divides the query heads (falcon-7b's 71 heads: tp 1 only),
    # vLLM block sizes 16 and 64, bf16 ('auto') or fp8 KV
    pts = ft.vllm_tile_points()
    assert {p.model for p in pts} == {"falcon-7b", "gemma-2-9b", "llama-2-7b", "llama-3-8b", "llama-3.2-1b",
                                      "qwen3-235b-a22b", "qwen3-30b-a3b", "starcoder"}
    assert sorted({p.tp for p in pts if p.model == "llama-3-8b"}) == [1, 2, 4, 8]
    assert {p.tp for p in pts if p.model == "falcon-7b"} == {1}
    assert {(p.block, p.element_size) for p in pts} == {(16, 2), (16, 1), (64, 2), (64, 1)}
    assert len(pts) == (1 + 7 * 4) * 2 * 2 and all(p.num_sm == 132 for p in pts)


def test_a_vllm_points_heads_and_instance_are_vllms_integer_heads_and_causal_full_attention():
    # vLLM's ModelConfig: num_heads // tp and max(1, num_kv_heads // tp), in ints
    p = ft.VllmTilePoint("llama-3-8b", 2, 16, 2, 132)
    h, hk = p.heads()
    assert (h, hk) == (16, 4) and type(h) is int and type(hk) is int
    h, hk = ft.VllmTilePoint("qwen3-235b-a22b", 8, 64, 1, 132).heads()
    assert (h, hk) == (8, 1) and type(h) is int and type(hk) is int
    assert p.instance() == ft.TileInstance(128, 128, 2, True, False, 16)
    assert p.instance().local is False


def test_the_z3_tile_lets_upstreams_local_paged_calls_take_tma():
    # fp8 d = dv = 192, local, page 160, 200 rows. Upstream's tile_size.h (line 49 at 0251105a) gives 128 x ((paged
    # non-TMA or softcap) and local ? 128 : 160); its paged TMA holds (160 % 160 == 0, 200 > 128: flash_api.cpp 466),
    # so the call keeps 128 x 160. The fork turns TMA off for local attention, which its tiles cannot show (its fp8
    # tiles, tile_size.h 66-77 at 617264c1, read neither paging nor, at d 192, local): 128 x 96 either way.
    inst = ft.TileInstance(192, 192, 1, False, True, 160)
    for build, tile in ((ft.UPSTREAM, (128, 160)), (ft.VLLM_FORK, (128, 96))):
        want = resolve_schedule(call_inputs(2, 200, 4096, 1, 1, 192, qkv_dtype="float8_e4m3fn", page_size=160,
                                            window_size=(100, 0), build=build))
        assert (want.block_m, want.block_n) == tile == _sym_tile_at(inst, build, 200, 1, 1), build


def test_the_agreement_query_refutes_a_kblockn_disagreement_and_gives_the_defect_to_both_sides(monkeypatch):
    # Negative control on kBlockN alone (the seeded defect of the theorem changes kBlockM): an encoding whose kBlockN
    # reads h. Sides agreeing on seqlen_q and h/h_k but not on h then choose the same kBlockM and another kBlockN,
    # which the query must refute; and the seeded defect reaches both sides' encodings, as in the theorem's control.
    real, seen = ft.sym_tile, []

    def block_n_reads_h(inst, side, build=ft.VLLM_FORK, defects=frozenset(), wg_rows=64):
        seen.append(frozenset(defects))
        bm, bn = real(inst, side, build, frozenset(defects) - {"block-n-reads-h"}, wg_rows)
        return bm, (bn + side.h if "block-n-reads-h" in defects else bn)

    monkeypatch.setattr(ft, "sym_tile", block_n_reads_h)
    r = ft._agree(10.0, defects=frozenset({"block-n-reads-h"}), instances=ft.TILE_INSTANCES[:1])
    w = r.witness
    assert r.verdict == "refuted" and w["h_p"] != w["h_c"]
    assert w["block_m_p"] == w["block_m_c"] and w["block_n_p"] != w["block_n_c"]
    assert seen == [frozenset({"block-n-reads-h"})] * 2
    seen.clear()
    assert ft._agree(10.0, instances=ft.TILE_INSTANCES[:1]).verdict == "proved" and seen == [frozenset()] * 2


def test_a_sides_domain_is_fa3s_head_counts_and_query_lengths():
    # side_vars: 1 <= seqlen_q <= the bound, 1 <= h_k <= h <= 256 and h % h_k == 0 (mha_fwd: "Number of heads in
    # key/value must divide number of heads in query"); outside it no witness may be drawn
    from spec.theorems.z3ctx import isolated

    def run():
        side = ft.side_vars("dom")
        ctx = side.h.ctx

        def admits(h, hk, sq=1):
            s = z3.Solver(ctx=ctx)
            s.add(side.domain, side.h == z3.BitVecVal(h, 32, ctx), side.h_k == z3.BitVecVal(hk, 32, ctx),
                  side.seqlen_q == z3.BitVecVal(sq, 32, ctx))
            return s.check() == z3.sat

        # (0, 0) and (0, 4) pass h % h_k == 0 in z3's bit-vector arithmetic (0 % 0 is 0), so only h_k >= 1 and
        # h_k <= h keep them out; (6, 4) only the divisibility
        return [admits(8, 2), admits(256, 1), admits(8, 8, ft.MAX_SEQLEN_Q), admits(0, 0), admits(0, 4),
                admits(6, 4), admits(257, 1), admits(8, 2, 0), admits(8, 2, ft.MAX_SEQLEN_Q + 1)]

    assert isolated(run) == [True, True, True, False, False, False, False, False, False]
