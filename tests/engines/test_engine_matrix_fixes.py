"""The engine matrix's fix releases (fa3verify.matrix_fixes) and its rows over any engine with releases.

On stand-ins of sglang releases (tests/fake_engines.py: the model under each release's profile) the matrix replays
every failing row's case files on their own release (STILL FAILS) and on every later one, and names, per family,
the first release where they pass; the negative control is a later release that keeps the defect: no fix is named.
"""

from __future__ import annotations

import json

from fa3verify import cli

from fake_engines import FactsSUT, install


def _matrix(tmp_path, argv):
    out = tmp_path / "m.json"
    code = cli.main(["engine", "matrix", *argv, "--cases", "40", "--no-probes", "--cases-dir",
                     str(tmp_path / "cases"), "--json", str(out)])
    return code, json.loads(out.read_text())


def test_a_failing_rows_cases_still_fail_on_it_and_the_first_release_where_they_pass_is_named(monkeypatch,
                                                                                             tmp_path, capsys):
    # 0.5.20: tp heads, its guard leaves attention CP without prefill CP precomputing; 0.5.21: attn_tp heads (fixed)
    install(monkeypatch, lambda spec: FactsSUT(spec.release))
    code, data = _matrix(tmp_path, ["--releases", "0.5.20..0.5.21"])
    assert code == 1
    rows = {r["release"]: r for r in data["rows"]}
    assert rows["0.5.20"]["verdict"] == "fail" and rows["0.5.21"]["verdict"] == "pass"
    fixes = data["fixes"]
    assert fixes and {f["found_on"] for f in fixes} == {"0.5.20"}
    for f in fixes:
        assert f["still_fails_on_own_release"] and f["replays"]["0.5.20"] == "STILL FAILS", f
        assert f["first_pass"] == "0.5.21" and f["replays"]["0.5.21"] == "PASSES NOW", f
        assert f["family"] in rows["0.5.20"]["families"] and set(f["case_files"]) <= set(rows["0.5.20"]["case_files"])
    out = capsys.readouterr().out
    assert "fix releases" in out and "first passes on 0.5.21" in out


def test_negative_control_a_later_release_that_keeps_the_defect_is_no_fix(monkeypatch, tmp_path, capsys):
    # the seeded defect: 0.5.21's code with 0.5.20's tp heads and guard
    install(monkeypatch, lambda spec: FactsSUT(spec.release, heads="tp", guard="fixed"))
    code, data = _matrix(tmp_path, ["--releases", "0.5.20..0.5.21"])
    assert code == 1
    fixes = [f for f in data["fixes"] if f["found_on"] == "0.5.20"]
    assert fixes and all(f["first_pass"] is None and f["still_failing_later"] == ["0.5.21"] for f in fixes), fixes
    assert "passes on no later release gated" in capsys.readouterr().out


def test_the_matrix_takes_the_engine_whose_releases_it_gates(monkeypatch, tmp_path):
    """`--engine vllm` lists vLLM's releases (gpu_impl.sut.releases_of: the registry row's list); a release the
    engine cannot open is an 'unavailable' row with the reason, never dropped; an engine without releases, or a
    release it does not list, is exit 2."""
    from gpu_impl.engines.vllm.recipes import version_key
    from gpu_impl.sut import releases_of

    listed = [r for r, _ in releases_of("vllm")]
    assert listed and listed == sorted(listed, key=version_key)
    import gpu_impl.sut as sut_mod
    from gpu_impl.engines.errors import EnvSetupError

    def fail(spec, **options):
        raise EnvSetupError(f"{spec}: no environment here")

    monkeypatch.setattr(sut_mod, "open_sut", fail)
    out = tmp_path / "m.json"
    code = cli.main(["engine", "matrix", "--engine", "vllm", "--releases", listed[-1], "--cases", "5", "--no-fixes",
                     "--cases-dir", str(tmp_path), "--json", str(out)])
    data = json.loads(out.read_text())
    row = data["rows"][0]
    assert "fixes" not in data  # --no-fixes: no replays
    assert code == 3 and row["verdict"] == "unavailable" and "no environment here" in row["message"]
    assert row["engine"] == "vllm" and row["release"] == listed[-1]
    assert cli.main(["engine", "matrix", "--engine", "model"]) == 2
    assert cli.main(["engine", "matrix", "--engine", "vllm", "--releases", "0.1.0"]) == 2
    assert cli.main(["engine", "matrix", "--engine", "vllm", "--releases", f"{listed[-1]}..{listed[0]}"]) == 2 \
        or len(listed) == 1


