"""fa3verify.commands.bench's prove figures: wall time, the slowest theorem, and the CPU time of the run (no bar)."""

import time

from fa3verify.commands import bench
from fa3verify.commands import prove as proving
from fa3verify.summary import Check, RunSummary


def _stub_prove(busy_cpu_s: float):
    def prove(policy, cases_dir=None, **kw):
        end = time.process_time() + busy_cpu_s
        while time.process_time() < end:  # CPU work the figure must count
            pass
        s = RunSummary(command="prove", policy={})
        s.checks.append(Check(name="t", kind="theorem", verdict="proved", seconds=0.25, failed=False))
        s.elapsed_s = 0.5
        return s
    return prove


def test_the_cpu_figure_counts_the_runs_cpu_time_and_has_no_bar(monkeypatch):
    monkeypatch.setattr(proving, "prove", _stub_prove(0.05))
    figs = {f.name: f for f in bench.bench_prove()}
    assert figs["prove_total_s"].value == 0.5 and figs["prove_max_theorem_s"].value == 0.25
    cpu = figs["prove_cpu_s"]
    assert cpu.value >= 0.05 and cpu.bar is None and cpu.holds is None
    assert "load_average_1min" in cpu.detail


def test_control_an_idle_run_uses_less_cpu_than_a_busy_one(monkeypatch):
    monkeypatch.setattr(proving, "prove", _stub_prove(0.0))
    idle = {f.name: f for f in bench.bench_prove()}["prove_cpu_s"].value
    monkeypatch.setattr(proving, "prove", _stub_prove(0.3))
    busy = {f.name: f for f in bench.bench_prove()}["prove_cpu_s"].value
    assert busy >= 0.3 and busy > idle
