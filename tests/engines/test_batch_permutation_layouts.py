"""BATCH_PERMUTATION reads per-batch slots, so it applies only where the metadata has per-batch vectors.

Under the FA3 builds of vLLM 0.8.5 .. 0.16.0 (metadata layout "semaphore-splits") a call or precompute given
``num_splits=1`` (vLLM's batch-invariant mode: both sides pass 1) has no split vector: its metadata is the semaphore
alone (flash_api.cpp@a8937124 994, 1008-1028), and a call over more rows than the precompute reads no slot the
precompute left unwritten. Driven through the vLLM front (no vLLM needed): a precompute over 6 rows, a call over 8.
Negative controls: the same pair under a build whose layout has per-batch vectors (the fork's 617264c1, whose
vectors are rounded to 4 rows, so the sizes agree) is still a BATCH_PERMUTATION; and under semaphore-splits with the
split vector (num_splits 0) the sizes differ and the pair is a SHAPE.
"""

import torch

from gpu_impl.engines.vllm.front import BUILD_VARIABLE, FrontFA3

ROWS = 8
REAL = [4000, 100, 20, 30, 40, 50]


def _lengths(seq_lens, rows):
    real = len(seq_lens)
    cu = list(range(real + 1)) + [real] * (rows - real)
    return torch.tensor(cu, dtype=torch.int32), torch.tensor(list(seq_lens) + [0] * (rows - real), dtype=torch.int32)


def _pair(monkeypatch, build, num_splits):
    monkeypatch.setenv(BUILD_VARIABLE, build)
    front = FrontFA3(132)
    cu, seqused = _lengths(REAL, len(REAL))
    md = front.c_get_scheduler_metadata(
        batch_size=len(REAL), max_seqlen_q=1, max_seqlen_k=8192, num_heads=32, num_heads_k=4, headdim=128,
        headdim_v=128, qkv_dtype=torch.bfloat16, seqused_k=seqused, cu_seqlens_q=cu, cu_seqlens_k=None,
        cu_seqlens_k_new=None, seqused_q=None, leftpad_k=None, page_size=16, max_seqlen_k_new=0, is_causal=True,
        window_size_left=-1, window_size_right=-1, attention_chunk=0, has_softcap=False, num_splits=num_splits,
        pack_gqa=None, sm_margin=0)
    front.drain()
    cu, seqused = _lengths(REAL, ROWS)
    none = dict.fromkeys(("k_new", "v_new", "q_v", "cu_seqlens_k", "cu_seqlens_k_new", "seqused_q", "kv_batch_idx",
                          "leftpad_k", "rotary_cos", "s_aux", "cp_tot_seqused_k", "out"))
    front.c_fwd(**dict(none, q=torch.zeros(ROWS, 32, 128, dtype=torch.bfloat16),
                       k=torch.zeros(4, 16, 4, 128, dtype=torch.bfloat16),
                       v=torch.zeros(4, 16, 4, 128, dtype=torch.bfloat16), max_seqlen_q=1, cu_seqlens_q=cu,
                       max_seqlen_k=8192, seqused_k=seqused, page_table=torch.zeros(ROWS, 512, dtype=torch.int32),
                       is_causal=True, window_size_left=-1, window_size_right=-1, softcap=0.0, scheduler_metadata=md,
                       num_splits=num_splits, softmax_scale=None))
    return md.numel(), sorted({v.invariant for _, _, vs in front.drain() for v in vs})


def test_a_semaphore_only_metadata_has_no_per_batch_slots_to_read(monkeypatch):
    size, found = _pair(monkeypatch, "vllm-fork-a8937124", num_splits=1)
    assert size == 1 and "BATCH_PERMUTATION" not in found, found


def test_negative_control_a_layout_with_per_batch_vectors_is_still_reported(monkeypatch):
    _, found = _pair(monkeypatch, "vllm-fork-617264c1", num_splits=1)
    assert "BATCH_PERMUTATION" in found, found


def test_negative_control_the_split_vector_makes_the_sizes_differ(monkeypatch):
    size, found = _pair(monkeypatch, "vllm-fork-a8937124", num_splits=0)
    assert size == 1 + len(REAL) and "SHAPE" in found, found
