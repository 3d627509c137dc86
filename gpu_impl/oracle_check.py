"""The numerics check, written once: an FA3 output against the float64 oracle (NaN where the oracle has none, FA3's
tolerance rule), with the findings' invariants, messages and evidence.

Every path that checks an output for NaN or compares it with the oracle calls it: a scenario's decode and extend
steps (``gpu_impl.scenario``), rank 0 of a multi-process run (``gpu_impl.rank_verdict``), vLLM's call under the
checking shim (``gpu_impl.engines.vllm.numerics``), one kernel-level call (``fa3verify.kernel_cases``), sglang's rank
runner in the engine's process (``gpu_impl.engines.sglang.rank`` records :func:`nan_rows`, the driver reports
:func:`engine_nan_finding`), gpu-check's real-GPU recorders (``fa3verify.gpu_check.fuzz_cases`` and
``worked_example``: :func:`nan_rows`, :func:`nan_message`, :func:`closeness`, :func:`mismatch_message`) and the
sanitizer's GPU stage (``fa3verify.sanitize.gpu_stage``: :func:`all_finite`).
``tests/robustness/test_numerics_check_once.py`` finds any other NaN or closeness check in the packages.
The oracle and the rule are refmodel's (``refmodel.attention``, ``refmodel.tolerance``: ``reference_outputs``,
``fa3_output_close``, which follow FA3's own tests); this module only decides which finding a mismatch is.

Findings (``spec.finding.Finding``, not yet located in a run: the caller adds its step, DP rank and its detail):

- ``NO_NAN``: the output has NaN in some rows where the oracle has none (the rows, the first
  :data:`ROWS_SHOWN` in the message, the first :data:`ROWS_KEPT` in ``detail["rows"]``);
- ``MATCHES_ORACLE``: the largest error exceeds FA3's bound (``detail``: ``max_error``, ``bound``, and with
  ``error_rows`` the rows past the bound);
- on one kernel call (:func:`compare_call`) also ``MASKED_ROW_LSE``: a fully masked row's LSE is not -inf, and the
  NaN check covers the LSE too.
"""

from __future__ import annotations

from typing import Optional

import torch

from refmodel.tolerance import fa3_output_close
from spec.finding import Finding

__all__ = ["compare_output", "compare_call", "nan_rows", "nan_message", "engine_nan_finding", "all_finite",
           "closeness", "mismatch_message", "ROWS_SHOWN", "ROWS_KEPT", "NO_NAN", "MATCHES_ORACLE", "MASKED_ROW_LSE"]

NO_NAN, MATCHES_ORACLE, MASKED_ROW_LSE = "NO_NAN", "MATCHES_ORACLE", "MASKED_ROW_LSE"
#: Rows named in a NO_NAN message, and kept in its detail.
ROWS_SHOWN, ROWS_KEPT = 8, 32


def nan_rows(out: torch.Tensor) -> list:
    """The distinct first-dimension indices (rows, or tokens) of ``out`` that hold a NaN, sorted."""
    return sorted({int(i) for i in torch.nonzero(torch.isnan(out.float()))[:, 0].tolist()})


def all_finite(out: torch.Tensor) -> bool:
    """True when every element of ``out`` is finite (no NaN, no infinity)."""
    return bool(torch.isfinite(out.float()).all())


def nan_message(rows: list) -> str:
    """The sentence naming an output's NaN rows (the first :data:`ROWS_SHOWN`)."""
    return f"NaN in output rows {rows[:ROWS_SHOWN]}"


def engine_nan_finding(rows: list) -> Finding:
    """``NO_NAN`` for real rows of an engine's attention output that held NaN in one step on one rank (sglang's rank
    runner on the emulator: no oracle there, so any NaN in a real row is one); ``detail``: the first
    :data:`ROWS_KEPT` rows."""
    return Finding(NO_NAN, message=f"NaN in the attention output of real rows {rows[:ROWS_SHOWN]} (FA3's numerics "
                                   f"on the emulator, with the metadata the backend passed)",
                   detail={"rows": rows[:ROWS_KEPT]})


