"""The emulated FA3 as a drop-in for FA3's Python interface (gpu_impl.kernels.fa3_interface, gpu_impl.emulate_fa3).

Pinned against FA3 hopper at 0251105a: ``rotary_seqlens`` is read only with ``rotary_cos`` (ignored alone);
FP8 input gives a bfloat16 output (``mha_fwd``'s ``out_type``) at bfloat16 precision; ``return_softmax_lse=True``
returns ``(out, softmax_lse, out_accum, softmax_lse_accum)``; the interface asserts ``k_cache.stride(-1) == 1``.
The one-line install is run in a subprocess against a small user-style test file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpu_impl.kernels import fa3_interface as fa3
from gpu_impl.kernels.call_features import FA3CheckFailed
from refmodel.attention import attention

REPO = Path(__file__).resolve().parents[2]
FP8 = torch.float8_e4m3fn


def _decode_call(dtype=torch.bfloat16, b=3, lq=2, h=6, hk=3, d=64, width=96, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, lq, h, d, generator=gen).to(dtype)
    k = torch.randn(b, width, hk, d, generator=gen).to(dtype)
    v = torch.randn(b, width, hk, d, generator=gen).to(dtype)
    cs = torch.tensor([width, width // 3, 5][:b], dtype=torch.int32)
    return q, k, v, cs


# ----------------------------------------------------------------------------------------------------------
# The pinned fixes (each failed on the adapter before them)
# ----------------------------------------------------------------------------------------------------------

def test_rotary_seqlens_without_rotary_cos_is_ignored_as_fa3_does():
    q, k, v, cs = _decode_call()
    plain = fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, causal=True)
    with_it = fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, causal=True, rotary_seqlens=cs // 2)
    assert torch.equal(plain, with_it)


def test_fp8_input_returns_bf16_at_bf16_precision():
    q, k, v, cs = _decode_call(FP8)
    scales = [torch.rand(3, 3, generator=torch.Generator().manual_seed(i)) + 0.5 for i in range(3)]
    out = fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, q_descale=scales[0], k_descale=scales[1],
                                      v_descale=scales[2], num_splits=3)
    assert out.dtype == torch.bfloat16 and out.shape == (3, 2, 6, 64)
    group = 2
    q64 = q.double() * scales[0].double().repeat_interleave(group, dim=1)[:, None, :, None]
    k64 = k.double() * scales[1].double()[:, None, :, None]
    v64 = v.double() * scales[2].double()[:, None, :, None]
    exact, _ = attention(q64, k64, v64, cache_seqlens=cs, softmax_scale=64 ** -0.5)
    # one rounding to bf16 of an exact result: within half a bf16 ulp (2^-8 relative) of it, far below fp8's
    assert ((out.double() - exact).abs() <= exact.abs() * 2 ** -8 + 1e-6).all()
    # without descales the output is still bf16, and descales of a non-fp8 call are ignored as FA3 ignores them
    assert fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs).dtype == torch.bfloat16
    qb, kb, vb, _ = _decode_call()
    assert torch.equal(fa3.flash_attn_with_kvcache(qb, kb, vb, cache_seqlens=cs, q_descale=scales[0]),
                       fa3.flash_attn_with_kvcache(qb, kb, vb, cache_seqlens=cs))


def test_return_softmax_lse_is_fa3s_four_tuple_with_the_split_buffers():
    q, k, v, cs = _decode_call()
    result = fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, num_splits=1, return_softmax_lse=True)
    assert len(result) == 4 and result[2] is None and result[3] is None
    out, lse, out_accum, lse_accum = fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, num_splits=3,
                                                                 return_softmax_lse=True)
    assert lse.shape == (3, 6, 2) and lse.dtype == torch.float32
    assert out_accum.shape == (3, 3, 6, 2, 64) and out_accum.dtype == torch.float32   # (S, b, h, sq, dv)
    assert lse_accum.shape == (3, 3, 6, 2)                                            # (S, b, h, sq)
    # the buffers are the splits' partials: FA3's combine of them gives the call's output and LSE
    again, again_lse = fa3.flash_attn_combine(out_accum.transpose(2, 3), lse_accum.transpose(2, 3),
                                              out_dtype=torch.bfloat16)
    assert torch.equal(again, out)
    assert torch.allclose(again_lse.transpose(1, 2), lse, atol=1e-6)


@pytest.mark.parametrize("which", ["k_cache", "v_cache"])
def test_cache_with_strided_last_dim_fails_the_interfaces_assert(which):
    q, k, v, cs = _decode_call()
    strided = {"k_cache": k, "v_cache": v}
    strided[which] = strided[which].transpose(-1, -2).contiguous().transpose(-1, -2)
    with pytest.raises(AssertionError, match=f"^{which} must have contiguous last dimension$"):
        fa3.flash_attn_with_kvcache(q, strided["k_cache"], strided["v_cache"], cache_seqlens=cs)


# ----------------------------------------------------------------------------------------------------------
# FA3's names, defaults, shapes and refusals
# ----------------------------------------------------------------------------------------------------------

def test_defaults_and_shapes_of_the_five_functions():
    import inspect

    sig = inspect.signature
    assert sig(fa3.flash_attn_func).parameters["num_splits"].default == 1
    assert sig(fa3.flash_attn_varlen_func).parameters["num_splits"].default == 1
    assert sig(fa3.flash_attn_with_kvcache).parameters["num_splits"].default == 0
    assert sig(fa3.flash_attn_with_kvcache).parameters["rotary_interleaved"].default is True
    assert list(sig(fa3.flash_attn_combine).parameters) == ["out_partial", "lse_partial", "out", "out_dtype"]
    q, k, v, _ = _decode_call(width=40)
    out, lse = fa3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == (3, 2, 6, 64) and lse.shape == (3, 6, 2)
    cu_q = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 30, 31, 60], dtype=torch.int32)
    qp = torch.randn(5, 6, 64).bfloat16()
    kp, vp = torch.randn(60, 3, 64).bfloat16(), torch.randn(60, 3, 64).bfloat16()
    out, lse = fa3.flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, 3, 30, causal=True, return_attn_probs=True)
    assert out.shape == (5, 6, 64) and lse.shape == (6, 5)
    md = fa3.get_scheduler_metadata(3, 1, 96, 6, 3, 64, torch.tensor([96, 32, 5], dtype=torch.int32))
    assert md.dtype == torch.int32 and md.dim() == 1


def test_varlen_matches_the_same_call_on_a_padded_cache():
    """flash_attn_varlen_func over packed K equals flash_attn_with_kvcache over the same keys laid out per sequence."""
    gen = torch.Generator().manual_seed(3)
    lens_q, lens_k = [3, 1, 4], [20, 7, 33]
    qp = torch.randn(sum(lens_q), 6, 64, generator=gen).bfloat16()
    kp = torch.randn(sum(lens_k), 2, 64, generator=gen).bfloat16()
    vp = torch.randn(sum(lens_k), 2, 64, generator=gen).bfloat16()
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)  # noqa: E731
    out = fa3.flash_attn_varlen_func(qp, kp, vp, cu(lens_q), cu(lens_k), 4, 33, causal=True)
    kc, vc = torch.zeros(3, 33, 2, 64).bfloat16(), torch.zeros(3, 33, 2, 64).bfloat16()
    start = 0
    for bb, n in enumerate(lens_k):
        kc[bb, :n], vc[bb, :n] = kp[start:start + n], vp[start:start + n]
        start += n
    ref = fa3.flash_attn_with_kvcache(qp, kc, vc, cache_seqlens=torch.tensor(lens_k, dtype=torch.int32),
                                      cu_seqlens_q=cu(lens_q), max_seqlen_q=4, causal=True, num_splits=1)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("call,message", [
    (dict(k="new"), "If k_new is supplied, v_new must also be passed in"),
    (dict(rotary_cos="cos"), "If rotary cos/sin are provided, new key / value to be appended to KV cache"),
    (dict(qv="qv"), "q_v is only supported for hdim_v >= 256."),
    (dict(cache_batch_idx="idx64"), "kv_batch_idx must have dtype int32"),
])
def test_fa3s_refusals_carry_fa3s_message(call, message):
    q, k, v, cs = _decode_call()
    values = {"new": torch.zeros(3, 1, 3, 64).bfloat16(), "cos": torch.zeros(96, 16).bfloat16(),
              "qv": torch.zeros(3, 2, 6, 64).bfloat16(), "idx64": torch.arange(3)}
    kwargs = {name: values[key] for name, key in call.items()}
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, **kwargs)
    assert isinstance(info.value, FA3CheckFailed) and isinstance(info.value, ValueError)


def test_head_dim_refusal_from_the_schedule_check_is_a_runtime_error_too():
    q, k, v, cs = _decode_call(d=60)
    with pytest.raises(RuntimeError, match="head_size should be a multiple of 8"):
        fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs)


def test_appended_kv_is_written_into_the_cache_in_place():
    q, k, v, cs = _decode_call(width=64)
    k_new, v_new = torch.randn(3, 2, 3, 64).bfloat16(), torch.randn(3, 2, 3, 64).bfloat16()
    before = k.clone()
    cs = torch.tensor([10, 0, 62], dtype=torch.int32)
    fa3.flash_attn_with_kvcache(q, k, v, k_new, v_new, cache_seqlens=cs, causal=True)
    for bb, start in enumerate(cs.tolist()):
        assert torch.equal(k[bb, start:start + 2], k_new[bb]) and torch.equal(v[bb, start:start + 2], v_new[bb])
        assert torch.equal(k[bb, :start], before[bb, :start])


def test_combine_of_one_split_passes_split_zero_through():
    """FA3's combine kernel exits early with one split (its output keeps torch.empty's contents); the model
    returns split 0, which is what FA3's own test compares against (docs/emulator.md)."""
    o = torch.randn(1, 2, 3, 4, 64)
    lse = torch.randn(1, 2, 4, 3).transpose(-1, -2)
    out, out_lse = fa3.flash_attn_combine(o, lse)
    assert torch.equal(out, o[0]) and torch.equal(out_lse, lse[0])


