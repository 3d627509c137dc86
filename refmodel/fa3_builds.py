"""Named FA3 builds: which FA3 source an engine release ships, and the host-side rules in which builds differ.

Invariant: every schedule is computed under one named build; a rule that differs between builds is written once
here, keyed by build, and everything else is shared (refmodel.fa3_scheduler).

Builds, engine releases and the FA3 source each release ships are data (``fa3_builds.json`` beside this module).
Each build's sm90 tile table is data too (``tile_size_sm90.json``), read by ``tile_size_fwd_sm90_build``.
Seven builds are modelled:

* ``upstream-0251105a``: Dao-AILab/flash-attention ``hopper/`` at 0251105a (the rest of refmodel).
* ``vllm-fork-617264c1``: vllm-project/flash-attention ``hopper/`` at 617264c1, compiled by the fork's
  ``CMakeLists.txt`` (lines 303-315) with ``FLASHATTENTION_VARLEN_ONLY`` and ``FLASHATTENTION_PACKGQA_ONLY``.
  Its host-side differences (each function below cites its lines):
  the decode tile choice ``use_one_mma_wg`` (heuristics.h 10-14) and the tiles it selects (tile_size.h 10-93);
  the other changed bf16/fp16 and fp8 tiles; ``get_pagedkv_tma`` vetoing local attention (flash_api.cpp 466);
  PackGQA forced for h/h_k = 8, local, d = dv = 64 (485-488), for Split (671, 1063) and, under PACKGQA_ONLY,
  whenever d == dv (674, 1065); the call's static seqlen_k is ``max_seqlen_k`` whenever it is passed (835);
  Sort always off (689, 1079); the metadata vectors ``prepare_seqlen_q`` [+ dynamic splits when b <= 992 and
  S > 1] [+ heads-in-L2 when Swizzle] (692-699, 1068, 1083-1090), checked by CHECK_SHAPE (1096); a varlen call
  of more than 992 batches runs with one split (1070).

* ``sglang-kernel-0.4.2`` and ``sglang-kernel-0.4.5``: read from sglang's kernel wheels (0.4.2-0.4.4 and
  0.4.5-0.4.10) by scripts/read_fa3_wheel.py, which calls their compiled ``tile_size_fwd_sm90``,
  ``get_num_splits`` and ``get_pack_gqa`` (docs/fa3-builds.md). They differ from upstream in the tile table
  (``tile_size_sm90.json``), the decode tile choice ``use_one_mma_wg`` (no local test: ``Build.one_mma_wg``
  "sglang"), and, from 0.4.5, a varlen ``get_num_splits`` bounded by ``params.total_q``
  (``Build.varlen_total_q_bound``; ``ScheduleInputs.total_q``). Their other host rules are taken as upstream's.

* ``vllm-fork-2d3b7508``, ``vllm-fork-a8937124``, ``vllm-fork-1c81743f``: the FA3 that vLLM 0.10.1-0.11.0,
  0.11.1-0.16.0 and 0.17.0-0.18.1 build in, read from their wheels by scripts/read_fa3_wheel.py (the fork's older
  Flash_fwd_params layouts) and named by the fork commit whose hopper/ sources match them. All three have the
  fork's host deltas (``Build.host_rules`` "fork"); the first two test no local flag in ``use_one_mma_wg``
  (heuristics.h@a8937124 10-14), are compiled without PACKGQA_ONLY, keep no Sort and lay the metadata out as the
  semaphore at 0 then b split counts, present when b <= 992 and the num_splits argument is not 1
  (``Build.metadata_layout`` "semaphore-splits", ``legacy_uses_dynamic_split``; flash_api.cpp@a8937124 624,
  642-652, 994, 1008-1028); the third is 617264c1's host code with an older tile table.

The fork's prepare kernel (``prepare_seqlen_q`` instead of m-blocks, a 32 MiB / qhpk L2 budget) is modelled in
refmodel.prepare, its layout in refmodel.metadata (``MetadataLayout``, ``decode_for_schedule``).

Simplifications: the fork has no ``attention_chunk`` argument, and the model does not refuse a chunk under the
fork's build; ``use_one_mma_wg`` is applied to the kernel's tile as to the host's (the fork's
flash_fwd_launch_template.h 217-219 switches on the same predicate and also needs kHeadDimV == kHeadDim, which
holds wherever the tile reads the flag: d 128 forces dv 128, and d 64 with a wider dv takes the dv tiles first); the fork's sm8x path is compiled out
(``FLASHATTENTION_DISABLE_SM8x``), as refmodel refuses arch != 90 for every build.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .cint import to_int32

__all__ = ["UPSTREAM", "VLLM_FORK", "SGLANG_KERNEL_042", "SGLANG_KERNEL_045", "Build", "builds", "build", "engine_sources", "build_for_engine",
           "use_one_mma_wg", "tile_rules", "rule_matches", "tile_size_fwd_sm90_build", "tile_size_fwd_sm90_vllm_fork",
           "fork_packgqa_override", "fork_packgqa",
           "fork_metadata_vectors", "fork_uses_dynamic_split", "engine_sources_markdown", "check_build_name",
           "MAX_BATCHES_1CTA", "DATA", "TILE_DATA", "fork_host_rules", "metadata_layout_kind",
           "VLLM_FORK_2D3B7508", "VLLM_FORK_A8937124", "VLLM_FORK_1C81743F", "legacy_uses_dynamic_split",
           "VLLM_FORK_8798F277", "fork_static_seqlen_k", "decode_tile", "empty_row_split_count"]

UPSTREAM = "upstream-0251105a"
VLLM_FORK = "vllm-fork-617264c1"
#: The sglang kernel wheels' builds, read from the wheels (scripts/read_fa3_wheel.py): 0.4.2 to 0.4.4, and 0.4.5 to
#: 0.4.10 (whose get_num_splits bounds a varlen call by params.total_q).
SGLANG_KERNEL_042 = "sglang-kernel-0.4.2"
SGLANG_KERNEL_045 = "sglang-kernel-0.4.5"
#: The fork builds vLLM 0.10.1-0.18.1 ship, read from their wheels (scripts/read_fa3_wheel.py) and named by the fork
#: commit whose hopper/ sources they match: 0.10.1-0.11.0, 0.11.1-0.16.0, 0.17.0-0.18.1.
VLLM_FORK_2D3B7508 = "vllm-fork-2d3b7508"
VLLM_FORK_A8937124 = "vllm-fork-a8937124"
VLLM_FORK_1C81743F = "vllm-fork-1c81743f"
#: The fork build vLLM 0.8.5-0.10.0 ship (read from their wheels; the commit 0.8.5 pins, host files unchanged to
#: b99f8c82^): the decode tile at d 128 only, chosen with PackGQA, PackGQA set to Split after the split count.
VLLM_FORK_8798F277 = "vllm-fork-8798f277"
DATA = Path(__file__).with_name("fa3_builds.json")
#: Each build's sm90 tile table, as ordered rules (read by ``tile_size_fwd_sm90_build``).
TILE_DATA = Path(__file__).with_name("tile_size_sm90.json")
#: One prepare CTA handles 992 batches (flash.h / flash_api.cpp PREPARE_VARLEN_MAX_BATCHES_1CTA, both builds).
MAX_BATCHES_1CTA = 992


@dataclass(frozen=True)
class Build:
    """One FA3 source as compiled: repository, commit, files read, compile definitions that change scheduling."""

    name: str
    repo: str
    commit: str
    files: tuple
    compile_definitions: tuple
    note: str = ""
    #: which decode-tile predicate the build compiles: None (upstream: none), "fork" (vLLM's fork: not local),
    #: "sglang" (the sglang kernel wheels: no local test)
    one_mma_wg: Optional[str] = None
    #: get_num_splits bounds a varlen call by params.total_q (when > 0) instead of batch 1
    varlen_total_q_bound: bool = False
    #: "fork": the vLLM fork's host-side deltas (paged TMA vetoed for local, flash_api.cpp 466; PackGQA forced for
    #: h/h_k 8, local, d = dv = 64, 485-488; the call's static seqlen_k = max_seqlen_k, 835); None: upstream's
    host_rules: Optional[str] = None
    #: the metadata layout: "upstream" (0251105a: splits, m-blocks[, batch order][, heads-in-L2] of b4 each, then
    #: the semaphore), "fork" (617264c1: prepare_seqlen_q[, splits][, heads-in-L2], then the semaphore) or
    #: "semaphore-splits" (the fork before 5824e6e2: the semaphore at 0, then b dynamic split counts)
    metadata_layout: str = "upstream"
    #: compiled with FLASHATTENTION_PACKGQA_ONLY: PackGQA also whenever d == dv (flash_api.cpp@617264c1 674, 1065)
    packgqa_only: bool = False
    #: "semaphore-splits" only: the precompute's split vector also needs a num_splits argument other than 1
    #: (@a8937124 624); False for 8798f277, which keeps it for any b <= 992 (flash_api.cpp@8798f277 584)
    split_vector_tests_num_splits: bool = True
    #: pack_gqa = num_splits > 1 after the split count, replacing the heuristic and the argument
    #: (flash_api.cpp@8798f277 592, 947); the older fork builds OR them instead
    pack_gqa_is_split: bool = False
    #: the split count the build's kernels read as an empty row (no tiles, no combine), with the FA3 lines that
    #: make it so; None where the build's metadata has no such rule (fa3_builds.json "empty_row")
    empty_row_split_count: Optional[int] = None
    empty_row_source: str = ""


@functools.lru_cache(maxsize=1)
def _data() -> dict:
    return json.loads(DATA.read_text())


def builds() -> dict:
    """Every named build, by name (fa3_builds.json)."""
    return dict(_builds())


@functools.lru_cache(maxsize=1)
def _builds() -> dict:
    # read once (every ScheduleInputs names its build: a prover's length scan checks the name thousands of times);
    # callers get a copy of the dict, and a Build is frozen
    return {name: Build(name=name, repo=b["repo"], commit=b["commit"], files=tuple(b["files"]),
                        compile_definitions=tuple(b["compile_definitions"]), note=b.get("note", ""),
                        one_mma_wg=b.get("one_mma_wg"), varlen_total_q_bound=bool(b.get("varlen_total_q_bound")),
                        host_rules=b.get("host_rules"), metadata_layout=b.get("metadata_layout", "upstream"),
                        packgqa_only=bool(b.get("packgqa_only")),
                        split_vector_tests_num_splits=bool(b.get("split_vector_tests_num_splits", True)),
                        pack_gqa_is_split=bool(b.get("pack_gqa_is_split")),
                        empty_row_split_count=(b.get("empty_row") or {}).get("split_count"),
                        empty_row_source=(b.get("empty_row") or {}).get("source", ""))
            for name, b in _data()["builds"].items()}


def fork_host_rules(build_name: str) -> bool:
    """The build has the vLLM fork's host-side deltas (``Build.host_rules`` "fork"): 617264c1 and the older fork
    builds read from vLLM 0.10.1-0.18.1's wheels (flash_api.cpp@a8937124 427, 443-446, 774; @617264c1 466, 485-488,
    835)."""
    return build(build_name).host_rules == "fork"


def fork_static_seqlen_k(build_name: str) -> bool:
    """The call's static seqlen_k is ``max_seqlen_k`` when given, paged or not: every fork build (host_rules "fork",
    and 8798f277's "fork-static-seqlen-k", flash_api.cpp@8798f277 730, which has none of the fork's other deltas)."""
    return build(build_name).host_rules in ("fork", "fork-static-seqlen-k")


def metadata_layout_kind(build_name: str) -> str:
    """The build's metadata layout: "upstream", "fork" or "semaphore-splits" (``Build.metadata_layout``)."""
    return build(build_name).metadata_layout


