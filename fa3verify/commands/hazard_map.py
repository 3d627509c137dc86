"""fa3verify hazard-map: where reusing precomputed FA3 scheduler metadata overflows the call's split buffers (a PNG
heatmap per CP/DP configuration, and the grid as JSON).

For one model and GPU, every cell is one decode batch -- a longest sequence of length ``L`` (x axis,
log-spaced) plus ``n`` short companions of ``short_len`` tokens (y axis) -- under one server
configuration (a panel). The value of a cell is

    margin = max over the batch of the split count in the precomputed metadata - S_c

where ``S_c`` is the split count the call itself derives (it sizes ``out_accum``/``lse_accum``). A
positive margin means the main kernel writes, and the combine reads, past the end of those buffers
(the modelled backend's PR #30439). When ``S_c == 1`` the call ignores the metadata's split counts: such cells are safe
whatever the margin, and are drawn grey.

Everything comes from refmodel's formulas, with the arguments the modelled backend
(:mod:`gpu_impl.backend`) uses: the precompute is ``refmodel.metadata.schedule_and_prepare`` with
``max_seqlen_q=1``, ``max_seqlen_k=L``, ``cu_seqlens_q=arange(b+1)``, ``causal=True``, the backend's
``num_splits`` and, under the pre-fix policy, the modelled backend's heads ``H // tp`` and ``max(1, Hk // tp)``; the
call is ``resolve_schedule(call_inputs(...))`` with the layer's heads ``H // attn_tp`` and
``max(1, Hk // attn_tp)`` and a page table as wide as the longest sequence (eager decode).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
import time
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence

from gpu_impl.config import MODELS, ModelConfig, ServerConfig
from refmodel.fa3_scheduler import call_inputs, ceil_div, precompute_inputs, resolve_schedule
from refmodel.prepare import prepare_scheduler

from gpu_impl.plugin import engine_phrase

from ..errors import UsageError
from ..outputs import write_output

SCHEMA = "fa3verify.hazard-map/1"

#: The map's choices and defaults (hazard_map.json, with why each holds).
_DATA = json.loads(Path(__file__).with_name("hazard_map.json").read_text())
GPU_SM_COUNTS = {int(n): gpu for n, gpu in _DATA["gpu_sm_counts"].items()}
TP_SIZES, GUARDS, METADATA_HEADS = tuple(_DATA["tp_sizes"]), tuple(_DATA["guards"]), tuple(_DATA["metadata_heads"])
DEFAULT_SHORT_LEN, DEFAULT_MAX_COMPANIONS, DEFAULT_MIN_LEN, DEFAULT_MAX_LEN, POINTS_PER_OCTAVE = (
    _DATA["defaults"][k] for k in ("short_len", "max_companions", "min_len", "max_len", "points_per_octave"))
WORKED_EXAMPLE = dict(_DATA["worked_example"])


@dataclass(frozen=True)
class CellResult:
    """What reusing the precomputed metadata does to one decode call."""

    precomputed: bool           # False when the guard disables the precompute
    s_p: int                    # split count the precompute resolved (caps the per-batch counts)
    s_c: int                    # split count the call resolves: rows of its partial buffers
    splits: tuple               # per-batch split counts in the metadata (virtual-batch order)
    precompute_heads: tuple
    call_heads: tuple

    @property
    def max_split(self) -> int:
        return max(self.splits) if self.splits else 0

    @property
    def margin(self) -> int:
        """Largest metadata split count minus S_c: > 0 means past the end of the call's buffers."""
        return self.max_split - self.s_c

    @property
    def splits_ignored(self) -> bool:
        """S_c == 1: the call runs the non-split kernel and never reads the metadata's split counts."""
        return self.s_c == 1

    @property
    def overflow(self) -> bool:
        return self.precomputed and not self.splits_ignored and self.margin > 0


@lru_cache(maxsize=None)
def _precompute_schedule(max_seqlen_k: int, heads: tuple, head_dim: int, head_dim_v: int, dtype: str,
                         page_size: int, num_splits: int, num_sm: int):
    """The precompute's resolved schedule for a batch of one; see :func:`_precompute_splits`."""
    inputs = precompute_inputs(1, 1, max_seqlen_k, heads[0], heads[1], head_dim, qkv_dtype=dtype,
                               headdim_v=head_dim_v, varlen_q=True, page_size=page_size, causal=True,
                               num_splits=num_splits, num_sm=num_sm)
    return resolve_schedule(inputs)


