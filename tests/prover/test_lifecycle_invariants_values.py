"""Pins of spec.lifecycle_invariants: each check's condition on both sides of its boundary, and what it reports.

The checks judge refmodel.metadata_lifecycle's launch records. Each test takes a real record (one replay and one
eager launch of a one-layer engine) and changes the one field a check reads, so both sides of every condition are
seen. What each invariant models is FA3's (spec/lifecycle_invariants.json names the lines):

- SEMAPHORE_STARTS_AT_ZERO: the tile scheduler's semaphore is zeroed by the prepare kernel
  (hopper/flash_prepare_scheduler.cu@0251105a 77) and fetched with atomicAdd (tile_scheduler.hpp 763-788): a start
  s > 0 on a launch that runs skips tiles; no kernel (or no semaphore) reads none.
- READS_OWN_STEP_METADATA: a launch reads the metadata written for its own step (flash_api.cpp 1004-1025).
- CAPTURE_COVERS_REPLAY: a CUDA graph fixes b, the page-table width and S_c at capture (flash_api.cpp 1095-1110); a
  replay's rows, KV lengths and, for S_c > 1, split counts up to min(S_c, kMax) must fit (the combine reads at most
  kMax splits, flash_fwd_combine_launch_template.h).
- PADDED_ROWS_READ_DEFINED: no launch reads a slot nobody wrote.
- SHARED_PRECOMPUTE_MATCHES_LAYER: a shared precompute's inputs equal the layer's (mha_fwd_get_scheduler_metadata
  and mha_fwd read the same fields, flash_api.cpp 548-620 and 929-1000).
- PRECOMPUTE_CALL_SIZE_AGREE: the precompute's size equals the call's (CHECK_SHAPE, flash_api.cpp 1004-1010): loud
  when FA3 checks it, silent when a captured view has the call's size.
"""

import dataclasses

import pytest

from refmodel.metadata_lifecycle import EngineModel, LayerShape, Origin, Read, Step, Trace, run_sequence
from spec.lifecycle_invariants import (CHECKS, DEFECTS, LIFECYCLE_INVARIANTS, _LIMIT, _cap, _capture_width,
                                       _halve_last_layer_kv_heads, _stale_replays, check_capture_covers_replay,
                                       check_padded_rows_read_defined, check_precompute_call_size_agree,
                                       check_reads_own_step, check_semaphore_starts_at_zero,
                                       check_shared_precompute_matches_layer, check_trace, control_sequence,
                                       run_and_check, seed_defect, violated)
from spec.violation import Violation

ENGINE = EngineModel(layers=(LayerShape(32, 8),), context_len=4096)
_TRACE = run_sequence(ENGINE, [Step("capture", (1,) * 8), Step("replay", (300,) * 8), Step("eager", (100, 200))])
REPLAY, EAGER = _TRACE.launches


def one(record, **changes) -> Trace:
    return Trace(launches=[dataclasses.replace(record, **changes)])


def test_the_base_records_are_clean_and_what_the_pins_assume():
    assert check_trace(_TRACE) == [] and violated(_TRACE) == set()
    assert (REPLAY.step, REPLAY.layer, REPLAY.mode, EAGER.step, EAGER.mode) == (1, 0, "replay", 2, "eager")
    assert REPLAY.captured is not None and REPLAY.captured.num_splits > 1 and EAGER.captured is None
    assert REPLAY.semaphore_start == 0 and REPLAY.kernel_ran and REPLAY.precompute is not None


