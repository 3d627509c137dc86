"""Pins of spec.model.config: the domain assumptions, each at its edge, with the whole violation it reports.

Sources: sglang's ServerArgs checks and ``compute_dp_attention_world_info`` (python/sglang/srt/server_args.py,
layers/dp_attention.py: attn_tp = tp // attn_dp // attn_cp), its attention modules' head splits (KV heads
partitioned when Hk >= attn_tp, replicated when Hk < attn_tp), and FA3's limits (hopper/flash_api.cpp: head dim
<= 256, V head dim <= 512, num_splits <= 256).
"""

import pytest

from spec.model.config import (ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP, ASSUMPTION_CP_STRATEGY_KNOWN, ASSUMPTION_DTYPE_SUPPORTED,
                         ASSUMPTION_GQA_GROUPS, ASSUMPTION_HEAD_DIM_SUPPORTED, ASSUMPTION_HEADS_DIVISIBLE_ATTN_TP,
                         ASSUMPTION_HEADS_POSITIVE, ASSUMPTION_KV_HEADS_SPLIT_ATTN_TP, ASSUMPTION_NUM_SPLITS_RANGE,
                         ASSUMPTION_POSITIVE_SIZES, ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL,
                         ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY, ASSUMPTION_TP_DIVISIBLE, ModelConfig, ServerConfig,
                         validate_config)
from spec.violation import Violation


def broken(assumption, field, message):
    """The whole violation spec.model.config reports for a broken assumption: its name, the field, the sentence."""
    return Violation(assumption, None, {"field": field}, message)


def model(h=32, hk=8, d=128, dv=None, dtype="bfloat16", name="m", mla=False):
    return ModelConfig(name=name, num_heads=h, num_kv_heads=hk, head_dim=d, head_dim_v=dv, dtype=dtype, is_mla=mla)


@pytest.mark.parametrize("m, want", [
    (model(h=1, hk=1), []),                                                    # one head is a valid model
    (model(h=0, hk=1), [broken(ASSUMPTION_HEADS_POSITIVE, "num_heads", "num_heads must be >= 1, got 0")]),  # hk in [1, max(0, 1)]
    (model(h=1, hk=2), [broken(ASSUMPTION_HEADS_POSITIVE, "num_kv_heads",
                                  "num_kv_heads must be in [1, num_heads=1], got 2")]),
    (model(h=3, hk=2), [broken(ASSUMPTION_GQA_GROUPS, "num_kv_heads",
                                  "num_heads=3 must be divisible by num_kv_heads=2")]),
    (model(d=8, dv=8), []), (model(d=256, dv=512), []),
    (model(d=0), [broken(ASSUMPTION_HEAD_DIM_SUPPORTED, "head_dim", "head_dim must be a multiple of 8 in [8, 256], got 0"),
                  broken(ASSUMPTION_HEAD_DIM_SUPPORTED, "head_dim_v", "head_dim_v must be a multiple of 8 in [8, 512], got 0")]),
    (model(d=12, dv=8), [broken(ASSUMPTION_HEAD_DIM_SUPPORTED, "head_dim",
                                   "head_dim must be a multiple of 8 in [8, 256], got 12")]),
    (model(d=128, dv=520), [broken(ASSUMPTION_HEAD_DIM_SUPPORTED, "head_dim_v",
                                      "head_dim_v must be a multiple of 8 in [8, 512], got 520")]),
    (model(dtype="float32"), [broken(ASSUMPTION_DTYPE_SUPPORTED, "dtype",
                                        "dtype must be one of ['bfloat16', 'float16', 'float8_e4m3'], got 'float32'")]),
])
def test_model_assumptions_at_their_edges(m, want):
    assert m.violations() == want


def test_a_non_int_model_field_is_refused_by_name():
    with pytest.raises(ValueError) as info:
        model(h="32").violations()
    assert str(info.value) == "ModelConfig.num_heads: expected int, got '32'"
    with pytest.raises(ValueError) as info:
        ServerConfig(tp_size=2.0).violations()
    assert str(info.value) == "ServerConfig.tp_size: expected int, got 2.0"


