"""vLLM's case options (schema fa3verify.case/1: a case file's ``options.vllm`` object, or the top-level ``vllm``
object of files written before ``options``): what a vLLM configuration adds to the server/model. The schema is
vLLM's plugin's (``VllmPlugin.check_options``); ``spec.model.cases`` validates a case's options through it.

Invariant: a case's vLLM options name only knobs that vLLM's FlashAttention backend reads and the sglang-shaped
``server``/``model`` cannot say (``vllm/v1/attention/backends/flash_attn.py``, 0.33.0; ``vllm/config``), each in
the range vLLM accepts; everything else of the configuration stays in ``server``/``model`` (one truth per knob):
``server.tp_size`` is vLLM's tensor parallel size, ``server.attn_cp_size`` its decode context parallel (DCP) size,
``server.cuda_graph`` full CUDA graph, ``server.enable_deterministic_inference`` ``VLLM_BATCH_INVARIANT``,
``server.page_size`` the block size, ``server.context_length`` ``max_model_len``, ``server.num_sm`` the GPU.

Fields (all optional): ``piecewise`` (bool: piecewise CUDA graphs, attention eager; not with ``server.cuda_graph``),
``kv_cache_dtype`` (``"auto"`` or ``"fp8"``), ``num_layers`` (1..64), ``sliding_window`` (null, an integer >= 1 for
every layer, or one null-or-integer per layer), ``capture_sizes`` (1..64 integers in [1, 4096]),
``max_num_splits_for_cuda_graph`` (1..256), ``full_and_piecewise`` (bool, only with ``server.cuda_graph``: vLLM's
FULL_AND_PIECEWISE mode, FULL graphs for uniform decode batches and PIECEWISE for the rest; driven by the V2
runner's driver generation), ``common_prefix`` (0..2^31-1: tokens every request of each step shares, which the
release's own cascade rule may turn into cascade attention), ``draft_tokens`` (0..8: draft steps a speculative-decoding
drafter builds its metadata for after each step), ``runner`` (``"v1"`` or ``"v2"``: which model runner drives the
case on a release that ships both; absent: the release's driver generation), ``attention_chunk_size`` (null, an
integer in [1, 2^31) for every layer, or one null-or-integer per layer: vLLM's chunked local attention, the layers
with a size being chunked local layers as Llama 4's are),
``layer_kv_heads`` (null, or one
KV-head count per layer, ``num_layers`` >= 2 of them, each dividing ``model.num_heads`` (the driver checks that): a Nemotron-NAS model whose
layers differ from its config; the release's own ``ModelConfig`` decides the model-wide count). :func:`check_vllm_options` raises ``CaseFormatError`` naming the field.
"""

from __future__ import annotations

from typing import Any

from spec.model.case_bounds import MAX_LEN, CaseFormatError

__all__ = ["OPTIONS_KEY", "VLLM_FIELDS", "check_vllm_options"]

#: the key a case files vLLM's options under (``Case.options``; ``VllmPlugin.options_key``)
OPTIONS_KEY = "vllm"
VLLM_FIELDS = ("piecewise", "kv_cache_dtype", "num_layers", "sliding_window", "capture_sizes",
               "max_num_splits_for_cuda_graph", "full_and_piecewise", "common_prefix", "draft_tokens",
               "runner", "attention_chunk_size", "layer_kv_heads")
MAX_LAYERS = 64
MAX_CAPTURE_SIZE = 4096


