"""Pins of refmodel.tolerance: FA3's output acceptance rule and its two references, on hand-worked rows.

Source: Dao-AILab/flash-attention `hopper/test_flash_attn.py` at 0251105a (test_flash_attn_output): an output is
accepted when ``max|out - out_ref| <= rtol * max|out_pt - out_ref| + fwd_atol`` with rtol 2 (3 with softcap) and
``fwd_atol = 2 * max|out_ref + 0.3 - 0.3 - out_ref|`` in the output dtype; out_pt rounds the probabilities to the
input dtype before P @ V (as the kernel feeds its P @ V matmul).
"""

import math

import pytest
import torch

from refmodel.tolerance import ATOL, FACTOR, FACTOR_SOFTCAP, fa3_output_close, reference_outputs


def test_fa3_s_factors_and_our_floor():
    assert (FACTOR, FACTOR_SOFTCAP, ATOL) == (2.0, 3.0, 1e-4)


def test_an_empty_output_is_accepted_with_zero_error():
    assert fa3_output_close(torch.zeros(0, 4), torch.zeros(0, 4), torch.zeros(0, 4)) == (True, 0.0, 0.0)


def test_the_bound_is_twice_the_same_precision_error_in_float32():
    # exact 0 and same-precision 0.25: 0 + 0.3 - 0.3 == 0 exactly, so fwd_atol = 0 and the bound is 2 * 0.25
    exact, lowp = torch.zeros(1, 2, dtype=torch.float64), torch.full((1, 2), 0.25, dtype=torch.float64)
    assert fa3_output_close(torch.full((1, 2), 0.5), exact, lowp, atol=0.0) == (True, 0.5, 0.5)   # equality passes
    ok, err, bound = fa3_output_close(torch.full((1, 2), 0.5001), exact, lowp, atol=0.0)
    assert not ok and err == pytest.approx(0.5001) and bound == 0.5
    assert fa3_output_close(torch.full((1, 2), 0.5), exact, lowp)[2] == pytest.approx(0.5 + ATOL)   # default floor
    # softcap: rtol 3
    assert fa3_output_close(torch.full((1, 2), 0.75), exact, lowp, atol=0.0, softcap=30.0) == (True, 0.75, 0.75)
    # a float64 output is judged in float32 (the references are rounded to float32 too)
    assert fa3_output_close(torch.full((1, 2), 0.5, dtype=torch.float64), exact, lowp, atol=0.0)[0]


def test_a_bf16_output_is_judged_against_bf16_rounded_references():
    # exact = 1/3: in bf16 0.333984375; bf16(0.333984375 + 0.3) = 0.6328125 (162 steps of 2^-8), - 0.3 ->
    # bf16 0.33203125: |diff| = 2^-9, fwd_atol = 2^-8 = 0.00390625. Same-precision ref = exact: bound = fwd_atol.
    exact = torch.full((1, 1), 1.0 / 3.0, dtype=torch.float64)
    two_up = torch.full((1, 1), 0.337890625, dtype=torch.bfloat16)     # 2 bf16 steps (2^-9 each) above 0.333984375
    assert fa3_output_close(two_up, exact, exact, atol=0.0) == (True, 0.00390625, 0.00390625)
    three_up = torch.full((1, 1), 0.33984375, dtype=torch.bfloat16)
    ok, err, bound = fa3_output_close(three_up, exact, exact, atol=0.0)
    assert not ok and err == 0.005859375 and bound == 0.00390625


def _kv(keys, values):
    k = torch.tensor(keys, dtype=torch.float32).reshape(1, len(keys), 1, -1)
    v = torch.tensor(values, dtype=torch.float32).reshape(1, len(values), 1, -1)
    return k, v


E0 = [1.0] + [0.0] * 7


def test_the_references_on_a_two_key_row():
    # scale 1, q = e0, keys (ln 3) e0 and 0, all given in bf16 (ln 3 -> 1.1015625): scores (1.1015625, 0),
    # p1 = 1 / (e^1.1015625 + 1); V rows e0, e1: out = (p0, p1, 0...)
    q = torch.tensor(E0).reshape(1, 1, 1, 8).to(torch.bfloat16)
    k, v = _kv([[math.log(3.0)] + [0.0] * 7, [0.0] * 8], [E0, [0.0, 1.0] + [0.0] * 6])
    k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    exact, lowp = reference_outputs(q, k, v, softmax_scale=1.0)
    assert exact.shape == (1, 1, 1, 8) and exact.dtype == torch.float64
    p1 = 1.0 / (math.exp(1.1015625) + 1.0)
    assert exact[0, 0, 0, :2].tolist() == pytest.approx([1.0 - p1, p1], abs=1e-12)
    # same precision: P rounded to bf16 before P @ V: p1 = 0.249447.. -> 0.2490234375 (255 * 2^-10), p0 = 0.750553.. ->
    # 0.75 (192 * 2^-8)
    assert lowp[0, 0, 0, 1].item() == 0.2490234375
    assert lowp[0, 0, 0, 0].item() == 0.75


