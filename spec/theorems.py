"""The theorem catalogue: every theorem `fa3verify prove` runs, with its number in issue 3 and its statement.

The statements are the one-sentence claims each theorem's z3 query decides; the queries live in
`theorems_metadata` (0-4), `theorems_algebra` (5), `theorems_cp` (6-7), `theorems_edges` (8) and
`theorems_fork_tile` (9). A test checks that this table and
the theorems a prove run reports are the same set, so docs/invariants.md (generated from it) cannot drift.
"""

from __future__ import annotations

import time

from .results import TheoremResult

#: name -> (theorem number in issue 3, statement)
THEOREMS: dict[str, tuple[str, str]] = {
    "0-kv-cover": ("lemma", "The call's split ranges start at n_min, are contiguous and end at n_max, for every "
                            "n_max <= 2^23 KV blocks and 1..256 splits (KV_COVER by design; hopper/block.h)."),
    "0-batch-over-992": ("lemma", "Every per-batch split lies in 1..S_static, and with b > 992 every split is 1 "
                                  "(flash_prepare_scheduler.cu), so the b <= 8 results carry over."),
    "1-freshness": ("1", "Metadata computed from the call's own inputs (P == C) is SAFE, except FA3's own corners "
                         "(d <= 64 with 64 < dv <= 192; explicit pack_gqa=False with splits), kept as documented "
                         "expected refutations."),
    "2-benign-drift": ("2", "Changing only cache_seqlens (same b, same static shapes) preserves SAFE."),
    "2-drift-breaks-h_k": ("2", "Changing only the KV head count can break SAFE (witness: SPLIT_BOUND)."),
    "2-drift-breaks-seqlen_k": ("2", "Changing only seqlen_k (the page-table width) can break SAFE."),
    "2-drift-breaks-seqlen_q": ("2", "Changing only seqlen_q can break SAFE (QUERY_COVER)."),
    "2-drift-breaks-pack": ("2", "Changing only pack_gqa can break SAFE (QUERY_COVER)."),
    "2-drift-breaks-b": ("2", "Changing only the batch size can break SAFE (BATCH_PERMUTATION: unwritten slots)."),
    "3-hazard": ("3", "Under the policy, no prefill-CP configuration precomputes metadata that violates "
                      "SPLIT_BOUND (refuted, with a replayable case, for the pre-fix guard with 'tp' heads)."),
    "4-guard-soundness": ("4", "Under the policy, every configuration of the domain either computes no metadata "
                               "or satisfies SAFE."),
    "4-root-cause-alternative": ("4", "The pre-fix guard with 'attn_tp' precompute heads is sound on sglang's "
                                      "replicated-KV decode."),
    "4-sharded-kv-decode": ("4", "Under the policy, a CP decode over sharded KV (metadata from global lengths, "
                                 "call over the rank's local KV) is SAFE (a fork's path; a safety theorem only "
                                 "with --cp-decode-sharded-kv)."),
    "4-guard-robustness": ("4", "The guard returns (never raises) on every configuration and on ServerArgs "
                                "lacking any of its flags (older sglang versions)."),
    "combine_exact_merge": ("5", "FA3's combine equals the exact merge of partial softmax states for 1..8 and 16 "
                                 "splits, any of them empty with garbage output."),
    "combine_all_empty": ("5", "Rows whose splits are all empty combine to (O = 0, LSE = -inf)."),
    "merge_commutative": ("5", "Two-way merge of softmax states is commutative."),
    "merge_associative": ("5", "Two-way merge of softmax states is associative."),
    "zigzag_partition": ("6", "For cp 2..8 and L >= 2cp the 2cp zigzag blocks partition [0, L), rank r owns "
                              "blocks r and 2cp-1-r, and kv_len_prev/next are their causal extents."),
    "zigzag_balance": ("6", "Per-rank token counts of one sequence differ by at most 1 (tight)."),
    "runner_hygiene": ("7", "The backend takes the CP path iff the batch is CP-v2 active, for every sequence of "
                            "batches (refuted for the runner that keeps stale CP metadata)."),
    "runner_freshness": ("7", "Whenever the backend takes the CP path, its CP metadata was built for the current "
                              "batch."),
    "8-int32-split-heuristic": ("8", "FA3's L2 split branch never yields fewer than 1 split (refuted for FA3 "
                                     "itself, every head-dim instance: its int size + 50 MiB - 1 wraps; the call "
                                     "then rejects loudly; an expected refutation, proved with 64-bit sizes)."),
    "9-fork-tile-agree": ("9", "Under vLLM's FA3 fork, a precompute and a call that agree on seqlen_q and h/h_k "
                               "choose the same tile (kBlockM, kBlockN), for every head-dim instance, dtype, "
                               "masking and paging."),
    "9-fork-tile-drift": ("9", "Under vLLM's FA3 fork, a precompute whose max_seqlen_q is one more than the call's "
                               "chooses another tile on vLLM's domain (an expected refutation: replayed as "
                               "SPLIT_BOUND on vLLM with the seeded off-by-one; none under upstream's build)."),
}


def known_defects() -> set:
    """Every seeded-defect name the theorem modules accept (theorem 5's and theorems 6-7's)."""
    from . import theorems_algebra, theorems_cp

    return set(theorems_algebra.DEFECTS) | set(theorems_cp.DEFECTS)


def own_defects(defects, own) -> frozenset:
    """The defects in `defects` that belong to a module (`own`); an unknown name is a ValueError listing all."""
    defects = frozenset(defects)
    unknown = defects - known_defects()
    if unknown:
        raise ValueError(f"defects: unknown names {sorted(unknown)}; known: {sorted(known_defects())}")
    return defects & frozenset(own)


def select(only, names, number_of) -> list:
    """Theorems among `names` matching `only`: exact names, the issue's number or substrings; None selects all.

    Names that match nothing are not an error: the command line passes one `only` list to every group.
    """
    if only is None:
        return list(names)
    wanted = [str(o) for o in only]
    return [t for t in names if any(o == t or o == number_of(t) or o in t for o in wanted)]


def theorem_result(name: str, verdict: str, t0: float, witness: dict, message: str, details: dict,
                   failed=None):
    """A TheoremResult timed from `t0`: failed when refuted (unless told), expected when neither failed nor unknown."""
    failed = (verdict == "refuted") if failed is None else failed
    return TheoremResult(name=name, verdict=verdict, seconds=round(time.perf_counter() - t0, 3), witness=witness,
                         case_file=None, message=message, failed=failed,
                         expected=not failed and verdict != "inconclusive", details=details)
