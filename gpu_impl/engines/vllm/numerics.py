"""Numerics on request for the vLLM driver: vLLM's FA3 calls computed by the CPU emulation of FA3, outputs judged.

Invariant: with numerics on, every ``fwd`` vLLM's ``FlashAttentionImpl.forward`` makes (through the fork's real
Python wrapper, ``vllm/vllm_flash_attn/flash_attn_interface.py``) runs on ``gpu_impl.kernels.emulated.EmulatedKernel``
in ``gpu-like`` mode on the scheduler metadata vLLM passed -- FA3's ``mha_fwd`` (``hopper/flash_api.cpp``): its own
schedule and buffers, the metadata trusted, so a faulty hand-off gives NaN or wrong rows as on a GPU -- over a KV
cache of seeded values; the output lands in the ``out`` tensor vLLM passed; and each call's output must be free of
NaN where the float64 oracle has none (NO_NAN) and within FA3's tolerance of it (MATCHES_ORACLE,
``refmodel/tolerance.py``). The oracle is ``refmodel.tolerance.reference_outputs`` on the same q, cache, lengths,
block table, causal flag, window and scale.

Simplified (also in docs/engines-vllm.md): bf16/fp16 KV caches only (an fp8 cache needs the descale path, not in
the emulator), DCP off (its LSE combine across ranks is stood in), at most :data:`MAX_NUMERICS_KV_TOKENS` KV tokens
per step. Runs inside the vLLM engine environment (torch, refmodel, gpu_impl only).
"""

from __future__ import annotations

from gpu_impl.engines.protocol import Unsupported

__all__ = ["MAX_NUMERICS_KV_TOKENS", "EmulatorVarlenFA3", "check_numerics_scenario", "numerics_kv", "judge"]

#: Most KV tokens in one step with numerics (the replay command's bound, fa3verify.commands.replay.MAX_NUMERICS_KV_TOKENS).
MAX_NUMERICS_KV_TOKENS = 1 << 20


def check_numerics_scenario(s: dict) -> None:
    """Refuse (Unsupported, naming the field) what the numerics path does not model."""
    if s["kv_cache_dtype"] != "auto":
        raise Unsupported("kv_cache_dtype: numerics run with an 'auto' (bf16/fp16) KV cache only; the fp8 descale "
                          "path is not in the emulator")
    if s["dcp"] > 1:
        raise Unsupported("dcp: numerics need the DCP LSE combine across ranks, which the driver stands in")
    for i, st in enumerate(s["steps"]):
        if sum(st["seq_lens"]) > MAX_NUMERICS_KV_TOKENS:
            raise Unsupported(f"steps[{i}].seq_lens: at most {MAX_NUMERICS_KV_TOKENS} KV tokens per step with "
                              f"numerics, got {sum(st['seq_lens'])}")


def numerics_kv(hk: int, block: int, head_dim: int, dtype, seq_lens, max_blocks: int, seed: int):
    """(kv_cache ``[num_blocks, hk, block, 2 * head_dim]`` of seeded values, block table ``[b, max_blocks]``):
    every sequence owns its own blocks (block 0 is the null block padded rows and unused entries point to)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    per = [-(-int(k) // block) for k in seq_lens]
    kv = torch.randn(1 + sum(per), hk, block, 2 * head_dim, generator=gen).to(dtype)
    table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    start = 1
    for i, n in enumerate(per):
        table[i, :n] = torch.arange(start, start + n, dtype=torch.int32)
        start += n
    return kv, table


class EmulatorVarlenFA3:
    """FA3 for the checking shim with numerics: refmodel metadata, vLLM's varlen paged call on the emulator."""

    name = "emulator"

    def __init__(self, num_sm: int, arch: int = 90):
        from gpu_impl.kernels.emulated import EmulatedKernel

        self.kernel = EmulatedKernel(mode="gpu-like", num_sm=num_sm, arch=arch)
        #: (out, lse) of the latest call
        self.last = None

    def get_scheduler_metadata(self, *args, **kwargs):
        return self.kernel.get_scheduler_metadata(*args, **kwargs)

    def flash_attn_varlen_func(self, q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, seqused_k=None,
                               block_table=None, causal=False, window_size=(-1, -1), softcap=0.0,
                               scheduler_metadata=None, num_splits=0, softmax_scale=None, **_ignored):
        """``mha_fwd`` for a paged varlen call: FA3's ``flash_attn_with_kvcache`` path with ``cache_seqlens =
        seqused_k`` and ``page_table = block_table`` (the same C++ entry point)."""
        out, lse, *_ = self.kernel.flash_attn_with_kvcache(
            q, k, v, cache_seqlens=seqused_k, page_table=block_table, cu_seqlens_q=cu_seqlens_q,
            max_seqlen_q=max_seqlen_q, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            softcap=softcap or 0.0, scheduler_metadata=scheduler_metadata, num_splits=num_splits,
            return_softmax_lse=True)
        self.last = (out, lse)
        return out


def judge(out, q, k, v, cu_seqlens_q, max_seqlen_q, seqused_k, block_table, causal, window_size, softcap,
          softmax_scale):
    """(invariant, message, detail) when ``out`` has NaN where the oracle has none or misses FA3's tolerance,
    else None."""
    from refmodel.tolerance import reference_outputs

    from gpu_impl.oracle_check import compare_output

    ref, low = reference_outputs(q, k, v, cache_seqlens=seqused_k, cu_seqlens_q=cu_seqlens_q,
                                 max_seqlen_q=max_seqlen_q, page_table=block_table, causal=causal,
                                 window_size=tuple(window_size), softcap=softcap or 0.0, softmax_scale=softmax_scale)
    miss = compare_output(out, ref, low, softcap=softcap or 0.0)
    return None if miss is None else (miss.invariant, miss.message, miss.detail)
