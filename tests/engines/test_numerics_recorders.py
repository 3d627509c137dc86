"""The recorders that check outputs outside a scenario run (gpu-check's real-GPU fuzz case and worked example, sglang's
rank runner and its driver) call the one numerics check, ``gpu_impl.oracle_check``, and keep what they always wrote:
the same outcomes, row lists and sentences. Fed CPU tensors here (the emulated kernel; on a GPU the same code reads
FA3's outputs), with an output made to hold NaN or to miss the oracle."""

import re
import types

import pytest
import torch

from gpu_impl.backend import FlashAttentionBackend

EMULATED = {"name": "emulated", "device": "cpu"}
CASE = {"index": 0, "model": "llama-2-7b", "seed": 7, "seq_lens": [40, 52, 63],
        "server": {"tp_size": 1, "page_size": 1, "num_sm": 132, "context_length": 1024}}
FLOAT = r"\d\.\d{3}e[+-]\d\d"


def _spoil(monkeypatch, how):
    """Every decode output of FlashAttentionBackend passed through ``how`` (it returns the spoiled output)."""
    real = FlashAttentionBackend.forward_decode

    def spoiled(self, *args, **kwargs):
        out, lse = real(self, *args, **kwargs)
        return how(out.clone()), lse

    monkeypatch.setattr(FlashAttentionBackend, "forward_decode", spoiled)


def _nan_in_rows(*rows):
    def how(out):
        for r in rows:
            out[r, 0, 0] = float("nan")
        return out
    return how


def _case():
    from gpu_impl.config import ServerConfig

    return {**CASE, "server": ServerConfig(**CASE["server"]).to_dict()}


def test_a_fuzz_case_that_matches_the_oracle_passes_with_its_error_and_bound():
    from fa3verify.gpu_check.fuzz_cases import fuzz_case_task

    result = fuzz_case_task(EMULATED, _case())
    assert result["outcome"] == "pass"
    assert all(c["outcome"] == "pass" and c["max_error"] <= c["bound"] for c in result["calls"])


def test_a_fuzz_case_with_nan_rows_names_them(monkeypatch):
    from fa3verify.gpu_check.fuzz_cases import fuzz_case_task

    _spoil(monkeypatch, _nan_in_rows(2, 1))
    result = fuzz_case_task(EMULATED, _case())
    call = result["calls"][0]
    assert result["outcome"] == call["outcome"] == "nan"
    assert call["nan_rows"] == [1, 2]
    assert call["message"] == "NaN in output rows [1, 2] (sliding_window=False); predicted violations []"


def test_a_fuzz_case_off_the_oracle_is_a_mismatch_with_fa3s_bound(monkeypatch):
    from fa3verify.gpu_check.fuzz_cases import fuzz_case_task

    _spoil(monkeypatch, lambda out: out + 0.25)
    call = fuzz_case_task(EMULATED, _case())["calls"][0]
    assert call["outcome"] == "mismatch" and call["max_error"] > call["bound"]
    assert re.fullmatch(rf"max error {FLOAT} exceeds FA3's bound {FLOAT} \(sliding_window=False\)", call["message"])
    assert call["message"].startswith(f"max error {call['max_error']:.3e} exceeds FA3's bound {call['bound']:.3e}")


@pytest.mark.parametrize("spoil, outcome", [(None, "agrees"), (_nan_in_rows(3, 0), "nan"),
                                            (lambda out: out - 0.5, "mismatch")])
def test_the_worked_example_records_its_outcome(monkeypatch, spoil, outcome):
    from fa3verify.gpu_check.worked_example import worked_example_task

    if spoil is not None:
        _spoil(monkeypatch, spoil)
    info = worked_example_task(EMULATED, "fixed", long_len=256, num_sm=16)
    assert info["outcome"] == outcome
    assert info["nan_batches"] == ([0, 3] if outcome == "nan" else [])
    if outcome == "nan":
        assert "max_error" not in info
    else:
        assert (info["max_error"] <= info["bound"]) == (outcome == "agrees")


def _front():
    return types.SimpleNamespace(nan_rows=[])


def test_sglangs_rank_runner_records_nan_in_real_rows_only():
    from gpu_impl.engines.sglang.rank import RankBackend

    rank = types.SimpleNamespace(numerics=True, engine=types.SimpleNamespace(front=_front()))
    out = torch.zeros(6, 2, 4, dtype=torch.bfloat16)
    out[1, 1, 3] = out[4, 0, 0] = float("nan")  # row 4 is padding past the 3 real rows
    RankBackend._note_output(rank, (out, None), 3)
    RankBackend._note_output(rank, torch.zeros(6, 2, 4), 3)
    assert rank.engine.front.nan_rows == [[1]]
    rank.numerics = False
    RankBackend._note_output(rank, out, 6)
    assert rank.engine.front.nan_rows == [[1]]


def test_sglangs_driver_reports_one_no_nan_finding_a_step_and_rank():
    from gpu_impl.engines.sglang.driver import Engine

    rows = list(range(40))
    driver = types.SimpleNamespace(front=types.SimpleNamespace(nan_rows=[[5, 2], rows]))
    out = {"findings": []}
    Engine._collect_nan(driver, out, 3, 1)
    assert driver.front.nan_rows == []
    assert out["findings"] == [{
        "invariant": "NO_NAN", "step": 3, "dp_rank": 1,
        "message": "NaN in the attention output of real rows [0, 1, 2, 3, 4, 5, 6, 7] (FA3's numerics on the "
                   "emulator, with the metadata the backend passed)",
        "detail": {"mode": "decode", "rows": rows[:32], "source": "numerics"}}]
    assert list(out["findings"][0]["detail"]) == ["mode", "rows", "source"]
    Engine._collect_nan(driver, out, 4, 1)
    assert len(out["findings"]) == 1