def test_a_vllm_case_is_named_by_its_own_family_and_graph_path():
    from gpu_impl.engines.vllm.host import VllmSUT
    from spec.model.cases import Case

    case = Case.load("tests/corpus_vllm/full-graph-replay-window-dropped-at-recompute.json")
    family, path = VllmSUT("0.34.0").case_family(case)
    assert family == "sliding window 4096 + head size 256" and path == "full CUDA graph (FULL_AND_PIECEWISE)"


def test_a_replay_on_a_release_is_still_fails_passes_now_or_what_stopped_it():
    from pathlib import Path

    from fa3verify.matrix_fixes import replay_on_release

    from fake_engines import ProfileSUT

    case = str(Path(__file__).parent.parent / "corpus" / "worked_example_prefix_guard.json")
    assert replay_on_release(case, ProfileSUT("0.5.14")) == "STILL FAILS"
    assert replay_on_release(case, ProfileSUT("0.5.23")) == "PASSES NOW"

    class Refusing(ProfileSUT):
        def validate(self, server_config, model_config=None):
            return False, "ServerArgs: the release refuses it"

    class Dying(ProfileSUT):
        def run(self, scenario, kernel=None, numerics=False, device="cpu"):
            from spec.process.worker_client import WorkerError

            raise WorkerError("engine worker (pid 1): no answer within 1 s; killed")

    assert replay_on_release(case, Refusing("0.5.23")) == "REJECTED (ServerArgs: the release refuses it)"
    assert replay_on_release(case, Dying("0.5.23")).startswith("NOT RUN (engine worker (pid 1)")


def test_a_vllm_family_names_layers_that_differ_and_k_v_sizes_that_differ():
    """The matrix's family of a case drawn with per-layer KV heads or a V head size of its own says so (the
    findings on those paths are told apart from the same shapes with uniform layers)."""
    from gpu_impl.engines.vllm.host import VllmSUT
    from spec.model.cases import Case

    sut = VllmSUT("0.34.0")
    layers = Case.load("tests/corpus_vllm/vllm-0.28.0-heterogeneous-layers-precompute-model-config-kv-heads.json")
    diffkv = Case.load("tests/corpus_vllm/vllm-0.33.0-diffkv-precompute-without-headdim-v-block-256.json")
    uniform = Case.load("tests/corpus_vllm/full-graph-replay-window-dropped-at-recompute.json")
    assert "layers with their own KV heads" in sut.case_family(layers)[0]
    assert "head sizes K 192 / V 128" in sut.case_family(diffkv)[0]
    assert "own KV heads" not in sut.case_family(uniform)[0] and "head sizes" not in sut.case_family(uniform)[0]


# ---------------------------------------------------------------- the fix releases of a sharded matrix


def _sharded_then_fixed(tmp_path, factory_kwargs=None, monkeypatch=None, releases="0.5.20..0.5.22"):
    """``releases`` in two shards (0.5.20 .. 0.5.22: 1/2 holds 0.5.20 and 0.5.22, 2/2 holds 0.5.21), merged, then
    `engine fixes`."""
    install(monkeypatch, lambda spec: FactsSUT(spec.release, **(factory_kwargs or {})))
    for k in (1, 2):
        code = cli.main(["engine", "matrix", "--releases", releases, "--cases", "40", "--no-probes",
                         "--shard", f"{k}/2", "--cases-dir", str(tmp_path / f"c{k}"),
                         "--json", str(tmp_path / f"s{k}.json")])
        assert code in (0, 1)
    assert cli.main(["report", "merge", str(tmp_path / "s1.json"), str(tmp_path / "s2.json"),
                     "--json", str(tmp_path / "merged.json")]) == 1
    merged = json.loads((tmp_path / "merged.json").read_text())
    code = cli.main(["engine", "fixes", str(tmp_path / "merged.json"), "--json", str(tmp_path / "fixed.json")])
    return merged, code, json.loads((tmp_path / "fixed.json").read_text())


