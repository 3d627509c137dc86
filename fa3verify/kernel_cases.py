"""Kernel-level cases: one FA3 call on the emulated kernel, checked against the float64 oracle.

A kernel-level case (schema ``fa3verify.case/1`` with a ``call`` instead of ``batches``, docs/case-format.md;
the older ``fa3verify.kernel-case/1`` is still read) is what the catalogue's kernel families generate
(``fa3verify.strategies.kernel_calls``): a combine, masking, heuristic or caller defect lives below the backend.
:class:`KernelCallSUT` is the system under test the campaign drives for them, behind the same ``observe``
interface as the scenario systems (``fa3verify.commands.fuzz.ScenarioTarget``). Seeded defects are applied from
outside: ``kernel``-layer switches through ``EmulatedKernel.with_defects``, ``caller``-layer switches by
:func:`seed_caller_defects` (the caller here is a serving engine's cascade attention; the catalogue names its file).

Outcomes: "shape_error" (FA3's loud check), "violation" (an out-of-bounds access, a crash -- NO_CRASH -- or a
numerics property: NO_NAN, MASKED_ROW_LSE, MATCHES_ORACLE), "clear_error" (a ValueError naming the argument, or
FA3's own rejection ``FA3_REJECTS_<FIELD>``: allowed), "pass".
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Iterable, Optional

from spec.finding import Outcome

from .campaign import Observation

__all__ = ["LEGACY_KERNEL_SCHEMA", "KernelCallSUT", "evaluate_kernel_case", "kernel_case", "load_kernel_case",
           "replay_kernel_case", "seed_caller_defects", "is_kernel_case", "judge_kernel_case", "verdict_terms"]

#: The schema kernel-level cases had before they joined ``fa3verify.case/1`` (still read).
LEGACY_KERNEL_SCHEMA = "fa3verify.kernel-case/1"
#: The outcomes a kernel-level case may expect.
OUTCOMES = (Outcome.VIOLATION, Outcome.PASS, Outcome.SHAPE_ERROR, Outcome.CLEAR_ERROR)


def seed_caller_defects(call: dict, defects: Iterable[str]) -> dict:
    """The call as a caller with ``defects`` issues it (``caller``-layer switches of gpu_impl.defects).

    ``cascade-prefix-metadata-batch-size``: the shared-prefix metadata is built for ``num_reqs`` batches instead
    of the one batch the prefix call runs as (the engine's PR #17283). Idempotent, so a case that already carries the
    defective metadata (``fa3verify.kernel-case/1``) replays the same.
    """
    from .strategies.kernel_calls import cascade_prefix_metadata

    call = dict(call)
    if "cascade-prefix-metadata-batch-size" in set(defects) and call.get("metadata") and call.get("num_reqs"):
        md = call["metadata"]
        call["metadata"] = cascade_prefix_metadata(md["max_seqlen_q"], md["max_seqlen_k"], int(call["num_reqs"]))
    return call


class KernelCallSUT:
    """The emulated FA3 kernel as a system under test for kernel-level calls, with seeded defects:
    ``observe(call) -> Observation`` (the campaign's target interface)."""

    def __init__(self, defects: Iterable[str] = (), source: str = "manual"):
        self.defects = tuple(sorted(defects))
        self.source = source

    def case(self, call: dict) -> dict:
        """The kernel-level case (a dict) that runs ``call`` with this system's defects."""
        return kernel_case(self.source, call, self.defects)

    def observe(self, call: dict) -> Observation:
        verdict = judge_kernel_case(self.case(call))
        outcome, invs, msgs = verdict_terms(verdict)
        return Observation(outcome, invs, msgs, list(verdict.findings))


def kernel_case(source: str, call: dict, defects: Iterable[str], outcome: str = Outcome.PASS,
                invariants: Iterable[str] = (), messages: Iterable[str] = (), notes: str = "",
                case_id: Optional[str] = None) -> dict:
    """A kernel-level case (schema ``fa3verify.case/1``, field ``call``) as a JSON-ready dict."""
    from spec.model.cases import SCHEMA

    invs = list(invariants)
    ident = case_id or (f"catalogue-{source.split(':', 1)[1]}" if source.startswith("catalogue:") else source)
    return {"schema": SCHEMA, "id": ident, "source": source, "defects": sorted(defects), "call": call,
            "kernel": {"name": "emulated", "mode": "strict"},
            "expected": {"outcome": outcome, "invariant": invs[0] if invs else None,
                         "detail": {"invariants": invs, "message": next(iter(messages), "")}},
            "notes": notes}


def is_kernel_case(data) -> bool:
    """True for a kernel-level case: the legacy schema, or ``fa3verify.case/1`` with a ``call``."""
    from spec.model.cases import SCHEMA

    return isinstance(data, dict) and (data.get("schema") == LEGACY_KERNEL_SCHEMA
                                       or (data.get("schema") == SCHEMA and "call" in data))


def load_kernel_case(path) -> dict:
    """Read a kernel-level case; ValueError names what is wrong."""
    from spec.model.kernel_cases import check_kernel_case

    data = json.loads(Path(path).read_text())
    if not is_kernel_case(data):
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: schema must be 'fa3verify.case/1' with a call (or {LEGACY_KERNEL_SCHEMA!r}), "
                         f"got {got!r}")
    for key in ("call", "expected", "defects"):
        if key not in data:
            raise ValueError(f"{path}: missing field {key!r}")
    if data["expected"].get("outcome") not in OUTCOMES:
        raise ValueError(f"{path}: expected.outcome must be violation, pass, shape_error or clear_error")
    check_kernel_case(data)
    return data


def replay_kernel_case(path, defects: Optional[Iterable[str]] = None) -> dict:
    """Replay a kernel-level case: {"outcome", "invariants", "messages", "still_fails", "expected"}.

    ``still_fails`` is True when the case fails the way the file says (same outcome, and the named invariant
    among those observed); for an expected "pass" it is False and ``matches`` says whether it passed.
    """
    kc = load_kernel_case(path)
    verdict = judge_kernel_case(kc, defects)
    outcome, invs, msgs = verdict_terms(verdict)
    exp = kc["expected"]
    matches = outcome == exp["outcome"] and (exp.get("invariant") is None or exp["invariant"] in invs)
    return {"outcome": outcome, "invariants": invs, "messages": msgs, "expected": exp, "matches": matches,
            "still_fails": matches and exp["outcome"] != Outcome.PASS, "verdict": verdict}


def _kernel_tensors(kc: dict):
    """Seeded q, k_cache, v_cache, cu_seqlens_q, cache_seqlens for a kernel-level case (non-paged cache)."""
    import torch

    call = kc["call"]
    gen = torch.Generator().manual_seed(int(call["seed"]))
    lq, lk = list(call["seqlens_q"]), list(call["seqlens_k"])
    h, hk = call["heads"]
    d, dv = call["head_dim"], call["head_dim_v"]
    b = len(lq)
    cap = int(call.get("capacity_k") or max(lk + [1]))
    total = sum(lq)
    if call.get("dense"):
        q = torch.randn(b, max(lq + [0]), h, d, generator=gen)
    else:
        q = torch.randn(total, h, d, generator=gen)
    if call.get("broadcast_kv"):
        # one random KV row per batch, broadcast over the cache without allocating it (millions of slots)
        k = torch.randn(b, 1, hk, d, generator=gen).bfloat16().expand(b, cap, hk, d)
        v = torch.randn(b, 1, hk, dv, generator=gen).bfloat16().expand(b, cap, hk, dv)
    else:
        k = torch.randn(b, cap, hk, d, generator=gen)
        v = torch.randn(b, cap, hk, dv, generator=gen)
    if call.get("logits") == "below-sentinel":
        # every raw logit q.k ~ -(a^2 d) = -6e4, below FlashInfer's -5e4 sentinel; values stay random
        u = torch.randn(d, generator=gen)
        u = u / u.norm()
        a = (6.0e4) ** 0.5
        q = a * u + 0.01 * q
        k = -a * u + 0.01 * k
    cu = torch.tensor([0] + [sum(lq[:i + 1]) for i in range(b)], dtype=torch.int32)
    cs = torch.tensor(lk, dtype=torch.int32)
    return q.bfloat16(), k if k.dtype == torch.bfloat16 else k.bfloat16(), \
        v if v.dtype == torch.bfloat16 else v.bfloat16(), cu, cs


def evaluate_kernel_case(kc: dict, defects: Optional[Iterable[str]] = None) -> tuple:
    """Run one kernel-level case: (outcome, invariants, messages), from :func:`judge_kernel_case`'s verdict.

    Outcomes (``spec.finding.Outcome``): SHAPE_ERROR (FA3's loud check), VIOLATION (an out-of-bounds access, a
    crash -- NO_CRASH -- or a numerics property: NO_NAN, MASKED_ROW_LSE, MATCHES_ORACLE), CLEAR_ERROR (a ValueError
    naming the argument, or FA3's own rejection ``FA3_REJECTS_<FIELD>``: allowed), PASS. ``defects`` default to
    the case's own.
    """
    return verdict_terms(judge_kernel_case(kc, defects))


def verdict_terms(verdict) -> tuple:
    """A kernel-level verdict as (outcome, invariants, messages): the findings' (or the refusal's named) invariants
    in the order found, and their messages."""
    shown = verdict.findings or verdict.refusals
    return verdict.outcome, [f.invariant for f in shown if f.invariant], [f.message for f in shown]


def judge_kernel_case(kc: dict, defects: Optional[Iterable[str]] = None):
    """Run one kernel-level case on the emulated kernel (its seeded defects applied from outside) and judge it
    (:func:`fa3verify.judge.judge_call`, the output against the oracle by ``gpu_impl.oracle_check.compare_call``):
    a :class:`fa3verify.judge.Verdict`."""
    from .campaign import single_threaded_torch

    with single_threaded_torch():
        return _judge_kernel_case(kc, defects)


def _judge_kernel_case(kc: dict, defects: Optional[Iterable[str]] = None):
    import numpy as np
    import torch

    from gpu_impl.defects import check_defects, defects_in_layer
    from gpu_impl.kernels import load
    from gpu_impl.oracle_check import compare_call
    from refmodel.attention import attention
    from refmodel.tolerance import reference_outputs

    from .judge import judge_call

    defects = check_defects(kc.get("defects", []) if defects is None else defects)
    kernel = load("emulated", mode=kc.get("kernel", {}).get("mode", "strict"))
    if defects_in_layer(defects, "kernel"):
        kernel = kernel.with_defects(defects_in_layer(defects, "kernel"))
    kc = {**kc, "call": seed_caller_defects(kc["call"], defects_in_layer(defects, "caller"))}
    call = kc["call"]
    q, k, v, cu, cs = _kernel_tensors(kc)
    dense = bool(call.get("dense"))
    kwargs = dict(causal=bool(call["causal"]), num_splits=int(call.get("num_splits", 0)))
    if not dense:
        kwargs.update(cache_seqlens=cs, cu_seqlens_q=cu, max_seqlen_q=int(call.get("max_seqlen_q", max(
            call["seqlens_q"] + [0]))))

    def run():
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            md = None
            if call.get("metadata"):
                m = dict(call["metadata"])
                md = kernel.get_scheduler_metadata(
                    m["batch_size"], m["max_seqlen_q"], m["max_seqlen_k"], call["heads"][0], call["heads"][1],
                    call["head_dim"], torch.tensor(m["cache_seqlens"], dtype=torch.int32),
                    headdim_v=call["head_dim_v"], cu_seqlens_q=torch.tensor(m["cu_seqlens_q"], dtype=torch.int32),
                    causal=bool(m.get("causal", call["causal"])), num_splits=int(m.get("num_splits", 0)))
            out, lse, *_ = kernel.flash_attn_with_kvcache(q, k, v, scheduler_metadata=md, return_softmax_lse=True,
                                                      **kwargs)
            return out, lse

    def check(returned) -> list:
        out, lse = returned
        ref_kwargs = {} if dense else dict(cache_seqlens=cs, cu_seqlens_q=cu, max_seqlen_q=kwargs["max_seqlen_q"])
        ref_out, ref_lse = attention(q.double(), k.double(), v.double(), causal=kwargs["causal"], **ref_kwargs)
        exact, lowp = reference_outputs(q, k, v, causal=kwargs["causal"], **ref_kwargs)
        return compare_call(out, lse, ref_out, ref_lse, exact, lowp)

    return judge_call(run, check)
