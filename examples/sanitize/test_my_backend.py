"""A backend's decode step under the fa3-verify sanitizer, on the CPU.

Run from the repository root (the sanitizer ships as a pytest plugin of fa3-verify):

    .venv/bin/python -m pytest --fa3verify-emulate-fa3 --fa3verify-sanitize=raise examples/sanitize/test_my_backend.py

``MyBackend`` precomputes FA3's scheduler metadata once per batch and hands it to the attention call, as sglang's
FA3 backend does. One test precomputes with the layer's own head counts (32, 4) and passes; the other with the
heads divided by a tensor-parallel size of 4, (8, 1) -- the head counts sglang's backend used under context
parallelism before PR #30439. On this batch (one sequence of 4000 tokens, one of 100) no split count overflows,
so without the sanitizer both tests pass; with it the second fails with PRECOMPUTE_ARGUMENTS, naming the
arguments that differ and the shortest batch at which the same arguments overflow.
"""

import torch

import flash_attn_interface as fa3   # FA3's module; on the CPU: pytest --fa3verify-emulate-fa3

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE = 32, 4, 128, 16       # one rank of Qwen3-30B-A3B (tp 4, attention tp 1)


class MyBackend:
    """Precompute the metadata with ``precompute_heads``, then run one decode step with the layer's heads."""

    def __init__(self, precompute_heads):
        self.precompute_heads = precompute_heads

    def decode(self, seq_lens):
        b = len(seq_lens)
        pages = -(-max(seq_lens) // PAGE)
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(b, 1, NUM_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
        k_cache = torch.randn(b * pages, PAGE, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
        v_cache = torch.randn(b * pages, PAGE, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
        page_table = torch.arange(b * pages, dtype=torch.int32).reshape(b, pages)
        cache_seqlens = torch.tensor(seq_lens, dtype=torch.int32)
        heads, kv_heads = self.precompute_heads
        metadata = fa3.get_scheduler_metadata(
            batch_size=b, max_seqlen_q=1, max_seqlen_k=max(seq_lens), num_heads_q=heads, num_heads_kv=kv_heads,
            headdim=HEAD_DIM, cache_seqlens=cache_seqlens, page_size=PAGE, causal=True)
        return fa3.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=cache_seqlens, page_table=page_table, causal=True,
            scheduler_metadata=metadata)


def test_decode_with_the_layers_own_heads():
    out = MyBackend((NUM_HEADS, NUM_KV_HEADS)).decode([4000, 100])
    assert torch.isfinite(out.float()).all()


def test_decode_with_heads_divided_by_tp():
    out = MyBackend((NUM_HEADS // 4, NUM_KV_HEADS // 4)).decode([4000, 100])
    assert torch.isfinite(out.float()).all()
