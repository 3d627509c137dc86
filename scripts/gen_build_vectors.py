"""Generate FA3 test vectors for one named build from its own C++ (run once per build; the output is committed).

Invariant: every vector in fa3verify/fidelity_vectors/<build>.json is what that build's own host code returns for
the input beside it, computed by compiling the build's ``hopper/tile_size.h`` and ``hopper/heuristics.h`` (read with
``git show COMMIT:PATH`` from a local git directory of the build's repository, never copied into the project) with
a driver written here, on the CPU with g++.

Usage::

    python scripts/gen_build_vectors.py BUILD GIT_DIR [--out PATH]

``BUILD`` is a name in refmodel/fa3_builds.json (its repo and commit); ``GIT_DIR`` a git directory of that repository
holding the commit. Exit codes: 0 written, 2 bad input (unknown build, commit not in GIT_DIR, no g++).

Grids (the same for every build; ``use_one_mma_wg`` only where the build has it):

* ``tile_size_fwd_sm90``: rounded d in {64, 96, 128, 192, 256} x dv in {64, 96, 128, 192, 256, 512} x causal x local x
  element size {1, 2} x v_colmajor x paged_kv_non_TMA x softcap (x use_one_mma_wg);
* ``num_splits_heuristic``: total_mblocks 1..160 x SMs {108, 132} x n_blocks {1, 4, 5, 16, 200} x m_blocks {1, 264}
  x KV-head bytes {50 MiB, 50 MiB + 1, 2^31 - 1} x causal_or_local, max_splits 128;
* ``should_pack_gqa``: varlen x seqlen_q 1..300 x qhpk {1, 2, 4, 8, 16} x kBlockM {64, 128, 192};
* ``use_one_mma_wg``: arch {80, 90, 100} x d 8..256 step 8 x local x seqlen_q 1..20 x (h, h_k) in
  {(8,8), (8,1), (32,4), (64,1), (65,1), (16,2)}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from refmodel.fa3_builds import build  # noqa: E402

HEADERS = ("tile_size.h", "heuristics.h", "flash.h")

#: Stand-in for <cuda.h>: flash.h needs only fixed-width ints and a stream type on the host.
CUDA_STUB = "#pragma once\n#include <cstdint>\ntypedef void* cudaStream_t;\n"

DRIVER = r"""
#include <algorithm>
#include <cmath>
#include <cstdio>
#include "heuristics.h"
#include "tile_size.h"

