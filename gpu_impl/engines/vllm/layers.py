"""The attention layers both vLLM driver generations build: vLLM's ``Attention`` objects around the release's own
impl, made without the layer's constructor (which needs the model's config), and their query heads."""

from __future__ import annotations

__all__ = ["attention_layer", "layer_heads"]


def layer_heads(s: dict, index: int, layers: int, heads: int, kv_heads: int) -> int:
    """Query heads of layer ``index``: the scenario's, except under the seeded
    ``shared-precompute-heterogeneous-heads``, where the last layer has half of them."""
    if s["lifecycle_defect"] == "shared-precompute-heterogeneous-heads" and index == layers - 1:
        return max(kv_heads, heads // 2)
    return heads


def attention_layer(Attention, impl, index: int):  # noqa: N803 - vLLM's class, passed in
    """A vLLM ``Attention`` layer around ``impl``, made without its constructor (which needs the model's config):
    the fields the builder and the impl's forward read, scales 1."""
    import torch

    layer = Attention.__new__(Attention)
    torch.nn.Module.__init__(layer)
    layer.impl = impl
    layer.layer_name = f"model.layers.{index}.self_attn.attn"
    for name in ("_q_scale", "_k_scale", "_v_scale"):
        setattr(layer, name, torch.ones((), dtype=torch.float32))
        setattr(layer, name + "_float", 1.0)  # 0.34.0's impl reads the float mirror (_descale)
    return layer