# ----------------------------------------------------------------------------------------------------------
# The one-line install, as a user's test suite uses it
# ----------------------------------------------------------------------------------------------------------

USER_TESTS = '''
import pytest
import torch
from flash_attn_interface import flash_attn_with_kvcache, get_scheduler_metadata


def naive(q, k, v, lens):
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b, n in enumerate(lens):
        kk = k[b, :n].double().repeat_interleave(q.shape[2] // k.shape[2], dim=1)
        vv = v[b, :n].double().repeat_interleave(q.shape[2] // k.shape[2], dim=1)
        s = torch.einsum("qhd,khd->hqk", q[b].double(), kk) / q.shape[-1] ** 0.5
        out[b] = torch.einsum("hqk,khd->qhd", s.softmax(-1), vv)
    return out


def test_decode_with_precomputed_metadata():
    torch.manual_seed(0)
    q = torch.randn(4, 1, 8, 128).bfloat16()
    k, v = torch.randn(4, 300, 2, 128).bfloat16(), torch.randn(4, 300, 2, 128).bfloat16()
    lens = torch.tensor([300, 12, 7, 150], dtype=torch.int32)
    md = get_scheduler_metadata(4, 1, 300, 8, 2, 128, lens, causal=True)
    out = flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True, scheduler_metadata=md)
    assert (out.double() - naive(q, k, v, lens.tolist())).abs().max() < 2e-2


def test_metadata_for_other_head_counts_fails_like_fa3():
    q = torch.randn(2, 1, 8, 128).bfloat16()
    k, v = torch.randn(2, 64, 2, 128).bfloat16(), torch.randn(2, 64, 2, 128).bfloat16()
    lens = torch.tensor([64, 3], dtype=torch.int32)
    md = get_scheduler_metadata(5, 1, 64, 8, 2, 128, lens[:1].repeat(5))   # precomputed for 5 sequences
    with pytest.raises(RuntimeError):
        flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, scheduler_metadata=md)
'''


