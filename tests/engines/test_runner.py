"""Tests of gpu_impl.runner: CP-v2 metadata lifetime in the eager runner, fixed vs pre-fix."""

import itertools

import pytest

from gpu_impl.config import ServerConfig
from gpu_impl.runner import (
    Batch,
    EagerRunner,
    ForwardMode,
    backend_takes_cp_path,
    batch_is_cp_v2_active,
    build_cp_metadata,
    cp_path_matches_activity,
    prepare_cp_forward,
)

CFG = ServerConfig(tp_size=2, attn_cp_size=2, enable_prefill_cp=True, cp_strategy="zigzag")


def cp_v2_extend():
    return Batch(ForwardMode.EXTEND, seq_lens=(12, 9), extend_lens=(8, 5))  # both >= 2cp = 4


def non_cp_extend():
    return Batch(ForwardMode.EXTEND, seq_lens=(6,), extend_lens=(3,))  # 3 < 4: CP-v2 inactive


def mixed():
    # A new 8-token prefill mixed with two running requests decoding one token each.
    return Batch(ForwardMode.MIXED, seq_lens=(8, 20, 31), extend_lens=(8, 1, 1))


def decode():
    return Batch(ForwardMode.DECODE, seq_lens=(13, 10))


KINDS = {"cp_v2_extend": cp_v2_extend, "non_cp_extend": non_cp_extend, "mixed": mixed,
         "decode": decode}


def sequences(max_len=3):
    for n in range(1, max_len + 1):
        yield from itertools.product(KINDS, repeat=n)


def run(kinds, **runner_kwargs):
    runner = EagerRunner(CFG, **runner_kwargs)
    return runner.run([KINDS[k]() for k in kinds])


def test_forward_modes_counting_as_cp_extend():
    # forward_batch_info.py: EXTEND and MIXED; DRAFT_EXTEND_V2 only on request.
    assert {m for m in ForwardMode if m.is_context_parallel_extend()} == {
        ForwardMode.EXTEND, ForwardMode.MIXED}
    assert ForwardMode.DRAFT_EXTEND_V2.is_context_parallel_extend(include_draft_extend_v2=True)


def test_batch_kinds_have_the_intended_activity():
    assert batch_is_cp_v2_active(cp_v2_extend(), CFG)
    assert not batch_is_cp_v2_active(non_cp_extend(), CFG)
    assert not batch_is_cp_v2_active(mixed(), CFG)
    assert not batch_is_cp_v2_active(decode(), CFG)
    # A MIXED batch whose rows are all long enough is CP-v2 only under the pre-fix gate.
    long_mixed = Batch(ForwardMode.MIXED, seq_lens=(8, 9), extend_lens=(8, 4))
    assert not batch_is_cp_v2_active(long_mixed, CFG)
    assert batch_is_cp_v2_active(long_mixed, CFG, allow_mixed=True)
    # Without prefill CP no strategy is bound, so nothing is CP-v2.
    assert not batch_is_cp_v2_active(cp_v2_extend(), ServerConfig(tp_size=2))


def test_mixed_after_cp_v2_extend_takes_cp_path_only_before_the_fix():
    pre = run(["cp_v2_extend", "mixed"], clear_stale_cp_metadata=False)
    fixed = run(["cp_v2_extend", "mixed"], clear_stale_cp_metadata=True)
    assert pre[0].took_cp_path and fixed[0].took_cp_path
    assert pre[1].took_cp_path and pre[1].metadata_was_stale and not pre[1].cp_v2_active
    assert pre[1].metadata_built_for == pre[0].batch_id
    assert not fixed[1].took_cp_path and not fixed[1].metadata_was_stale
    assert fixed[1].metadata_built_for is None


def test_fixed_runner_takes_cp_path_iff_cp_v2_active_exhaustively():
    count = 0
    for kinds in sequences(3):
        traces = run(kinds, clear_stale_cp_metadata=True)
        assert cp_path_matches_activity(traces), (kinds, traces)
        for t in traces:  # an inactive step never carries metadata under the fix
            assert t.cp_v2_active or t.metadata_built_for is None
        count += 1
    assert count == 4 + 16 + 64


