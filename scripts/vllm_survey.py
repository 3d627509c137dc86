"""Survey vLLM's released wheels: which files the driver runs differ between releases, which driver generation each
release's API fits, and what each release's FlashAttention backend has (precompute, CUDA graphs, cascade, DCP, ...).

Usage::

    python scripts/vllm_survey.py SRC_DIR [--json OUT]

``SRC_DIR`` holds one folder per release, ``vllm-<V>/``, with the wheel's Python files unpacked (``vllm/**/*.py``
and the ``*.dist-info/METADATA``) and ``fa3_sha256.txt`` (the sha256 of ``vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so``);
made from the wheels by::

    for V in 0.8.5 ... 0.32.0; do pip download --no-deps vllm==$V -d W; done
    unzip -q W/vllm-$V-*.whl 'vllm/*.py' '*.dist-info/METADATA' -d SRC_DIR/vllm-$V
    unzip -p W/vllm-$V-*.whl vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so | sha256sum > SRC_DIR/vllm-$V/fa3_sha256.txt

What it reads, statically (no import, nothing run): the sha256 of every driven file (``DRIVEN``; the V2 runner's
folder as one hash); for each driver generation, every ``module.name`` of ``vllm_recipes.GENERATION_MODULES`` and
``COMMON_MODULES`` (plus ``STATIC_EXTRA``) that the release's sources do not define (a module file that is absent,
or a name bound nowhere at its top level); the metadata builder's ``__init__`` and ``build`` parameters; the
backend's features by the names its ``flash_attn.py`` uses (``FEATURES``); the wheel's torch and Python pins.
Releases next to each other whose driven files are byte-identical share a row (the newest of them is the row's
release). Writes ``gpu_impl/engines/vllm/survey.json`` (or ``--json OUT``); exit 0, 2 on bad input.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_impl.engines.vllm import recipes as vllm_recipes

#: the files whose code the driver runs or imitates (one hash each); a name in braces: every file under that folder
DRIVEN = ("vllm/v1/attention/backends/flash_attn.py", "vllm/v1/attention/backends/fa_utils.py",
          "vllm/attention/utils/fa_utils.py", "vllm/v1/attention/backends/utils.py", "vllm/v1/attention/backend.py",
          "vllm/v1/attention/backends/flash_attn_diffkv.py", "vllm/v1/worker/gpu_model_runner.py",
          "vllm/v1/worker/block_table.py", "vllm/v1/cudagraph_dispatcher.py", "vllm/v1/kv_cache_interface.py",
          "vllm/vllm_flash_attn/flash_attn_interface.py", "vllm/config/compilation.py", "vllm/config/attention.py",
          "vllm/config/vllm.py", "vllm/config.py", "{vllm/v1/worker/gpu}")

#: names the first generation's Config uses beyond GENERATION_MODULES (checked statically only)
STATIC_EXTRA = {"v0": {}, "v1": {"vllm.config.compilation": ["CUDAGraphMode"]},
                "v2": {}}

#: a backend feature -> a regular expression over ``flash_attn.py`` that shows it
FEATURES = {"precompute": r"get_scheduler_metadata", "full_cuda_graph": r"use_full_cuda_graph|cudagraph",
            "split_bound": r"max_num_splits", "cascade": r"use_cascade_attention|cascade_attention",
            "dcp": r"dcp_world_size", "local_attention": r"local_attn|attention_chunk",
            "sliding_window": r"sliding_window", "batch_invariant": r"batch_invariant|BATCH_INVARIANT",
            "fp8_kv": r"fp8", "softcap": r"softcap"}


def sha(path: Path):
    if path.is_dir():
        h = hashlib.sha256()
        for f in sorted(path.rglob("*.py")):
            h.update(str(f.relative_to(path)).encode() + b"\0" + f.read_bytes())
        return h.hexdigest()[:16]
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


def module_file(src: Path, module: str):
    base = src / module.replace(".", "/")
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def top_level_names(path: Path) -> set:
    tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):  # TYPE_CHECKING blocks and import fallbacks
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names.update((a.asname or a.name).split(".")[0] for a in sub.names)
                elif isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.add(sub.name)
    return names


def static_missing(src: Path, generation: str) -> list:
    """The ``module.name`` entries a generation needs that the release's sources define nowhere."""
    tables = (vllm_recipes.COMMON_MODULES, vllm_recipes.GENERATION_MODULES[generation], STATIC_EXTRA[generation])
    missing = []
    for table in tables:
        for key, names in table.items():
            candidates = [m.strip() for m in key.split("|")]
            files = {m: module_file(src, m) for m in candidates}
            have = {m: top_level_names(f) for m, f in files.items() if f is not None}
            def binds(m, n):  # a name "a | b" is either (vllm_recipes._binds)
                return any(a.strip() in have[m] for a in n.split("|"))

            module = next((m for m in candidates if m in have and all(binds(m, n) for n in names)), candidates[0])
            if module not in have:
                missing.append(f"{key} (no such module)")
                continue
            missing.extend(f"{module}.{n}" for n in names if not binds(module, n))
    return missing


