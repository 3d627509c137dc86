"""gpu-check's fuzz stage writes its failing cases in the one case schema (fa3verify.case/1), so `replay` reads them.

Negative control: a seeded defect (``graph-metadata-before-padding``, applied by the stage's workers from outside)
makes a known configuration (six rows under CUDA graph, padded to a graph batch of eight) fail in the stage; its
case file carries the defect, replays as STILL FAILS, and passes when replayed without it. The stage is given that
one configuration instead of its random ones (one in about 40 of the dry run's cases is such a batch).
"""

import json
import types

import pytest

from fa3verify.cli import main

DEFECT = "graph-metadata-before-padding"


def _failing_case():
    from fa3verify.strategies import FuzzCase
    from gpu_impl.config import MODELS, ServerConfig

    server = ServerConfig(tp_size=1, page_size=1, cuda_graph=True, num_sm=132, context_length=1024)
    return FuzzCase(server=server, model=MODELS["llama-2-7b"], numerics=True, seed=1205089176,
                    steps=({"mode": "decode", "seq_lens": [123, 60, 174, 239, 363, 183], "extend_lens": None},))


@pytest.fixture(scope="module")
def fuzz_stage_run(tmp_path_factory):
    from fa3verify.gpu_check import fuzz_stage
    from fa3verify.gpu_check.plan import make_plan
    from fa3verify.gpu_check.runner import GpuCheck, Stage
    from fa3verify.gpu_check.tasks import worker_init
    from fa3verify.workers import WorkerPool

    out = tmp_path_factory.mktemp("gpu-check-cases")
    args = types.SimpleNamespace(dry_run=True, fidelity_configs=None, fuzz_budget_s=2.0, total_budget_s=None,
                                 workers=1, seed=0)
    plan = make_plan(args)
    check = GpuCheck(plan, out_dir=str(out), skip={"gpu_tests"}, defects=[DEFECT])
    stage = Stage("fuzz")
    mp = pytest.MonkeyPatch()
    import fa3verify.strategies as strategies

    mp.setattr(strategies, "gpu_decode_case", lambda rng, **kw: _failing_case())
    check.pool = WorkerPool(1, init=worker_init, init_args=(1,), timeout_s=plan.fuzz_case_timeout_s)
    try:
        fuzz_stage.run(check, stage)
    finally:
        check.pool.close()
        mp.undo()
    return check, stage


def test_a_failing_fuzz_case_is_written_as_a_replayable_case(fuzz_stage_run, capsys):
    from spec.model.cases import SCHEMA, Case

    check, stage = fuzz_stage_run
    assert stage.status == "fail" and stage.numbers["failures"] >= 1, (stage.message, stage.numbers)
    finding = next(f for f in check.findings if f["stage"] == "fuzz")
    path = f"{check.out_dir}/{finding['case_file']}"
    data = json.loads(open(path).read())
    assert data["schema"] == SCHEMA and data["defects"] == [DEFECT]
    case = Case.load(path)
    assert case.kernel == {"name": "emulated", "mode": "gpu-like"} and case.policy["guard"] == "fixed"
    assert case.batches[0]["seq_lens"] == [123, 60, 174, 239, 363, 183]
    assert case.expected["detail"]["gpu_check"]["outcome"] == finding["kind"]
    assert main(["replay", path]) == 1
    assert "STILL FAILS" in capsys.readouterr().out
    # the same case without its seeded defect passes: the failure is the defect's
    assert main(["replay", path, "--without-defects"]) == 0



class _TimingOutPool:
    """A pool whose every task misses its deadline (the worker killed), as a hung kernel launch would."""

    def run_many(self, tasks, timeout_s):
        from fa3verify.workers import WorkerResult

        for i, _task in enumerate(tasks):
            yield i, WorkerResult(ok=False, crashed=True, kind="timeout", exitcode=-9, worker_pid=12345,
                                  error_text=f"no answer within {timeout_s:.1f}s: worker 12345 killed")


def test_a_fuzz_case_past_its_deadline_is_inconclusive_not_a_crash_finding(tmp_path, monkeypatch):
    from fa3verify.gpu_check import fuzz_stage
    from fa3verify.gpu_check.plan import make_plan
    from fa3verify.gpu_check.runner import GpuCheck, Stage
    import fa3verify.strategies as strategies

    args = types.SimpleNamespace(dry_run=True, fidelity_configs=None, fuzz_budget_s=2.0, total_budget_s=None,
                                 workers=1, seed=0)
    check = GpuCheck(make_plan(args), out_dir=str(tmp_path), skip={"gpu_tests"})
    stage = Stage("fuzz")
    monkeypatch.setattr(strategies, "gpu_decode_case", lambda rng, **kw: _failing_case())
    check.pool = _TimingOutPool()
    fuzz_stage.run(check, stage)
    assert stage.status == "inconclusive", (stage.status, stage.message)
    assert stage.numbers["timeouts"] >= 1 and stage.numbers["failures"] == 0 and stage.numbers["crashes"] == 0
    assert "past their deadline" in stage.message
    assert not [f for f in check.findings if f["stage"] == "fuzz"] and not check.case_files
