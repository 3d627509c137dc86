"""Which vLLM releases this suite drives, and what each one's engine environment installs (data, no code).

Invariant: a vLLM environment holds the project's CPU torch, vLLM itself installed without dependencies (its wheel
pins torch 2.14 with CUDA), the light pure-Python packages the FlashAttention backend's import chain asks for, and
``xgrammar`` / ``triton`` without dependencies (found by importing ``vllm/v1/attention/backends/flash_attn.py`` of
vLLM 0.33.0 on CPU; docs/engines-vllm.md). The constraints keep torch the CPU build and make torchvision /
torchaudio / torchcodec unresolvable (each replaces or breaks the CPU torch; transformers probes torchvision, so
the sglang fakes' torchvision stand-in is on the driver's path). Built by ``gpu_impl.engines.envs``.
"""

from __future__ import annotations

import json
from pathlib import Path

#: The packages a vLLM environment installs by name (the import chain of the FlashAttention backend, found by the
#: import probe); a row with ``wheel_pins`` takes their versions from the wheel's own Requires-Dist.
LIGHT = ["numpy", "packaging", "regex", "cachetools", "psutil", "tqdm", "pyyaml", "pydantic", "msgspec",
         "cloudpickle", "blake3", "py-cpuinfo", "pyzmq", "einops", "typing_extensions", "filelock", "requests",
         "cbor2", "pybase64", "orjson", "transformers", "aiohttp", "oss-harmony", "openai", "pillow", "uvloop",
         "prometheus_client", "opentelemetry-api", "starlette", "partial_json_parser", "fastapi", "llguidance",
         "apache-tvm-ffi"]
CONSTRAINTS = ["torch==2.13.0", "torchvision==0.0.0", "torchaudio==0.0.0", "torchcodec==0.0.0"]


def _pinned_by_wheel(*extra: str) -> dict:
    """A row whose packages are :data:`LIGHT` (and ``extra``: what the release's import probe found missing) at the
    wheel's own versions (``wheel_pins``)."""
    return {"torch": "torch==2.13.0", "constraints": list(CONSTRAINTS), "light": list(LIGHT) + list(extra),
            "no_deps": ["xgrammar", "triton==3.9.0"], "wheel_pins": True}


#: Releases whose backend import chain imports ``gguf`` (``vllm/transformers_utils/config.py`` ->
#: ``gguf_utils``, 0.12.0 .. 0.23.0): found by the import probe ("No module named 'gguf'"); 0.10.1 .. 0.11.2 import
#: it where vLLM's own validation inspects the model class (a subprocess of ``vllm.model_executor.models.registry``).
_GGUF = ("0.10.1", "0.10.2", "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.1", "0.15.0", "0.15.1",
         "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.2", "0.21.0",
         "0.22.1", "0.23.0")

#: Releases whose ``vllm/utils/__init__.py`` imports ``setproctitle`` at import: found by the import probe ("No
#: module named 'setproctitle'").
_SETPROCTITLE = ("0.10.1", "0.10.2", "0.11.0")

#: Releases whose model inspection (``vllm/model_executor/layers/fused_moe/config.py``, imported by every model
#: module through ``model_loader``) imports ``compressed_tensors``: without it vLLM's own validation rejects every
#: model ("Model architectures ... failed to be inspected"; the import in the release's environment: "No module
#: named 'compressed_tensors'").
_COMPRESSED_TENSORS = ("0.10.0", "0.10.1", "0.10.2")

#: What the V1 model-runner module (``vllm/v1/worker/gpu_model_runner.py``, which holds the cascade rule
#: ``_compute_cascade_attn_prefix_len``) imports beyond the backend's chain, per package: found by importing that
#: module in each release's environment with the driver's glue installed (``paths._runner_class``), adding the
#: missing module's package at the wheel's own version to a throwaway ``--target`` folder on the path, and importing
#: again until it imported; each list then confirmed by the same import in the rebuilt environment. ``numba``:
#: ``vllm/v1/spec_decode/ngram_proposer.py`` (0.10.1 .. 0.15.1; the wheels pin 0.61.2, 0.10.1 .. 0.11.0 under the
#: marker ``python_version > "3.9"``); ``mistral-common``: ``vllm/tokenizers/mistral.py``, imported by
#: ``vllm/v1/structured_output/backend_xgrammar.py`` (0.14.1 .. 0.16.0); ``diskcache``:
#: ``vllm/v1/structured_output/utils.py`` (0.10.1 .. 0.19.1; pinned 5.6.3). 0.20.0 on import the module without them.
_RUNNER_MODULE = {
    "numba": ("0.10.1", "0.10.2", "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.1", "0.15.0", "0.15.1"),
    "mistral-common": ("0.14.1", "0.15.0", "0.15.1", "0.16.0"),
    "diskcache": ("0.10.1", "0.10.2", "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.1", "0.15.0", "0.15.1",
                  "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0", "0.19.1"),
}


