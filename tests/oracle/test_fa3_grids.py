"""FA3's own test grids (kvcache, combine, output, varlen) on the emulated FA3, sampled at CPU sizes (tests/fa3_grids.py).

A few items per grid, drawn with a fixed seed, must pass FA3's tolerance rules; the counts over larger samples
are measured with ``python tests/fa3_grids.py`` (docs/emulator.md). Each grid's check is shown to fail on a
seeded defect of the emulator (negative controls): query rotary at the wrong position, appended KV not written,
``attention_chunk`` dropped, FP8 descales dropped, the combine reading two splits of five.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fa3_grids as grids  # noqa: E402
from gpu_impl.kernels import call_features, fa3_interface  # noqa: E402

#: items per grid in the suite (the whole file: 5.9 s of CPU on the project's 2-core machine)
SUITE_SAMPLES = {"kvcache": 2, "combine": 6, "output": 2, "varlen": 2}

KV_ROTARY = dict(dtype="bfloat16", mha_type="gqa", new_kv=True, causal=True, local=False,
                 seqlen_new_eq_seqlen_q=True, rotary_interleaved=False, rotary_fraction=1.0, page_size=None,
                 has_leftpad=False, has_batch_idx=True, varlen_q=False, d=128, seqlen_q=16, seqlen_k=64)
OUT_CAUSAL = dict(dtype="bfloat16", mha_type="mha", has_qv=False, softcap=0.0, local=False, causal=True,
                  add_unused=False, d=128, seqlen_q=32, seqlen_k=64)
COMBINE = dict(dtype="float32", d=64, seqlen=32, num_splits=5)


def _items():
    for grid, count in SUITE_SAMPLES.items():
        for i, item in enumerate(grids.sample(grid, count, seed=11)):
            yield pytest.param(grid, item, id=f"{grid}-{i}")


@pytest.mark.parametrize("grid,item", list(_items()))
def test_sampled_grid_item_passes_fa3s_rule(grid, item):
    outcome = grids.run_item(grid, item)
    if outcome.status == "unsupported":
        pytest.skip(f"unsupported by the emulator: {outcome.detail}")
    assert outcome.status in ("pass", "undefined", "fa3_test_disagrees"), f"{item}: {outcome.detail}"


def test_a_window_covering_the_sequence_follows_fa3s_kernel_not_its_test():
    """FA3's kernel rotates q at one position when mha_fwd resolves a whole-sequence window away; the emulator
    does the same (FA3's test reference would move q's positions: the item is reported, not passed)."""
    item = {"dtype": "bfloat16", "mha_type": "mqa", "new_kv": True, "causal": False, "local": True,
            "seqlen_new_eq_seqlen_q": False, "rotary_interleaved": True, "rotary_fraction": 0.5, "page_size": 128,
            "has_leftpad": False, "has_batch_idx": True, "varlen_q": False, "d": 128, "seqlen_q": 64,
            "seqlen_k": 128}
    outcome = grids.run_item("kvcache", {**item, "dtype": "float8_e4m3fn"})
    assert outcome.status == "fa3_test_disagrees" and "window (127, 109)" in outcome.detail, outcome


def test_feature_items_pass():
    """The items the negative controls use pass on the emulator as built."""
    for grid, item in (("kvcache", KV_ROTARY), ("output", OUT_CAUSAL), ("output", {**OUT_CAUSAL, "dtype": "float8_e4m3fn"}),
                       ("combine", COMBINE)):
        outcome = grids.run_item(grid, item)
        assert outcome.status == "pass", (grid, item, outcome.detail)


def test_combine_of_one_split_is_reported_undefined_not_passed():
    outcome = grids.run_item("combine", {**COMBINE, "num_splits": 1})
    assert outcome.status == "undefined" and "passes split 0 through" in outcome.detail


# ----------------------------------------------------------------------------------------------------------
# Negative controls: a seeded defect makes the grid's check fail
# ----------------------------------------------------------------------------------------------------------

def test_query_rotary_at_the_wrong_position_is_caught(monkeypatch):
    real = call_features.rotary_positions_q
    monkeypatch.setattr(call_features, "rotary_positions_q", lambda start, rows, local: real(start + 1, rows, local))
    outcome = grids.run_item("kvcache", KV_ROTARY)
    assert outcome.status == "fail" and "max error" in outcome.detail


def test_appended_kv_not_written_is_caught(monkeypatch):
    monkeypatch.setattr(call_features, "append_kv", lambda *args, **kwargs: None)
    outcome = grids.run_item("kvcache", {**KV_ROTARY, "rotary_fraction": 0.0})
    assert outcome.status == "fail" and "appended" in outcome.detail


def test_attention_chunk_dropped_is_caught(monkeypatch):
    kernel = fa3_interface.kernel()
    real = kernel.flash_attn_with_kvcache

    def no_chunk(*args, **kwargs):
        kwargs["attention_chunk"] = 0
        return real(*args, **kwargs)

    monkeypatch.setattr(kernel, "flash_attn_with_kvcache", no_chunk)
    outcome = grids.run_item("output", OUT_CAUSAL)
    assert outcome.status == "fail" and "chunk=" in outcome.detail and "chunk=0 " not in outcome.detail


def test_fp8_descales_dropped_is_caught(monkeypatch):
    kernel = fa3_interface.kernel()
    real = kernel.flash_attn_with_kvcache

    def no_descale(*args, **kwargs):
        kwargs.update(q_descale=None, k_descale=None, v_descale=None)
        return real(*args, **kwargs)

    monkeypatch.setattr(kernel, "flash_attn_with_kvcache", no_descale)
    outcome = grids.run_item("output", {**OUT_CAUSAL, "dtype": "float8_e4m3fn"})
    assert outcome.status == "fail" and "max error" in outcome.detail


def test_combine_reading_too_few_splits_is_caught(monkeypatch):
    from refmodel.combine import flash_attn_combine

    monkeypatch.setattr(fa3_interface, "_ref_combine", lambda *a, **kw: flash_attn_combine(*a, capacity=2, **kw))
    outcome = grids.run_item("combine", COMBINE)
    assert outcome.status == "fail"