SANITIZED_TEST = '''
import torch
from flash_attn_interface import flash_attn_with_kvcache, get_scheduler_metadata


def test_decode_reuses_metadata_precomputed_for_one_kv_head():
    lens = torch.tensor([8192] + [100] * 7, dtype=torch.int32)
    cu = torch.arange(9, dtype=torch.int32)
    md = get_scheduler_metadata(8, 1, 8192, 32, 1, 128, lens, cu_seqlens_q=cu, causal=True)
    q, k = torch.zeros(8, 32, 128, dtype=torch.bfloat16), torch.zeros(8, 8192, 4, 128, dtype=torch.bfloat16)
    flash_attn_with_kvcache(q, k, k, cache_seqlens=lens, cu_seqlens_q=cu, max_seqlen_q=1, causal=True,
                            scheduler_metadata=md)
'''


def test_one_line_install_runs_a_users_tests_on_cpu(tmp_path):
    (tmp_path / "test_user_attention.py").write_text(USER_TESTS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gpu_impl.emulate_fa3",
           "test_user_attention.py"]
    ran = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and "2 passed" in ran.stdout, ran.stdout + ran.stderr


def test_pytest_option_with_the_sanitizer_catches_stale_metadata_on_cpu(tmp_path):
    """docs/sanitize.md's CPU example: the emulated FA3 registered by the option, the sanitizer wrapping it."""
    (tmp_path / "test_user_attention.py").write_text(USER_TESTS)
    (tmp_path / "test_sanitized.py").write_text(SANITIZED_TEST)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fa3verify.pytest_plugin",
           "--fa3verify-emulate-fa3", "--fa3verify-sanitize=raise", "--fa3verify-sanitize-dir", str(tmp_path / "out"),
           "test_user_attention.py", "test_sanitized.py"]
    ran = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 1 and "1 failed, 2 passed" in ran.stdout, ran.stdout + ran.stderr
    assert "MetadataMismatch: SPLIT_BOUND" in ran.stdout and "wrapped: flash_attn_interface." in ran.stdout