def test_the_semaphore_check_flags_any_start_but_zero_on_a_launch_that_runs():
    origin = Origin("kernel", 0)
    (v,) = check_semaphore_starts_at_zero(one(REPLAY, semaphore_start=1, semaphore_origin=origin, skipped_tiles=1))
    assert v == Violation.at_step(
        "SEMAPHORE_STARTS_AT_ZERO", 1, None,
        f"layer 0 (replay) starts its tile scheduler from 1: 1 of {REPLAY.tiles} tiles are skipped",
        {"step": 1, "layer": 0, "mode": "replay", "semaphore": 1, "written_by": "kernel", "skipped_tiles": 1,
         "tiles": REPLAY.tiles})
    assert check_semaphore_starts_at_zero(one(REPLAY, semaphore_start=-1, semaphore_origin=origin)) != []
    assert check_semaphore_starts_at_zero(one(REPLAY, semaphore_start=0)) == []
    assert check_semaphore_starts_at_zero(one(REPLAY, semaphore_start=None)) == []          # no semaphore slot
    assert check_semaphore_starts_at_zero(one(REPLAY, semaphore_start=5, kernel_ran=False)) == []   # nothing ran


def test_the_own_step_check_flags_a_read_written_for_another_step_and_reports_the_first():
    reads = list(REPLAY.reads)
    stale = [dataclasses.replace(reads[2], origin=Origin("precompute", 0)),
             dataclasses.replace(reads[5], origin=Origin("zero_fill", None))]
    reads[2], reads[5] = stale
    (v,) = check_reads_own_step(one(REPLAY, reads=tuple(reads)))
    x = stale[0]
    assert v.invariant == "READS_OWN_STEP_METADATA" and v.step == 1
    assert v.message == (f"layer 0 (replay) reads 2 metadata slots not written for step 1 "
                         f"(slot {x.slot}, {x.vector}[{x.vb}] from precompute of step 0)")
    assert v.detail == {"step": 1, "layer": 0, "mode": "replay", "slots": 2,
                        "first": {"slot": x.slot, "vector": x.vector, "vb": x.vb, "written_at": 0, "by": "precompute"}}
    assert check_reads_own_step(one(REPLAY)) == []


def _replay_with(rows=None, seqused_k=None, capture_splits=None, reads=None):
    r = REPLAY
    cap = r.captured
    if capture_splits is not None:
        cap = dataclasses.replace(cap, call=dataclasses.replace(cap.call, num_splits=capture_splits))
    if seqused_k is None:
        seqused_k = r.seqused_k
    return one(r, captured=cap, seqused_k=tuple(seqused_k), reads=r.reads if reads is None else tuple(reads))


def test_the_capture_check_compares_rows_kv_width_and_splits_with_the_graph():
    cap = REPLAY.captured
    b, width = cap.call.inputs.batch_size, cap.call.inputs.seqlen_k
    assert check_capture_covers_replay(_replay_with(seqused_k=(width,) * b)) == []          # exactly the graph
    (v,) = check_capture_covers_replay(_replay_with(seqused_k=(1,) * (b + 1)))
    assert v.message == f"layer 0's graph captured at step {cap.step} does not cover this replay: rows {b + 1} > {b}"
    assert v.detail == {"step": 1, "layer": 0, "mode": "replay", "rows": [b + 1, b]}
    (v,) = check_capture_covers_replay(_replay_with(seqused_k=(width + 1,) + (1,) * (b - 1)))
    assert v.detail["kv_width"] == [width + 1, width] and "kv_width 4097 > 4096" in v.message
    (v,) = check_capture_covers_replay(_replay_with(seqused_k=(width + 1,) * (b + 1)))
    assert v.message.endswith(f"rows {b + 1} > {b}, kv_width {width + 1} > {width}")


def _split_reads(values):
    base = [x for x in REPLAY.reads if x.vector == "num_splits"][0]
    return list(REPLAY.reads) + [dataclasses.replace(base, value=v) for v in values]


