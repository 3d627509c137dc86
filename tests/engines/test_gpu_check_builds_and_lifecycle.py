"""The GPU run's checks of the model, on CPU: what each judges and that each can fail.

* fidelity per FA3 build: refmodel's side is the build the adapter's FA3 is judged as; an adapter judged as the wrong
  build is caught (negative control);
* vLLM's FA3 build: the varlen, paged form its library runs, the op's keyword arguments from its schema, a missing
  or broken library refused with the reason, never a traceback;
* the metadata's life across launches: the predictions (semaphore reset, skipped tiles, stale heads in a graph
  replay) and the judge of observations, with observations that contradict the model caught;
* the emulator against the kernel: which outcomes count as a sound call;
* ``scripts/prepare_fa3_builds.py``: a vLLM wheel's FA3 files packed byte for byte, a wheel without them refused.
"""

import io
import json
import lzma
import os
import sys
import tarfile
import types
import zipfile

import pytest
import torch

from fa3verify.fidelity import adapter_build, run_fidelity
from fa3verify.gpu_check import emulator_stage, lifecycle_stage
from fa3verify.gpu_check.plan import make_plan
from gpu_impl.errors import KernelUnavailable
from gpu_impl.kernels import load
from gpu_impl.kernels.call_model import CallArgs
from gpu_impl.kernels.fa3_vllm import VllmFA3Kernel, find_vllm_fa3, op_kwargs, varlen_paged_form
from refmodel import fa3_builds
from refmodel.fa3_scheduler import get_num_splits
from spec.finding import DeviceOutcome

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VLLM_BUILD = fa3_builds.build_for_engine("vllm", "0.34.0")


# -- fidelity per build ------------------------------------------------------------------------------------------

def test_fidelity_judges_an_adapter_as_its_own_build():
    emulated = load("emulated", device="cpu", num_sm=132)
    assert adapter_build(emulated) == fa3_builds.UPSTREAM
    report = run_fidelity(emulated, 12, seed=3)
    assert report.build == fa3_builds.UPSTREAM and report.configs == 12 and report.ok


def test_fidelity_catches_an_adapter_judged_as_the_wrong_build():
    """Negative control: upstream's metadata judged as vLLM's build (another layout) must mismatch."""
    emulated = load("emulated", device="cpu", num_sm=132)
    emulated.build = VLLM_BUILD
    report = run_fidelity(emulated, 12, seed=3, probe_split=False)
    assert report.build == VLLM_BUILD and report.metadata_mismatches > 0


# -- vLLM's FA3 build ---------------------------------------------------------------------------------------------

def test_varlen_paged_form_of_a_batch_call_over_a_contiguous_cache():
    q = torch.zeros(3, 2, 8, 64)
    k = torch.zeros(3, 100, 2, 64)
    args = varlen_paged_form(CallArgs(q=q, k_cache=k, v_cache=k, cache_seqlens=torch.tensor([5, 6, 7])))
    assert tuple(args.q.shape) == (6, 8, 64) and args.max_seqlen_q == 2
    assert args.cu_seqlens_q.tolist() == [0, 2, 4, 6]
    assert args.page_table.tolist() == [[0], [1], [2]] and args.k_cache is k
    assert args.cache_seqlens.tolist() == [5, 6, 7]
    full = varlen_paged_form(CallArgs(q=q, k_cache=k, v_cache=k))
    assert full.cache_seqlens.tolist() == [100, 100, 100]


def test_varlen_paged_form_keeps_a_call_that_is_already_varlen_and_paged():
    q = torch.zeros(5, 8, 64)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    table = torch.tensor([[1, 0], [2, 3]], dtype=torch.int32)
    k = torch.zeros(4, 16, 2, 64)
    args = CallArgs(q=q, k_cache=k, v_cache=k, cache_seqlens=torch.tensor([20, 30]), page_table=table,
                    cu_seqlens_q=cu, max_seqlen_q=3)
    out = varlen_paged_form(args)
    assert out.q is q and out.cu_seqlens_q is cu and out.page_table is table and out.max_seqlen_q == 3


def test_op_kwargs_name_every_argument_from_the_schema():
    schema = [("q", False), ("k_new", False), ("num_splits", False), ("pack_gqa", True)]
    kw = op_kwargs(schema, {"q": 1, "num_splits": 0})
    assert kw == {"q": 1, "num_splits": 0, "k_new": None}
    with pytest.raises(KernelUnavailable, match="attention_chunk"):
        op_kwargs(schema, {"q": 1, "attention_chunk": 4})


def _effective(build, q, k, cs):
    kernel = object.__new__(VllmFA3Kernel)
    kernel.build, kernel.num_sm, kernel.arch = build, 132, 90
    return kernel.effective_call_inputs(q, k, k, cache_seqlens=cs, causal=True)


