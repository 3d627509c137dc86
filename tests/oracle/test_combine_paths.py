"""The combine's float32 result does not depend on which of its two paths computes it.

refmodel.combine accumulates ``sum_s scale_s * O_partial_s`` either with one broadcast multiply or split by split,
chosen by problem size for speed only. An oracle's value cannot depend on how it was computed: both paths must
give the same bits, and both must be the order FA3's combine uses, ascending s in float32 from +0
(Dao-AILab/flash-attention ``hopper/flash_fwd_combine_kernel.h`` at 0251105a: ``clear(tOrO)`` line 666, the loop
``for (int s = 0; s <= thr_max_valid_split; ++s)`` line 669, ``if (... scale(m) > 0.f)`` line 685,
``tOrO(i, m, k) += scale(m) * rOpartial[i]`` line 693).

Negative controls: a seeded reordering of the splits (the same sum in another order) and torch's own reduction
over the split dimension must each give other bits on the same input, so the bit comparison here would catch a
path that reordered the sum.
"""

import math
import random

import numpy as np
import pytest
import torch

import refmodel.combine as combine
from refmodel.combine import _accumulate, flash_attn_combine


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _scales_and_partials(seed: int, num_splits: int = 9, rows: int = 48, dv: int = 40):
    """Scales in (0, 1] and partial outputs spread over 12 binades with both signs: rounding depends on the order."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.rand(num_splits, rows, generator=g) + 1e-3
    scales = scales / scales.sum(dim=0, keepdim=True)
    magnitude = torch.exp2(torch.randint(-6, 6, (num_splits, rows, dv), generator=g).float())
    partials = torch.randn(num_splits, rows, dv, generator=g) * magnitude
    return scales.float(), partials.float()


def _ascending_float32(scales: torch.Tensor, partials: torch.Tensor) -> np.ndarray:
    """FA3's order, written independently: acc = +0; for s ascending: acc = f32(acc + f32(scale_s * O_s))."""
    acc = np.zeros(partials.shape[1:], dtype=np.float32)
    for s in range(partials.shape[0]):
        product = (scales[s].numpy()[:, None] * partials[s].numpy()).astype(np.float32)
        acc = (acc + product).astype(np.float32)
    return acc


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_both_paths_give_the_same_bits_and_fa3s_ascending_order(seed):
    scales, partials = _scales_and_partials(seed)
    broadcast = _accumulate(scales, partials, per_split=False)
    per_split = _accumulate(scales, partials, per_split=True)
    assert torch.equal(_bits(broadcast), _bits(per_split))
    reference = torch.from_numpy(_ascending_float32(scales, partials))
    assert torch.equal(_bits(broadcast), _bits(reference))


def test_the_size_threshold_picks_the_path_and_either_side_gives_the_same_bits(monkeypatch):
    # the whole combine on one input, once with every problem below the thresholds (broadcast) and once with every
    # problem above them (per split): out and lse bit for bit
    scales, partials = _scales_and_partials(3, num_splits=6, rows=24, dv=32)
    lse = torch.log(scales).reshape(6, 2, 3, 4)
    o = partials.reshape(6, 2, 3, 4, 32)
    chosen = []
    real = combine._accumulate

    def spy(sc, op, per_split=None):
        out = real(sc, op, per_split)
        rows, dv = op.shape[1:]
        chosen.append(rows * dv >= combine._LOOP_MIN_ROW_ELEMS and op.shape[0] * rows * dv >= combine._LOOP_MIN_TOTAL_ELEMS)
        return out

    monkeypatch.setattr(combine, "_accumulate", spy)
    monkeypatch.setattr(combine, "_LOOP_MIN_ROW_ELEMS", 1 << 30)
    monkeypatch.setattr(combine, "_LOOP_MIN_TOTAL_ELEMS", 1 << 30)
    out_b, lse_b = flash_attn_combine(o, lse)
    monkeypatch.setattr(combine, "_LOOP_MIN_ROW_ELEMS", 1)
    monkeypatch.setattr(combine, "_LOOP_MIN_TOTAL_ELEMS", 1)
    out_l, lse_l = flash_attn_combine(o, lse)
    assert chosen == [False, True]
    assert torch.equal(_bits(out_b), _bits(out_l)) and torch.equal(_bits(lse_b), _bits(lse_l))