@pytest.mark.parametrize("server, m, want", [
    (ServerConfig(num_splits=256), None, []),
    (ServerConfig(num_splits=257), None, [broken(ASSUMPTION_NUM_SPLITS_RANGE, "num_splits",
                                                    "num_splits must be 0 (heuristic) or in [1, 256], got 257")]),
    (ServerConfig(page_size=0), model(), [broken(ASSUMPTION_POSITIVE_SIZES, "page_size", "page_size must be >= 1, got 0")]),
    (ServerConfig(page_size=0), model(h=3, hk=2),     # sizes broken: the model's own violations still come back
     [broken(ASSUMPTION_POSITIVE_SIZES, "page_size", "page_size must be >= 1, got 0"),
      broken(ASSUMPTION_GQA_GROUPS, "num_kv_heads", "num_heads=3 must be divisible by num_kv_heads=2")]),
    (ServerConfig(cp_strategy="ring"), None, [broken(ASSUMPTION_CP_STRATEGY_KNOWN, "cp_strategy",
                                                       "cp_strategy must be one of [None, 'zigzag'], got 'ring'")]),
    (ServerConfig(enable_prefill_cp=True), None, [broken(ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY, "cp_strategy",
                                                           "enable_prefill_cp=True requires cp_strategy='zigzag', got None")]),
    (ServerConfig(tp_size=6, dp_size=4, enable_dp_attention=True), None,
     [broken(ASSUMPTION_TP_DIVISIBLE, "tp_size", "tp_size=6 must be divisible by attn_dp_size*attn_cp_size=4*1=4")]),
    (ServerConfig(tp_size=8, dp_size=2, attn_cp_size=2, enable_dp_attention=True, enable_prefill_cp=True,
                  cp_strategy="zigzag"), model(), []),          # group 2 * 2 = 4 divides 8: attn_tp 2
    (ServerConfig(tp_size=6, dp_size=2, attn_cp_size=2, enable_dp_attention=True, enable_prefill_cp=True,
                  cp_strategy="zigzag"), None,
     [broken(ASSUMPTION_TP_DIVISIBLE, "tp_size", "tp_size=6 must be divisible by attn_dp_size*attn_cp_size=2*2=4")]),
    (ServerConfig(tp_size=2, attn_cp_size=2), model(), [broken(
        ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP, "enable_prefill_cp",
        "attn_cp_size=2 > 1 requires enable_prefill_cp=True for the non-MLA model 'm'")]),
    (ServerConfig(tp_size=2, attn_cp_size=2), model(mla=True), []),
    (ServerConfig(tp_size=4), model(h=6, hk=2), [   # attn_tp 4: 6 % 4, and 4 > 2 KV heads replicated twice: fine
        broken(ASSUMPTION_HEADS_DIVISIBLE_ATTN_TP, "num_heads", "num_heads=6 of 'm' must be divisible by attn_tp_size=4"),
        broken(ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL, "tp_size", "num_heads=6 of 'm' must be divisible by tp_size=4")]),
    (ServerConfig(tp_size=4), model(h=32, hk=4), []),           # Hk == attn_tp: one KV head a rank
    (ServerConfig(tp_size=4), model(h=24, hk=6), [broken(
        ASSUMPTION_KV_HEADS_SPLIT_ATTN_TP, "num_kv_heads", "num_kv_heads=6 >= attn_tp_size=4 must be divisible by it")]),
    (ServerConfig(tp_size=4), model(h=24, hk=3), [broken(
        ASSUMPTION_KV_HEADS_SPLIT_ATTN_TP, "num_kv_heads",
        "attn_tp_size=4 > num_kv_heads=3 must be divisible by it (KV heads are replicated)")]),
    (ServerConfig(tp_size=8, dp_size=2, enable_dp_attention=True), model(h=12, hk=4), [broken(
        ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL, "tp_size", "num_heads=12 of 'm' must be divisible by tp_size=8")]),
    (ServerConfig(tp_size=2), model(h=0, hk=3), [    # heads broken: the TP-split rules (3 % 2 != 0) are skipped
        broken(ASSUMPTION_HEADS_POSITIVE, "num_heads", "num_heads must be >= 1, got 0"),
        broken(ASSUMPTION_HEADS_POSITIVE, "num_kv_heads", "num_kv_heads must be in [1, num_heads=0], got 3")]),
    (ServerConfig(tp_size=4), model(h=6, hk=2, dtype="float32"), [   # another model violation: the split rules run
        broken(ASSUMPTION_DTYPE_SUPPORTED, "dtype",
                  "dtype must be one of ['bfloat16', 'float16', 'float8_e4m3'], got 'float32'"),
        broken(ASSUMPTION_HEADS_DIVISIBLE_ATTN_TP, "num_heads", "num_heads=6 of 'm' must be divisible by attn_tp_size=4"),
        broken(ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL, "tp_size", "num_heads=6 of 'm' must be divisible by tp_size=4")]),
])
def test_server_assumptions_at_their_edges(server, m, want):
    assert server.violations(m) == want