def _runner_module_packages(release: str) -> tuple:
    """The packages of :data:`_RUNNER_MODULE` that ``release``'s V1 runner module needs."""
    return tuple(package for package, releases in _RUNNER_MODULE.items() if release in releases)


#: Per release: what its environment installs (hashed into the stamp, with the layout version and the release):
#: ``light`` with dependencies (under the constraints), ``no_deps`` without. ``apache-tvm-ffi`` is xgrammar's
#: binding (``tvm_ffi``): found missing by the import probe of a build from nothing. Releases 0.10.1 .. 0.32.0 are
#: rows of the release survey (``vllm/survey.json``, scripts/vllm_survey.py); their wheels pin torch 2.7.1
#: (0.10.1), 2.8.0 (0.10.2, 0.11.0), 2.9.0 (0.11.1 .. 0.13), 2.9.1 (0.14 .. 0.16), 2.10.0 (0.17 .. 0.19), 2.11.0 (0.20 .. 0.26) or
#: 2.13.0; each runs on the project's CPU torch 2.13.0 (vLLM itself installed without dependencies) as far as its
#: import probe and its gate show.
#: Releases 0.8.5 .. 0.10.0, whose builder reads the model runner object (driver generation ``v0``): their wheels
#: leave transformers unbounded above (``>=4.51.1``); the 5.x line removed names their import chain reads, so the row
#: bounds it to the 4.x line of their time.
_RUNNER_BOUND = ("0.8.5", "0.8.5.post1", "0.9.0", "0.9.1", "0.9.2", "0.10.0")

RECIPES = {
    **{release: _pinned_by_wheel("gguf", "setproctitle", "transformers<4.54",
                                 *(("compressed-tensors",) if release in _COMPRESSED_TENSORS else ()))
       for release in _RUNNER_BOUND},
    **{release: _pinned_by_wheel(*(("gguf",) if release in _GGUF else ()),
                                 *(("setproctitle",) if release in _SETPROCTITLE else ()),
                                 *(("compressed-tensors",) if release in _COMPRESSED_TENSORS else ()),
                                 *_runner_module_packages(release)) for release in ("0.10.1", "0.10.2", "0.11.0", "0.11.1", "0.11.2", "0.12.0", "0.13.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1", "0.19.0",
                                                   "0.19.1", "0.20.0", "0.20.2", "0.21.0", "0.22.1", "0.23.0",
                                                   "0.24.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0",
                                                   "0.30.0", "0.31.0", "0.32.0")},
    "0.33.0": {
        "torch": "torch==2.13.0",
        "constraints": list(CONSTRAINTS),
        "light": ["numpy", "packaging", "regex", "cachetools", "psutil", "tqdm", "pyyaml", "pydantic", "msgspec",
                  "cloudpickle", "blake3", "py-cpuinfo", "pyzmq", "einops", "typing_extensions", "filelock",
                  "requests", "cbor2", "pybase64", "orjson", "transformers>=5.16.1,<5.21.0", "aiohttp",
                  "oss-harmony", "openai", "pillow", "uvloop", "prometheus_client", "opentelemetry-api",
                  "starlette", "partial_json_parser", "fastapi", "llguidance<1.8.0,>=1.7.0",
                  "apache-tvm-ffi==0.1.11"],
        "no_deps": ["xgrammar==0.2.8", "triton==3.9.0"],
    },
    # 0.34.0: the same packages by name; their versions are the wheel's own specifiers (``wheel_pins``: read from
    # the installed vllm's Requires-Dist by ``wheel_requirements``), so a new release's row is its name and list.
    "0.34.0": _pinned_by_wheel(),
}
RELEASES = tuple(RECIPES)

