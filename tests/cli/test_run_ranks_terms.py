"""Findings in backend terms on every surface, run-ranks included: a finding of one process per
attention rank carries the configuration, path, differing FA3 arguments, S_p vs S_c, the guard's decision and a
fix hint (``fa3verify.finding_terms.run_ranks_terms``: one model run of its case file, the scenario every rank
ran), and its numbers are the ranks' own; ``run-ranks --engine`` findings are the replay's, with its terms."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch

from fa3verify import cli
from fa3verify.summary import finding_sentence, finding_text

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is needed")

WORKED = str(Path(__file__).resolve().parent.parent / "corpus" / "worked_example_prefix_guard.json")


def _dp2_case(tmp_path) -> str:
    """Two DP ranks, no guard: the rank holding the 32768-token sequence overflows its splits (SPLIT_BOUND)."""
    from spec.model.cases import Case

    data = {"schema": "fa3verify.case/1", "id": "dp2", "source": "manual",
            "server": {"tp_size": 4, "dp_size": 2, "enable_dp_attention": True},
            "model": {"name": "qwen3-30b-a3b", "num_heads": 32, "num_kv_heads": 4, "head_dim": 128},
            "policy": {"guard": "none", "metadata_heads": "tp", "clear_stale_cp_metadata": True},
            "batches": [{"mode": "decode", "seq_lens": [32768] + [100] * 15, "extend_lens": None}],
            "kernel": {"name": "emulated", "mode": "strict"}, "seed": 0,
            "expected": {"outcome": "violation", "invariant": "SPLIT_BOUND", "detail": {}}}
    path = tmp_path / "dp2.json"
    path.write_text(json.dumps(Case.from_dict(data).to_dict()))
    return str(path)


def test_a_run_ranks_finding_is_in_backend_terms_with_the_ranks_numbers(tmp_path, capsys):
    case = _dp2_case(tmp_path)
    code = cli.main(["run-ranks", case, "--metadata-only", "--out-dir", str(tmp_path / "ranks"),
                     "--json", str(tmp_path / "r.json"), "--timeout-s", "600"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "in backend terms: qwen3-30b-a3b/tp4/dp2" in out and "fix: " in out
    found = json.loads((tmp_path / "r.json").read_text())["findings"]
    ranks = json.loads((tmp_path / "ranks" / "verdict-0.json").read_text())["findings"]
    first = next(f for f in found if f["invariant"] == "SPLIT_BOUND")
    rank = next(f for f in ranks if f["invariant"] == "SPLIT_BOUND")
    assert first["config"].startswith("qwen3-30b-a3b/tp4/dp2") and first["path"] and first["hint"]
    assert first["guard"] == "guard 'none' kept the precompute" and "2 ranks, gloo" in first["ran_on"]
    assert (first["s_p"], first["s_c"]) == (rank["detail"]["s_p"], rank["detail"]["s_c"])
    assert first["message"] == rank["message"]  # the evidence is the ranks' own
    assert "S_p=" in finding_text(first)


def test_negative_control_without_terms_a_rank_finding_says_nothing_of_the_backend(monkeypatch):
    import fa3verify.finding_terms as observed_terms
    from fa3verify.commands.run_ranks import rank_findings

    res = types.SimpleNamespace(world=4, backend="gloo", findings=[
        {"invariant": "SPLIT_BOUND", "step": 0, "dp_rank": 0, "message": "batch 0 has 86 splits", "detail": {}}])
    (with_terms,) = rank_findings(WORKED, res)
    assert "precomputes with heads (8, 1) but calls with heads (32, 4)" in finding_sentence(with_terms)
    monkeypatch.setattr(observed_terms, "run_ranks_terms", lambda *a, **k: {})  # the defect: no terms
    (bare,) = rank_findings(WORKED, res)
    assert not finding_sentence(bare) and not bare.hint


def test_run_ranks_on_an_engine_reports_the_replay_s_terms(monkeypatch, tmp_path, capsys):
    from fake_engines import ProfileSUT, install

    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    assert cli.main(["run-ranks", WORKED, "--engine", "sglang==0.5.14", "--json", str(tmp_path / "e.json")]) == 1
    assert "  in backend terms: " in capsys.readouterr().out
    (f, *_) = json.loads((tmp_path / "e.json").read_text())["findings"]
    assert f["ran_on"] == "sglang==0.5.14" and f["config"] and f["guard"] == "sglang==0.5.14's own guard kept the precompute"
    assert f["hint"] and f["s_c"] is not None