def empty_row_split_count(build_name: str) -> Optional[int]:
    """The split count that makes a row of the call's batch empty under this build, or None where no such rule holds.

    The builds of the "semaphore-splits" layout (8798f277, 2d3b7508, a8937124: vLLM 0.8.5-0.16.0) read each row's
    split count from the vector at 1..b and give the row ``num_m_blocks * num_splits`` tiles, so a count of 0 gives
    it none whatever its m-blocks (for a decode every row, padding included, gets the m-blocks of the call's
    ``max_seqlen_q``), and the combine returns for it (``num_splits <= 1``); the lines per build are
    ``Build.empty_row_source`` (fa3_builds.json "empty_row"). The other layouts put other vectors (query rows,
    heads-in-L2, the semaphore) where a longer read lands, so no split count alone makes such a read harmless."""
    return build(build_name).empty_row_split_count


def build(name: str) -> Build:
    """The build of that name; ValueError naming the allowed names otherwise."""
    known = builds()
    if name not in known:
        raise ValueError(f"build: must be one of {', '.join(sorted(known))}, got {name!r}")
    return known[name]


def engine_sources() -> list[dict]:
    """One row per engine release: engine, release, kernel package and version, FA3 repo, commit, build."""
    data = _data()
    rows = []
    for e in data["engines"]:
        src = data["sources"][e["kernel_package"]]
        by_version = src.get("builds_by_version") or {}
        name = by_version.get(e["kernel_version"], src["build"])
        rows.append({**e, "fa3_repo": src["fa3_repo"], "fa3_commit": src["fa3_commit"], "build": name,
                     "verified": src["verified"], "interface": src["interface"],
                     "wheel": (src.get("wheels") or {}).get(e["kernel_version"])})
    return rows


