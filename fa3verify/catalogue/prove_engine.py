"""The catalogue's prove engine: an entry's ``prove_run`` (data) names a theorem, the policy with the defect on and
off, and the verdict expected; :data:`KINDS` holds the little code each kind of theorem needs to be run and read.

With the defect on, the entry is caught when the theorem gives the expected verdict (``refuted``, or for theorem 8
``expected-refutation``) with the expected witness; with it off, a refutation is a false alarm. z3 "unknown" is
inconclusive, never caught and never silent.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from typing import Callable

from spec.finding import CatalogueStatus, Outcome, TheoremVerdict

from .results import EngineOutcome

__all__ = ["KINDS", "engine_from_data"]


def _verdict(r, on: bool, secs: float, text: str, caught: bool, invariants: list, case=None) -> EngineOutcome:
    """Caught / missed (on), fired / silent (off), inconclusive on z3 unknown."""
    if r.verdict == TheoremVerdict.INCONCLUSIVE:
        return EngineOutcome("prove", CatalogueStatus.INCONCLUSIVE, secs, detail=text)
    if on:
        return EngineOutcome("prove", CatalogueStatus.CAUGHT if caught else CatalogueStatus.MISSED, secs,
                             invariants if caught else [],
                             detail=text, case=case if caught else None)
    fired = r.verdict == TheoremVerdict.REFUTED
    return EngineOutcome("prove", CatalogueStatus.FIRED if fired else CatalogueStatus.SILENT, secs,
                         invariants if fired else [], detail=text)


def _guard(spec: str):
    """A built-in guard stays its name; any other spec loads (``gpu_impl.defects:...``) and labels itself."""
    from spec.model.guards import is_builtin_guard

    if is_builtin_guard(spec):
        return spec, None
    from gpu_impl.guards import load_guard

    return load_guard(spec), spec


def _metadata_theorem(run: dict, on: bool, b: dict) -> EngineOutcome:
    """A metadata theorem (spec.theorems.metadata) under the policy's guard; caught by a witness of the invariant."""
    from spec.theorems.metadata_jobs import run_metadata_theorems

    guard, label = _guard((run["on"] if on else run["off"])["guard"])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = run_metadata_theorems(guard=guard, metadata_heads="tp", timeout_s=b["timeout_s"], cases_dir=tmp,
                                        only=[run["theorem"]], guard_spec=label)
    secs = time.perf_counter() - start
    r = next((x for x in results if x.name == run["theorem"]), None)
    if r is None:
        return EngineOutcome("prove", CatalogueStatus.ERROR, secs, detail=f"theorem {run['theorem']} did not run")
    inv = (r.witness or {}).get("invariant")
    caught = r.verdict == run["verdict"] and inv == run["witness_invariant"] and \
        run.get("witness_config_contains", "") in str((r.witness or {}).get("config"))
    text = f"{r.name}: {r.verdict} -- {r.message[:240]}"
    if on and not caught and r.verdict != TheoremVerdict.INCONCLUSIVE:
        return EngineOutcome("prove", CatalogueStatus.MISSED, secs, [inv] if inv else [], detail=text)
    return _verdict(r, on, secs, text, caught, [inv] if inv else [])


def _cp_theorem(run: dict, on: bool, b: dict) -> EngineOutcome:
    """A CP-runner theorem (spec.theorems.cp, bounded model checking) with the runner's hygiene on or off."""
    start = time.perf_counter()
    try:
        from spec.theorems.cp import run_cp_theorems
    except ImportError as exc:
        return EngineOutcome("prove", CatalogueStatus.NOT_APPLICABLE, 0.0,
                             detail=f"spec.theorems.cp is not available ({exc})")
    side = run["on"] if on else run["off"]
    results = run_cp_theorems(timeout_s=b["timeout_s"], clear_stale=side["clear_stale_cp_metadata"],
                              only=[run["theorem"]])
    secs = time.perf_counter() - start
    found = [r for r in results if r.name == run["theorem"]]
    if not found:
        return EngineOutcome("prove", CatalogueStatus.NOT_APPLICABLE, secs, detail=f"no {run['theorem']} theorem among "
                                                          + ", ".join(r.name for r in results))
    r = found[0]
    return _verdict(r, on, secs, f"{r.name}: {r.verdict} -- {r.message[:200]}", r.verdict == run["verdict"],
                    [run["invariant"]] if on else [])


def _algebra_theorem(run: dict, on: bool, b: dict) -> EngineOutcome:
    """A combine-algebra theorem (spec.theorems.algebra) with the combine defects of the side."""
    from spec.theorems.algebra import run_algebra_theorems

    defects = frozenset((run["on"] if on else run["off"])["defects"])
    start = time.perf_counter()
    results = run_algebra_theorems(timeout_s=b["timeout_s"], only=[run["theorem"]], defects=defects)
    secs = time.perf_counter() - start
    r = results[0]
    text = f"{r.name} via run_algebra_theorems: {r.verdict} -- {r.message[:200] or r.summary()[:200]}"
    return _verdict(r, on, secs, text, r.verdict == run["verdict"], [run["invariant"]] if on else [])


