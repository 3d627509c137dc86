"""fa3verify.sanitize over fake FA3 modules backed by the emulator (a 16-SM device, so the shapes stay small).

The scenario is the worked example's shape at CPU size: a layer with H=8, Hk=4 heads (d=128, page size 16), one
1024-token sequence and three of 16. The pre-fix precompute divides the heads by tp=4: (2, 1) -> S_p = 7, while
the call (8, 4) has S_c = 4, and the long sequence gets 7 splits. Every check has a negative control (a stale
precompute caught) and a positive one (the fresh precompute passes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import fa3verify.sanitize as sanitize
from fa3verify.sanitize.records import load_pair
from gpu_impl.fa3_calls import MetadataMismatch
from spec.model.cases import Case

from sanitize_fakes import fakes, forget_fakes, write_fakes  # noqa: F401 - fakes is a fixture

REPO = Path(__file__).resolve().parents[2]
LENS = [1024, 16, 16, 16]
HEADS = (8, 4)
STALE = (2, 1)
BF16 = torch.bfloat16




def tensors(lens=LENS, heads=HEADS, page=16, d=128, width=None):
    gen = torch.Generator().manual_seed(0)
    b = len(lens)
    width = width or -(-max(lens) // page)
    k = torch.randn(b * width, page, heads[1], d, generator=gen).to(BF16)
    v = torch.randn(b * width, page, heads[1], d, generator=gen).to(BF16)
    pt = torch.arange(b * width, dtype=torch.int32).reshape(b, width)
    q = torch.randn(b, heads[0], d, generator=gen).to(BF16)
    return q, k, v, pt, torch.tensor(lens, dtype=torch.int32), torch.arange(b + 1, dtype=torch.int32)


def install(tmp_path, mode="raise", **kw):
    return sanitize.install(mode=mode, out_dir=tmp_path / "out", num_sm=16, **kw)


def run_decode(backend, lens=LENS, via_cache=False, heads=HEADS):
    q, k, v, pt, cs, cu = tensors(lens, heads)
    md = backend.metadata(cs, cu, max(lens), 16)
    return backend.decode(q, k, v, pt, cs, cu, md, via_cache=via_cache)


# ----------------------------------------------------------------------------------------------------------
# Installed before the engine imports FA3 (the import hook)
# ----------------------------------------------------------------------------------------------------------


def test_stale_precompute_is_caught_and_fresh_passes(fakes, tmp_path):
    s = install(tmp_path)
    import fake_backend
    import sgl_kernel.flash_attn as fa

    assert getattr(fa.flash_attn_with_kvcache, "__fa3verify_original__", None) is not None
    assert fake_backend.flash_attn_with_kvcache is fa.flash_attn_with_kvcache
    out = run_decode(fake_backend.Backend(HEADS))
    assert torch.isfinite(out.float()).all() and s.checker.checked_calls == 1
    with pytest.raises(MetadataMismatch, match="SPLIT_BOUND") as info:
        run_decode(fake_backend.Backend(STALE))
    err = info.value
    assert (err.precompute.num_heads, err.precompute.num_heads_k) == STALE
    assert (err.call.num_heads, err.call.num_heads_k) == HEADS
    assert "S_p=7 S_c=4" in str(err) and err.case_path and Path(err.case_path).exists()


def test_the_case_file_replays_and_the_pair_file_reproduces(fakes, tmp_path):
    install(tmp_path)
    import fake_backend

    with pytest.raises(MetadataMismatch) as info:
        run_decode(fake_backend.Backend(STALE))
    case = Case.load(info.value.case_path)
    assert case.server["tp_size"] == 4 and case.server["attn_cp_size"] == 4 and case.server["num_sm"] == 16
    assert case.model["num_heads"] == 8 and case.batches[0]["seq_lens"] == LENS
    assert case.expected["invariant"] == "SPLIT_BOUND"
    pairs = sorted((tmp_path / "out").glob("pair-*.json"))
    assert len(pairs) == 1
    pre, call, recorded = load_pair(pairs[0])
    assert pre.num_heads == 2 and recorded[0]["invariant"] == "SPLIT_BOUND"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    replay = subprocess.run([sys.executable, "-m", "fa3verify", "replay", info.value.case_path], env=env,
                            capture_output=True, text=True, timeout=300)
    assert replay.returncode == 1 and "STILL FAILS" in replay.stdout, replay.stdout + replay.stderr
    again = subprocess.run([sys.executable, "-m", "fa3verify", "sanitize", "replay", str(pairs[0])], env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "deep check: SPLIT_BOUND" in again.stdout, again.stdout + again.stderr


def make_call(kind):
    """(precompute heads, lens at precompute, lens at call, metadata source) for one seeded defect."""
    return {
        "SPLIT_BOUND": (STALE, LENS, LENS),
        "BATCH_PERMUTATION": (HEADS, LENS[:3], LENS),          # 3 sequences precomputed, 4 called (same b4)
        "SHAPE": (HEADS, LENS + [16] * 2, LENS),               # b4 = 8 vs 4
    }[kind]


@pytest.mark.parametrize("invariant", ["SPLIT_BOUND", "BATCH_PERMUTATION", "SHAPE"])
def test_each_quick_check_negative_and_positive_control(fakes, tmp_path, invariant):
    s = install(tmp_path)
    import fake_backend

    heads, pre_lens, call_lens = make_call(invariant)
    q, k, v, pt, cs, cu = tensors(call_lens)
    pcs = torch.tensor(pre_lens, dtype=torch.int32)
    md = fake_backend.Backend(heads).metadata(pcs, torch.arange(len(pre_lens) + 1, dtype=torch.int32),
                                              max(pre_lens), 16)
    with pytest.raises(MetadataMismatch) as info:
        fake_backend.Backend(heads).decode(q, k, v, pt, cs, cu, md)
    assert info.value.violations[0].invariant == invariant
    fresh = fake_backend.Backend(HEADS).metadata(cs, cu, max(call_lens), 16)
    fake_backend.Backend(HEADS).decode(q, k, v, pt, cs, cu, fresh)
    assert s.checker.events[-1][2] == []


def test_query_cover_negative_and_positive_control(fakes, tmp_path):
    install(tmp_path)
    import sgl_kernel.flash_attn as fa

    q, k, v, pt, cs, cu = tensors()
    rows = 80                                                   # 80 rows x qhpk 2 = 160 packed rows: 2 m-blocks
    qs = torch.randn(4, rows, 8, 128).to(BF16)
    stale = fa.get_scheduler_metadata(4, 1, 1024, 8, 4, 128, cs, page_size=16, causal=True, num_splits=1)
    with pytest.raises(MetadataMismatch, match="QUERY_COVER"):
        fa.flash_attn_with_kvcache(qs, k, v, cache_seqlens=cs, page_table=pt, causal=True, scheduler_metadata=stale,
                                   num_splits=1)
    fresh = fa.get_scheduler_metadata(4, rows, 1024, 8, 4, 128, cs, page_size=16, causal=True, num_splits=1)
    out = fa.flash_attn_with_kvcache(qs, k, v, cache_seqlens=cs, page_table=pt, causal=True, scheduler_metadata=fresh,
                                     num_splits=1)
    assert out.shape == qs.shape


def test_metadata_of_unknown_origin_is_reported(fakes, tmp_path):
    import sgl_kernel.flash_attn as fa

    q, k, v, pt, cs, cu = tensors()
    md = fa.get_scheduler_metadata(4, 1, 1024, 8, 4, 128, cs, cu_seqlens_q=cu, page_size=16, causal=True)
    install(tmp_path)                                            # the precompute happened before install
    with pytest.raises(MetadataMismatch, match="METADATA_ORIGIN"):
        fa.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=pt, cu_seqlens_q=cu, max_seqlen_q=1,
                                   causal=True, scheduler_metadata=md)


# ----------------------------------------------------------------------------------------------------------
# Installed late: bindings made before install are replaced, or reported
# ----------------------------------------------------------------------------------------------------------


def test_late_install_rebinds_every_binding_reports_the_rest_and_uninstall_restores(fakes, tmp_path):
    import fake_backend
    import sgl_kernel.flash_attn as fa

    originals = (fa.get_scheduler_metadata, fa.flash_attn_with_kvcache)
    stale = fake_backend.Backend(STALE)                           # instance attribute bound before install
    fake_backend._load_kernels()                                  # kernel cache dict filled before install
    closure = fake_backend._closure_over_the_original()
    with pytest.warns(RuntimeWarning, match="a closure variable of fake_backend._closure_over_the_original.<locals>.precompute"):
        s = install(tmp_path)
    assert stale._get_scheduler_metadata is not originals[0]
    assert fake_backend.flash_attn_with_kvcache is fa.flash_attn_with_kvcache is not originals[1]
    assert fake_backend._KERNELS["flash_attn_with_kvcache"] is fa.flash_attn_with_kvcache
    patched = " | ".join(s.status()["patched_bindings"])
    assert "instance of fake_backend.Backend: _get_scheduler_metadata" in patched
    assert "module fake_backend: flash_attn_with_kvcache" in patched
    assert any("closure" in u for u in s.status()["unreachable"])
    assert any("staticmethod" in u for u in s.status()["unreachable"])
    with pytest.raises(MetadataMismatch, match="SPLIT_BOUND"):
        run_decode(stale, via_cache=True)
    assert closure is not None
    sanitize.uninstall()
    assert (fa.get_scheduler_metadata, fa.flash_attn_with_kvcache) == originals
    assert fa.get_scheduler_metadata is originals[0] and fa.flash_attn_with_kvcache is originals[1]
    assert stale._get_scheduler_metadata is originals[0]
    assert fake_backend.flash_attn_with_kvcache is originals[1]
    assert fake_backend._KERNELS["flash_attn_with_kvcache"] is originals[1]
    assert "copy_" not in torch.Tensor.__dict__ and "__setitem__" not in torch.Tensor.__dict__
    assert sanitize.current() is None and sanitize.status() == {"installed": False}


def test_context_manager_uninstalls_on_exit_and_on_error(fakes, tmp_path):
    import sgl_kernel.flash_attn as fa

    original = fa.flash_attn_with_kvcache
    with sanitize.sanitizing("record", out_dir=tmp_path / "out", num_sm=16) as s:
        assert fa.flash_attn_with_kvcache is not original and s.installed
    assert fa.flash_attn_with_kvcache is original
    with pytest.raises(KeyError):
        with sanitize.sanitizing("raise", out_dir=tmp_path / "out"):
            raise KeyError("boom")
    assert fa.flash_attn_with_kvcache is original and sanitize.current() is None


def test_install_rejects_a_bad_mode_and_a_second_mode(fakes, tmp_path):
    with pytest.raises(ValueError, match="mode: must be one of raise, warn, record"):
        sanitize.install(mode="loud")
    install(tmp_path, "record")
    with pytest.raises(ValueError, match="already installed"):
        install(tmp_path, "raise")
    assert install(tmp_path, "record") is sanitize.current()


# ----------------------------------------------------------------------------------------------------------
# CUDA graphs: a persistent metadata buffer, captured once, recomputed at every replay
# ----------------------------------------------------------------------------------------------------------


def test_cuda_graph_replay_with_a_stale_recompute_is_caught(fakes, tmp_path):
    s = install(tmp_path)
    import fake_backend

    s.checker.report_causes = False     # the replay-time check alone (the cause at capture: engines/test_sanitize_causes.py)
    capturing = [False]
    s.checker.capturing = lambda: capturing[0]
    buf = torch.zeros(1 + 4 * 4, dtype=torch.int32)             # sglang: 1 + round_up(max_bs, 4) * 4 int32
    q, k, v, pt, cs, cu = tensors()                              # page table as wide as the context
    ones = torch.ones(4, dtype=torch.int32)

    def recompute(backend, lens):
        md = backend.metadata(lens, cu, int(lens.max()), 16)
        buf[:md.numel()] = md                                      # sglang's replay: written into the buffer
        buf[md.numel():] = 0
        return buf[:md.numel()]

    for heads, expect in ((HEADS, None), (STALE, "SPLIT_BOUND")):
        backend = fake_backend.Backend(heads)
        capturing[0] = True                                        # capture: seq_len 1 rows
        graph_md = recompute(backend, ones)
        backend.decode(q, k, v, pt, ones, cu, graph_md)
        capturing[0] = False
        assert s.checker.events[-1][2] == []                       # S_p = 1 at capture: nothing to see yet
        if expect is None:
            recompute(backend, cs)                                 # replay with the real lengths: fresh, passes
            assert s.checker.graph_checks >= 1 and s.checker.events[-1][2] == []
        else:
            with pytest.raises(MetadataMismatch, match=expect):
                recompute(backend, cs)                             # the stale recompute, before the replay
        s.checker.captured.clear()


def test_a_padded_graph_replay_is_checked_against_the_larger_captured_call(fakes, tmp_path):
    """Graph captured for 8 rows, replayed with 5 real rows: the recompute (5 sequences, the same b4 = 8 layout)
    is checked against the 8-row captured call -- a stale one is caught, a fresh one passes -- and a recompute
    whose layout differs (3 sequences: b4 = 4) is a silent layout mismatch at a replay (SHAPE)."""
    s = install(tmp_path)
    import fake_backend

    s.checker.report_causes = False     # the replay-time check alone (the cause at capture: engines/test_sanitize_causes.py)
    capturing = [False]
    s.checker.capturing = lambda: capturing[0]
    graph_lens = LENS + [16] * 4                                  # 8 rows at capture
    buf = torch.zeros(1 + 8 * 4, dtype=torch.int32)
    q, k, v, pt, cs8, cu8 = tensors(graph_lens)
    ones, real = torch.ones(8, dtype=torch.int32), torch.tensor(LENS + [16], dtype=torch.int32)

    def recompute(backend, lens):
        cu = torch.arange(len(lens) + 1, dtype=torch.int32)
        md = backend.metadata(lens, cu, int(lens.max()), 16)
        buf[:md.numel()] = md
        buf[md.numel():] = 0                                       # vLLM zeroes the tail
        return buf[:md.numel()]

    for heads, expect in ((HEADS, None), (STALE, "SPLIT_BOUND")):
        backend = fake_backend.Backend(heads)
        capturing[0] = True
        graph_md = recompute(backend, ones)
        backend.decode(q, k, v, pt, ones, cu8, graph_md)
        capturing[0] = False
        checks, padded, unmatched = s.checker.graph_checks, s.checker.graph_padded, s.checker.graph_unmatched
        if expect is None:
            recompute(backend, real)                               # 5 real rows: checked, not skipped
            assert s.checker.events[-1][2] == [] and s.checker.events[-1][1].batch_size == 8
        else:
            with pytest.raises(MetadataMismatch, match=expect) as info:
                recompute(backend, real)
            assert "S_p=7 S_c=4" in str(info.value) and info.value.precompute.batch_size == 5
        assert (s.checker.graph_checks, s.checker.graph_padded) == (checks + 1, padded + 1)
        assert s.checker.graph_unmatched == unmatched
        s.checker.captured.clear()
    backend = fake_backend.Backend(HEADS)
    capturing[0] = True
    backend.decode(q, k, v, pt, ones, cu8, recompute(backend, ones))
    capturing[0] = False
    with pytest.raises(MetadataMismatch, match="SHAPE.*silent layout mismatch"):
        recompute(backend, torch.tensor(LENS[:3], dtype=torch.int32))
    s.checker.captured.clear()
    assert sanitize.status()["graph_padded"] == 3


# ----------------------------------------------------------------------------------------------------------
# Modes: warn once per signature, record JSON lines that `fa3verify report` reads
# ----------------------------------------------------------------------------------------------------------


def test_warn_mode_warns_once_per_signature(fakes, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FA3_GPU_LIKE", "1")
    s = install(tmp_path, "warn")
    import fake_backend

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            run_decode(fake_backend.Backend(STALE))
    assert len([w for w in caught if "SPLIT_BOUND" in str(w.message)]) == 1
    assert len(s.checker.violations()) == 3


def test_record_mode_writes_json_lines_that_report_reads(fakes, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FA3_GPU_LIKE", "1")
    s = install(tmp_path, "record")
    import fake_backend

    run_decode(fake_backend.Backend(STALE))
    run_decode(fake_backend.Backend(HEADS))
    log = s.log.path
    sanitize.uninstall()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["type"] for x in lines][0] == "start" and lines[-1]["type"] == "summary"
    violations = [x for x in lines if x["type"] == "violation"]
    assert len(violations) == 1 and violations[0]["violations"][0]["invariant"] == "SPLIT_BOUND"
    assert lines[-1]["checked_calls"] == 2
    html = tmp_path / "report.html"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "fa3verify", "report", str(log), "--html", str(html)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "SPLIT_BOUND" in html.read_text() and "verdict FAIL" in out.stdout


def test_nothing_is_overwritten(fakes, tmp_path):
    from fa3verify.sanitize.records import new_path

    (tmp_path / "a.jsonl").write_text("mine")
    assert new_path(tmp_path, "a", ".jsonl").name == "a-1.jsonl"
    assert (tmp_path / "a.jsonl").read_text() == "mine"


# ----------------------------------------------------------------------------------------------------------
# Activation without code changes: the .pth hook, a spawned child, pytest
# ----------------------------------------------------------------------------------------------------------

CHILD = r"""
import json, multiprocessing, sys