def build_for_engine(engine: str, release: str) -> str:
    """The build that judges an engine release (fa3_builds.json); ValueError for a release not recorded."""
    for row in engine_sources():
        if row["engine"] == engine and row["release"] == release:
            return row["build"]
    raise ValueError(f"engine: no FA3 source recorded for {engine}=={release} (refmodel/fa3_builds.json)")


def use_one_mma_wg(build_name: str, arch: int, headdim: int, is_local: bool, seqlen_q: int, qhpk: int,
                   pack_gqa: bool = False) -> bool:
    """The build's decode tile choice: sm90+, d 64 or 128 (unrounded), seqlen_q * h/h_k <= 64, and for the fork not local.

    The fork: vllm-project/flash-attention@617264c1 hopper/heuristics.h 10-14. The sglang kernel wheels (0.4.2 to
    0.4.10): read from their compiled get_num_splits (scripts/read_fa3_wheel.py; docs/fa3-builds.md), which tests
    arch > 89, d in {64, 128} and (h / h_k) * seqlen_q <= 64 as 32-bit ints and has no local test. ``h / h_k`` is
    C++ int division (exact: both sides reject h % h_k != 0 first). Always False for upstream, which has no such choice.
    """
    kind = build(build_name).one_mma_wg
    if kind is None:
        return False
    if kind == "packgqa-d128":
        # heuristics.h@8798f277 10-13: params.d == 128 only, and the rows counted with h / h_k only under PackGQA
        return int(arch) >= 90 and int(headdim) == 128 and \
            to_int32(int(seqlen_q) * (int(qhpk) if pack_gqa else 1)) <= 64
    if kind == "fork" and is_local:
        return False
    return int(arch) >= 90 and int(headdim) in (64, 128) and to_int32(int(seqlen_q) * int(qhpk)) <= 64


