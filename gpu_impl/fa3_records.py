"""The two sides of FA3's metadata hand-off, recorded in plain Python: precompute and call (used by fa3_calls).

Invariant (one sentence): a record holds exactly the arguments FA3's host code schedules from, so refmodel
resolves the same schedule from the record as FA3 does from the call (``hopper/flash_api.cpp``
``mha_fwd_get_scheduler_metadata`` and ``mha_fwd``; Python wrappers ``hopper/flash_attn_interface.py``,
sgl-kernel 0.4.10 ``sgl_kernel/flash_attn.py``, vLLM's ``vllm_flash_attn/flash_attn_interface.py``).

* :func:`record_precompute` / :class:`PrecomputeRecord`: both ``get_scheduler_metadata`` signatures bind
  (sgl_kernel naming ``num_heads, num_heads_k, leftpad_k``; FA3 / vLLM-fork naming ``num_heads_q, num_heads_kv,
  cache_leftpad``); :func:`translate_precompute` renames between them.
* :func:`record_call` / :class:`CallRecord`: ``flash_attn_with_kvcache``; :func:`record_varlen_call`: vLLM's
  ``flash_attn_varlen_func`` in FA3's vocabulary.
* :func:`precompute_schedule` / :func:`call_schedule_of`: refmodel's resolved schedules (memoised by scalars).

Imports only torch, refmodel and gpu_impl (engine environments hold only torch and numpy).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from refmodel.fa3_builds import UPSTREAM, check_build_name, fork_static_seqlen_k
from refmodel.fa3_scheduler import Schedule, call_inputs, precompute_inputs, resolve_schedule

from .kernels.base import CallShape, schedule_dtype

__all__ = [
    "PrecomputeRecord", "CallRecord", "record_precompute", "record_call", "record_varlen_call", "bind_call",
    "record_bound_call", "bind_precompute", "record_bound_precompute", "translate_precompute",
    "precompute_schedule", "call_schedule_of", "DEFAULT_NUM_SM", "DEFAULT_ARCH", "PRECOMPUTE_SIGNATURES",
    "CALL_SIGNATURE", "VARLEN_POSITIONAL", "call_key",
]

#: H200 / H100 SXM: 132 SMs, sm90 (used when neither the implementation nor a GPU says otherwise).
DEFAULT_NUM_SM = 132
DEFAULT_ARCH = 90

_REQUIRED = object()

# ------------------------------------------------------------------------------------------------------------
# Signatures (names and positional order of the upstream Python wrappers; no code copied)
# ------------------------------------------------------------------------------------------------------------

#: ``get_scheduler_metadata`` positional parameters, per naming. "sgl_kernel": sgl-kernel 0.4.10
#: ``sgl_kernel/flash_attn.py``; "fa3": FA3 ``hopper/flash_attn_interface.py`` (and ``fa3_fwd_interface``,
#: and vLLM's fork, which uses the same names).
PRECOMPUTE_SIGNATURES: dict[str, tuple[tuple[str, Any], ...]] = {
    "sgl_kernel": (
        ("batch_size", _REQUIRED), ("max_seqlen_q", _REQUIRED), ("max_seqlen_k", _REQUIRED),
        ("num_heads", _REQUIRED), ("num_heads_k", _REQUIRED), ("headdim", _REQUIRED),
        ("cache_seqlens", _REQUIRED), ("qkv_dtype", torch.bfloat16), ("headdim_v", None), ("cu_seqlens_q", None),
        ("cu_seqlens_k", None), ("cu_seqlens_k_new", None), ("seqused_q", None), ("leftpad_k", None),
        ("page_size", None), ("max_seqlen_k_new", 0), ("causal", False), ("window_size", (-1, -1)),
        ("attention_chunk", 0), ("has_softcap", False), ("num_splits", 0), ("pack_gqa", None), ("sm_margin", 0)),
    "fa3": (
        ("batch_size", _REQUIRED), ("max_seqlen_q", _REQUIRED), ("max_seqlen_k", _REQUIRED),
        ("num_heads_q", _REQUIRED), ("num_heads_kv", _REQUIRED), ("headdim", _REQUIRED),
        ("cache_seqlens", _REQUIRED), ("qkv_dtype", torch.bfloat16), ("headdim_v", None), ("cu_seqlens_q", None),
        ("cu_seqlens_k_new", None), ("cache_leftpad", None), ("page_size", None), ("max_seqlen_k_new", 0),
        ("causal", False), ("window_size", (-1, -1)), ("attention_chunk", 0), ("has_softcap", False),
        ("num_splits", 0), ("pack_gqa", None), ("sm_margin", 0)),
}
_SGL_ONLY = frozenset({"num_heads", "num_heads_k", "leftpad_k", "cu_seqlens_k", "seqused_q"})
_FA3_ONLY = frozenset({"num_heads_q", "num_heads_kv", "cache_leftpad"})
#: Positional prefix on which the two signatures agree (batch_size .. cu_seqlens_q).
_COMMON_POSITIONAL = 10

#: ``flash_attn_with_kvcache`` parameters (FA3 ``hopper/flash_attn_interface.py``; sgl_kernel's adds nothing
#: this model reads; unknown keywords are accepted and ignored so newer wrappers still bind).
CALL_SIGNATURE: tuple[tuple[str, Any], ...] = (
    ("q", _REQUIRED), ("k_cache", _REQUIRED), ("v_cache", _REQUIRED), ("k", None), ("v", None), ("qv", None),
    ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None), ("cache_batch_idx", None),
    ("cache_leftpad", None), ("page_table", None), ("cu_seqlens_q", None), ("cu_seqlens_k_new", None),
    ("max_seqlen_q", None), ("rotary_seqlens", None), ("q_descale", None), ("k_descale", None), ("v_descale", None),
    ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)), ("attention_chunk", 0), ("softcap", 0.0),
    ("rotary_interleaved", True), ("scheduler_metadata", None), ("num_splits", 0), ("pack_gqa", None),
    ("sm_margin", 0), ("return_softmax_lse", False))

#: vLLM ``flash_attn_varlen_func`` (``vllm/vllm_flash_attn/flash_attn_interface.py``): the six positional
#: parameters; everything else is passed by keyword in vLLM's backends.
VARLEN_POSITIONAL = ("q", "k", "v", "max_seqlen_q", "cu_seqlens_q", "max_seqlen_k")


def _bind(fn: str, spec: Sequence[tuple[str, Any]], args: tuple, kwargs: dict, strict: bool = True) -> dict:
    """Bind args/kwargs to a parameter list (faster than inspect.Signature.bind); TypeError names the problem."""
    if len(args) > len(spec):
        raise TypeError(f"{fn}: takes at most {len(spec)} positional arguments, got {len(args)}")
    out = dict(spec)
    for (name, _), value in zip(spec, args):
        out[name] = value
    positional = len(args)
    for name, value in kwargs.items():
        if name not in out:
            if strict:
                raise TypeError(f"{fn}: unexpected keyword argument {name!r}")
            continue
        if positional and name in _positional_names(spec, positional):
            raise TypeError(f"{fn}: got multiple values for argument {name!r}")
        out[name] = value
    missing = [name for name, value in out.items() if value is _REQUIRED]
    if missing:
        raise TypeError(f"{fn}: missing required argument(s) {', '.join(missing)}")
    return out


@functools.lru_cache(maxsize=256)
def _positional_names(spec: tuple, n: int) -> frozenset:
    return frozenset(name for name, _ in spec[:n])


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _host_ints(x, read: Optional[bool]) -> Optional[tuple]:
    """Host values of a small int tensor: always for CPU tensors and sequences; for device tensors only if read."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        if x.device.type == "cpu":
            return tuple(int(v) for v in x.reshape(-1).tolist())
        if read and x.device.type != "meta":
            return tuple(int(v) for v in x.detach().reshape(-1).cpu().tolist())
        return None
    if isinstance(x, int) and not isinstance(x, bool):
        return None
    return tuple(int(v) for v in x)


