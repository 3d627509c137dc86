"""Theorems 10-11: the scheduler metadata as state, over bounded sequences of launches (spec.lifecycle_invariants).

``semaphore-zero``: over every sequence of up to :data:`MAX_LAUNCHES` launches that reuse one metadata tensor after
its precompute (each launch any split count 1..256, any tile count 0..2^20, on 1..256 SMs, its kernel running or
not), every launch's scheduler starts from a zero semaphore. The step is refmodel.metadata_lifecycle's
``semaphore_after_launch`` (the prepare kernel zeroes the slot, flash_prepare_scheduler.cu@0251105a 77; the scheduler
adds its fetches, tile_scheduler.hpp 763-788; the combine, flash_fwd_combine_kernel.h 439-441, or the host,
flash_api.cpp 1186-1188, writes 0 back), encoded in z3 here and checked against that function on a grid
(tests/prover/test_theorems_lifecycle.py). Proved for FA3 at 0251105a; ``semaphore-pre-fix`` is the same query for FA3
before 1a58058a (no host reset after a one-split launch): an expected refutation whose witness is replayed through
the engine model, where SEMAPHORE_STARTS_AT_ZERO catches it. Counts stay below 2^31 under these bounds, so z3's
integers are C++ ints here.

``metadata-size-agrees-sm90``: for every batch 1..2^20 and split counts S_p, S_c in 1..256, a varlen precompute and call
with the same batch and masking expect the same metadata size on upstream FA3 for sm90 (proved).
``metadata-size-sm8x`` and ``metadata-size-fork``: the same claim on sm8x and on vLLM's fork, refuted (expected): there the size
depends on whether the side splits, so a heuristic split count on one side and a fixed one on the other mismatch;
loud at an eager call's CHECK_SHAPE, silent behind a persistent-buffer view (the fork's witness is replayed through
the engine model: PRECOMPUTE_CALL_SIZE_AGREE). The sizes are refmodel's (``scheduler_needs_semaphore``,
fa3_builds ``fork_metadata_vectors``): each is constant in S over 2..256 and in b over 1..992 and 993.. (checked over
every S and both batch classes before the query), so z3 takes them as two-case terms.
"""

from __future__ import annotations

import time

import z3

from refmodel import fa3_builds
from refmodel.fa3_scheduler import scheduler_needs_semaphore
from refmodel.metadata_lifecycle import FA3Behaviour, run_sequence

from spec.lifecycle_invariants import check_trace, control_sequence, run_and_check
from spec.theorems.base import select, theorem_result
from spec.theorems.z3ctx import Bool, Int, IntVal, checked
from spec.theorems.symbolic import solver
from spec.finding import TheoremVerdict

__all__ = ["THEOREMS", "MAX_LAUNCHES", "semaphore_step", "lifecycle_jobs", "group_jobs", "size_terms"]

THEOREMS = ("semaphore-zero", "semaphore-pre-fix", "metadata-size-agrees-sm90", "metadata-size-sm8x", "metadata-size-fork")
MAX_LAUNCHES = 8
MAX_TILES = 2**20
MAX_SPLITS = 256
MAX_BATCH = 2**20


def semaphore_step(start, tiles, num_sm, num_splits, runs, reset_after_reuse: bool):
    """z3 terms (end, after) of refmodel.metadata_lifecycle.semaphore_after_launch for a start >= 0."""
    zero = IntVal(0)
    valid = z3.If(tiles < num_sm, tiles, num_sm)                       # min(num_sm, T)
    beyond = tiles - start - num_sm
    fetches = valid + z3.If(beyond > zero, beyond, zero)
    end = z3.If(runs, start + fetches, start)
    reset = z3.Or(num_splits > 1, z3.BoolVal(bool(reset_after_reuse), start.ctx))
    return end, z3.If(runs, z3.If(reset, zero, end), start)