@lru_cache(maxsize=None)
def _precompute_splits(seq_lens: tuple, heads: tuple, head_dim: int, head_dim_v: int, dtype: str,
                       page_size: int, num_splits: int, num_sm: int) -> tuple:
    """(S_p, per-batch split counts) of the modelled backend's get_scheduler_metadata call for one decode batch.

    Equal to ``refmodel.metadata.schedule_and_prepare(b, 1, max(seq_lens), h, h_k, d, seq_lens,
    cu_seqlens_q=arange(b+1), page_size=..., causal=True, ...)`` (tests check it), computed faster: FA3's
    host-side decisions (split heuristic, tiles, pack) do not depend on the batch size -- the precompute is
    varlen, so ``get_num_splits`` counts one batch -- so the schedule is resolved once per (max_seqlen_k,
    heads) and only the prepare step runs per batch.
    """
    b = len(seq_lens)
    base = _precompute_schedule(max(max(seq_lens), 1), heads, head_dim, head_dim_v, dtype, page_size,
                                num_splits, num_sm)
    schedule = dataclasses.replace(base, inputs=dataclasses.replace(base.inputs, batch_size=b))
    result = prepare_scheduler(schedule, list(seq_lens), seqlens_q=[1] * b)
    return schedule.num_splits, tuple(int(s) for s in result.num_splits)


@lru_cache(maxsize=None)
def _call_splits(seqlen_k: int, heads: tuple, head_dim: int, head_dim_v: int, dtype: str,
                 page_size: int, num_splits: int, num_sm: int) -> int:
    """S_c: the split count the layer's flash_attn_with_kvcache call resolves from its own shapes.

    The decode call is varlen (cache_seqlens, cu_seqlens_q), so FA3's heuristic counts one batch and S_c
    does not depend on the batch size (tests check it); it is resolved here for a batch of one.
    """
    inputs = call_inputs(1, 1, seqlen_k, heads[0], heads[1], head_dim, headdim_v=head_dim_v,
                         qkv_dtype=dtype, varlen_q=True, has_cache_seqlens=True, page_size=page_size,
                         causal=True, num_splits=num_splits, num_sm=num_sm)
    return resolve_schedule(inputs).num_splits


def cell(model: ModelConfig, server: ServerConfig, seq_lens: Sequence[int], metadata_heads: str = "tp",
         precomputed: bool = True) -> CellResult:
    """Reuse of precomputed metadata for one eager decode batch (`seq_lens`) on one attention rank."""
    lens = tuple(int(x) for x in seq_lens)
    if not lens or min(lens) < 1:
        raise UsageError(f"seq_lens: need at least one sequence, each of length >= 1, got {list(lens)}")
    call_heads = server.layer_heads(model)
    pre_heads = server.precompute_heads(model) if metadata_heads == "tp" else call_heads
    page = server.page_size
    width = ceil_div(max(lens), page) * page        # page_table.size(1) * page_size
    num_splits = server.backend_num_splits
    dims = (model.head_dim, model.head_dim_v, model.dtype)
    s_p, splits = _precompute_splits(lens, pre_heads, *dims, page, num_splits, server.num_sm)
    s_c = _call_splits(width, call_heads, *dims, page, num_splits, server.num_sm)
    return CellResult(precomputed=precomputed, s_p=s_p, s_c=s_c, splits=splits,
                      precompute_heads=tuple(pre_heads), call_heads=tuple(call_heads))


@dataclass(frozen=True)
class PanelSpec:
    """One server configuration of the map: prefill CP ("cp") or DP attention ("dp") at one attn_tp/tp ratio."""

    kind: str
    server: ServerConfig

    @property
    def ratio(self) -> Fraction:
        return Fraction(self.server.attn_tp_size, self.server.tp_size)

    @property
    def label(self) -> str:
        s = self.server
        if self.kind == "dp":
            return f"tp={s.tp_size}, DP attention dp={s.dp_size}"
        if s.attn_cp_size > 1:
            return f"tp={s.tp_size}, prefill CP attn_cp={s.attn_cp_size}"
        return f"tp={s.tp_size} (no CP, no DP attention)"


