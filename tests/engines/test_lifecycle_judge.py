"""gpu_impl.engines.lifecycle_judge on the sglang driver's FA3 front (EngineFA3, no sglang needed): each lifecycle
check of an engine launch holds on a clean two-layer step and fails on its seeded defect; bad defect names and layer
counts are clear errors naming the field."""

import pytest
import torch

from gpu_impl.engines.lifecycle_judge import ENGINE_DEFECTS, LifecycleJudge, check_engine_defect
from gpu_impl.engines.sglang.driver import EngineFA3


def step(front, lens, layers=2, h=32, hk=4, md=None, where=(0, 0), width=None, heads=None):
    """One decode step the way sglang's backend makes it: a precompute (unless ``md`` is given), then ``layers``
    launches over it; ``heads``: per-layer query heads (default ``h`` for each)."""
    front.where = where
    b = len(lens)
    cs = torch.tensor(lens, dtype=torch.int32)
    cu = torch.arange(b + 1, dtype=torch.int32)
    width = width or max(lens)
    if md is None:
        md = front.get_scheduler_metadata(batch_size=b, max_seqlen_q=1, max_seqlen_k=max(lens), num_heads=h,
                                          num_heads_k=hk, headdim=128, cache_seqlens=cs, qkv_dtype=torch.bfloat16,
                                          cu_seqlens_q=cu, page_size=1, causal=True, has_softcap=False, num_splits=0)
    for lh in heads or [h] * layers:
        front.flash_attn_with_kvcache(q=torch.zeros(b, 1, lh, 128, dtype=torch.bfloat16),
                                      k_cache=torch.zeros(8, 1, hk, 128, dtype=torch.bfloat16),
                                      v_cache=torch.zeros(8, 1, hk, 128, dtype=torch.bfloat16),
                                      page_table=torch.zeros(b, width, dtype=torch.int32), cache_seqlens=cs,
                                      cu_seqlens_q=cu, max_seqlen_q=1, causal=True, scheduler_metadata=md)
    return md


def found(front) -> list:
    return [v.invariant for _, _, vs in front.checker.events for v in vs]


def test_a_clean_two_layer_step_violates_nothing_and_leaves_the_semaphore_at_zero():
    front = EngineFA3(132, False)
    md = step(front, [300, 200])
    assert found(front) == [] and int(md[-1]) == 0 and front.judge.launches == 2


def test_fa3_without_the_reset_after_reuse_is_caught_at_the_second_layer():
    front = EngineFA3(132, False, lifecycle_defect="no-semaphore-reset-after-reuse")
    md = step(front, [300, 200])
    assert found(front) == ["SEMAPHORE_STARTS_AT_ZERO"]      # layer 1 starts where layer 0 left the count
    assert int(md[-1]) > 0
    event = front.checker.events[1][2][0]
    assert event.detail["semaphore"] > 0 and "skips up to" in event.message


def test_metadata_of_an_earlier_step_is_caught_at_every_layer():
    front = EngineFA3(132, False)
    md = step(front, [300, 200])
    step(front, [300, 200], md=md, where=(1, 0))
    assert found(front) == ["READS_OWN_STEP_METADATA"] * 2
    assert "precomputed at step 0" in front.checker.events[-1][2][0].message


def test_a_layer_of_other_heads_sharing_the_precompute_is_caught():
    front = EngineFA3(132, False)
    step(front, [300, 200], heads=[32, 16])
    assert found(front) == ["SHARED_PRECOMPUTE_MATCHES_LAYER"]
    assert front.checker.events[1][2][0].detail["fields"] == {"num_heads": [32, 16]}


def test_a_replay_past_the_captured_width_is_caught_and_a_covered_one_is_not():
    judge = LifecycleJudge()
    front = EngineFA3(132, False)
    md = step(front, [300, 200], layers=1, width=4096)
    pre, call, _ = front.checker.events[-1]
    assert judge.before(pre, call, md, (0, 0), "replay") == []
    md = step(front, [300, 200], layers=1, width=256, where=(1, 0))
    pre, call, _ = front.checker.events[-1]
    v = judge.before(pre, call, md, (1, 0), "replay")
    assert [x.invariant for x in v] == ["CAPTURE_COVERS_REPLAY"] and v[0].detail["kv_width"] == [300, 256]