def test_engine_fixes_names_the_fix_release_the_unsplit_matrix_names(monkeypatch, tmp_path, capsys):
    """A shard replays a family only on its own later releases: found on 0.5.20 (shard 1), its shard names 0.5.22,
    never having replayed 0.5.21 (shard 2); `engine fixes` replays it there and names 0.5.21, as the unsplit matrix
    does; the merged verdict stands (exit 1)."""
    merged, code, fixed = _sharded_then_fixed(tmp_path, monkeypatch=monkeypatch)
    found = [e for e in merged["fixes"] if e["found_on"] == "0.5.20"]
    assert found and all(e["first_pass"] == "0.5.22" and "0.5.21" in e["not_replayed"] for e in found), found
    assert code == 1
    after = [e for e in fixed["fixes"] if e["found_on"] == "0.5.20"]
    assert all(e["first_pass"] == "0.5.21" and e["replays"]["0.5.21"] == "PASSES NOW" for e in after), after
    assert all("0.5.21" not in e["not_replayed"] and list(e["replays"]) == ["0.5.20", "0.5.21", "0.5.22"]
               for e in after)
    _, unsplit = _matrix(tmp_path / "unsplit", ["--releases", "0.5.20..0.5.22"])
    assert {(e["family"], e["first_pass"]) for e in unsplit["fixes"] if e["found_on"] == "0.5.20"} == \
        {(e["family"], e["first_pass"]) for e in after}
    assert "first passes on 0.5.21" in capsys.readouterr().out


def test_negative_control_engine_fixes_names_no_fix_where_the_other_shards_release_keeps_the_defect(monkeypatch,
                                                                                                    tmp_path):
    """Every release with 0.5.20's heads and guard, 0.5.20 .. 0.5.23 in two shards: a family found on 0.5.22
    (shard 1) has no later release there; `engine fixes` replays it on 0.5.23 (shard 2), where it STILL FAILS, so no
    fix is named. Releases before a family's last failure are not replayed and stay named as such."""
    merged, code, fixed = _sharded_then_fixed(tmp_path, {"heads": "tp", "guard": "fixed"}, monkeypatch,
                                              releases="0.5.20..0.5.23")
    before = [e for e in merged["fixes"] if e["found_on"] == "0.5.22"]
    assert before and all(e["not_replayed"] == ["0.5.23"] for e in before), before
    after = [e for e in fixed["fixes"] if e["found_on"] == "0.5.22"]
    assert code == 1 and after
    assert all(e["first_pass"] is None and e["replays"]["0.5.23"] == "STILL FAILS" and e["not_replayed"] == []
               and e["still_failing_later"] == ["0.5.23"] for e in after), after
    early = [e for e in fixed["fixes"] if e["found_on"] == "0.5.20"]  # 0.5.22 failed in its shard: 0.5.21 is before it
    assert early and all(e["first_pass"] is None and e["not_replayed"] == ["0.5.21"]
                         and e["replays"]["0.5.23"] == "STILL FAILS" for e in early), early


def test_engine_fixes_refuses_what_is_not_a_merged_sharded_matrix_naming_the_field(tmp_path, capsys):
    cases = {"run.json": {"schema": "fa3verify.run/1"},
             "nofixes.json": {"schema": "fa3verify.engine-matrix/1", "exit_code": 1,
                              "rows": [{"release": "0.5.20", "engine": "sglang"}]},
             "model.json": {"schema": "fa3verify.engine-matrix/1", "exit_code": 1,
                            "rows": [{"release": "0.5.20", "engine": "model"}],
                            "fixes": [{"found_on": "0.5.20", "replays": {}, "case_files": [], "not_replayed": []}]},
             "unsplit.json": {"schema": "fa3verify.engine-matrix/1", "exit_code": 1,
                              "rows": [{"release": "0.5.20", "engine": "sglang"}],
                              "fixes": [{"found_on": "0.5.20", "replays": {}, "case_files": []}]}}
    for name, data in cases.items():
        (tmp_path / name).write_text(json.dumps(data))
        assert cli.main(["engine", "fixes", str(tmp_path / name)]) == 2, name
    err = capsys.readouterr().err
    assert "MATRIX.json" in err and "schema fa3verify.engine-matrix/1" in err
    assert "--no-fixes" in err and "not a merged sharded matrix" in err
    assert "engine 'model' is not one with releases (sglang or vllm)" in err
    assert cli.main(["engine", "fixes", str(tmp_path / "missing.json")]) == 2
    # the output is never one of its inputs: the merged matrix is not overwritten
    before = (tmp_path / "unsplit.json").read_bytes()
    assert cli.main(["engine", "fixes", str(tmp_path / "unsplit.json"), "--json", str(tmp_path / "unsplit.json")]) == 2
    assert "is the run's input MATRIX.json" in capsys.readouterr().err
    assert (tmp_path / "unsplit.json").read_bytes() == before
