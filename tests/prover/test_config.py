"""Tests of spec.model.config (re-exported as gpu_impl.config): model shapes, derived head counts, domain assumptions, JSON round trips."""

import json

import pytest

from spec.model import config as C
from spec.model.config import MODELS, ModelConfig, ServerConfig


def test_registry_shapes_are_the_documented_ones():
    expected = {
        "llama-3-8b": (32, 8, 128),
        "qwen3-30b-a3b": (32, 4, 128),
        "qwen3-235b-a22b": (64, 4, 128),
        "llama-2-7b": (32, 32, 128),
        "starcoder": (48, 1, 128),
        "falcon-7b": (71, 1, 64),
        "gemma-2-9b": (16, 8, 256),
        "llama-3.2-1b": (32, 8, 64),
        "deepseek-v2-lite": (16, 16, 192),
    }
    assert {k: (m.num_heads, m.num_kv_heads, m.head_dim) for k, m in MODELS.items()} == expected
    assert MODELS["deepseek-v2-lite"].is_mla and MODELS["deepseek-v2-lite"].head_dim_v == 128
    for name, model in MODELS.items():
        assert model.name == name
        assert model.head_dim_v == (128 if model.is_mla else model.head_dim)
        assert model.violations() == []
        C.validate_config(model, ServerConfig())
    assert MODELS["gemma-2-9b"].has_sliding_window_layers
    assert any(m.num_kv_heads == m.num_heads for m in MODELS.values())  # a GQA-free model
    assert any(m.num_kv_heads == 1 for m in MODELS.values())  # an MQA model
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        C.get_model("nope")


def test_attn_tp_size_ignores_dp_without_dp_attention():
    # compute_dp_attention_world_info: attn_dp_size = dp_size only with DP attention.
    assert ServerConfig(tp_size=8, dp_size=2).attn_tp_size == 8
    assert ServerConfig(tp_size=8, dp_size=2, enable_dp_attention=True).attn_tp_size == 4
    assert ServerConfig(tp_size=8, attn_cp_size=2, enable_prefill_cp=True,
                        cp_strategy="zigzag").attn_tp_size == 4
    assert ServerConfig(tp_size=8, dp_size=2, attn_cp_size=2, enable_dp_attention=True,
                        enable_prefill_cp=True, cp_strategy="zigzag").attn_tp_size == 2


