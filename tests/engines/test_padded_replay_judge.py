"""A FULL-graph replay over fewer rows than captured, judged by what the captured call reads past the recompute's write.

vLLM 0.9.1 .. 0.16.0 replay the graph of N rows over b < N real rows: the builder copies the recompute's 1 + b int32
into the persistent buffer and zeroes the tail, and the captured kernel reads 1 + N. Under the FA3 builds those
releases ship (metadata layout "semaphore-splits") slot 1 + row is that row's split count, and a count of 0 makes the
row empty (refmodel.fa3_builds ``empty_row_split_count``). Driven here as vLLM's builder drives the front
(gpu_impl/engines/vllm/front.py; no vLLM needed): qwen3-30b-a3b's shapes (32 query and 4 KV heads, head size 128,
block 16), a graph captured for 8 one-token rows, replayed over 6 decodes. Negative controls: a stale split count
in the tail fails, and a layout other than semaphore-splits keeps the replay's SHAPE.
"""

import pytest
import torch

from gpu_impl.engines.vllm.front import BUILD_VARIABLE, FrontFA3
from gpu_impl.fa3_checks import padded_replay_read
from refmodel import fa3_builds
from refmodel.metadata_layout import UNWRITTEN, read_past_write

ROWS = 8                    # the captured graph's rows
REAL = [4000, 100, 20, 30, 40, 50]
SEMAPHORE_SPLITS = "vllm-fork-a8937124"     # vLLM 0.11.1 .. 0.16.0


def _tensors(seq_lens, rows=ROWS):
    """The persistent query starts and KV lengths the runner fills: padded rows get no tokens and no keys."""
    real = len(seq_lens)
    cu = list(range(real + 1)) + [real] * (rows - real)
    return (torch.tensor(cu, dtype=torch.int32),
            torch.tensor(list(seq_lens) + [0] * (rows - real), dtype=torch.int32))


def _precompute(front, seq_lens, max_seqlen_k=8192):
    b = len(seq_lens)
    cu, seqused = _tensors(seq_lens, b)
    return front.c_get_scheduler_metadata(
        batch_size=b, max_seqlen_q=1, max_seqlen_k=max_seqlen_k, num_heads=32, num_heads_k=4, headdim=128,
        headdim_v=128, qkv_dtype=torch.bfloat16, seqused_k=seqused, cu_seqlens_q=cu, cu_seqlens_k=None,
        cu_seqlens_k_new=None, seqused_q=None, leftpad_k=None, page_size=16, max_seqlen_k_new=0, is_causal=True,
        window_size_left=-1, window_size_right=-1, attention_chunk=0, has_softcap=False, num_splits=32,
        pack_gqa=None, sm_margin=0)


def _captured_call(md, cu, seqused):
    """The captured FA3 call's arguments (what a replay re-issues), over the persistent tensors."""
    none = dict.fromkeys(("k_new", "v_new", "q_v", "cu_seqlens_k", "cu_seqlens_k_new", "seqused_q", "kv_batch_idx",
                          "leftpad_k", "rotary_cos", "s_aux", "cp_tot_seqused_k", "out"))
    return dict(none, q=torch.zeros(ROWS, 32, 128, dtype=torch.bfloat16),
                k=torch.zeros(4, 16, 4, 128, dtype=torch.bfloat16), v=torch.zeros(4, 16, 4, 128, dtype=torch.bfloat16),
                max_seqlen_q=1, cu_seqlens_q=cu, max_seqlen_k=8192, seqused_k=seqused,
                page_table=torch.zeros(ROWS, 512, dtype=torch.int32), is_causal=True, window_size_left=-1,
                window_size_right=-1, softcap=0.0, scheduler_metadata=md, num_splits=32, softmax_scale=None)


def _replay(monkeypatch, build, real=REAL, tail=None):
    """Capture the graph of 8 rows, then replay it over ``real``: the recompute copied into the buffer, the tail
    zeroed (or set to ``tail``); returns the front and the replay's (precompute, call, violations) events."""
    monkeypatch.setenv(BUILD_VARIABLE, build)
    front = FrontFA3(132)
    captured = _precompute(front, [1] * ROWS)
    buf = torch.zeros(captured.numel(), dtype=torch.int32)
    buf.copy_(captured)
    front.checker.registry.remember(buf, front.last_pre)
    front.drain()
    front.where = (1, 0)
    md = _precompute(front, real)
    buf[:md.numel()] = md
    buf[md.numel():] = 0
    if tail is not None:
        buf[md.numel():] = tail
    cu, seqused = _tensors(real)
    front.replay([_captured_call(buf, cu, seqused)])
    return front, front.drain(), md.numel()


def _invariants(events):
    return sorted({v.invariant for _, _, vs in events for v in vs})


