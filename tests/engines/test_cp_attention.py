"""Tests of gpu_impl.cp_attention and the extend numerics of gpu_impl.scenario: CP-v2 prefill vs the oracle."""

import random

import pytest
import torch

import gpu_impl.zigzag as zigzag
from gpu_impl.config import ServerConfig, get_model
from gpu_impl.cp_attention import (
    CPLayoutMismatch,
    check_layout_matches_batch,
    cp_prefill_attention,
    extend_rows,
    join_prefix_and_extend,
    local_shard,
    plain_prefill_attention,
    prefill_tensors,
    rank_call,
    unshard,
)
from gpu_impl.guards import load_guard
from gpu_impl.scenario import Scenario, Step, run_scenario
from gpu_impl.zigzag import zigzag_layout
from refmodel.attention import attention
from refmodel.tolerance import fa3_output_close, reference_outputs

QWEN = get_model("qwen3-30b-a3b")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # Tiny float64 matmuls are ~10x slower with intra-op threads on a busy 2-core box.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cp_server(cp, tp=None, **kw):
    return ServerConfig(tp_size=tp or cp, attn_cp_size=cp, enable_prefill_cp=True, cp_strategy="zigzag", **kw)


def random_batch(rng, cp, max_seqs=3, max_len=40):
    """A batch on which CP-v2 is active: every extend length >= 2*cp, random cached prefixes."""
    n = rng.randint(1, max_seqs)
    ext = [rng.randint(2 * cp, max_len) for _ in range(n)]
    seqs = [e + rng.choice([0, 0, rng.randint(1, 20)]) for e in ext]
    return seqs, ext


def oracle_close(out, q, k, v, seqs, ext):
    exact, low = reference_outputs(q, k.unsqueeze(1), v.unsqueeze(1), **_plain_args(k, seqs, ext))
    return fa3_output_close(out, exact, low)


def _plain_args(k, seqs, ext):
    from gpu_impl.cp_attention import plain_call_args

    args = plain_call_args(torch.zeros(sum(ext), 1, 8), k, k, seqs, ext)
    for name in ("q", "k_cache", "v_cache"):
        args.pop(name)
    return args


# ---------------------------------------------------------------------------------------------
# The per-rank calls
# ---------------------------------------------------------------------------------------------


def test_rank_calls_of_the_upstream_cp4_case():
    # seq_lens [11, 13], extend [9, 10], cp 4: prefixes 2 and 3, blocks [2,1,1,1,1,1,1,1] / [2,2,1,1,1,1,1,1].
    layout = zigzag_layout([11, 13], [9, 10], 4)
    call0 = rank_call(layout, 0)  # blocks 0 and 7
    assert call0.seq_index == (0, 1, 0, 1)
    assert call0.q_lens == (2, 2, 1, 1)
    # prev: prefix + block 0 -> 2+2, 3+2; next: prefix + all 8 blocks -> 11, 13.
    assert call0.cache_seqlens == (4, 5, 11, 13)
    call3 = rank_call(layout, 3)  # blocks 3 and 4
    assert call3.q_lens == (1, 1, 1, 1)
    # prev: 2 + (2+1+1+1) = 7, 3 + (2+2+1+1) = 9; next (blocks 0..4): 2 + 6 = 8, 3 + 7 = 10.
    assert call3.cache_seqlens == (7, 9, 8, 10)
    assert [rank_call(layout, r).local_tokens for r in range(4)] == list(layout.rank_tokens)
    with pytest.raises(ValueError, match="rank"):
        rank_call(layout, 4)


def test_local_shard_and_unshard_round_trip_with_padding():
    # 20 tokens: blocks [3,3,3,2] and [3,2,2,2] -> 10 tokens per rank, padded to 12 (a multiple of 2cp = 4).
    layout = zigzag_layout([11, 9], [11, 9], 2)
    x = torch.arange(20 * 3, dtype=torch.float32).reshape(20, 3)
    shards = [local_shard(layout, r, x) for r in range(2)]
    assert all(s.shape[0] == layout.physical_rank_tokens for s in shards)
    assert layout.physical_rank_tokens > max(layout.rank_tokens)  # padding rows are really there
    assert torch.equal(unshard(layout, shards), x)