int main() {
    int const ds[] = {64, 96, 128, 192, 256};
    int const dvs[] = {64, 96, 128, 192, 256, 512};
    for (int d : ds) for (int dv : dvs) for (int c = 0; c < 2; ++c) for (int l = 0; l < 2; ++l)
    for (int e = 1; e <= 2; ++e) for (int vc = 0; vc < 2; ++vc) for (int pg = 0; pg < 2; ++pg)
    for (int sc = 0; sc < 2; ++sc) for (int wg = 0; wg < NUM_WG; ++wg) {
        auto t = tile_size_fwd_sm90(d, dv, c, l, e, vc, pg, sc TILE_WG_ARG);
        std::printf("T %d %d %d %d %d %d %d %d %d %d %d\n", d, dv, c, l, e, vc, pg, sc, wg, std::get<0>(t), std::get<1>(t));
    }
    int const sms[] = {108, 132};
    int const nbs[] = {1, 4, 5, 16, 200};
    int const mbs[] = {1, 264};
    int const sizes[] = {50 * 1024 * 1024, 50 * 1024 * 1024 + 1, 2147483647};
    for (int tot = 1; tot <= 160; ++tot) for (int sm : sms) for (int nb : nbs) for (int mb : mbs)
    for (int sz : sizes) for (int cl = 0; cl < 2; ++cl)
        std::printf("S %d %d %d %d %d %d %d\n", tot, sm, nb, mb, sz, cl, num_splits_heuristic(tot, sm, nb, mb, sz, cl, 128));
    int const qs[] = {1, 2, 4, 8, 16};
    int const bms[] = {64, 128, 192};
    for (int v = 0; v < 2; ++v) for (int sq = 1; sq <= 300; ++sq) for (int q : qs) for (int bm : bms)
        std::printf("P %d %d %d %d %d\n", v, sq, q, bm, int(should_pack_gqa(v, sq, q, bm)));
#if HAS_WG
    int const archs[] = {80, 90, 100};
    int const heads[][2] = {{8, 8}, {8, 1}, {32, 4}, {64, 1}, {65, 1}, {16, 2}};
    for (int a : archs) for (int d = 8; d <= 256; d += 8) for (int l = 0; l < 2; ++l)
    for (int sq = 1; sq <= 20; ++sq) for (auto const& hh : heads) {
        Flash_fwd_params p{};
        p.arch = a; p.d = d; p.is_local = l; p.seqlen_q = sq; p.h = hh[0]; p.h_k = hh[1];
        std::printf("W %d %d %d %d %d %d %d\n", a, d, l, sq, hh[0], hh[1], int(use_one_mma_wg(p)));
    }
#endif
    return 0;
}
"""


def _git_show(git_dir: str, commit: str, path: str) -> str:
    out = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"], capture_output=True, text=True)
    if out.returncode != 0:
        _fail(f"GIT_DIR: cannot read {commit}:{path} from {git_dir}")
    return out.stdout


def _fail(message: str):
    print(f"gen_build_vectors: {message}", file=sys.stderr)
    raise SystemExit(2)


def generate(build_name: str, git_dir: str) -> dict:
    """Compile the build's headers with the driver, run it, and return the vectors as a JSON-ready dict."""
    try:
        b = build(build_name)
    except ValueError as exc:
        _fail(str(exc))
    if shutil.which("g++") is None:
        _fail("g++: not found on PATH")
    tile_h = _git_show(git_dir, b.commit, "hopper/tile_size.h")
    has_wg = "use_one_mma_wg" in tile_h
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "tile_size.h").write_text(tile_h)
        for name in HEADERS[1:]:
            (tmp_path / name).write_text(_git_show(git_dir, b.commit, f"hopper/{name}"))
        (tmp_path / "cuda.h").write_text(CUDA_STUB)
        defs = {"NUM_WG": "2" if has_wg else "1", "TILE_WG_ARG": ", bool(wg)" if has_wg else "",
                "HAS_WG": "1" if has_wg else "0"}
        src = "".join(f"#define {k} {v}\n" for k, v in defs.items()) + DRIVER
        (tmp_path / "driver.cpp").write_text(src)
        exe = tmp_path / "driver"
        cc = subprocess.run(["g++", "-std=c++17", "-O1", f"-I{tmp}", str(tmp_path / "driver.cpp"), "-o", str(exe)],
                            capture_output=True, text=True, timeout=600)
        if cc.returncode != 0:
            _fail(f"g++ failed: {cc.stderr.strip()[:2000]}")
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, check=True)
    out = {"schema": "fa3verify.build_vectors/1", "build": b.name, "repo": b.repo, "commit": b.commit,
           "generator": "scripts/gen_build_vectors.py", "has_use_one_mma_wg": has_wg,
           "tiles": [], "splits": [], "pack": [], "one_mma_wg": []}
    key = {"T": "tiles", "S": "splits", "P": "pack", "W": "one_mma_wg"}
    for line in run.stdout.splitlines():
        tag, *values = line.split()
        out[key[tag]].append([int(v) for v in values])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("git_dir")
    ap.add_argument("--out", default=None, help="default: fa3verify/fidelity_vectors/BUILD.json")
    args = ap.parse_args(argv)
    data = generate(args.build, args.git_dir)
    out = Path(args.out) if args.out else ROOT / "fa3verify" / "fidelity_vectors" / f"{args.build}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {out}: {', '.join(f'{k} {len(data[k])}' for k in ('tiles', 'splits', 'pack', 'one_mma_wg'))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
