"""fa3verify bench: the performance figures, each a ratio or a count measured side by side.

1. time to first failure for the pre-fix guard: median over seeds, fuzz alone and prove alone;
2. fuzz throughput (cases/s) at the default scenario mix, and the share of time in oracle/emulator/harness;
3. proof suite wall time, total and per theorem;
4. oracle cost: FA3-semantics combine vs a plain logsumexp combine, and oracle attention vs plain PyTorch;
5. on a GPU with FA3: the real kernel's time per call vs the harness's overhead per case (skipped elsewhere).

Bars are reported next to each figure; they are never asserted in tests.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import pstats
import resource
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

from ..outputs import write_output
from ..policy import load_policy
from . import fuzz as fuzzing
from . import prove as proving  # the work functions are looked up at call time (a test stands in for them)

#: the bars for prove: every theorem under 5 s on 2 cores, the pre-fix refutation under 2 s
BARS = {
    "prove_total_s": ("<", 5.0),
    "prove_max_theorem_s": ("<", 10.0),
    "ttf_prove_median_s": ("<", 2.0),
    "ttf_fuzz_median_s": ("<", 20.0),
    "fuzz_cases_per_s": (">=", 200.0),
    "combine_ratio": ("<=", 1.5),
    "sanitize_overhead_us": ("<", 20.0),
}

#: FA3's own combine sweep (hopper/test_flash_attn.py test_flash_attn_combine).
COMBINE_SWEEP = (1, 2, 3, 5, 17, 32, 55, 97, 133)


@dataclass
class Figure:
    """One benchmark figure, the command that reproduces it, and its bar if it has one."""

    name: str
    value: float
    unit: str
    command: str
    bar: Optional[str] = None
    holds: Optional[bool] = None
    detail: dict = field(default_factory=dict)


def _bar(name: str, value: float) -> tuple[Optional[str], Optional[bool]]:
    if name not in BARS:
        return None, None
    op, limit = BARS[name]
    holds = value < limit if op == "<" else value <= limit if op == "<=" else value >= limit
    return f"{op} {limit:g}", bool(holds)


def figure(name: str, value: float, unit: str, command: str, **detail) -> Figure:
    bar, holds = _bar(name, value)
    return Figure(name, float(value), unit, command, bar, holds, detail)


def bench_prove() -> list[Figure]:
    """Proof suite wall time under the fixed guard, total and per theorem, and the CPU time it used.

    The CPU figure (this process and its reaped prove workers, user + system) has no bar: on a shared machine it
    says how much of the wall time was the run's own work; the load average at the start is in its detail.
    """

    def cpu() -> float:
        return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                       resource.getrusage(resource.RUSAGE_CHILDREN)))

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cpu0 = cpu()
    summary = proving.prove(load_policy("fixed"), cases_dir=None)
    cpu_s = cpu() - cpu0
    per = {c.name: round(c.seconds, 3) for c in summary.checks}
    return [figure("prove_total_s", summary.elapsed_s, "s", "fa3verify prove", per_theorem=per),
            figure("prove_max_theorem_s", max(per.values(), default=0.0), "s", "fa3verify prove"),
            figure("prove_cpu_s", cpu_s, "s", "fa3verify prove (CPU: this process and its workers)",
                   load_average_1min=load)]


def bench_time_to_first_failure(seeds=(0, 1, 2, 3, 4), fuzz_budget_s: float = 30.0) -> list[Figure]:
    """Median time to the first failure of the pre-fix guard, for prove alone and for fuzz alone."""
    from gpu_impl.kernels import load


    policy = load_policy("pre-fix")
    prove_times = []
    for _ in seeds:
        s = proving.prove(policy, cases_dir=None, only=["hazard"])
        prove_times.append(s.first_failure_s if s.first_failure_s is not None else math.inf)
    kernel = load("emulated", mode="strict")
    fuzz_times = []
    for seed in seeds:
        camp = fuzzing.run_campaign(policy, kernel, seed=seed, budget_s=fuzz_budget_s, stop_at_first_failure=True)
        fuzz_times.append(min((f.found_at_s for f in camp.failures.values()), default=math.inf))
    return [figure("ttf_prove_median_s", statistics.median(prove_times), "s",
                   "fa3verify prove --guard pre-fix --only hazard", samples=prove_times),
            figure("ttf_fuzz_median_s", statistics.median(fuzz_times), "s",
                   "fa3verify fuzz --guard pre-fix --seed S (S = 0..4)", samples=fuzz_times)]


def bench_fuzz_throughput(budget_s: float = 10.0, seed: int = 0) -> list[Figure]:
    """Cases per second at the default mix under the fixed guard; then a profiled run splits the time."""
    from gpu_impl.kernels import load


    kernel, policy = load("emulated", mode="strict"), load_policy("fixed")
    camp = fuzzing.run_campaign(policy, kernel, seed=seed, budget_s=budget_s)
    profiler = cProfile.Profile()
    profiler.enable()
    profiled = fuzzing.run_campaign(policy, kernel, seed=seed + 1, budget_s=budget_s / 2)
    profiler.disable()
    return [figure("fuzz_cases_per_s", camp.cases / camp.elapsed, "cases/s",
                   f"fa3verify fuzz --budget-s {budget_s:g}", cases=camp.cases,
                   shares=time_shares(profiler, profiled.elapsed))]


def time_shares(profiler: cProfile.Profile, total: float) -> dict:
    """Share of the time in the oracle (refmodel), the emulator (gpu_impl.kernels), spec; the rest is harness.

    A function's cumulative time is counted when none of its callers is in the same bucket (top-level calls),
    so nested calls are not counted twice. Case generation and scenario plumbing fall in the harness share.
    """
    stats = pstats.Stats(profiler)
    roots = {"oracle(refmodel)": "/refmodel/", "emulator(gpu_impl.kernels)": "/gpu_impl/kernels/",
             "spec": "/spec/"}
    buckets = dict.fromkeys(roots, 0.0)
    for (filename, _, _), (_, _, _, cumtime, callers) in stats.stats.items():
        for bucket, root in roots.items():
            if root in filename and not any(root in c[0] for c in callers):
                buckets[bucket] += cumtime
    total = max(total, 1e-9)
    out = {k: round(min(v / total, 1.0), 3) for k, v in buckets.items()}
    out["harness(rest)"] = round(max(0.0, 1.0 - sum(out.values())), 3)
    return out


def plain_logsumexp_combine(out_partial: torch.Tensor, lse_partial: torch.Tensor):
    """A plain PyTorch combine: softmax weights over splits via logsumexp (the baseline users would write)."""
    import torch

    lse = torch.logsumexp(lse_partial, dim=0)
    w = torch.exp(lse_partial - lse.unsqueeze(0))
    return (w.unsqueeze(-1) * out_partial).sum(0), lse


def _timeit(fn, repeat: int = 7) -> float:
    fn()
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def bench_oracle_cost(batch: int = 2, seqlen: int = 256, heads: int = 8, dv: int = 128) -> list[Figure]:
    """Combine and attention oracle cost relative to plain PyTorch, over FA3's combine sweep sizes."""
    from refmodel.combine import flash_attn_combine

    import torch

    gen = torch.Generator().manual_seed(0)
    ratios = {}
    for s in COMBINE_SWEEP:
        op = torch.randn((s, batch, seqlen, heads, dv), generator=gen)
        lp = torch.randn((s, batch, seqlen, heads), generator=gen)
        ours = _timeit(lambda: flash_attn_combine(op, lp))
        plain = _timeit(lambda: plain_logsumexp_combine(op, lp))
        ratios[s] = round(ours / plain, 3)
    worst = max(ratios.values())
    attn_ratio = _attention_ratio(gen)
    return [figure("combine_ratio", worst, "x", "fa3verify bench (oracle cost)", per_splits=ratios),
            figure("attention_oracle_ratio", attn_ratio, "x", "fa3verify bench (oracle cost)")]


