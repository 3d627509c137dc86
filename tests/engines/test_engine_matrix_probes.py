"""The engine matrix's family probes (``fa3verify.engine_matrix.run_probes``): the worked example under prefill
CP and DP attention, eager and CUDA graph, on an engine. Played here by the model under each release's profile
(``fake_engines.ProfileSUT``), so the expected cells are docs/facts-engines.md section 1's table."""

from __future__ import annotations

import json

import pytest
from fake_engines import ProfileSUT, install

from fa3verify import cli
from fa3verify.engine_matrix import matrix_markdown, run_probes

KEYS = ("prefill CP, eager", "prefill CP, CUDA graph", "DP attention, eager", "DP attention, CUDA graph")


@pytest.mark.parametrize("release, prefill_cp, dp_attention", [
    ("0.5.11", "fail", "fail"),                                  # no guard, H // tp_size heads
    ("0.5.13", "fail", "pass (no precompute)"),                  # guard: DP attention only
    ("0.5.17", "pass (no precompute)", "pass (no precompute)"),  # guard: prefill CP or DP attention
    ("0.5.23", "pass (no precompute)", "pass (no precompute)"),  # both fixes
])
def test_probes_follow_each_releases_heads_and_guard(release, prefill_cp, dp_attention):
    probes = run_probes(ProfileSUT(release))
    assert list(probes) == list(KEYS)
    for key, want in zip(KEYS, (prefill_cp, prefill_cp, dp_attention, dp_attention)):
        assert probes[key].split(":")[0] == want, (key, probes[key])
    if prefill_cp == "fail":
        assert "SPLIT_BOUND" in probes["prefill CP, eager"]


def test_probes_catch_a_release_with_its_fixes_reverted():
    """Negative control: 0.5.23 played with tp heads and no guard fails both families."""
    probes = run_probes(ProfileSUT("0.5.23", heads="tp", guard="none"))
    assert all(v.startswith("fail: ") for v in probes.values()), probes


def test_a_probe_the_engine_cannot_run_is_an_error_not_a_pass():
    class Crashing(ProfileSUT):
        def run(self, scenario, **kw):
            raise RuntimeError("engine crashed")

    probes = run_probes(Crashing("0.5.23"))
    assert all(v.startswith("error: RuntimeError") for v in probes.values())


def test_the_matrix_carries_the_probes_into_json_and_markdown(monkeypatch, tmp_path, capsys):
    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    out = tmp_path / "m.json"
    code = cli.main(["engine", "matrix", "--releases", "0.5.13..0.5.13", "--cases", "10", "--cases-dir",
                     str(tmp_path / "cases"), "--json", str(out), "--markdown"])
    assert code == 1
    (row,) = json.loads(out.read_text())["rows"]
    assert row["probes"]["DP attention, eager"] == "pass (no precompute)"
    assert "fail (" in capsys.readouterr().out
    from fa3verify.engine_matrix import MatrixRow

    assert "| - / - | - / - |" in matrix_markdown([MatrixRow(release="0.5.13", verdict="pass", exit_code=0)])
    code = cli.main(["engine", "matrix", "--releases", "0.5.13..0.5.13", "--cases", "5", "--no-probes",
                     "--cases-dir", str(tmp_path / "c2"), "--json", str(out)])
    assert json.loads(out.read_text())["rows"][0]["probes"] == {}


def test_a_release_whose_worker_never_answers_is_an_inconclusive_row_not_a_lost_matrix(monkeypatch, tmp_path):
    """One release's worker dying (DriverError) leaves the other rows and the JSON; that row ran nothing."""
    from gpu_impl.engines.errors import DriverError

    class Dead(ProfileSUT):
        def run(self, scenario, **kw):
            raise DriverError(f"engine worker sglang=={self.release}: no answer within 900s; killed")

    install(monkeypatch, lambda spec: Dead(spec.release) if spec.release == "0.5.14" else ProfileSUT(spec.release))
    out = tmp_path / "m.json"
    code = cli.main(["engine", "matrix", "--releases", "0.5.13..0.5.14", "--cases", "5", "--no-probes",
                     "--cases-dir", str(tmp_path / "cases"), "--json", str(out)])
    rows = {r["release"]: r for r in json.loads(out.read_text())["rows"]}
    assert code == 1 and rows["0.5.13"]["verdict"] == "fail"  # 0.5.13 still fails its gate
    assert rows["0.5.14"]["verdict"] == "inconclusive" and "no answer" in rows["0.5.14"]["message"]
    assert rows["0.5.14"]["agrees"] is None