def _pair(w) -> tuple:
    if w is None:
        return (-1, -1)
    w = tuple(w)
    if len(w) != 2:
        raise ValueError(f"window_size: must be a pair (left, right), got {w!r}")
    return (int(w[0]), int(w[1]))


# ------------------------------------------------------------------------------------------------------------
# The precompute
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrecomputeRecord:
    """The resolved arguments of one ``get_scheduler_metadata`` call (FA3 ``flash_api.cpp``
    ``mha_fwd_get_scheduler_metadata``), plus the device's ``num_sm`` and ``arch``.

    Head counts are stored under FA3's C++ meaning (query heads, KV heads) whatever the caller's naming.
    ``cache_seqlens`` / ``cu_seqlens_q`` / ``cu_seqlens_k_new`` / ``leftpad_k`` hold host values (tuples here,
    lists in :meth:`to_dict`) when they were read, else None; ``has_*`` say whether the argument was given.
    """

    batch_size: int
    max_seqlen_q: int
    max_seqlen_k: int
    num_heads: int
    num_heads_k: int
    headdim: int
    headdim_v: Optional[int] = None
    qkv_dtype: str = "bfloat16"
    cache_seqlens: Optional[tuple] = None
    cu_seqlens_q: Optional[tuple] = None
    cu_seqlens_k_new: Optional[tuple] = None
    leftpad_k: Optional[tuple] = None
    has_cu_seqlens_q: bool = False
    has_cu_seqlens_k_new: bool = False
    has_leftpad: bool = False
    has_cu_seqlens_k: bool = False
    has_seqused_q: bool = False
    page_size: Optional[int] = None
    max_seqlen_k_new: int = 0
    causal: bool = False
    window_size: tuple = (-1, -1)
    attention_chunk: int = 0
    has_softcap: bool = False
    num_splits: int = 0
    pack_gqa: Optional[bool] = None
    sm_margin: int = 0
    num_sm: int = DEFAULT_NUM_SM
    arch: int = DEFAULT_ARCH
    signature: str = "fa3"
    build: str = UPSTREAM

    def to_dict(self) -> dict:
        """JSON-ready dict (tuples become lists)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "PrecomputeRecord":
        """Inverse of :meth:`to_dict`; unknown keys raise ValueError naming them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"precompute record: unknown field(s) {unknown}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    @property
    def headdim_v_resolved(self) -> int:
        return self.headdim if self.headdim_v is None else self.headdim_v

    def lengths_known(self) -> bool:
        """Every per-batch vector the prepare step reads has host values."""
        return (self.cache_seqlens is not None and (self.cu_seqlens_q is not None or not self.has_cu_seqlens_q)
                and (self.leftpad_k is not None or not self.has_leftpad)
                and (self.cu_seqlens_k_new is not None or not self.has_cu_seqlens_k_new))

    def scheduler_kwargs(self) -> dict:
        """Keyword arguments for refmodel's ``get_scheduler_metadata`` (FA3 naming); needs host lengths."""
        if not self.lengths_known():
            raise ValueError("precompute record: cache_seqlens (and cu_seqlens_q / cache_leftpad / cu_seqlens_k_new "
                             "where given) were not read to the host; record with read_tensors=True")
        return dict(batch_size=self.batch_size, max_seqlen_q=self.max_seqlen_q, max_seqlen_k=self.max_seqlen_k,
                    num_heads_q=self.num_heads, num_heads_kv=self.num_heads_k, headdim=self.headdim,
                    cache_seqlens=list(self.cache_seqlens), qkv_dtype=self.qkv_dtype, headdim_v=self.headdim_v,
                    cu_seqlens_q=None if self.cu_seqlens_q is None else list(self.cu_seqlens_q),
                    cu_seqlens_k_new=None if self.cu_seqlens_k_new is None else list(self.cu_seqlens_k_new),
                    cache_leftpad=None if self.leftpad_k is None else list(self.leftpad_k),
                    page_size=self.page_size, max_seqlen_k_new=self.max_seqlen_k_new, causal=self.causal,
                    window_size=tuple(self.window_size), attention_chunk=self.attention_chunk,
                    has_softcap=self.has_softcap, num_splits=self.num_splits, pack_gqa=self.pack_gqa,
                    sm_margin=self.sm_margin, num_sm=self.num_sm, arch=self.arch, build=self.build)

    def schedule_key(self) -> tuple:
        """The scalars the precompute's schedule depends on (refmodel ``precompute_inputs``)."""
        return (self.batch_size, self.max_seqlen_q, self.max_seqlen_k, self.num_heads, self.num_heads_k, self.headdim,
                self.qkv_dtype, self.headdim_v, self.has_cu_seqlens_q, self.has_leftpad, self.page_size,
                self.max_seqlen_k_new, self.causal, tuple(self.window_size), self.attention_chunk, self.has_softcap,
                self.num_splits, self.pack_gqa, self.sm_margin, self.num_sm, self.arch, self.build)


