"""Shared by the tests of vLLM's split-count findings on a path whose call and precompute disagree (cascade's shared
prefix, DCP's context attention, the V0-era full graphs): the model-level verdict of one varlen precompute and the
call that reads it, under the FA3 build the release ships, and the replay of a finding's case file on its release in
a fresh process, as the docs print it (skipped, naming the setup command, where the release's environment is not
built)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def varlen_verdict(seqused_k, seqlens_q, heads: int, heads_k: int, headdim: int, *, build, precompute_splits: int,
                   call_splits: int, metadata_size: int, **options) -> list:
    """Findings (spec.invariants.check_all) of one step whose precompute asks ``precompute_splits`` and whose call
    passes ``call_splits``: a varlen batch of ``seqused_k`` keys and ``seqlens_q`` query rows per sequence, paged by
    16, under ``build``; ``options`` (``causal``) go to both sides. Both sides' metadata must have ``metadata_size``
    slots (the semaphore and one split count per batch), so a finding is never a SHAPE error."""
    from refmodel import call_inputs, precompute_inputs, resolve_schedule
    from refmodel.prepare import prepare_scheduler
    from spec import invariants

    b, max_q, max_k = len(seqused_k), max(seqlens_q), max(seqused_k)
    pre = resolve_schedule(precompute_inputs(b, max_q, max_k, heads, heads_k, headdim, varlen_q=True, page_size=16,
                                             num_splits=precompute_splits, build=build, **options))
    result = prepare_scheduler(pre, list(seqused_k), seqlens_q=list(seqlens_q))
    call = resolve_schedule(call_inputs(b, max_q, max_k, heads, heads_k, headdim, varlen_q=True, page_size=16,
                                        num_splits=call_splits, total_q=sum(seqlens_q), build=build, **options))
    assert pre.metadata_size == call.metadata_size == metadata_size
    return invariants.check_all(pre, result, call, {"seqused_k": list(seqused_k), "seqlens_q": list(seqlens_q)})


def replay_on_release(case: Path, release: str) -> subprocess.CompletedProcess:
    """``python -m fa3verify replay CASE --engine vllm==RELEASE`` from the repository root (the test skips where the
    release's environment is not built)."""
    from engine_releases import need_vllm

    need_vllm(release)  # $FA3VERIFY_ENGINE_HOME or the default home, as the replay sees it
    return subprocess.run([sys.executable, "-m", "fa3verify", "replay", str(case), "--engine", f"vllm=={release}"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
