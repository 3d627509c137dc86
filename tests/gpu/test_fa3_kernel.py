"""The real FA3 kernel against refmodel (skipped without CUDA and an FA3 module; see conftest.py).

* real ``get_scheduler_metadata`` equals refmodel's on every written slot (ties of FA3's unstable sort compared
  as sets: per real batch, the (split count, m-blocks, heads-in-L2) triple must match);
* the real kernel's own split count (the leading dim of the ``out_accum`` it returns) equals refmodel's S_c;
* docs/facts-fa3.md's worked example with fresh metadata (the call's own heads) matches the oracle under FA3's rule;
* with tp=4 metadata, the strict adapter refuses to launch (SPLIT_BOUND), and a gpu-like launch -- run in a
  child process, as it may corrupt the CUDA context -- does not produce the oracle's result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import refmodel
from gpu_impl.errors import OutOfBoundsAccess
from refmodel.metadata import decode_metadata, schedule_and_prepare
from refmodel.tolerance import fa3_output_close, reference_outputs

pytestmark = pytest.mark.gpu

WORKED_LENS = [32768] + [100] * 7
LSE_ATOL = 2e-3
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _paged(lens, hk, d, page_size, seed=0, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    pages = [max(1, -(-n // page_size)) for n in lens]
    total = sum(pages)
    perm = torch.randperm(total, generator=gen).to(torch.int32)
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    off = 0
    for i, n in enumerate(pages):
        table[i, :n] = perm[off:off + n]
        off += n
    k = torch.randn(total, page_size, hk, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(total, page_size, hk, d, generator=gen).to(torch.bfloat16)
    return k.to(device), v.to(device), table.to(device)


def _per_batch(decoded, b, sort, swizzle):
    """{real batch: (splits, m_blocks, heads_in_l2)} from a decoded metadata (written slots only)."""
    order = decoded.batch_idx[:b] if sort else list(range(b))
    return {order[vb]: (decoded.num_splits[vb], decoded.num_m_blocks[vb],
                        decoded.nheads_in_l2[vb] if swizzle else None) for vb in range(b)}


METADATA_CONFIGS = [
    # (lens, lq, heads, heads_k, d, causal, page_size, varlen_q)
    (WORKED_LENS, 1, 8, 1, 128, True, 1, False),
    (WORKED_LENS, 1, 32, 4, 128, True, 1, False),
    ([5000, 17, 900, 3, 64], 1, 16, 2, 64, False, None, False),
    ([300, 1200, 40], [1, 17, 300], 32, 8, 128, True, 64, True),
    ([(i * 977) % 5000 + 1 for i in range(33)], 1, 32, 8, 128, True, 16, False),
]


@pytest.mark.parametrize("config", METADATA_CONFIGS, ids=lambda c: f"b{len(c[0])}-h{c[2]}/{c[3]}-d{c[4]}")
def test_real_metadata_equals_refmodel(fa3_strict, config):
    lens, lq, h, hk, d, causal, page_size, varlen_q = config
    b = len(lens)
    cs = torch.tensor(lens, dtype=torch.int32, device="cuda")
    cu = None
    max_q = lq if not varlen_q else max(lq)
    if varlen_q:
        cu = torch.tensor([0] + torch.tensor(lq).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    md = fa3_strict.get_scheduler_metadata(b, max_q, max(lens), h, hk, d, cs, qkv_dtype=torch.bfloat16,
                                           cu_seqlens_q=cu, page_size=page_size, causal=causal)
    eff_page = fa3_strict.last_metadata_trace["effective_page_size"]
    schedule, result = schedule_and_prepare(b, max_q, max(lens), h, hk, d, cs.cpu(), qkv_dtype=torch.bfloat16,
                                            cu_seqlens_q=None if cu is None else cu.cpu(), page_size=eff_page,
                                            causal=causal, num_sm=fa3_strict.num_sm)
    ref = refmodel.encode_metadata(schedule, result)
    assert md.numel() == ref.numel() == schedule.metadata_size
    real = decode_metadata(md, b, schedule.sort, schedule.swizzle)
    model = decode_metadata(ref, b, schedule.sort, schedule.swizzle)
    assert _per_batch(real, b, schedule.sort, schedule.swizzle) == _per_batch(model, b, schedule.sort, schedule.swizzle)
    if schedule.sort:
        assert sorted(real.batch_idx[:b]) == list(range(b))
    assert real.semaphore == 0


def _worked_call(seed=0):
    k, v, table = _paged(WORKED_LENS, 4, 128, page_size=1, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(8, 1, 32, 128, generator=gen).to(torch.bfloat16).cuda()
    cs = torch.tensor(WORKED_LENS, dtype=torch.int32, device="cuda")
    return q, k, v, table, cs


def test_worked_example_fresh_metadata_matches_oracle(fa3_strict):
    q, k, v, table, cs = _worked_call()
    md = fa3_strict.get_scheduler_metadata(8, 1, max(WORKED_LENS), 32, 4, 128, cs, page_size=1, causal=True)
    out, lse, *_ = fa3_strict.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True,
                                                  scheduler_metadata=md, return_softmax_lse=True)
    torch.cuda.synchronize()
    trace = fa3_strict.last_trace
    assert trace["ok"] and trace["launched"]
    assert trace["observed_num_splits"] in (None, trace["schedule"]["num_splits"])
    kw = dict(cache_seqlens=cs.cpu(), page_table=table.cpu(), causal=True)
    exact, lowp = reference_outputs(q.cpu(), k.cpu(), v.cpu(), **kw)
    ok, err, bound = fa3_output_close(out.cpu(), exact, lowp)
    assert ok, f"max error {err:.3g} > FA3 bound {bound:.3g}"
    _, ref_lse = refmodel.attention(q.cpu(), k.cpu(), v.cpu(), **kw)
    assert (lse.cpu().double() - ref_lse.double()).abs().max().item() <= LSE_ATOL


def test_real_split_count_equals_refmodel(fa3_strict):
    """The leading dim of FA3's out_accum is its own S_c; refmodel must predict it for the effective call."""
    q, k, v, table, cs = _worked_call(seed=5)
    fa3_strict.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True)
    trace = fa3_strict.last_trace
    assert trace["observed_num_splits"] is not None, "FA3 returned no out_accum (did the build split?)"
    assert trace["observed_num_splits"] == trace["schedule"]["num_splits"]