@functools.lru_cache(maxsize=4096)
def _precompute_schedule(key: tuple) -> Schedule:
    (b, sq, sk, h, hk, d, dtype, dv, varlen_q, leftpad, page, knew, causal, window, chunk, softcap, splits, pack,
     margin, num_sm, arch, build) = key
    return resolve_schedule(precompute_inputs(
        b, sq, sk, h, hk, d, qkv_dtype=dtype, headdim_v=dv, varlen_q=varlen_q, has_leftpad=leftpad, page_size=page,
        max_seqlen_k_new=knew, causal=causal, window_size=window, attention_chunk=chunk, has_softcap=softcap,
        num_splits=splits, pack_gqa=pack, sm_margin=margin, num_sm=num_sm, arch=arch, build=build))


def precompute_schedule(pre: PrecomputeRecord) -> Schedule:
    """The precompute's resolved schedule (refmodel ``precompute_inputs`` + ``resolve_schedule``, memoised)."""
    return _precompute_schedule(pre.schedule_key())


def _precompute_signature(args: tuple, kwargs: dict, signature: Optional[str]) -> str:
    if signature is not None:
        if signature not in PRECOMPUTE_SIGNATURES:
            raise ValueError(f"signature: must be one of {sorted(PRECOMPUTE_SIGNATURES)} or None, got {signature!r}")
        return signature
    names = set(kwargs)
    if names & _SGL_ONLY and names & _FA3_ONLY:
        raise TypeError(f"get_scheduler_metadata: mixes sgl_kernel names {sorted(names & _SGL_ONLY)} with FA3 names "
                        f"{sorted(names & _FA3_ONLY)}")
    if names & _SGL_ONLY:
        return "sgl_kernel"
    if names & _FA3_ONLY or len(args) <= _COMMON_POSITIONAL:
        return "fa3"
    raise TypeError(f"get_scheduler_metadata: {len(args)} positional arguments bind differently under the "
                    f"sgl_kernel and FA3 signatures; pass signature='sgl_kernel' or 'fa3'")


