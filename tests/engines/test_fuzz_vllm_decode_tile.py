"""Family ``vllm-decode-tile`` (gpu_impl/engines/vllm/strategies.py) and the seeded driver defect of theorem 9's drift.

The defect ``precompute-max-seqlen-q-off-by-one`` (gpu_impl.defects, a hazard control) makes the vLLM driver ask
get_scheduler_metadata for ``max_seqlen_q + 1``; under vLLM's FA3 fork the precompute then chooses another decode
tile. The family must find it within 100 cases on vLLM 0.33.0's own builder, and stay silent without it; the
theorem's own case file replays as still failing. Tests marked ``engine`` skip without the cached environment.
"""

import random

import pytest

from gpu_impl.engines import envs
from vllm_campaign import assert_cli_replays_as_seeded, find_seeded_split

RELEASE = "0.33.0"
DEFECT = "precompute-max-seqlen-q-off-by-one"


def test_the_family_draws_the_forks_decode_tile_boundary():
    from fa3verify.strategies import family

    cases = [family("vllm-decode-tile")(random.Random(i)) for i in range(300)]
    assert {c.model.head_dim for c in cases} == {64, 128}
    at_edge = 0
    for c in cases:
        h, hk = c.model.num_heads // c.server.tp_size, max(1, c.model.num_kv_heads // c.server.tp_size)
        (step,) = c.steps
        q = (step["extend_lens"] or [1])[0]
        at_edge += q == max(1, 64 // (h // hk))
        assert not c.server.cuda_graph and c.server.attn_cp_size == 1 and "sliding_window" not in c.options["vllm"]
    assert at_edge > 100


def test_the_driver_seeds_the_off_by_one_from_outside_vllms_code():
    from gpu_impl.defects import DEFECTS
    from gpu_impl.engines.vllm.host import VLLM_DEFECTS
    from gpu_impl.engines.vllm.driver import check_scenario, seed_defect

    assert DEFECTS[DEFECT].kind == "hazard-control" and VLLM_DEFECTS[DEFECT] == {"precompute_max_seqlen_q_delta": 1}
    seen = {}

    class Front:
        def c_get_scheduler_metadata(self, **a):
            seen.update(a)

    seed_defect(Front(), VLLM_DEFECTS[DEFECT]).c_get_scheduler_metadata(max_seqlen_q=16, num_splits=0)
    assert seen == {"max_seqlen_q": 17, "num_splits": 0}
    with pytest.raises(ValueError, match="defect:"):
        check_scenario({"defect": {"precompute_max_seqlen_q_delta": -1}})


@pytest.fixture(scope="module")
def vllm_sut(engine_sut):
    if not envs.env_ready(RELEASE, engine="vllm"):
        pytest.skip(f"no environment for vllm {RELEASE} under {envs.env_dir(RELEASE, engine='vllm')}")
    return engine_sut(f"vllm=={RELEASE}")  # the test process's shared worker (tests/engine_pool.py)


@pytest.mark.engine
def test_negative_control_the_off_by_one_is_found_within_100_cases_and_replays(vllm_sut, cli_on_engine_pool,
                                                                              tmp_path, capsys):
    from fa3verify.commands.fuzz import fuzz

    case_file, _ = find_seeded_split(vllm_sut, tmp_path / "cases", DEFECT, "vllm-decode-tile", 100, RELEASE)
    assert_cli_replays_as_seeded(case_file, capsys)  # the CLI's replay, on the shared worker
    control = fuzz(sut=vllm_sut, max_cases=100, budget_s=None, out_dir=str(tmp_path / "off"),
                   strategy="vllm-decode-tile", show_progress=False)
    assert control.exit_code == 0 and control.cases == 100  # silent when off: the same draws without the defect


@pytest.mark.engine
def test_the_drift_theorems_case_replays_on_vllms_builder(vllm_sut, cli_on_engine_pool, tmp_path, capsys):
    from spec.theorems.fork_tile import run_fork_tile_theorems

    (r,) = run_fork_tile_theorems(only=["fork-tile-drift"], cases_dir=str(tmp_path))
    assert r.case_file
    assert_cli_replays_as_seeded(r.case_file, capsys)
