"""Shrinking a failing fuzz case to a small one with the same violation signature.

Greedy and deterministic, over the case's structure: drop steps, drop batch rows, lower lengths (halving,
then stepping down), then simplify the configuration (no CUDA graph, page size 1, the H200's SM count, the
shortest context that still holds every sequence). A candidate is kept only when it still shows the same
signature; invalid candidates (a configuration sglang would reject; for a vLLM case, one outside the vLLM family's
domain, ``strategies.vllm.NOT_ASSUMED_BY_VLLM``) are skipped.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterator

from gpu_impl.config import is_valid_config

from .strategies import CONTEXT_LENGTHS, FuzzCase


def shrink_case(case: FuzzCase, still_fails: Callable[[FuzzCase], bool], budget_s: float = 4.0) -> FuzzCase:
    """The smallest case reachable by greedy simplification that still fails the same way."""
    from .strategies.vllm import NOT_ASSUMED_BY_VLLM

    deadline = time.perf_counter() + budget_s
    dropped = NOT_ASSUMED_BY_VLLM if case.vllm is not None else ()
    best = case
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for candidate in _candidates(best):
            if time.perf_counter() >= deadline:
                break
            if not is_valid_config(candidate.model, candidate.server, dropped):
                continue
            if still_fails(candidate):
                best = candidate
                improved = True
                break
    return best


def _candidates(case: FuzzCase) -> Iterator[FuzzCase]:
    steps = [dict(s) for s in case.steps]
    # 1. drop whole steps
    if len(steps) > 1:
        for i in range(len(steps)):
            yield _with_steps(case, steps[:i] + steps[i + 1:])
    # 2. drop rows of a batch (last first)
    for i, step in enumerate(steps):
        for j in reversed(range(len(step["seq_lens"]))):
            if len(step["seq_lens"]) > 1:
                yield _with_steps(case, _replace_step(steps, i, _drop_row(step, j)))
    # 3. lower lengths: halve, then minus one
    for i, step in enumerate(steps):
        for j, length in enumerate(step["seq_lens"]):
            for smaller in _smaller(length):
                yield _with_steps(case, _replace_step(steps, i, _set_len(step, j, smaller)))
    # 4. simplify the configuration
    server = case.server
    longest = max((x for s in steps for x in s["seq_lens"]), default=1)
    simpler = dict(cuda_graph=False, page_size=1, num_sm=132, dp_size=1 if not server.enable_dp_attention else
                   server.dp_size, context_length=next((c for c in CONTEXT_LENGTHS if c >= longest),
                                                       server.context_length))
    for field, value in simpler.items():
        if getattr(server, field) != value:
            yield dataclasses.replace(case, server=dataclasses.replace(server, **{field: value}))


def _smaller(length: int) -> list[int]:
    out = []
    if length > 1:
        out.append(max(1, length // 2))
    if length - 1 >= 1 and length - 1 not in out:
        out.append(length - 1)
    return out


def _with_steps(case: FuzzCase, steps: list) -> FuzzCase:
    return dataclasses.replace(case, steps=tuple(steps))


def _replace_step(steps: list, i: int, step: dict) -> list:
    return steps[:i] + [step] + steps[i + 1:]


def _drop_row(step: dict, j: int) -> dict:
    out = dict(step)
    out["seq_lens"] = step["seq_lens"][:j] + step["seq_lens"][j + 1:]
    if step.get("extend_lens") is not None:
        out["extend_lens"] = step["extend_lens"][:j] + step["extend_lens"][j + 1:]
    return out


def _set_len(step: dict, j: int, length: int) -> dict:
    out = dict(step)
    out["seq_lens"] = list(step["seq_lens"])
    out["seq_lens"][j] = length
    if step.get("extend_lens") is not None:
        out["extend_lens"] = list(step["extend_lens"])
        out["extend_lens"][j] = min(out["extend_lens"][j], length)
    return out