_RENAME = {("sgl_kernel", "fa3"): {"num_heads": "num_heads_q", "num_heads_k": "num_heads_kv",
                                   "leftpad_k": "cache_leftpad"},
           ("fa3", "sgl_kernel"): {"num_heads_q": "num_heads", "num_heads_kv": "num_heads_k",
                                   "cache_leftpad": "leftpad_k"}}


def bind_precompute(*args, signature: Optional[str] = None, **kwargs) -> tuple:
    """``(signature, arguments by name)`` of a ``get_scheduler_metadata`` call under either naming."""
    sig = _precompute_signature(args, kwargs, signature)
    return sig, _bind("get_scheduler_metadata", PRECOMPUTE_SIGNATURES[sig], args, kwargs)


def translate_precompute(bound: dict, source: str, target: str) -> dict:
    """Keyword arguments of a bound precompute renamed from one signature's names to the other's.

    ``cu_seqlens_k`` / ``seqused_q`` (sgl_kernel only) have no FA3-naming counterpart: ValueError if given.
    """
    if source == target:
        return dict(bound)
    rename = _RENAME[(source, target)]
    out = {}
    for name, value in bound.items():
        if name in ("cu_seqlens_k", "seqused_q") and target == "fa3":
            if value is not None:
                raise ValueError(f"{name}: has no counterpart in the FA3 naming of get_scheduler_metadata")
            continue
        out[rename.get(name, name)] = value
    return out


def record_precompute(*args, signature: Optional[str] = None, num_sm: int = DEFAULT_NUM_SM,
                      arch: int = DEFAULT_ARCH, read_tensors: Optional[bool] = None, build: str = UPSTREAM,
                      **kwargs) -> PrecomputeRecord:
    """Bind ``get_scheduler_metadata(*args, **kwargs)`` under either signature and record it.

    ``signature``: "sgl_kernel", "fa3" or None (decided by the keyword names; positional arguments past
    ``cu_seqlens_q`` need it). ``read_tensors``: None reads host (CPU) tensors only, True also copies device
    tensors to the host (a sync), False reads none.
    """
    sig, a = bind_precompute(*args, signature=signature, **kwargs)
    return record_bound_precompute(sig, a, num_sm=num_sm, arch=arch, read_tensors=read_tensors, build=build)


