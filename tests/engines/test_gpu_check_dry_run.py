"""`scripts/gpu_check.sh --dry-run`: the GPU run's whole plumbing on CPU (emulated kernel), so CI covers it.

One full dry run (about a minute on two cores) is shared by the assertions on its summary; the rest are fast
checks of the pieces (no GPU -> exit 3 with a message, bad arguments -> 2, output parsers, fuzz cases).
"""

import json
import os
import subprocess
import sys

import pytest

from fa3verify.commands import gpu_check

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRY_RUN_TOTAL_BUDGET_S = 900


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("gpu-check")
    out_dir, copied = base / "run", base / "OUT"
    copied.mkdir()
    env = dict(os.environ, OUT=str(copied), PYTHON=sys.executable)
    # The total budget is the run's own deadline: the default dry run's 150 s ran out before the fuzz stage on a
    # 2-core machine at load 10, so the suite gives it room (every stage still runs; each has its own budget).
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", "--out", str(out_dir), "--total-budget-s",
                           str(DRY_RUN_TOTAL_BUDGET_S)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=DRY_RUN_TOTAL_BUDGET_S + 300)
    summary = json.loads((out_dir / gpu_check.SUMMARY_NAME).read_text())
    return proc, summary, out_dir, copied


def test_dry_run_passes_and_writes_the_summary(dry_run):
    proc, summary, out_dir, copied = dry_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert summary["schema"] == gpu_check.SCHEMA and summary["dry_run"] is True
    assert summary["verdict"] == "pass" and summary["exit_code"] == 0
    assert set(summary["stages"]) == set(gpu_check.STAGE_NAMES)
    for name, stage in summary["stages"].items():
        assert stage["status"] in ("pass", "skipped"), (name, stage)
        assert stage["seconds"] >= 0 and stage["expectation"]
    assert summary["elapsed_s"] < summary["plan"]["total_budget_s"]
    # the summary, the log and the case files come back through $OUT
    assert (copied / gpu_check.SUMMARY_NAME).exists() and (copied / "gpu_check.log").exists()
    assert (copied / "gpu_check_cases.tar.gz").exists() and (copied / "gpu_tests.xml").exists()
    assert "verdict: PASS" in proc.stdout


def test_dry_run_environment_is_printed_and_recorded(dry_run):
    proc, summary, _, _ = dry_run
    env = summary["environment"]
    assert env["torch"] and env["python"] and env["cuda_available"] in (True, False)
    assert "fa3" in env and "compute_sanitizer" in env
    assert "FA3 module:" in proc.stdout and "GPU:" in proc.stdout and "torch" in proc.stdout


def test_dry_run_numbers(dry_run):
    _, summary, out_dir, _ = dry_run
    st = summary["stages"]
    fid = st["fidelity"]
    assert fid["configs"] == fid["configs_requested"] >= 20
    assert fid["metadata_mismatches"] == 0 and fid["split_mismatches"] == 0 and fid["errors"] == 0
    assert fid["split_checked"] == fid["configs"]
    fuzz = st["fuzz"]
    assert fuzz["cases"] >= 1 and fuzz["failures"] == 0 and fuzz["crashes"] == 0 and fuzz["cases_per_s"] > 0
    we = st["worked_example"]
    assert we["pre_fix_outcome"] == "nan" and we["fixed_outcome"] == "agrees"
    pre = we["pre_fix"]
    assert pre["predicted_violations"] == ["SPLIT_BOUND"] and pre["nan_batches"] == [0]
    assert max(pre["metadata_splits_read"]) > pre["s_c"]          # the overflow, in numbers: 11 splits, S_c = 4
    assert we["fixed"]["max_error"] <= we["fixed"]["bound"] and not we["fixed"]["precomputed"]
    iso = st["crash_isolation"]
    assert iso["crash_kind"] == "died" and iso["next_task_ok"]
    tests = st["gpu_tests"]
    assert tests["failures"] == 0 and tests["errors"] == 0 and tests["skipped"] == tests["tests"]
    assert st["sanitizer"]["status"] == "skipped"
    # the pre-fix NaN is a finding with a case file
    pre_findings = [f for f in summary["findings"] if f["kind"] == "pre-fix:nan"]
    assert pre_findings and (out_dir / pre_findings[0]["case_file"]).exists()