def test_a_replays_split_counts_are_bounded_by_the_captured_count_and_the_combine_capacity():
    cap = REPLAY.captured
    s, kmax = cap.num_splits, cap.combine_capacity
    assert s < kmax          # S_c = 14 splits, kMax 32: the bound is S_c
    assert check_capture_covers_replay(_replay_with(reads=_split_reads([s]))) == []
    (v,) = check_capture_covers_replay(_replay_with(reads=_split_reads([s + 1, s + 3])))
    assert v.detail["splits"] == [s + 3, s] and v.message.endswith(f"splits {s + 3} > {s}")
    # S_c 200: kMax 256 (the combine's next template size), so the bound is S_c again
    assert _replay_with(capture_splits=200).launches[0].captured.combine_capacity == 256
    assert check_capture_covers_replay(_replay_with(capture_splits=200, reads=_split_reads([200]))) == []
    (v,) = check_capture_covers_replay(_replay_with(capture_splits=200, reads=_split_reads([201])))
    assert v.detail["splits"] == [201, 200]
    # only the num_splits vector is compared; a one-split graph reads no split counts
    other = [dataclasses.replace(x, value=10 ** 6) for x in REPLAY.reads if x.vector != "num_splits"]
    assert check_capture_covers_replay(_replay_with(reads=other)) == []
    assert check_capture_covers_replay(_replay_with(capture_splits=1, reads=_split_reads([5]))) == []
    assert check_capture_covers_replay(_replay_with(capture_splits=2, reads=_split_reads([3])))[0].detail["splits"] == [3, 2]


def test_the_capture_check_reads_replays_with_a_graph_only():
    wide = (10 ** 6,) * 9
    assert check_capture_covers_replay(one(REPLAY, seqused_k=wide, mode="eager")) == []
    assert check_capture_covers_replay(one(REPLAY, seqused_k=wide, captured=None)) == []
    assert check_capture_covers_replay(one(EAGER, seqused_k=wide)) == []


def test_the_padded_rows_check_flags_unwritten_slots_with_their_virtual_batches():
    reads = list(REPLAY.reads)
    marked = [i for i, x in enumerate(reads) if x.vb in (6, 7)][:3]
    for i in marked:
        reads[i] = dataclasses.replace(reads[i], origin=Origin("unwritten", 1))
    (v,) = check_padded_rows_read_defined(one(REPLAY, reads=tuple(reads), real_batch=6))
    rows = sorted({reads[i].vb for i in marked})
    assert v.message == (f"layer 0 (replay) reads 3 uninitialised metadata slots for virtual batches {rows} "
                         f"(real rows: 6 of {REPLAY.call.inputs.batch_size})")
    assert v.detail == {"step": 1, "layer": 0, "mode": "replay", "virtual_batches": rows, "real_batch": 6,
                        "vectors": sorted({reads[i].vector for i in marked})}
    # a zero-filled slot is defined (someone chose 0): not flagged
    zeroed = [dataclasses.replace(x, origin=Origin("zero_fill", None)) for x in REPLAY.reads]
    assert check_padded_rows_read_defined(one(REPLAY, reads=tuple(zeroed))) == []


def test_the_shared_precompute_check_names_every_differing_input():
    pre = REPLAY.precompute
    other = dataclasses.replace(pre, schedule=dataclasses.replace(
        pre.schedule, inputs=dataclasses.replace(pre.schedule.inputs, num_heads_k=4, headdim=64)))
    (v,) = check_shared_precompute_matches_layer(one(REPLAY, precompute=other))
    assert v.message == ("layer 0 uses a precompute made for other shapes: num_heads_k 4 (precompute) != 8 (layer), "
                         "headdim 64 (precompute) != 128 (layer)")
    assert v.detail == {"step": 1, "layer": 0, "mode": "replay", "fields": {"num_heads_k": [4, 8], "headdim": [64, 128]}}
    # lengths and batch are not the precompute's identity
    lengths = dataclasses.replace(pre, schedule=dataclasses.replace(
        pre.schedule, inputs=dataclasses.replace(pre.schedule.inputs, seqlen_k=7, batch_size=3)))
    assert check_shared_precompute_matches_layer(one(REPLAY, precompute=lengths)) == []
    assert check_shared_precompute_matches_layer(one(REPLAY, precompute=None)) == []


