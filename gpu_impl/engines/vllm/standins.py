"""The stand-ins the vLLM drivers build vLLM's objects over: the model config the FlashAttention builder and impl
read (vLLM's ``ModelConfig`` inspects the model class, which needs the model code and weights) and a one-process
decode-context-parallel group (vLLM's needs torch.distributed over GPUs). Listed in docs/engines-vllm.md.

Invariant: a stand-in answers only what vLLM's builder and impl read, as vLLM's own object would for the scenario;
where the release's own method can answer (layers that differ from the config), it is bound and run.
"""

from __future__ import annotations


class ModelStandIn:
    """The model-config fields vLLM's FlashAttention builder and impl read (a stand-in; see the module doc)."""

    def __init__(self, s: dict, torch_dtype):
        import types

        self.hf_config = types.SimpleNamespace(model_type="llama")
        self.rswa_window = None
        self.is_mm_prefix_lm = False
        self.is_diffusion = False
        self.dtype = torch_dtype
        self.hf_text_config = self.hf_config
        self.is_hybrid = False
        self.is_encoder_decoder = False
        self.enforce_eager = False  # VllmConfig._set_cudagraph_sizes resolves capture sizes only when False
        self._heads, self._kv_heads, self._head_size = s["num_heads"], s["num_kv_heads"], s["head_dim"]
        self.max_model_len = s["max_model_len"]  # 0.34.0's build reads it under VLLM_BATCH_INVARIANT
        if s.get("layer_kv_heads"):
            # a model whose layers differ from its config: the release's own ModelConfig methods answer
            # (gpu_impl.engines.vllm.heterolayers), from a Nemotron-NAS hf_config
            from gpu_impl.engines.vllm.heterolayers import bind_model_config, nemotron_nas_hf_config

            self.hf_config = self.hf_text_config = nemotron_nas_hf_config(s)
            bind_model_config(self)

    def get_num_attention_heads(self, parallel_config) -> int:
        return self._heads // parallel_config.tensor_parallel_size

    def get_num_kv_heads(self, parallel_config) -> int:
        """As vLLM's ModelConfig: at least one KV head per rank (the builder of 0.28 and before reads it)."""
        return max(1, self._kv_heads // parallel_config.tensor_parallel_size)

    def get_head_size(self) -> int:
        """The model's (K) head size: the precompute's ``headdim`` in the builder of 0.28 and before."""
        return self._head_size


class DCPGroupStandIn:
    """A one-process decode-context-parallel group: vLLM reads world_size and rank_in_group; all_gather repeats."""

    def __init__(self, world_size: int, rank: int = 0):
        self.world_size, self.rank_in_group = world_size, rank

    def all_gather(self, t, dim: int = -1):
        import torch

        return torch.cat([t] * self.world_size, dim=dim)


def cumsum(xs):
    t = 0
    for x in xs:
        t += x
        yield t
