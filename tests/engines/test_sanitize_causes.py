"""The sanitizer reports the cause: a precompute whose FA3 arguments differ from the call's is reported as
PRECOMPUTE_ARGUMENTS in every mode, whether or not this call overflows, with the worst case computed by refmodel's
split formulas; the device's SM count is read from the device or given; a case the sanitizer writes names the
run's layout (none when unknown); and the CPU example of the pytest flow in docs/sanitize.md runs as typed.

The head-count case is the pre-fix one: precompute (8, 1), call (32, 4), d=128, bf16, page 16, on one rank of
Qwen3-30B-A3B, with a batch of lengths [4000, 100]: S_p = S_c = 28 on 132 SMs, so no split count overflows on
that call. FA3 is the emulated drop-in the example registers with --fa3verify-emulate-fa3 (gpu_impl.emulate_fa3,
132 SMs).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

import fa3verify.sanitize as sanitize
from gpu_impl.fa3_calls import (ARGUMENTS_INVARIANT, CheckingFA3, MetadataMismatch, argument_differences,
                                precompute_schedule, record_call, record_precompute, worst_case)
from refmodel.fa3_scheduler import call_inputs, precompute_inputs, resolve_schedule

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "sanitize"
LAYER, PRE_FIX = (32, 4), (8, 1)
SHORT = [4000, 100]


@pytest.fixture
def example(monkeypatch):
    """The example's directory on sys.path, its module imported afresh over the emulated drop-in FA3 (as
    ``--fa3verify-emulate-fa3`` registers it) in its gpu-like mode, which trusts the metadata it is given as the real
    kernel does, so the sanitizer is the only checker; the sanitizer uninstalled and the drop-in reset after."""
    from gpu_impl import emulate_fa3
    from gpu_impl.kernels import fa3_interface

    monkeypatch.syspath_prepend(str(EXAMPLE))
    for name in ("flash_attn_interface", "test_my_backend"):
        sys.modules.pop(name, None)
    emulate_fa3.install(sgl_kernel=False)
    fa3_interface.configure(mode="gpu-like")
    yield
    sanitize.uninstall()
    fa3_interface.configure()
    for name in ("flash_attn_interface", "test_my_backend"):
        sys.modules.pop(name, None)


def decode(heads, lens=SHORT):
    import test_my_backend

    return test_my_backend.MyBackend(heads).decode(lens)


# ----------------------------------------------------------------------------------------------------------
# The cause, in every mode, whether or not the call overflows
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("deep", [False, True], ids=["quick", "deep"])
def test_the_pre_fix_head_counts_are_reported_on_a_batch_that_does_not_overflow(example, tmp_path, deep):
    s = sanitize.install(mode="raise", deep=deep, out_dir=tmp_path / "out")
    decode(LAYER)                                                     # negative control: equal arguments
    assert s.checker.events[-1][2] == []
    with pytest.raises(MetadataMismatch) as info:
        decode(PRE_FIX)
    err = info.value
    assert [v.invariant for v in err.violations] == [ARGUMENTS_INVARIANT]   # no overflow on this call
    (v,) = err.violations
    diffs = {d["argument"]: (d["precompute"], d["call"]) for d in v.detail["differences"]}
    assert diffs == {"num_heads": (8, 32), "num_heads_k": (1, 4)}
    w = v.detail["worst_case"]
    assert (w["s_p"], w["s_c"], w["overflows"]) == (28, 28, False)
    assert w["first_overflow"] == {"longest": 4368, "s_p": 30, "s_c": 29}
    assert "num_heads 8 vs 32, num_heads_k 1 vs 4" in str(err) and "4368 tokens" in str(err)
    pair = next((tmp_path / "out").glob("pair-precompute_arguments-*.json"))
    assert not (tmp_path / "out" / "cases").exists()                 # no overflow to replay on the model
    from fa3verify.cli import main

    assert main(["sanitize", "replay", str(pair)]) == 1


def test_warn_and_record_report_the_cause_once_per_difference_whatever_the_lengths(example, tmp_path):
    s = sanitize.install(mode="warn", out_dir=tmp_path / "out")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for lens in ([4000, 100], [3000, 100], [2000, 50]):
            decode(PRE_FIX, lens)
        decode(LAYER, [3000, 100])
    assert len([w for w in caught if ARGUMENTS_INVARIANT in str(w.message)]) == 1
    assert len(s.checker.violations()) == 3 and len(list((tmp_path / "out").glob("pair-*.json"))) == 1
    sanitize.uninstall()
    s = sanitize.install(mode="record", out_dir=tmp_path / "rec")
    decode(PRE_FIX)
    log = s.log.path
    sanitize.uninstall()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["violations"][0]["invariant"] for x in lines if x["type"] == "violation"] == [ARGUMENTS_INVARIANT]


def test_an_overflowing_call_names_the_overflow_first_and_the_cause_after(example, tmp_path):
    sanitize.install(mode="raise", out_dir=tmp_path / "out")
    with pytest.raises(MetadataMismatch) as info:
        decode(PRE_FIX, [32768, 100, 100, 100])
    names = [v.invariant for v in info.value.violations]
    assert names == ["SPLIT_BOUND", ARGUMENTS_INVARIANT]
    assert "S_p=109 S_c=29" in str(info.value) and "cause: the scheduler metadata was precomputed" in str(info.value)
    assert info.value.violations[1].detail["worst_case"]["overflows"] is True


def test_the_checker_without_causes_keeps_its_old_verdicts():
    """CheckingFA3's default (the engine drivers') is unchanged: only the sanitizer asks for causes."""
    pre, call = pair(PRE_FIX)
    for causes, want in ((False, []), (True, [ARGUMENTS_INVARIANT])):
        checker = CheckingFA3(None, mode="record", report_causes=causes)
        md = torch.zeros(call.metadata_numel, dtype=torch.int32)
        checker.registry.remember(md, pre)
        assert [v.invariant for v in checker.check(call, md)[1]] == want


# ----------------------------------------------------------------------------------------------------------
# Which arguments count, on records (no sanitizer): each kind caught, and the engines' practice not flagged
# ----------------------------------------------------------------------------------------------------------


def pair(heads=LAYER, lens=SHORT, page=16, pre_kw=None, call_kw=None, width=None, q_dtype=torch.bfloat16):
    b = len(lens)
    cs = torch.tensor(lens, dtype=torch.int32)
    pre = record_precompute(**{"batch_size": b, "max_seqlen_q": 1, "max_seqlen_k": max(lens), "num_heads_q": heads[0],
                               "num_heads_kv": heads[1], "headdim": 128, "cache_seqlens": cs, "page_size": page,
                               "causal": True, **(pre_kw or {})})
    pages = width or -(-max(lens) // page)
    size = precompute_schedule(pre).metadata_size
    q = torch.zeros(b, 1, 32, 128, dtype=q_dtype)
    k = torch.zeros(b * pages, page, 4, 128, dtype=q_dtype)
    call = record_call(q, k, k, **{"cache_seqlens": cs, "page_table": torch.zeros(b, pages, dtype=torch.int32),
                                   "causal": True, "scheduler_metadata": torch.zeros(size, dtype=torch.int32),
                                   **(call_kw or {})})
    return pre, call


@pytest.mark.parametrize("name, kw, want", [
    ("heads", dict(heads=PRE_FIX), {"num_heads", "num_heads_k"}),
    ("page size", dict(pre_kw={"page_size": 64}), {"page_size"}),
    ("num_splits", dict(call_kw={"num_splits": 2}), {"num_splits"}),
    ("batch", dict(pre_kw={"batch_size": 3}), {"batch_size"}),
    ("causal", dict(pre_kw={"causal": False}), {"causal/window_size"}),
    ("window", dict(call_kw={"window_size": (256, 0)}), {"causal/window_size"}),
    ("dtype", dict(pre_kw={"qkv_dtype": torch.float8_e4m3fn}), {"element_size"}),
    ("softcap", dict(pre_kw={"has_softcap": True}), {"has_softcap"}),
    ("pack_gqa", dict(call_kw={"pack_gqa": True}), {"pack_gqa"}),
    ("head dim v", dict(pre_kw={"headdim_v": 64}), {"headdim_v"}),
    ("max_seqlen_k past the call's extent", dict(pre_kw={"max_seqlen_k": 8192}), {"max_seqlen_k"}),
    ("sm_margin", dict(pre_kw={"sm_margin": 4}), {"num_sm"}),
])
def test_each_argument_the_metadata_depends_on_is_reported(name, kw, want):
    pre, call = pair(**kw)
    assert {d["argument"] for d in argument_differences(pre, call)} == want


@pytest.mark.parametrize("name, kw", [
    ("equal arguments", {}),
    ("max_seqlen_k below a page table rounded up to a page", dict(lens=[4001, 100])),
    ("max_seqlen_k below a CUDA graph's page table", dict(width=2048)),
    ("fp16 against bf16: the same element size", dict(q_dtype=torch.float16)),
])
def test_what_the_engines_pass_on_purpose_is_not_a_difference(name, kw):
    pre, call = pair(**kw)
    assert argument_differences(pre, call) == []


def test_a_padded_graph_replay_is_not_a_batch_difference_but_an_eager_call_is():
    pre, call = pair(lens=[4000, 100, 100, 100], pre_kw={"batch_size": 3})      # 3 real rows, a graph of 4
    assert argument_differences(pre, call, replay=True) == []
    assert [d["argument"] for d in argument_differences(pre, call)] == ["batch_size"]


def test_the_worst_case_is_refmodels_split_counts():
    """The scan's answer agrees with refmodel's schedule at that length, and the length before it does not
    overflow; the worked example (32768 tokens) overflows on the call itself."""
    pre, call = pair(PRE_FIX)
    w = worst_case(pre, call)
    L = w["first_overflow"]["longest"]

    def splits(length):
        p = resolve_schedule(precompute_inputs(2, 1, length, 8, 1, 128, page_size=16, causal=True))
        c = resolve_schedule(call_inputs(2, 1, -(-length // 16) * 16, 32, 4, 128, page_size=16, causal=True))
        return p.num_splits, c.num_splits

    assert splits(L) == (w["first_overflow"]["s_p"], w["first_overflow"]["s_c"]) and splits(L)[0] > splits(L)[1]
    assert all(a <= b for a, b in map(splits, range(16, L, 16)))
    big = worst_case(*pair(PRE_FIX, lens=[32768, 100]))
    assert (big["s_p"], big["s_c"], big["overflows"]) == (109, 29, True)
    assert worst_case(*pair(LAYER))["first_overflow"] is None       # equal arguments never overflow


# ----------------------------------------------------------------------------------------------------------
# CUDA graphs: a stale capture is reported at capture; a fresh padded replay is not
# ----------------------------------------------------------------------------------------------------------


def test_a_capture_with_the_pre_fix_heads_is_reported_at_capture_and_a_fresh_padded_replay_passes(example, tmp_path):
    s = sanitize.install(mode="record", out_dir=tmp_path / "out")
    import flash_attn_interface as fa3

    capturing = [False]
    s.checker.capturing = lambda: capturing[0]
    buf = torch.zeros(1 + 8 * 4, dtype=torch.int32)
    q = torch.zeros(8, 1, 32, 128, dtype=torch.bfloat16)
    k = torch.zeros(8 * 64, 16, 4, 128, dtype=torch.bfloat16)
    pt = torch.arange(8 * 64, dtype=torch.int32).reshape(8, 64)

    def recompute(heads, lens):
        md = fa3.get_scheduler_metadata(batch_size=len(lens), max_seqlen_q=1, max_seqlen_k=max(lens),
                                        num_heads_q=heads[0], num_heads_kv=heads[1], headdim=128,
                                        cache_seqlens=torch.tensor(lens, dtype=torch.int32), page_size=16, causal=True)
        buf[:md.numel()] = md
        buf[md.numel():] = 0
        return buf[:md.numel()]

    for heads in (LAYER, PRE_FIX):
        capturing[0] = True
        md = recompute(heads, [1] * 8)
        fa3.flash_attn_with_kvcache(q, k, k, cache_seqlens=torch.ones(8, dtype=torch.int32), page_table=pt,
                                    causal=True, scheduler_metadata=md)
        capturing[0] = False
        recompute(heads, [1000, 100, 100, 100, 100])               # 5 real rows in the graph of 8
        s.checker.captured.clear()
    events = [(e[1].batch_size, [v.invariant for v in e[2]]) for e in s.checker.events]
    assert events == [(8, []), (8, []), (8, [ARGUMENTS_INVARIANT]), (8, [ARGUMENTS_INVARIANT])]
    assert s.checker.graph_padded == 2


# ----------------------------------------------------------------------------------------------------------
# The SM count: read from the device, or given (validated), 132 on the CPU and said so
# ----------------------------------------------------------------------------------------------------------


def test_on_the_cpu_the_sm_count_is_132_and_the_status_says_why(example, tmp_path):
    s = sanitize.install(mode="record", out_dir=tmp_path / "out")
    assert "not read yet" in s.status()["num_sm_source"]
    decode(LAYER)
    st = s.status()
    assert st["num_sm"] == 132 and "not on a CUDA device" in st["num_sm_source"]


def test_the_sm_count_is_read_from_a_cuda_tensors_device(monkeypatch):
    class OnCuda(torch.Tensor):
        is_cuda = property(lambda self: True)
        device = property(lambda self: torch.device("cuda", 1))

    props = types.SimpleNamespace(multi_processor_count=78, major=9, minor=0, name="NVIDIA H20")
    seen = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: seen.append(i) or props)
    checker = CheckingFA3(None, mode="record")
    checker._settle_device((torch.zeros(2, dtype=torch.int32).as_subclass(OnCuda),), {})
    assert (checker.num_sm, checker.arch, seen) == (78, 90, [1])
    assert checker.num_sm_source == "read from cuda:1 (NVIDIA H20)"
    given = CheckingFA3(None, mode="record", num_sm=100)
    given._settle_device((torch.zeros(2).as_subclass(OnCuda),), {})
    assert given.num_sm == 100 and given.num_sm_source == "given"


def test_a_given_sm_count_is_used_and_a_bad_one_refused_naming_where_it_came_from(example, tmp_path, monkeypatch):
    s = sanitize.install(mode="record", out_dir=tmp_path / "out", num_sm=16)
    decode(LAYER)
    assert s.checker.events[-1][1].num_sm == 16 and s.status()["num_sm_source"] == "given (num_sm=)"
    sanitize.uninstall()
    monkeypatch.setenv(sanitize.ENV_NUM_SM, "78")
    assert sanitize.install(mode="record", out_dir=tmp_path / "o2").status()["num_sm"] == 78
    sanitize.uninstall()
    for value, name in ((0, "num_sm"), ("many", "num_sm"), (2000, "num_sm")):
        with pytest.raises(ValueError, match=f"^{name}: must be an integer from 1 to 1024"):
            sanitize.install(mode="record", out_dir=tmp_path / "o3", num_sm=value)
    monkeypatch.setenv(sanitize.ENV_NUM_SM, "abc")
    with pytest.raises(ValueError, match="^FA3VERIFY_SANITIZE_NUM_SM: must be an integer from 1 to 1024"):
        sanitize.install(mode="record", out_dir=tmp_path / "o4")
    assert sanitize.current() is None


def test_the_pytest_option_refuses_a_bad_sm_count_naming_it(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_x.py"),
                          "--fa3verify-sanitize=record", "--fa3verify-sanitize-num-sm=0",
                          "--fa3verify-sanitize-dir", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 4 and "--fa3verify-sanitize-num-sm: must be an integer from 1 to 1024" in out.stderr


# ----------------------------------------------------------------------------------------------------------
# A case the sanitizer writes carries the run's layout, and its replay prints it
# ----------------------------------------------------------------------------------------------------------


def _replay(path) -> str:
    from fa3verify.cli import main
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["replay", str(path)])
    assert code == 1
    return out.getvalue()


def test_a_written_case_names_the_runs_layout_not_the_models_stand_in(example, tmp_path):
    s = sanitize.install(mode="raise", out_dir=tmp_path / "out")
    with pytest.raises(MetadataMismatch) as info:
        decode(PRE_FIX, [32768, 100, 100, 100])
    from fa3verify.sanitize.records import log_to_run_summary

    (finding,) = log_to_run_summary(s.log.path)["findings"]          # `fa3verify report LOG.jsonl` says the same
    assert finding["config"].startswith("run layout: none recorded (the case replays")
    case = json.loads(Path(info.value.case_path).read_text())
    assert case["expected"]["detail"]["run_layout"] is None and case["server"]["tp_size"] == 4
    text = _replay(info.value.case_path)
    assert "run layout: none recorded (the case replays the run's head counts as sanitized-run/tp4/cp4+pcp" in text
    assert "in backend terms: run layout: none recorded" in text
    # negative control: a case without the recorded layout (as written before) names the model's layout alone
    del case["expected"]["detail"]["run_layout"]
    old = tmp_path / "old-case.json"
    old.write_text(json.dumps(case))
    assert "run layout" not in _replay(old) and "in backend terms: sanitized-run/tp4/cp4+pcp" in _replay(old)


def test_a_run_under_torch_distributed_records_its_world(tmp_path):
    import torch.distributed as dist

    from fa3verify.sanitize.records import run_layout

    assert run_layout() is None
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        assert run_layout() == "torch.distributed world 1, rank 0"
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------------
# The CPU example of docs/sanitize.md, run exactly as the docs say
# ----------------------------------------------------------------------------------------------------------


def docs_command() -> str:
    text = (REPO / "docs" / "sanitize.md").read_text()
    (line,) = [x.strip() for x in text.splitlines()
               if "examples/sanitize/test_my_backend.py" in x and x.strip().startswith(".venv/bin/")]
    return line


def test_the_docs_example_fails_on_the_pre_fix_heads_and_passes_on_the_layers(tmp_path):
    command = docs_command()
    assert command == (".venv/bin/python -m pytest --fa3verify-emulate-fa3 --fa3verify-sanitize=raise "
                       "examples/sanitize/test_my_backend.py")
    argv = shlex.split(command)
    if not (REPO / argv[0]).exists():                  # a checkout whose tests run from another environment
        argv[0] = sys.executable
    env = {k: v for k, v in os.environ.items() if k not in ("FA3VERIFY_SANITIZE_DIR", "PYTEST_ADDOPTS")}
    env["FA3VERIFY_SANITIZE_DIR"] = str(tmp_path / "out")
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert re.search(r"FAILED examples/sanitize/test_my_backend.py::test_decode_with_heads_divided_by_tp", text)
    assert "1 failed, 1 passed" in text and "PRECOMPUTE_ARGUMENTS" in text
    assert "num_heads 8 vs 32, num_heads_k 1 vs 4" in text and "device: 132 SMs, sm90" in text
    # negative control: the same file without the sanitizer is green -- the bug stays hidden on these lengths
    plain = subprocess.run([argv[0], "-m", "pytest", "--fa3verify-emulate-fa3", "examples/sanitize/test_my_backend.py"], cwd=REPO,
                           capture_output=True, text=True, timeout=300, env=env)
    assert plain.returncode == 0 and "2 passed" in plain.stdout, plain.stdout + plain.stderr


def test_the_start_hook_refuses_a_bad_sm_count_before_anything_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "FA3VERIFY_SANITIZE": "raise", "FA3VERIFY_SANITIZE_NUM_SM": "0"}
    out = subprocess.run([sys.executable, "-c", "import fa3verify.sanitize.hook as h; h.start(); print('ran')"],
                         env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and "ran" not in out.stdout
    assert "FA3VERIFY_SANITIZE_NUM_SM: must be an integer from 1 to 1024" in out.stderr
    env["FA3VERIFY_SANITIZE_NUM_SM"] = "78"                           # a good value: the hook starts
    ok = subprocess.run([sys.executable, "-c", "import fa3verify.sanitize.hook as h; h.start(); print('ran')"],
                        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout.strip() == "ran", ok.stderr


def test_a_call_that_reads_no_per_batch_metadata_has_no_cause():
    """Without cache_seqlens the call runs no prepare step and reads none of md's vectors (quick_check's rule):
    different arguments cannot matter there; the same pair with cache_seqlens is reported."""
    from gpu_impl.fa3_calls import argument_check

    pre, call = pair(PRE_FIX)
    assert [v.invariant for v in argument_check(pre, call)] == [ARGUMENTS_INVARIANT]
    q = torch.zeros(2, 1, 32, 128, dtype=torch.bfloat16)
    k = torch.zeros(2, 4000, 4, 128, dtype=torch.bfloat16)
    dense = record_call(q, k, k, causal=True, scheduler_metadata=torch.zeros(17, dtype=torch.int32))
    assert argument_differences(pre, dense) and argument_check(pre, dense) == []
