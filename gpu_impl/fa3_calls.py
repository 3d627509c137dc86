"""Recording and checking FA3 calls: what was passed to ``get_scheduler_metadata`` and to the call using it.

Invariant (one sentence): a ``flash_attn_with_kvcache(..., scheduler_metadata=md)`` call is safe only if ``md``
was produced by a precompute whose inputs schedule the same way as the call's own (spec.invariants: SHAPE,
SPLIT_BOUND, COMBINE_CAPACITY, BATCH_PERMUTATION, QUERY_COVER, KV_COVER); FA3 itself checks only md's shape
(``hopper/flash_api.cpp`` ``mha_fwd``: ``CHECK_SHAPE(scheduler_metadata, metadata_size)``).

This module is the shim every real-engine driver and the runtime sanitizer share. It imports only torch,
refmodel, spec and gpu_impl (it runs inside isolated engine environments where only torch and numpy exist).

* :func:`record_precompute` / :class:`PrecomputeRecord`: the resolved arguments of one ``get_scheduler_metadata``
  call, in plain Python, under either signature (sgl_kernel's ``num_heads, num_heads_k, leftpad_k`` or FA3 /
  vLLM-fork ``num_heads_q, num_heads_kv, cache_leftpad``); :func:`record_call` / :class:`CallRecord`: shapes,
  dtypes and scalars of one ``flash_attn_with_kvcache`` (or vLLM ``flash_attn_varlen_func``) call, host values
  of the small index vectors only when asked. Defined in :mod:`gpu_impl.fa3_records`, re-exported here.
* :func:`quick_check`: shapes and scalars only, no device sync. :func:`deep_check`: the full
  ``spec.invariants.check_all`` over the per-batch vectors.
* :func:`pair_summary`: the normalised "what was passed to FA3 on both sides" dict used by conformance.
* :class:`CheckingFA3`: an FA3 front that records, checks and delegates to any implementation.

Every formula comes from refmodel (``precompute_inputs``, ``call_inputs``, ``resolve_schedule``,
``m_blocks_for``, ``combine_capacity``, ``get_scheduler_metadata``) or gpu_impl.kernels.base (``build_tile_plan``,
``check_plan``, which run ``spec.invariants.check_all``); nothing is re-derived here.

Simplifications (stated once): ``cu_seqlens_k`` and ``seqused_q`` of the sgl_kernel precompute, and ``k``/``v``
(appended KV) of the call, are recorded but refmodel does not model them (the schedule ignores them beyond
``max_seqlen_k_new``/``seqlen_k_new``); a real FA3 metadata tensor holds garbage, not ``UNWRITTEN``, in slots
the precompute never wrote, so :func:`deep_check` on a real tensor sees such reads only as out-of-range
values (:func:`quick_check`'s batch-size check catches them from the scalars).
"""

from __future__ import annotations

import math
import warnings
import weakref
from typing import Callable, Optional, Sequence

import torch

from refmodel.fa3_scheduler import PREPARE_MAX_BATCH_ONE_CTA, Schedule, combine_capacity
from refmodel.metadata import get_scheduler_metadata as ref_get_scheduler_metadata
from refmodel.prepare import m_blocks_for
from spec.invariants import Violation

from .errors import MetadataShapeError
from .fa3_records import (CALL_SIGNATURE, DEFAULT_ARCH, DEFAULT_NUM_SM, PRECOMPUTE_SIGNATURES, VARLEN_POSITIONAL,
                          CallRecord, PrecomputeRecord, bind_call, bind_precompute, call_schedule_of,
                          precompute_schedule, record_bound_call, record_bound_precompute, record_call,
                          record_precompute, record_varlen_call, translate_precompute)
from .kernels.base import KernelAdapter, build_tile_plan, check_plan

__all__ = [
    "PrecomputeRecord", "CallRecord", "record_precompute", "record_call", "record_varlen_call", "bind_call",
    "record_bound_call", "bind_precompute", "record_bound_precompute", "translate_precompute",
    "quick_check", "deep_check", "pair_summary", "CheckingFA3", "MetadataMismatch", "MetadataRegistry",
    "precompute_schedule", "call_schedule_of", "violation_signature", "DEFAULT_NUM_SM", "DEFAULT_ARCH",
    "PRECOMPUTE_SIGNATURES", "CALL_SIGNATURE", "VARLEN_POSITIONAL",
]