def _attention_ratio(gen) -> float:
    from refmodel.attention import attention

    import torch

    q = torch.randn((4, 16, 8, 128), generator=gen)
    k = torch.randn((4, 1024, 2, 128), generator=gen)
    v = torch.randn((4, 1024, 2, 128), generator=gen)

    def plain():
        kk = k.repeat_interleave(4, dim=2).transpose(1, 2)
        vv = v.repeat_interleave(4, dim=2).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), kk, vv)

    return _timeit(lambda: attention(q, k, v), repeat=3) / _timeit(plain, repeat=3)


def run_all(quick: bool = False) -> list[Figure]:
    """Every figure, with torch on one thread as the fuzzer runs it; `quick` shortens budgets and seeds."""

    with fuzzing.single_threaded_torch():
        return _run_all(quick)


def bench_sanitize_overhead(calls: int = 2000) -> list[Figure]:
    """Host overhead of the runtime sanitizer per checked FA3 call (fa3verify.sanitize.overhead)."""
    from ..sanitize.overhead import measure_overhead  # imports torch


    m = measure_overhead(calls=calls)
    cmd = "fa3verify bench (sanitizer overhead)"
    detail = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in m.items()}
    return [figure("sanitize_overhead_us", m["overhead_quick_us"], "us", cmd, **detail),
            figure("sanitize_overhead_first_call_us", m["overhead_quick_first_us"], "us", cmd),
            figure("sanitize_overhead_deep_us", m["overhead_deep_us"], "us", cmd),
            figure("sanitize_overhead_precompute_us", m["overhead_precompute_us"], "us", cmd)]