def record_bound_precompute(sig: str, a: dict, num_sm: int = DEFAULT_NUM_SM, arch: int = DEFAULT_ARCH,
                            read_tensors: Optional[bool] = None, build: str = UPSTREAM) -> PrecomputeRecord:
    """:func:`record_precompute` for arguments already bound by :func:`bind_precompute`."""
    if sig == "sgl_kernel":
        h, hk, leftpad = a["num_heads"], a["num_heads_k"], a["leftpad_k"]
        cu_k, seqused_q = a["cu_seqlens_k"], a["seqused_q"]
    else:
        h, hk, leftpad = a["num_heads_q"], a["num_heads_kv"], a["cache_leftpad"]
        cu_k = seqused_q = None
    read, skip = bool(read_tensors), read_tensors is False
    cs = a["cache_seqlens"]
    return PrecomputeRecord(
        batch_size=int(a["batch_size"]), max_seqlen_q=int(a["max_seqlen_q"]), max_seqlen_k=int(a["max_seqlen_k"]),
        num_heads=int(h), num_heads_k=int(hk), headdim=int(a["headdim"]),
        headdim_v=None if a["headdim_v"] is None else int(a["headdim_v"]), qkv_dtype=_dtype_name(a["qkv_dtype"]),
        cache_seqlens=(tuple([int(cs)] * int(a["batch_size"])) if isinstance(cs, int) and not isinstance(cs, bool)
                       else (None if skip else _host_ints(cs, read))),
        cu_seqlens_q=None if skip else _host_ints(a["cu_seqlens_q"], read),
        cu_seqlens_k_new=None if skip else _host_ints(a["cu_seqlens_k_new"], read),
        leftpad_k=None if skip else _host_ints(leftpad, read),
        has_cu_seqlens_q=a["cu_seqlens_q"] is not None, has_cu_seqlens_k_new=a["cu_seqlens_k_new"] is not None,
        has_leftpad=leftpad is not None, has_cu_seqlens_k=cu_k is not None, has_seqused_q=seqused_q is not None,
        page_size=None if a["page_size"] is None else int(a["page_size"]),
        max_seqlen_k_new=int(a["max_seqlen_k_new"] or 0), causal=bool(a["causal"]),
        window_size=_pair(a["window_size"]), attention_chunk=int(a["attention_chunk"] or 0),
        has_softcap=bool(a["has_softcap"]), num_splits=int(a["num_splits"] or 0),
        pack_gqa=None if a["pack_gqa"] is None else bool(a["pack_gqa"]), sm_margin=int(a["sm_margin"] or 0),
        num_sm=int(num_sm), arch=int(arch), signature=sig, build=check_build_name(build))


# ------------------------------------------------------------------------------------------------------------
# The call
# ------------------------------------------------------------------------------------------------------------


def _shape(t) -> Optional[tuple]:
    return None if t is None else tuple(t.shape)