def test_without_the_install_the_users_import_fails_here():
    """Negative control of the install test: no FA3 on this machine, so the user's import fails without it."""
    bare = subprocess.run([sys.executable, "-c", "import flash_attn_interface"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    if bare.returncode == 0:
        pytest.skip("a real flash_attn_interface is importable on this machine")
    assert "No module named 'flash_attn_interface'" in bare.stderr


def test_install_registers_sgl_kernel_flash_attn_only_where_no_real_one_exists():
    code = ("import importlib.util, sys\n"
            "real = importlib.util.find_spec('sgl_kernel') is not None\n"
            "import gpu_impl.emulate_fa3 as e\n"
            "import flash_attn_interface\n"
            "assert flash_attn_interface.EMULATED\n"
            "state = e.install()\n"
            "if real:\n"
            "    assert state['sgl_kernel.flash_attn'].startswith('not registered'), state\n"
            "else:\n"
            "    from sgl_kernel.flash_attn import flash_attn_with_kvcache, get_scheduler_metadata\n"
            "    import torch\n"
            "    lens = torch.tensor([40, 3], dtype=torch.int32)\n"
            "    md = get_scheduler_metadata(batch_size=2, max_seqlen_q=1, max_seqlen_k=40, num_heads=8,\n"
            "                                num_heads_k=2, headdim=64, cache_seqlens=lens)\n"
            "    q, k = torch.randn(2, 1, 8, 64).bfloat16(), torch.randn(2, 40, 2, 64).bfloat16()\n"
            "    out = flash_attn_with_kvcache(q, k, k, cache_seqlens=lens, scheduler_metadata=md)\n"
            "    assert out.shape == (2, 1, 8, 64)\n"
            "e.uninstall()\n"
            "assert 'flash_attn_interface' not in sys.modules and 'sgl_kernel.flash_attn' not in sys.modules\n"
            "print('ok')\n")
    ran = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and "ok" in ran.stdout, ran.stdout + ran.stderr