def decode_tile(build_name: str, arch: int, headdim: int, is_local: bool, seqlen_q: int, qhpk: int,
                pack_gqa: Optional[bool] = None) -> bool:
    """``use_one_mma_wg`` where the build's tile call passes it. ``pack_gqa``: ``params.pack_gqa`` where 8798f277's
    predicate reads it; None where its tile call has no decode-tile argument (get_pack_gqa, get_pagedkv_tma:
    flash_api.cpp@8798f277 397, 420), which is no decode tile. The other builds ignore it."""
    if build(build_name).one_mma_wg != "packgqa-d128":
        return use_one_mma_wg(build_name, arch, headdim, is_local, seqlen_q, qhpk)
    return pack_gqa is not None and use_one_mma_wg(build_name, arch, headdim, is_local, seqlen_q, qhpk,
                                                   pack_gqa=pack_gqa)


@functools.lru_cache(maxsize=1)
def tile_rules() -> dict:
    """Each build's sm90 tile rules by element-size key (tile_size_sm90.json), first match wins."""
    return json.loads(TILE_DATA.read_text())["builds"]


def rule_matches(rule: dict, headdim: int, headdim_v: int, flags: dict) -> bool:
    """A tile rule holds: d <= d_max, dv == dv_eq, dv <= dv_max (each when given), one ``when`` group all true."""
    if "d_max" in rule and headdim > rule["d_max"]:
        return False
    if "dv_eq" in rule and headdim_v != rule["dv_eq"]:
        return False
    if "dv_max" in rule and headdim_v > rule["dv_max"]:
        return False
    return "when" not in rule or any(all(flags[f] for f in group) for group in rule["when"])


@functools.lru_cache(maxsize=65536)
def tile_size_fwd_sm90_build(build_name: str, headdim: int, headdim_v: int, is_causal: bool, is_local: bool,
                             element_size: int = 2, paged_kv_non_tma: bool = False, softcap: bool = False,
                             v_colmajor: bool = False, one_mma_wg: bool = False) -> tuple[int, int]:
    """(kBlockM, kBlockN) of a build's sm90 forward kernel: the first matching rule of its table.

    The tables are data (``tile_size_sm90.json`` beside this module, each build's rules citing its tile_size.h
    lines); element size 2 takes the bf16/fp16 rules and any other the fp8 rules, as tile_size.h branches.
    """
    rules = tile_rules()[build(build_name).name]["element_size_2" if element_size == 2 else "element_size_1"]
    flags = {"is_causal": bool(is_causal), "is_local": bool(is_local), "paged_kv_non_tma": bool(paged_kv_non_tma),
             "softcap": bool(softcap), "v_colmajor": bool(v_colmajor), "one_mma_wg": bool(one_mma_wg)}
    for rule in rules:
        if rule_matches(rule, int(headdim), int(headdim_v), flags):
            return rule["tile"][0], rule["tile"][1]
    raise ValueError(f"tile_size_sm90.json: build {build_name!r} has no rule for headdim {headdim}")