#: The release survey's verdicts (``vllm/releases.json``, from ``scripts/vllm_survey.py``'s reading of every
#: wheel 0.8.5 .. 0.32.x): ``shares_row``: a release whose driven files are byte-identical to a registered row's
#: release (it runs as that row); ``unavailable``: a release this suite cannot run, with the exact reason.
RELEASES_FILE = Path(__file__).resolve().parent / "releases.json"
_STATUS = json.loads(RELEASES_FILE.read_text())
SHARES_ROW = dict(_STATUS["shares_row"])
UNAVAILABLE = {release: entry["reason"] for release, entry in _STATUS["unavailable"].items()}


SURVEY_FILE = Path(__file__).resolve().parent / "survey.json"

#: The first release whose FlashAttention backend precomputes FA3 scheduler metadata (the survey's first entry);
#: the registry's releases before it (``releases.json`` ``registry_releases``: 0.8.0 .. 0.8.4) have nothing to gate.
FIRST_PRECOMPUTE = "0.8.5"


def version_key(release: str) -> tuple:
    """A vLLM version number as a sortable tuple: ``0.9.0.1`` and ``0.8.5.post1`` included (four parts, a post
    number); ValueError for anything else."""
    import re

    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.(\d+))?(?:\.post(\d+))?", str(release))
    if not m:
        raise ValueError(f"not a release number: {release!r}")
    return tuple(int(x or 0) for x in m.groups())


WITHOUT_PRECOMPUTE = tuple(r for r in _STATUS["registry_releases"] if version_key(r) < version_key(FIRST_PRECOMPUTE))


def survey_gaps(survey: dict, recipes=None, shares=None, unavailable=None) -> list:
    """What the release survey (``vllm/survey.json``) and the rows disagree on, as sentences: a surveyed release
    that is neither a row, nor shares one, nor unavailable with a reason; a release that shares a row whose driven
    files are not byte-identical to its own; a row or a shared release the survey does not list."""
    recipes = RECIPES if recipes is None else recipes
    shares = SHARES_ROW if shares is None else shares
    unavailable = UNAVAILABLE if unavailable is None else unavailable
    by_release = {e["release"]: e for e in survey["releases"]}
    gaps = []
    for release, entry in by_release.items():
        if release in recipes:
            continue
        if release in shares:
            row = by_release.get(shares[release])
            if shares[release] not in recipes:
                gaps.append(f"{release}: shares row {shares[release]}, which is no row of RECIPES")
            elif row is None or row["driven"] != entry["driven"]:
                gaps.append(f"{release}: shares row {shares[release]}, but its driven files differ from that "
                            f"release's (or the survey lacks it)")
        elif not str(unavailable.get(release) or "").strip():
            gaps.append(f"{release}: surveyed, but neither a row, nor sharing one, nor unavailable with a reason")
    newest = max((version_key(r) for r in by_release), default=None)
    for release in list(shares) + list(recipes):
        if release not in by_release and newest is not None and version_key(release) <= newest:
            gaps.append(f"{release}: a row or shared release in the survey's range that the survey does not list")
    return gaps


def survey_markdown(survey: dict) -> str:
    """The docs table of the release survey (docs/engines-vllm.md, "The release survey"): one line per row of
    releases with byte-identical driven files: the releases, the row that runs them, the wheel's torch pin, the
    driver generation or why unavailable, and the backend features the survey read."""
    lines = ["| releases | row | wheel's torch | status | backend features read |", "|---|---|---|---|---|"]
    groups: dict = {}
    for e in survey["releases"]:
        groups.setdefault(e["row"], []).append(e)
    for row, entries in groups.items():
        names = [e["release"] for e in entries]
        registered = next((row_of(n) for n in names if row_of(n) is not None), None)
        if registered is not None:
            row, status = registered, f"driven, generation {DRIVER_GENERATIONS[registered]}"
        else:
            row, status = "-", "unavailable: " + "; ".join(sorted({UNAVAILABLE.get(n, "not recorded") for n in names}))
        lines.append(f"| {', '.join(names)} | {row} | {entries[-1]['torch']} | {status} | "
                     f"{', '.join(entries[-1]['features'])} |")
    return "\n".join(lines)


def row_of(release: str):
    """The registered row that runs ``release`` (itself, or the row it shares); None if neither."""
    return release if release in RECIPES else SHARES_ROW.get(release)


