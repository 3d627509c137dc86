"""The cause of a metadata mismatch: which FA3 arguments a precompute used differently from the call consuming its
metadata, and the worst that metadata built with those arguments can do to that call (used by fa3_calls).

Invariant (one sentence): a precompute whose resolved inputs (refmodel ``precompute_inputs``) differ from the
call's (refmodel ``call_inputs``) in anything the metadata depends on -- batch size, query length, head counts,
head dims, element size, page size, resolved causal/local masking, softcap, ``num_splits``, ``pack_gqa``,
``sm_margin``, varlen q, leftpad, appended KV, or a ``max_seqlen_k`` past the call's KV extent -- gives one
PRECOMPUTE_ARGUMENTS violation, whether or not this call's lengths overflow.

``max_seqlen_k`` below the call's KV extent (``page_table.size(1) * page_size``) is not a difference: sglang and
vLLM pass the batch's longest sequence, which the call's page table holds by construction (docs/sanitize.md);
when it changes a resolved decision (a window that covers ``max_seqlen_k`` but not the call's extent: local on
one side only) the masking comparison reports it. A CUDA-graph replay (``replay=True``) reads a recompute of
fewer real rows than the captured batch by design (the padding rows): that batch difference is left to the
graph's own checks (``gpu_impl.fa3_calls.graph_replay_check``).

The consequence is computed with refmodel's formulas only (``resolve_schedule``, ``num_splits_over_lengths``,
``combine_capacity``): for this metadata, its S_p (the most splits the prepare step gives any sequence, for any
lengths) against the call's S_c; and for the same arguments at other lengths, the shortest longest-sequence
length L (scanned every :data:`SCAN_STEP` tokens up to :data:`SCAN_MAX_TOKENS`, or the call's extent if larger)
at which a precompute given ``max_seqlen_k = L`` and a call whose page table is L rounded up to a page give
``S_p(L) > S_c(L) > 1`` -- the next skewed batch that overflows.
"""

from __future__ import annotations

import functools
from typing import Optional

from refmodel.fa3_scheduler import (PREPARE_MAX_BATCH_ONE_CTA, ScheduleInputs, combine_capacity,
                                    num_splits_over_lengths, with_inputs)
from spec.violation import Violation

from .fa3_records import CallRecord, PrecomputeRecord, call_schedule_of, precompute_schedule

__all__ = ["ARGUMENTS_INVARIANT", "SCAN_STEP", "SCAN_MAX_TOKENS", "argument_differences", "worst_case",
           "argument_check", "forget_worst_cases"]

ARGUMENTS_INVARIANT = "PRECOMPUTE_ARGUMENTS"
#: the longest-sequence lengths the consequence scan tries: every SCAN_STEP tokens up to SCAN_MAX_TOKENS (or the
#: call's KV extent when it is larger); 16 divides every kBlockN of sm90 (64..192) and every page size sglang uses
SCAN_STEP = 16
SCAN_MAX_TOKENS = 131072

#: (name in the report, ScheduleInputs field, the precompute's argument, the call's source of it)
_COMPARED = (
    ("batch_size", "batch_size", "batch_size", "q.size(0), or len(cu_seqlens_q) - 1"),
    ("max_seqlen_q", "seqlen_q", "max_seqlen_q", "q.size(1), or max_seqlen_q"),
    ("num_heads", "num_heads", "num_heads / num_heads_q", "q.size(-2)"),
    ("num_heads_k", "num_heads_k", "num_heads_k / num_heads_kv", "k_cache.size(-2)"),
    ("headdim", "headdim", "headdim", "q.size(-1)"),
    ("headdim_v", "headdim_v", "headdim_v", "v_cache.size(-1)"),
    ("element_size", "element_size", "qkv_dtype", "q.dtype"),
    ("page_size", "page_size", "page_size", "k_cache.size(1) with a page_table"),
    ("has_softcap", "has_softcap", "has_softcap", "softcap > 0"),
    ("num_splits", "num_splits", "num_splits", "num_splits"),
    ("pack_gqa", "pack_gqa", "pack_gqa", "pack_gqa"),
    ("num_sm", "num_sm", "sm_margin (and the device's SM count)", "sm_margin (and the device's SM count)"),
    ("varlen_q", "varlen_q", "cu_seqlens_q given", "cu_seqlens_q given"),
    ("has_leftpad", "has_leftpad", "leftpad_k / cache_leftpad given", "cache_leftpad given"),
    ("seqlen_knew", "seqlen_knew", "max_seqlen_k_new", "k.size(1)"),
    ("attention_chunk", "attention_chunk", "attention_chunk", "attention_chunk"),
)


