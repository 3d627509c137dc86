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
  ``spec.invariants.check_all`` over the per-batch vectors (both in :mod:`gpu_impl.fa3_checks`, re-exported).
* :func:`argument_check`: the cause, a precompute whose arguments differ from the call's, with the worst case
  (:mod:`gpu_impl.fa3_arguments`; :class:`CheckingFA3` runs it with ``report_causes=True``, as the sanitizer does).
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

import warnings
from typing import Callable, Optional, Sequence

import torch

from refmodel.fa3_builds import UPSTREAM, check_build_name
from spec.violation import Violation

from .fa3_arguments import ARGUMENTS_INVARIANT, argument_check, argument_differences, worst_case
from .fa3_checks import (captured_call_for, deep_check, graph_replay_check, padded_replay_read, pair_summary,
                         quick_check, violation_signature)
from .fa3_records import (CALL_SIGNATURE, DEFAULT_ARCH, DEFAULT_NUM_SM, PRECOMPUTE_SIGNATURES, VARLEN_POSITIONAL,
                          CallRecord, PrecomputeRecord, bind_call, bind_precompute, call_key, call_schedule_of,
                          precompute_schedule, record_bound_call, record_bound_precompute, record_call,
                          record_precompute, record_varlen_call, translate_precompute)
from .fa3_registry import MetadataRegistry, tensor_address
from .kernels.base import KernelAdapter

__all__ = [
    "PrecomputeRecord", "CallRecord", "record_precompute", "record_call", "record_varlen_call", "bind_call",
    "record_bound_call", "bind_precompute", "record_bound_precompute", "translate_precompute",
    "quick_check", "deep_check", "pair_summary", "CheckingFA3", "MetadataMismatch", "MetadataRegistry",
    "precompute_schedule", "call_schedule_of", "violation_signature", "captured_call_for", "graph_replay_check", "DEFAULT_NUM_SM", "DEFAULT_ARCH",
    "PRECOMPUTE_SIGNATURES", "CALL_SIGNATURE", "VARLEN_POSITIONAL", "ARGUMENTS_INVARIANT", "argument_check",
    "argument_differences", "worst_case",
]


# ------------------------------------------------------------------------------------------------------------
# The checking front
# ------------------------------------------------------------------------------------------------------------


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
        cause = next((v for v in self.violations[1:] if v.invariant == ARGUMENTS_INVARIANT), None)
        if cause is not None:
            msg += f"\n  cause: {cause.message}"
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
    While ``replaying`` (set by an engine driver re-issuing a captured graph's calls), a deep check of a call whose
    tensor has its own size but whose precompute wrote fewer int32 judges the slots past the write by the build's
    empty-row rule (:func:`gpu_impl.fa3_checks.padded_replay_read`) where that rule applies, instead of SHAPE.
    """

    def __init__(self, impl=None, mode: str = "raise", deep: bool = False, on_violation: Optional[Callable] = None,
                 num_sm: Optional[int] = None, arch: Optional[int] = None, record_all: bool = False,
                 max_events: Optional[int] = None, signature: Optional[str] = None,
                 impl_signature: Optional[str] = None, capturing: Optional[Callable[[], bool]] = None,
                 build: str = UPSTREAM, report_causes: bool = False):
        if mode not in MODES:
            raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
        self.impl = impl
        self.mode = mode
        #: the FA3 build whose rules judge every record (refmodel.fa3_builds)
        self.build = check_build_name(build)
        self.deep = bool(deep)
        self.on_violation = on_violation
        #: with neither an implementation that knows its device nor num_sm/arch given, the device is read from the
        #: first FA3 tensor seen (:meth:`_settle_device`): a CUDA tensor's device, else the defaults, said so
        self._device_pending = impl is None and (num_sm is None or arch is None)
        if self._device_pending:
            dev_sm, dev_arch = DEFAULT_NUM_SM, DEFAULT_ARCH
        else:
            dev_sm, dev_arch = _device_num_sm_arch(impl) if num_sm is None or arch is None else (num_sm, arch)
        self.num_sm = int(num_sm if num_sm is not None else dev_sm)
        self.arch = int(arch if arch is not None else dev_arch)
        self._given = (num_sm is not None, arch is not None)
        #: where num_sm came from: "given", "the implementation", "read from cuda:N (name)" or the default's reason
        self.num_sm_source = "given" if num_sm is not None else (
            "not read yet (from the first FA3 tensor's device)" if self._device_pending else "the implementation")
        self.record_all = record_all
        #: also report the cause (:func:`gpu_impl.fa3_arguments.argument_check`: a precompute whose arguments differ
        #: from the call's), whether or not the call overflows; the runtime sanitizer turns it on
        self.report_causes = bool(report_causes)
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
        #: set by a driver while a CUDA-graph replay re-issues captured calls: no host code runs, so a tensor of the
        #: call's size passes whatever its precompute's size (fa3_checks.padded_replay_read judges what is read)
        self.replaying = False

    # -- bookkeeping --------------------------------------------------------------------------------------
    def _settle_device(self, args: tuple, kwargs: dict) -> None:
        """Read num_sm/arch (those not given) from the device of the first tensor argument of the first FA3 call:
        ``torch.cuda.get_device_properties`` of a CUDA tensor's device; on the CPU the defaults (132, sm90)."""
        self._device_pending = False
        t = next((x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)), None)
        if t is not None and t.is_cuda:
            index = t.device.index if t.device.index is not None else torch.cuda.current_device()
            props = torch.cuda.get_device_properties(index)
            if not self._given[0]:
                self.num_sm = int(props.multi_processor_count)
                self.num_sm_source = f"read from cuda:{index} ({props.name})"
            if not self._given[1]:
                self.arch = int(props.major * 10 + props.minor)
        elif not self._given[0]:
            self.num_sm_source = (f"default {DEFAULT_NUM_SM} (an H100's or H200's): the FA3 tensors are not on a "
                                  f"CUDA device")

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
            if self.report_causes:
                violations = violations + argument_check(pre, call, replay=True)
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
        if self._device_pending:
            self._settle_device(args, kwargs)
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
        if self._device_pending:
            self._settle_device(args, kwargs)
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
            if self.report_causes:
                violations = violations + argument_check(pre, call)
            if len(self._memo) > 4096:
                self._memo.clear()
            self._memo[(id(pre), id(call))] = (pre, call, violations)
        if not deep or metadata is None:
            return pre, violations
        host = metadata.detach().to("cpu") if isinstance(metadata, torch.Tensor) else metadata
        past = None
        if any(v.invariant == "SHAPE" for v in violations):
            # a replay reading past its recompute's write: exact where the build's empty-row rule decides the slots
            past = padded_replay_read(pre, call, host) if self.replaying else None
            if past is None:
                return pre, violations
            violations = [v for v in violations if v.invariant != "SHAPE"]
        # deep: the exact verdict replaces the sufficient-condition one; the batch-size finding stays
        # (on a real tensor, unwritten slots hold garbage the exact check may not recognise)
        exact = deep_check(pre, call, host) + (past or [])
        names = {v.invariant for v in exact}
        exact += [v for v in violations if v.invariant in ("BATCH_PERMUTATION", ARGUMENTS_INVARIANT)
                  and v.invariant not in names]
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
