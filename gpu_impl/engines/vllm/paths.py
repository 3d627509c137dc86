"""The FlashAttention-backend paths of each vLLM release: which the drivers reach, which are not covered and why,
and the labels a driven step carries (counted per path in a campaign's reach); the release's cascade rule and its
drafter metadata build, as the first driver generation runs them.

Invariant: every path of ``paths.json`` is, for every release, either driven (a run counts the cases that reached
it) or not covered with the exact reason (:func:`release_paths`); :func:`missing_paths` names a path that is
neither. Whether a step takes cascade attention is decided by the release's own code: the V1 runner's
``GPUModelRunner._compute_cascade_attn_prefix_len`` (run unbound on a stand-in holding the runner fields it reads)
and, inside it, the builder's ``use_cascade_attention``; a drafter's metadata is the builder's own
``build_for_drafting``. Stood in (listed in :data:`STOOD_IN`): the KV-cache manager's count of blocks every request
shares (the scenario's ``common_prefix`` in whole blocks) and the proposer's advance of the batch between draft
steps (one more token per request, one query token each).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["PATHS_FILE", "PATH_KEYS", "STOOD_IN", "release_paths", "not_covered_reason", "local_not_driven", "both_runners", "missing_paths", "step_labels",
           "cascade_prefix_len", "draft_steps"]

PATHS_FILE = Path(__file__).resolve().parent / "paths.json"
_DATA = json.loads(PATHS_FILE.read_text())
#: every path of the list (docs/engines-vllm.md, "Paths and reach per release"), in order
PATH_KEYS = tuple(_DATA["paths"])

#: what the first generation stands in for on these paths, besides ``vllm_glue.FAKED``
STOOD_IN = (
    "the KV-cache manager's num_common_prefix_blocks (the scenario's common_prefix, in whole blocks, shared by every "
    "request of a step)",
    "the V1 runner's self for _compute_cascade_attn_prefix_len (num_query_heads, use_alibi=False, num_sms, "
    "dcp_world_size, input_batch.num_computed_tokens_cpu)",
    "xgrammar, where its binding cannot load in the release's environment (imported by the V1 runner's module for "
    "structured output, read by no attention code): a module of empty classes",
    "the drafter's advance of the batch between draft steps (the proposer's GPU update: one query token per request, "
    "each sequence one token longer)",
)

#: survey feature -> the path it makes present in a release
_FEATURE_OF = {"cascade": "cascade", "DCP": "dcp", "batch invariant": "batch_invariant",
               "full graph": "full_cuda_graph", "sliding window": "sliding_window"}


def _survey_entry(release: str) -> dict:
    """The release survey's entry for ``release``; a release newer than the survey takes the newest surveyed entry
    (0.33.0 and 0.34.0 keep 0.32.0's backend features: no cascade path)."""
    from . import recipes

    survey = json.loads(recipes.SURVEY_FILE.read_text())["releases"]
    by = {e["release"]: e for e in survey}
    if release in by:
        return by[release]
    older = [e for e in survey if recipes.version_key(e["release"]) <= recipes.version_key(release)]
    return max(older or survey, key=lambda e: recipes.version_key(e["release"]))


def release_paths(release: str, generation: str | None = None) -> dict:
    """Every path of :data:`PATH_KEYS` -> None (the driver reaches it on ``release``) or why it is not covered."""
    from . import recipes

    generation = generation or recipes.DRIVER_GENERATIONS.get(release, "v1")
    entry = _survey_entry(release)
    features = set(entry.get("features", ()))
    reasons = _DATA["not_covered"]
    out: dict = {}
    for key in PATH_KEYS:
        feature = _FEATURE_OF.get(key)
        if feature is not None and feature not in features:
            out[key] = _DATA["not_in_release"].format(feature=key)
            continue
        first = _DATA["first_release"].get(key)
        if first is not None and recipes.version_key(release) < recipes.version_key(first):
            out[key] = f"not in this release: {key} appears in vLLM {first} ({_DATA['first_release_where'][key]})"
            continue
        if key == "layers differ from the config" and (release in _DATA["layers_refused"] or generation == "v0"):
            out[key] = (_DATA["layers_refused"].get(release) or
                        "not driven: driver generation v0 builds one metadata builder for all layers")
            continue
        if key == "V2 runner":
            if generation == "v2":
                out[key] = None
            elif "v2" not in entry.get("runners", ()) and release not in _v2_runner()["not_driven"]:
                out[key] = "not in this release: it ships no V2 model runner (vllm/v1/worker/gpu/)"
            elif release in _v2_runner()["driven"]:
                out[key] = None  # beside the V1 runner: a case's vllm.runner = "v2"
            elif release in _v2_runner()["not_driven"]:
                out[key] = _v2_runner()["not_driven"][release]
            else:
                missing = entry.get("missing", {}).get("v2") or ["(not surveyed)"]
                out[key] = reasons["V2 runner@v1"].format(missing="; ".join(missing))
            continue
        if key == "cascade" and generation == "v2":
            out[key] = "not driven: driver generation v2 drives no cascade step"
            continue
        if key == "cascade" and release in _DATA["runner_module_does_not_import"]:
            out[key] = ("not covered: the release's cascade rule lives in its V1 model runner module, which does not "
                        f"import in its environment ({_DATA['runner_module_does_not_import'][release]})")
            continue
        if key == "drafter" and generation == "v2":
            # the V2 runner's drafter (drafter_v2), on the releases releases.json v2_runner.drafter names
            out[key] = None if release in _v2_runner().get("drafter", {}).get("releases", ()) else reasons["drafter@v2"]
            continue
        if key in ("V2 drafter", "V2 drafter FULL graph"):  # after the V2 runner's own entry (below)
            out[key] = None
            continue
        if key == "local attention":
            out[key] = _local_reason(release, generation)
            continue
        out[key] = reasons.get(key)
    out["V2 drafter"] = _v2_drafter_reason(release, generation, out["V2 runner"])
    graphs = _v2_runner().get("drafter", {}).get("full_graph", {}).get("releases", ())
    out["V2 drafter FULL graph"] = (out["V2 drafter"] if out["V2 drafter"] is not None else
                                    None if release in graphs else reasons["V2 drafter FULL graph@v2"])
    return out


def not_covered_reason(key: str) -> str:
    """The reason of paths.json ``not_covered`` under ``key`` (e.g. "layers differ from the config@v2 drafter")."""
    return _DATA["not_covered"][key]


def _v2_drafter_reason(release: str, generation: str, runner_reason):
    """None where the V2 runner's drafter (drafter_v2) is driven on ``release``, else why not: the V2 runner itself
    not driven, or the release's measured reason (releases.json ``v2_runner.drafter.not_driven``), or the general
    one."""
    drafter = _v2_runner().get("drafter", {})
    if runner_reason is not None:
        return _DATA["not_covered"]["V2 drafter@v1"].format(runner=runner_reason)
    if release in drafter.get("releases", ()):
        return None
    from .recipes import v2_runner_generation

    runner_generation = v2_runner_generation(release)
    if runner_generation != "v2":
        return _DATA["not_covered"]["V2 drafter@early runner"].format(generation=runner_generation)
    return drafter.get("not_driven", {}).get(release) or _DATA["not_covered"]["V2 drafter@v2"]


def local_not_driven(key: str) -> str:
    """The reason chunked local attention is not driven, by key of paths.json ``local_attention.not_covered`` ("v2",
    "v0@0.10.0", "v2 full graph@no-resolve")."""
    return _DATA["local_attention"]["not_covered"][key]


def _local_reason(release: str, generation: str):
    """None where chunked local attention is driven on ``release`` (paths.json ``local_attention``), else why not."""
    from . import recipes

    local = _DATA["local_attention"]
    key = recipes.version_key(release)
    last = local.get("last_release", {}).get(generation)
    if generation in local["driven_generations"] and key >= recipes.version_key(local["first_release"][generation]) \
            and (last is None or key <= recipes.version_key(last)):
        return None
    return (local["not_covered"].get(f"{generation}@{release}") or local["not_covered"].get(generation)
            or local["not_covered"]["default"])


def _v2_runner() -> dict:
    """releases.json's ``v2_runner``: the releases whose V2 runner is driven beside the V1 runner, and measured
    reasons for those whose V2 runner cannot be."""
    from .recipes import v2_runner_table

    return v2_runner_table()


def both_runners(release: str) -> bool:
    """Whether a release driven through its V1 runner has its V2 runner driven too (a case's ``vllm.runner``)."""
    from . import recipes

    return recipes.DRIVER_GENERATIONS.get(release, "v1") == "v1" and release in _v2_runner()["driven"]


def missing_paths(table: dict) -> list:
    """Paths of :data:`PATH_KEYS` that a release's table neither drives nor gives a reason for."""
    return [k for k in PATH_KEYS if k not in table or (table[k] is not None and not str(table[k]).strip())]


def step_labels(s: dict, query_lens, seq_lens, md, generation: str, drafter: bool = False) -> list:
    """The paths (:data:`PATH_KEYS`) one driven step's call was on: the graph mode as dispatched, cascade, DCP
    (and its skipped context), windows, differing head sizes, layers that differ from the config, batch invariance,
    a drafter's build, the runner."""
    out = []
    graph = s["cuda_graph"]
    above = sum(query_lens) > max(s["capture_sizes"])
    cascade = bool(getattr(md, "use_cascade", False))
    if drafter:
        out.append("drafter")
        if generation == "v2":
            out.append("V2 drafter")
    if graph == "none" or (cascade and graph == "full"):
        out.append("eager")
    elif graph == "piecewise" or (graph == "full_and_piecewise" and max(query_lens) > 1):
        out.append("piecewise")
    elif above:
        out.append("full graph above captured sizes")
    else:
        out.append("full graph")
    if cascade:
        out.append("cascade")
    if s["dcp"] > 1:
        out.append("DCP")
        if getattr(md, "max_dcp_context_kv_len", None) == 0 and getattr(md, "scheduler_metadata", 1) is None:
            out.append("DCP skipped context")
    if any(w is not None for w in (s["sliding_window"] or ())):
        out.append("sliding window")
    if s.get("head_dim_v") not in (None, s["head_dim"]):
        out.append("K/V head sizes differ")
    if s.get("layer_kv_heads"):
        out.append("layers differ from the config")
    if s["batch_invariant"]:
        out.append("batch invariant")
    if any(c is not None for c in (s.get("attention_chunk_size") or ())):
        out.append("local attention")
    if generation == "v2":
        out.append("V2 runner")
    return out


class _RunnerStandIn:
    """The fields ``GPUModelRunner._compute_cascade_attn_prefix_len`` reads from the runner (see STOOD_IN)."""

    def __init__(self, cfg, computed):
        import types

        import numpy as np

        s = cfg.s
        self.num_query_heads = cfg.h
        self.use_alibi = False
        self.num_sms = s["num_sm"]
        self.dcp_world_size = s["dcp"]
        self.input_batch = types.SimpleNamespace(num_computed_tokens_cpu=np.asarray(computed, dtype=np.int32))


def cascade_prefix_len(cfg, query_lens, seq_lens) -> int:
    """The common prefix length the release's V1 runner hands the builder for this step (0: no cascade), decided
    by its own ``_compute_cascade_attn_prefix_len`` (and so the builder's ``use_cascade_attention``); 0 where the
    scenario shares no prefix, where the release has no cascade rule, or where a layer has a sliding window (vLLM
    puts windowed layers in a group of their own, which the rule refuses; the driver's one group would not)."""
    s = cfg.s
    blocks = int(s.get("common_prefix", 0) or 0) // s["block_size"]
    if blocks == 0 or any(w is not None for w in (s["sliding_window"] or ())):
        return 0
    if not hasattr(cfg.builder, "use_cascade_attention"):
        return 0
    import inspect

    import numpy as np

    import vllm

    if getattr(vllm, "__version__", None) in _DATA["runner_module_does_not_import"]:  # not covered (release_paths says why), never a crash
        return 0
    rule = _runner_class()._compute_cascade_attn_prefix_len
    computed = [k - q for q, k in zip(query_lens, seq_lens)]
    scheduled = np.asarray(query_lens, dtype=np.int32)
    given = {"num_scheduled_tokens": scheduled, "num_computed_tokens": np.asarray(computed, dtype=np.int32),
             "num_common_prefix_blocks": blocks, "kv_cache_spec": cfg.spec, "attn_metadata_builder": cfg.builder}
    params = inspect.signature(rule).parameters
    return int(rule(_RunnerStandIn(cfg, computed), **{k: v for k, v in given.items() if k in params}))


class _Anything(type(__import__("sys"))):
    """A module whose every attribute is a new empty class (a stand-in that only has to be named at import)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {})
        setattr(self, name, value)
        return value


def stand_in_module(name: str):
    """A module named ``name`` whose every attribute is a new empty class (listed where it is used)."""
    return _Anything(name)


def _runner_class():
    """The release's ``GPUModelRunner``. Its module imports structured output's ``xgrammar`` at class definition;
    where that binding cannot load in the release's environment (its ``apache-tvm-ffi`` is another version:
    ``load_lib_module() got an unexpected keyword argument``), a stand-in module is put in its place (it only names
    grammar types in annotations; no attention code reads it) and the import is retried (listed in STOOD_IN)."""
    return import_with_xgrammar_stand_in("vllm.v1.worker.gpu_model_runner").GPUModelRunner


def import_with_xgrammar_stand_in(module: str):
    """``module`` imported; where the import fails on structured output's ``xgrammar`` binding (see
    :func:`_runner_class`), once more with the stand-in module in its place (listed in STOOD_IN)."""
    import importlib
    import sys

    try:
        return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - retried once with the stand-in, else raised as it was
        if "xgrammar" not in "".join(__import__("traceback").format_exception(exc)):
            raise
        for name in [m for m in sys.modules if m == "xgrammar" or m.startswith("xgrammar.")
                     or m.startswith("vllm.v1.structured_output") or m.startswith(module)]:
            del sys.modules[name]
        sys.modules["xgrammar"] = _Anything("xgrammar")
        return importlib.import_module(module)


def draft_steps(cfg, query_lens, seq_lens) -> list:
    """(query_lens, seq_lens) of each draft step after a step (the scenario's ``draft_tokens``): one query token per
    request, each sequence one token longer than before (the proposer's advance, stood in); none where the
    release's builder has no ``build_for_drafting``."""
    n = int(cfg.s.get("draft_tokens", 0) or 0)
    if n == 0 or not hasattr(cfg.builder, "build_for_drafting"):
        return []
    limit = cfg.s["max_model_len"]
    return [([1] * len(seq_lens), [min(limit, k + i + 1) for k in seq_lens]) for i in range(n)]