def test_without_a_gpu_the_real_run_is_inconclusive_with_a_message(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run([sys.executable, "-m", "fa3verify", "gpu-check", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "no CUDA GPU visible" in proc.stderr and "--dry-run" in proc.stdout
    summary = json.loads((tmp_path / gpu_check.SUMMARY_NAME).read_text())
    assert summary["verdict"] == "inconclusive" and summary["error"] and summary["stages"] == {}


def test_bad_arguments_exit_2(tmp_path, capsys):
    from fa3verify.cli import main

    for args in (["--fidelity-configs", "0"], ["--fuzz-budget-s", "-1"], ["--total-budget-s", "5"],
                 ["--workers", "0"]):
        assert main(["gpu-check", "--dry-run", "--out", str(tmp_path), *args]) == 2
        assert args[0] in capsys.readouterr().err
    # the module's own entry point (used when the CLI cannot load) checks the same way
    assert gpu_check.main(["--dry-run", "--fidelity-configs", "0"]) == 2
    assert "--fidelity-configs" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing ran


def test_memcheck_and_junit_parsers(tmp_path):
    text = ("========= Invalid __global__ write of size 4 bytes\n=========     at flash_fwd_kernel\n"
            "========= ERROR SUMMARY: 57 errors\n")
    parsed = gpu_check.parse_memcheck(text)
    assert parsed["errors"] == 57 and parsed["first_errors"][0].startswith("Invalid __global__ write")
    assert gpu_check.parse_memcheck("========= ERROR SUMMARY: 0 errors")["errors"] == 0
    assert gpu_check.parse_memcheck("Segmentation fault")["errors"] is None
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2">'
                   '<testcase classname="a" name="t"><failure message="boom"/></testcase></testsuite></testsuites>')
    assert gpu_check.junit_counts(str(xml)) == {"tests": 5, "failures": 1, "errors": 0, "skipped": 2, "passed": 2}
    assert gpu_check.junit_failures(str(xml)) == ["a::t: failure: boom"]
    assert gpu_check.junit_counts(str(tmp_path / "missing.xml"))["tests"] is None


def test_worked_example_expectations():
    exp = gpu_check.worked_expected
    assert exp("pre-fix", {"outcome": "nan"}) and exp("pre-fix", {"outcome": "crash"})
    assert exp("pre-fix", {"outcome": "mismatch"}) and exp("pre-fix", {"outcome": "agrees"}) is False
    assert exp("fixed", {"outcome": "agrees"}) and exp("fixed", {"outcome": "nan"}) is False
    assert exp("fixed", {"outcome": "crash"}) is False and exp("fixed", {"outcome": "error"}) is None


def test_fuzz_cases_are_seeded_valid_configurations():
    from gpu_impl.config import ServerConfig, get_model, is_valid_config

    cases = [gpu_check.random_fuzz_case(0, i, 132, 16384, (4096, 32768)) for i in range(200)]
    assert cases[:3] == [gpu_check.random_fuzz_case(0, i, 132, 16384, (4096, 32768)) for i in range(3)]
    for c in cases:
        server = ServerConfig.from_dict(c["server"])
        assert is_valid_config(get_model(c["model"]), server)
        assert 1 <= min(c["seq_lens"]) and max(c["seq_lens"]) <= min(16384, server.context_length)
    assert any(ServerConfig.from_dict(c["server"]).attn_cp_size > 1 for c in cases)
    assert any(c["server"]["enable_dp_attention"] for c in cases)
    assert any(max(c["seq_lens"]) > 8192 for c in cases)


def test_dry_run_sanitizer_stage_refuses_the_stale_metadata(dry_run):
    _, summary, out_dir, _ = dry_run
    st = summary["stages"]["fa3_sanitize"]
    assert st["status"] == "pass"
    assert st["stale"]["caught"] and st["stale"]["invariant"] == "SPLIT_BOUND"
    assert st["fresh"]["finite"] and st["fresh"]["violations"] == 0 and st["restored"]
    assert st["kernel_call_us"] > 0 and "overhead_us" in st
    assert st["stale"]["case_file"] and os.path.exists(st["stale"]["case_file"])
