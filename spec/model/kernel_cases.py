"""Kernel-level case files: schema "fa3verify.case/1" with a ``call`` (one FA3 call) instead of ``batches``.

Validation only (docs/case-format.md, "Kernel-level cases"): every field of ``call`` is checked for type and
range, and the tensors it implies are bounded, so a bad file is a CaseFormatError (exit 2) naming the field,
never a traceback or an allocation that does not fit. The older schema "fa3verify.kernel-case/1" has the same
fields and is read the same way.
"""

from __future__ import annotations

from typing import Any

from spec.model.cases import MAX_SEED, CaseFormatError, is_int, check_defect_names

__all__ = ["check_kernel_case", "MAX_KERNEL_ELEMENTS"]

#: Largest q / K / V tensor (elements) a kernel-level case may imply (a broadcast cache counts one row per batch).
MAX_KERNEL_ELEMENTS = 1 << 27
MAX_KERNEL_BATCH = 4096
_CALL_FIELDS = {"seqlens_q", "seqlens_k", "capacity_k", "dense", "heads", "head_dim", "head_dim_v", "causal",
                "num_splits", "max_seqlen_q", "broadcast_kv", "seed", "logits", "metadata", "num_reqs", "prefix_len"}
_METADATA_FIELDS = {"batch_size", "max_seqlen_q", "max_seqlen_k", "cache_seqlens", "cu_seqlens_q", "causal",
                    "num_splits"}


def _int(path: str, v: Any, lo: int, hi: int) -> int:
    if not is_int(v) or not lo <= v <= hi:
        raise CaseFormatError(path, f"an integer in [{lo}, {hi}]", v)
    return v


def _ints(path: str, v: Any, lo: int, hi: int, n_max: int = MAX_KERNEL_BATCH) -> list:
    if not isinstance(v, list) or len(v) > n_max or not all(is_int(x) and lo <= x <= hi for x in v):
        raise CaseFormatError(path, f"a list of at most {n_max} integers in [{lo}, {hi}]", v if len(repr(v)) < 80
                              else repr(v)[:60] + "...")
    return v


def check_kernel_case(data: dict) -> dict:
    """Validate a kernel-level case's ``call``, ``defects`` and ``kernel``; returns ``data`` unchanged."""
    check_defect_names(data.get("defects", []))
    call = data.get("call")
    if not isinstance(call, dict):
        raise CaseFormatError("call", "a JSON object (one FA3 call)", call)
    unknown = sorted(set(call) - _CALL_FIELDS)
    if unknown:
        raise CaseFormatError(f"call.{unknown[0]}", f"one of the fields {sorted(_CALL_FIELDS)}", unknown[0])
    for name in ("seqlens_q", "seqlens_k", "heads", "head_dim", "head_dim_v", "causal", "seed"):
        if name not in call:
            raise CaseFormatError(f"call.{name}", "a value", "<missing>")
    lq = _ints("call.seqlens_q", call["seqlens_q"], 0, 2**31 - 1)
    lk = _ints("call.seqlens_k", call["seqlens_k"], 0, 2**31 - 1)
    if len(lq) != len(lk):
        raise CaseFormatError("call.seqlens_k", f"a list of {len(lq)} lengths (one per seqlens_q)", lk)
    heads = call["heads"]
    if not isinstance(heads, list) or len(heads) != 2 or not all(is_int(h) and 1 <= h <= 1024 for h in heads) \
            or heads[0] % heads[1]:
        raise CaseFormatError("call.heads", "[h, h_k] with 1 <= h_k <= h <= 1024 and h % h_k == 0", heads)
    d = _int("call.head_dim", call["head_dim"], 1, 1024)
    dv = _int("call.head_dim_v", call["head_dim_v"], 1, 1024)
    for flag in ("causal", "dense", "broadcast_kv"):
        if flag in call and not isinstance(call[flag], bool):
            raise CaseFormatError(f"call.{flag}", "true or false", call[flag])
    _int("call.seed", call["seed"], 0, MAX_SEED)
    _int("call.num_splits", call.get("num_splits", 0), 0, 2**31 - 1)
    cap = _int("call.capacity_k", call.get("capacity_k", max(lk + [1])), 1, 2**31 - 1)
    if max(lk + [0]) > cap:
        raise CaseFormatError("call.capacity_k", f"an integer >= max(seqlens_k) = {max(lk)}", cap)
    if "max_seqlen_q" in call:
        _int("call.max_seqlen_q", call["max_seqlen_q"], 0, 2**31 - 1)
    if call.get("logits", "random") not in ("random", "below-sentinel"):
        raise CaseFormatError("call.logits", "'below-sentinel' (or absent)", call["logits"])
    for name in ("num_reqs", "prefix_len"):
        if name in call:
            _int(f"call.{name}", call[name], 0, 2**31 - 1)
    b, h, hk = len(lq), heads[0], heads[1]
    rows = b * max(lq + [0]) if call.get("dense") else sum(lq)
    kv_rows = b if call.get("broadcast_kv") else b * cap
    if rows * h * d > MAX_KERNEL_ELEMENTS or kv_rows * hk * max(d, dv) > MAX_KERNEL_ELEMENTS:
        raise CaseFormatError("call", f"tensors of at most {MAX_KERNEL_ELEMENTS} elements (query rows x heads x "
                                      "head dim; cache slots x KV heads x head dim, one slot per batch with "
                                      "broadcast_kv)", f"{rows} query rows, {kv_rows} cache slots")
    md = call.get("metadata")
    if md is not None:
        if not isinstance(md, dict) or sorted(set(md) - _METADATA_FIELDS):
            raise CaseFormatError("call.metadata", f"an object with the fields {sorted(_METADATA_FIELDS)}", md)
        for name in ("batch_size", "max_seqlen_q", "max_seqlen_k", "cache_seqlens", "cu_seqlens_q"):
            if name not in md:
                raise CaseFormatError(f"call.metadata.{name}", "a value", "<missing>")
        mb = _int("call.metadata.batch_size", md["batch_size"], 1, MAX_KERNEL_BATCH)
        _int("call.metadata.max_seqlen_q", md["max_seqlen_q"], 0, 2**31 - 1)
        _int("call.metadata.max_seqlen_k", md["max_seqlen_k"], 0, 2**31 - 1)
        if len(_ints("call.metadata.cache_seqlens", md["cache_seqlens"], 0, 2**31 - 1)) != mb:
            raise CaseFormatError("call.metadata.cache_seqlens", f"a list of batch_size={mb} lengths",
                                  md["cache_seqlens"])
        if len(_ints("call.metadata.cu_seqlens_q", md["cu_seqlens_q"], 0, 2**31 - 1, mb + 1)) != mb + 1:
            raise CaseFormatError("call.metadata.cu_seqlens_q", f"a list of batch_size + 1 = {mb + 1} offsets",
                                  md["cu_seqlens_q"])
    kernel = data.get("kernel", {"name": "emulated"})
    if not isinstance(kernel, dict) or kernel.get("name", "emulated") != "emulated" \
            or kernel.get("mode", "strict") not in ("strict", "gpu-like"):
        raise CaseFormatError("kernel", "{'name': 'emulated', 'mode': 'strict' or 'gpu-like'} (kernel-level cases "
                                        "run on the emulated kernel)", kernel)
    return data
