"""fa3verify hazard-map: a heatmap of where reusing precomputed FA3 metadata overflows the call's buffers."""

from __future__ import annotations

import argparse

from gpu_impl.plugin import engine_phrase

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
    from ..hazard_map import (DEFAULT_MAX_COMPANIONS, DEFAULT_SHORT_LEN, GPU_SM_COUNTS, GUARDS, METADATA_HEADS,
                              TP_SIZES)

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
    import json
    import os
    import time

    from ..errors import UsageError
    from ..hazard_map import compute_hazard_map, render

    start = time.perf_counter()
    hmap = compute_hazard_map(args.model, args.sm, page_size=args.page_size, tp=args.tp, guard=args.guard,
                              metadata_heads=args.metadata_heads, short_len=args.short_len,
                              max_companions=args.max_companions)
    for path, flag in ((args.out, "--out"), (args.json, "--json")):
        if path:
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                raise UsageError(f"{flag}: directory does not exist: {parent}")
    import io

    from ..outputs import write_output

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
