"""The model of sglang's backend schedules both sides under the FA3 build its release ships.

A release profile (spec/model/engine_profiles.json) names the release; refmodel/fa3_builds.json maps it to the build
read from its kernel wheel; the profile's policy carries that build to the model's backend (precompute and call),
to the pairs conform compares with the engine, to case files and to every label. Judged under upstream's build,
the model's call at a decode batch of 16 and more chose another split count than sglang 0.5.23's stand-in
(0.4.5's get_num_splits bounds a varlen call by its real rows): the negative controls below.
"""

from __future__ import annotations

import pytest

from gpu_impl.config import ServerConfig, get_model
from gpu_impl.guards import load_guard
from gpu_impl.model_pairs import model_pairs
from gpu_impl.scenario import Scenario, Step, run_scenario
from refmodel.fa3_builds import SGLANG_KERNEL_042, SGLANG_KERNEL_045, UPSTREAM
from spec.model.engine_profiles import profile_for

QWEN = get_model("qwen3-30b-a3b")


def _scenario(build: str, batch: int = 16) -> Scenario:
    # tp 4 (8 query / 1 KV heads per rank), eager, 1-token pages; one 32768-token row and short ones
    server = ServerConfig(tp_size=4, page_size=1, cuda_graph=False, context_length=40960)
    return Scenario(server=server, model=QWEN, guard=load_guard("none"), guard_spec="none",
                    steps=[Step("decode", [32768] + [100] * (batch - 1))], fa3_build=build)


def _splits(build: str, batch: int = 16) -> tuple:
    scn = _scenario(build, batch)
    (pair,) = model_pairs(scn, run_scenario(scn))
    (entry,) = [e for e in run_scenario(scn).trace if e.get("mode") == "decode"]
    return pair["s_p"], pair["s_c"], entry["s_p"], entry["s_c"]


def test_each_release_profile_names_the_build_of_its_kernel_wheel():
    builds = {f"0.5.{n}": profile_for(f"0.5.{n}").policy()["fa3_build"] for n in range(11, 24)}
    assert {r for r, b in builds.items() if b == SGLANG_KERNEL_042} == {f"0.5.{n}" for n in range(11, 16)}
    assert {r for r, b in builds.items() if b == SGLANG_KERNEL_045} == {f"0.5.{n}" for n in range(16, 24)}
    assert profile_for("0.5.23").fa3_build == SGLANG_KERNEL_045


def test_the_model_schedules_precompute_and_call_under_the_scenario_s_build():
    # the backend's check and the pairs conform compares are one schedule: equal under every build
    for build in (UPSTREAM, SGLANG_KERNEL_042, SGLANG_KERNEL_045):
        s_p, s_c, trace_p, trace_c = _splits(build)
        assert (s_p, s_c) == (trace_p, trace_c), build
    # 0.4.5 counts the call's 16 real rows; upstream and 0.4.2 one sequence (negative control: the old model)
    assert _splits(SGLANG_KERNEL_045)[:2] != _splits(UPSTREAM)[:2]
    assert _splits(SGLANG_KERNEL_042)[:2] == _splits(UPSTREAM)[:2]


def test_the_model_and_the_engine_stand_in_schedule_the_call_alike():
    # the engine's stand-in records the call sglang makes (q rows = batch, cu_seqlens_q) under the release's build
    import torch

    from gpu_impl.fa3_records import call_schedule_of, record_call

    def engine_s_c(build):
        q = torch.zeros(16, 8, 128, dtype=torch.bfloat16)
        kc = torch.zeros(64, 1, 1, 128, dtype=torch.bfloat16)
        return call_schedule_of(record_call(
            q, kc, kc, cache_seqlens=torch.tensor([32768] + [100] * 15, dtype=torch.int32),
            page_table=torch.zeros(16, 40960, dtype=torch.int32), cu_seqlens_q=torch.arange(17, dtype=torch.int32),
            max_seqlen_q=1, causal=True, read_tensors=True, build=build)).num_splits

    assert _splits(SGLANG_KERNEL_045)[1] == engine_s_c(SGLANG_KERNEL_045)
    # negative control: the model under upstream's build against the 0.4.5 engine is the difference conform saw
    assert _splits(UPSTREAM)[1] != engine_s_c(SGLANG_KERNEL_045)


