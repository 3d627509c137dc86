"""Fidelity per FA3 build: refmodel against each build's own host arithmetic, from stored test vectors.

Invariant: for every named build (refmodel/fa3_builds.json) refmodel returns exactly what that build's compiled
``hopper/tile_size.h`` and ``hopper/heuristics.h`` return on the stored grids: 0 mismatches.

The vectors (``fidelity_vectors/<build>.json``, with the source repo and commit) were generated once by
``scripts/gen_build_vectors.py``, which compiles the build's own headers with g++ on the CPU; CI compares
against them without the upstream source. Compared per vector: the sm90 tile (kBlockM, kBlockN) under the build
(refmodel.fa3_scheduler ``tile_size_fwd_sm90`` upstream, refmodel.fa3_builds ``tile_size_fwd_sm90_build`` for
a fork that compiles its own decode-tile choice), ``num_splits_heuristic``, ``should_pack_gqa`` and, where the build has it, ``use_one_mma_wg``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

VECTORS = Path(__file__).with_name("fidelity_vectors")

__all__ = ["VECTORS", "load_vectors", "compare_build", "available_builds", "wheel_builds", "compare_wheel_build"]


def available_builds() -> list[str]:
    """Builds that have stored vectors."""
    return sorted(p.stem for p in VECTORS.glob("*.json"))


def load_vectors(build_name: str) -> dict:
    """The stored vectors of one build; ValueError naming the builds that have some."""
    path = VECTORS / f"{build_name}.json"
    if not path.is_file():
        raise ValueError(f"build: no fidelity vectors for {build_name!r}; have {', '.join(available_builds())}")
    return json.loads(path.read_text())


def _model(build_name: str) -> dict:
    from refmodel import fa3_builds
    from refmodel.fa3_scheduler import num_splits_heuristic, should_pack_gqa, tile_size_fwd_sm90

    if fa3_builds.build(build_name).one_mma_wg == "fork":  # a fork's own tile table (softcap, v_colmajor unused)
        def tile(d, dv, c, l, e, vc, pg, sc, wg):
            return fa3_builds.tile_size_fwd_sm90_build(build_name, d, dv, bool(c), bool(l), e, bool(pg),
                                                       one_mma_wg=bool(wg))
    else:
        def tile(d, dv, c, l, e, vc, pg, sc, wg):
            return tile_size_fwd_sm90(d, dv, bool(c), bool(l), e, paged_kv_non_tma=bool(pg), softcap=bool(sc),
                                      v_colmajor=bool(vc))

    def one_mma_wg(arch, d, local, sq, h, hk):
        return fa3_builds.use_one_mma_wg(build_name, arch, d, bool(local), sq, h // hk)

    return {"tile": tile, "splits": num_splits_heuristic, "pack": should_pack_gqa, "one_mma_wg": one_mma_wg}


def compare_build(build_name: str, vectors: Optional[dict] = None, model: Optional[dict] = None,
                  max_examples: int = 5) -> dict:
    """Mismatch counts per function (and a few examples) of refmodel under ``build_name`` against the vectors.

    ``vectors`` defaults to the stored ones of that build; ``model`` replaces refmodel's functions (a negative
    control passes a seeded defect here). Returns ``{"build", "commit", "compared": {fn: n}, "mismatches": {fn: n},
    "examples": [...]}``.
    """
    vectors = vectors if vectors is not None else load_vectors(build_name)
    m = {**_model(build_name), **(model or {})}
    compared, mismatches, examples = {}, {}, []

    def check(fn: str, rows, predict: Callable, got_of: Callable) -> None:
        compared[fn] = mismatches[fn] = 0
        for row in rows:
            compared[fn] += 1
            want, got = got_of(row), predict(row)
            if want != got:
                mismatches[fn] += 1
                if len(examples) < max_examples:
                    examples.append({"function": fn, "input": row[:-1] if fn != "tile" else row[:-2],
                                     "build": want, "refmodel": got})

    check("tile", vectors["tiles"], lambda r: tuple(m["tile"](*r[:9])), lambda r: (r[9], r[10]))
    check("splits", vectors["splits"], lambda r: int(m["splits"](*r[:6], 128)), lambda r: r[6])
    check("pack", vectors["pack"], lambda r: int(bool(m["pack"](bool(r[0]), r[1], r[2], r[3]))), lambda r: r[4])
    if vectors.get("has_use_one_mma_wg"):
        check("one_mma_wg", vectors["one_mma_wg"], lambda r: int(m["one_mma_wg"](*r[:6])), lambda r: r[6])
    return {"build": build_name, "commit": vectors.get("commit"), "compared": compared, "mismatches": mismatches,
            "examples": examples}


# ----------------------------------------------------------------------------------------------------------
# Builds read from a kernel wheel (scripts/read_fa3_wheel.py --vectors): the wheel's own compiled
# tile_size_fwd_sm90 and get_num_splits, called on fixed grids.
# ----------------------------------------------------------------------------------------------------------


def wheel_builds() -> list[str]:
    """Builds whose stored vectors were read from a kernel wheel."""
    return sorted(p.stem for p in VECTORS.glob("*.json")
                  if json.loads(p.read_text()).get("schema") == "fa3verify.wheel_vectors/1")


def _wheel_model(build_name: str) -> dict:
    from refmodel import fa3_builds
    from refmodel.fa3_scheduler import Masking, ScheduleInputs, get_num_splits_resolved, get_pack_gqa

    def tile(d, dv, c, l, e, vc, pg, sc, wg):
        return fa3_builds.tile_size_fwd_sm90_build(build_name, d, dv, bool(c), bool(l), e, bool(pg), bool(sc),
                                                   bool(vc), bool(wg))

    # the wheel is called with params.pack_gqa 0; 8798f277's get_num_splits reads it (its decode-tile predicate)
    reads_pack_gqa = fa3_builds.build(build_name).one_mma_wg == "packgqa-d128"

    def splits(b, sq, tq, sk, h, hk, d, dv, causal, local, varlen, paged, tma):
        masking = Masking(is_causal=bool(causal), is_local=bool(local), window_left=1000 if local else -1,
                          window_right=0 if (causal or local) else -1)
        inp = ScheduleInputs(batch_size=b, seqlen_q=sq, seqlen_k=sk, num_heads=h, num_heads_k=hk, headdim=d,
                             headdim_v=dv, page_size=1 if paged else None, uses_prepare=bool(varlen),
                             precompute=False, num_sm=132, arch=90, build=build_name, total_q=tq,
                             pack_gqa=False if reads_pack_gqa else None)
        return get_num_splits_resolved(inp, masking, tma=bool(tma) if paged else False)

    def pack(sq, h, hk, d, causal, local, varlen, num_splits, paged, tma):
        masking = Masking(is_causal=bool(causal), is_local=bool(local), window_left=1000 if local else -1,
                          window_right=0 if (causal or local) else -1)
        inp = ScheduleInputs(batch_size=2, seqlen_q=sq, seqlen_k=4096, num_heads=h, num_heads_k=hk, headdim=d,
                             headdim_v=d, page_size=1 if paged else None, varlen_q=bool(varlen),
                             uses_prepare=bool(varlen), precompute=False, num_sm=132, arch=90, build=build_name,
                             total_q=2 * sq)
        return int(get_pack_gqa(inp, num_splits, masking, bool(tma) if paged else False))

    return {"tile": tile, "get_num_splits": splits, "get_pack_gqa": pack}


def compare_wheel_build(build_name: str, vectors: Optional[dict] = None, model: Optional[dict] = None,
                        max_examples: int = 5) -> dict:
    """Mismatches of refmodel under ``build_name`` against the vectors read from one of its wheels.

    Compared: the sm90 tile of every (rounded d, dv, flags, one_mma_wg), get_num_splits and get_pack_gqa on the
    stored grids (their rows give ``params`` fields directly: resolved causal/local, window, varlen, total_q, paged
    and TMA, and for get_pack_gqa the split count).
    ``model`` replaces refmodel's functions (a negative control passes a seeded defect here).
    """
    vectors = vectors if vectors is not None else load_vectors(build_name)
    m = {**_wheel_model(build_name), **(model or {})}
    compared, mismatches, examples = {}, {}, []
    checks = [("tile", vectors["tiles"], 9), ("get_num_splits", vectors["get_num_splits"], 13)]
    if "get_pack_gqa" in vectors:
        checks.append(("get_pack_gqa", vectors["get_pack_gqa"], 10))
    for fn, rows, n_in in checks:
        compared[fn] = mismatches[fn] = 0
        for row in rows:
            compared[fn] += 1
            want = tuple(row[n_in:]) if fn == "tile" else row[n_in]
            got = m[fn](*row[:n_in])
            got = tuple(got) if fn == "tile" else int(got)
            if want != got:
                mismatches[fn] += 1
                if len(examples) < max_examples:
                    examples.append({"function": fn, "input": row[:n_in], "wheel": want, "refmodel": got})
    return {"build": build_name, "wheel": vectors.get("wheel"), "version": vectors.get("version"),
            "sha256": vectors.get("sha256"), "compared": compared, "mismatches": mismatches, "examples": examples}