def panel_specs(model: ModelConfig, tp: int, page_size: int, num_sm: int) -> list[PanelSpec]:
    """Prefill-CP panels for every attn_cp dividing tp, then DP-attention panels for every dp > 1 dividing tp.

    Configurations that break the domain's assumptions for `model` (e.g. heads not divisible) are left out.
    """
    specs = []
    for cp in (c for c in TP_SIZES if c <= tp and tp % c == 0):
        specs.append(PanelSpec("cp", ServerConfig(tp_size=tp, attn_cp_size=cp, enable_prefill_cp=cp > 1,
                                                  cp_strategy="zigzag" if cp > 1 else None,
                                                  page_size=page_size, num_sm=num_sm)))
    for dp in (d for d in TP_SIZES if 1 < d <= tp and tp % d == 0):
        specs.append(PanelSpec("dp", ServerConfig(tp_size=tp, dp_size=dp, enable_dp_attention=True,
                                                  page_size=page_size, num_sm=num_sm)))
    return [p for p in specs if not p.server.violations(model)]


def length_grid(min_len: int = DEFAULT_MIN_LEN, max_len: int = DEFAULT_MAX_LEN,
                per_octave: int = POINTS_PER_OCTAVE) -> list[int]:
    """Log-spaced lengths from min_len to max_len, `per_octave` points per doubling (powers of two included)."""
    octaves = math.log2(max_len / min_len)
    n = int(round(octaves * per_octave))
    values = sorted({int(round(min_len * 2 ** (i / per_octave))) for i in range(n + 1)} | {min_len, max_len})
    return [v for v in values if min_len <= v <= max_len]


@dataclass
class Panel:
    """One panel's grid: margin[y][x], S_c per x, whether the call ignores the metadata's splits per x."""

    spec: PanelSpec
    precomputed: bool
    precompute_heads: tuple
    call_heads: tuple
    margin: list = field(default_factory=list)        # [companions][length index]
    s_p: list = field(default_factory=list)           # [companions][length index]
    s_c: list = field(default_factory=list)           # [length index]

    @property
    def splits_ignored(self) -> list:
        return [s == 1 for s in self.s_c]

    def overflow_grid(self) -> list:
        """[companions][length index] -> True where the cell overflows the call's buffers."""
        ignored = self.splits_ignored
        return [[self.precomputed and not ignored[i] and m > 0 for i, m in enumerate(row)] for row in self.margin]

    @property
    def overflow_cells(self) -> int:
        return sum(sum(row) for row in self.overflow_grid())

    @property
    def worst_margin(self) -> int:
        ignored = self.splits_ignored
        values = [m for row in self.margin for i, m in enumerate(row) if not ignored[i]]
        return max(values) if values else 0

    def to_dict(self) -> dict:
        return {"label": self.spec.label, "kind": self.spec.kind, "server": self.spec.server.to_dict(),
                "attn_tp_size": self.spec.server.attn_tp_size,
                "ratio": f"{self.spec.ratio.numerator}/{self.spec.ratio.denominator}",
                "precomputed": self.precomputed, "precompute_heads": list(self.precompute_heads),
                "call_heads": list(self.call_heads), "s_c": self.s_c, "splits_ignored": self.splits_ignored,
                "s_p": self.s_p, "margin": self.margin, "overflow": self.overflow_grid(),
                "overflow_cells": self.overflow_cells, "worst_margin": self.worst_margin}


