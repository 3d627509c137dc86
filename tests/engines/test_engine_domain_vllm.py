"""vLLM's own config validation decides which drawn configurations run (marked ``engine``; one vLLM worker)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine

BASE = dict(num_heads=32, num_kv_heads=8, head_dim=128, max_model_len=40960, block_size=16)


@pytest.fixture(scope="module")
def vllm_sut(engine_sut):
    return engine_sut("vllm==0.33.0")  # the test process's shared worker (tests/engine_pool.py)


def test_vllm_rejects_with_its_own_message_and_accepts_what_it_accepts(vllm_sut):
    ok = vllm_sut.worker.validate(dict(BASE, tp=2, dcp=1))
    assert ok["accepted"] is True, ok
    bad = vllm_sut.worker.validate(dict(BASE, tp=4, dcp=3))
    assert bad["accepted"] is False and "must be divisible by dcp_size" in bad["message"]
    gqa = vllm_sut.worker.validate(dict(BASE, tp=4, dcp=2))   # DCP needs tp > the model's KV heads
    assert gqa["accepted"] is False and "Decode context parallelism" in gqa["message"]


def test_a_vllm_campaign_draws_only_what_vllm_accepts_and_reports_reach_per_graph_mode(vllm_sut, tmp_path):
    from fa3verify.commands.fuzz import fuzz

    summary = fuzz(sut=vllm_sut, max_cases=40, out_dir=str(tmp_path), show_progress=False)
    dom = summary.domain
    assert dom["name"] == "vllm==0.33.0" and dom["accepted"] >= summary.cases > 0
    assert any("Decode context parallelism" in r for r in dom["rejected"])
    from gpu_impl.engines.vllm.paths import PATH_KEYS

    assert set(dom["reach"]) == {"none", "piecewise", "full", *PATH_KEYS} and sum(dom["reach"].values()) > 0
    assert all(k in dom["not_covered"] for k, n in dom["reach"].items() if n == 0)  # every path: a count or why