def test_numerics_runs_are_judged_under_upstream_s_build():
    # the emulated kernel models upstream's FA3: a numerics run's trace is upstream's schedule. Under CUDA graph the
    # call's keys are the context's (40960), so 0.4.5's 16-row bound gives another S_c on short rows
    import dataclasses

    from gpu_impl.kernels import load

    def graph(build):
        scn = _scenario(build)
        return dataclasses.replace(scn, server=dataclasses.replace(scn.server, cuda_graph=True),
                                   steps=[Step("decode", [40, 7] * 8)])

    def s_c(scn, numerics):
        kernel = load("emulated") if numerics else None
        return [e["s_c"] for e in run_scenario(scn, kernel=kernel, numerics=numerics).trace
                if e.get("mode") == "decode"]

    assert s_c(graph(SGLANG_KERNEL_045), False) != s_c(graph(UPSTREAM), False)  # the builds differ here
    assert s_c(graph(SGLANG_KERNEL_045), True) == s_c(graph(UPSTREAM), True) == s_c(graph(UPSTREAM), False)


def test_the_policy_carries_the_build_to_labels_cases_and_replays(tmp_path):
    from fa3verify.policy import load_policy
    from fa3verify.commands.replay import load_case, scenario_from_case
    from spec.model.cases import Case

    p = load_policy("fixed", "tp", fa3_build=SGLANG_KERNEL_042)
    assert p.to_dict()["fa3_build"] == SGLANG_KERNEL_042 and "FA3 build sglang-kernel-0.4.2" in p.label
    assert "fa3_build" not in load_policy("fixed").to_dict() and "FA3 build" not in load_policy("fixed").label
    scn = _scenario(SGLANG_KERNEL_045)
    case = Case.from_parts(source="manual", server=scn.server.to_dict(), model=scn.model.to_dict(),
                           policy={"guard": "none", "metadata_heads": "tp", "clear_stale_cp_metadata": True,
                                   "fa3_build": SGLANG_KERNEL_045},
                           batches=[{"mode": "decode", "seq_lens": [32768] + [100] * 15}])
    loaded = load_case(str(case.save(tmp_path)))
    assert scenario_from_case(loaded).fa3_build == SGLANG_KERNEL_045


def test_a_bad_build_is_refused_naming_the_field_and_the_builds():
    from fa3verify.errors import UsageError
    from fa3verify.policy import load_policy
    from spec.model.cases import Case, CaseFormatError

    with pytest.raises(UsageError, match="fa3_build: must be one of .*sglang-kernel-0.4.5.*got 'nope'"):
        load_policy("fixed", fa3_build="nope")
    scn = _scenario(UPSTREAM)
    with pytest.raises(CaseFormatError, match="policy.fa3_build"):
        Case.from_parts(source="manual", server=scn.server.to_dict(), model=scn.model.to_dict(),
                        policy={"guard": "fixed", "fa3_build": "nope"}, batches=[{"mode": "decode", "seq_lens": [10]}])
    from gpu_impl.backend import FlashAttentionBackend

    with pytest.raises(ValueError, match="build: must be one of"):
        FlashAttentionBackend(scn.server, QWEN, None, fa3_build="nope")


def test_a_model_replay_names_the_build_of_its_case(tmp_path):
    import json

    from fa3verify import cli
    from spec.model.cases import Case

    scn = _scenario(SGLANG_KERNEL_045)
    for build in (SGLANG_KERNEL_045, UPSTREAM):
        policy = {"guard": "none", "metadata_heads": "tp", "clear_stale_cp_metadata": True,
                  **({"fa3_build": build} if build != UPSTREAM else {})}
        case = Case.from_parts(source="manual", server=scn.server.to_dict(), model=scn.model.to_dict(), policy=policy,
                               batches=[{"mode": "decode", "seq_lens": [32768] + [100] * 15}])
        path = case.save(tmp_path / build)
        out = tmp_path / build / "r.json"
        cli.main(["replay", str(path), "--json", str(out)])
        data = json.loads(out.read_text())
        (check,) = [c for c in data["checks"] if c["kind"] == "replay"]
        assert check["message"].endswith(f"[FA3 build {build}]"), check["message"]
