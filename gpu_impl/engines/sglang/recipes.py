"""Which sglang releases this suite drives, and what each one's engine environment installs (data, no code).

Invariant: every release on :data:`RELEASES` precomputes FA3 scheduler metadata (``get_scheduler_metadata`` in
``python/sglang/srt/layers/attention/flashattention_backend.py`` first appears in 0.5.11, docs/facts-engines.md section 1);
releases before 0.5.11 have nothing to gate. A release's environment is: CPU torch pinned to the project's build,
sglang itself without its dependencies, the light pure-Python packages its import needs (pinned as that release's
own wheel metadata pins them, or by the table below), and real ``triton`` / ``xgrammar`` without dependencies.
The CUDA-only packages are faked (``gpu_impl/engines/fakes``), never installed.
"""

from __future__ import annotations

import hashlib
import json

#: The first sglang release with a FA3 metadata precompute (docs/facts-engines.md section 1).
FIRST_PRECOMPUTE = "0.5.11"

#: Releases this suite knows how to drive (0.5.11 .. 0.5.23; ``.post1`` releases are byte-identical to their base
#: in the attention backend and are not listed separately).
RELEASES = tuple(f"0.5.{n}" for n in range(11, 24))

#: The torch build every engine environment uses (the CPU wheel; never an unpinned torch).
TORCH = "torch==2.13.0"

#: Constraints for every install into an engine environment: torch stays the CPU build, and torchvision can never
#: be pulled in (it would replace the CPU torch with a CUDA build): no release has version 0.0.0, so a package that
#: depends on torchvision fails to resolve instead of installing it.
CONSTRAINTS = (TORCH, "torchvision==0.0.0")

#: Pure-Python packages sglang's attention backend and test kit import (docs/facts-engines.md section 2), installed with
#: their dependencies. A version pin comes from the release's own wheel metadata when it pins the package exactly.
LIGHT = ("orjson", "psutil", "pybase64", "requests", "pillow", "starlette", "msgspec", "pydantic", "pyzmq", "tqdm",
         "ipython", "aiohttp", "transformers", "tokenizers", "dill", "apache-tvm-ffi", "sentencepiece",
         "compressed-tensors", "gguf", "openai", "partial_json_parser", "einops", "uvicorn", "fastapi", "httpx",
         "xxhash", "zstandard", "numpy")

#: Installed for real with ``--no-deps`` (fakes of them break torch's own probes and pydantic).
NO_DEPS = ("triton", "xgrammar")

#: Per-release-range pins that override (or add to) the wheel's own: (first, last, {package: version}).
#: triton: the wheels pin none (it comes with CUDA torch); 3.9.0 imports on CPU with torch 2.13.
PINS = (
    ("0.5.11", "0.5.23", {"triton": "3.9.0"}),
)

#: Bumped when the way an environment is built changes (invalidates every cached environment).
LAYOUT_VERSION = 1


def release_key(release: str) -> tuple:
    """``"0.5.13"`` -> (0, 5, 13, 0); ``"0.5.10.post1"`` -> (0, 5, 10, 1). ValueError for anything else."""
    parts = release.split(".")
    post = 0
    if len(parts) == 4 and parts[3].startswith("post") and parts[3][4:].isdigit():
        post = int(parts[3][4:])
        parts = parts[:3]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a release number: {release!r}")
    return tuple(int(p) for p in parts) + (post,)


def has_precompute(release: str) -> bool:
    """Whether this release number is at or after the first FA3 metadata precompute (0.5.11)."""
    return release_key(release)[:3] >= release_key(FIRST_PRECOMPUTE)[:3]


def pins_for(release: str) -> dict:
    """The table's pins for one release (later ranges override earlier ones)."""
    key = release_key(release)
    out: dict = {}
    for first, last, pins in PINS:
        if release_key(first) <= key <= release_key(last):
            out.update(pins)
    return out


def nearest_release(version: str) -> str:
    """The registered release an sglang version (of a checkout or wheel) runs beside: the newest release at or
    before it, else the oldest one."""
    try:
        key = release_key(version.split("+")[0].split("rc")[0].split(".dev")[0])
    except ValueError:
        return RELEASES[-1]
    older = [r for r in RELEASES if release_key(r) <= key]
    return older[-1] if older else RELEASES[0]


def recipe(release: str) -> dict:
    """Everything that decides the contents of one release's environment (hashed into its stamp)."""
    return {"layout": LAYOUT_VERSION, "release": release, "torch": TORCH, "constraints": list(CONSTRAINTS),
            "light": list(LIGHT), "no_deps": list(NO_DEPS), "pins": pins_for(release)}


def recipe_hash(release: str) -> str:
    return hash_recipe(recipe(release))


def hash_recipe(data: dict) -> str:
    """The stamp hash of a recipe (any engine's): the first 16 hex digits of the sha256 of its sorted JSON."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