#: Which driver generation drives each release (not hashed into the environment): ``v1`` imitates the V1 model
#: runner (``vllm/v1/worker/gpu_model_runner.py``, ``block_table.py``), ``v2`` runs the V2 runner's own input and
#: CUDA-graph code (``vllm/v1/worker/gpu/``; 0.34.0 deleted the V1 runner). ``GENERATION_MODULES``: what each
#: generation imports from the release beyond the backend (``vllm_driver.py``, ``vllm_driver_v2.py``): an
#: unregistered release is tried against them (``probe_generation``).
DRIVER_GENERATIONS = {**{r: "v1" for r in RECIPES if r != "0.34.0"}, **{r: "v0" for r in _RUNNER_BOUND},
                      "0.34.0": "v2"}
#: A module key ``"a | b"`` means the names live in the first of those modules that has them (a release moved them):
#: :func:`locate` finds them, :func:`missing_for_generation` counts them missing only where no candidate has them.
GENERATION_MODULES = {
    "v0": {"vllm.v1.worker.block_table": ["BlockTable"],
           "vllm.model_executor.layers.attention | vllm.attention.layer": ["Attention"]},
    "v1": {"vllm.v1.worker.block_table": ["MultiGroupBlockTable"],
           "vllm.v1.attention.backend | vllm.v1.attention.backends.utils": ["CommonAttentionMetadata"],
           "vllm.model_executor.layers.attention | vllm.attention.layer": ["Attention"]},
    "v2": {"vllm.v1.kv_cache_interface": ["KVCacheConfig", "KVCacheGroupSpec"],
           # the block-table width: get_block_table_width (kv_cache_interface from 0.34, the V1 block table's module
           # 0.27 .. 0.33), before 0.27 the V1 block table's MultiGroupBlockTable (driver_v2.ConfigV2.table_width)
           "vllm.v1.kv_cache_interface | vllm.v1.worker.block_table": ["get_block_table_width | MultiGroupBlockTable"],
           "vllm.v1.worker.gpu.cudagraph_utils": ["CudaGraphManager", "BatchExecutionDescriptor",
                                                  "prepare_inputs_to_capture"],
           "vllm.v1.worker.gpu.input_batch": ["InputBatch", "InputBuffers"],
           "vllm.v1.worker.gpu.model_states.default": ["DefaultModelState"],
           "vllm.v1.worker.utils": ["AttentionGroup"]},
    # the V2 runner's first CUDA-graph API (0.17.0 .. 0.17.1, driver_v2_early): graphs keyed by token count, the
    # runner asking get_cudagraph_runtime_mode, no BatchExecutionDescriptor; beside the V1 runner only
    "v2early": {"vllm.v1.kv_cache_interface": ["KVCacheConfig", "KVCacheGroupSpec"],
                "vllm.v1.worker.gpu.cudagraph_utils": ["CudaGraphManager", "get_cudagraph_sizes",
                                                       "prepare_inputs_to_capture"],
                "vllm.v1.worker.gpu.dp_utils": ["get_cudagraph_and_dp_padding"],
                "vllm.v1.worker.gpu.input_batch": ["InputBatch", "InputBuffers"],
                "vllm.v1.worker.gpu.model_states.default": ["DefaultModelState"],
                "vllm.v1.worker.utils": ["AttentionGroup"]},
    # the V2 runner's first form (0.12.0 .. 0.16.0, driver_v2_first): FULL graphs only, the metadata built inline by
    # the runner through build_attn_metadata, no model states; beside the V1 runner only
    "v2first": {"vllm.v1.kv_cache_interface": ["KVCacheConfig", "KVCacheGroupSpec"],
                "vllm.v1.worker.gpu.cudagraph_utils": ["CudaGraphManager", "get_cudagraph_size",
                                                       "prepare_inputs_to_capture"],
                "vllm.v1.worker.gpu.attn_utils": ["build_attn_metadata", "init_attn_backend"]},
}
#: The config class of each generation that drives a V2 runner beside the V1 runner (a case's ``vllm.runner`` "v2"):
#: which one a release takes is data, releases.json ``v2_runner.generation`` (:func:`v2_runner_generation`).
V2_RUNNER_CONFIGS = {"v2": "gpu_impl.engines.vllm.driver_v2:ConfigV2",
                     "v2early": "gpu_impl.engines.vllm.driver_v2_early:ConfigV2Early",
                     "v2first": "gpu_impl.engines.vllm.driver_v2_first:ConfigV2First"}