# ------------------------------------------------------------------------------------------------------------
# The checks
# ------------------------------------------------------------------------------------------------------------


def _origin_violation(call: CallRecord) -> Violation:
    return Violation("METADATA_ORIGIN", None, {"metadata_numel": call.metadata_numel},
                     f"{call.function} was given a scheduler_metadata tensor ({call.metadata_numel} int32) that was not "
                     f"produced by a recorded get_scheduler_metadata call (nor copied from one): its inputs are "
                     f"unknown, so nothing says it matches this call")


def quick_check(pre: Optional[PrecomputeRecord], call: CallRecord) -> list[Violation]:
    """Check a precompute against the call consuming its metadata from shapes and scalars only (no device sync).

    * SHAPE: the precompute's metadata size, and the tensor's size, equal the size the call expects
      (``nvec*b4 + semaphore``); a mismatch is FA3's loud error, reported so the pair is seen; nothing else
      is checked then.
    * BATCH_PERMUTATION from the batch sizes: b_c > b_p reads slots the precompute never wrote; with Sort,
      b_c < b_p makes ``varlen_batch_idx[0:b_c]`` name batches the call does not have.
    * SPLIT_BOUND from ``S_p <= S_c or S_c == 1``. Sufficient for SPLIT_BOUND and COMBINE_CAPACITY: the
      prepare step clamps every per-batch split to ``min(ceil(n_blocks/blocks_per_sm), S_p)`` (all 1 when
      b_p > 992), so each split in md is <= S_p <= S_c, and ``kMax(S_c, dv) >= S_c`` for every S_c; with
      S_c == 1 FA3 ignores md's split counts. It is not necessary: a pair with S_p > S_c whose current lengths
      give small splits passes :func:`deep_check` (reported here as a mismatch the next skewed batch overflows).
    * QUERY_COVER from what the scalars allow: md's m-blocks (precompute tiles, unforced PackGQA, its qhpk)
      times the kernel's kBlockM cover the call's packed rows, per batch when both sides' query lengths are
      known (always for a non-varlen q), else for every length up to max_seqlen_q assuming the same
      cu_seqlens_q on both sides.

    ``pre=None`` (metadata of unknown origin) gives one METADATA_ORIGIN violation.
    """
    if not call.metadata_passed:
        return []
    if pre is None:
        return [_origin_violation(call)]
    P = precompute_schedule(pre)
    C = call_schedule_of(call)
    expected = C.metadata_size
    if expected == 0:
        return []  # mha_fwd ignores scheduler_metadata
    sizes = {"produced": P.metadata_size, "expected": expected, "passed": call.metadata_numel}
    if P.metadata_size != expected or (call.metadata_numel is not None and call.metadata_numel != expected):
        return [Violation("SHAPE", None, sizes,
                          f"metadata of {call.metadata_numel} int32 values (precompute produces {P.metadata_size}) but "
                          f"the call expects {expected} (nvec*b4 + semaphore): FA3 raises, a loud and safe error")]
    if not call.kernel_runs or not C.inputs.uses_prepare:
        return []  # the kernels read no per-batch vectors (gpu_impl.kernels.base.check_plan)
    out: list[Violation] = []
    b_p, b_c = pre.batch_size, call.batch_size
    if b_c > b_p or (b_c < b_p and C.sort):
        out.append(Violation(
            "BATCH_PERMUTATION", None, {"precompute_batch": b_p, "call_batch": b_c, "sort": C.sort},
            f"metadata computed for {b_p} sequences, call has {b_c}: "
            + (f"virtual batches {b_p}..{b_c - 1} read slots the precompute never wrote" if b_c > b_p else
               f"varlen_batch_idx[0:{b_c}] is a prefix of a sort of {b_p} batches, not a permutation of 0..{b_c - 1}")))
    s_c = C.num_splits
    s_p = 1 if b_p > PREPARE_MAX_BATCH_ONE_CTA else P.num_splits
    if s_c > 1 and s_p > s_c:
        k_max = combine_capacity(s_c, C.inputs.headdim_v)
        out.append(Violation(
            "SPLIT_BOUND", None, {"s_p": s_p, "s_c": s_c, "k_max": k_max, "possible_out_of_bounds_splits": [s_c, s_p - 1],
                                  "check": "S_p <= S_c or S_c == 1"},
            f"the precompute allows up to S_p={s_p} splits per batch but the call's partial buffers hold S_c={s_c} "
            f"(combine reads kMax={k_max}): any batch given more than {s_c} splits is written and read out of bounds"))
    out.extend(_quick_query_cover(pre, call, P, C))
    return out