def test_negative_control_pre_fix_runner_violates_the_property():
    violations = [k for k in sequences(3)
                  if not cp_path_matches_activity(run(k, clear_stale_cp_metadata=False))]
    assert violations, "the pre-fix runner should break the property"
    assert ("cp_v2_extend", "mixed") in violations
    assert ("cp_v2_extend", "non_cp_extend") in violations
    # Decode clears the field (ScheduleBatch.prepare_for_decode), so a decode in between saves it.
    assert ("cp_v2_extend", "decode", "mixed") not in violations
    # Every violating sequence has a CP-v2 extend before a non-decode inactive extend-like step.
    for kinds in violations:
        assert "cp_v2_extend" in kinds


def test_without_a_reused_batch_object_nothing_is_ever_stale():
    for kinds in sequences(3):
        for clear in (False, True):
            traces = run(kinds, clear_stale_cp_metadata=clear, reuse_forward_batch=False)
            assert cp_path_matches_activity(traces)
            assert not any(t.metadata_was_stale for t in traces)


def test_consecutive_cp_v2_extends_each_build_fresh_metadata():
    # A batch CP-v2 runs starts from a fresh forward batch, so two active steps never share metadata.
    traces = run(["cp_v2_extend", "cp_v2_extend"], clear_stale_cp_metadata=True)
    assert traces[0].built_metadata and not traces[0].metadata_was_stale
    assert traces[1].cp_v2_active and traces[1].took_cp_path
    assert traces[1].built_metadata and not traces[1].metadata_was_stale
    # The fixed runner never takes the CP path with metadata built for another batch.
    for kinds in sequences(3):
        traces = run(kinds, clear_stale_cp_metadata=True)
        assert not any(t.took_cp_path and t.metadata_was_stale for t in traces)


def test_pre_fix_mixed_gate_builds_metadata_for_long_mixed_batches():
    runner = EagerRunner(CFG, mixed_counts_as_cp_v2=True, reuse_forward_batch=False)
    trace = runner.step(Batch(ForwardMode.MIXED, seq_lens=(8, 9), extend_lens=(8, 4)))
    assert trace.cp_v2_active and trace.took_cp_path and trace.built_metadata


def test_prepare_cp_forward_builds_once_and_keeps_stale_objects():
    a, b = cp_v2_extend(), cp_v2_extend()
    assert prepare_cp_forward(a, CFG)
    md = a.attn_cp_metadata
    assert md.built_for == a.batch_id and md.cp_size == 2
    assert md.layout.kv_len_next[0] == (12, 9)  # rank 0's next half ends each sequence
    assert not prepare_cp_forward(a, CFG) and a.attn_cp_metadata is md
    b.attn_cp_metadata = md
    assert not prepare_cp_forward(b, CFG) and b.attn_cp_metadata.built_for == a.batch_id
    with pytest.raises(AssertionError):
        prepare_cp_forward(non_cp_extend(), CFG)


def test_backend_cp_path_needs_mode_metadata_and_cp_size():
    md = build_cp_metadata(cp_v2_extend(), CFG)
    for mode, expect in [(ForwardMode.EXTEND, True), (ForwardMode.MIXED, True),
                         (ForwardMode.DECODE, False), (ForwardMode.IDLE, False),
                         (ForwardMode.TARGET_VERIFY, False)]:
        batch = Batch(mode, seq_lens=(12, 9), extend_lens=(8, 5), attn_cp_metadata=md)
        assert backend_takes_cp_path(batch, CFG) is expect
    batch = cp_v2_extend()
    batch.attn_cp_metadata = md
    assert not backend_takes_cp_path(batch, ServerConfig(tp_size=2))  # attn_cp_size == 1
    batch.attn_cp_metadata = None
    assert not backend_takes_cp_path(batch, CFG)


def test_batch_validation():
    with pytest.raises(ValueError, match="extend_lens is required"):
        Batch(ForwardMode.EXTEND, seq_lens=(4,))
    with pytest.raises(ValueError, match="1 <= extend <= seq"):
        Batch(ForwardMode.EXTEND, seq_lens=(4,), extend_lens=(5,))
    with pytest.raises(ValueError, match="entries"):
        Batch(ForwardMode.MIXED, seq_lens=(4, 5), extend_lens=(1,))
    d = Batch(ForwardMode.DECODE, seq_lens=(4, 5), extend_lens=(1, 1))
    assert d.extend_lens is None and d.prefix_lens is None and d.token_count == 2
    assert cp_v2_extend().prefix_lens == (4, 4)
    with pytest.raises(ValueError, match="cannot build CP metadata"):
        build_cp_metadata(d, CFG)
