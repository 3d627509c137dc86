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