def _quick_query_cover(pre: PrecomputeRecord, call: CallRecord, P: Schedule, C: Schedule) -> list[Violation]:
    qp, fp, bm_p = P.qhead_per_khead, P.pack_gqa, P.block_m
    qc, fc, bm_c = C.qhead_per_khead, C.kernel_pack_gqa, C.kernel_block_m

    def short(lq_p: int, lq_c: int) -> Optional[tuple]:
        have = m_blocks_for(lq_p, qp, fp, bm_p)
        need = m_blocks_for(lq_c, qc, fc, bm_c)
        return None if have >= need else (have, need)

    def violation(bb, lq_p, lq_c, have, need, assumed):
        rows = lq_c * (qc if fc else 1)
        return Violation("QUERY_COVER", bb, {"metadata_m_blocks": have, "m_blocks_needed": need,
                                             "kernel_block_m": bm_c, "rows": rows, "precompute_rows": lq_p,
                                             "uncovered_rows": [have * bm_c, rows - 1], "assumed_lengths": assumed},
                         f"{'batch ' + str(bb) if bb is not None else 'a batch'} of {lq_c} query rows: md gives "
                         f"{have} m-blocks (precompute kBlockM={bm_p}, pack={fp}, qhpk={qp}) but the call needs {need} "
                         f"of {bm_c} rows (pack={fc}, qhpk={qc}): rows {have * bm_c}..{rows - 1} are never computed")

    lq_c = call.seqlens_q
    if pre.cu_seqlens_q is not None:
        cu = pre.cu_seqlens_q
        lq_p = tuple(cu[i + 1] - cu[i] for i in range(pre.batch_size))
    elif not pre.has_cu_seqlens_q:
        lq_p = (pre.max_seqlen_q,) * pre.batch_size
    else:
        lq_p = None
    if lq_p is None and lq_c is not None:
        lq_p = lq_c          # same cu_seqlens_q assumed on both sides
    if lq_c is None and lq_p is not None:
        lq_c = lq_p
    if lq_p is not None:
        n = min(len(lq_p), len(lq_c))
        if n and len(set(lq_p[:n])) == 1 and len(set(lq_c[:n])) == 1:
            gap = short(lq_p[0], lq_c[0])
            return [] if gap is None else [violation(None, lq_p[0], lq_c[0], *gap, False)]
        for bb in range(n):
            gap = short(lq_p[bb], lq_c[bb])
            if gap is not None:
                return [violation(bb, lq_p[bb], lq_c[bb], *gap, False)]
        return []
    # Neither side's per-batch query lengths are on the host: any length L <= max_seqlen_q may occur.
    f_p, f_c = (qp if fp else 1), (qc if fc else 1)
    if f_p * bm_c >= f_c * bm_p:
        return []  # ceil(L*f_p/bm_p)*bm_c >= L*f_p*bm_c/bm_p >= L*f_c for every L
    first_bad = bm_p // math.gcd(f_p, bm_p)
    for L in range(1, min(call.seqlen_q, first_bad) + 1):
        gap = short(L, L)
        if gap is not None:
            return [violation(None, L, L, *gap, True)]
    return []