@pytest.mark.parametrize("rows, dv, splits, per_split", [
    (1 << 14, 2, 64, True),                  # rows * dv at the row threshold 2^15, S * rows * dv = 2^21
    ((1 << 15) - 1, 1, 128, False),          # one element under the row threshold
    (1 << 14, 2, 63, False),                 # S * rows * dv one split under 2^21
])
def test_the_thresholds_on_both_sides_of_each_boundary(monkeypatch, rows, dv, splits, per_split):
    # the per-split path is the one that multiplies into a reused buffer (torch.mul(..., out=product)) once a split
    calls = {"mul_out": 0}
    real_mul = torch.mul

    def counting_mul(*args, **kw):
        if "out" in kw:
            calls["mul_out"] += 1
        return real_mul(*args, **kw)

    monkeypatch.setattr(combine.torch, "mul", counting_mul)
    scales = torch.full((splits, rows), 1.0 / splits)
    partials = torch.ones(splits, rows, dv)
    out = _accumulate(scales, partials)
    assert calls["mul_out"] == (splits if per_split else 0)
    assert out.shape == (rows, dv)


def test_negative_control_a_seeded_reordering_of_the_splits_changes_the_bits():
    # the same terms summed in a seeded order other than ascending: mathematically the same sum, other bits, so a
    # path that reordered the accumulation fails the comparison above
    scales, partials = _scales_and_partials(0)
    order = list(range(scales.shape[0]))
    random.Random(20261205).shuffle(order)
    assert order != sorted(order)
    ascending = _accumulate(scales, partials, per_split=True)
    reordered = _accumulate(scales[order], partials[order], per_split=False)
    differing = int((_bits(ascending) != _bits(reordered)).sum())
    assert differing > 0
    assert torch.allclose(ascending, reordered, rtol=1e-5, atol=1e-5)  # a rounding difference, not a wrong sum


def test_negative_control_torchs_reduction_over_the_split_dimension_is_not_fa3s_order():
    # the broadcast path before this pin summed with torch's reduction (``(scales * partials).sum(dim=0)``), whose
    # order is torch's own: on this input it gives other bits than the ascending float32 loop
    scales, partials = _scales_and_partials(1, num_splits=64, rows=64, dv=256)
    reduced = (scales.unsqueeze(-1) * partials).sum(dim=0)
    ascending = _accumulate(scales, partials, per_split=False)
    assert int((_bits(reduced) != _bits(ascending)).sum()) > 0
    assert torch.allclose(reduced, ascending, rtol=1e-4, atol=1e-4)


def test_a_negative_zero_product_leaves_positive_zero_on_both_paths():
    # tOrO starts at +0 (clear, line 666): +0 + -0 = +0, so a row whose only products are -0 is +0 on both paths
    scales = torch.tensor([[0.5], [0.5]])
    partials = torch.tensor([[[-0.0]], [[-0.0]]])
    for per_split in (False, True):
        out = _accumulate(scales, partials, per_split=per_split)
        assert math.copysign(1.0, float(out)) == 1.0


def test_negative_control_a_fused_multiply_add_on_one_path_changes_the_bits():
    # the per-split path before this pin used addcmul_, which torch's CPU kernels may fuse into one rounding while
    # the broadcast path rounded the product first: emulated here in float64 (the product of two float32 is exact
    # in float64), the fused accumulation gives other bits than the two-rounding one on the same input
    scales, partials = _scales_and_partials(0)
    acc = torch.zeros(partials.shape[1:], dtype=torch.float64)
    for s in range(partials.shape[0]):
        acc = (acc + scales[s].double().unsqueeze(-1) * partials[s].double()).float().double()
    fused = acc.float()
    assert int((_bits(fused) != _bits(_accumulate(scales, partials, per_split=True))).sum()) > 0
    assert int((_bits(fused) != _bits(_accumulate(scales, partials, per_split=False))).sum()) > 0
