"""Class 3: the model accepts and rejects exactly what FA3 does, on each side, with FA3's messages.

FA3 (hopper/flash_api.cpp at 0251105a): the precompute, mha_fwd_get_scheduler_metadata, checks only the dtype and
h % h_k (lines 548-550); the call, mha_fwd, checks head dims (780-792), alignment (854-856), appended KV
(931-933) and the split count (1095; run_mha_fwd 371). A rejection is loud and safe: spec says so.
"""

import pytest
import torch

from gpu_impl.kernels import load
from refmodel import call_inputs, get_scheduler_metadata, precompute_inputs, resolve_schedule
from refmodel.errors import FA3Rejected
from spec.invariants import CallLengths, evaluate_inputs

# (what, call_inputs kwargs, field, FA3's message, flash_api.cpp line)
CALL_REJECTS = [
    ("head dim over 256", dict(headdim=288), "headdim",
     "FlashAttention forward only supports head dimension at most 256", "780"),
    ("dv != d outside FA3's two bands", dict(headdim=128, headdim_v=64), "headdim_v",
     "we only support Q/K headdim in (128, 192] and V headdim in (96, 128]", "783-786"),
    ("dv != d: d in (128, 192] but dv over 128", dict(headdim=192, headdim_v=160), "headdim_v",
     "or (Q/K <= 64 and V <= 512)", "783-786"),
    ("fp8 with dv over 256", dict(headdim=64, headdim_v=512, qkv_dtype="float8_e4m3fn"), "headdim_v",
     "HeaddimV > 256 requires fp16 and bf16 data type", "788-791"),
    ("head dim not a multiple of 8", dict(headdim=100), "headdim", "head_size should be a multiple of 8", "855"),
    ("fp8 head dim not a multiple of 16", dict(headdim=72, qkv_dtype="float8_e4m3fn"), "headdim",
     "head_size should be a multiple of 16", "855"),
    ("V head dim not a multiple of 8", dict(headdim=64, headdim_v=100), "headdim_v",
     "head_size_v should be a multiple of 8", "856"),
    ("k_new without cache_seqlens", dict(seqlen_knew=4, has_cache_seqlens=False), "cache_seqlens",
     "If k_new is supplied, seqlens_k must also be passed in", "932"),
    ("k_new with seqlen_q over the cache", dict(seqlen_q=64, seqlen_k=32, seqlen_knew=4), "seqlen_q",
     "If k_new is supplied, it must have seqlen <= the seqlen of the KV cache", "933"),
    ("more than 256 splits", dict(num_splits=257), "num_splits", "num_splits > 256 not supported", "1095"),
]


def _call(**kw):
    base = dict(batch_size=2, seqlen_q=1, seqlen_k=1024, num_heads=8, num_heads_k=1, headdim=128)
    base.update(kw)
    return call_inputs(**base)


@pytest.mark.parametrize("what,kw,field,message,line", CALL_REJECTS, ids=[c[0] for c in CALL_REJECTS])
def test_the_call_rejects_what_mha_fwd_rejects(what, kw, field, message, line):
    with pytest.raises(FA3Rejected) as err:
        resolve_schedule(_call(**kw))
    assert err.value.field == field and message in err.value.fa3_message and line in err.value.source


def test_the_call_accepts_what_mha_fwd_accepts():
    # negative controls: the two bands of dv != d, fp16/bf16 dv 512, fp8 multiples of 16, k_new within the cache
    for kw in (dict(headdim=192, headdim_v=128), dict(headdim=64, headdim_v=512), dict(headdim=64, headdim_v=96),
               dict(headdim=256), dict(headdim=80, qkv_dtype="float8_e4m3fn"), dict(seqlen_q=32, seqlen_knew=4),
               dict(num_splits=256), dict(num_splits=-5)):
        resolve_schedule(_call(**kw))
    # a negative num_splits is "use the heuristic" on both sides (flash_api.cpp:610, 983: num_splits <= 0)
    assert resolve_schedule(_call(num_splits=-5)).num_splits == resolve_schedule(_call(num_splits=0)).num_splits


def test_the_precompute_accepts_what_only_the_call_rejects():
    # flash_api.cpp:548-550: only the dtype and h % h_k; metadata is produced for everything else
    seq = torch.tensor([100, 2000], dtype=torch.int32)
    for kw in (dict(headdim=288), dict(headdim=128, headdim_v=64), dict(headdim=100), dict(num_splits=300)):
        args = dict(headdim=128) | kw
        md = get_scheduler_metadata(2, 1, 2048, 8, 1, args.pop("headdim"), seq, **args)
        assert md.dtype == torch.int32 and md.numel() > 0
    # what the precompute itself rejects, with FA3's messages
    with pytest.raises(FA3Rejected, match="Number of heads in key/value must divide"):
        get_scheduler_metadata(2, 1, 2048, 6, 4, 128, seq)
    with pytest.raises(FA3Rejected, match="FlashAttention only supports fp16, bf16, and fp8_e4m3 data type"):
        get_scheduler_metadata(2, 1, 2048, 8, 1, 128, seq, qkv_dtype=torch.float32)


def test_spec_treats_the_calls_rejection_as_loud_and_safe():
    P = precompute_inputs(2, 1, 2048, 8, 1, 128, varlen_q=True, num_splits=300)
    C = call_inputs(2, 1, 2048, 8, 1, 128, varlen_q=True, num_splits=300)
    ev = evaluate_inputs(P, C, [100, 2000], CallLengths((100, 2000), (1, 1)))
    assert ev.outcome == "rejected" and ev.safe and "num_splits > 256" in ev.message
    # negative control: the same mismatch of splits without a rejection is the silent overflow
    P = precompute_inputs(2, 1, 2048, 8, 1, 128, varlen_q=True, num_splits=200)
    C = call_inputs(2, 1, 2048, 8, 1, 128, varlen_q=True, num_splits=2)
    ev = evaluate_inputs(P, C, [100, 2000], CallLengths((100, 2000), (1, 1)))
    assert ev.outcome == "violation" and not ev.safe


def test_the_emulated_kernel_rejects_like_fa3():
    k = load("emulated")
    q = torch.zeros(1, 1, 8, 100)
    kv = torch.zeros(1, 16, 1, 100)
    with pytest.raises(FA3Rejected, match="multiple of 8"):
        k.flash_attn_with_kvcache(q, kv, kv, cache_seqlens=torch.tensor([3], dtype=torch.int32))