def _semaphore(name: str, reset_after_reuse: bool, timeout_s: float):
    t0 = time.perf_counter()
    s = solver(timeout_s)
    num_sm = Int("num_sm")
    s.add(num_sm >= 1, num_sm <= 256)
    state = IntVal(0)                       # the prepare kernel's zero (flash_prepare_scheduler.cu 77)
    starts, launches = [], []
    for i in range(MAX_LAUNCHES):
        tiles, splits, runs = Int(f"tiles_{i}"), Int(f"splits_{i}"), Bool(f"runs_{i}")
        s.add(tiles >= 0, tiles <= MAX_TILES, splits >= 1, splits <= MAX_SPLITS)
        starts.append(state)
        launches.append((tiles, splits, runs))
        _, state = semaphore_step(state, tiles, num_sm, splits, runs, reset_after_reuse)
    s.add(z3.Or([st != 0 for st in starts]))
    r = checked(s)
    details = {"max_launches": MAX_LAUNCHES, "max_tiles": MAX_TILES, "reset_after_reuse": reset_after_reuse}
    if r == z3.unknown:
        return theorem_result(name, TheoremVerdict.INCONCLUSIVE, t0, {}, f"z3 unknown: {s.reason_unknown()}", details)
    if r == z3.unsat:
        return theorem_result(name, TheoremVerdict.PROVED, t0, {},
                              f"every launch of every sequence of up to {MAX_LAUNCHES} "
                              "over one tensor starts from a zero semaphore", details)
    m = s.model()
    first = next(i for i, st in enumerate(starts) if m.eval(st, model_completion=True).as_long() != 0)
    seq = [{"tiles": m.eval(t, model_completion=True).as_long(), "splits": m.eval(p, model_completion=True).as_long(),
            "runs": z3.is_true(m.eval(u, model_completion=True))} for t, p, u in launches[:first]]
    witness = {"invariant": "SEMAPHORE_STARTS_AT_ZERO", "launch": first, "before": seq,
               "start": m.eval(starts[first], model_completion=True).as_long(),
               "num_sm": m.eval(num_sm, model_completion=True).as_long()}
    replay = _replay_semaphore()
    details["replay"] = replay
    if reset_after_reuse or not replay["caught"]:
        return theorem_result(name, TheoremVerdict.INCONCLUSIVE if not reset_after_reuse else TheoremVerdict.REFUTED,
                              t0, witness,
                              f"a launch starts from {witness['start']}; engine-model replay: {replay}", details)
    return theorem_result(name, TheoremVerdict.EXPECTED_REFUTATION, t0, witness,
                          f"FA3 before 1a58058a: after a one-split launch that reused metadata the next launch starts "
                          f"from {witness['start']} (launch {first}); replayed on the engine model: "
                          f"{replay['skipped_tiles']} tiles skipped, SEMAPHORE_STARTS_AT_ZERO", details, failed=False)


def _replay_semaphore() -> dict:
    engine, steps = control_sequence("no-semaphore-reset-after-reuse")
    trace = run_sequence(engine, steps, FA3Behaviour(reset_after_reuse=False))
    found = {v.invariant for v in check_trace(trace)}
    return {"caught": found == {"SEMAPHORE_STARTS_AT_ZERO"}, "violated": sorted(found),
            "skipped_tiles": max(r.skipped_tiles for r in trace.launches)}


def _check_two_cases(fn, name: str) -> None:
    """refmodel's size ingredient is constant in S over 2..256 and in b within {1..992} and {993..}: the lifting."""
    for b in (1, 4, 992, 993, 4096):
        base = fn(b, 2)
        if any(fn(b, s) != base for s in range(3, MAX_SPLITS + 1)):
            raise AssertionError(f"{name}: not constant in S over 2..{MAX_SPLITS} at b={b}")
    for s in (1, 2):
        if len({fn(b, s) for b in range(1, 993)}) != 1 or fn(993, s) != fn(4096, s):
            raise AssertionError(f"{name}: not constant in b within a batch class at S={s}")


def size_terms(b, split, platform: str, precompute: bool, swizzle: bool):
    """The metadata size of one side as a z3 term over symbolic b and S, from refmodel's functions."""
    arch = 80 if platform == "sm8x" else 90
    fork = platform == "fork"

    def sem(bb, s):
        return int(scheduler_needs_semaphore(arch, precompute, swizzle, False, s, True))

    def vectors(bb, s):
        if fork:
            return fa3_builds.fork_metadata_vectors(True, bb, s, swizzle)
        return 2 + 1 + int(swizzle)   # upstream varlen: 2 + Sort + Swizzle, Sort = not local (flash_api.cpp 624-631)

    for fn, what in ((sem, "semaphore"), (vectors, "vectors")):
        _check_two_cases(fn, f"{platform} {what}")

    def case(fn):
        small = z3.If(split > 1, IntVal(fn(1, 2)), IntVal(fn(1, 1)))
        large = z3.If(split > 1, IntVal(fn(993, 2)), IntVal(fn(993, 1)))
        return z3.If(b <= fa3_builds.MAX_BATCHES_1CTA, small, large)

    b4 = (b + 3) / 4 * 4
    return case(sem) + b4 * case(vectors)