def _shown(pre: PrecomputeRecord, call: CallRecord, name: str, p, c) -> tuple:
    """The two sides' values as the user passed them (dtype names rather than element sizes)."""
    if name == "element_size":
        return f"{pre.qkv_dtype} ({p} B)", f"{call.dtype} ({c} B)"
    return p, c


def argument_differences(pre: PrecomputeRecord, call: CallRecord, replay: bool = False) -> list[dict]:
    """The arguments the metadata depends on that the precompute passed differently from the call:
    ``[{"argument", "precompute", "call", "precompute_argument", "call_argument"}]``, in FA3's argument order
    (empty: the precompute used the call's own arguments)."""
    P, C = precompute_schedule(pre), call_schedule_of(call)
    pi, ci = P.inputs, C.inputs
    out = []
    for name, field, pre_arg, call_arg in _COMPARED:
        p, c = getattr(pi, field), getattr(ci, field)
        if p == c:
            continue
        if name == "batch_size" and replay and p < c:
            continue                    # a padded CUDA-graph replay: the captured call's padding rows
        if name == "seqlen_knew" and not ci.appends_kv and not pi.appends_kv:
            continue
        shown_p, shown_c = _shown(pre, call, name, p, c)
        out.append({"argument": name, "precompute": shown_p, "call": shown_c, "precompute_argument": pre_arg,
                    "call_argument": call_arg})
    if pi.seqlen_k > ci.seqlen_k:
        out.append({"argument": "max_seqlen_k", "precompute": pi.seqlen_k, "call": ci.seqlen_k,
                    "precompute_argument": "max_seqlen_k",
                    "call_argument": "seqlen_k (page_table.size(1) * page_size, or k_cache.size(1))"})
    pm, cm = P.masking, C.masking
    if (pm.is_causal, pm.is_local) != (cm.is_causal, cm.is_local) or (
            pm.is_local and (pm.window_left, pm.window_right) != (cm.window_left, cm.window_right)):
        def label(m):
            return "local" + f" ({m.window_left}, {m.window_right})" if m.is_local else (
                "causal" if m.is_causal else "not causal")
        out.append({"argument": "causal/window_size",
                    "precompute": f"causal={pre.causal}, window_size={tuple(pre.window_size)}, max_seqlen_k="
                                  f"{pre.max_seqlen_k}: {label(pm)}",
                    "call": f"causal={call.causal}, window_size={tuple(call.window_size)}, seqlen_k="
                            f"{call.seqlen_k}: {label(cm)}",
                    "precompute_argument": "causal, window_size (resolved with max_seqlen_k)",
                    "call_argument": "causal, window_size (resolved with seqlen_k)"})
    return out