def _run_all(quick: bool) -> list[Figure]:
    figs = []
    figs += bench_prove()
    figs += bench_time_to_first_failure(seeds=(0, 1) if quick else (0, 1, 2, 3, 4),
                                        fuzz_budget_s=10.0 if quick else 30.0)
    figs += bench_fuzz_throughput(budget_s=2.0 if quick else 10.0)
    figs += bench_oracle_cost()
    figs += bench_sanitize_overhead(calls=500 if quick else 2000)
    return figs


def to_markdown(figs: list[Figure]) -> str:
    """The docs/performance.md table."""
    lines = ["| figure | value | bar | holds | command |", "|---|---|---|---|---|"]
    for f in figs:
        holds = "" if f.holds is None else ("yes" if f.holds else "**no**")
        lines.append(f"| {f.name} | {f.value:.3g} {f.unit} | {f.bar or ''} | {holds} | `{f.command}` |")
    return "\n".join(lines)


def to_json(figs: list[Figure]) -> list[dict]:
    return [asdict(f) for f in figs]

HELP = "measure the suite: time to first failure, fuzz throughput, proof time, oracle cost"
EPILOG = """\
Every figure is a ratio measured side by side or a count, so it holds on a noisy machine. Bars from the
performance issue are printed next to the figures; a missed bar is reported, not hidden.

examples:
  fa3verify bench                      # all figures, table on stdout
  fa3verify bench --json bench.json --markdown docs/performance-table.md
  fa3verify bench --quick              # shorter budgets, two seeds
"""


def register(sub) -> None:
    p = sub.add_parser("bench", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="shorter budgets and fewer seeds")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the figures as a Markdown table")
    p.set_defaults(func=run)


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    figs = run_all(quick=args.quick)
    table = Table(title="fa3verify bench")
    for col in ("figure", "value", "bar", "holds", "command"):
        table.add_column(col)
    for f in figs:
        holds = "" if f.holds is None else ("[green]yes[/green]" if f.holds else "[red]no[/red]")
        table.add_row(f.name, f"{f.value:.3g} {f.unit}", f.bar or "", holds, f.command)
    Console().print(table)
    for f in figs:
        if f.detail:
            print(f"{f.name}: {json.dumps(f.detail)}")

    if args.json:
        write_output(args.json, json.dumps(to_json(figs), indent=2), "--json")
    if args.markdown:
        write_output(args.markdown, to_markdown(figs) + "\n", "--markdown")
    return 0
