"""Which vLLM releases this suite drives, and what each one's engine environment installs (data, no code).

Invariant: a vLLM environment holds the project's CPU torch, vLLM itself installed without dependencies (its wheel
pins torch 2.14 with CUDA), the light pure-Python packages the FlashAttention backend's import chain asks for, and
``xgrammar`` / ``triton`` without dependencies (found by importing ``vllm/v1/attention/backends/flash_attn.py`` of
vLLM 0.33.0 on CPU; docs/engines-vllm.md). The constraints keep torch the CPU build and make torchvision /
torchaudio / torchcodec unresolvable (each replaces or breaks the CPU torch; transformers probes torchvision, so
the sglang fakes' torchvision stand-in is on the driver's path). Built by ``gpu_impl.engines.envs``.
"""

from __future__ import annotations

#: Per release: what its environment installs (hashed into the stamp, with the layout version and the release):
#: ``light`` with dependencies (under the constraints), ``no_deps`` without. ``apache-tvm-ffi`` is xgrammar's
#: binding (``tvm_ffi``): found missing by the import probe of a build from nothing.
RECIPES = {
    "0.33.0": {
        "torch": "torch==2.13.0",
        "constraints": ["torch==2.13.0", "torchvision==0.0.0", "torchaudio==0.0.0", "torchcodec==0.0.0"],
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
    "0.34.0": {
        "torch": "torch==2.13.0",
        "constraints": ["torch==2.13.0", "torchvision==0.0.0", "torchaudio==0.0.0", "torchcodec==0.0.0"],
        "light": ["numpy", "packaging", "regex", "cachetools", "psutil", "tqdm", "pyyaml", "pydantic", "msgspec",
                  "cloudpickle", "blake3", "py-cpuinfo", "pyzmq", "einops", "typing_extensions", "filelock",
                  "requests", "cbor2", "pybase64", "orjson", "transformers", "aiohttp", "oss-harmony", "openai",
                  "pillow", "uvloop", "prometheus_client", "opentelemetry-api", "starlette", "partial_json_parser",
                  "fastapi", "llguidance", "apache-tvm-ffi"],
        "no_deps": ["xgrammar", "triton==3.9.0"],
        "wheel_pins": True,
    },
}
RELEASES = tuple(RECIPES)

#: Which driver generation drives each release (not hashed into the environment): ``v1`` imitates the V1 model
#: runner (``vllm/v1/worker/gpu_model_runner.py``, ``block_table.py``), ``v2`` runs the V2 runner's own input and
#: CUDA-graph code (``vllm/v1/worker/gpu/``; 0.34.0 deleted the V1 runner). ``GENERATION_MODULES``: what each
#: generation imports from the release beyond the backend (``vllm_driver.py``, ``vllm_driver_v2.py``): an
#: unregistered release is tried against them (``probe_generation``).
DRIVER_GENERATIONS = {"0.33.0": "v1", "0.34.0": "v2"}
GENERATION_MODULES = {
    "v1": {"vllm.v1.worker.block_table": ["get_block_table_width"],
           "vllm.v1.attention.backend": ["CommonAttentionMetadata"]},
    "v2": {"vllm.v1.kv_cache_interface": ["get_block_table_width", "KVCacheConfig", "KVCacheGroupSpec"],
           "vllm.v1.worker.gpu.cudagraph_utils": ["CudaGraphManager", "BatchExecutionDescriptor",
                                                  "prepare_inputs_to_capture"],
           "vllm.v1.worker.gpu.input_batch": ["InputBatch", "InputBuffers"],
           "vllm.v1.worker.gpu.model_states.default": ["DefaultModelState"],
           "vllm.v1.worker.utils": ["AttentionGroup"]},
}
COMMON_MODULES = {"vllm.v1.attention.backends.flash_attn": ["FlashAttentionMetadataBuilder", "FlashAttentionImpl",
                                                            "FlashAttentionBackend"],
                  "vllm.v1.attention.backends.fa_utils": ["get_flash_attn_version"],
                  "vllm.v1.kv_cache_interface": ["FullAttentionSpec", "SlidingWindowSpec"],
                  "vllm.config": ["VllmConfig", "CompilationConfig"]}

#: Bumped when the way a vLLM environment is built changes (invalidates every cached vLLM environment).
LAYOUT_VERSION = 1

#: The import probe: the backend module with the CPU glue installed, and FA3 (not FA2) chosen by vLLM's own helper.
PROBE = ("from gpu_impl.engines import vllm_glue; vllm_glue.install(); "
         "import vllm.v1.attention.backends.fa_utils as u; import vllm.v1.attention.backends.flash_attn; "
         "v = u.get_flash_attn_version(); assert v == 3, v; print('fa', v)")

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
            f"spec/model/engine_profiles_vllm.json and its FA3 source in refmodel/fa3_builds.json")


def missing_for_generation(generation: str, source=None) -> list:
    """The ``module.name`` entries of ``GENERATION_MODULES[generation]`` and ``COMMON_MODULES`` that the imported
    vllm lacks (an import that fails names its module once, with the error). ``source``: a checkout put first on the
    path; a module it does not hold itself (so the release's copy would be imported in its place) counts as missing.
    Run inside an engine environment."""
    import importlib
    import os

    missing = []
    for table in (COMMON_MODULES, GENERATION_MODULES[generation]):
        for module, names in table.items():
            try:
                mod = importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 - what the release lacks is the answer
                missing.append(f"{module} ({type(exc).__name__}: {exc})")
                continue
            where = os.path.realpath(getattr(mod, "__file__", "") or "")
            if source and not os.path.abspath(getattr(mod, "__file__", "") or "").startswith(os.path.abspath(source)):
                missing.append(f"{module} (not in the checkout: the release's {where} would stand in)")
                continue
            missing.extend(f"{module}.{n}" for n in names if not hasattr(mod, n))
    return missing


def _marker_applies(marker: str) -> bool:
    """Whether a Requires-Dist environment marker holds in an engine environment (Linux x86_64, CPython 3.11, no
    extras): no marker, or one that names ``platform_machine == "x86_64"``; any other marker (extras, other
    machines, ``python_version > "3.11"``) is taken not to hold."""
    marker = marker.strip()
    return not marker or ('platform_machine == "x86_64"' in marker and "extra" not in marker)


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
