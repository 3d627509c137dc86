"""Python API mirroring the command line, for projects that call fa3-verify from their own code or tests.

    from fa3verify import api

    result = api.gate(guard="mypkg.attention.backend:should_disable", budget_s=20, seed=0)
    assert result.passed, result.report()

Every function validates its arguments first and raises :class:`fa3verify.errors.UsageError` (a
``ValueError``) naming the argument and what is allowed; the CLI turns the same errors into exit code 2.
Results carry the :class:`~fa3verify.summary.RunSummary` the CLI prints and writes with ``--json``; their findings
are the project's one finding type, :class:`spec.finding.Finding` (``api.Finding`` is that class, kept as a name
for API users) with ``case``, the case file's JSON, filled in.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Union

from . import exitcodes
from .errors import UsageError
from .policy import METADATA_HEADS, Policy
from .summary import Finding, RunSummary, verdict_line, write_json, write_junit

__all__ = ["Finding", "RunResult", "GateResult", "ReplayResult", "gate", "prove", "fuzz", "replay", "UsageError",
           "DEFAULT_CASES_DIR"]

DEFAULT_CASES_DIR = "fa3verify-out/cases"
KERNELS = ("emulated", "fa3")

GuardLike = Union[str, Callable[[Any], Any]]


def _read_case(path: Optional[str]) -> Optional[dict]:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class RunResult:
    """The outcome of one run: verdict ("pass" | "fail" | "inconclusive"), exit code, checks and findings."""

    verdict: str
    exit_code: int
    checks: list
    findings: list
    summary: RunSummary

    @classmethod
    def from_summary(cls, summary: RunSummary, **extra) -> "RunResult":
        findings = [dataclasses.replace(f, case=_read_case(f.case_file)) for f in summary.findings]
        return cls(verdict=summary.verdict, exit_code=summary.exit_code, checks=list(summary.checks),
                   findings=findings, summary=summary, **extra)

    @property
    def passed(self) -> bool:
        return self.exit_code == exitcodes.PASS

    @property
    def failed_checks(self) -> list:
        return [c for c in self.checks if c.failed]

    def to_dict(self) -> dict:
        """The run summary's JSON (schema fa3verify.run/1), with each finding's case file inlined."""
        data = self.summary.to_dict()
        data["findings"] = [f.api_dict() for f in self.findings]
        return data

    def report(self) -> str:
        """A plain-text report: the verdict line, every failed or inconclusive check, every finding."""
        lines = [verdict_line(self.summary)]
        for c in self.checks:
            if c.failed or c.inconclusive:
                lines.append(f"  {c.verdict.upper():<13} {c.name}: {c.message}"
                             + (f" (case file {c.case_file})" if c.case_file else ""))
        if self.findings:
            lines.append("findings:")
            lines += [f"  {f}" for f in self.findings]
        return "\n".join(lines)

    def write_json(self, path: str) -> None:
        write_json(self.summary, path)

    def write_junit(self, path: str) -> None:
        write_junit(self.summary, path)


@dataclass
class GateResult(RunResult):
    """The gate's outcome (prove + fuzz for one policy)."""


@dataclass
class ReplayResult(RunResult):
    """A replay's outcome; ``still_fails`` is True when the case fails the way its file says."""

    still_fails: bool = False
    observed: Any = field(default=None, repr=False)


# ------------------------------------------------------------------------------------------------
# Argument validation
# ------------------------------------------------------------------------------------------------


def _policy(guard: GuardLike, metadata_heads: str, keep_stale_cp_metadata: bool) -> Policy:
    from .policy import load_policy

    if not isinstance(keep_stale_cp_metadata, bool):
        raise UsageError(f"keep_stale_cp_metadata: must be a bool, got {keep_stale_cp_metadata!r}")
    if metadata_heads not in METADATA_HEADS:
        raise UsageError(f"metadata_heads: must be one of {', '.join(METADATA_HEADS)}, got {metadata_heads!r}")
    if callable(guard):
        module, qualname = getattr(guard, "__module__", None), getattr(guard, "__qualname__", None)
        if not module or not qualname or "<" in qualname:
            raise UsageError(f"guard: a callable guard must be a module-level function (case files record it as "
                             f"module:function for replay), got {guard!r}")
        return Policy(guard_spec=f"{module}:{qualname}", guard=guard, metadata_heads=metadata_heads,
                      clear_stale_cp_metadata=not keep_stale_cp_metadata)
    if not isinstance(guard, str):
        raise UsageError(f"guard: must be a spec string ('fixed', 'pre-fix', 'none', module:function, "
                         f"file.py:function) or a callable, got {type(guard).__name__}")
    try:
        return load_policy(guard, metadata_heads, keep_stale_cp_metadata)
    except UsageError as exc:
        raise UsageError(str(exc).replace("--guard", "guard", 1).replace("--metadata-heads", "metadata_heads", 1)) \
            from None


def _budget(budget_s: Optional[float], cases: Optional[int]) -> tuple:
    if cases is not None:
        if isinstance(cases, bool) or not isinstance(cases, int) or cases < 1:
            raise UsageError(f"cases: must be an integer >= 1, got {cases!r}")
        return None, cases
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s > 0:
        raise UsageError(f"budget_s: must be a number > 0 (or give cases=N), got {budget_s!r}")
    return float(budget_s), None


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UsageError(f"{name}: must be a number > 0, got {value!r}")
    return float(value)


def _seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError(f"seed: must be an integer >= 0, got {seed!r}")
    return seed