def test_the_size_check_says_whether_fa3_sees_the_mismatch():
    pre = REPLAY.precompute
    smaller = dataclasses.replace(pre, tensor=dataclasses.replace(pre.tensor, values=pre.tensor.values[:-4],
                                                                   origins=pre.tensor.origins[:-4]))
    size, call = smaller.size, REPLAY.call.metadata_size
    assert size == call - 4
    (v,) = check_precompute_call_size_agree(one(REPLAY, precompute=smaller))
    assert v.message == (f"layer 0 (replay) expects {call} metadata slots; its precompute made {size} "
                         "(silent: the captured view has the call's size)")
    assert v.detail == {"step": 1, "layer": 0, "mode": "replay", "precompute_size": size, "call_size": call,
                        "loud": False}
    (v,) = check_precompute_call_size_agree(one(REPLAY, precompute=smaller, shape_error=True))
    assert v.message.endswith("(FA3 raises at capture (CHECK_SHAPE))") and v.detail["loud"] is True
    (v,) = check_precompute_call_size_agree(one(EAGER, precompute=smaller, shape_error=True))
    assert v.message.startswith("layer 0 (eager)") and v.message.endswith("(FA3 raises (CHECK_SHAPE))")
    assert check_precompute_call_size_agree(one(REPLAY)) == []
    assert check_precompute_call_size_agree(one(REPLAY, precompute=None)) == []


def test_at_most_eight_violations_per_invariant_then_a_count():
    found = [Violation.at_step("X", i, None, f"m{i}") for i in range(_LIMIT + 3)]
    assert _LIMIT == 8
    assert _cap("X", found[:_LIMIT]) == found[:_LIMIT]
    capped = _cap("X", found)
    assert capped[:_LIMIT] == found[:_LIMIT] and len(capped) == _LIMIT + 1
    assert capped[-1] == Violation.at_step("X", None, None, "3 more launches violate X", {"more": 3})
    many = Trace(launches=[dataclasses.replace(REPLAY, semaphore_start=1, semaphore_origin=Origin("kernel", 0),
                                               layer=i) for i in range(_LIMIT + 1)])
    assert [v.detail.get("more") for v in check_semaphore_starts_at_zero(many)][-1] == 1


def test_check_trace_runs_every_check_in_order_or_only_the_named():
    bad = Trace(launches=[dataclasses.replace(REPLAY, semaphore_start=1, semaphore_origin=Origin("kernel", 0),
                                              seqused_k=(1,) * 9)])
    assert [v.invariant for v in check_trace(bad)] == ["SEMAPHORE_STARTS_AT_ZERO", "CAPTURE_COVERS_REPLAY"]
    assert [v.invariant for v in check_trace(bad, only=["CAPTURE_COVERS_REPLAY"])] == ["CAPTURE_COVERS_REPLAY"]
    assert violated(bad) == {"SEMAPHORE_STARTS_AT_ZERO", "CAPTURE_COVERS_REPLAY"}
    assert list(CHECKS) == list(LIFECYCLE_INVARIANTS)


