"""Shrinking a failing fuzz case to a small one with the same violation signature.

Greedy and deterministic, over the case's structure: drop steps, drop batch rows, lower lengths (to half, then
by a quarter, an eighth, ... down to one token less), then simplify the configuration (no CUDA graph, page size
1, the H200's SM count, the shortest context that still holds every sequence). A candidate is kept only when it
still shows the same signature; the search goes on over the smaller case's candidates from the position of the
one kept, round to it, so it ends at a case none of whose candidates fails the same way; invalid candidates (a
configuration the modelled backend would reject; for a case carrying an engine's own options, one outside that
engine's domain: the assumptions its plugin does not require, ``EnginePlugin.assumptions_not_required``) are
skipped without being run.

Shrinking is bounded by **steps**, the candidates it runs (calls of ``still_fails``; a skipped invalid candidate
is not a step), so the same failing case shrinks to the same result on any machine, fast or slow. A time-boxed
run (``fuzz --budget-s``) also gives a ``deadline`` on a clock: no candidate is started that would end past it,
judged by the mean cost of the candidates run so far. :class:`Shrunk` says how shrinking ended: ``done`` (no
candidate of the result fails the same way), ``steps`` (the step bound was reached) or ``deadline``; the last two
are a partial shrink, the case still fails the same way and replays.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterator, Optional

from gpu_impl.config import is_valid_config

from .strategies import CONTEXT_LENGTHS, FuzzCase


def assumptions_not_required(options: dict) -> tuple:
    """spec's domain assumptions a case carrying engine-owned ``options`` need not meet: those the plugins owning
    them drop (``gpu_impl.plugin.EnginePlugin.assumptions_not_required``)."""
    from gpu_impl.plugin import options_plugin

    out: set = set()
    for key in options or {}:
        plugin = options_plugin(key)
        if plugin is not None:
            out.update(plugin.assumptions_not_required())
    return tuple(sorted(out))

__all__ = ["MAX_SHRINK_STEPS", "Shrunk", "shrink", "shrink_case"]

#: Candidates run per failing case at most, by default. Measured (docs/performance.md): every failure of
#: ``fuzz --cases 300`` with seeds 0..2 under the guards none and pre-fix and three seeded defects reaches its end
#: in at most 76 steps, and every catching case of the bug catalogue in at most 276 (the time-boxed shrinker
#: needed up to 8,061 steps, 3 to 4.5 s, for the same results). A step costs 0.1 to 1.5 ms on the model and 20
#: to 60 ms on a real engine; a time budget also bounds shrinking by its deadline.
MAX_SHRINK_STEPS = 1000


@dataclasses.dataclass(frozen=True)
class Shrunk:
    """A shrinking's result: the smallest case reached, the steps run, and why it ended.

    ``ended``: "done" (a local minimum: no candidate of ``case`` fails the same way), "steps" (the step bound was
    reached) or "deadline" (the time box ended), ``partial`` for these two; "unsupported" for a case shrinking
    does not handle (``fa3verify.campaign.shrink_failure``: a kernel-level call, returned as it is).
    """

    case: Any
    steps: int
    ended: str

    @property
    def partial(self) -> bool:
        return self.ended in ("steps", "deadline")


def shrink(case: FuzzCase, still_fails: Callable[[FuzzCase], bool], max_steps: int = MAX_SHRINK_STEPS,
           deadline: Optional[float] = None, clock: Optional[Callable[[], float]] = None,
           step_cost: float = 0.0) -> Shrunk:
    """Shrink ``case`` greedily while ``still_fails`` holds, running at most ``max_steps`` candidates.

    ``deadline`` (a value of ``clock``, default ``time.perf_counter``) ends shrinking early: a candidate is run only
    when the clock plus the expected cost of one candidate (the mean so far; ``step_cost`` before the first) is
    before it. Without a deadline the result depends on ``case`` and ``still_fails`` alone.
    """
    if max_steps < 0:
        raise ValueError(f"max_steps: expected an integer >= 0, got {max_steps!r}")
    now = clock or (lambda: time.perf_counter())  # looked up at each call: a test may slow the clock
    dropped = assumptions_not_required(case.options)
    best, steps, spent, at = case, 0, 0.0, 0
    while True:
        candidates = list(_candidates(best))
        # From where the last kept candidate stood (the same kind of move, which often works again), around to
        # it: a whole round without a kept candidate is a local minimum.
        for k in range(len(candidates)):
            index = (at + k) % len(candidates)
            candidate = candidates[index]
            if not is_valid_config(candidate.model, candidate.server, dropped):
                continue
            if steps >= max_steps:
                return Shrunk(best, steps, "steps")
            started = now() if deadline is not None else 0.0
            if deadline is not None and started + (spent / steps if steps else step_cost) >= deadline:
                return Shrunk(best, steps, "deadline")
            steps += 1
            fails = still_fails(candidate)
            if deadline is not None:
                spent += now() - started
            if fails:
                best, at = candidate, index
                break
        else:
            return Shrunk(best, steps, "done")


def shrink_case(case: FuzzCase, still_fails: Callable[[FuzzCase], bool], max_steps: int = MAX_SHRINK_STEPS,
                deadline: Optional[float] = None, clock: Optional[Callable[[], float]] = None) -> FuzzCase:
    """The smallest case reachable by greedy simplification that still fails the same way (:func:`shrink`)."""
    return shrink(case, still_fails, max_steps, deadline, clock).case


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
    # 3. lower lengths: halve, then by a quarter, an eighth, ..., one
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
    """Lower lengths to try, largest cut first: half the length, then a quarter less, an eighth less, ..., one
    less (a length that must stay near its value is found in about log2(length) steps, not one token at a
    time)."""
    out: list[int] = []
    if length > 1:
        out.append(max(1, length // 2))
    cut = length // 4
    while cut >= 1:
        if length - cut not in out:
            out.append(length - cut)
        cut //= 2
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