def v2_runner_table(name=None) -> dict:
    """releases.json ``v2_runner`` (read once, with the rest of the file, at import), or its table ``name`` ({} where
    absent): the one reader of it for the driver generations, the paths and the tests."""
    table = _STATUS["v2_runner"]
    return table if name is None else table.get(name, {})


def v2_runner_generation(release) -> str:
    """The driver generation of ``release``'s V2 runner where it ships both runners: the one releases.json
    ``v2_runner.generation`` lists it under, else ``v2``."""
    table = v2_runner_table("generation")
    return next((g for g, releases in table.items() if g != "about" and release in releases), "v2")


def v2_runner_config(generation: str):
    """The config class that drives a V2 runner under ``generation`` (:data:`V2_RUNNER_CONFIGS`)."""
    import importlib

    module, name = V2_RUNNER_CONFIGS[generation].split(":")
    return getattr(importlib.import_module(module), name)
COMMON_MODULES = {"vllm.v1.attention.backends.flash_attn": ["FlashAttentionMetadataBuilder", "FlashAttentionImpl",
                                                            "FlashAttentionBackend"],
                  "vllm.v1.attention.backends.fa_utils | vllm.attention.utils.fa_utils": ["get_flash_attn_version"],
                  "vllm.v1.kv_cache_interface": ["FullAttentionSpec", "SlidingWindowSpec"],
                  "vllm.config": ["VllmConfig", "CompilationConfig"]}

#: Bumped when the way a vLLM environment is built changes (invalidates every cached vLLM environment).
LAYOUT_VERSION = 1

#: The import probe: the backend module with the CPU glue installed, and FA3 (not FA2) chosen by vLLM's own helper.
PROBE = ("from gpu_impl.engines.vllm import glue as vllm_glue; vllm_glue.install(); "
         "from gpu_impl.engines.vllm.recipes import locate; import vllm.v1.attention.backends.flash_attn; "
         "v = locate('get_flash_attn_version')(); assert v == 3, v; print('fa', v)")

#: A local copy of the release's wheel, installed instead of asking the registry, when this variable names one.
WHEEL_VARIABLE = "FA3VERIFY_VLLM_WHEEL"


def nearest_generation(release: str) -> tuple:
    """(registered release, its driver generation) nearest to ``release``: the newest registered release at or
    before it, else the oldest; ValueError for a string that is no release number."""
    from gpu_impl.engines.sglang.recipes import release_key

    key = release_key(release)
    older = [r for r in RELEASES if release_key(r) <= key]
    nearest = older[-1] if older else RELEASES[0]
    return nearest, DRIVER_GENERATIONS[nearest]


def unregistered_message(release: str) -> str:
    """What a user of an unregistered ``vllm==release`` is told: the nearest driver generation, how to try the
    release's own code with it, and the data a new release needs (docs/engines-vllm.md, "Adding a release")."""
    try:
        nearest, generation = nearest_generation(release)
    except ValueError:
        return "not a release number"
    return (f"the nearest driver generation is {generation} (vllm=={nearest}'s): --engine vllm-src=<the vllm "
            f"{release} wheel> runs the release's own code with it and names every module the generation needs that "
            f"the release lacks; to register it: a row in "
            f"gpu_impl/engines/vllm/recipes.py (RECIPES, DRIVER_GENERATIONS), a profile in "
            f"gpu_impl/engines/vllm/profiles.json and its FA3 source in refmodel/fa3_builds.json")


def missing_for_generation(generation: str, source=None) -> list:
    """The ``module.name`` entries of ``GENERATION_MODULES[generation]`` and ``COMMON_MODULES`` that the imported
    vllm lacks (an import that fails names its module once, with the error). ``source``: a checkout put first on the
    path; a module it does not hold itself (so the release's copy would be imported in its place) counts as missing.
    Run inside an engine environment."""
    import importlib
    import os

    missing = []
    for table in (COMMON_MODULES, GENERATION_MODULES[generation]):
        for key, names in table.items():
            candidates = [m.strip() for m in key.split("|")]
            module = next((m for m in candidates if _has_all(m, names)), candidates[0])
            try:
                mod = importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 - what the release lacks is the answer
                missing.append(f"{module} ({type(exc).__name__}: {exc})")
                continue
            where = os.path.realpath(getattr(mod, "__file__", "") or "")
            if source and not os.path.abspath(getattr(mod, "__file__", "") or "").startswith(os.path.abspath(source)):
                missing.append(f"{module} (not in the checkout: the release's {where} would stand in)")
                continue
            missing.extend(f"{module}.{n}" for n in names if not _binds(mod, n))
    return missing