def test_unwritten_slots_read_by_padded_rows_are_caught():
    front = EngineFA3(132, False)
    md = step(front, [300, 200, 100], layers=0)          # a precompute over 3 rows: slot 3 of each vector unwritten
    step(front, [300, 200, 100, 1], layers=1, md=md)     # a launch over 4 (one padded row), same size
    assert "PADDED_ROWS_READ_DEFINED" in found(front)


def test_bad_defect_names_are_clear_errors_naming_the_field():
    assert check_engine_defect(None) is None
    for name in ENGINE_DEFECTS:
        assert check_engine_defect(name) == name
    with pytest.raises(ValueError, match="lifecycle_defect: null or one of capture-width-of-capture-batch"):
        check_engine_defect("nope")


def test_the_vllm_scenario_checks_the_lifecycle_defect_and_its_layers():
    from gpu_impl.engines.vllm.driver import check_scenario

    assert check_scenario({"lifecycle_defect": "precompute-over-real-rows"})["lifecycle_defect"]
    with pytest.raises(ValueError, match="lifecycle_defect: null or one of"):
        check_scenario({"lifecycle_defect": "nope"})
    with pytest.raises(ValueError, match="num_layers: at least 2"):
        check_scenario({"lifecycle_defect": "shared-precompute-heterogeneous-heads", "num_layers": 1})


def test_the_sanitizer_overhead_measures_the_lifecycle_checks_quick_and_deep():
    from fa3verify.sanitize.overhead import _decode, _lifecycle_costs
    from fa3verify.sanitize.targets import make_wrapper
    from gpu_impl.fa3_calls import CheckingFA3
    from gpu_impl.kernels.emulated import EmulatedKernel

    lens = [1024] + [16] * 7
    q, k, v, pt, cs, cu = _decode(lens)
    for name in ("quick", "deep"):
        checker = CheckingFA3(None, mode="record", deep=name == "deep", max_events=100, report_causes=True)
        md = make_wrapper(EmulatedKernel().get_scheduler_metadata, "precompute", checker)(
            batch_size=8, max_seqlen_q=1, max_seqlen_k=max(lens), num_heads_q=32, num_heads_kv=4, headdim=128,
            cache_seqlens=cs, cu_seqlens_q=cu, page_size=16, causal=True)
        kw = dict(q=q, k_cache=k, v_cache=v, page_table=pt, cache_seqlens=cs, cu_seqlens_q=cu, max_seqlen_q=1,
                  causal=True, scheduler_metadata=md, num_splits=0)
        out = _lifecycle_costs(checker, make_wrapper(lambda *a, **kw: None, "call", checker), kw, name, 10)
        assert set(out) == {f"wrapped_empty_{name}_lifecycle_us", f"engine_lifecycle_judge_{name}_us"}
        assert all(x > 0 for x in out.values())


def test_conformance_compares_the_pair_verdicts_and_leaves_the_lifecycle_findings_out():
    from types import SimpleNamespace as NS

    from fa3verify.commands.conform import verdict_diff

    def run(outcome, *names):
        return NS(outcome=outcome, findings=[NS(invariant=n) for n in names])

    assert verdict_diff(run("pass"), run("violation", "READS_OWN_STEP_METADATA")) is None
    assert verdict_diff(run("violation", "SPLIT_BOUND"),
                        run("violation", "SPLIT_BOUND", "SHARED_PRECOMPUTE_MATCHES_LAYER")) is None
    assert verdict_diff(run("pass"), run("violation", "SPLIT_BOUND", "SHARED_PRECOMPUTE_MATCHES_LAYER")) == \
        "verdict: model pass [] vs engine violation ['SPLIT_BOUND']"
    assert verdict_diff(run("violation", "SPLIT_BOUND"), run("pass")) is not None