def test_softcap_caps_both_references():
    # softcap 2: 2 * tanh(ln 3 / 2) = 2 * (3 - 1) / (3 + 1) = 1: scores (1, 0), p0 = e / (e + 1)
    q = torch.tensor(E0).reshape(1, 1, 1, 8)
    k, v = _kv([[math.log(3.0)] + [0.0] * 7, [0.0] * 8], [E0, [0.0, 1.0] + [0.0] * 6])
    exact, lowp = reference_outputs(q, k, v, softmax_scale=1.0, softcap=2.0)
    p0 = math.e / (math.e + 1.0)
    assert exact[0, 0, 0, :2].tolist() == pytest.approx([p0, 1.0 - p0], abs=1e-7)
    assert lowp[0, 0, 0, :2].tolist() == pytest.approx([p0, 1.0 - p0], abs=1e-6)


def test_hidden_keys_are_masked_and_a_row_without_keys_is_zero():
    q = torch.tensor(E0).reshape(1, 1, 1, 8).expand(2, 1, 1, 8).clone()
    k, v = _kv([[math.log(3.0)] + [0.0] * 7, [0.0] * 8], [E0, [0.0, 1.0] + [0.0] * 6])
    k, v = k.expand(2, 2, 1, 8).clone(), v.expand(2, 2, 1, 8).clone()
    # batch 0 sees key 0 only (cache_seqlens 1): out = V_0; batch 1 sees no key: 0, not NaN
    exact, lowp = reference_outputs(q, k, v, softmax_scale=1.0, cache_seqlens=torch.tensor([1, 0], dtype=torch.int32))
    assert exact[0, 0, 0].tolist() == E0 and lowp[0, 0, 0].tolist() == E0
    assert exact[1].abs().sum().item() == 0.0 and lowp[1].abs().sum().item() == 0.0


def test_varlen_rows_are_placed_at_their_offsets():
    # varlen q: batch 0 has 1 row, batch 1 has 2 rows (cu_seqlens_q 0, 1, 3); each batch's one key has V = its index + 1
    q = torch.tensor(E0).reshape(1, 1, 8).expand(3, 1, 8).clone()
    k = torch.zeros(2, 4, 1, 8)
    v = torch.stack([torch.full((4, 1, 8), 1.0), torch.full((4, 1, 8), 2.0)])
    exact, lowp = reference_outputs(q, k, v, cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32), max_seqlen_q=2,
                                    cache_seqlens=torch.tensor([1, 4], dtype=torch.int32))
    assert exact.shape == (3, 1, 8)
    assert exact[:, 0, 0].tolist() == [1.0, 2.0, 2.0] and lowp[:, 0, 0].tolist() == [1.0, 2.0, 2.0]


def test_any_positive_softcap_is_the_softcap_rule():
    # softcap 0.5 (< 1) still caps: rtol 3, and the scores become 0.5 * tanh(s / 0.5)
    exact, lowp = torch.zeros(1, 2, dtype=torch.float64), torch.full((1, 2), 0.25, dtype=torch.float64)
    assert fa3_output_close(torch.full((1, 2), 0.75), exact, lowp, atol=0.0, softcap=0.5) == (True, 0.75, 0.75)
    q = torch.tensor(E0).reshape(1, 1, 1, 8)
    k, v = _kv([[math.log(3.0)] + [0.0] * 7, [0.0] * 8], [E0, [0.0, 1.0] + [0.0] * 6])
    exact, _ = reference_outputs(q, k, v, softmax_scale=1.0, softcap=0.5)
    s0 = 0.5 * math.tanh(math.log(3.0) / 0.5)          # = 0.5 * (9 - 1) / (9 + 1) = 0.4
    p0 = math.exp(s0) / (math.exp(s0) + 1.0)
    assert exact[0, 0, 0, 0].item() == pytest.approx(p0, abs=1e-8)     # k holds ln 3 in float32


def test_a_float64_output_is_judged_after_rounding_the_references_to_float32():
    # exact 1/3; out = 1/3 + 1e-8 in float64. In float32 the reference is 0.3333333433 and its fwd_atol 2 * 2^-25 ~ 6e-8,
    # so the output (1e-10 from it) passes; judged in float64 it would be 1e-8 off against a bound of ~1e-16
    exact = torch.full((1, 1), 1.0 / 3.0, dtype=torch.float64)
    out = torch.full((1, 1), 1.0 / 3.0 + 1e-8, dtype=torch.float64)
    ok, err, bound = fa3_output_close(out, exact, exact, atol=0.0)
    assert ok and err < 1e-9 and bound > 1e-8


def test_rows_without_a_visible_key_are_zero_next_to_rows_with_keys():
    # bottom-right causal, Lq 2 > Lk 1: row 0 sees no key (j <= 0 + 1 - 2), row 1 sees key 0; the empty row is 0
    q = torch.tensor(E0).reshape(1, 1, 1, 8).expand(1, 2, 1, 8).clone()
    k, v = _kv([[1.0] * 8], [[2.0] * 8])
    exact, lowp = reference_outputs(q, k, v, causal=True)
    assert exact[0, 0, 0].tolist() == [0.0] * 8 and lowp[0, 0, 0].tolist() == [0.0] * 8
    assert exact[0, 1, 0].tolist() == [2.0] * 8 and lowp[0, 1, 0].tolist() == [2.0] * 8
