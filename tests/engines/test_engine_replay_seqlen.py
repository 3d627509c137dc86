"""The CUDA-graph replay's precompute ``max_seqlen_k`` as a release profile states it (``spec/model/engine_profiles.json``).

sglang 0.5.16+ give the decode CUDA-graph replay no CPU lengths (``FlashAttentionBackend.needs_cpu_seq_lens =
False``; ``init_forward_metadata_out_graph`` passes ``seq_lens_cpu=None``), so the replay precomputes with the
backend's ``max_context_len`` bound; 0.5.11 - 0.5.15 pass the replayed rows' longest length. The model plays
either (``gpu_impl.backend.GRAPH_REPLAY_SEQLEN_K``); conformance must tell them apart (the negative control).
"""

from __future__ import annotations

import pytest

from gpu_impl.config import ServerConfig, get_model
from gpu_impl.model_pairs import model_pairs
from gpu_impl.scenario import Scenario, Step, run_scenario
from spec.model.engine_profiles import profile_for

FALCON = get_model("falcon-7b")


def _scenario(bound: str, cuda_graph: bool = True) -> Scenario:
    from gpu_impl.guards import load_guard

    server = ServerConfig(tp_size=2, page_size=64, cuda_graph=cuda_graph, context_length=4096)
    return Scenario(server=server, model=FALCON, guard=load_guard("fixed"), guard_spec="fixed",
                    steps=[Step("decode", [3975, 100])], graph_replay_seqlen_k=bound)


def _precompute_seqlen_k(scn: Scenario) -> dict:
    return {e["path"]: e["precompute"]["max_seqlen_k"] for e in model_pairs(scn, run_scenario(scn))}


def test_the_replay_precomputes_with_the_context_bound_only_when_the_profile_says_so():
    assert _precompute_seqlen_k(_scenario("max_seq_len")) == {"capture": 1, "replay": 3975}
    assert _precompute_seqlen_k(_scenario("context_length")) == {"capture": 1, "replay": 4096}
    assert _precompute_seqlen_k(_scenario("context_length", cuda_graph=False)) == {"eager": 3975}


def test_profiles_name_the_releases_whose_replay_has_no_cpu_lengths():
    bounds = {f"0.5.{n}": profile_for(f"0.5.{n}").graph_replay_seqlen_k for n in range(11, 24)}
    assert {r for r, b in bounds.items() if b == "context_length"} == {f"0.5.{n}" for n in range(16, 24)}
    assert profile_for("0.5.23").policy()["graph_replay_seqlen_k"] == "context_length"
    assert "graph_replay_seqlen_k" not in profile_for("0.5.15").policy()


def test_an_unknown_replay_bound_is_refused():
    from gpu_impl.backend import FlashAttentionBackend

    with pytest.raises(ValueError, match="graph_replay_seqlen_k: must be one of max_seq_len, context_length"):
        FlashAttentionBackend(_scenario("max_seq_len").server, FALCON, None, graph_replay_seqlen_k="host")


def test_conformance_tells_a_release_that_replays_with_host_lengths_from_its_profile(monkeypatch, tmp_path):
    """Negative control: an engine playing 0.5.23 but replaying with max(seq_lens) differs from 0.5.23's profile."""
    from fake_engines import ProfileSUT, install

    from fa3verify import cli

    class HostLengths(ProfileSUT):
        def scenario(self, scenario):
            import dataclasses

            return dataclasses.replace(super().scenario(scenario), graph_replay_seqlen_k="max_seq_len")

    import json

    for fake, expected in ((ProfileSUT, 0), (HostLengths, 1)):
        install(monkeypatch, lambda spec, fake=fake: fake(spec.release))
        out = tmp_path / fake.__name__
        code = cli.main(["conform", "--engine", "sglang==0.5.23", "--cases", "60", "--seed", "3", "--cases-dir",
                         str(out), "--no-assumption-probes", "--json", str(out / "c.json")])
        diffs = json.loads((out / "c.json").read_text())["conform"]["differences"]
        assert code == expected, diffs[:2]
        if expected:
            assert any("max_seqlen_k" in " ".join(map(str, d)) for d in diffs), diffs[:2]


def test_a_case_policy_carries_the_replay_bound_to_every_runner(tmp_path):
    """The case file's ``policy.graph_replay_seqlen_k`` reaches the in-process replay and the multi-rank runner."""
    from fa3verify.commands.replay import load_case, scenario_from_case as replay_scenario
    from gpu_impl.distributed import scenario_from_case as ranks_scenario
    from spec.model.cases import Case

    scn = _scenario("context_length")
    case = Case.from_parts(source="manual", server=scn.server.to_dict(), model=scn.model.to_dict(),
                           policy={"guard": "fixed", "metadata_heads": "attn_tp", "clear_stale_cp_metadata": True,
                                   "graph_replay_seqlen_k": "context_length"},
                           batches=[{"mode": "decode", "seq_lens": [3975, 100]}])
    loaded = load_case(str(case.save(tmp_path)))
    assert loaded.policy["graph_replay_seqlen_k"] == "context_length"
    assert replay_scenario(loaded).graph_replay_seqlen_k == "context_length"
    assert ranks_scenario(loaded).graph_replay_seqlen_k == "context_length"


def test_a_bad_replay_bound_in_a_case_file_names_the_field():
    from spec.model.cases import Case, CaseFormatError

    scn = _scenario("max_seq_len")
    with pytest.raises(CaseFormatError, match="policy.graph_replay_seqlen_k"):
        Case.from_parts(source="manual", server=scn.server.to_dict(), model=scn.model.to_dict(),
                        policy={"guard": "fixed", "graph_replay_seqlen_k": "host"},
                        batches=[{"mode": "decode", "seq_lens": [10]}])