def _kernel(kernel: str, device: str) -> None:
    if kernel not in KERNELS:
        raise UsageError(f"kernel: must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if not isinstance(device, str) or not device:
        raise UsageError(f"device: must be a torch device string such as 'cpu' or 'cuda', got {device!r}")


def _cases_dir(cases_dir: Any) -> str:
    if not isinstance(cases_dir, str) or not cases_dir:
        raise UsageError(f"cases_dir: must be a non-empty path string, got {cases_dir!r}")
    return cases_dir


# ------------------------------------------------------------------------------------------------
# The entry points
# ------------------------------------------------------------------------------------------------


def gate(guard: GuardLike = "fixed", metadata_heads: str = "tp", keep_stale_cp_metadata: bool = False,
         budget_s: Optional[float] = 20.0, seed: int = 0, cases: Optional[int] = None, timeout_s: float = 10.0,
         cases_dir: str = DEFAULT_CASES_DIR, kernel: str = "emulated", device: str = "cpu",
         show_progress: bool = False) -> GateResult:
    """``fa3verify gate``: prove every theorem and fuzz the backend under one policy.

    `guard` is a spec ("fixed", "pre-fix", "none", "package.module:function", "path/file.py:function") or a
    module-level callable ``guard(server_args) -> bool``. `budget_s` bounds the fuzz stage (its cases, shrinking
    and case files; the proofs come before it); `cases` (a case count) replaces it and reads no clock, so the same
    `cases` and `seed` save the same case files on any machine.
    """
    from gpu_impl.engines.model.sut import ModelSUT

    from .commands.gate import gate as run_gate

    policy = _policy(guard, metadata_heads, keep_stale_cp_metadata)
    budget, max_cases = _budget(budget_s, cases)
    timeout = _positive("timeout_s", timeout_s)
    _kernel(kernel, device)
    summary = run_gate(ModelSUT(policy=policy), budget_s=budget, seed=_seed(seed), timeout_s=timeout,
                       cases_dir=_cases_dir(cases_dir), kernel_name=kernel, device=device, max_cases=max_cases,
                       show_progress=show_progress)
    return GateResult.from_summary(summary)


def prove(guard: GuardLike = "fixed", metadata_heads: str = "tp", keep_stale_cp_metadata: bool = False,
          timeout_s: float = 10.0, cases_dir: str = DEFAULT_CASES_DIR, only: Optional[Iterable[str]] = None,
          drop_assumptions: Iterable[str] = ()) -> RunResult:
    """``fa3verify prove``: the z3 theorems for one policy (a solver timeout is inconclusive, never proved)."""
    from .commands.prove import prove as run_prove

    policy = _policy(guard, metadata_heads, keep_stale_cp_metadata)
    timeout = _positive("timeout_s", timeout_s)
    if isinstance(only, str):
        only = [only]
    dropped = [drop_assumptions] if isinstance(drop_assumptions, str) else list(drop_assumptions)
    if dropped:
        from spec.model.domain import assumption_name_error

        message = assumption_name_error(dropped, "drop_assumptions")
        if message:
            raise UsageError(message)
    summary = run_prove(policy, timeout_s=timeout, cases_dir=_cases_dir(cases_dir), only=only,
                        dropped_assumptions=dropped)
    return RunResult.from_summary(summary)


def fuzz(guard: GuardLike = "fixed", metadata_heads: str = "tp", keep_stale_cp_metadata: bool = False,
         budget_s: Optional[float] = 20.0, seed: int = 0, cases: Optional[int] = None,
         kernel: str = "emulated", device: str = "cpu", out_dir: str = DEFAULT_CASES_DIR,
         show_progress: bool = False) -> RunResult:
    """``fa3verify fuzz``: a seeded differential fuzz campaign; each distinct violation saved as a case file.

    `budget_s` bounds the whole campaign, shrinking and case files included; `cases` replaces it with a case count
    (no clock: the same case files on any machine)."""
    from gpu_impl.engines.model.sut import ModelSUT

    from .commands.fuzz import fuzz as run_fuzz

    policy = _policy(guard, metadata_heads, keep_stale_cp_metadata)
    budget, max_cases = _budget(budget_s, cases)
    _kernel(kernel, device)
    if not isinstance(out_dir, str) or not out_dir:
        raise UsageError(f"out_dir: must be a non-empty path string, got {out_dir!r}")
    summary = run_fuzz(ModelSUT(policy=policy), kernel_name=kernel, device=device, seed=_seed(seed), budget_s=budget,
                       max_cases=max_cases, out_dir=out_dir, show_progress=show_progress)
    return RunResult.from_summary(summary)


def replay(path: str, kernel: Optional[str] = None, device: str = "cpu", guard: Optional[str] = None,
           metadata_heads: Optional[str] = None, keep_stale_cp_metadata: Optional[bool] = None,
           numerics: Optional[bool] = None) -> ReplayResult:
    """``fa3verify replay``: run a case file again; ``still_fails`` (and verdict "fail") when it fails as recorded."""
    import os

    from .commands.replay import replay as run_replay

    if not isinstance(path, (str, os.PathLike)):
        raise UsageError(f"path: must be a case file path, got {path!r}")
    if not os.path.isfile(path):
        raise UsageError(f"path: no such case file: {os.fspath(path)}")
    if kernel is not None:
        _kernel(kernel, device)
    if metadata_heads is not None and metadata_heads not in METADATA_HEADS:
        raise UsageError(f"metadata_heads: must be one of {', '.join(METADATA_HEADS)}, got {metadata_heads!r}")
    if guard is not None and not isinstance(guard, str):
        raise UsageError(f"guard: must be a guard spec string, got {type(guard).__name__}")
    summary, observed = run_replay(os.fspath(path), kernel_name=kernel, device=device, guard=guard,
                                   metadata_heads=metadata_heads, keep_stale=keep_stale_cp_metadata,
                                   numerics=numerics)
    return ReplayResult.from_summary(summary, still_fails=bool(observed.still_fails), observed=observed)