def test_the_empty_row_rule_is_the_semaphore_splits_builds_and_cites_their_lines():
    for name, build in fa3_builds.builds().items():
        if build.metadata_layout == "semaphore-splits":
            assert fa3_builds.empty_row_split_count(name) == 0
            assert "tile_scheduler.hpp" in build.empty_row_source and "combine" in build.empty_row_source
        else:
            assert fa3_builds.empty_row_split_count(name) is None


def _read(pre):
    """The 1 + 8 int32 a replay reads after this recompute: its values, then vLLM's zeroed tail."""
    from refmodel.metadata import get_scheduler_metadata

    md = get_scheduler_metadata(**pre.scheduler_kwargs())
    return [int(x) for x in md.tolist()] + [0] * (1 + ROWS - md.numel())


def test_a_semaphore_splits_replay_whose_tail_is_zero_passes(monkeypatch):
    front, events, written = _replay(monkeypatch, SEMAPHORE_SPLITS)
    assert written == 1 + len(REAL) and front.build == SEMAPHORE_SPLITS
    (pre, call, violations), = events
    assert (pre.batch_size, call.batch_size) == (len(REAL), ROWS)
    assert violations == []
    # the rule judged the read: two padded rows past the write, each with the empty row's split count
    assert padded_replay_read(pre, call, _read(pre)) == []


@pytest.mark.parametrize("stale", [3, UNWRITTEN])
def test_a_semaphore_splits_replay_with_a_nonzero_tail_fails(monkeypatch, stale):
    # negative control through the front: the tail holds a value no copy of this step wrote, so the view is not the
    # recompute plus a zeroed tail; the front keeps the capture's precompute as its origin, made at another step
    _, events, _ = _replay(monkeypatch, SEMAPHORE_SPLITS, tail=stale)
    assert "READS_OWN_STEP_METADATA" in _invariants(events)
    # and the rule itself, on the recompute's record: the padded row's stale split count (or no one's value)
    (pre, call, _), = _replay(monkeypatch, SEMAPHORE_SPLITS)[1]
    values = _read(pre)
    values[-1] = stale
    found = padded_replay_read(pre, call, values)
    if stale == UNWRITTEN:
        assert [v.invariant for v in found] == ["PADDED_ROWS_READ_DEFINED"]
        assert found[0].detail["virtual_batches"] == [ROWS - 1]
    else:
        assert [v.invariant for v in found] == ["READS_OWN_STEP_METADATA"]
        assert found[0].detail["padded_rows"] == [ROWS - 1] and found[0].detail["split_counts"] == [stale]


def test_the_rule_judges_on_the_checker_at_a_replay_only(monkeypatch):
    # the pair check on the checker: at a replay the rule replaces SHAPE by the tail's verdict; outside one, a
    # tensor of the call's size over a shorter precompute stays SHAPE
    (pre, call, _), = _replay(monkeypatch, SEMAPHORE_SPLITS)[1]
    checker = FrontFA3(132).checker
    values = torch.tensor(_read(pre), dtype=torch.int32)
    checker.registry.remember(values, pre)
    assert [v.invariant for v in checker.check(call, values, deep=True)[1]] == ["SHAPE"]
    checker.replaying = True
    assert checker.check(call, values, deep=True)[1] == []
    values[-1] = 5
    assert [v.invariant for v in checker.check(call, values, deep=True)[1]] == ["READS_OWN_STEP_METADATA"]


@pytest.mark.parametrize("build", ["vllm-fork-617264c1", "vllm-fork-1c81743f"])
def test_another_layout_with_the_same_short_write_keeps_shape(monkeypatch, build):
    # negative control: under the fork's layout the slots past a 4-row recompute hold other vectors (query rows,
    # heads-in-L2, the semaphore), which no split count makes empty
    from gpu_impl.fa3_records import call_schedule_of

    _, events, written = _replay(monkeypatch, build, real=REAL[:4])
    (pre, call, violations), = events
    assert written < call_schedule_of(call).metadata_size
    assert "SHAPE" in [v.invariant for v in violations]
    assert padded_replay_read(pre, call, [0] * call_schedule_of(call).metadata_size) is None


def test_read_past_write_needs_padded_rows_and_a_split_call(monkeypatch):
    import dataclasses

    from gpu_impl.fa3_records import call_schedule_of

    _, events, written = _replay(monkeypatch, SEMAPHORE_SPLITS)
    _, call, _ = events[0]
    sched = call_schedule_of(call)
    values = [0] * sched.metadata_size
    assert read_past_write(sched, written, values, call.seqlens_q) == [(6, 0, True), (7, 0, True)]
    assert read_past_write(sched, written, values[:-1] + [2], call.seqlens_q)[-1] == (7, 2, False)
    # a slot past the write that is a real row's split count (the row has query tokens): not padding
    assert read_past_write(sched, written - 1, values, call.seqlens_q) is None
    # nothing past the write; a call that does not split reads no split count there
    assert read_past_write(sched, sched.metadata_size, values, call.seqlens_q) is None
    assert read_past_write(dataclasses.replace(sched, num_splits=1), written, values, call.seqlens_q) is None
