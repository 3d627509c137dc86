"""The regression corpus (tests/corpus/): replaying any case the suite writes, and refreshing the corpus.

:func:`replay_corpus_file` replays a scenario case through ``fa3verify.commands.replay.replay`` and a kernel-level case
(``fa3verify.case/1`` with a ``call``, or the older ``fa3verify.kernel-case/1``) through
``fa3verify.kernel_cases.replay_kernel_case``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional

from ..case_files import write_case
from ..kernel_cases import is_kernel_case, replay_kernel_case
from .entries import CORPUS_DIR
from spec.finding import Outcome

__all__ = ["replay_corpus_file", "write_corpus", "EXTRA_CORPUS"]


def replay_corpus_file(path) -> dict:
    """Replay any corpus file (scenario or kernel-level): {"kind", "outcome", "invariants", "expected", "matches"}."""
    data = json.loads(Path(path).read_text())
    if is_kernel_case(data):
        r = replay_kernel_case(path)
        return {"kind": "kernel", **{k: v for k, v in r.items() if k != "verdict"}}
    from ..commands.replay import replay

    _summary, observed = replay(str(path))
    exp = {"outcome": observed.expected_outcome, "invariant": observed.expected_invariant}
    if observed.expected_outcome == Outcome.PASS:
        matches = observed.outcome == Outcome.PASS
    else:
        matches = observed.still_fails
    return {"kind": "scenario", "outcome": observed.outcome, "invariants": observed.invariants,
            "messages": [f.message for f in observed.findings[:3]], "expected": exp, "matches": matches,
            "still_fails": observed.still_fails}


def _extra_corpus() -> dict:
    """The corpus cases that are not catalogue entries: docs/facts-fa3.md's worked example (both guards), MIXED after
    CP-v2."""
    from spec.model.cases import Case

    server = {"tp_size": 4, "dp_size": 1, "attn_cp_size": 4, "enable_dp_attention": False, "enable_prefill_cp": True,
              "cp_strategy": "zigzag", "page_size": 1, "num_splits": 0, "enable_deterministic_inference": False,
              "cuda_graph": False, "num_sm": 132, "context_length": 32768}
    model = {"name": "qwen3-30b-a3b", "num_heads": 32, "num_kv_heads": 4, "head_dim": 128, "head_dim_v": 128,
             "dtype": "bfloat16", "is_mla": False, "has_sliding_window_layers": False}
    decode = [{"mode": "decode", "seq_lens": [32768] + [100] * 7, "extend_lens": None}]
    prefix = Case.from_parts(
        source="manual", server=server, model=model,
        policy={"guard": "pre-fix", "metadata_heads": "tp", "clear_stale_cp_metadata": True}, batches=decode,
        expected={"outcome": Outcome.VIOLATION, "invariant": "SPLIT_BOUND",
                  "detail": {"S_p": 109, "S_c": 29, "splits": [86, 1, 1, 1, 1, 1, 1, 1]}},
        notes="docs/facts-fa3.md's worked example: Qwen3-30B-A3B, tp 4, attn_cp 4, the pre-fix guard; the long "
              "sequence gets 86 splits against S_c = 29 buffers")
    fixed = Case.from_parts(
        source="manual", server=server, model=model,
        policy={"guard": "fixed", "metadata_heads": "tp", "clear_stale_cp_metadata": True}, batches=decode,
        expected={"outcome": Outcome.PASS, "invariant": None, "detail": {}},
        notes="docs/facts-fa3.md's worked example under the fixed guard (PR #30439): no precompute, nothing fires")
    mixed = Case.from_parts(
        source="manual", server=server, model=model,
        policy={"guard": "fixed", "metadata_heads": "tp", "clear_stale_cp_metadata": False},
        batches=[{"mode": "extend", "seq_lens": [64], "extend_lens": [64]},
                 {"mode": "mixed", "seq_lens": [80, 33], "extend_lens": [16, 1]}],
        expected={"outcome": Outcome.VIOLATION, "invariant": "CP_PATH_MATCHES_ACTIVITY", "detail": {}},
        notes="a CP-v2 extend, then a MIXED batch: the runner without the PR #30439 clear leaves the extend's CP-v2 "
              "metadata on the MIXED batch and the backend takes the CP path")
    return {"worked_example_prefix_guard.json": prefix, "worked_example_fixed_guard.json": fixed,
            "mixed_after_cp_v2_stale_runner.json": mixed}


#: File names of the corpus cases that are not catalogue entries.
EXTRA_CORPUS = ("worked_example_prefix_guard.json", "worked_example_fixed_guard.json",
                "mixed_after_cp_v2_stale_runner.json")


def write_corpus(directory=CORPUS_DIR, mode: str = "fast", ids: Optional[Iterable[str]] = None) -> list:
    from .runner import run_catalogue

    """Run the selected entries and write each entry's catching case (and the extra cases) into ``directory``."""
    directory = Path(directory)
    written = []
    for name, case in _extra_corpus().items():
        written.append(write_case(case, directory / name))
    for res in run_catalogue(ids, mode):
        case = next((res.on[e].case for e in ("fuzz", "prove") if e in res.on and res.on[e].case is not None), None)
        if case is not None:
            written.append(write_case(case, directory / res.entry.case_name))
    return written