def _binds(mod, name: str) -> bool:
    """Whether ``mod`` binds ``name``; a name ``"a | b"`` is either (what a generation uses in a release that
    lacks the first: ``get_block_table_width``, else the V1 block table that applies the same rule)."""
    return any(hasattr(mod, n.strip()) for n in name.split("|"))


def _has_all(module: str, names) -> bool:
    """Whether ``module`` imports and binds every one of ``names`` (an import error: no)."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a candidate that does not import is not the one
        return False
    return all(_binds(mod, n) for n in names)


def locate(name: str):
    """The object ``name`` of the imported vllm, from the first module of its ``GENERATION_MODULES``
    or ``COMMON_MODULES`` key that has it (a name a release moved: ``Attention`` lived in ``vllm.attention.layer``
    before 0.16, ``get_flash_attn_version`` in ``vllm.attention.utils.fa_utils`` before 0.14); ImportError naming
    every candidate otherwise. Run inside an engine environment."""
    import importlib

    for table in (COMMON_MODULES, *GENERATION_MODULES.values()):
        for key, names in table.items():
            if name in names or any(name in [a.strip() for a in n.split("|")] for n in names):
                for module in (m.strip() for m in key.split("|")):
                    if _has_all(module, [name]):
                        return getattr(importlib.import_module(module), name)
                raise ImportError(f"{name}: in none of {key}")
    raise KeyError(f"{name}: not a name the driver generations locate (GENERATION_MODULES)")


#: The marker variables of an engine environment (Linux x86_64, CPython 3.11), for :func:`_marker_applies`.
MARKER_ENVIRONMENT = {"python_version": "3.11", "python_full_version": "3.11.0", "platform_machine": "x86_64",
                      "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
                      "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def _marker_applies(marker: str) -> bool:
    """Whether a Requires-Dist environment marker holds in an engine environment (:data:`MARKER_ENVIRONMENT`; no
    extras): no marker, or one that evaluates true there (``platform_machine == "x86_64" or ...``, ``python_version >
    "3.9"``); a marker that names an extra, or does not parse, is taken not to hold."""
    from packaging.markers import InvalidMarker, Marker  # installed with pytest and matplotlib (pyproject)

    marker = marker.strip()
    if not marker:
        return True
    if "extra" in marker:
        return False
    try:
        return Marker(marker).evaluate(dict(MARKER_ENVIRONMENT))
    except InvalidMarker:
        return False


def reads_wheel_pins(release: str) -> bool:
    """Whether the release's build reads the installed wheel's Requires-Dist (its row says ``wheel_pins``)."""
    return bool(RECIPES[release].get("wheel_pins"))


def wheel_requirements(release: str, requires: list) -> dict:
    """The wheel's own version specifiers (``transformers<5.23.0,>=5.16.1``) for the names the recipe installs, by
    normalised name, when the recipe asks for them (``wheel_pins``); {} otherwise (0.33.0's recipe pins by hand)."""
    import re

    if not reads_wheel_pins(release):
        return {}
    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    row = RECIPES[release]
    wanted = {norm(re.split(r"[=<>!~ ]", n)[0]) for n in list(row["light"]) + list(row["no_deps"])}
    out = {}
    for line in requires or ():
        text, _, marker = line.partition(";")
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(\[[^\]]*\])?\s*([<>=!~][^;]*)?$", text)
        if m and m.group(3) and _marker_applies(marker) and norm(m.group(1)) in wanted:
            out[norm(m.group(1))] = m.group(3).replace(" ", "")
    return out


def recipe(release: str) -> dict:
    """Everything that decides the contents of one release's environment (hashed into its stamp)."""
    return {"layout": LAYOUT_VERSION, "release": release, **RECIPES[release]}
