"""A FULL CUDA graph the vLLM driver captures on first use leaves the builders' persistent scheduler-metadata buffers,
and the FA3 front's record of the latest precompute, as the previous step's build left them
(``gpu_impl.engines.vllm.graphs.capture_keeps_persistent_metadata``): vLLM captures every graph at start-up, so a
replay whose build writes no metadata (DCP's skipped context attention) reads the previous step's, not a capture's.
Fast (no vLLM); the release-level pins are in tests/engines/test_engine_vllm_v2.py
(``test_dcp_skipped_context_replay_reads_the_previous_step_not_the_capture``)."""

import types

import torch

from gpu_impl.engines.vllm.graphs import capture_keeps_persistent_metadata


def _front(last_md=None):
    return types.SimpleNamespace(last_md=last_md, last_pre="pre" if last_md is not None else None,
                                 recent=[(last_md, "pre")] if last_md is not None else [], handed_out=[])


def _capture(builders, front):
    """What a capture does to the state: every builder's buffer rewritten, the front's latest precompute replaced."""
    for b in builders:
        b.scheduler_metadata.fill_(7)
    front.last_md, front.last_pre, front.recent, front.handed_out = torch.full((3,), 7), "capture", [("c",)], ["c"]


def test_the_previous_step_s_metadata_is_back_after_a_capture_on_first_use():
    step0 = torch.tensor([0, 1, 1, 0, 0], dtype=torch.int32)
    builders = [types.SimpleNamespace(scheduler_metadata=step0.clone()),
                types.SimpleNamespace(scheduler_metadata=torch.arange(5, dtype=torch.int32))]
    front = _front(step0[:3].clone())
    before = dict(vars(front))
    with capture_keeps_persistent_metadata(builders, front):
        _capture(builders, front)
    assert torch.equal(builders[0].scheduler_metadata, step0)
    assert torch.equal(builders[1].scheduler_metadata, torch.arange(5, dtype=torch.int32))
    assert vars(front) == before


def test_a_grouped_builder_s_groups_are_each_kept():
    a, b = (types.SimpleNamespace(scheduler_metadata=torch.zeros(4, dtype=torch.int32)) for _ in range(2))
    grouped = types.SimpleNamespace(groups=[(a, ["l0"]), (b, ["l1"])])
    front = _front(torch.zeros(2, dtype=torch.int32))
    with capture_keeps_persistent_metadata([grouped], front):
        _capture([a, b], front)
    assert not a.scheduler_metadata.any() and not b.scheduler_metadata.any()


def test_before_any_build_the_capture_s_metadata_stays():
    """Negative control: with no earlier build (vLLM's buffer then holds a start-up capture's), nothing is restored;
    the capture's values and record stay."""
    builder = types.SimpleNamespace(scheduler_metadata=torch.zeros(4, dtype=torch.int32))
    front = _front(None)
    with capture_keeps_persistent_metadata([builder], front):
        _capture([builder], front)
    assert builder.scheduler_metadata.tolist() == [7, 7, 7, 7] and front.last_pre == "capture"


def test_a_builder_without_a_persistent_buffer_is_left_alone():
    eager = types.SimpleNamespace(scheduler_metadata=None)
    front = _front(torch.zeros(1, dtype=torch.int32))
    with capture_keeps_persistent_metadata([eager], front):
        pass
    assert eager.scheduler_metadata is None