def deep_check(pre: Optional[PrecomputeRecord], call: CallRecord, metadata=None) -> list[Violation]:
    """The full ``spec.invariants.check_all`` for the call reading this metadata (gpu_impl.kernels.base
    ``build_tile_plan`` + ``check_plan``), with the call's own per-batch lengths.

    ``metadata``: a host copy of the tensor the call was given (a tensor or a list of ints), or None to recompute
    it from ``pre`` with refmodel (``get_scheduler_metadata``; needs the precompute's host lengths). The call must
    have been recorded with its host lengths (``read_tensors=True``). A size mismatch is reported as SHAPE.
    """
    if not call.metadata_passed:
        return []
    if metadata is None:
        if pre is None:
            return [_origin_violation(call)]
        metadata = ref_get_scheduler_metadata(**pre.scheduler_kwargs())
    elif not isinstance(metadata, torch.Tensor):
        metadata = torch.tensor([int(x) for x in metadata], dtype=torch.int32)
    metadata = metadata.detach().to("cpu")
    C = call_schedule_of(call)
    try:
        plan = build_tile_plan(call.call_shape(), C, metadata, device=metadata.device)
    except MetadataShapeError as exc:
        return [Violation("SHAPE", None, {"produced": int(metadata.numel()), "expected": C.metadata_size},
                          f"{exc}: FA3 raises, a loud and safe error")]
    out = [] if pre is not None else [_origin_violation(call)]
    for v in check_plan(plan):
        out.append(Violation(v.invariant, v.batch, dict(v.indices), v.detail))
    return out


def pair_summary(pre: Optional[PrecomputeRecord], call: CallRecord) -> dict:
    """What was passed to FA3 on both sides, normalised (used by conformance to compare engines)."""
    C = call_schedule_of(call)
    pre_part = None
    s_p = None
    if pre is not None:
        pre_part = {"batch_size": pre.batch_size, "max_seqlen_q": pre.max_seqlen_q, "max_seqlen_k": pre.max_seqlen_k,
                    "num_heads": pre.num_heads, "num_heads_k": pre.num_heads_k, "headdim": pre.headdim,
                    "headdim_v": pre.headdim_v_resolved, "page_size": pre.page_size, "causal": pre.causal,
                    "window_size": list(pre.window_size), "has_softcap": pre.has_softcap,
                    "num_splits": pre.num_splits, "qkv_dtype": pre.qkv_dtype}
        s_p = precompute_schedule(pre).num_splits
    call_part = {"batch_size": call.batch_size, "num_heads": call.num_heads, "num_heads_k": call.num_heads_k,
                 "headdim": call.headdim, "headdim_v": call.headdim_v, "seqlen_k": call.seqlen_k,
                 "page_size": call.page_size, "num_splits": call.num_splits, "causal": call.causal,
                 "window_size": list(call.window_size), "softcap": call.softcap, "dtype": call.dtype,
                 "metadata_passed": call.metadata_passed}
    return {"precomputed": pre is not None, "precompute": pre_part, "call": call_part, "s_p": s_p,
            "s_c": C.num_splits}


def violation_signature(pre: Optional[PrecomputeRecord], call: CallRecord, violations: Sequence[Violation]) -> tuple:
    """A key that is equal for the same mismatch seen again (invariants + both sides' scalars, not lengths)."""
    return (tuple(sorted({v.invariant for v in violations})), None if pre is None else pre.schedule_key()[1:],
            call.schedule_key()[1:])


# ------------------------------------------------------------------------------------------------------------
# Remembering where a metadata tensor came from
# ------------------------------------------------------------------------------------------------------------


def _address(t: torch.Tensor) -> Optional[tuple]:
    if not isinstance(t, torch.Tensor) or t.device.type == "meta" or t.numel() == 0:
        return None
    return (t.device.type, t.device.index, t.data_ptr())


class MetadataRegistry:
    """Metadata tensor (by device address) -> the PrecomputeRecord that last wrote it, held weakly.

    Keyed by the address of the first element, so a view ``buf[:n]`` of a persistent buffer finds the buffer's
    entry; each entry keeps a weak reference to the tensor registered, and is dropped when that tensor dies
    (its memory may be reused by a tensor nobody recorded). :meth:`note_copy` records ``dst.copy_(src)``:
    the buffer's last writer becomes ``src``'s precompute (or unknown, when ``src`` is unknown).
    """

    def __init__(self):
        self._entries: dict = {}

    def __len__(self) -> int:
        self._purge()
        return len(self._entries)

    def _purge(self) -> None:
        for key in [k for k, (ref, _) in self._entries.items() if ref() is None]:
            del self._entries[key]

    def remember(self, tensor, record: Optional[PrecomputeRecord]) -> None:
        key = _address(tensor)
        if key is None:
            return
        if record is None:
            self._entries.pop(key, None)
            return
        try:
            ref = weakref.ref(tensor)
        except TypeError:  # not weak-referenceable: hold it (rare tensor subclasses)
            ref = (lambda t: (lambda: t))(tensor)
        self._entries[key] = (ref, record)

    def lookup(self, tensor) -> Optional[PrecomputeRecord]:
        key = _address(tensor)
        if key is None:
            return None
        entry = self._entries.get(key)
        if entry is None:
            return None
        ref, record = entry
        if ref() is None:
            del self._entries[key]
            return None
        return record

    def note_copy(self, dst, src) -> None:
        """``dst.copy_(src)`` happened: dst now holds src's metadata (unknown origin when src is unknown)."""
        self.remember(dst, self.lookup(src))


