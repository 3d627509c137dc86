"""The exact check (gpu_impl.kernels.plan_checks) on the older fork builds' metadata: the semaphore and b split counts.

spec's invariants are evaluated on a stub precompute whose tensor must have the call's size; for the "semaphore-splits"
layout that is 1 + b int32, not 1 + b4. A stub of b4 batches failed spec's SHAPE check, so every violation on these
builds (vLLM 0.8.5 .. 0.16.0) was hidden from the exact check. Control: the same pair with metadata whose split
count fits the call passes.
"""

import pytest
import torch

from gpu_impl.kernels.base import build_tile_plan, check_plan
from gpu_impl.kernels.call_model import CallShape
from refmodel import call_inputs, precompute_inputs, resolve_schedule
from refmodel.fa3_builds import VLLM_FORK_8798F277, VLLM_FORK_A8937124
from refmodel.metadata_layout import encode_metadata_values
from refmodel.prepare import prepare_scheduler


def _pair(build, seqlen_k):
    # one decode row, 16 query heads on 1 KV head, d 128: the precompute passes no window, the call a 4096 window
    pre = resolve_schedule(precompute_inputs(1, 1, seqlen_k, 16, 1, 128, causal=True, page_size=16, varlen_q=True,
                                             build=build))
    call = resolve_schedule(call_inputs(1, 1, seqlen_k, 16, 1, 128, varlen_q=True, causal=True, window_size=(4095, 0),
                                        page_size=16, total_q=1, build=build))
    values = encode_metadata_values(pre, prepare_scheduler(pre, [seqlen_k]))
    pages = -(-seqlen_k // 16)
    shape = CallShape(batch_size=1, seqlen_q=1, seqlen_k=pages * 16, total_q=1, num_heads=16, num_heads_k=1,
                      headdim=128, headdim_v=128, dtype=torch.bfloat16, page_size=16, varlen_q=True, seqlens_q=(1,),
                      cache_seqlens=(seqlen_k,), cache_leftpad=None, cache_slots=16)
    return pre, call, values, shape


@pytest.mark.parametrize("build", [VLLM_FORK_8798F277, VLLM_FORK_A8937124])
def test_a_split_count_above_the_calls_buffers_is_found_on_the_semaphore_splits_layout(build):
    pre, call, values, shape = _pair(build, 40000)
    assert len(values) == 2 and values[1] > call.num_splits > 1       # 105 splits written, the call holds 29
    plan = build_tile_plan(shape, call, torch.tensor(values, dtype=torch.int32))
    found = {v.invariant for v in check_plan(plan)}
    assert "SPLIT_BOUND" in found, found


@pytest.mark.parametrize("build", [VLLM_FORK_8798F277, VLLM_FORK_A8937124])
def test_control_a_split_count_within_the_calls_buffers_passes(build):
    pre, call, values, shape = _pair(build, 40000)
    values = [values[0], call.num_splits]
    plan = build_tile_plan(shape, call, torch.tensor(values, dtype=torch.int32))
    assert [v.invariant for v in check_plan(plan)] == []