def builder_params(fa: Path) -> dict:
    """The parameters of ``FlashAttentionMetadataBuilder.__init__`` and ``.build`` (none if absent)."""
    out = {"__init__": None, "build": None}
    if not fa.is_file():
        return out
    for node in ast.parse(fa.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == "FlashAttentionMetadataBuilder":
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name in out:
                    out[fn.name] = [a.arg for a in fn.args.args[1:]]
    return out


def wheel_meta(folder: Path) -> dict:
    meta = next(folder.glob("*.dist-info/METADATA"), None)
    text = meta.read_text() if meta else ""
    torch = re.search(r"^Requires-Dist: torch\s*(==[^\s;]+)", text, re.M)
    python = re.search(r"^Requires-Python: (.+)$", text, re.M)
    return {"torch": torch.group(1).lstrip("=") if torch else None,
            "requires_python": python.group(1).strip() if python else None}


def survey_release(folder: Path) -> dict:
    release = folder.name[len("vllm-"):]
    fa = folder / "vllm/v1/attention/backends/flash_attn.py"
    text = fa.read_text() if fa.is_file() else ""
    fa3 = folder / "fa3_sha256.txt"
    return {"release": release, **wheel_meta(folder),
            "fa3_library_sha256": fa3.read_text().split()[0][:16] if fa3.is_file() else None,
            "driven": {name.strip("{}"): sha(folder / name.strip("{}")) for name in DRIVEN},
            "features": sorted(k for k, rx in FEATURES.items() if re.search(rx, text)),
            "builder": builder_params(fa),
            "runners": [r for r, p in (("v1", "vllm/v1/worker/gpu_model_runner.py"),
                                       ("v2", "vllm/v1/worker/gpu/model_runner.py")) if (folder / p).is_file()],
            "missing": {g: static_missing(folder, g) for g in vllm_recipes.GENERATION_MODULES}}


def group_rows(surveyed: list) -> list:
    """Consecutive releases (oldest first) with byte-identical driven files share a row: its newest release."""
    rows = []
    for entry in surveyed:
        if rows and rows[-1]["driven"] == entry["driven"]:
            rows[-1]["releases"].append(entry["release"])
            rows[-1]["row"] = entry["release"]
        else:
            rows.append({"row": entry["release"], "releases": [entry["release"]], "driven": entry["driven"]})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="folder of vllm-<V>/ folders (the wheels' Python files unpacked)")
    p.add_argument("--json", default=str(ROOT / "gpu_impl/engines/vllm/survey.json"))
    args = p.parse_args(argv)
    src = Path(args.src)
    folders = [f for f in src.glob("vllm-*") if (f / ".done").is_file() and (f / "vllm").is_dir()] if src.is_dir() else []
    if not folders:
        print(f"src: {src} holds no vllm-<V>/ folder with an unpacked vllm/ package", file=sys.stderr)
        return 2
    folders.sort(key=lambda f: vllm_recipes.version_key(f.name[len("vllm-"):]))
    surveyed = [survey_release(f) for f in folders]
    rows = group_rows(surveyed)
    row_of = {r: row["row"] for row in rows for r in row["releases"]}
    for entry in surveyed:
        entry["row"] = row_of[entry["release"]]
    Path(args.json).write_text(json.dumps({"schema": "fa3verify.vllm-survey/1",
                                           "command": "python scripts/vllm_survey.py SRC_DIR",
                                           "driven_files": list(DRIVEN), "releases": surveyed},
                                          indent=1, sort_keys=False) + "\n")
    for row in rows:
        e = next(x for x in surveyed if x["release"] == row["row"])
        print(f"{'/'.join(row['releases']):28s} torch {e['torch']}  runners {','.join(e['runners'])}  "
              f"v1 missing {len(e['missing']['v1'])}  v2 missing {len(e['missing']['v2'])}  "
              f"builder {e['builder']['__init__']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
