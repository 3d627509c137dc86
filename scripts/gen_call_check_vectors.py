"""Generate the appended-KV acceptance vectors of upstream's ``mha_fwd`` from its own C++ (run once; output committed).

Invariant: every vector in fa3verify/fidelity_vectors/call_checks/upstream-0251105a.json is what 0251105a's
``mha_fwd`` decides for the input beside it, computed by compiling its appended-KV checks (the three
``TORCH_CHECK`` lines of the ``if (k_new_.has_value())`` block, ``hopper/flash_api.cpp`` 931-933, read with ``git
show COMMIT:hopper/flash_api.cpp`` from a local git directory and never copied into the project) inside a driver
written here, on the CPU with g++. ``TORCH_CHECK`` throws its message; ``k_new_``, ``v_new_`` and ``seqused_k_`` are
``std::optional`` values as in ``mha_fwd``'s signature; ``seqlen_q`` and ``seqlen_k`` are the ints ``mha_fwd`` has
computed by then (lines 807-835: q's size(1) or ``max_seqlen_q``; the cache's size(1) or pages x page size).

Usage::

    python scripts/gen_call_check_vectors.py GIT_DIR [--out PATH]

``GIT_DIR`` is a git directory of Dao-AILab/flash-attention holding 0251105a. Exit codes: 0 written, 2 bad input
(commit not in GIT_DIR, the three checks not found, no g++).

Grid: k_new none / dense with 1, 8, 100 or 8192 rows / varlen (``cu_seqlens_k_new``, whose ``seqlen_knew`` is 0) x
``seqused_k`` passed or not x ``cu_seqlens_q`` passed or not x seqlen_q in {1, 2, 8, 64, 100} x the cache's
seqlen_k in {1, 8, 64, 100, 4096}; ``v_new`` is passed whenever ``k_new`` is (the model has no ``v_new``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPO, COMMIT = "Dao-AILab/flash-attention", "0251105a"
OUT = ROOT / "fa3verify" / "fidelity_vectors" / "call_checks" / "upstream-0251105a.json"
#: the checks' messages, in mha_fwd's order; a check's index + 1 is the code the driver prints for it
MESSAGES = ("If k_new is supplied, v_new must also be passed in", "If k_new is supplied, seqlens_k must also be passed in",
            "If k_new is supplied, it must have seqlen <= the seqlen of the KV cache")
K_NEW = (None, 1, 8, 100, 8192, "varlen")
SEQLEN_Q = (1, 2, 8, 64, 100)
SEQLEN_K = (1, 8, 64, 100, 4096)

DRIVER = r"""
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#define TORCH_CHECK(cond, msg) do { if (!(cond)) throw std::runtime_error(msg); } while (0)
static char const* const MESSAGES[] = {%s};

int decide(bool has_knew, bool has_vnew, bool has_seqused, int seqlen_q, int seqlen_k) {
    std::optional<int> k_new_, v_new_, seqused_k_;
    if (has_knew) k_new_ = 1;
    if (has_vnew) v_new_ = 1;
    if (has_seqused) seqused_k_ = 1;
    try {
        if (k_new_.has_value()) {
%s
        }
    } catch (std::runtime_error const& e) {
        for (int i = 0; i < 3; ++i) if (!std::strcmp(e.what(), MESSAGES[i])) return i + 1;
        return 9;
    }
    return 0;
}

int main() {
    int a, b, c, q, k;
    while (std::scanf("%%d %%d %%d %%d %%d", &a, &b, &c, &q, &k) == 5) std::printf("%%d\n", decide(a, b, c, q, k));
}
"""


def _fail(message: str):
    print(f"gen_call_check_vectors: {message}", file=sys.stderr)
    raise SystemExit(2)


def checks_from_source(source: str) -> list:
    """The three TORCH_CHECK lines of mha_fwd's k_new block, as upstream wrote them (with their line numbers)."""
    lines = source.splitlines()
    found = [(i + 1, line.strip()) for i, line in enumerate(lines)
             if line.strip().startswith("TORCH_CHECK(") and any(f'"{m}"' in line for m in MESSAGES)]
    if [n for n, _ in found] != sorted(n for n, _ in found) or len(found) != 3 or \
            any(f'"{m}"' not in text for m, (_, text) in zip(MESSAGES, found)):
        _fail(f"the three appended-KV checks were not found in order in hopper/flash_api.cpp (got {found})")
    return found


def grid() -> list:
    """(k_new, seqused_k passed, cu_seqlens_q passed, seqlen_q, seqlen_k) in a fixed order."""
    return list(itertools.product(K_NEW, (False, True), (False, True), SEQLEN_Q, SEQLEN_K))


def generate(git_dir: str) -> dict:
    if shutil.which("g++") is None:
        _fail("g++ not found")
    out = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{COMMIT}:hopper/flash_api.cpp"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        _fail(f"GIT_DIR: cannot read {COMMIT}:hopper/flash_api.cpp from {git_dir}")
    checks = checks_from_source(out.stdout)
    messages = ", ".join(json.dumps(m) for m in MESSAGES)
    body = "\n".join(" " * 12 + text for _, text in checks)
    points = grid()
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "driver.cpp", Path(tmp) / "driver"
        src.write_text(DRIVER % (messages, body))
        cc = subprocess.run(["g++", "-std=c++17", "-O1", str(src), "-o", str(exe)], capture_output=True, text=True)
        if cc.returncode != 0:
            _fail(f"g++ failed: {cc.stderr[:2000]}")
        stdin = "".join(f"{int(kn is not None)} {int(kn is not None)} {int(su)} {q} {k}\n"
                        for kn, su, _, q, k in points)
        run = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, timeout=120, check=True)
    codes = [int(x) for x in run.stdout.split()]
    vectors = [{"k_new": kn, "seqused_k": su, "cu_seqlens_q": cq, "seqlen_q": q, "seqlen_k": k,
                "rejected": None if code == 0 else MESSAGES[code - 1]}
               for (kn, su, cq, q, k), code in zip(points, codes)]
    return {"repo": REPO, "commit": COMMIT, "file": "hopper/flash_api.cpp",
            "lines": [n for n, _ in checks], "generator": "scripts/gen_call_check_vectors.py", "vectors": vectors}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("git_dir")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    data = generate(args.git_dir)
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    rejected = sum(v["rejected"] is not None for v in data["vectors"])
    print(f"wrote {args.out}: {len(data['vectors'])} vectors, {rejected} rejected, lines {data['lines']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