# ------------------------------------------------------------------------------------------------------------
# The checking front
# ------------------------------------------------------------------------------------------------------------


class MetadataMismatch(RuntimeError):
    """A call was given scheduler metadata that does not match its own inputs.

    Attributes: ``violations`` (spec ``Violation`` list, the first one named in the message), ``precompute``
    (PrecomputeRecord or None), ``call`` (CallRecord), ``case_path`` (set by a sanitizer that wrote a case).
    """

    def __init__(self, violations: Sequence[Violation], precompute: Optional[PrecomputeRecord], call: CallRecord,
                 case_path: Optional[str] = None):
        self.violations = list(violations)
        self.precompute = precompute
        self.call = call
        self.case_path = case_path
        first = self.violations[0]
        summary = pair_summary(precompute, call)
        batch = "" if first.batch is None else f" (batch {first.batch})"
        msg = (f"{first.invariant}{batch}: {first.message}\n  precompute: {summary['precompute']}"
               f"\n  call: {summary['call']}\n  S_p={summary['s_p']} S_c={summary['s_c']}")
        if len(self.violations) > 1:
            msg += "\n  also: " + ", ".join(sorted({v.invariant for v in self.violations[1:]}))
        if case_path:
            msg += f"\n  case file: {case_path}"
        super().__init__(msg)


MODES = ("raise", "warn", "record")


def _device_num_sm_arch(impl) -> tuple:
    num_sm, arch = getattr(impl, "num_sm", None), getattr(impl, "arch", None)
    if (num_sm is None or arch is None) and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        num_sm = props.multi_processor_count if num_sm is None else num_sm
        arch = props.major * 10 + props.minor if arch is None else arch
    return int(num_sm or DEFAULT_NUM_SM), int(arch or DEFAULT_ARCH)