def test_the_seeded_defects_change_what_they_name():
    steps = [Step("capture", (1,) * 2), Step("replay", (5, 6)), Step("replay", (7, 8)), Step("eager", (9,)),
             Step("capture", (1,) * 3), Step("replay", (1, 2, 3))]
    assert [s.refresh for s in _stale_replays(steps)] == [True, True, False, True, True, True]
    assert [s.cache_seqlens for s in _stale_replays(steps)] == [s.cache_seqlens for s in steps]
    paged = dataclasses.replace(ENGINE, page_size=16)   # the width is whole pages: 300 -> 304, 1 -> 16
    assert _capture_width(paged, [Step("capture", (1, 300)), Step("capture", (90,)), Step("eager", (4000,))]) == 304
    assert _capture_width(paged, [Step("eager", (4000,))]) == 16
    three = dataclasses.replace(ENGINE, layers=(LayerShape(32, 8), LayerShape(32, 8), LayerShape(32, 1)),
                                precompute_layer=2)
    halved = _halve_last_layer_kv_heads(three)
    assert [l.num_heads_k for l in halved.layers] == [8, 8, 1] and halved.precompute_layer == 0   # at least 1 head
    assert [l.num_heads_k for l in _halve_last_layer_kv_heads(ENGINE).layers] == [4]
    e, s, f = seed_defect("no-semaphore-reset-after-reuse", ENGINE, steps)
    assert (e, s, f.reset_after_reuse) == (ENGINE, steps, False)
    e, s, f = seed_defect("fork-precompute-heuristic-splits", ENGINE, steps)
    assert (e.build, e.call_num_splits, e.precompute_num_splits) == ("vllm-fork-617264c1", 32, 0)
    assert seed_defect("precompute-over-real-rows", ENGINE, steps)[0].precompute_padded_batch is False
    assert seed_defect("capture-width-of-capture-batch", ENGINE, steps)[0].capture_width == ENGINE.page_width(1)
    with pytest.raises(ValueError, match=r"^defect: one of \['capture-width-of-capture-batch', .*got 'nope'$"):
        seed_defect("nope", ENGINE, steps)
    assert set(DEFECTS) == {i.defect for i in LIFECYCLE_INVARIANTS.values()}


LAYERS = (LayerShape(32, 8),) * 3   # 32 query heads over 8 KV heads (a Llama-3-8B rank), three layers


def test_each_control_sequence_is_the_documented_one():
    # one split on both sides (deterministic inference): the semaphore is FA3's only reset path then
    engine, steps = control_sequence("no-semaphore-reset-after-reuse")
    assert engine == EngineModel(layers=LAYERS, context_len=8192, precompute_num_splits=1, call_num_splits=1)
    assert steps == [Step("eager", (700, 300, 1200, 90) * 6)]
    # vLLM under full CUDA graphs: 32 splits on both sides, on the fork
    engine, steps = control_sequence("fork-precompute-heuristic-splits")
    assert engine == EngineModel(layers=LAYERS, context_len=32768, precompute_num_splits=32, call_num_splits=32,
                                 build="vllm-fork-617264c1")
    assert steps == [Step("capture", (32768,) * 8), Step("replay", (300,) * 8)]
    plain = EngineModel(layers=LAYERS, context_len=32768)
    assert control_sequence("shared-precompute-heterogeneous-heads") == (plain, [Step("eager", (32768,) + (100,) * 7)])
    assert control_sequence("precompute-over-real-rows") == (
        plain, [Step("capture", (1,) * 8), Step("replay", (4000,) * 6 + (1, 1), real_batch=6)])
    replays = [Step("capture", (1,) * 8), Step("replay", (32768,) + (100,) * 7), Step("replay", (500,) * 8)]
    assert control_sequence("replay-skips-metadata-refresh") == (plain, replays)
    assert control_sequence("capture-width-of-capture-batch") == (plain, replays)


def test_run_and_check_seeds_only_when_a_defect_is_named():
    engine, steps = control_sequence("precompute-over-real-rows")
    trace, found = run_and_check(engine, steps)
    assert found == [] and len(trace.launches) == 3
    trace, found = run_and_check(engine, steps, defect="precompute-over-real-rows")
    assert {v.invariant for v in found} == {"PADDED_ROWS_READ_DEFINED"}
    assert found == check_trace(trace)


