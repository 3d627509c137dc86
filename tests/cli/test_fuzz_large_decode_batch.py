"""Family ``large-decode-batch`` and the hazard control of theorem ``total-q-drift`` on the model.

The model plays a release under its kernel build (the profile's ``fa3_build``). With the seeded backend defect
``precompute-max-seqlen-q-two`` the precompute bounds by ``2 * b`` rows under sglang-kernel-0.4.5 while the call
counts its ``b`` real rows: the family must find the overflow; without the defect, and under 0.4.2 (whose
get_num_splits reads no total_q) with it, the same cases pass.
"""

from __future__ import annotations

import random

from fa3verify.commands.fuzz import fuzz
from fa3verify.policy import load_policy
from fa3verify.strategies import family
from gpu_impl.engines.model.sut import ModelSUT
from refmodel.fa3_builds import SGLANG_KERNEL_042, SGLANG_KERNEL_045

DEFECT = "precompute-max-seqlen-q-two"


def test_the_family_draws_large_decode_batches():
    cases = [c for c in (family("large-decode-batch")(random.Random(i)) for i in range(100)) if c is not None]
    assert len(cases) > 80
    for c in cases:
        (step,) = c.steps
        assert step["mode"] == "decode" and 16 <= len(step["seq_lens"]) <= 256
    assert {c.server.cuda_graph for c in cases} == {True, False}


def _fuzz(build, defects, tmp_path):
    sut = ModelSUT(policy=load_policy("fixed", "attn_tp", fa3_build=build), defects=defects)
    return fuzz(sut, seed=0, budget_s=None, max_cases=40, out_dir=str(tmp_path), show_progress=False,
                strategy="large-decode-batch", shrink_steps=0)


def test_the_family_finds_the_seeded_total_q_drift_under_0_4_5(tmp_path):
    summary = _fuzz(SGLANG_KERNEL_045, {DEFECT}, tmp_path / "seeded")
    assert summary.exit_code == 1
    found = {f.invariant for f in summary.findings}
    assert "SPLIT_BOUND" in found or "COMBINE_CAPACITY" in found, found


def test_without_the_defect_or_under_0_4_2_the_same_cases_pass(tmp_path):
    assert _fuzz(SGLANG_KERNEL_045, set(), tmp_path / "plain").exit_code == 0
    assert _fuzz(SGLANG_KERNEL_042, {DEFECT}, tmp_path / "old-build").exit_code == 0
