"""Theorems 6 and 7: the zigzag prefill-CP partition, and the eager runner's CP-metadata hygiene.

Sources modelled (read, not copied; docs/facts-fa3.md section 3):

* ``ZigzagCPStrategy.build_metadata`` in sglang ``python/sglang/srt/layers/cp/zigzag.py``: a sequence's
  ``L`` extend tokens are cut into ``2*cp`` blocks, ``base = L // (2cp)``, ``rem = L % (2cp)``, block ``i`` has
  ``base + 1`` tokens if ``i < rem`` else ``base``; rank ``r`` owns blocks ``r`` and ``2cp-1-r``;
  ``kv_len_prev = prefix + sum(blocks[:r+1])``, ``kv_len_next = prefix + sum(blocks[:2cp-r])``.
  FA3 then runs each half causally with ``cache_seqlens = kv_len`` and the half's tokens as the last
  ``q_len`` queries (bottom-right aligned causal mask: query ``j`` of ``q_len`` sees keys ``[0, K - q_len + j + 1)``).
* The eager runner's extend step (sglang ``model_executor`` eager runner, ``prepare_cp_forward`` in
  ``python/sglang/srt/layers/cp/utils.py``, ``ForwardMode.is_context_parallel_extend`` in
  ``forward_batch_info.py`` -- EXTEND and MIXED -- and the FA3 backend's CP gate), with PR #30439's fix:
  clear ``attn_cp_metadata`` when CP-v2 is not active for the batch.

Theorem 6 (``zigzag-partition``, ``zigzag-balance``), for every ``cp`` in 2..8 and symbolic ``L >= 2cp``,
``prefix >= 0`` (z3 integers, unbounded): the blocks are non-empty and partition ``[0, L)`` (every position
lies in exactly one block); the ownership map is a bijection from (rank, half) to blocks; each half's
``kv_len`` is the causal extent of its block (``prefix + end``), so every query token sees exactly its causal
prefix and nothing past the sequence; and the per-rank token counts of one sequence differ by at most 1.
The bound is tight, the counts are equal iff ``rem`` is 0 or ``cp``, and over a batch of ``b`` sequences the
per-rank totals differ by at most ``b`` (tight) -- reported in ``details``.

Theorem 7 (``runner-hygiene``, ``runner-freshness``): bounded model checking (z3, unrolled up to ``k``
steps, default 6) of the runner as a transition system, plus a 1-step induction for every length:

* state: the ``attn_cp_metadata`` the forward-batch object holds: ``None`` (-1) or "built for step j" (j);
* input per step: a batch kind (CP-v2 extend; non-CP extend -- an EXTEND that CP-v2 cannot split, e.g. an
  extend length below ``2cp``; MIXED; DECODE) and how it arrives: ``fresh`` (a new object, no metadata),
  ``carried`` (a reused object still holding what the previous step left -- how a MIXED or short extend
  batch formed from the running batch can carry CP metadata) or ``built`` (metadata built with this batch;
  only a CP-v2 extend, since only ``prepare_cp_forward`` builds metadata and it asserts CP-v2 is active).
  By default a CP-v2 extend never arrives ``carried`` (sglang builds a new batch object for a new extend;
  ``gpu_impl.runner`` assumes the same); ``cp_v2_may_inherit=True`` drops that assumption;
* step: DECODE clears the field (``prepare_for_decode``); a CP-v2-active batch (mode EXTEND; MIXED never)
  runs ``prepare_cp_forward``, which builds metadata only if the field is None; an inactive batch has the field
  cleared iff the fix is in (``clear_stale``); the backend takes the CP path iff the mode is a CP extend
  (EXTEND or MIXED), the field is not None and ``attn_cp_size > 1`` (taken as given: CP-v2 needs it).

``runner-hygiene`` -- the CP path is taken iff the batch is CP-v2 active -- and ``runner-freshness`` --
whenever the CP path is taken, the metadata was built for the current batch -- are proved with the fix (for
every sequence length by induction; BMC up to ``k`` agrees) and refuted without it: the shortest witness is a
CP-v2 extend followed by a MIXED (or non-CP extend) batch carrying its metadata. Finding, in
``runner-freshness``'s details: if a CP-v2 extend could arrive on a reused object, two consecutive CP-v2
extends would share the first one's metadata even with the fix (``prepare_cp_forward`` keeps any non-None
object); clearing before every ``prepare_cp_forward``, as sglang's prefill CUDA-graph path does, closes that.

Layering: this module imports nothing from ``gpu_impl`` or ``fa3verify``; tests compare it with them.

Modules: theorem 6 is ``cp_zigzag``, theorem 7 ``cp_runner``, what they share
``cp_common``; this one holds the seeded defects, the runner case files and the entry point
:func:`run_cp_theorems`, and re-exports the public names.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from spec.theorems.results import TheoremResult
from spec.theorems.base import SEEDED_DEFECTS, own_defects, select
from spec.theorems.jobs import Job, run_jobs

from spec.theorems.cp_common import CARRIED, FRESH, ARRIVALS, CP_SIZES, KINDS, THEOREM_NUMBERS, THEOREMS
from spec.theorems.cp_runner import theorem_runner, runner_step, runner_step_z3, simulate_runner
from spec.theorems.cp_zigzag import theorem_zigzag_balance, theorem_zigzag_partition, zigzag_concrete, zigzag_terms
from spec.finding import TheoremVerdict


__all__ = [
    "DEFECTS",
    "THEOREMS",
    "THEOREM_NUMBERS",
    "CP_SIZES",
    "KINDS",
    "ARRIVALS",
    "zigzag_terms",
    "zigzag_concrete",
    "runner_step",
    "runner_step_z3",
    "simulate_runner",
    "run_cp_theorems",
    "cp_jobs",
]

#: Seeded defects for negative controls: name -> description.
DEFECTS: dict[str, str] = SEEDED_DEFECTS["cp"]


# --------------------------------------------------------------------------------------------
# Entry point.
# --------------------------------------------------------------------------------------------


def _check_defects(defects: Iterable[str]) -> frozenset:
    return own_defects(defects, DEFECTS)


def _select(only: Optional[Iterable[str]]) -> list[str]:
    return select(only, THEOREMS, THEOREM_NUMBERS.get)


#: A replayable scenario per batch kind (attn_cp_size 4, so 2*cp = 8): what a runner case file holds.
CASE_SERVER = {"tp_size": 4, "dp_size": 1, "attn_cp_size": 4, "enable_dp_attention": False,
               "enable_prefill_cp": True, "cp_strategy": "zigzag", "page_size": 1, "num_splits": 0,
               "enable_deterministic_inference": False, "cuda_graph": False, "num_sm": 132, "context_length": 32768}
CASE_MODEL = {"name": "qwen3-30b-a3b", "num_heads": 32, "num_kv_heads": 4, "head_dim": 128, "head_dim_v": 128,
              "dtype": "bfloat16", "is_mla": False, "has_sliding_window_layers": False}
CASE_BATCHES = {
    "CP_V2_EXTEND": {"mode": "extend", "seq_lens": [64], "extend_lens": [64]},  # 64 >= 2cp: CP-v2 active
    "NON_CP_EXTEND": {"mode": "extend", "seq_lens": [70], "extend_lens": [6]},  # 6 < 2cp: inactive
    "MIXED": {"mode": "mixed", "seq_lens": [80, 33], "extend_lens": [16, 1]},
    "DECODE": {"mode": "decode", "seq_lens": [81, 34], "extend_lens": None},
}


def _write_runner_case(result: TheoremResult, cases_dir: Optional[str]) -> Optional[str]:
    """Write a refuted runner theorem's witness as a case file (schema fa3verify.case/1; spec/model/cases.py).

    Only witnesses whose arrivals a replay reproduces are written: a CP-v2 extend arrives on a fresh batch
    object (no ``built``/inherited arrival) and every other batch on the reused one, as ``gpu_impl.runner``
    steps them; the violated invariant is CP_PATH_MATCHES_ACTIVITY (the CP path without CP-v2 activity).
    """
    w = result.witness
    if cases_dir is None or not w:
        return None
    # the arrivals a replay gives: a fresh object for a CP-v2 extend, the reused one for everything else
    replay_steps = [(KINDS.index(k), FRESH if k == "CP_V2_EXTEND" else CARRIED) for k in w["sequence"]]
    last = simulate_runner(replay_steps, clear_stale=bool(w["clear_stale"]))[-1]
    if last["cp_path"] == last["active"]:
        return None
    from spec.model.cases import Case  # same layer

    case = Case.from_parts(
        source=f"prove:{result.name}", server=dict(CASE_SERVER), model=dict(CASE_MODEL),
        policy={"guard": "fixed", "metadata_heads": "tp", "clear_stale_cp_metadata": bool(w["clear_stale"])},
        batches=[dict(CASE_BATCHES[k]) for k in w["sequence"]],
        expected={"outcome": "violation", "invariant": "CP_PATH_MATCHES_ACTIVITY",
                  "detail": {"sequence": w["sequence"], "arrivals": w["arrivals"], "step": len(w["sequence"]) - 1}},
        notes=f"z3 BMC witness of {result.name}: " + " -> ".join(w["sequence"])
              + "; the last batch takes the CP path with metadata built for an earlier batch")
    return str(case.save(cases_dir))


def run_cp_theorems(timeout_s: float = 10, clear_stale: bool = True, only: Optional[Iterable[str]] = None,
                    defects: Iterable[str] = frozenset(), max_k: int = 6,
                    cp_v2_may_inherit: bool = False, cases_dir: Optional[str] = None) -> list[TheoremResult]:
    """Check theorems 6 (zigzag partition/balance, cp/zigzag.py) and 7 (runner CP-metadata hygiene, PR #30439's eager-runner fix).

    ``timeout_s`` bounds each z3 query; ``clear_stale`` selects the runner with (True) or without (False) the
    fix; ``only`` selects theorems by name, number ("6", "7") or substring (entries matching nothing here are
    ignored); ``defects`` seeds entries of :data:`DEFECTS` (algebra defects are accepted and ignored
    here); ``max_k`` is the BMC unrolling depth (1..12); ``cp_v2_may_inherit`` lets a CP-v2 extend arrive on a
    reused batch object (by default it arrives fresh or with its own metadata, as sglang builds a new batch
    for a new extend -- the assumption ``gpu_impl.runner`` makes too); with ``cases_dir``, a refuted runner
    theorem whose witness a replay reproduces is written there as a case file (``case_file``).
    """
    return run_jobs(cp_jobs(timeout_s, clear_stale, only, defects, max_k, cp_v2_may_inherit, cases_dir)).results


def cp_jobs(timeout_s: float = 10, clear_stale: bool = True, only: Optional[Iterable[str]] = None,
            defects: Iterable[str] = frozenset(), max_k: int = 6, cp_v2_may_inherit: bool = False,
            cases_dir: Optional[str] = None) -> list[Job]:
    """The jobs of :func:`run_cp_theorems` (same arguments; spec.theorems.jobs): one per theorem."""
    active = _check_defects(defects)
    if not 1 <= max_k <= 12:
        raise ValueError(f"max_k: must lie in [1, 12], got {max_k}")
    runners: dict[str, Callable[[], TheoremResult]] = {
        "zigzag-partition": lambda: theorem_zigzag_partition(timeout_s, active),
        "zigzag-balance": lambda: theorem_zigzag_balance(timeout_s, active),
        "runner-hygiene": lambda: theorem_runner("hygiene", timeout_s, clear_stale, max_k, cp_v2_may_inherit),
        "runner-freshness": lambda: theorem_runner("freshness", timeout_s, clear_stale, max_k, cp_v2_may_inherit),
    }
    weights = {"zigzag-partition": 0.1, "zigzag-balance": 0.45, "runner-hygiene": 0.05, "runner-freshness": 0.07}
    return [Job((name,), (lambda name=name: _with_case(runners[name](), cases_dir),), weight=weights[name], light=True,
                key=(name, timeout_s, clear_stale, max_k, cp_v2_may_inherit, active),
                cases_dir=None if cases_dir is None else str(cases_dir))
            for name in _select(only)]


def _with_case(r: TheoremResult, cases_dir: Optional[str]) -> list:
    """[r], a refuted runner theorem's replayable witness written into `cases_dir` first."""
    if r.name.startswith("runner-") and r.verdict == TheoremVerdict.REFUTED:
        r.case_file = _write_runner_case(r, cases_dir)
    return [r]


def group_jobs(request) -> list[Job]:
    """The CP theorems' jobs for a :class:`spec.theorems.base.ProveRequest` (spec.theorems.jobs_for)."""
    return cp_jobs(timeout_s=request.timeout_s, clear_stale=request.clear_stale_cp_metadata,
                   only=None if request.only is None else list(request.only), cases_dir=request.cases_dir)