def _size(name: str, platform: str, timeout_s: float):
    t0 = time.perf_counter()
    s = solver(timeout_s)
    b, sp, sc, swz = Int("b"), Int("S_p"), Int("S_c"), Bool("swizzle")
    s.add(b >= 1, b <= MAX_BATCH, sp >= 1, sp <= MAX_SPLITS, sc >= 1, sc <= MAX_SPLITS)
    sizes = [z3.If(swz, size_terms(b, x, platform, pre, True), size_terms(b, x, platform, pre, False))
             for x, pre in ((sp, True), (sc, False))]
    s.add(sizes[0] != sizes[1])
    r = checked(s)
    details = {"platform": platform, "max_batch": MAX_BATCH, "max_splits": MAX_SPLITS}
    if r == z3.unknown:
        return theorem_result(name, TheoremVerdict.INCONCLUSIVE, t0, {}, f"z3 unknown: {s.reason_unknown()}", details)
    if r == z3.unsat:
        return theorem_result(name, TheoremVerdict.PROVED, t0, {},
                              f"{platform}: a varlen precompute and call of the same batch "
                              "and masking expect the same metadata size for every S_p, S_c", details)
    m = s.model()
    witness = {"invariant": "PRECOMPUTE_CALL_SIZE_AGREE", "platform": platform,
               **{k: m.eval(v, model_completion=True).as_long() for k, v in (("b", b), ("S_p", sp), ("S_c", sc))},
               "sizes": [m.eval(x, model_completion=True).as_long() for x in sizes]}
    if platform == "sm90":
        return theorem_result(name, TheoremVerdict.REFUTED, t0, witness, f"sizes differ on sm90: {witness}", details)
    msg = (f"{platform}: S_p={witness['S_p']}, S_c={witness['S_c']} (b={witness['b']}) give sizes "
           f"{witness['sizes'][0]} and {witness['sizes'][1]}: loud at an eager call's CHECK_SHAPE, silent behind a "
           "persistent-buffer view")
    if platform == "fork":
        defect = "fork-precompute-heuristic-splits"
        _, violations = run_and_check(*control_sequence(defect), defect=defect)
        found = [v for v in violations if v.invariant == "PRECOMPUTE_CALL_SIZE_AGREE"]
        details["replay"] = {"silent_violations": sum(not v.detail["loud"] for v in found)}
        if not details["replay"]["silent_violations"]:
            return theorem_result(name, TheoremVerdict.INCONCLUSIVE, t0, witness,
                                  "the witness does not replay on the engine "
                                  "model", details)
        msg += f"; replayed on the engine model (vLLM-style capture, heuristic precompute): {len(found)} silent"
    return theorem_result(name, TheoremVerdict.EXPECTED_REFUTATION, t0, witness, msg, details, failed=False)


_RUNNERS = {
    "semaphore-zero": lambda t: _semaphore("semaphore-zero", True, t),
    "semaphore-pre-fix": lambda t: _semaphore("semaphore-pre-fix", False, t),
    "metadata-size-agrees-sm90": lambda t: _size("metadata-size-agrees-sm90", "sm90", t),
    "metadata-size-sm8x": lambda t: _size("metadata-size-sm8x", "sm8x", t),
    "metadata-size-fork": lambda t: _size("metadata-size-fork", "fork", t),
}


def lifecycle_jobs(timeout_s: float = 10.0, only=None) -> list:
    """One job per selected theorem (spec.theorems.jobs)."""
    from spec.theorems.jobs import Job

    names = select(only, THEOREMS, lambda t: t.split("-")[0])
    return [Job((name,), ((lambda n=name: [_RUNNERS[n](timeout_s)]),), weight=0.2) for name in names]


def group_jobs(request) -> list:
    """The lifecycle theorems' jobs for a :class:`spec.theorems.base.ProveRequest` (spec.theorems.jobs_for)."""
    return lifecycle_jobs(timeout_s=request.timeout_s, only=None if request.only is None else list(request.only))