@dataclass
class HazardMap:
    """The whole map: grid axes, one Panel per configuration, and the policy it was drawn under."""

    model: ModelConfig
    num_sm: int
    page_size: int
    tp: int
    guard: str
    metadata_heads: str
    short_len: int
    lengths: list
    companions: list
    panels: list

    def panel(self, kind: str, attn_cp: int = 1, dp: int = 1) -> Panel:
        """The panel of one configuration (KeyError when the map has none)."""
        for p in self.panels:
            s = p.spec.server
            if p.spec.kind == kind and s.attn_cp_size == attn_cp and (kind != "dp" or s.dp_size == dp):
                return p
        raise KeyError(f"no {kind} panel with attn_cp={attn_cp}, dp={dp}")

    def index_of(self, length: int, companions: int) -> tuple:
        """(y, x) grid indices of a batch: nearest length on the log grid, exact companion count."""
        x = min(range(len(self.lengths)), key=lambda i: abs(math.log(self.lengths[i] / length)))
        return self.companions.index(companions), x

    @property
    def policy_label(self) -> str:
        heads = f"H//tp, max(1,Hk//tp) ({engine_phrase('modelled')} before the fix)" if self.metadata_heads == "tp" \
            else "H//attn_tp (root-cause fix)"
        return f"guard {self.guard}, metadata heads {heads}"

    def worked_example(self) -> Optional[dict]:
        """docs/facts-fa3.md's worked example's cell, when this map has its panel and batch shape."""
        w = WORKED_EXAMPLE
        if self.model.name != w["model"] or self.tp != w["tp_size"] or self.short_len != w["short_len"]:
            return None
        try:
            panel = self.panel("cp", attn_cp=w["attn_cp_size"])
        except KeyError:
            return None
        y, x = self.index_of(w["long_len"], w["companions"])
        if self.lengths[x] != w["long_len"]:
            return None
        c = cell(self.model, panel.spec.server, [w["long_len"]] + [w["short_len"]] * w["companions"],
                 self.metadata_heads, panel.precomputed)
        return {"panel": panel.spec.label, "long_len": w["long_len"], "companions": w["companions"],
                "short_len": w["short_len"], "x_index": x, "y_index": y, "s_p": c.s_p, "s_c": c.s_c,
                "max_split": c.max_split, "margin": c.margin, "overflow": c.overflow}

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "model": self.model.to_dict(), "num_sm": self.num_sm,
                "gpu": GPU_SM_COUNTS.get(self.num_sm, ""), "page_size": self.page_size, "tp_size": self.tp,
                "policy": {"guard": self.guard, "metadata_heads": self.metadata_heads},
                "short_len": self.short_len, "x_longest_len": self.lengths, "y_companions": self.companions,
                "value": "max per-batch split count in the metadata minus S_c (overflow when > 0 and S_c > 1)",
                "panels": [p.to_dict() for p in self.panels], "worked_example": self.worked_example(),
                "int32_split_band": self.int32_split_band()}

    def int32_split_band(self) -> Optional[dict]:
        """FA3's own int-overflow band for this model's call heads (None for an MLA model: no FA3 call here)."""
        if self.model.is_mla or not self.panels:
            return None
        return int32_split_hazard(self.model, self.num_sm, tuple(self.panels[0].call_heads))


def validate(model: str, num_sm: int, page_size: int = 1, tp: int = 4, guard: str = "pre-fix",
             metadata_heads: str = "tp", short_len: int = DEFAULT_SHORT_LEN,
             max_companions: int = DEFAULT_MAX_COMPANIONS) -> ModelConfig:
    """Check the map's parameters; UsageError names the field and the allowed values."""
    if model not in MODELS:
        raise UsageError(f"--model: unknown model {model!r}; allowed: {', '.join(sorted(MODELS))}")
    if num_sm not in GPU_SM_COUNTS:
        allowed = ", ".join(f"{n} ({name})" for n, name in GPU_SM_COUNTS.items())
        raise UsageError(f"--sm: {num_sm} is not the SM count of a supported GPU; allowed: {allowed}")
    if not isinstance(page_size, int) or page_size < 1:
        raise UsageError(f"--page-size: must be an integer >= 1, got {page_size!r}")
    if tp not in TP_SIZES:
        raise UsageError(f"--tp: must be one of {', '.join(map(str, TP_SIZES))}, got {tp!r}")
    if guard not in GUARDS:
        raise UsageError(f"--guard: must be one of {', '.join(GUARDS)}, got {guard!r}")
    if metadata_heads not in METADATA_HEADS:
        raise UsageError(f"--metadata-heads: must be one of {', '.join(METADATA_HEADS)}, got {metadata_heads!r}")
    if not isinstance(short_len, int) or short_len < 1:
        raise UsageError(f"--short-len: must be an integer >= 1, got {short_len!r}")
    if not isinstance(max_companions, int) or not 0 <= max_companions <= 255:
        raise UsageError(f"--max-companions: must be an integer in 0..255, got {max_companions!r}")
    return MODELS[model]