def child_status():
    import sgl_kernel.flash_attn  # the first FA3 import installs the sanitizer
    import fa3verify.sanitize as s
    st = s.status()
    return {"installed": st["installed"], "mode": st.get("mode"), "wrapped": st.get("wrapped", [])}

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        print(json.dumps(pool.apply(child_status)))
"""


@pytest.fixture
def hooked_venv(tmp_path, fakes):
    """A fresh venv whose only packages are reached through the hook's --add-path lines."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "fa3verify", "sanitize", "install-hook", "--venv", str(venv),
                          "--add-path", str(REPO), "--add-path", site, "--add-path", str(fakes)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    written = Path(out.stdout.split("written: ", 1)[1].splitlines()[0])
    assert written.is_relative_to(venv), written                    # never the environment running the tests
    return venv


def test_env_var_activation_reaches_a_spawned_child(hooked_venv, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(FA3VERIFY_SANITIZE="record", FA3VERIFY_SANITIZE_DIR=str(tmp_path / "out"))
    out = subprocess.run([str(hooked_venv / "bin" / "python"), str(script)], env=env, capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout.strip().splitlines()[-1])
    assert status["installed"] and status["mode"] == "record"
    assert "sgl_kernel.flash_attn.flash_attn_with_kvcache" in status["wrapped"]
    # unset: the hook does nothing
    env.pop("FA3VERIFY_SANITIZE")
    quiet = subprocess.run([str(hooked_venv / "bin" / "python"), "-c",
                            "import sys; print('fa3verify.sanitize' in sys.modules)"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert quiet.stdout.strip() == "False"
    # a bad value stops the interpreter with exit 2, naming the variable
    env["FA3VERIFY_SANITIZE"] = "loud"
    bad = subprocess.run([str(hooked_venv / "bin" / "python"), "-c", "print('ran')"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "FA3VERIFY_SANITIZE: must be one of raise, warn, record" in bad.stderr
    assert "ran" not in bad.stdout


def test_install_hook_never_replaces_a_foreign_file(hooked_venv, tmp_path):
    from fa3verify.sanitize.hook import PTH_NAME

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    site = subprocess.run([str(hooked_venv / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True,
                          text=True, env={}).stdout.strip()
    pth = Path(site) / PTH_NAME
    fa3 = [sys.executable, "-m", "fa3verify", "sanitize"]
    removed = subprocess.run(fa3 + ["uninstall-hook", "--venv", str(hooked_venv)], env=env, capture_output=True,
                             text=True, timeout=120)
    assert removed.returncode == 0 and not pth.exists()
    pth.write_text("someone else's file\n")
    refused = subprocess.run(fa3 + ["install-hook", "--venv", str(hooked_venv), "--no-import-check"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "not replacing it" in refused.stderr
    kept = subprocess.run(fa3 + ["uninstall-hook", "--venv", str(hooked_venv)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert kept.returncode == 2 and pth.read_text() == "someone else's file\n"


PYTEST_SUITE = """
import torch
import fake_backend

def test_stale_decode():
    lens = [1024, 16, 16, 16]
    cs = torch.tensor(lens, dtype=torch.int32); cu = torch.arange(5, dtype=torch.int32)
    q = torch.zeros(4, 8, 128, dtype=torch.bfloat16)
    k = torch.zeros(4 * 64, 16, 4, 128, dtype=torch.bfloat16)
    pt = torch.arange(4 * 64, dtype=torch.int32).reshape(4, 64)
    b = fake_backend.Backend((2, 1))
    b.decode(q, k, k, pt, cs, cu, b.metadata(cs, cu, 1024, 16))
"""


def test_pytest_option_fails_the_test_that_reuses_stale_metadata(fakes, tmp_path):
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "test_user.py").write_text(PYTEST_SUITE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(fakes)]), "FAKE_FA3_GPU_LIKE": "1"}
    from importlib.metadata import entry_points

    autoloaded = any(ep.value == "fa3verify.pytest_plugin" for ep in entry_points(group="pytest11"))
    plugin = [] if autoloaded and not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") else ["-p", "fa3verify.pytest_plugin"]
    base = [sys.executable, "-m", "pytest", "-q", *plugin, "-p", "no:cacheprovider",
            str(tmp_path / "suite" / "test_user.py"), "--fa3verify-sanitize-dir", str(tmp_path / "out")]
    # 16-SM sizes: the sanitizer must use the fake device's SM count
    conftest = tmp_path / "suite" / "conftest.py"
    conftest.write_text("import fa3verify.sanitize as s\n\n"
                        "def pytest_sessionstart(session):\n    if s.current(): s.current().checker.num_sm = 16\n")
    failed = subprocess.run(base + ["--fa3verify-sanitize=raise"], env=env, capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "MetadataMismatch" in failed.stdout and "SPLIT_BOUND" in failed.stdout
    assert "fa3verify sanitize" in failed.stdout
    passed = subprocess.run(base, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert passed.returncode == 0, passed.stdout + passed.stderr   # gpu-like fake: no check, the garbage flows
    bad = subprocess.run(base + ["--fa3verify-sanitize=loud"], env=env, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert bad.returncode == 4 and "--fa3verify-sanitize: must be one of raise, warn, record" in bad.stderr


# ----------------------------------------------------------------------------------------------------------
# Binding by the implementation's own signature; calls the recorder cannot bind
# ----------------------------------------------------------------------------------------------------------


def test_positional_arguments_bind_by_the_wrapped_functions_own_order(fakes, tmp_path):
    from fa3verify.sanitize.targets import make_wrapper

    s = install(tmp_path)
    import sgl_kernel.flash_attn as fa

    seen = {}

    def reordered(q, k_cache, v_cache, scheduler_metadata=None, cache_seqlens=None, page_table=None,
                  cu_seqlens_q=None, max_seqlen_q=None, causal=False, only_qv=False, num_splits=0):
        seen["md"] = scheduler_metadata
        return q

    wrapped = make_wrapper(reordered, "call", s.checker)
    q, k, v, pt, cs, cu = tensors()
    stale = fake_md(fa, STALE)
    with pytest.raises(MetadataMismatch, match="SPLIT_BOUND"):
        wrapped(q, k, v, stale, cs, pt, cu, 1, True, False, 0)
    fresh = fake_md(fa, HEADS)
    assert wrapped(q, k, v, fresh, cs, pt, cu, 1, True, False, 0) is q and seen["md"] is fresh


def fake_md(fa, heads, lens=LENS):
    cs = torch.tensor(lens, dtype=torch.int32)
    return fa.get_scheduler_metadata(len(lens), 1, max(lens), heads[0], heads[1], 128, cs,
                                     cu_seqlens_q=torch.arange(len(lens) + 1, dtype=torch.int32), page_size=16,
                                     causal=True)


def test_a_call_the_recorder_cannot_bind_is_reported_not_passed(fakes, tmp_path):
    install(tmp_path)
    import sgl_kernel.flash_attn as fa

    q, k, v, pt, cs, cu = tensors()
    md = fake_md(fa, HEADS)
    with pytest.warns(RuntimeWarning, match="could not record"):
        with pytest.raises(MetadataMismatch, match="UNCHECKED_CALL"):
            fa.flash_attn_with_kvcache("not a tensor", k, v, cache_seqlens=cs, page_table=pt, cu_seqlens_q=cu,
                                       max_seqlen_q=1, causal=True, scheduler_metadata=md)


def test_copy_following_ignores_gathers_and_other_dtypes(fakes, tmp_path):
    s = install(tmp_path)
    import sgl_kernel.flash_attn as fa

    md = fake_md(fa, HEADS)
    table = torch.zeros(8, 8, dtype=torch.int32)
    table[torch.tensor([1, 2])] = torch.ones(2, 8, dtype=torch.int32)      # advanced indexing: not followed
    floats = torch.zeros(4)
    floats[:2] = torch.ones(2)
    buf = torch.zeros(64, dtype=torch.int32)
    buf.copy_(torch.zeros(64, dtype=torch.int32))                            # unknown source, untracked dest
    assert s.checker.registry.lookup(buf) is None
    buf[:md.numel()].copy_(md)                                               # followed through copy_
    assert s.checker.registry.lookup(buf[:md.numel()]) is not None
    assert table[1].sum() == 8 and floats.sum() == 2
