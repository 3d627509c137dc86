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
from typing import Callable, Optional, Sequence

import torch

from refmodel.fa3_builds import UPSTREAM, check_build_name
from refmodel.fa3_scheduler import PREPARE_MAX_BATCH_ONE_CTA, Schedule, combine_capacity
from refmodel.metadata import get_scheduler_metadata as ref_get_scheduler_metadata
from refmodel.prepare import m_blocks_for
from spec.violation import Violation

from .errors import MetadataShapeError
from .fa3_records import (CALL_SIGNATURE, DEFAULT_ARCH, DEFAULT_NUM_SM, PRECOMPUTE_SIGNATURES, VARLEN_POSITIONAL,
                          CallRecord, PrecomputeRecord, bind_call, bind_precompute, call_key, call_schedule_of,
                          precompute_schedule, record_bound_call, record_bound_precompute, record_call,
                          record_precompute, record_varlen_call, translate_precompute)
from .fa3_registry import MetadataRegistry, tensor_address
from .kernels.base import KernelAdapter, build_tile_plan, check_plan

__all__ = [
    "PrecomputeRecord", "CallRecord", "record_precompute", "record_call", "record_varlen_call", "bind_call",
    "record_bound_call", "bind_precompute", "record_bound_precompute", "translate_precompute",
    "quick_check", "deep_check", "pair_summary", "CheckingFA3", "MetadataMismatch", "MetadataRegistry",
    "precompute_schedule", "call_schedule_of", "violation_signature", "captured_call_for", "graph_replay_check", "DEFAULT_NUM_SM", "DEFAULT_ARCH",
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
    return out + check_plan(plan)


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
# The checking front
# ------------------------------------------------------------------------------------------------------------


def captured_call_for(calls: Sequence[CallRecord], batch_size: int) -> tuple:
    """``(calls, padded)``: the captured calls a replay with ``batch_size`` real rows runs.

    The captured calls of exactly that batch size; else those of the smallest captured size above it
    (``padded`` True): sglang's and vLLM's graph runners replay the smallest captured graph that holds the batch
    and fill the rest with padding rows (``gpu_impl.backend.cuda_graph_batch_size``; vLLM's
    ``cudagraph_capture_sizes``). ``([], False)`` when no captured call is that large.
    """
    exact = [c for c in calls if c.batch_size == batch_size]
    if exact:
        return exact, False
    larger = [c.batch_size for c in calls if c.batch_size > batch_size]
    if not larger:
        return [], False
    b = min(larger)
    return [c for c in calls if c.batch_size == b], True


def graph_replay_check(pre: PrecomputeRecord, call: CallRecord) -> list[Violation]:
    """:func:`quick_check` of a recompute written into a captured graph's metadata buffer, as the replay uses it.

    At a replay no host code runs: FA3's shape check does not fire, so a metadata size other than the captured
    call's (a padded batch whose ``round_up(b, 4)`` differs) is a silent layout mismatch, reported as SHAPE
    with that message; and the captured call's padding rows (batches ``b_p .. b_c - 1``) read slots this
    precompute did not write -- what they hold is the buffer's tail (zeroed by vLLM, the previous recompute's in
    sglang), which only a deep check reads, so that BATCH_PERMUTATION verdict is left to it. Everything else
    (SPLIT_BOUND against the captured S_c, QUERY_COVER) is checked for the real rows.
    """
    out = []
    for v in quick_check(pre, call):
        if v.invariant == "SHAPE":
            v = Violation("SHAPE", None, dict(v.detail, replay=True),
                          f"the recompute wrote {v.detail.get('produced')} int32 values (metadata of {pre.batch_size} "
                          f"sequences) into the buffer of a graph captured for {call.batch_size}, which reads "
                          f"{v.detail.get('expected')}: at a replay FA3 checks nothing, so the captured kernel reads "
                          f"the vectors at the captured layout's offsets (a silent layout mismatch)")
        elif v.invariant == "BATCH_PERMUTATION" and call.batch_size > pre.batch_size:
            continue
        out.append(v)
    return out


class MetadataMismatch(RuntimeError):
    """A call was given scheduler metadata that does not match its own inputs.

    Attributes: ``violations`` (spec ``Violation`` list, the first one named in the message), ``precompute``
    (PrecomputeRecord or None), ``call`` (CallRecord; None for UNCHECKED_CALL, a call that could not be recorded),
    ``case_path`` (set by a sanitizer that wrote a case).
    """

    def __init__(self, violations: Sequence[Violation], precompute: Optional[PrecomputeRecord], call: CallRecord,
                 case_path: Optional[str] = None):
        self.violations = list(violations)
        self.precompute = precompute
        self.call = call
        self.case_path = case_path
        first = self.violations[0]
        batch = "" if first.batch is None else f" (batch {first.batch})"
        msg = f"{first.invariant}{batch}: {first.message}"
        if call is not None:
            summary = pair_summary(precompute, call)
            msg += (f"\n  precompute: {summary['precompute']}\n  call: {summary['call']}"
                    f"\n  S_p={summary['s_p']} S_c={summary['s_c']}")
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


def _cuda_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA)."""
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # a CPU build's dummy CUDA bindings raise
        return False


class CheckingFA3:
    """FA3's entry points that record, check and delegate to ``impl`` (any object with FA3's two methods).

    Every metadata tensor ``get_scheduler_metadata`` returns is remembered (weakly) with its PrecomputeRecord;
    :meth:`note_copy` follows it into persistent buffers. Every call passing ``scheduler_metadata`` is checked
    (:func:`quick_check`; ``deep=True`` also runs :func:`deep_check` on a host copy, a device sync, skipped
    while a CUDA graph is being captured). A tensor of unknown origin is a METADATA_ORIGIN violation.
    On violations: ``on_violation(event)`` is called (a str it returns is taken as the path of a case file
    written for it), then mode "raise" raises :class:`MetadataMismatch` without running the call, "warn" warns
    once per :func:`violation_signature` and runs it, "record" only records. ``events`` holds
    ``(PrecomputeRecord | None, CallRecord, violations)`` for every checked call (all calls with
    ``record_all=True``), at most ``max_events`` (oldest dropped). ``impl_signature`` ("fa3" for a
    gpu_impl kernel adapter, found automatically): the precompute naming ``impl`` takes, so a caller using
    sgl_kernel's names can be served by an FA3-named implementation.

    CUDA graphs: under capture (``capturing()``, by default ``torch.cuda.is_current_stream_capturing``) the
    Python wrapper runs once; the captured call is remembered by its metadata buffer's address. A later
    recompute written into that buffer (:meth:`note_copy`, outside capture) is checked against every captured
    call on that buffer with the recompute's batch size -- the replay will run that call with this metadata.
    """

    def __init__(self, impl=None, mode: str = "raise", deep: bool = False, on_violation: Optional[Callable] = None,
                 num_sm: Optional[int] = None, arch: Optional[int] = None, record_all: bool = False,
                 max_events: Optional[int] = None, signature: Optional[str] = None,
                 impl_signature: Optional[str] = None, capturing: Optional[Callable[[], bool]] = None,
                 build: str = UPSTREAM):
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
        self.impl = impl
        self.mode = mode
        #: the FA3 build whose rules judge every record (refmodel.fa3_builds)
        self.build = check_build_name(build)
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
        self.capturing = capturing if capturing is not None else (
            _cuda_capturing if torch.cuda.is_available() else (lambda: False))
        self.registry = MetadataRegistry()
        self.events: list = []
        self.checked_calls = 0
        self.graph_checks = 0
        self.graph_unmatched = 0        # recomputes into a graph buffer that no captured call can replay
        self.graph_padded = 0           # recomputes checked against a larger (padded) captured call
        #: metadata buffer address -> calls captured into a CUDA graph reading it
        self.captured: dict = {}
        self._warned: set = set()
        self._calls: dict = {}          # call_key -> CallRecord
        self.unrecordable: list = []    # (function, error type, message) of calls the recorder could not bind
        self._memo: dict = {}           # (id(pre), id(call)) -> (pre, call, quick violations)
        self.violation_path = "eager"   # see _handle

    # -- bookkeeping --------------------------------------------------------------------------------------
    def note_copy(self, dst, src) -> None:
        """Tell the checker ``dst.copy_(src)`` happened (a persistent CUDA-graph metadata buffer).

        Outside capture, a recompute written into a buffer a captured call reads is checked against that call.
        """
        pre = self.registry.lookup(src)
        self.registry.remember(dst, pre)
        if pre is None or not self.captured:
            return
        key = tensor_address(dst)
        calls = self.captured.get(key)
        if not calls or self.capturing():
            return
        matched, padded = captured_call_for(calls, pre.batch_size)
        if not matched:
            self.graph_unmatched += 1   # no captured graph holds this batch: nothing replays it
        for call in matched:
            self.graph_checks += 1
            if padded:
                self.graph_padded += 1
            violations = graph_replay_check(pre, call)
            self._event(pre, call, violations)
            if violations:
                self._handle(pre, call, violations, where="CUDA-graph replay")

    def origin_of(self, metadata) -> Optional[PrecomputeRecord]:
        return self.registry.lookup(metadata)

    def _event(self, pre, call, violations) -> None:
        self.events.append((pre, call, violations))
        if self.max_events is not None and len(self.events) > self.max_events:
            del self.events[: len(self.events) - self.max_events]

    def violations(self) -> list:
        """Every (precompute, call, violations) event with at least one violation."""
        return [e for e in self.events if e[2]]

    # -- checked delegation (the sanitizer wraps module functions with these) ------------------------------
    def checked_precompute(self, fn: Callable, args: tuple, kwargs: dict, impl_signature: Optional[str] = None,
                           names: Optional[Sequence[str]] = None):
        """Record ``get_scheduler_metadata(*args, **kwargs)``, run ``fn``, remember the tensor it returns.

        ``names``: ``fn``'s own positional parameter names (a wrapper reads them from its signature), so
        positional arguments bind by the implementation's order. A call the recorder cannot bind is run
        unrecorded with one warning; the metadata it returns is then of unknown origin, which the consuming
        call reports (METADATA_ORIGIN).
        """
        if names is not None and args:
            kwargs, args = {**dict(zip(names, args)), **kwargs}, ()
        try:
            sig, bound = bind_precompute(*args, signature=self.signature, **kwargs)
            pre = record_bound_precompute(sig, bound, num_sm=self.num_sm, arch=self.arch,
                                          read_tensors=True if (self.deep and not self.capturing()) else None,
                                          build=self.build)
        except (TypeError, ValueError) as exc:
            self._unrecordable("get_scheduler_metadata", exc)
            return fn(*args, **kwargs)
        if impl_signature is None or impl_signature == sig:
            md = fn(*args, **kwargs)
        else:
            md = fn(**translate_precompute(bound, sig, impl_signature))
        self.registry.remember(md, pre)
        return md

    def _unrecordable(self, what: str, exc: Exception) -> None:
        key = (what, type(exc).__name__, str(exc))
        self.unrecordable.append(key)
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"fa3verify: could not record this {what} call ({exc}); it runs unchecked", RuntimeWarning,
                          stacklevel=4)

    def checked_call(self, fn: Callable, args: tuple, kwargs: dict, varlen: bool = False,
                     names: Optional[Sequence[str]] = None):
        """Record and check one ``flash_attn_with_kvcache`` (``varlen``: ``flash_attn_varlen_func``), then run ``fn``.

        ``names`` as for :meth:`checked_precompute`. A call passing metadata that the recorder cannot bind is a
        violation (UNCHECKED_CALL: nothing says its metadata matches); without metadata it just runs.
        """
        capturing = self.capturing()
        deep = self.deep and not capturing
        call_args, call_kwargs = args, kwargs
        if names is not None and args:
            kwargs, args = {**dict(zip(names, args)), **kwargs}, ()
        try:
            call, md, record = self._record_call(args, kwargs, varlen, deep)
        except (TypeError, ValueError) as exc:
            md = kwargs.get("scheduler_metadata")
            if md is not None:
                self._unchecked(varlen, exc)
            return fn(*call_args, **call_kwargs)
        if md is not None and capturing:
            key = tensor_address(md)
            if key is not None:
                self.captured.setdefault(key, []).append(call)
        # a failing call is re-recorded with its host lengths (one sync, only then) so the report can replay it
        self._check(call, md, deep, reread=None if capturing else (lambda: record(True)))
        return fn(*call_args, **call_kwargs)

    def _record_call(self, args, kwargs, varlen: bool, deep: bool) -> tuple:
        if varlen:
            md = kwargs.get("scheduler_metadata")

            def record(read):
                return record_varlen_call(*args, num_sm=self.num_sm, arch=self.arch, read_tensors=read,
                                          build=self.build, **kwargs)
            return record(deep and md is not None), md, record
        bound = bind_call(*args, **kwargs) if args else None    # keyword-only calls skip the binding
        named = bound if bound is not None else kwargs
        md = named.get("scheduler_metadata")

        def record(read):
            full = bound if bound is not None else bind_call(**kwargs)
            return record_bound_call(full, num_sm=self.num_sm, arch=self.arch, read_tensors=read, build=self.build)
        if deep and md is not None:
            return record(True), md, record
        # the same layer call, again: one record per distinct shape key (no tensor values are read)
        key = call_key(named)
        call = self._calls.get(key) if key is not None else None
        if call is None:
            call = record(False)
            if key is not None:
                if len(self._calls) > 4096:
                    self._calls.clear()
                self._calls[key] = call
        return call, md, record

    def _unchecked(self, varlen: bool, exc: Exception) -> None:
        """A call passing metadata that cannot be recorded: reported through the mode like any violation."""
        self._unrecordable("flash_attn_varlen_func" if varlen else "flash_attn_with_kvcache", exc)
        v = Violation("UNCHECKED_CALL", None, {"error": f"{type(exc).__name__}: {exc}"},
                      f"a call passing scheduler_metadata could not be recorded ({exc}); it was not checked")
        if self.mode == "raise":
            raise MetadataMismatch([v], None, None)

    # -- the entry points ---------------------------------------------------------------------------------
    def get_scheduler_metadata(self, *args, **kwargs):
        return self.checked_precompute(self.impl.get_scheduler_metadata, args, kwargs, self.impl_signature)

    def flash_attn_with_kvcache(self, *args, **kwargs):
        return self.checked_call(self.impl.flash_attn_with_kvcache, args, kwargs)

    def flash_attn_varlen_func(self, *args, **kwargs):
        return self.checked_call(self.impl.flash_attn_varlen_func, args, kwargs, varlen=True)

    def __getattr__(self, name):
        # Other FA3 functions (flash_attn_combine, ...) pass through unchecked.
        if name == "impl" or self.__dict__.get("impl") is None:
            raise AttributeError(name)
        return getattr(self.impl, name)

    def check(self, call: CallRecord, metadata, deep: Optional[bool] = None) -> tuple:
        """Check one recorded call against the recorded origin of ``metadata``: ``(precompute, violations)``."""
        deep = self.deep if deep is None else deep
        pre = self.registry.lookup(metadata) if metadata is not None else None
        memo = self._memo.get((id(pre), id(call)))
        if memo is not None and memo[0] is pre and memo[1] is call:
            violations = memo[2]            # every layer of a step: same precompute, same call record
        else:
            violations = quick_check(pre, call)
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[(id(pre), id(call))] = (pre, call, violations)
        if not deep or metadata is None or any(v.invariant == "SHAPE" for v in violations):
            return pre, violations
        # deep: the exact verdict replaces the sufficient-condition one; the batch-size finding stays
        # (on a real tensor, unwritten slots hold garbage the exact check may not recognise)
        exact = deep_check(pre, call, metadata.detach().to("cpu") if isinstance(metadata, torch.Tensor) else metadata)
        names = {v.invariant for v in exact}
        exact += [v for v in violations if v.invariant == "BATCH_PERMUTATION" and v.invariant not in names]
        return pre, exact

    def _check(self, call: CallRecord, md, deep: Optional[bool] = None, reread: Optional[Callable] = None) -> None:
        if md is None:
            if self.record_all:
                self._event(None, call, [])
            return
        self.checked_calls += 1
        pre, violations = self.check(call, md, deep)
        if violations and reread is not None and not call.lengths_known():
            call = reread()
        self._event(pre, call, violations)
        if violations:
            self._handle(pre, call, violations)

    def report(self, pre, call, violations, where: str = "call") -> None:
        """Record and handle violations found outside a call (gpu_impl.lifecycle_checks: before a graph replay)."""
        self._event(pre, call, violations)
        if violations:
            self._handle(pre, call, violations, where=where)

    def _handle(self, pre, call, violations, where: str = "call") -> None:
        case_path = None
        #: the path of the violation being handled, for ``on_violation``: a CUDA graph's "replay" (a recompute
        #: copied into a captured call's buffer), its "capture", or an "eager" call
        self.violation_path = "replay" if where == "CUDA-graph replay" else (
            "capture" if self.capturing() else "eager")
        if self.on_violation is not None:
            returned = self.on_violation((pre, call, violations))
            case_path = returned if isinstance(returned, str) else None
        if self.mode == "raise":
            raise MetadataMismatch(violations, pre, call, case_path=case_path)
        if self.mode == "warn":
            key = violation_signature(pre, call, violations)
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn(str(MetadataMismatch(violations, pre, call, case_path=case_path)), RuntimeWarning,
                              stacklevel=4)