@dataclass(frozen=True)
class CallRecord:
    """Shapes, dtypes and scalars of one FA3 call (``mha_fwd``'s view, ``hopper/flash_api.cpp``), JSON-able.

    ``seqlen_k`` is ``page_table.size(1) * page_size`` when paged, else ``k_cache.size(1)`` (vLLM varlen without
    a block table: ``max_seqlen_k``). ``cache_seqlens`` / ``cu_seqlens_q`` / ``leftpad`` hold host values only
    when read (``read_tensors=True``, or an int ``cache_seqlens``).
    """

    batch_size: int
    seqlen_q: int
    seqlen_k: int
    total_q: int
    num_heads: int
    num_heads_k: int
    headdim: int
    headdim_v: int
    dtype: str
    q_shape: tuple
    k_cache_shape: tuple
    v_cache_shape: tuple
    page_table_shape: Optional[tuple] = None
    page_size: Optional[int] = None
    varlen_q: bool = False
    has_cache_seqlens: bool = False
    has_leftpad: bool = False
    max_seqlen_q: Optional[int] = None
    seqlen_k_new: int = 0
    has_k_new: bool = False
    causal: bool = False
    window_size: tuple = (-1, -1)
    attention_chunk: int = 0
    softcap: float = 0.0
    num_splits: int = 0
    pack_gqa: Optional[bool] = None
    sm_margin: int = 0
    metadata_passed: bool = False
    metadata_numel: Optional[int] = None
    cache_seqlens: Optional[tuple] = None
    cu_seqlens_q: Optional[tuple] = None
    leftpad: Optional[tuple] = None
    num_sm: int = DEFAULT_NUM_SM
    arch: int = DEFAULT_ARCH
    function: str = "flash_attn_with_kvcache"
    build: str = UPSTREAM

    to_dict = PrecomputeRecord.to_dict

    @classmethod
    def from_dict(cls, data: dict) -> "CallRecord":
        """Inverse of :meth:`to_dict`; unknown keys raise ValueError naming them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"call record: unknown field(s) {unknown}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    @property
    def kernel_runs(self) -> bool:
        """``mha_fwd`` launches only when total_q > 0 and total_k > 0 (``CallShape.kernel_runs``)."""
        return self.total_q > 0 and self.batch_size * self.k_cache_shape[1] > 0 and self.num_heads_k > 0

    @property
    def seqlens_q(self) -> Optional[tuple]:
        """Per-batch query rows when known (always for a non-varlen q)."""
        if not self.varlen_q:
            return (self.seqlen_q,) * self.batch_size
        if self.cu_seqlens_q is None:
            return None
        cu = self.cu_seqlens_q
        return tuple(cu[i + 1] - cu[i] for i in range(self.batch_size))

    def lengths_known(self) -> bool:
        return ((self.cache_seqlens is not None or not self.has_cache_seqlens)
                and (self.cu_seqlens_q is not None or not self.varlen_q)
                and (self.leftpad is not None or not self.has_leftpad))

    def schedule_key(self) -> tuple:
        """The scalars the call's schedule depends on (refmodel ``call_inputs``); ``total_q`` only under a build whose
        get_num_splits reads it (refmodel.fa3_builds ``varlen_total_q_bound``), else None."""
        from refmodel.fa3_builds import build as fa3_build

        total_q = self.total_q if fa3_build(self.build).varlen_total_q_bound else None
        return (self.batch_size, self.seqlen_q, self.seqlen_k, self.num_heads, self.num_heads_k, self.headdim,
                self.headdim_v, self.dtype, self.varlen_q, self.has_cache_seqlens, self.has_leftpad, self.page_size,
                self.seqlen_k_new, self.causal, tuple(self.window_size), self.attention_chunk, self.softcap > 0,
                self.num_splits, self.pack_gqa, self.sm_margin, self.num_sm, self.arch, self.has_k_new,
                self.build, total_q)

    def call_shape(self) -> CallShape:
        """gpu_impl.kernels.base's :class:`CallShape` of this call (needs the host lengths)."""
        if not self.lengths_known():
            raise ValueError("call record: cache_seqlens / cu_seqlens_q / cache_leftpad were not read to the host; "
                             "record the call with read_tensors=True")
        sq = self.seqlens_q
        return CallShape(batch_size=self.batch_size, seqlen_q=self.seqlen_q, seqlen_k=self.seqlen_k,
                         total_q=self.total_q, num_heads=self.num_heads, num_heads_k=self.num_heads_k,
                         headdim=self.headdim, headdim_v=self.headdim_v, dtype=getattr(torch, self.dtype),
                         page_size=self.page_size, varlen_q=self.varlen_q, seqlens_q=tuple(sq),
                         cache_seqlens=self.cache_seqlens if self.has_cache_seqlens else None,
                         cache_leftpad=self.leftpad if self.has_leftpad else None,
                         cache_slots=self.k_cache_shape[1])


@functools.lru_cache(maxsize=4096)
def _call_schedule(key: tuple) -> Schedule:
    (b, sq, sk, h, hk, d, dv, dtype, varlen_q, has_cs, leftpad, page, knew, causal, window, chunk, softcap, splits,
     pack, margin, num_sm, arch, has_k_new, build, total_q) = key
    return resolve_schedule(call_inputs(
        b, sq, sk, h, hk, d, headdim_v=dv, qkv_dtype=schedule_dtype(getattr(torch, dtype)), varlen_q=varlen_q,
        has_cache_seqlens=has_cs, has_leftpad=leftpad, page_size=page, seqlen_knew=knew, causal=causal,
        window_size=window, attention_chunk=chunk, has_softcap=softcap, num_splits=splits, pack_gqa=pack,
        sm_margin=margin, num_sm=num_sm, arch=arch, has_k_new=has_k_new, build=build, total_q=total_q))


def call_schedule_of(call: CallRecord) -> Schedule:
    """The call's own resolved schedule (refmodel ``call_inputs`` + ``resolve_schedule``, memoised): S_c etc."""
    return _call_schedule(call.schedule_key())


