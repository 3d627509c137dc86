"""Fidelity of the call's acceptance checks: refmodel against upstream's compiled ``mha_fwd`` appended-KV checks.

Invariant: on every stored input, refmodel's call (``refmodel.fa3_scheduler.call_inputs`` -> ``resolve_schedule``,
whose ``refmodel.validation.check_call`` tests appended KV) accepts exactly what 0251105a's ``mha_fwd`` accepts and
rejects the rest with FA3's message: 0 mismatches.

The vectors (``fidelity_vectors/call_checks/upstream-0251105a.json``, with repo, commit and the source lines) were
generated once by ``scripts/gen_call_check_vectors.py``, which compiles the three ``TORCH_CHECK`` lines of
``mha_fwd``'s ``k_new`` block (flash_api.cpp 931-933) with g++; CI compares against them without the source.
Each vector: ``k_new`` (None, a dense row count, or "varlen": ``cu_seqlens_k_new``), whether ``seqused_k``
(``cache_seqlens``) and ``cu_seqlens_q`` are passed, ``seqlen_q``, the cache's ``seqlen_k``, and FA3's message or
None.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

VECTORS = Path(__file__).with_name("fidelity_vectors") / "call_checks" / "upstream-0251105a.json"

__all__ = ["VECTORS", "load_call_check_vectors", "model_decision", "call_check_mismatches"]


def load_call_check_vectors() -> dict:
    return json.loads(VECTORS.read_text())


def model_decision(v: dict) -> Optional[str]:
    """refmodel's answer for one vector: None (accepted) or the FA3 message it rejects with."""
    from refmodel.errors import FA3Rejected
    from refmodel.fa3_scheduler import call_inputs, resolve_schedule

    k_new = v["k_new"]
    inp = call_inputs(2, v["seqlen_q"], v["seqlen_k"], 8, 1, 128, varlen_q=v["cu_seqlens_q"],
                      has_cache_seqlens=v["seqused_k"], seqlen_knew=k_new if isinstance(k_new, int) else 0,
                      has_k_new=k_new is not None)
    try:
        resolve_schedule(inp)
    except FA3Rejected as exc:
        return exc.fa3_message
    return None


def call_check_mismatches(decide: Callable[[dict], Optional[str]] = model_decision) -> tuple[int, list]:
    """(vectors compared, mismatches) of ``decide`` (default: refmodel) against the stored C++ decisions."""
    vectors = load_call_check_vectors()["vectors"]
    bad = [{**v, "model": got} for v in vectors if (got := decide(v)) != v["rejected"]]
    return len(vectors), bad