def test_worked_example_tp_metadata_strict_refuses_to_launch(fa3_strict):
    q, k, v, table, cs = _worked_call()
    md = fa3_strict.get_scheduler_metadata(8, 1, max(WORKED_LENS), 8, 1, 128, cs, page_size=1, causal=True)
    with pytest.raises(OutOfBoundsAccess) as info:
        fa3_strict.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True,
                                           scheduler_metadata=md)
    assert info.value.invariant == "SPLIT_BOUND" and info.value.batch == 0
    assert fa3_strict.last_trace["launched"] is False


_HAZARD_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {repo!r})
    sys.path.insert(0, {tests!r})
    from test_fa3_kernel import _worked_call, WORKED_LENS
    import refmodel
    from gpu_impl.kernels import load
    kern = load("fa3", mode="gpu-like")
    q, k, v, table, cs = _worked_call()
    md = kern.get_scheduler_metadata(8, 1, max(WORKED_LENS), 8, 1, 128, cs, page_size=1, causal=True)
    try:
        out, lse, *_ = kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True,
                                                scheduler_metadata=md, return_softmax_lse=True)
        torch.cuda.synchronize()
    except Exception as exc:
        print(json.dumps({{"verdict": "error", "detail": repr(exc)[:500]}}))
        sys.exit(0)
    nan = bool(torch.isnan(out[0]).any() or torch.isnan(lse[0]).any())
    _, ref_lse = refmodel.attention(q[:1].cpu(), k.cpu(), v.cpu(), cache_seqlens=cs[:1].cpu(),
                                    page_table=table[:1].cpu(), causal=True)
    lse_err = float((lse[:1].cpu().double() - ref_lse.double()).abs().max())
    print(json.dumps({{"verdict": "nan" if nan else ("wrong" if lse_err > 0.1 else "ok"), "lse_err": lse_err,
                      "verdicts": [v["invariant"] for v in kern.last_trace["verdicts"]]}}))
""")


def test_worked_example_tp_metadata_gpu_like_reproduces_the_hazard():
    """Launch the mismatched call for real, in a child process: NaN, a CUDA error or a wrong LSE -- never 'ok'."""
    script = _HAZARD_SCRIPT.format(repo=REPO, tests=os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:  # the child died: an illegal memory access (CUDA error or signal) is the hazard, reproduced
        died_of_cuda = proc.returncode < 0 or "cuda" in proc.stderr.lower() or "illegal" in proc.stderr.lower()
        assert proc.returncode != 0 and died_of_cuda, f"child failed otherwise (rc {proc.returncode}): {proc.stderr[-2000:]}"
        return
    result = json.loads(lines[-1])
    assert result["verdict"] != "ok", f"mismatched metadata gave the oracle's result: {result}"