def _record(fn: str, q, k_cache, v_cache, *, cache_seqlens, cache_leftpad, page_table, cu_seqlens_q, max_seqlen_q,
            seqlen_k_static, seqlen_k_new, causal, window_size, attention_chunk, softcap, scheduler_metadata,
            num_splits, pack_gqa, sm_margin, num_sm, arch, read_tensors, has_k_new=False,
            build: str = UPSTREAM) -> CallRecord:
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: must be a tensor, got {type(t).__name__}")
    varlen_q = cu_seqlens_q is not None
    if varlen_q:
        batch_size = int(cu_seqlens_q.shape[0]) - 1 if isinstance(cu_seqlens_q, torch.Tensor) else len(cu_seqlens_q) - 1
        if max_seqlen_q is None:
            raise ValueError("max_seqlen_q: must be given with cu_seqlens_q (FA3 requires it)")
        seqlen_q, total_q = int(max_seqlen_q), int(q.shape[0])
    else:
        batch_size, seqlen_q = int(q.shape[0]), int(q.shape[1])
        total_q = batch_size * seqlen_q
    paged = page_table is not None
    page_size = int(k_cache.shape[1]) if paged else None
    if seqlen_k_static is not None:
        seqlen_k = int(seqlen_k_static)
    elif paged:
        seqlen_k = int(page_table.shape[1]) * page_size
    else:
        seqlen_k = int(k_cache.shape[1])
    read = bool(read_tensors)
    int_cs = isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool)
    md = scheduler_metadata
    return CallRecord(
        batch_size=batch_size, seqlen_q=seqlen_q, seqlen_k=seqlen_k, total_q=total_q, num_heads=int(q.shape[-2]),
        num_heads_k=int(k_cache.shape[-2]), headdim=int(q.shape[-1]), headdim_v=int(v_cache.shape[-1]),
        dtype=_dtype_name(q.dtype), q_shape=_shape(q), k_cache_shape=_shape(k_cache), v_cache_shape=_shape(v_cache),
        page_table_shape=_shape(page_table), page_size=page_size, varlen_q=varlen_q,
        has_cache_seqlens=cache_seqlens is not None, has_leftpad=cache_leftpad is not None,
        max_seqlen_q=None if max_seqlen_q is None else int(max_seqlen_q), seqlen_k_new=int(seqlen_k_new),
        has_k_new=bool(has_k_new), causal=bool(causal), window_size=_pair(window_size),
        attention_chunk=int(attention_chunk or 0),
        softcap=float(softcap or 0.0), num_splits=int(num_splits or 0),
        pack_gqa=None if pack_gqa is None else bool(pack_gqa), sm_margin=int(sm_margin or 0),
        metadata_passed=md is not None, metadata_numel=int(md.numel()) if isinstance(md, torch.Tensor) else None,
        cache_seqlens=(tuple([int(cache_seqlens)] * batch_size) if int_cs
                       else (_host_ints(cache_seqlens, True) if read else None)),
        cu_seqlens_q=_host_ints(cu_seqlens_q, True) if read else None,
        leftpad=_host_ints(cache_leftpad, True) if read else None,
        num_sm=int(num_sm), arch=int(arch), function=fn, build=check_build_name(build))


def bind_call(*args, **kwargs) -> dict:
    """``flash_attn_with_kvcache``'s arguments by name (FA3 order; unknown keywords ignored)."""
    return _bind("flash_attn_with_kvcache", CALL_SIGNATURE, args, kwargs, strict=False)


def record_bound_call(a: dict, num_sm: int = DEFAULT_NUM_SM, arch: int = DEFAULT_ARCH,
                      read_tensors: bool = False, build: str = UPSTREAM) -> CallRecord:
    """:func:`record_call` for arguments already bound by :func:`bind_call`."""
    k = a["k"]
    return _record("flash_attn_with_kvcache", a["q"], a["k_cache"], a["v_cache"], cache_seqlens=a["cache_seqlens"],
                   cache_leftpad=a["cache_leftpad"], page_table=a["page_table"], cu_seqlens_q=a["cu_seqlens_q"],
                   max_seqlen_q=a["max_seqlen_q"], seqlen_k_static=None,
                   seqlen_k_new=int(k.shape[1]) if isinstance(k, torch.Tensor) and k.dim() == 4 else 0,
                   has_k_new=isinstance(k, torch.Tensor),
                   causal=a["causal"], window_size=a["window_size"], attention_chunk=a["attention_chunk"],
                   softcap=a["softcap"], scheduler_metadata=a["scheduler_metadata"], num_splits=a["num_splits"],
                   pack_gqa=a["pack_gqa"], sm_margin=a["sm_margin"], num_sm=num_sm, arch=arch,
                   read_tensors=read_tensors, build=build)