@functools.lru_cache(maxsize=1024)
def _first_overflow(pre_inputs: ScheduleInputs, call_inputs_: ScheduleInputs, page: Optional[int],
                    upto: int) -> Optional[tuple]:
    """``(L, S_p(L), S_c(L))`` for the shortest scanned L with S_p(L) > S_c(L) > 1, else None (lengths zeroed in
    the key, so every step of one layer shares the scan)."""
    lengths = list(range(SCAN_STEP, upto + 1, SCAN_STEP))
    if not lengths:
        return None
    s_p = num_splits_over_lengths(pre_inputs, lengths)
    extents = [L if not page else -(-L // page) * page for L in lengths]
    s_c = num_splits_over_lengths(call_inputs_, extents)
    if pre_inputs.batch_size > PREPARE_MAX_BATCH_ONE_CTA:
        return None                     # the prepare step gives every sequence one split
    for L, a, b in zip(lengths, s_p, s_c):
        if b > 1 and a > b:
            return L, a, b
    return None


def forget_worst_cases() -> None:
    """Empty the cache of the consequence scan (the overhead measurement times a first scan with it)."""
    _first_overflow.cache_clear()


def worst_case(pre: PrecomputeRecord, call: CallRecord) -> dict:
    """The worst the metadata can do to this call, and the same arguments at other lengths (refmodel's formulas).

    ``s_p``: the most splits this metadata gives any sequence (the prepare step clamps each to it; 1 past 992
    sequences); ``s_c``, ``k_max``: the call's partial buffers and what its combine reads; ``overflows`` whether
    a sequence can be given more splits than S_c by this metadata; ``first_overflow``: ``{"longest", "s_p",
    "s_c"}`` for the shortest longest-sequence length at which the same arguments overflow, or None up to
    ``scanned_to`` tokens."""
    P, C = precompute_schedule(pre), call_schedule_of(call)
    s_p = 1 if pre.batch_size > PREPARE_MAX_BATCH_ONE_CTA else P.num_splits
    s_c = C.num_splits
    upto = max(SCAN_MAX_TOKENS, call.seqlen_k)
    first = _first_overflow(with_inputs(P.inputs, seqlen_k=0), with_inputs(C.inputs, seqlen_k=0), call.page_size,
                            upto) if C.inputs.uses_prepare else None
    return {"s_p": s_p, "s_c": s_c, "k_max": combine_capacity(s_c, C.inputs.headdim_v),
            "overflows": s_c > 1 and s_p > s_c,
            "first_overflow": None if first is None else {"longest": first[0], "s_p": first[1], "s_c": first[2]},
            "scanned_to": upto}


def _consequence(w: dict) -> str:
    here = (f"this metadata gives a sequence up to S_p={w['s_p']} splits and the call's partial buffers hold "
            f"S_c={w['s_c']} (combine reads kMax={w['k_max']})")
    if w["overflows"]:
        here += f": splits {w['s_c']}..{w['s_p'] - 1} of a long enough sequence are written and read out of bounds"
    else:
        here += ": no sequence overflows on this call"
    first = w["first_overflow"]
    if first is None:
        later = (f"; with the same arguments no longest-sequence length up to {w['scanned_to']} tokens overflows "
                 f"(the metadata still schedules differently from the call)")
    else:
        later = (f"; with the same arguments a batch whose longest sequence has {first['longest']} tokens "
                 f"(max_seqlen_k and the page table that long) gets S_p={first['s_p']} > S_c={first['s_c']}: "
                 f"out of bounds")
    return here + later


def argument_check(pre: Optional[PrecomputeRecord], call: CallRecord, replay: bool = False) -> list[Violation]:
    """One PRECOMPUTE_ARGUMENTS violation when the precompute's arguments differ from the call's (the cause,
    reported whether or not this call overflows), with the worst case; [] otherwise, or without a precompute."""
    if pre is None or not call.metadata_passed:
        return []
    C = call_schedule_of(call)
    if C.metadata_size == 0 or not call.kernel_runs or not C.inputs.uses_prepare:
        return []   # FA3 reads no per-batch vector of this metadata (fa3_checks.quick_check's same rule)
    diffs = argument_differences(pre, call, replay=replay)
    if not diffs:
        return []
    w = worst_case(pre, call)
    listed = ", ".join(f"{d['argument']} {d['precompute']} vs {d['call']}" for d in diffs)
    return [Violation(ARGUMENTS_INVARIANT, None, {"differences": diffs, "worst_case": w},
                      f"the scheduler metadata was precomputed with FA3 arguments other than this call's "
                      f"(precompute vs call: {listed}); worst case: {_consequence(w)}")]