def test_run_and_check_keeps_the_callers_fa3_behaviour_under_a_seeded_defect():
    # the caller's FA3 (no reset after reuse: before 1a58058a) reaches the run; the padded-batch defect does not
    # touch an eager-only sequence, so the semaphore violation comes from the caller's FA3 alone
    from refmodel.metadata_lifecycle import FA3Behaviour

    engine, steps = control_sequence("no-semaphore-reset-after-reuse")
    _, found = run_and_check(engine, steps, FA3Behaviour(reset_after_reuse=False), defect="precompute-over-real-rows")
    assert {v.invariant for v in found} == {"SEMAPHORE_STARTS_AT_ZERO"}
    assert run_and_check(engine, steps, defect="precompute-over-real-rows")[1] == []


def _many(record, n=_LIMIT + 1, **changes) -> Trace:
    return Trace(launches=[dataclasses.replace(record, layer=i, **changes) for i in range(n)])


def test_every_check_caps_its_own_violations_under_its_own_name():
    pre = REPLAY.precompute
    smaller = dataclasses.replace(pre, tensor=dataclasses.replace(pre.tensor, values=pre.tensor.values[:-4],
                                                                   origins=pre.tensor.origins[:-4]))
    other = dataclasses.replace(pre, schedule=dataclasses.replace(
        pre.schedule, inputs=dataclasses.replace(pre.schedule.inputs, num_heads_k=4)))
    unwritten = tuple(dataclasses.replace(x, origin=Origin("unwritten", 1)) for x in REPLAY.reads)
    stale = tuple(dataclasses.replace(x, origin=Origin("precompute", 0)) for x in REPLAY.reads)
    traces = {
        "SEMAPHORE_STARTS_AT_ZERO": _many(REPLAY, semaphore_start=1, semaphore_origin=Origin("kernel", 0)),
        "READS_OWN_STEP_METADATA": _many(REPLAY, reads=stale),
        "CAPTURE_COVERS_REPLAY": _many(REPLAY, seqused_k=(1,) * 9),
        "PADDED_ROWS_READ_DEFINED": _many(REPLAY, reads=unwritten),
        "SHARED_PRECOMPUTE_MATCHES_LAYER": _many(REPLAY, precompute=other),
        "PRECOMPUTE_CALL_SIZE_AGREE": _many(REPLAY, precompute=smaller),
    }
    for name, trace in traces.items():
        found = CHECKS[name](trace)
        assert len(found) == _LIMIT + 1 and {v.invariant for v in found} == {name}, name
        assert found[-1] == Violation.at_step(name, None, None, f"1 more launches violate {name}", {"more": 1})


def test_a_launch_a_check_skips_does_not_end_the_check():
    # the launches a check passes over (not a replay, no precompute) come first; the violating one after them
    pre = REPLAY.precompute
    smaller = dataclasses.replace(pre, tensor=dataclasses.replace(pre.tensor, values=pre.tensor.values[:-4],
                                                                   origins=pre.tensor.origins[:-4]))
    other = dataclasses.replace(pre, schedule=dataclasses.replace(
        pre.schedule, inputs=dataclasses.replace(pre.schedule.inputs, num_heads_k=4)))
    skipped = dataclasses.replace(EAGER, precompute=None)
    for check, bad in ((check_capture_covers_replay, dataclasses.replace(REPLAY, seqused_k=(1,) * 9)),
                       (check_precompute_call_size_agree, dataclasses.replace(REPLAY, precompute=smaller)),
                       (check_shared_precompute_matches_layer, dataclasses.replace(REPLAY, precompute=other))):
        assert len(check(Trace(launches=[skipped, bad]))) == 1, check.__name__


def test_the_defect_helpers_keep_int_head_counts_and_a_one_key_width():
    odd = dataclasses.replace(ENGINE, layers=(LayerShape(6, 3),))
    (layer,) = _halve_last_layer_kv_heads(odd).layers
    assert layer.num_heads_k == 1 and type(layer.num_heads_k) is int   # 3 // 2 (C++ int heads)
    assert _capture_width(ENGINE, [Step("eager", (4000,))]) == 1       # no capture: one key, page size 1