def tile_size_fwd_sm90_vllm_fork(headdim: int, headdim_v: int, is_causal: bool, is_local: bool,
                                 element_size: int = 2, paged_kv_non_tma: bool = False,
                                 one_mma_wg: bool = False) -> tuple[int, int]:
    """(kBlockM, kBlockN) of the fork's sm90 forward kernel (vllm-project/flash-attention@617264c1 tile_size.h 10-93).

    fp8 takes the two-level-accumulation prefill tiles (lines 66-77): the fork's CMakeLists.txt does not define
    FLASHATTENTION_DISABLE_FP8_TWO_LEVEL_ACCUMULATION. Neither ``softcap`` nor ``v_colmajor`` reaches these tiles.
    """
    return tile_size_fwd_sm90_build(VLLM_FORK, headdim, headdim_v, is_causal, is_local, element_size,
                                    paged_kv_non_tma, one_mma_wg=one_mma_wg)


def fork_packgqa_override(arch: int, qhpk: int, is_local: bool, headdim: int, headdim_v: int) -> bool:
    """The fork packs GQA for sm90+, h/h_k == 8, local, d == dv == 64 before its heuristic (flash_api.cpp 485-488)."""
    return int(arch) >= 90 and int(qhpk) == 8 and bool(is_local) and int(headdim) == 64 and int(headdim_v) == 64


def fork_packgqa(pack: bool, num_splits: int, headdim: int, headdim_v: int) -> bool:
    """After get_pack_gqa (or the argument) the fork ORs in Split (671, 1063) and, under PACKGQA_ONLY, d == dv (674, 1065)."""
    return bool(pack) or int(num_splits) > 1 or int(headdim) == int(headdim_v)


def fork_uses_dynamic_split(uses_prepare: bool, batch_size: int, num_splits: int) -> bool:
    """The fork writes a per-batch split vector only with the prepare step, b <= 992 and S > 1 (677, 1068)."""
    return bool(uses_prepare) and int(batch_size) <= MAX_BATCHES_1CTA and int(num_splits) > 1


def legacy_uses_dynamic_split(precompute: bool, uses_prepare: bool, batch_size: int, num_splits_arg: int,
                              build_name: Optional[str] = None) -> bool:
    """The fork before 5824e6e2 keeps a dynamic split vector when b <= 992 and the caller did not pass num_splits 1
    (the argument, not the split count chosen), the call only when varlen (flash_api.cpp@a8937124 624, 994)."""
    tests_arg = build_name is None or build(build_name).split_vector_tests_num_splits
    return (bool(precompute) or bool(uses_prepare)) and int(batch_size) <= MAX_BATCHES_1CTA and \
        (int(num_splits_arg) != 1 or not tests_arg)


def fork_metadata_vectors(uses_prepare: bool, batch_size: int, num_splits: int, swizzle: bool) -> int:
    """Per-batch vectors of the fork's metadata: prepare_seqlen_q, [dynamic splits], [heads-in-L2]; Sort is off.

    flash_api.cpp 689-699 (precompute) and 1079-1090 (call); the tensor is ``vectors * b4 + semaphore`` int32.
    """
    if not uses_prepare:
        return int(bool(swizzle))
    return 1 + int(fork_uses_dynamic_split(uses_prepare, batch_size, num_splits)) + int(bool(swizzle))


def check_build_name(name: Optional[str]) -> str:
    """The build name, defaulting to upstream; ValueError for an unknown one."""
    return build(UPSTREAM if name is None else name).name


def engine_sources_markdown() -> str:
    """The docs table (docs/fa3-builds.md): engine release, kernel package, FA3 source, build and its evidence."""
    lines = ["| engine release | kernel package | FA3 source | FA3 commit | build | evidence |",
             "|---|---|---|---|---|---|"]
    for r in engine_sources():
        commit = r["fa3_commit"][:12] if r["fa3_commit"] else "not recorded"
        if r.get("wheel"):
            evidence = f"wheel {r['wheel']['wheel']}, sha256 {r['wheel']['sha256'][:12]}"
        else:
            evidence = "source pin read" if r["verified"] else "pin not read"
        lines.append(f"| {r['engine']}=={r['release']} | {r['kernel_package']} {r['kernel_version']} | "
                     f"{r['fa3_repo']} | {commit} | `{r['build']}` | {evidence} |")
    return "\n".join(lines)