def closeness(out: torch.Tensor, exact: torch.Tensor, low: torch.Tensor, softcap: float = 0.0) -> tuple:
    """(ok, max error, bound): ``out`` against the oracle under FA3's rule (``refmodel.tolerance.fa3_output_close``;
    ``out`` may live on the GPU: the rule compares on the CPU)."""
    return fa3_output_close(out, exact, low, softcap=softcap)


def mismatch_message(err: float, bound: float) -> str:
    """The sentence of an output outside FA3's tolerance of the oracle."""
    return f"max error {err:.3e} exceeds FA3's bound {bound:.3e}"


def _closeness(out: torch.Tensor, exact: torch.Tensor, low: torch.Tensor, softcap: float,
               error_rows: bool) -> Optional[Finding]:
    ok, err, bound = closeness(out, exact, low, softcap=softcap)
    if ok:
        return None
    detail = {"max_error": err, "bound": bound}
    if error_rows:
        rows = ((out.double().cpu() - exact).abs().amax(dim=(1, 2)) > bound).nonzero()[:, 0].tolist() \
            if out.shape == exact.shape else []
        detail["rows"] = rows[:ROWS_KEPT]
    return Finding(MATCHES_ORACLE, message=mismatch_message(err, bound), detail=detail)


def compare_output(out: torch.Tensor, exact: torch.Tensor, low: torch.Tensor, softcap: float = 0.0,
                   nan_check: bool = True, error_rows: bool = False) -> Optional[Finding]:
    """The first way ``out`` misses the oracle (``exact``, float64, and ``low``, the low-precision reference of FA3's
    rule): ``NO_NAN`` (with ``nan_check``) when it has NaN rows where ``exact`` has none, else ``MATCHES_ORACLE``
    when it misses the tolerance (``error_rows``: the rows past the bound in its detail); None when it matches.
    Without ``nan_check`` a NaN output is a closeness miss (the extend path's comparison, as it always was)."""
    if nan_check and torch.isnan(out.float()).any() and not torch.isnan(exact).any():
        bad = nan_rows(out)
        return Finding(NO_NAN, message=f"{nan_message(bad)} where the oracle has none",
                       detail={"rows": bad[:ROWS_KEPT]})
    return _closeness(out, exact, low, softcap, error_rows)


def compare_call(out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor, ref_lse: torch.Tensor,
                 exact: torch.Tensor, low: torch.Tensor) -> list:
    """Every way one kernel-level call's output and LSE miss the oracle (``ref_out``/``ref_lse``: exact attention
    in float64; ``exact``/``low``: FA3's rule's references), in this order: ``NO_NAN`` (NaN in the output or the
    LSE where the oracle has none), ``MASKED_ROW_LSE``, ``MATCHES_ORACLE`` (NaN read as 0)."""
    found = []
    out_f, lse_f = out.float(), lse.float()
    if (torch.isnan(out_f).any() and not torch.isnan(ref_out).any()) or \
            (torch.isnan(lse_f).any() and not torch.isnan(ref_lse).any()):
        found.append(Finding(NO_NAN, message=f"NaN in the output ({int(torch.isnan(out_f).sum())}) or LSE "
                                             f"({int(torch.isnan(lse_f).sum())}) where the oracle has none"))
    masked = torch.isneginf(ref_lse)
    if masked.any() and not bool(torch.isneginf(lse_f[masked]).all()):
        bad = lse_f[masked][~torch.isneginf(lse_f[masked])]
        found.append(Finding(MASKED_ROW_LSE,
                             message=f"{bad.numel()} fully masked row(s) have LSE {bad[:3].tolist()} instead of -inf"))
    close = _closeness(torch.nan_to_num(out), exact, low, 0.0, False)
    if close is not None:
        found.append(close)
    return found
