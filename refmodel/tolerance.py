"""FA3's own acceptance rule for a kernel's output, and the two references it needs.

FA3's tests (`hopper/test_flash_attn.py`, test_flash_attn_output) accept an output when
`max|out - out_ref| <= rtol * max|out_pt - out_ref| + fwd_atol`, with both references rounded to the output
dtype, rtol = 2 (3 with softcap) and `fwd_atol = 2 * max|out_ref + 0.3 - 0.3 - out_ref|` (the rounding noise
of one add/subtract in the output dtype). Here out_ref is refmodel's float64 attention; out_pt, the
same-precision reference, rounds q/k/v to the input dtype, computes scores and softmax in float32, rounds the
probabilities to the input dtype (as FA3 feeds P to its P@V matmul) and accumulates in float32. `ATOL` is a
small extra floor of ours, for rows where both references round to the same value.
"""

from __future__ import annotations

import torch

from .attention import resolve_attention_call

#: Extra absolute floor on top of FA3's own fwd_atol.
ATOL = 1e-4
#: FA3's rtol: twice the same-precision error (three times with softcap).
FACTOR = 2.0
FACTOR_SOFTCAP = 3.0


def reference_outputs(q, k_cache, v_cache, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact float64 output, same-precision output as float64), both shaped like FA3's `out`."""
    call = resolve_attention_call(q, k_cache, v_cache, **kwargs)
    shape = (call.total_q, call.num_heads, call.head_dim_v) if call.varlen else \
        (call.batch_size, call.seqlen_q, call.num_heads, call.head_dim_v)
    exact = torch.zeros(shape, dtype=torch.float64)
    lowp = torch.zeros(shape, dtype=torch.float64)
    dtype = call.q_dtype
    for b in call.batches:
        scores64 = torch.matmul(b.q, b.k.transpose(-1, -2)) * call.scale
        scores32 = torch.matmul(b.q.to(dtype).float(), b.k.to(dtype).float().transpose(-1, -2)) * call.scale
        if call.softcap > 0:
            scores64 = torch.tanh(scores64 / call.softcap) * call.softcap
            scores32 = torch.tanh(scores32 / call.softcap) * call.softcap
        mask = ~b.visible
        e64 = _softmax(scores64.masked_fill(mask, float("-inf"))) @ b.v
        p32 = _softmax(scores32.masked_fill(mask, float("-inf"))).to(dtype).float()
        e32 = p32 @ b.v.to(dtype).float()
        _place(exact, e64, b, call)
        _place(lowp, e32.double(), b, call)
    return exact, lowp


def fa3_output_close(out: torch.Tensor, exact: torch.Tensor, lowp: torch.Tensor, atol: float = ATOL,
                     softcap: float = 0.0) -> tuple[bool, float, float]:
    """FA3's rule: max|out - ref| <= rtol * max|pt - ref| + fwd_atol + atol, refs in out's dtype. (ok, err, bound)."""
    if not out.numel():
        return True, 0.0, 0.0
    dtype = out.dtype if out.dtype in (torch.bfloat16, torch.float16) else torch.float32
    ref = exact.to(dtype).double()
    pt = lowp.to(dtype).double()
    ref_lp = exact.to(dtype)
    fwd_atol = 2.0 * ((ref_lp + 0.3 - 0.3) - ref_lp).abs().max().item()
    rtol = FACTOR_SOFTCAP if softcap > 0 else FACTOR
    err = (out.double().cpu() - ref).abs().max().item()
    bound = rtol * (pt - ref).abs().max().item() + fwd_atol + atol
    return bool(err <= bound), float(err), float(bound)


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    finite = torch.isfinite(scores).any(dim=-1, keepdim=True)
    probs = torch.softmax(torch.where(finite, scores, torch.zeros_like(scores)), dim=-1)
    return torch.where(finite, probs, torch.zeros_like(probs))


def _place(target: torch.Tensor, rows: torch.Tensor, b, call) -> None:
    # rows: (h, Lq, dv) -> the output layout
    if call.varlen:
        target[b.row_start:b.row_start + b.seqlen_q] = rows.permute(1, 0, 2)
    else:
        target[b.index, :b.seqlen_q] = rows.permute(1, 0, 2)
