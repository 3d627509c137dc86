"""Numerics on request for vLLM (gpu_impl/engines/vllm/numerics.py): vLLM's calls on the FA3 emulator, outputs
judged against the float64 oracle (NO_NAN, MATCHES_ORACLE).

Unit tests need nothing; those marked ``engine`` run vLLM 0.33.0's builder and impl in the cached environment.
Negative control: the seeded vLLM #20301 defect (the precompute with the heuristic, the call with the CUDA-graph 32)
gives NaN rows on the real code path; the same batch without it matches the oracle.
"""

import pytest
import torch

from gpu_impl.engines import envs
from gpu_impl.engines.vllm import driver as vllm_driver
from gpu_impl.engines.protocol import Unsupported
from gpu_impl.engines.vllm.numerics import EmulatorVarlenFA3, check_numerics_scenario, judge, numerics_kv

RELEASE = "0.33.0"
SKEWED = [32768] + [100] * 7


def _call(seq_lens=(40, 7), query_lens=(1, 3), h=4, hk=2, d=64, block=16):
    kv, table = numerics_kv(hk, block, d, torch.bfloat16, list(seq_lens), 8, seed=1)
    k, v = kv.transpose(1, 2).split(d, dim=-1)
    q = torch.randn(sum(query_lens), h, d, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    cu = torch.tensor([0] + [sum(query_lens[:i + 1]) for i in range(len(query_lens))], dtype=torch.int32)
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu, max_seqlen_q=max(query_lens),
                seqused_k=torch.tensor(seq_lens, dtype=torch.int32), block_table=table)


def test_the_emulated_call_matches_the_oracle_and_the_judge_catches_zeros_and_nan():
    a = _call()
    fa3 = EmulatorVarlenFA3(num_sm=132)
    out = fa3.flash_attn_varlen_func(a["q"], a["k"], a["v"], a["max_seqlen_q"], a["cu_seqlens_q"], 128,
                                     seqused_k=a["seqused_k"], block_table=a["block_table"], causal=True,
                                     softmax_scale=64 ** -0.5)
    args = (a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["max_seqlen_q"], a["seqused_k"], a["block_table"], True,
            (-1, 0), 0.0, 64 ** -0.5)
    assert judge(out, *args) is None
    assert judge(torch.zeros_like(out), *args)[0] == "MATCHES_ORACLE"   # negative controls of the judge
    bad = out.clone()
    bad[1] = float("nan")
    inv, msg, detail = judge(bad, *args)
    assert inv == "NO_NAN" and detail["rows"] == [1]


def test_every_sequence_owns_its_blocks_and_unused_entries_point_at_the_null_block():
    kv, table = numerics_kv(1, 16, 8, torch.bfloat16, [33, 1], 4, seed=0)
    assert kv.shape == (1 + 3 + 1, 1, 16, 16)
    assert table.tolist() == [[1, 2, 3, 0], [4, 0, 0, 0]]


def test_numerics_refuses_what_it_does_not_model_naming_the_field():
    for extra, field in (({"kv_cache_dtype": "fp8"}, "kv_cache_dtype"), ({"tp": 2, "dcp": 2}, "dcp"),
                         ({"max_model_len": 2 ** 21, "steps": [{"seq_lens": [2 ** 20, 5]}]}, "steps[0].seq_lens")):
        with pytest.raises(Unsupported, match=field.replace("[", r"\[").replace("]", r"\]")):
            check_numerics_scenario(vllm_driver.check_scenario({"steps": [{"seq_lens": [5]}], **extra}))


# ---------------------------------------------------------------- engine: vLLM's own code


@pytest.fixture(scope="module")
def vllm_worker(engine_sut):
    if not envs.env_ready(RELEASE, engine="vllm"):
        pytest.skip(f"no environment for vllm {RELEASE} under {envs.env_dir(RELEASE, engine='vllm')}")
    return engine_sut(f"vllm=={RELEASE}").worker  # the test process's shared worker (tests/engine_pool.py)


@pytest.mark.engine
def test_outputs_match_the_oracle_on_eager_windowed_chunked_and_full_graph_steps(vllm_worker):
    for sc in ({"tp": 4, "steps": [{"seq_lens": [300, 17, 5]}]},
               {"tp": 2, "num_layers": 2, "sliding_window": 64,
                "steps": [{"seq_lens": [300, 100, 5], "query_lens": [1, 40, 5]}]},
               {"tp": 4, "cuda_graph": "piecewise", "steps": [{"seq_lens": [300, 100], "query_lens": [1, 60]}]},
               {"tp": 4, "cuda_graph": "full", "steps": [{"seq_lens": [2000, 3, 1]}]}):
        resp = vllm_worker.run(sc, numerics=True)
        assert resp["findings"] == [] and resp["shape_errors"] == [], (sc, resp["findings"])
        assert resp["trace"][-1]["numerics"] == "emulator"


@pytest.mark.engine
def test_negative_control_the_seeded_pr20301_defect_gives_nan_on_the_real_code_path(vllm_worker):
    seeded = vllm_worker.run({"tp": 4, "cuda_graph": "full", "defect": {"precompute_num_splits": 0},
                              "steps": [{"seq_lens": SKEWED}]}, numerics=True)
    found = {f["invariant"] for f in seeded["findings"]}
    assert {"SPLIT_BOUND", "NO_NAN"} <= found, found
    nan = next(f for f in seeded["findings"] if f["invariant"] == "NO_NAN")
    assert nan["detail"]["rows"] == [0] and nan["detail"]["path"] == "full"  # the long sequence's row
    plain = vllm_worker.run({"tp": 4, "cuda_graph": "full", "steps": [{"seq_lens": SKEWED}]}, numerics=True)
    assert plain["findings"] == []  # the control: the same batch without the defect matches the oracle


@pytest.mark.engine
def test_replay_numerics_runs_the_prover_counterexample_on_the_emulator(tmp_path):
    from fa3verify.commands.replay import replay
    from spec.model.config import MODELS
    from gpu_impl.engines.vllm.profiles import vllm_profile_from_dict
    from gpu_impl.engines.vllm.theorems import run_vllm_theorems

    variant = vllm_profile_from_dict("0.33.0+pr20301", {"precompute_modes": ["full"],
                                                        "num_splits": {"precompute": {"full": 0}, "call": {"full": 32}}})
    (r,) = run_vllm_theorems(variant, models=[MODELS["qwen3-30b-a3b"]], cases_dir=str(tmp_path))
    summary, seen = replay(r.case_file, numerics=True)
    assert summary.exit_code == 1 and "NO_NAN" in seen.invariants, seen.invariants
    _, fixed = replay(r.case_file, numerics=True, defects=())
    assert not fixed.fails, fixed.findings
