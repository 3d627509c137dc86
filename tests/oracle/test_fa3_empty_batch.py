"""Class 2: a precompute of zero batches ends the process in FA3; can a backend reach it?

FA3 (hopper/ at 0251105a): flash_prepare_scheduler.cu:222-232 launches ceil_div(b, 992) CTAs, so b == 0 is a
zero-block grid ("invalid configuration argument"); flash_api.cpp:659 runs CHECK_CUDA_KERNEL_LAUNCH(), and
cuda_check.h:12-21 turns the error into exit(1). That is loud, but not safe for a server: the whole process and
every request on it goes. The call itself never launches anything for an empty batch (flash_api.cpp:1167).
"""

import pytest
import torch

from gpu_impl.backend import DecodeCall, FlashAttentionBackend
from gpu_impl.config import MODELS, ServerConfig
from gpu_impl.errors import ProcessAbort
from gpu_impl.guards import load_guard
from gpu_impl.kernels import load
from refmodel import call_inputs, get_scheduler_metadata, precompute_inputs, resolve_schedule
from spec.invariants import CallLengths, evaluate_inputs


def test_precompute_of_zero_batches_ends_the_process():
    with pytest.raises(ProcessAbort, match="grid of 0 blocks") as err:
        get_scheduler_metadata(0, 1, 1024, 8, 1, 128, torch.zeros(0, dtype=torch.int32))
    assert err.value.field == "batch_size" and "cuda_check.h" in err.value.source
    assert "not safe for a server" in str(err.value)
    # the emulated kernel adapter is refmodel: the same
    with pytest.raises(ProcessAbort):
        load("emulated").get_scheduler_metadata(0, 1, 1024, 8, 1, 128, torch.zeros(0, dtype=torch.int32))
    # negative control: one batch is an ordinary precompute
    assert get_scheduler_metadata(1, 1, 1024, 8, 1, 128, torch.tensor([5], dtype=torch.int32)).numel() > 0


def test_zero_kv_heads_divide_by_zero_on_the_host():
    # flash_api.cpp:550 (precompute) and 781 (call): num_heads % num_heads_k with int operands: SIGFPE
    with pytest.raises(ProcessAbort, match="SIGFPE"):
        resolve_schedule(precompute_inputs(1, 1, 100, 8, 0, 128))
    with pytest.raises(ProcessAbort, match="SIGFPE"):
        resolve_schedule(call_inputs(1, 1, 100, 8, 0, 128))


def test_an_empty_call_is_fine_and_spec_calls_the_abort_unsafe():
    # the call with b == 0 has total_q == 0: mha_fwd launches nothing (flash_api.cpp:1167)
    assert resolve_schedule(call_inputs(0, 1, 1024, 8, 1, 128)).metadata_size == 1
    P0 = precompute_inputs(0, 1, 1024, 8, 1, 128, varlen_q=True)
    C0 = call_inputs(0, 1, 1024, 8, 1, 128, varlen_q=True)
    ev = evaluate_inputs(P0, C0, [], CallLengths((), ()))
    assert ev.outcome == "process_abort" and not ev.safe
    # negative control: one batch passes
    P1 = precompute_inputs(1, 1, 1024, 8, 1, 128, varlen_q=True)
    C1 = call_inputs(1, 1, 1024, 8, 1, 128, varlen_q=True)
    ev1 = evaluate_inputs(P1, C1, [1000], CallLengths((1000,), (1,)))
    assert ev1.outcome == "pass" and ev1.safe


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_the_model_backend_never_precomputes_an_empty_batch(cuda_graph):
    # sglang 0.5.11 model_runner.py:3077 runs init_forward_metadata for an IDLE batch only when batch_size > 0,
    # and CUDA graphs replay a captured size >= 1 (padded rows of length 1); gpu_impl.backend does the same
    server = ServerConfig(tp_size=2, dp_size=2, enable_dp_attention=True, cuda_graph=cuda_graph)
    backend = FlashAttentionBackend(server, MODELS["llama-3-8b"], load_guard("none"))
    calls = backend.decode_calls([[4096, 100], []])   # DP rank 1 is idle
    assert all(len(c.seq_lens) >= 1 for c in calls)
    assert len(calls) == (2 if cuda_graph else 1)
    for c in calls:
        backend.check_decode(c)  # no ProcessAbort
    # negative control: a backend that precomputed for the idle rank would end the process
    idle = DecodeCall(dp_rank=1, path="eager", seq_lens=[], real_rows=0, precompute_heads=backend.precompute_heads(),
                      call_heads=server.layer_heads(MODELS["llama-3-8b"]), call_seqlen_k=1, num_splits=0,
                      precomputed=True)
    with pytest.raises(ProcessAbort):
        backend.precompute(idle)