def call_key(a: dict) -> Optional[tuple]:
    """Everything :func:`record_bound_call` reads without tensor values, as a hashable key (None when a
    tensor argument is not a tensor): two calls with equal keys give equal records (read_tensors=False)."""
    q, kc, vc = a.get("q"), a.get("k_cache"), a.get("v_cache")
    if not (isinstance(q, torch.Tensor) and isinstance(kc, torch.Tensor) and isinstance(vc, torch.Tensor)):
        return None
    pt, cs, cu, lp, kn, md = (a.get("page_table"), a.get("cache_seqlens"), a.get("cu_seqlens_q"),
                              a.get("cache_leftpad"), a.get("k"), a.get("scheduler_metadata"))
    w = a.get("window_size", (-1, -1))
    try:
        return (q.shape, q.dtype, kc.shape, vc.shape, None if pt is None else pt.shape,
                cs if (isinstance(cs, int) or cs is None) else True, lp is None,
                None if cu is None else cu.shape, None if kn is None else kn.shape, a.get("max_seqlen_q"),
                a.get("causal", False), (-1, -1) if w is None else tuple(w), a.get("attention_chunk", 0),
                a.get("softcap", 0.0), a.get("num_splits", 0), a.get("pack_gqa"), a.get("sm_margin", 0),
                None if md is None else (md.numel() if isinstance(md, torch.Tensor) else -1))
    except (AttributeError, TypeError):
        return None


def record_call(*args, num_sm: int = DEFAULT_NUM_SM, arch: int = DEFAULT_ARCH, read_tensors: bool = False,
                build: str = UPSTREAM, **kwargs) -> CallRecord:
    """Bind ``flash_attn_with_kvcache(*args, **kwargs)`` and record its shapes and scalars (no device sync
    unless ``read_tensors=True``, which copies cache_seqlens / cu_seqlens_q / cache_leftpad to the host)."""
    return record_bound_call(bind_call(*args, **kwargs), num_sm=num_sm, arch=arch, read_tensors=read_tensors,
                             build=build)


def record_varlen_call(*args, num_sm: int = DEFAULT_NUM_SM, arch: int = DEFAULT_ARCH, read_tensors: bool = False,
                       build: str = UPSTREAM, **kwargs) -> CallRecord:
    """Record vLLM's ``flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, ...,
    seqused_k, block_table, scheduler_metadata, num_splits, ...)`` in FA3's call vocabulary.

    ``seqused_k`` is FA3's ``cache_seqlens`` and ``block_table`` its ``page_table``; without a block table the
    call's static seqlen_k is ``max_seqlen_k`` (``mha_fwd`` with ``cu_seqlens_k``; varlen K itself is not modelled).
    Under the vLLM fork's builds the call's seqlen_k is ``max_seqlen_k`` whenever it is passed, block table or not
    (vllm-project/flash-attention@617264c1 hopper/flash_api.cpp 835, @a8937124 774; vLLM's wrapper always passes
    it; refmodel.fa3_builds ``fork_static_seqlen_k``).
    """
    if len(args) > len(VARLEN_POSITIONAL):
        raise TypeError(f"flash_attn_varlen_func: record takes at most {len(VARLEN_POSITIONAL)} positional "
                        f"arguments (pass the rest by keyword, as vLLM does), got {len(args)}")
    a = dict(zip(VARLEN_POSITIONAL, args))
    for name, value in kwargs.items():
        if name in a:
            raise TypeError(f"flash_attn_varlen_func: got multiple values for argument {name!r}")
        a[name] = value
    missing = [n for n in VARLEN_POSITIONAL if n not in a]
    if missing:
        raise TypeError(f"flash_attn_varlen_func: missing required argument(s) {', '.join(missing)}")
    block_table = a.get("block_table")
    return _record("flash_attn_varlen_func", a["q"], a["k"], a["v"], cache_seqlens=a.get("seqused_k"),
                   cache_leftpad=None, page_table=block_table, cu_seqlens_q=a["cu_seqlens_q"],
                   max_seqlen_q=a["max_seqlen_q"],
                   seqlen_k_static=(a["max_seqlen_k"] if block_table is None or (fork_static_seqlen_k(build) and
                                                                              a["max_seqlen_k"] is not None) else None),
                   seqlen_k_new=0, causal=a.get("causal", False), window_size=a.get("window_size"),
                   attention_chunk=0, softcap=a.get("softcap", 0.0), scheduler_metadata=a.get("scheduler_metadata"),
                   num_splits=a.get("num_splits", 0), pack_gqa=None, sm_margin=0, num_sm=num_sm, arch=arch,
                   read_tensors=read_tensors, build=build)