def test_validation_names_the_first_violation_and_counts_the_rest():
    with pytest.raises(ValueError) as info:
        validate_config(None, ServerConfig(page_size=0))
    assert str(info.value) == "page_size: page_size must be >= 1, got 0 [ASSUMPTION_POSITIVE_SIZES]"
    with pytest.raises(ValueError) as info:
        ServerConfig(page_size=0, num_sm=0).validate(model(h=3, hk=2))
    assert str(info.value) == "page_size: page_size must be >= 1, got 0 [ASSUMPTION_POSITIVE_SIZES] (and 2 more)"
    ServerConfig(page_size=0).validate(None, dropped=[ASSUMPTION_POSITIVE_SIZES])


def test_head_counts_of_each_side():
    # attn_tp = 8 // 2 = 4 with DP attention: the layer has 32 / 4 = 8 heads, the precompute 32 / 8 = 4 (#30439)
    s = ServerConfig(tp_size=8, dp_size=2, enable_dp_attention=True)
    assert s.precompute_heads(model(h=32, hk=8)) == (4, 1) and s.layer_heads(model(h=32, hk=8)) == (8, 2)
    assert isinstance(s.precompute_heads(model())[0], int) and isinstance(s.layer_heads(model())[1], int)
    assert s.layer_heads(model(h=30, hk=6)) == (7, 1) and s.precompute_heads(model(h=30, hk=6)) == (3, 1)
    assert ServerConfig(tp_size=4).precompute_heads(model(h=24, hk=6)) == (6, 1)    # 6 // 4: integer division
    # KV heads replicated: attn_tp 4 over 2 KV heads -> 2 copies; attn_tp == Hk -> 1; attn_tp 4 over 3 -> 4 // 3
    assert ServerConfig(tp_size=4).kv_head_replication(model(h=8, hk=2)) == 2
    assert ServerConfig(tp_size=4).kv_head_replication(model(h=8, hk=4)) == 1
    assert isinstance(ServerConfig(tp_size=4).kv_head_replication(model(h=24, hk=3)), int)


def test_to_dict_keeps_the_fork_field_only_when_set_or_asked():
    assert "cp_decode_sharded_kv" not in ServerConfig().to_dict()
    assert ServerConfig().to_dict(include_fork_fields=True)["cp_decode_sharded_kv"] is False
    assert ServerConfig(cp_decode_sharded_kv=True).to_dict()["cp_decode_sharded_kv"] is True


def test_from_dict_names_the_type_it_got():
    with pytest.raises(ValueError) as info:
        ServerConfig.from_dict([1])
    assert str(info.value) == "ServerConfig.from_dict expects a mapping, got list"
    with pytest.raises(ValueError) as info:
        ServerConfig.from_dict({"tp_size": "2"})
    assert str(info.value) == "ServerConfig.tp_size: expected int, got '2' (str)"
    with pytest.raises(ValueError) as info:
        ServerConfig.from_dict({"cp_strategy": 3})
    assert str(info.value) == "ServerConfig.cp_strategy: expected None or str, got 3 (int)"
    assert ServerConfig.from_dict({"cp_strategy": None}).cp_strategy is None
    with pytest.raises(ValueError) as info:
        ModelConfig.from_dict({"name": "m", "num_heads": 8, "num_kv_heads": 8, "head_dim": 64, "head_dim_v": "64"})
    assert str(info.value) == "ModelConfig.head_dim_v: expected None or int, got '64' (str)"
    assert ModelConfig.from_dict({"name": "m", "num_heads": 8, "num_kv_heads": 8, "head_dim": 64,
                                  "head_dim_v": None}).head_dim_v == 64