def test_vllm_call_is_scheduled_as_the_varlen_paged_call_of_its_build():
    q = torch.zeros(8, 1, 32, 128, dtype=torch.bfloat16)
    k = torch.zeros(8, 4096, 4, 128, dtype=torch.bfloat16)
    cs = torch.full((8,), 4000, dtype=torch.int32)
    inputs = _effective(VLLM_BUILD, q, k, cs)
    assert inputs.build == VLLM_BUILD and inputs.varlen_q and inputs.page_size == 4096
    assert inputs.seqlen_k == 4096 and inputs.total_q == 8 and get_num_splits(inputs) >= 1


def test_vllm_fa3_refused_with_the_reason(tmp_path, monkeypatch):
    with pytest.raises(KernelUnavailable, match="vllm/vllm_flash_attn"):
        find_vllm_fa3(str(tmp_path))
    if not torch.cuda.is_available():
        with pytest.raises(KernelUnavailable, match="CUDA is not available"):
            VllmFA3Kernel()
    # a laid-out folder whose library does not load: FA3_AVAILABLE False, its reason passed on
    pkg = tmp_path / "vllm-9.9.9" / "vllm" / "vllm_flash_attn"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "flash_attn_interface.py").write_text("FA3_AVAILABLE = False\nFA3_UNAVAILABLE_REASON = 'no library'\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        with pytest.raises(KernelUnavailable, match="no library"):
            find_vllm_fa3(str(tmp_path / "vllm-9.9.9"))
    finally:
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            del sys.modules[name]


def test_plan_refuses_a_build_folder_without_a_laid_out_build(tmp_path):
    from fa3verify.errors import UsageError

    args = types.SimpleNamespace(dry_run=False, fidelity_configs=None, fuzz_budget_s=None, total_budget_s=None,
                                 workers=1, seed=0, fa3_build=[str(tmp_path)])
    with pytest.raises(UsageError, match="--fa3-build"):
        make_plan(args)
    pkg = tmp_path / "vllm" / "vllm_flash_attn"
    pkg.mkdir(parents=True)
    plan = make_plan(args)
    assert [a["name"] for a in plan.fidelity_adapters] == ["fa3", "fa3-vllm"]
    assert plan.fidelity_adapters[1]["options"] == {"root": str(tmp_path)}


# -- the metadata's life across launches ----------------------------------------------------------------------------

def _schedule_and_values(batch, width, lens, heads=(32, 4)):
    emulated = load("emulated", device="cpu", num_sm=132)
    q = torch.zeros(batch, 1, 32, 128, dtype=torch.bfloat16)
    k = torch.zeros(batch, width, 4, 128, dtype=torch.bfloat16)
    cs = torch.tensor(lens, dtype=torch.int32)
    md = emulated.get_scheduler_metadata(batch, 1, width, heads[0], heads[1], 128, cs, causal=True)
    from gpu_impl.kernels.base import call_schedule, call_shape

    schedule = call_schedule(call_shape(q, k, k, cs), CallArgs(q=q, k_cache=k, v_cache=k, causal=True), 132, 90)
    return q, k, schedule, [int(x) for x in md.tolist()]


def test_lifecycle_predictions_reset_and_skipped_tiles():
    _, _, schedule, values = _schedule_and_values(lifecycle_stage.MANY_BATCH, lifecycle_stage.MANY_WIDTH,
                                                  lifecycle_stage.MANY_LENS)
    fresh = lifecycle_stage.predict_launch(values, schedule, 0, 132)
    stale = lifecycle_stage.predict_launch(values, schedule, 8, 132)
    assert fresh["tiles"] > 132, "the stale-semaphore shape must have more tiles than SMs, or nothing is skipped"
    assert fresh["semaphore_after"] == 0 and fresh["skipped_tiles"] == 0
    assert stale["semaphore_after"] == 0 and stale["skipped_tiles"] == 8


def test_lifecycle_graph_predictions_stale_heads_violate_recomputed_do_not():
    q, k, _, values = _schedule_and_values(8, lifecycle_stage.WIDTH, lifecycle_stage.LENS_B)
    assert lifecycle_stage.plan_violations(q, k, k, lifecycle_stage.LENS_B, values, 132, 90) == []
    q, k, _, pre_fix = _schedule_and_values(8, lifecycle_stage.WORKED_WIDTH, lifecycle_stage.WORKED_LENS,
                                            heads=lifecycle_stage.PRE_FIX_HEADS)
    assert "SPLIT_BOUND" in lifecycle_stage.plan_violations(q, k, k, lifecycle_stage.WORKED_LENS, pre_fix, 132, 90)


def test_lifecycle_judge_and_its_negative_controls():
    ok = {"name": "x", "predicted": {"semaphore_after": [0, 0], "output_correct": True},
          "observed": {"semaphore_after": [0, 0], "output_correct": True, "nan": False}}
    assert lifecycle_stage.judge_observation(ok) is True
    left = dict(ok, observed={"semaphore_after": [0, 57], "output_correct": True})
    assert lifecycle_stage.judge_observation(left) is False           # the semaphore was not reset
    wrong = dict(ok, observed={"semaphore_after": [0, 0], "output_correct": False})
    assert lifecycle_stage.judge_observation(wrong) is False          # a launch the model calls correct was not
    assert lifecycle_stage.judge_observation({"name": "x", "error": "boom"}) is None
    assert lifecycle_stage.judge_observation(dict(ok, observed={"output_correct": True})) is None


def test_a_crashed_replay_agrees_only_where_the_model_predicts_a_violation():
    crash = lifecycle_stage.crash_observation("graph_heads", "died", "illegal memory access", 132)
    assert "SPLIT_BOUND" in crash["violations"] and lifecycle_stage.judge_observation(crash) is True
    other = lifecycle_stage.crash_observation("reuse", "died", "illegal memory access", 132)
    assert lifecycle_stage.judge_observation(other) is None


def test_the_dry_run_skips_the_stages_that_need_a_gpu():
    for module in (lifecycle_stage, emulator_stage):
        stage = types.SimpleNamespace(status=None, message="", expectation="", numbers={})
        module.run(types.SimpleNamespace(plan=types.SimpleNamespace(dry_run=True)), stage)
        assert stage.status == "skipped" and "dry run" in stage.message


# -- the emulator against the kernel ----------------------------------------------------------------------------------

def test_soundness_of_each_outcome():
    assert emulator_stage.soundness(DeviceOutcome.AGREES) is True
    for bad in (DeviceOutcome.NAN, DeviceOutcome.CRASH, DeviceOutcome.MISMATCH):
        assert emulator_stage.soundness(bad) is False
    assert emulator_stage.soundness(DeviceOutcome.ERROR) is None
    assert emulator_stage.soundness(DeviceOutcome.NOT_RUN) is None
    assert {g for g, _ in emulator_stage.CASES} == {"pre-fix", "fixed"}


# -- laying out the builds ----------------------------------------------------------------------------------------------

def _load_prepare():
    import importlib.util

    spec = importlib.util.spec_from_file_location("prepare_fa3_builds", os.path.join(REPO, "scripts",
                                                                                     "prepare_fa3_builds.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_prepare_packs_the_vllm_fa3_files_byte_for_byte(tmp_path):
    prep = _load_prepare()
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    payload = {f: f"bytes of {f}".encode() for f in prep.VLLM_FILES}
    with zipfile.ZipFile(wheel, "w") as zf:
        for f, data in payload.items():
            zf.writestr(f, data)
        zf.writestr("vllm/__init__.py", b"import everything")
    entry = prep.pack_vllm(str(wheel), "9.9.9", str(tmp_path / "out"))
    archive = tmp_path / "out" / "vllm-9.9.9.tar.xz"
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(archive.read_bytes()))) as tar:
        names = sorted(tar.getnames())
        assert names == sorted(f"vllm-9.9.9/{f}" for f in prep.VLLM_FILES)
        for f, data in payload.items():
            assert tar.extractfile(f"vllm-9.9.9/{f}").read() == data
    assert set(entry["files"]) == set(prep.VLLM_FILES)
    json.dumps(entry)
    bare = tmp_path / "bare.whl"
    with zipfile.ZipFile(bare, "w") as zf:
        zf.writestr("vllm/__init__.py", b"")
    with pytest.raises(RuntimeError, match="_vllm_fa3_C"):
        prep.pack_vllm(str(bare), "9.9.9", str(tmp_path / "out"))


# -- the GPU machine has no z3 ----------------------------------------------------------------------------------------

GPU_RUN_IMPORTS = ("fa3verify.commands.gpu_check", "fa3verify.gpu_check.stages", "fa3verify.gpu_check.worked_example",
                   "fa3verify.gpu_check.fuzz_cases", "fa3verify.fidelity", "gpu_impl.backend", "gpu_impl.kernels.fa3",
                   "gpu_impl.kernels.fa3_vllm", "gpu_impl.kernels.emulated", "fa3verify.sanitize")


def test_the_gpu_run_imports_and_collects_without_z3(tmp_path):
    import subprocess

    blocker = tmp_path / "z3"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('z3 is not installed on the GPU machine')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\n"
    ok = subprocess.run([sys.executable, "-c", code, *GPU_RUN_IMPORTS], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    collect = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "tests/gpu"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert collect.returncode == 0, collect.stdout[-2000:] + collect.stderr[-2000:]
    # negative control: the blocker does block (a module that needs z3 fails to import under it)
    bad = subprocess.run([sys.executable, "-c", code, "spec.theorems.edges"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "not installed on the GPU machine" in bad.stderr


@pytest.mark.parametrize("arg", [["--fidelity-budget-s", "nan"], ["--fuzz-budget-s", "nan"],
                                 ["--total-budget-s", "inf"], ["--fidelity-budget-s", "0"]])
def test_the_module_entry_point_refuses_a_budget_that_is_no_finite_positive_number(arg, capsys):
    """``python -m fa3verify.commands.gpu_check`` (the GPU machine's entry point when the CLI cannot load) checks the
    CLI's shared ranges before anything runs: exit 2 naming the option (it once ran NaN budgets to an inconclusive)."""
    from fa3verify.commands import gpu_check

    assert gpu_check.main(["--dry-run", *arg]) == 2
    assert arg[0] in capsys.readouterr().err