def test_join_prefix_and_extend_writes_only_extend_rows():
    seqs, ext = [5, 3], [2, 3]
    kv = torch.zeros(8, 1, 2)
    rows = extend_rows(seqs, ext)
    assert rows.tolist() == [3, 4, 5, 6, 7]
    joined = join_prefix_and_extend(kv, torch.ones(5, 1, 2), seqs, ext)
    assert joined[rows].eq(1).all() and joined[:3].eq(0).all()


# ---------------------------------------------------------------------------------------------
# CP path == non-CP oracle
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_prefill_matches_the_non_cp_oracle_on_random_batches(cp):
    rng = random.Random(1000 + cp)
    for trial in range(6):
        seqs, ext = random_batch(rng, cp)
        layout = zigzag_layout(seqs, ext, cp)
        h, hk = rng.choice([(4, 1), (4, 2), (2, 2)])
        q, k, v = prefill_tensors(seqs, ext, h, hk, 64, 64, seed=trial)
        res = cp_prefill_attention(layout, q, k, v, seq_lens=seqs, extend_lens=ext)
        assert res.out.shape == (sum(ext), h, 64) and res.out.dtype == torch.bfloat16
        ok, err, bound = oracle_close(res.out, q, k, v, seqs, ext)
        assert ok, (seqs, ext, err, bound)
        plain, _ = plain_prefill_attention(q, k, v, seqs, ext)
        assert (res.out.float() - plain.float()).abs().max() <= 1e-2
        assert [c.rank for c in res.calls] == list(range(cp))


def test_each_block_sees_exactly_its_causal_prefix():
    # With v = one-hot of the key position and q = 0 (uniform weights), the output of a query at position p
    # is the mean of positions 0..p: any extra or missing key changes it.
    cp, seqs, ext = 2, [11, 8], [8, 8]
    layout = zigzag_layout(seqs, ext, cp)
    n = sum(seqs)
    q = torch.zeros(sum(ext), 1, 8, dtype=torch.float64)
    k = torch.zeros(n, 1, 8, dtype=torch.float64)
    pos = torch.cat([torch.arange(s) for s in seqs]).double()
    v = pos.reshape(n, 1, 1).expand(n, 1, 8).clone()
    out = cp_prefill_attention(layout, q, k, v).out
    expected = torch.cat([torch.arange(s - e, s).double() / 2 for s, e in zip(seqs, ext)])  # mean of 0..p
    assert torch.allclose(out[:, 0, 0], expected)


# ---------------------------------------------------------------------------------------------
# Stale layouts
# ---------------------------------------------------------------------------------------------


def test_stale_layout_is_reported_not_crashed_and_says_what_sglang_would_do():
    layout = zigzag_layout([20, 20], [12, 16], 2)
    with pytest.raises(CPLayoutMismatch) as info:
        check_layout_matches_batch(layout, [9, 21, 41], [9, 1, 1])
    assert info.value.consequence == "index_error"  # 28 tokens split, 11 in the batch
    with pytest.raises(CPLayoutMismatch) as info:
        check_layout_matches_batch(layout, [14, 14], [14, 14])
    assert info.value.consequence == "index_error"  # same count, but kv_len_next 20 > seq_len 14
    # Same token count, every KV length fits: silent wrong tokens.
    with pytest.raises(CPLayoutMismatch) as info:
        check_layout_matches_batch(layout, [20, 20], [14, 14])
    assert info.value.consequence == "wrong_tokens"
    assert info.value.detail["layout_extend_lens"] == [12, 16]
    q, k, v = prefill_tensors([20, 20], [14, 14], 2, 1, 8, 8, seed=0)
    with pytest.raises(CPLayoutMismatch):
        cp_prefill_attention(layout, q, k, v, seq_lens=[20, 20], extend_lens=[14, 14])
    check_layout_matches_batch(layout, [20, 20], [12, 16])  # its own batch: fine