class CheckingFA3:
    """FA3's entry points that record, check and delegate to ``impl`` (any object with FA3's two methods).

    Every metadata tensor ``get_scheduler_metadata`` returns is remembered (weakly) with its PrecomputeRecord;
    :meth:`note_copy` follows it into persistent buffers. Every call passing ``scheduler_metadata`` is checked
    (:func:`quick_check`; ``deep=True`` also runs :func:`deep_check` on a host copy, a device sync). A tensor of
    unknown origin is a METADATA_ORIGIN violation. On violations: ``on_violation(event)`` is called, then
    mode "raise" raises :class:`MetadataMismatch` without running the call, "warn" warns once per
    :func:`violation_signature` and runs it, "record" only records. ``events`` holds
    ``(PrecomputeRecord | None, CallRecord, violations)`` for every checked call (all calls with
    ``record_all=True``), at most ``max_events`` (oldest dropped). ``impl_signature`` ("fa3" for a
    gpu_impl kernel adapter, found automatically): the precompute naming ``impl`` takes, so a caller using
    sgl_kernel's names can be served by an FA3-named implementation.
    """

    def __init__(self, impl, mode: str = "raise", deep: bool = False, on_violation: Optional[Callable] = None,
                 num_sm: Optional[int] = None, arch: Optional[int] = None, record_all: bool = False,
                 max_events: Optional[int] = None, signature: Optional[str] = None,
                 impl_signature: Optional[str] = None):
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
        self.impl = impl
        self.mode = mode
        self.deep = bool(deep)
        self.on_violation = on_violation
        dev_sm, dev_arch = _device_num_sm_arch(impl) if num_sm is None or arch is None else (num_sm, arch)
        self.num_sm = int(num_sm if num_sm is not None else dev_sm)
        self.arch = int(arch if arch is not None else dev_arch)
        self.record_all = record_all
        self.max_events = max_events
        self.signature = signature
        if impl_signature is None and isinstance(impl, KernelAdapter):
            impl_signature = "fa3"
        if impl_signature is not None and impl_signature not in PRECOMPUTE_SIGNATURES:
            raise ValueError(f"impl_signature: must be one of {sorted(PRECOMPUTE_SIGNATURES)} or None, "
                             f"got {impl_signature!r}")
        #: the naming impl.get_scheduler_metadata takes (None: call it exactly as the caller called us)
        self.impl_signature = impl_signature
        self.registry = MetadataRegistry()
        self.events: list = []
        self.checked_calls = 0
        self._warned: set = set()

    # -- bookkeeping --------------------------------------------------------------------------------------
    def note_copy(self, dst, src) -> None:
        """Tell the checker ``dst.copy_(src)`` happened (a persistent CUDA-graph metadata buffer)."""
        self.registry.note_copy(dst, src)

    def origin_of(self, metadata) -> Optional[PrecomputeRecord]:
        return self.registry.lookup(metadata)

    def _event(self, pre, call, violations) -> None:
        self.events.append((pre, call, violations))
        if self.max_events is not None and len(self.events) > self.max_events:
            del self.events[: len(self.events) - self.max_events]

    def violations(self) -> list:
        """Every (precompute, call, violations) event with at least one violation."""
        return [e for e in self.events if e[2]]

    # -- the entry points ---------------------------------------------------------------------------------
    def get_scheduler_metadata(self, *args, **kwargs):
        sig, bound = bind_precompute(*args, signature=self.signature, **kwargs)
        pre = record_bound_precompute(sig, bound, num_sm=self.num_sm, arch=self.arch,
                                      read_tensors=True if self.deep else None)
        if self.impl_signature is None or self.impl_signature == sig:
            md = self.impl.get_scheduler_metadata(*args, **kwargs)
        else:
            md = self.impl.get_scheduler_metadata(**translate_precompute(bound, sig, self.impl_signature))
        self.registry.remember(md, pre)
        return md

    def flash_attn_with_kvcache(self, *args, **kwargs):
        bound = bind_call(*args, **kwargs)
        md = bound["scheduler_metadata"]
        call = record_bound_call(bound, num_sm=self.num_sm, arch=self.arch, read_tensors=self.deep and md is not None)
        self._check(call, md)
        return self.impl.flash_attn_with_kvcache(*args, **kwargs)

    def flash_attn_varlen_func(self, *args, **kwargs):
        md = kwargs.get("scheduler_metadata")
        call = record_varlen_call(*args, num_sm=self.num_sm, arch=self.arch,
                                  read_tensors=self.deep and md is not None, **kwargs)
        self._check(call, md)
        return self.impl.flash_attn_varlen_func(*args, **kwargs)

    def __getattr__(self, name):
        # Other FA3 functions (flash_attn_combine, ...) pass through unchecked.
        if name == "impl":
            raise AttributeError(name)
        return getattr(self.impl, name)

    def check(self, call: CallRecord, metadata) -> tuple:
        """Check one recorded call against the recorded origin of ``metadata``: ``(precompute, violations)``."""
        pre = self.registry.lookup(metadata) if metadata is not None else None
        violations = quick_check(pre, call)
        if not self.deep or metadata is None or any(v.invariant == "SHAPE" for v in violations):
            return pre, violations
        # deep: the exact verdict replaces the sufficient-condition one; the batch-size finding stays
        # (on a real tensor, unwritten slots hold garbage the exact check may not recognise)
        exact = deep_check(pre, call, metadata.detach().to("cpu") if isinstance(metadata, torch.Tensor) else metadata)
        names = {v.invariant for v in exact}
        exact += [v for v in violations if v.invariant == "BATCH_PERMUTATION" and v.invariant not in names]
        return pre, exact

    def _check(self, call: CallRecord, md) -> None:
        if md is None:
            if self.record_all:
                self._event(None, call, [])
            return
        self.checked_calls += 1
        pre, violations = self.check(call, md)
        self._event(pre, call, violations)
        if not violations:
            return
        if self.on_violation is not None:
            self.on_violation((pre, call, violations))
        if self.mode == "raise":
            raise MetadataMismatch(violations, pre, call)
        if self.mode == "warn":
            key = violation_signature(pre, call, violations)
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn(str(MetadataMismatch(violations, pre, call)), RuntimeWarning, stacklevel=3)
