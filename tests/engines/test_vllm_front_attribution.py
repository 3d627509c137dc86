"""The vLLM driver's FA3 front attributes a CUDA-graph replay's metadata to the recompute vLLM copied into the
persistent buffer (gpu_impl/engines/vllm/front.py ``FrontFA3._attribute``), whichever of the two layouts is longer.

No vLLM needed: the front is driven the way vLLM's builder drives it (``_store_scheduler_metadata``: ``buf[:n] = md``,
the tail zeroed), on the shapes of the V2 runner's mixed FULL graph of 0.28.0 .. 0.30.0 (64 rows captured with
``max_query_len`` 1; gemma-2-9b at tp 4: 4 query and 2 KV heads, head size 256, block 16, 32 splits): the capture's
metadata is 129 int32 (no heads-in-L2 vector), a replay's recompute for a 32-token prefill 193."""

import torch

from gpu_impl.engines.vllm.front import FrontFA3

ROWS = 64


def _precompute(front, query_lens, seq_lens, max_seqlen_q, max_seqlen_k):
    cu = [0]
    for q in query_lens + [0] * (ROWS - len(query_lens)):
        cu.append(cu[-1] + q)
    seqused = torch.tensor(seq_lens + [0] * (ROWS - len(seq_lens)), dtype=torch.int32)
    return front.c_get_scheduler_metadata(
        batch_size=ROWS, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, num_heads=4, num_heads_k=2,
        headdim=256, headdim_v=256, qkv_dtype=torch.bfloat16, seqused_k=seqused,
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32), cu_seqlens_k=None, cu_seqlens_k_new=None, seqused_q=None,
        leftpad_k=None, page_size=16, max_seqlen_k_new=0, is_causal=True, window_size_left=-1, window_size_right=-1,
        attention_chunk=0, has_softcap=False, num_splits=32, pack_gqa=None, sm_margin=0)


def _captured_then_recomputed(path="replay", recompute_query=32):
    """The persistent buffer after the capture's precompute and a replay's recompute; the captured view of it."""
    front = FrontFA3(132)
    buf = torch.zeros(4 * ROWS + 1, dtype=torch.int32)
    captured = _precompute(front, [1] * ROWS, [1] * ROWS, 1, 4096)
    buf[:captured.numel()] = captured
    view = buf[:captured.numel()]
    front.checker.registry.remember(view, front.last_pre)
    capture_pre = front.last_pre
    md = _precompute(front, [recompute_query, 1], [recompute_query, 1], recompute_query, recompute_query)
    buf[:md.numel()] = md
    buf[md.numel():] = 0
    front.path = path
    front._attribute(view)
    return front, view, capture_pre, captured.numel(), md.numel()


def test_a_captured_view_shorter_than_the_replay_recompute_is_attributed_to_the_recompute():
    front, view, capture_pre, n_captured, n_recompute = _captured_then_recomputed()
    assert (n_captured, n_recompute) == (129, 193)
    assert front.checker.origin_of(view) is front.last_pre and front.last_pre is not capture_pre


def test_a_shorter_view_keeps_its_origin_outside_a_replay_or_when_its_bytes_are_not_the_recompute():
    # negative controls: an eager call's shorter tensor is not a captured view; a view whose bytes differ from the
    # recompute's first values was not rewritten by it
    front, view, capture_pre, _, _ = _captured_then_recomputed(path="eager")
    assert front.checker.origin_of(view) is capture_pre
    front, view, capture_pre, _, _ = _captured_then_recomputed()
    front.checker.registry.remember(view, capture_pre)
    view[0] += 1
    front._attribute(view)
    assert front.checker.origin_of(view) is capture_pre


def _group_precompute(front, num_heads_k, seq_lens):
    """One attention group's precompute of a decode batch (4 rows, 32 query heads, ``num_heads_k`` KV heads)."""
    rows = len(seq_lens)
    return front.c_get_scheduler_metadata(
        batch_size=rows, max_seqlen_q=1, max_seqlen_k=max(seq_lens), num_heads=32, num_heads_k=num_heads_k,
        headdim=128, headdim_v=128, qkv_dtype=torch.bfloat16, seqused_k=torch.tensor(seq_lens, dtype=torch.int32),
        cu_seqlens_q=torch.arange(rows + 1, dtype=torch.int32), cu_seqlens_k=None, cu_seqlens_k_new=None,
        seqused_q=None, leftpad_k=None, page_size=16, max_seqlen_k_new=0, is_causal=True, window_size_left=-1,
        window_size_right=-1, attention_chunk=0, has_softcap=False, num_splits=32, pack_gqa=None, sm_margin=0)


def _two_groups(groups: int):
    """Two attention groups' builders (KV heads 1 and 8) each copying its precompute into its own persistent buffer,
    as the V2 runner's replay builds every group: (front, each buffer's view, each precompute's record)."""
    front = FrontFA3(132)
    front.metadata_groups = groups
    views, pres = [], []
    for heads in (1, 8):
        md = _group_precompute(front, heads, [32768, 100, 100, 100])
        buf = torch.zeros(md.numel() + 8, dtype=torch.int32)
        buf[:md.numel()] = md
        views.append(buf[:md.numel()])
        pres.append(front.last_pre)
    return front, views, pres


def test_with_several_attention_groups_each_buffer_is_attributed_to_its_own_group_s_precompute():
    front, (first, second), (pre_1, pre_8) = _two_groups(2)
    front.path = "replay"
    front._attribute(first, (32, 1))
    front._attribute(second, (32, 8))
    assert front.checker.origin_of(first) is pre_1 and front.checker.origin_of(second) is pre_8
    # negative control: with one group (the default) only the latest precompute is a candidate, and the first
    # group's buffer, whose bytes are another precompute's, stays of unknown origin
    front, (first, _), _ = _two_groups(1)
    front._attribute(first, (32, 1))
    assert front.checker.origin_of(first) is None


def test_the_call_s_heads_never_override_the_bytes_a_buffer_holds():
    # a layer of 8 KV heads whose buffer holds the 1-head group's precompute (a builder precomputing with another
    # group's heads) is judged against that precompute: the heads only order candidates whose bytes match
    front, (first, _), (pre_1, _) = _two_groups(2)
    stale = first.clone()
    front._attribute(stale, (32, 8))
    assert front.checker.origin_of(stale) is pre_1