@contextlib.contextmanager
def _kernel_uses_host_tiles():
    """Counterfactual FA3 whose kernel template dims are the host's rounded dims (entry 11 'off'); caches cleared."""
    import refmodel.fa3_scheduler as fs
    from spec.theorems import symbolic
    from spec.theorems import metadata_freshness

    def clear():
        metadata_freshness.qc_params.cache_clear()
        symbolic.clear_caches()

    original = fs.kernel_headdims
    fs.kernel_headdims = lambda d, dv, element_size=2: fs.rounded_headdims(d, dv)
    clear()
    try:
        yield
    finally:
        fs.kernel_headdims = original
        clear()


COUNTERFACTUALS: dict[str, Callable] = {"kernel-uses-host-tiles": _kernel_uses_host_tiles}


def _freshness_corner(run: dict, on: bool, b: dict) -> EngineOutcome:
    """Theorem 1's expected corner (FA3's own inconsistency): caught when the corner's witness replays as a
    violation; off is a counterfactual FA3 without it, where neither the corner nor a refutation may appear."""
    from spec.theorems.metadata_jobs import run_metadata_theorems

    side = run["on"] if on else run["off"]
    ctx = COUNTERFACTUALS[side["counterfactual"]]() if side.get("counterfactual") else contextlib.nullcontext()
    start = time.perf_counter()
    with ctx:
        results = run_metadata_theorems(guard="fixed", timeout_s=b["timeout_s"], only=[run["theorem"]])
    secs = time.perf_counter() - start
    r = results[0]
    corners = (r.details or {}).get("expected_corners", {})
    corner = corners.get(run["corner"])
    text = f"{r.name}: {r.verdict}; corners {sorted(corners)}"
    if r.verdict == TheoremVerdict.INCONCLUSIVE:
        return EngineOutcome("prove", CatalogueStatus.INCONCLUSIVE, secs, detail=text)
    if on:
        if corner and corner.get("replayed") == Outcome.VIOLATION:
            text += (f"; witness d={corner['headdim']}, dv={corner['headdim_v']}, Lq={corner['seqlen_q']}: "
                     f"{corner['m_blocks']} m-blocks of {corner['kernel_block_m']} < {corner['rows']} rows")
            return EngineOutcome("prove", CatalogueStatus.CAUGHT, secs, [run["invariant"]], detail=text)
        return EngineOutcome("prove", CatalogueStatus.MISSED, secs, detail=text)
    fired = corner is not None or r.verdict == TheoremVerdict.REFUTED
    return EngineOutcome("prove", CatalogueStatus.FIRED if fired else CatalogueStatus.SILENT, secs,
                         [run["invariant"]] if fired else [],
                         detail=text)


def _int32_split(run: dict, on: bool, b: dict) -> EngineOutcome:
    """Theorem 8 (FA3's int L2 split branch): with 32-bit sizes an expected refutation whose witness, replayed on
    the emulated kernel, is FA3's own rejection (the case); with 64-bit sizes proved."""
    from spec.theorems.edges import replay_rows, run_edge_theorems

    from ..kernel_cases import kernel_case

    side = run["on"] if on else run["off"]
    start = time.perf_counter()
    r = run_edge_theorems(timeout_s=b["timeout_s"], int_bits=side["int_bits"])[0]
    secs = time.perf_counter() - start
    text = f"{r.name}: {r.verdict}; {r.message[:200]}"
    if r.verdict == TheoremVerdict.INCONCLUSIVE:
        return EngineOutcome("prove", CatalogueStatus.INCONCLUSIVE, secs, detail=text)
    if not on:
        fired = r.verdict != TheoremVerdict.PROVED
        return EngineOutcome("prove", CatalogueStatus.FIRED if fired else CatalogueStatus.SILENT, secs,
                             [run["invariant"]] if fired else [],
                             detail=text)
    if r.verdict != run["verdict"]:
        return EngineOutcome("prove", CatalogueStatus.MISSED, secs, detail=text)
    w = r.witness
    rows = replay_rows(132)
    call = {"seqlens_q": [rows // 32], "seqlens_k": [w["seqlen_k"]], "capacity_k": w["seqlen_k"], "broadcast_kv": True,
            "max_seqlen_q": rows // 32, "heads": [32, 1], "head_dim": w["headdim"], "head_dim_v": w["headdim_v"],
            "causal": False, "num_splits": 0, "seed": 13}
    case = kernel_case("catalogue:13", call, (), "clear_error", [run["case_invariant"]], [w["call"]],
                       notes=f"FA3's L2 split branch wraps in int: {w['split_count']} splits for {w['seqlen_k']} KV "
                             f"tokens with {rows} query rows (32 query heads on 1 KV head), non-causal; "
                             "run_mha_fwd rejects it (hopper/heuristics.h:34, flash_api.cpp:371 at 0251105a)")
    return EngineOutcome("prove", CatalogueStatus.CAUGHT, secs, [run["invariant"]], detail=text, case=case)


#: prove_run["kind"] -> the function that runs and reads that kind of theorem.
KINDS: dict[str, Callable] = {"metadata-theorem": _metadata_theorem, "cp-theorem": _cp_theorem,
                              "algebra-theorem": _algebra_theorem, "freshness-corner": _freshness_corner,
                              "int32-split": _int32_split}


def engine_from_data(run: dict) -> Callable:
    """The prove engine an entry's ``prove_run`` describes: ``fn(on, budgets) -> EngineOutcome``."""
    kind = KINDS[run["kind"]]
    return lambda on, b: kind(run, on, b)