def compute_hazard_map(model: str, num_sm: int, page_size: int = 1, tp: int = 4, guard: str = "pre-fix",
                       metadata_heads: str = "tp", short_len: int = DEFAULT_SHORT_LEN,
                       max_companions: int = DEFAULT_MAX_COMPANIONS,
                       lengths: Optional[Sequence[int]] = None) -> HazardMap:
    """Compute every panel's grid from refmodel's formulas (cached per distinct precompute and call)."""
    from gpu_impl.guards import guard_disables_precompute, load_guard

    cfg = validate(model, num_sm, page_size, tp, guard, metadata_heads, short_len, max_companions)
    specs = panel_specs(cfg, tp, page_size, num_sm)
    if not specs:
        raise UsageError(f"--tp: no valid configuration of {model!r} (H={cfg.num_heads}, Hk={cfg.num_kv_heads}) "
                         f"with tp={tp}; try one of {', '.join(str(t) for t in TP_SIZES if t != tp)}")
    xs = list(lengths) if lengths is not None else length_grid()
    ys = list(range(max_companions + 1))
    guard_fn = load_guard(guard)
    panels = []
    for spec in specs:
        # MLA models never precompute FA3 metadata (flashattention_backend.py); nor does a disabling guard.
        precomputed = not cfg.is_mla and not guard_disables_precompute(guard_fn, spec.server)
        first = cell(cfg, spec.server, [xs[0]], metadata_heads, precomputed)
        panel = Panel(spec=spec, precomputed=precomputed, precompute_heads=first.precompute_heads,
                      call_heads=first.call_heads)
        for n in ys:
            row_margin, row_sp = [], []
            for x in xs:
                c = cell(cfg, spec.server, [x] + [short_len] * n, metadata_heads, precomputed)
                row_margin.append(c.margin)
                row_sp.append(c.s_p)
            panel.margin.append(row_margin)
            panel.s_p.append(row_sp)
        panel.s_c = [cell(cfg, spec.server, [x], metadata_heads, precomputed).s_c for x in xs]
        panels.append(panel)
    return HazardMap(model=cfg, num_sm=num_sm, page_size=page_size, tp=tp, guard=guard,
                     metadata_heads=metadata_heads, short_len=short_len, lengths=xs, companions=ys, panels=panels)


def int32_split_hazard(model: ModelConfig, num_sm: int, call_heads: tuple) -> dict:
    """Where FA3's int L2 split branch rejects a call of this model (theorem int32-split-heuristic).

    A non-causal, non-local call whose KV head holds between 2^31 - 50 MiB and 2^31 - 1 bytes gets a negative
    split count (hopper/heuristics.h:34 wraps) once it has at least 2 x num_SMs m-blocks of queries; mha_fwd then
    raises (run_mha_fwd: num_splits >= 1). Decode and causal prefill never take the branch. Every number is
    checked through refmodel's get_num_splits (the band edges and the query threshold, each side of it).
    """
    from refmodel.fa3_scheduler import element_size, get_num_splits
    from spec.theorems.edges import int32_split_band

    h, hk = call_heads
    d, dv, dtype = model.head_dim, model.head_dim_v, model.dtype
    bpt = (d + dv) * element_size(dtype)
    lo, hi = int32_split_band(bpt)

    def splits(seqlen_q: int, seqlen_k: int, causal: bool = False) -> int:
        return get_num_splits(call_inputs(1, seqlen_q, seqlen_k, h, hk, d, headdim_v=dv, qkv_dtype=dtype,
                                          causal=causal, num_sm=num_sm))

    bm = resolve_schedule(call_inputs(1, 1, lo, h, hk, d, headdim_v=dv, qkv_dtype=dtype, num_splits=1,
                                      num_sm=num_sm)).block_m
    qhpk = h // hk
    min_q = ceil_div((2 * num_sm - 1) * bm + 1, qhpk)
    checked = splits(min_q, lo) < 1 and splits(min_q, hi) < 1 and splits(min_q, lo - 1) >= 1 \
        and splits(min_q, hi + 1) >= 1 and (min_q == 1 or splits(min_q - 1, lo) >= 1) and splits(min_q, lo, True) >= 1
    return {"kv_tokens": [lo, hi], "repeats_every_tokens": 2**32 // bpt, "min_query_tokens": min_q,
            "split_count": splits(min_q, lo), "call_heads": [h, hk], "bytes_per_kv_token": bpt,
            "reached_by": "non-causal, non-local calls only (decode and causal prefill skip the branch)",
            "outcome": "mha_fwd raises (run_mha_fwd: num_splits >= 1): loud and safe, but the band cannot run",
            "checked_by_refmodel": bool(checked),
            "fa3_source": "hopper/heuristics.h@0251105a:29-34; hopper/flash_api.cpp@0251105a:463, 371"}


