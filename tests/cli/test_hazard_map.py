"""Tests of the hazard map: refmodel-derived cells, the worked example, the grid, the PNG and the CLI."""

import json
import random
from pathlib import Path

import pytest

from fa3verify import exitcodes
from fa3verify.cli import main
from fa3verify.errors import UsageError
from fa3verify.commands.hazard_map import (GPU_SM_COUNTS, WORKED_EXAMPLE, cell, compute_hazard_map, length_grid,
                                           panel_specs, render)
from gpu_impl.config import MODELS, ModelConfig, ServerConfig
from refmodel.fa3_scheduler import call_inputs, ceil_div, resolve_schedule

REPO = Path(__file__).resolve().parent.parent.parent
QWEN = MODELS["qwen3-30b-a3b"]
CP4 = ServerConfig(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag")


def reference_cell(model: ModelConfig, server: ServerConfig, seq_lens,
                   metadata_heads: str = "tp") -> tuple:
    """(S_p, split counts, S_c) straight from ``schedule_and_prepare`` and ``resolve_schedule(call_inputs())``
    with the actual batch, uncached: the definition the fast path of :func:`cell` is tested against."""
    from refmodel.metadata import schedule_and_prepare  # imports torch

    lens = [int(x) for x in seq_lens]
    b = len(lens)
    h, hk = server.precompute_heads(model) if metadata_heads == "tp" else server.layer_heads(model)
    ch, chk = server.layer_heads(model)
    page = server.page_size
    sched, result = schedule_and_prepare(
        b, 1, max(max(lens), 1), h, hk, model.head_dim, lens, qkv_dtype=model.dtype, headdim_v=model.head_dim_v,
        cu_seqlens_q=list(range(b + 1)), page_size=page, causal=True, num_splits=server.backend_num_splits,
        num_sm=server.num_sm)
    call = resolve_schedule(call_inputs(
        b, 1, ceil_div(max(lens), page) * page, ch, chk, model.head_dim, headdim_v=model.head_dim_v,
        qkv_dtype=model.dtype, varlen_q=True, has_cache_seqlens=True, page_size=page, causal=True,
        num_splits=server.backend_num_splits, num_sm=server.num_sm))
    return sched.num_splits, tuple(result.num_splits), call.num_splits


@pytest.fixture(scope="module")
def qwen_map():
    return compute_hazard_map("qwen3-30b-a3b", 132)


def test_worked_example_cell_overflows():
    c = cell(QWEN, CP4, [32768] + [100] * 7)
    assert (c.s_p, c.s_c, c.max_split) == (109, 29, 86)
    assert c.precompute_heads == (8, 1) and c.call_heads == (32, 4)
    assert c.margin == 57 and c.overflow


def test_eight_long_sequences_do_not_overflow():
    c = cell(QWEN, CP4, [32768] * 8)
    assert c.max_split == 15 and c.s_c == 29
    assert c.margin <= 0 and not c.overflow


def test_splits_ignored_when_call_does_not_split():
    # Fixed num_splits=1 (deterministic inference): S_c == 1, the metadata's counts are never read.
    det = ServerConfig(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag",
                       enable_deterministic_inference=True)
    c = cell(QWEN, det, [32768] + [100] * 7)
    assert c.s_c == 1 and c.splits_ignored and not c.overflow


def test_fast_path_matches_schedule_and_prepare():
    """cell() shares the schedule across batch sizes; it must equal refmodel's direct computation."""
    rng = random.Random(1)
    servers = [CP4, ServerConfig(tp_size=4, attn_cp_size=2, enable_prefill_cp=True, cp_strategy="zigzag",
                                 page_size=16, num_sm=114),
               ServerConfig(tp_size=8, dp_size=4, enable_dp_attention=True, page_size=64, num_sm=78),
               ServerConfig(tp_size=2, num_sm=108)]
    for _ in range(40):
        server = rng.choice(servers)
        model = rng.choice([MODELS[m] for m in ("qwen3-30b-a3b", "llama-3-8b", "starcoder", "llama-3.2-1b")])
        if server.violations(model):
            continue
        lens = [rng.choice([rng.randint(1, 300), rng.randint(1000, 131072)]) for _ in range(rng.randint(1, 40))]
        c = cell(model, server, lens)
        assert (c.s_p, c.splits, c.s_c) == reference_cell(model, server, lens), (model.name, server, lens)


def test_call_split_count_does_not_depend_on_batch_size():
    from refmodel.fa3_scheduler import call_inputs, resolve_schedule

    for seqlen_k in (1024, 9000, 32768, 131072):
        counts = {resolve_schedule(call_inputs(b, 1, seqlen_k, 32, 4, 128, varlen_q=True, page_size=1,
                                               causal=True)).num_splits for b in (1, 7, 64)}
        assert len(counts) == 1


def test_length_grid_is_log_spaced_and_hits_powers_of_two():
    xs = length_grid()
    assert xs[0] == 1024 and xs[-1] == 131072 and 32768 in xs
    assert xs == sorted(set(xs)) and 40 <= len(xs) <= 80


def test_panels_for_tp4():
    labels = [p.label for p in panel_specs(QWEN, 4, 1, 132)]
    assert labels == ["tp=4 (no CP, no DP attention)", "tp=4, prefill CP attn_cp=2", "tp=4, prefill CP attn_cp=4",
                      "tp=4, DP attention dp=2", "tp=4, DP attention dp=4"]


def test_map_grid(qwen_map):
    assert len(qwen_map.panels) == 5
    assert qwen_map.companions == list(range(64))
    cp4 = qwen_map.panel("cp", attn_cp=4)
    y, x = qwen_map.index_of(32768, 7)
    assert qwen_map.lengths[x] == 32768
    assert cp4.margin[y][x] > 0 and cp4.overflow_grid()[y][x]
    assert cp4.margin[y][x] == 57
    # Same heads on both sides: never an overflow. The pre-fix guard disables DP attention's precompute.
    assert qwen_map.panel("cp", attn_cp=1).overflow_cells == 0
    assert qwen_map.panel("cp", attn_cp=2).overflow_cells > 0
    for dp in (2, 4):
        panel = qwen_map.panel("dp", dp=dp)
        assert not panel.precomputed and panel.overflow_cells == 0
    we = qwen_map.worked_example()
    assert we["overflow"] and (we["s_p"], we["s_c"], we["max_split"]) == (109, 29, 86)


def test_guard_none_and_root_cause_fix():
    small = [1024, 4096, 32768, 131072]
    none = compute_hazard_map("qwen3-30b-a3b", 132, guard="none", lengths=small, max_companions=8)
    assert none.panel("dp", dp=4).precomputed and none.panel("dp", dp=4).overflow_cells > 0
    fixed_heads = compute_hazard_map("qwen3-30b-a3b", 132, guard="none", metadata_heads="attn_tp",
                                     lengths=small, max_companions=8)
    assert all(p.overflow_cells == 0 for p in fixed_heads.panels)
    fixed_guard = compute_hazard_map("qwen3-30b-a3b", 132, guard="fixed", lengths=small, max_companions=8)
    assert all(p.overflow_cells == 0 for p in fixed_guard.panels)


def test_render_png_has_panels(qwen_map, tmp_path):
    import matplotlib.image as mpimg

    out = render(qwen_map, str(tmp_path / "h.png"))
    data = Path(out).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = mpimg.imread(out)
    # 3 columns x 2 rows of panels: wider than tall, and big enough to read.
    assert img.shape[1] > img.shape[0] > 500


def test_cli_writes_png_and_json(tmp_path, capsys):
    png, js = tmp_path / "hazard.png", tmp_path / "hazard.json"
    rc = main(["hazard-map", "--model", "qwen3-30b-a3b", "--sm", "132", "--out", str(png), "--json", str(js),
               "--max-companions", "15"])
    assert rc == exitcodes.PASS
    assert png.read_bytes()[:4] == b"\x89PNG"
    data = json.loads(js.read_text())
    assert data["schema"] == "fa3verify.hazard-map/1"
    assert [p["ratio"] for p in data["panels"]] == ["1/1", "1/2", "1/4", "1/2", "1/4"]
    assert data["worked_example"]["margin"] == 57
    out = capsys.readouterr().out
    assert "OVERFLOW" in out and "attn_cp=4" in out


@pytest.mark.parametrize("args,field,allowed", [
    (["--model", "gpt-9", "--sm", "132"], "--model", "qwen3-30b-a3b"),
    (["--model", "qwen3-30b-a3b", "--sm", "100"], "--sm", "132"),
    (["--model", "qwen3-30b-a3b", "--sm", "132", "--tp", "3"], "--tp", "4"),
    (["--model", "qwen3-30b-a3b", "--sm", "132", "--page-size", "0"], "--page-size", ">= 1"),
    (["--model", "falcon-7b", "--sm", "132", "--tp", "4"], "--tp", "try one of"),
])
def test_cli_bad_input_exits_2(args, field, allowed, tmp_path, capsys):
    rc = main(["hazard-map", *args, "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc == exitcodes.USAGE
    assert field in err and allowed in err
    assert not (tmp_path / "x.png").exists()


def test_validation_raises_usage_error():
    with pytest.raises(UsageError, match="--sm: .*132"):
        compute_hazard_map("qwen3-30b-a3b", 7)


def test_sm_counts_match_fuzzer():
    from fa3verify.strategies import SM_COUNTS

    assert tuple(GPU_SM_COUNTS) == tuple(SM_COUNTS)


def test_committed_png_is_shown_in_concepts():
    png = REPO / "docs" / "img" / "hazard-qwen3-30b-a3b-sm132.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "img/hazard-qwen3-30b-a3b-sm132.png" in (REPO / "docs" / "concepts.md").read_text()
    assert WORKED_EXAMPLE["model"] == "qwen3-30b-a3b"
