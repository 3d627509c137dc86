"""The strategy a campaign on a system under test draws from: that system's own domain (``gpu_impl.domain``).

Invariant: the configurations come from the system under test (``sut.domain()``: a suite family it names, or
configurations it draws and its own checks accept); the batches are the suite's (:mod:`.scenarios`' decode
steps), shaped for the path the domain drew the configuration for: a decode batch for the eager and CUDA-graph
paths, and for an idle DP-attention rank a batch with fewer rows than DP ranks (``gpu_impl.scenario
.distribute_over_dp`` leaves the last ranks without rows). The engine driver runs decode and idle steps only.
What each case reached goes back to the domain (the campaign's ``observe`` hook), which weights later draws.
"""

from __future__ import annotations

import random
from typing import Callable, Optional

from .scenarios import FuzzCase, decode_step

__all__ = ["domain_strategy", "DomainStrategy", "CheckedFamily", "domain_steps", "LONGEST_ROW"]

#: Cases a checked family draws for one campaign draw before giving up (as a release's own domain tries
#: configurations: its engine folder's ``server_args.json`` ``tries``).
TRIES = 8

#: Longest decode row drawn (a 128k context's graph page table costs nothing in record mode, but a long eager
#: row's table is written row by row).
LONGEST_ROW = 65536


def domain_steps(rng: random.Random, server, target: str) -> tuple:
    """One or two decode steps for ``target``; "dp-idle": the first has fewer rows than DP ranks."""
    cap = min(server.context_length, LONGEST_ROW)
    steps = []
    if target == "dp-idle":
        rows = rng.randint(1, max(1, server.attn_dp_size - 1))
        lens = [rng.randint(max(1, cap // 4), cap)] + [rng.randint(1, min(cap, 512)) for _ in range(rows - 1)]
        steps.append({"mode": "decode", "seq_lens": lens, "extend_lens": None})
    else:
        steps.append(decode_step(rng, cap, max_batch=16))
    if rng.random() < 0.3:
        steps.append(decode_step(rng, cap, max_batch=16))
    return tuple(steps)


class DomainStrategy:
    """``strategy(rng) -> FuzzCase | None`` over a domain that draws itself (None when every try was rejected:
    the campaign counts the draw); ``observe(case, observation)`` gives the domain what each case reached."""

    def __init__(self, domain):
        self.domain = domain
        self.cells: dict = {}

    def __call__(self, rng: random.Random) -> Optional[FuzzCase]:
        got = self.domain.draw_config(rng)
        if got is None:
            return None
        case = FuzzCase(server=got.server, model=got.model, steps=domain_steps(rng, got.server, got.target),
                        numerics=False, seed=rng.randrange(2 ** 31))
        self.cells[id(case)] = (case, got.cell)
        return case

    def observe(self, case, observation) -> None:
        kept = self.cells.pop(id(case), None)
        if kept is not None and kept[0] is case:
            self.domain.observe(kept[1], None if observation is None else set(observation.reached))


def domain_strategy(domain) -> Callable[[random.Random], Optional[FuzzCase]]:
    """The strategy over ``domain``: its family when it names one, else a :class:`DomainStrategy`."""
    if domain.family is not None:
        from . import family, random_fuzz_case

        base = random_fuzz_case if domain.family == "scenario" else family(domain.family)
        return base if domain.check is None else CheckedFamily(domain, base)
    return DomainStrategy(domain)


class CheckedFamily:
    """A suite family whose draws the system's own check keeps or rejects (each rejection counted by its
    reason): up to :data:`TRIES` cases per draw, the first the system accepts (None when none is)."""

    def __init__(self, domain, base):
        self.domain, self.base = domain, base

    def __call__(self, rng: random.Random) -> Optional[FuzzCase]:
        for _ in range(TRIES):
            case = self.base(rng)
            if case is None:
                continue
            reason = self.domain.check(case)
            if reason is None:
                self.domain.accept()
                return case
            self.domain.reject(reason)
        return None