def test_worked_example_head_counts_of_facts_section_1():
    # Qwen3-30B-A3B, tp 4, attn_cp 4: precompute uses tp (H 32/4 = 8, Hk max(1, 4/4) = 1),
    # the layer uses attn_tp = 1 (H 32, Hk 4).
    model = MODELS["qwen3-30b-a3b"]
    cfg = ServerConfig(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag")
    cfg.validate(model)
    assert cfg.attn_tp_size == 1
    assert cfg.precompute_heads(model) == (8, 1)
    assert cfg.layer_heads(model) == (32, 4)
    assert cfg.head_counts_differ(model)
    assert not ServerConfig(tp_size=4).head_counts_differ(model)


def test_kv_heads_replicated_when_fewer_than_attn_tp():
    model = MODELS["qwen3-235b-a22b"]  # Hk = 4
    cfg = ServerConfig(tp_size=8)
    cfg.validate(model)
    assert cfg.layer_heads(model) == (8, 1)
    assert cfg.kv_head_replication(model) == 2
    assert ServerConfig(tp_size=2).kv_head_replication(model) == 1


def test_deterministic_inference_forces_one_split():
    assert ServerConfig(num_splits=0).backend_num_splits == 0
    assert ServerConfig(num_splits=0, enable_deterministic_inference=True).backend_num_splits == 1
    assert ServerConfig(num_splits=7).backend_num_splits == 7


def test_domain_assumptions_are_named_and_described():
    names = [a.name for a in C.DOMAIN_ASSUMPTIONS]
    assert len(names) == len(set(names))
    for a in C.DOMAIN_ASSUMPTIONS:
        assert a.name.startswith("ASSUMPTION_") and getattr(C, a.name) == a.name
        assert a.description and "\n" not in a.description
    assert C.ASSUMPTION_NAMES == frozenset(names)


ZZ = dict(enable_prefill_cp=True, cp_strategy="zigzag")
LLAMA3 = MODELS["llama-3-8b"]

# One violating configuration per assumption, with the field the error must name.
VIOLATIONS = [
    (C.ASSUMPTION_POSITIVE_SIZES, "tp_size", LLAMA3, ServerConfig(tp_size=0)),
    (C.ASSUMPTION_POSITIVE_SIZES, "page_size", LLAMA3, ServerConfig(page_size=0)),
    (C.ASSUMPTION_TP_DIVISIBLE, "tp_size", LLAMA3,
     ServerConfig(tp_size=6, dp_size=4, enable_dp_attention=True)),
    (C.ASSUMPTION_HEADS_POSITIVE, "num_kv_heads", ModelConfig("m", 8, 16, 128), ServerConfig()),
    (C.ASSUMPTION_GQA_GROUPS, "num_kv_heads", ModelConfig("m", 12, 8, 128), ServerConfig()),
    # attn_tp divides tp, so heads not divisible by attn_tp are not divisible by tp either.
    (C.ASSUMPTION_HEADS_DIVISIBLE_ATTN_TP, "num_heads", MODELS["falcon-7b"],
     ServerConfig(tp_size=2), {C.ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL}),
    (C.ASSUMPTION_KV_HEADS_SPLIT_ATTN_TP, "num_kv_heads", ModelConfig("m", 24, 12, 128),
     ServerConfig(tp_size=8)),
    (C.ASSUMPTION_KV_HEADS_SPLIT_ATTN_TP, "num_kv_heads", ModelConfig("m", 48, 3, 128),
     ServerConfig(tp_size=16, dp_size=4, enable_dp_attention=True)),
    (C.ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL, "tp_size", MODELS["gemma-2-9b"],
     ServerConfig(tp_size=32, dp_size=32, enable_dp_attention=True)),
    (C.ASSUMPTION_HEAD_DIM_SUPPORTED, "head_dim", ModelConfig("m", 8, 8, 100, head_dim_v=128),
     ServerConfig()),
    (C.ASSUMPTION_HEAD_DIM_SUPPORTED, "head_dim_v", ModelConfig("m", 8, 8, 64, head_dim_v=1024),
     ServerConfig()),
    (C.ASSUMPTION_DTYPE_SUPPORTED, "dtype", ModelConfig("m", 8, 8, 64, dtype="float32"),
     ServerConfig()),
    (C.ASSUMPTION_CP_STRATEGY_KNOWN, "cp_strategy", LLAMA3, ServerConfig(cp_strategy="ring")),
    (C.ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY, "cp_strategy", LLAMA3,
     ServerConfig(tp_size=2, attn_cp_size=2, enable_prefill_cp=True)),
    (C.ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP, "enable_prefill_cp", LLAMA3,
     ServerConfig(tp_size=2, attn_cp_size=2)),
    (C.ASSUMPTION_NUM_SPLITS_RANGE, "num_splits", LLAMA3, ServerConfig(num_splits=257)),
    (C.ASSUMPTION_NUM_SPLITS_RANGE, "num_splits", LLAMA3, ServerConfig(num_splits=-1)),
]


@pytest.mark.parametrize("case", VIOLATIONS, ids=[f"{v[0]}-{v[1]}" for v in VIOLATIONS])
def test_each_assumption_fires_names_field_and_can_be_dropped(case):
    assumption, field, model, server, *rest = case
    also = rest[0] if rest else set()
    found = C.config_violations(model, server)
    assert found[0].invariant == assumption, found
    assert {v.invariant for v in found} == {assumption} | also, found
    with pytest.raises(ValueError) as err:
        C.validate_config(model, server)
    assert str(err.value).startswith(f"{field}:") and assumption in str(err.value)
    dropped = {assumption} | also
    C.validate_config(model, server, dropped=dropped)
    assert C.is_valid_config(model, server, dropped=list(dropped))
    if also:
        assert not C.is_valid_config(model, server, dropped={assumption})


def test_every_assumption_has_a_violating_example():
    assert {v[0] for v in VIOLATIONS} == C.ASSUMPTION_NAMES


def test_mla_models_may_use_attn_cp_without_prefill_cp():
    mla = ModelConfig("mla", 16, 1, 128, is_mla=True)
    C.validate_config(mla, ServerConfig(tp_size=2, attn_cp_size=2))


def test_unknown_dropped_assumption_is_rejected():
    with pytest.raises(ValueError, match="unknown assumption name.*ASSUMPTION_NOPE"):
        C.validate_config(LLAMA3, ServerConfig(), dropped={"ASSUMPTION_NOPE"})


def test_server_only_validation_and_error_counts_more():
    ServerConfig(tp_size=4, attn_cp_size=4, **ZZ).validate()
    with pytest.raises(ValueError, match=r"and 1 more"):
        ServerConfig(tp_size=0, dp_size=0).validate()


def test_json_round_trip():
    for model in MODELS.values():
        text = json.dumps(model.to_dict())
        assert ModelConfig.from_dict(json.loads(text)) == model
    cfg = ServerConfig(tp_size=4, attn_cp_size=4, num_splits=3, cuda_graph=True, **ZZ)
    assert ServerConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert ServerConfig.from_dict({}) == ServerConfig()
    assert ModelConfig.from_dict({"name": "x", "num_heads": 8, "num_kv_heads": 2,
                                  "head_dim": 64}).head_dim_v == 64


@pytest.mark.parametrize("cls,data,pattern", [
    (ServerConfig, {"tp": 2}, r"unknown field\(s\) \['tp'\]"),
    (ServerConfig, {"tp_size": "2"}, r"ServerConfig.tp_size: expected int"),
    (ServerConfig, {"enable_prefill_cp": 1}, r"enable_prefill_cp: expected bool"),
    (ServerConfig, {"tp_size": True}, r"tp_size: expected int"),
    (ServerConfig, {"cp_strategy": 3}, r"cp_strategy: expected None or str"),
    (ModelConfig, {"name": "x", "num_heads": 8, "head_dim": 64},
     r"missing required field\(s\) \['num_kv_heads'\]"),
    (ModelConfig, {"name": "x", "num_heads": 8.0, "num_kv_heads": 8, "head_dim": 64},
     r"ModelConfig.num_heads: expected int"),
    (ModelConfig, [1, 2], r"expects a mapping"),
])
def test_from_dict_errors_name_the_field(cls, data, pattern):
    with pytest.raises(ValueError, match=pattern):
        cls.from_dict(data)