def test_stale_layout_on_mixed_batch_with_pre_fix_runner_is_a_finding():
    steps = [Step("extend", [20, 40], [16, 40]), Step("mixed", [9, 21, 41], [9, 1, 1])]
    pre = run_scenario(Scenario(cp_server(4), QWEN, load_guard("fixed"), steps, clear_stale_cp_metadata=False),
                       numerics=True)
    names = [f.invariant for f in pre.findings]
    assert "CP_LAYOUT_MATCHES_BATCH" in names and "CP_PATH_MATCHES_ACTIVITY" in names
    stale = next(f for f in pre.findings if f.invariant == "CP_LAYOUT_MATCHES_BATCH")
    assert stale.step == 1 and stale.detail["consequence"] == "index_error"
    assert stale.detail["layout_extend_lens"] == [16, 40]
    assert pre.trace[1]["numerics"] == "layout_mismatch"
    fixed = run_scenario(Scenario(cp_server(4), QWEN, load_guard("fixed"), steps), numerics=True)
    assert fixed.findings == []
    assert [t["numerics"] for t in fixed.trace] == ["cp", "plain"]
    assert len(fixed.outputs) == 2 and fixed.outputs[0].shape == (56, 32, 128)


def test_without_numerics_the_extend_trace_is_unchanged():
    steps = [Step("extend", [20, 40], [16, 40])]
    res = run_scenario(Scenario(cp_server(2), QWEN, load_guard("fixed"), steps), numerics=False)
    assert "numerics" not in res.trace[0] and "cp_calls" not in res.trace[0] and res.outputs == []


# ---------------------------------------------------------------------------------------------
# Scenario numerics: CP path, plain path, negative control
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cp", [2, 4])
def test_scenario_cp_extend_matches_oracle_with_prefixes(cp):
    steps = [Step("extend", [30, 17, 8 * cp], [22, 9, 8 * cp]), Step("extend", [5, 6], [5, 3])]
    res = run_scenario(Scenario(cp_server(cp), QWEN, load_guard("fixed"), steps, seed=7), numerics=True)
    assert res.findings == []
    assert res.trace[0]["numerics"] == "cp" and res.trace[1]["numerics"] == "plain"
    calls = res.trace[0]["cp_calls"]
    assert [c["rank"] for c in calls] == list(range(cp))
    h, _ = cp_server(cp).layer_heads(QWEN)
    assert res.outputs[0].shape == (22 + 9 + 8 * cp, h, QWEN.head_dim)


def test_negative_control_off_by_one_kv_len_is_caught(monkeypatch):
    real = zigzag.kv_lens

    def off_by_one(seq_len, extend_len, cp_size, rank):
        prev, nxt = real(seq_len, extend_len, cp_size, rank)
        return prev - 1, nxt  # each prev block loses its last visible key

    monkeypatch.setattr(zigzag, "kv_lens", off_by_one)
    steps = [Step("extend", [24, 16], [16, 16])]
    res = run_scenario(Scenario(cp_server(2), QWEN, load_guard("fixed"), steps), numerics=True)
    assert [f.invariant for f in res.findings] == ["MATCHES_ORACLE"]
    f = res.findings[0]
    assert f.detail["path"] == "cp" and f.detail["max_error"] > f.detail["bound"]
    assert res.outputs == []


def test_dp_attention_extend_is_split_over_dp_ranks():
    srv = ServerConfig(tp_size=4, dp_size=2, enable_dp_attention=True, attn_cp_size=2, enable_prefill_cp=True,
                       cp_strategy="zigzag")
    steps = [Step("extend", [12, 9, 20], [12, 5, 16])]  # rank 0: seqs 0 and 2 (CP-v2), rank 1: seq 1 (5 >= 4)
    res = run_scenario(Scenario(srv, QWEN, load_guard("fixed"), steps), numerics=True)
    assert res.findings == []
    assert [(t["dp_rank"], t["cp_v2_active"]) for t in res.trace] == [(0, True), (1, True)]
    assert [o.shape[0] for o in res.outputs] == [28, 5]


def test_big_extend_numerics_are_skipped_and_say_so():
    steps = [Step("extend", [4096], [4096])]
    res = run_scenario(Scenario(cp_server(2), QWEN, load_guard("fixed"), steps), numerics=True)
    assert res.trace[0]["numerics"].startswith("skipped") and res.findings == [] and res.outputs == []


def test_cp_result_is_deterministic():
    layout = zigzag_layout([18], [18], 2)
    q, k, v = prefill_tensors([18], [18], 2, 1, 16, 16, seed=3)
    a = cp_prefill_attention(layout, q, k, v).out
    b = cp_prefill_attention(layout, q, k, v).out
    assert torch.equal(a, b)
    ref, _ = attention(q, k.unsqueeze(1), v.unsqueeze(1), **_plain_args(k, [18], [18]))
    assert (a.float() - ref.float()).abs().max() <= 1e-2