def _fmt_len(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _edges(values: Sequence[float], log: bool) -> list:
    if len(values) == 1:
        v = values[0]
        return [v / 1.2, v * 1.2] if log else [v - 0.5, v + 0.5]
    if log:
        mids = [math.sqrt(a * b) for a, b in zip(values, values[1:])]
        return [values[0] ** 2 / mids[0]] + mids + [values[-1] ** 2 / mids[-1]]
    mids = [(a + b) / 2 for a, b in zip(values, values[1:])]
    return [2 * values[0] - mids[0]] + mids + [2 * values[-1] - mids[-1]]


def render(hmap: HazardMap, out_path, dpi: int = 110):
    """Draw the map as a PNG (matplotlib, Agg) to a path or a binary file object: one panel per configuration, a
    diverging scale centred at 0."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.cm import ScalarMappable
    from matplotlib.patches import Patch

    cp_panels = [p for p in hmap.panels if p.spec.kind == "cp"]
    dp_panels = [p for p in hmap.panels if p.spec.kind == "dp"]
    ncols = max(len(cp_panels), len(dp_panels) + 1, 2)
    nrows = 2 if dp_panels else 1
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 4.1 * nrows + 1.3), squeeze=False,
                             sharey=True, layout="constrained")
    slots = {}
    for i, p in enumerate(cp_panels):
        slots[id(p)] = axes[0][i]
    # DP panels sit under the CP panel of the same attn_tp/tp ratio (the ratio-1 column holds the legend).
    ratios = [p.spec.ratio for p in cp_panels]
    for p in dp_panels:
        col = ratios.index(p.spec.ratio) if p.spec.ratio in ratios else len(slots) % ncols
        slots[id(p)] = axes[1][col]

    all_margins = [m for p in hmap.panels for row in p.margin for i, m in enumerate(row) if p.s_c[i] > 1]
    vmin = min([-1] + all_margins)
    vmax = max([1] + all_margins)
    norm = TwoSlopeNorm(vmin=vmin, vcenter=0, vmax=vmax)
    cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#cfcfcf")
    xe = _edges(hmap.lengths, log=True)
    ye = _edges(hmap.companions, log=False)
    for p in hmap.panels:
        ax = slots[id(p)]
        data = np.array(p.margin, dtype=float)
        ignored = np.array(p.splits_ignored)
        data[:, ignored] = np.nan
        ax.pcolormesh(xe, ye, np.ma.masked_invalid(data), cmap=cmap, norm=norm, shading="flat",
                             alpha=1.0 if p.precomputed else 0.25, rasterized=True)
        over = np.array(p.overflow_grid(), dtype=float)
        if p.precomputed and 0 < over.sum() < over.size:
            ax.contour(hmap.lengths, hmap.companions, over, levels=[0.5], colors="black", linewidths=0.9)
        ax.set_xscale("log")
        ticks = [t for t in (1024 * 2 ** k for k in range(12)) if hmap.lengths[0] <= t <= hmap.lengths[-1]]
        ax.set_xticks(ticks)
        ax.set_xticklabels([_fmt_len(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlim(xe[0], xe[-1])
        ax.set_ylim(ye[0], ye[-1])
        r = p.spec.ratio
        ratio = "1" if r == 1 else f"{r.numerator}/{r.denominator}"
        ax.set_title(f"{p.spec.label}\nattn_tp/tp = {ratio}; heads (h, h_k): precompute "
                     f"{p.precompute_heads}, call {p.call_heads}", fontsize=8.5)
        ax.set_xlabel("longest sequence length (tokens)")
        row = axes[_row_of(axes, ax)]
        if ax is next(a for a in row if any(slots[id(q)] is a for q in hmap.panels)):
            ax.set_ylabel(f"short companions ({hmap.short_len} tokens each)")
            ax.tick_params(labelleft=True)
        stats = (f"overflow cells: {p.overflow_cells}/{len(hmap.lengths) * len(hmap.companions)}"
                 + (f", worst +{p.worst_margin}" if p.overflow_cells else ""))
        ax.text(0.02, 0.98, stats, transform=ax.transAxes, va="top", ha="left", fontsize=7.5,
                bbox=dict(boxstyle="round,pad=0.25", fc="white", ec="none", alpha=0.8))
        if not p.precomputed:
            ax.text(0.5, 0.5, f"precompute disabled by\nguard '{hmap.guard}': safe", transform=ax.transAxes,
                    ha="center", va="center", fontsize=10, fontweight="bold",
                    bbox=dict(boxstyle="round", fc="white", ec="0.5"))
    we = hmap.worked_example()
    if we is not None:
        ax = slots[id(hmap.panel("cp", attn_cp=WORKED_EXAMPLE["attn_cp_size"]))]
        ax.plot([we["long_len"]], [we["companions"]], marker="*", markersize=15, color="gold",
                markeredgecolor="black", zorder=5)
        ax.annotate(f"worked example: {_fmt_len(we['long_len'])} + {we['companions']} x {we['short_len']}\n"
                    f"split {we['max_split']} > S_c {we['s_c']} (S_p {we['s_p']})",
                    xy=(we["long_len"], we["companions"]), xytext=(0.04, 0.27), textcoords="axes fraction",
                    fontsize=8, arrowprops=dict(arrowstyle="->", color="black"),
                    bbox=dict(boxstyle="round", fc="lightyellow", ec="0.4"))
    used = {id(slots[k]) for k in slots}
    for row in axes:
        for ax in row:
            if id(ax) not in used:
                ax.axis("off")
    legend_ax = next((ax for row in axes for ax in row if id(ax) not in used), None)
    handles = [Patch(facecolor=cmap(norm(vmax)), label="> 0: metadata split count exceeds S_c: out of bounds"),
               Patch(facecolor=cmap(norm(0)), edgecolor="0.6", label="0: exactly fills the call's buffers"),
               Patch(facecolor=cmap(norm(vmin)), label="< 0: fewer splits than the buffers hold (safe)"),
               Patch(facecolor="#cfcfcf", label="S_c = 1: split counts ignored (safe)")]
    notes = ("colour = max per-batch split count in the\nprecomputed metadata minus S_c, the split\n"
             "count the call sizes its partial buffers with.\nBlack line: overflow boundary.\n"
             f"Page size {hmap.page_size}; eager decode; num_splits=0.")
    if legend_ax is not None:
        legend_ax.legend(handles=handles, loc="upper left", fontsize=8, frameon=False)
        legend_ax.text(0.02, 0.35, notes, transform=legend_ax.transAxes, fontsize=8, va="top")
    else:
        fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    gpu = GPU_SM_COUNTS.get(hmap.num_sm, "")
    fig.suptitle(f"FA3 precomputed-metadata hazard: {hmap.model.name} (H={hmap.model.num_heads}, "
                 f"Hk={hmap.model.num_kv_heads}, d={hmap.model.head_dim}) on {hmap.num_sm} SMs ({gpu})\n"
                 f"policy: {hmap.policy_label}", fontsize=11)
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=[ax for row in axes for ax in row if id(ax) in used], shrink=0.85, pad=0.015,
                 label="max split in metadata - S_c")
    fig.savefig(out_path, dpi=dpi, format="png")
    plt.close(fig)
    return out_path


def _row_of(axes, ax) -> int:
    """Row index of `ax` in a 2-D axes array."""
    for r, row in enumerate(axes):
        if any(a is ax for a in row):
            return r
    return 0

HELP = "draw where reusing precomputed FA3 scheduler metadata overflows (PNG heatmap per CP/DP configuration)"
EPILOG = """\
Each cell is one decode batch: the longest sequence (x, log scale) plus N short companions (y). Its colour is
the largest per-batch split count in the metadata precomputed with {modelled}'s head counts (H//tp) minus S_c, the
split count the layer's call (H//attn_tp heads) sizes its partial buffers with: > 0 is out of bounds (the
PR #30439 NaNs). Cells with S_c = 1 are safe (the call ignores the metadata's split counts). One panel per
prefill-CP and DP-attention configuration of --tp. Computed from refmodel's formulas; no kernel runs.

examples:
  fa3verify hazard-map --model qwen3-30b-a3b --sm 132 --out hazard.png
  fa3verify hazard-map --model llama-3-8b --sm 114 --tp 8 --page-size 16 --out h.png --json h.json
  fa3verify hazard-map --model qwen3-30b-a3b --sm 132 --guard none --out all-panels.png
"""


def register(sub) -> None:
    p = sub.add_parser("hazard-map", help=HELP, description=HELP, epilog=EPILOG.replace("{modelled}", engine_phrase("modelled")),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model shape name (see gpu_impl.config.MODELS), e.g. qwen3-30b-a3b")
    p.add_argument("--sm", type=int, required=True,
                   help="SM count of the GPU: " + ", ".join(f"{n} ({g})" for n, g in GPU_SM_COUNTS.items()))
    p.add_argument("--out", required=True, metavar="PNG", help="where to write the PNG")
    p.add_argument("--json", metavar="PATH", help="also write the grid as JSON (schema fa3verify.hazard-map/1)")
    p.add_argument("--page-size", type=int, default=1, help=f"KV cache page size (default 1, {engine_phrase('modelled')}'s default)")
    p.add_argument("--tp", type=int, default=4, help=f"tp_size, one of {TP_SIZES} (default 4)")
    p.add_argument("--guard", default="pre-fix",
                   help=f"precompute guard, one of {', '.join(GUARDS)} (default pre-fix: only DP attention "
                        "disables the precompute)")
    p.add_argument("--metadata-heads", default="tp",
                   help=f"heads the precompute uses, one of {', '.join(METADATA_HEADS)} (default tp, as {engine_phrase('modelled')})")
    p.add_argument("--short-len", type=int, default=DEFAULT_SHORT_LEN,
                   help=f"length of each short companion (default {DEFAULT_SHORT_LEN})")
    p.add_argument("--max-companions", type=int, default=DEFAULT_MAX_COMPANIONS,
                   help=f"largest companion count on the y axis (default {DEFAULT_MAX_COMPANIONS})")
    p.set_defaults(func=run)


def run(args) -> int:
    start = time.perf_counter()
    hmap = compute_hazard_map(args.model, args.sm, page_size=args.page_size, tp=args.tp, guard=args.guard,
                              metadata_heads=args.metadata_heads, short_len=args.short_len,
                              max_companions=args.max_companions)
    for path, flag in ((args.out, "--out"), (args.json, "--json")):
        if path:
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                raise UsageError(f"{flag}: directory does not exist: {parent}")

    png = io.BytesIO()
    render(hmap, png)
    write_output(args.out, png.getvalue(), "--out")
    if args.json:
        write_output(args.json, json.dumps(hmap.to_dict(), indent=1) + "\n", "--json")
    cells = len(hmap.lengths) * len(hmap.companions)
    print(f"hazard map: {hmap.model.name} on {hmap.num_sm} SMs, page size {hmap.page_size}, {hmap.policy_label}")
    for p in hmap.panels:
        state = "" if p.precomputed else "  (precompute disabled by the guard)"
        worst = f", worst margin +{p.worst_margin}" if p.overflow_cells else ""
        print(f"  {p.spec.label:<40} overflow cells {p.overflow_cells:>5}/{cells}{worst}{state}")
    we = hmap.worked_example()
    if we:
        print(f"  worked example {we['long_len']} + {we['companions']} x {we['short_len']} ({we['panel']}): "
              f"S_p {we['s_p']}, split {we['max_split']} vs S_c {we['s_c']} -> "
              + ("OVERFLOW" if we["overflow"] else "safe"))
    band = hmap.int32_split_band()
    if band:
        lo, hi = band["kv_tokens"]
        print(f"  FA3 int overflow (theorem 8): a non-causal call over {lo}..{hi} KV tokens with >= "
              f"{band['min_query_tokens']} query tokens gets {band['split_count']} splits and is rejected")
    print(f"wrote {args.out}" + (f" and {args.json}" if args.json else "")
          + f" in {time.perf_counter() - start:.1f}s")
    return 0