def _int_in(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def check_vllm_options(value: Any, server: dict, path: str = OPTIONS_KEY) -> dict:
    """The validated vLLM options object found at ``path`` of a case file (``options.vllm``, or ``vllm`` in a file
    written before ``options``); CaseFormatError names the first bad field under ``path``."""
    if not isinstance(value, dict):
        raise CaseFormatError(path, "a JSON object with fields " + ", ".join(VLLM_FIELDS), value)
    unknown = sorted(set(value) - set(VLLM_FIELDS))
    if unknown:
        raise CaseFormatError(f"{path}.{unknown[0]}", "one of the fields " + ", ".join(VLLM_FIELDS), unknown[0])
    out = dict(value)
    pw = out.get("piecewise", False)
    if not isinstance(pw, bool):
        raise CaseFormatError(f"{path}.piecewise", "true or false", pw)
    if pw and server.get("cuda_graph", False):
        raise CaseFormatError(f"{path}.piecewise", "false when server.cuda_graph is true (full CUDA graph)", pw)
    fp = out.get("full_and_piecewise", False)
    if not isinstance(fp, bool):
        raise CaseFormatError(f"{path}.full_and_piecewise", "true or false", fp)
    if fp and not server.get("cuda_graph", False):
        raise CaseFormatError(f"{path}.full_and_piecewise", "true only with server.cuda_graph (vLLM's FULL_AND_PIECEWISE "
                                                         "mode: FULL graphs for uniform decode batches)", fp)
    if out.get("kv_cache_dtype", "auto") not in ("auto", "fp8"):
        raise CaseFormatError(f"{path}.kv_cache_dtype", "'auto' or 'fp8'", out["kv_cache_dtype"])
    layers = out.get("num_layers", 1)
    if not _int_in(layers, 1, MAX_LAYERS):
        raise CaseFormatError(f"{path}.num_layers", f"an integer in [1, {MAX_LAYERS}]", layers)
    for name in ("sliding_window", "attention_chunk_size"):
        _check_per_layer(out.get(name), layers, f"{path}.{name}")
    sizes = out.get("capture_sizes")
    if sizes is not None and not (isinstance(sizes, list) and 1 <= len(sizes) <= 64
                                  and all(_int_in(x, 1, MAX_CAPTURE_SIZE) for x in sizes)):
        raise CaseFormatError(f"{path}.capture_sizes", f"a list of 1..64 integers in [1, {MAX_CAPTURE_SIZE}]", sizes)
    splits = out.get("max_num_splits_for_cuda_graph")
    if splits is not None and not _int_in(splits, 1, 256):
        raise CaseFormatError(f"{path}.max_num_splits_for_cuda_graph", "an integer in [1, 256]", splits)
    prefix = out.get("common_prefix", 0)
    if not _int_in(prefix, 0, MAX_LEN):
        raise CaseFormatError(f"{path}.common_prefix", "an integer in [0, 2^31 - 1]", prefix)
    if out.get("runner", "v1") not in ("v1", "v2"):
        raise CaseFormatError(f"{path}.runner", "'v1' or 'v2'", out["runner"])
    drafts = out.get("draft_tokens", 0)
    if not _int_in(drafts, 0, 8):
        raise CaseFormatError(f"{path}.draft_tokens", "an integer in [0, 8]", drafts)
    kv = out.get("layer_kv_heads")
    if kv is not None:
        if not isinstance(kv, list) or len(kv) != layers or layers < 2 or any(not _int_in(x, 1, 1 << 16) for x in kv):
            raise CaseFormatError(f"{path}.layer_kv_heads", f"null, or one KV-head count per layer ({layers} "
                                                            f"layers, at least 2), each an integer in [1, 65536] "
                                                            f"(dividing model.num_heads: checked by the driver)", kv)
        if prefix:
            raise CaseFormatError(f"{path}.common_prefix", "0 with layer_kv_heads (cascade over several attention "
                                                           "groups is not driven)", prefix)
    return out


def _check_per_layer(value, layers: int, field: str) -> None:
    """A per-layer option (``sliding_window``, ``attention_chunk_size``): null, one integer in [1, 2^31) for every
    layer, or a list of ``layers`` null-or-integer entries; CaseFormatError naming ``field`` otherwise."""
    if value is None:
        return
    if not (_int_in(value, 1, MAX_LEN) or (isinstance(value, list) and len(value) == layers
                                           and all(v is None or _int_in(v, 1, MAX_LEN) for v in value))):
        raise CaseFormatError(field, f"null, an integer in [1, 2^31) or a list of {layers} (null | integer) entries, "
                                     f"one per layer", value)
