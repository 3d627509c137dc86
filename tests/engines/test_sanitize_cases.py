"""What the sanitizer writes for mismatches other than the eager head-count one, and that each replays to the
same verdict: a CUDA-graph replay's head-count mismatch (a case over the graph's context), and the pairs no case
can express -- a batch-size difference, a num_splits difference, a KV extent neither backend path gives -- whose
pair file replays them (fake FA3 modules over the emulator, a 16-SM device; tests/sanitize_fakes.py)."""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path

import pytest
import torch

import fa3verify.sanitize as sanitize
from fa3verify.cli import main
from fa3verify.sanitize.records import case_for_pair, load_pair
from gpu_impl.fa3_calls import MetadataMismatch
from spec.model.cases import Case

from sanitize_fakes import fakes, forget_fakes, write_fakes  # noqa: F401 - fakes is a fixture
from engines.test_sanitize import HEADS, LENS, STALE, install, tensors





def fa3verify(*args):
    """The command line, run in this process (what it prints and its exit code): the replay reads the files the
    sanitizer wrote, not the fake FA3 modules the test installed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["fa3verify", *args], code, out.getvalue(), err.getvalue())


def only_pair(tmp_path):
    (pair,) = sorted((tmp_path / "out").glob("pair-*.json"))
    return pair


def assert_pair_replays(tmp_path, invariant):
    pair = only_pair(tmp_path)
    pre, call, recorded = load_pair(pair)
    assert recorded[0]["invariant"] == invariant
    out = fa3verify("sanitize", "replay", str(pair))
    assert out.returncode == 1 and invariant in out.stdout, out.stdout + out.stderr
    return pre, call


def test_a_graph_replays_head_count_mismatch_gets_a_case_over_the_graphs_context(fakes, tmp_path):
    s = install(tmp_path)
    import fake_backend

    s.checker.report_causes = False     # the replay-time check alone (the cause at capture: engines/test_sanitize_causes.py)
    capturing = [False]
    s.checker.capturing = lambda: capturing[0]
    width = 128                                                    # pages: the graph's page table spans 2048 tokens
    q, k, v, pt, cs, cu = tensors(width=width)
    buf = torch.zeros(1 + 4 * 4, dtype=torch.int32)
    backend = fake_backend.Backend(STALE)

    def recompute(lens):
        md = backend.metadata(lens, cu, int(lens.max()), 16)
        buf[:md.numel()] = md
        return buf[:md.numel()]

    capturing[0] = True
    backend.decode(q, k, v, pt, torch.ones(4, dtype=torch.int32), cu, recompute(torch.ones(4, dtype=torch.int32)))
    capturing[0] = False
    with pytest.raises(MetadataMismatch, match="SPLIT_BOUND") as info:
        recompute(cs)
    err = info.value
    assert err.call.seqlen_k == width * 16 and err.precompute.max_seqlen_k == max(LENS)
    case = Case.load(err.case_path)
    assert case.server["cuda_graph"] is True and case.server["context_length"] == width * 16
    assert case.batches[0]["seq_lens"] == LENS
    s_p, s_c = case.expected["detail"]["S_p"], case.expected["detail"]["S_c"]
    out = fa3verify("replay", err.case_path, "--json", str(tmp_path / "replay.json"))
    assert out.returncode == 1 and "STILL FAILS" in out.stdout, out.stdout + out.stderr
    text = (tmp_path / "replay.json").read_text()
    assert "SPLIT_BOUND" in text and f"S_p={s_p}" in str(err) and f"S_c={s_c}" in str(err)


def test_a_batch_size_difference_has_no_case_and_its_pair_replays(fakes, tmp_path):
    install(tmp_path)
    import fake_backend

    q, k, v, pt, cs, cu = tensors()
    backend = fake_backend.Backend(HEADS)
    md = backend.metadata(cs[:3], cu[:4], max(LENS), 16)            # 3 sequences precomputed, 4 called (same b4)
    with pytest.raises(MetadataMismatch, match="BATCH_PERMUTATION") as info:
        backend.decode(q, k, v, pt, cs, cu, md)
    assert Path(info.value.case_path).name.startswith("pair-")   # the pair file is what there is to replay
    assert not (tmp_path / "out" / "cases").exists()
    assert_pair_replays(tmp_path, "BATCH_PERMUTATION")


def test_a_num_splits_difference_has_no_case_and_its_pair_replays(fakes, tmp_path):
    install(tmp_path)
    import fake_backend
    import sgl_kernel.flash_attn as fa

    lens = [4096, 16, 16, 16]                                        # the long sequence gets S_p = 4 splits
    q, k, v, pt, cs, cu = tensors(lens)
    md = fake_backend.Backend(HEADS).metadata(cs, cu, max(lens), 16)  # num_splits=0: the heuristic's S_p
    with pytest.raises(MetadataMismatch, match="SPLIT_BOUND") as info:
        fa.flash_attn_with_kvcache(q=q, k_cache=k, v_cache=v, page_table=pt, cache_seqlens=cs, cu_seqlens_q=cu,
                                   max_seqlen_q=1, causal=True, scheduler_metadata=md, num_splits=2)
    assert info.value.call.num_splits == 2 and info.value.precompute.num_splits == 0
    assert not (tmp_path / "out" / "cases").exists()
    pre, call = assert_pair_replays(tmp_path, "SPLIT_BOUND")
    assert "deep check: SPLIT_BOUND" in fa3verify("sanitize", "replay", str(only_pair(tmp_path))).stdout
    assert (pre.num_splits, call.num_splits) == (0, 2) and case_for_pair(pre, call, info.value.violations) is None


def test_a_kv_extent_neither_backend_path_gives_has_no_case_and_its_pair_replays(fakes, tmp_path):
    """Head-count mismatch of 3 sequences with a page table wider than the longest: not eager (it is wider),
    not a CUDA graph (3 is no captured batch size), so the model cannot play it."""
    install(tmp_path)
    import fake_backend

    lens = LENS[:3]
    q, k, v, pt, cs, cu = tensors(lens, width=128)
    backend = fake_backend.Backend(STALE)
    with pytest.raises(MetadataMismatch, match="SPLIT_BOUND") as info:
        backend.decode(q, k, v, pt, cs, cu, backend.metadata(cs, cu, max(lens), 16))
    assert info.value.call.seqlen_k == 128 * 16 and not (tmp_path / "out" / "cases").exists()
    assert_pair_replays(tmp_path, "SPLIT_BOUND")
