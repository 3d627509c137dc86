"""Pins of refmodel.combine: the combine's per-row math on hand-worked rows, and every refusal's message.

Source: Dao-AILab/flash-attention `hopper/flash_fwd_combine_kernel.h` at 0251105a (max over the LSE slots with
fmaxf, the -inf guard `max_scale = lse_max == -INFINITY ? 0 : lse_max`, `inv_sum = (sum == 0 || sum != sum) ? 0 :
1 / sum`, output accumulated only for scales > 0) and `flash_fwd_combine_launch_template.h` (kMax slots).
"""

import math

import pytest
import torch

from refmodel.combine import flash_attn_combine, merge_states

LN3 = math.log(3.0)


def partials(lse_rows, out_rows):
    """(S, b=1, sq=1, h=len(rows), dv) partials from per-split lists: lse_rows[s][h], out_rows[s][h][dv]."""
    lse = torch.tensor(lse_rows, dtype=torch.float32).reshape(len(lse_rows), 1, 1, -1)
    out = torch.tensor(out_rows, dtype=torch.float32).reshape(len(out_rows), 1, 1, lse.shape[-1], -1)
    return out, lse


def test_two_splits_weigh_by_exp_lse():
    # lse (0, ln 3): M = ln 3, w = (1/3, 1), Z = 4/3, LSE = ln(4/3) + ln 3 = ln 4, scales (1/4, 3/4)
    o, l = partials([[0.0], [LN3]], [[[1.0, 0.0]], [[0.0, 1.0]]])
    out, lse = flash_attn_combine(o, l)
    assert out.reshape(-1).tolist() == pytest.approx([0.25, 0.75], abs=1e-6)
    assert float(lse) == pytest.approx(math.log(4.0), abs=1e-6)
    assert out.dtype == torch.float32 and out.shape == (1, 1, 1, 2) and lse.shape == (1, 1, 1)


def test_all_neg_inf_row_is_zero_and_neg_inf_even_over_garbage():
    # the -inf guard: M = -inf -> shift 0, w = 0, Z = 0 -> inv 0: every scale is 0, no split is read
    o, l = partials([[-math.inf], [-math.inf]], [[[math.nan, math.inf]], [[math.nan, -math.inf]]])
    out, lse = flash_attn_combine(o, l)
    assert out.reshape(-1).tolist() == [0.0, 0.0] and float(lse) == -math.inf
    # negative control: without the guard exp(-inf - -inf) is NaN, so the LSE is NaN
    _, lse = flash_attn_combine(o, l, guard_neg_inf=False)
    assert math.isnan(float(lse))


def test_garbage_behind_a_neg_inf_split_is_never_read():
    o, l = partials([[0.0], [-math.inf]], [[[2.0, 4.0]], [[math.nan, math.inf]]])
    out, lse = flash_attn_combine(o, l)
    assert out.reshape(-1).tolist() == [2.0, 4.0] and float(lse) == 0.0
    # negative control: accumulating zero-weighted splits lets 0 * NaN in
    out, _ = flash_attn_combine(o, l, skip_nonpositive=False)
    assert math.isnan(float(out.reshape(-1)[0]))


def test_a_nan_lse_makes_the_row_nan_and_its_output_zero():
    # fmaxf ignores the NaN (M = 0); Z = NaN + 1 = NaN -> LSE NaN, inv_sum 0 -> every scale 0 (skipped)
    o, l = partials([[math.nan], [0.0]], [[[5.0, 5.0]], [[7.0, 7.0]]])
    out, lse = flash_attn_combine(o, l)
    assert out.reshape(-1).tolist() == [0.0, 0.0] and math.isnan(float(lse))
    # the negative-control path (no skip) keeps the NaN LSE too
    out, lse = flash_attn_combine(o, l, skip_nonpositive=False)
    assert math.isnan(float(lse))


def test_nan_in_every_slot_is_a_nan_max():
    # S = 16 = kMax(16, dv 2): every slot NaN -> fmaxf gives NaN (the model's documented max rule, observable
    # only on the no-skip negative-control path: the row is NaN throughout)
    o = torch.ones(16, 1, 1, 1, 2)
    l = torch.full((16, 1, 1, 1), math.nan)
    out, lse = flash_attn_combine(o, l, skip_nonpositive=False)
    assert math.isnan(float(lse)) and all(math.isnan(x) for x in out.reshape(-1).tolist())


def test_capacity_reads_only_the_first_kmax_splits():
    # kMax = 2 of S = 3: lse (0, 0, [0]) -> the third split is never read: out = (1 + 3) / 2, LSE = ln 2
    o, l = partials([[0.0], [0.0], [0.0]], [[[1.0]], [[3.0]], [[100.0]]])
    out, lse = flash_attn_combine(o, l, capacity=2)
    assert float(out) == pytest.approx(2.0) and float(lse) == pytest.approx(math.log(2.0))
    out, lse = flash_attn_combine(o, l)          # kMax(3, 1) = 16: all three
    assert float(out) == pytest.approx(104.0 / 3) and float(lse) == pytest.approx(LN3)


def test_per_batch_counts_and_the_single_split_write_through():
    # b = 2 batches of one row: batch 0 reads 2 splits, batch 1 has count 1 (written through: out = split 0)
    lse = torch.zeros(3, 2, 1, 1)
    out = torch.tensor([1.0, 10.0, 100.0]).reshape(3, 1, 1, 1, 1).expand(3, 2, 1, 1, 1).clone()
    lse[0, 1] = 5.0
    o, l = flash_attn_combine(out, lse, num_splits_per_batch=[2, 1])
    assert o.reshape(-1).tolist() == pytest.approx([5.5, 1.0]) and l.reshape(-1).tolist()[1] == 5.0
    assert l.reshape(-1).tolist()[0] == pytest.approx(math.log(2.0))
    o, _ = flash_attn_combine(out, lse, num_splits_per_batch=torch.tensor([3, 0]))
    assert o.reshape(-1).tolist() == pytest.approx([37.0, 1.0])   # batch 1: count 0 <= 1 writes split 0 through
    # counts above kMax are read up to kMax: capacity 2 and count 3 read 2 splits
    o, _ = flash_attn_combine(out, lse, num_splits_per_batch=[3, 3], capacity=2)
    assert o.reshape(-1).tolist()[0] == pytest.approx(5.5)


def test_varlen_rows_take_their_batchs_count():
    # varlen (S, total_q, h, dv): rows 0, 1 belong to batch 0 (2 splits), row 2 to batch 1 (3 splits)
    out = torch.tensor([1.0, 10.0, 100.0]).reshape(3, 1, 1, 1).expand(3, 3, 1, 1).clone()
    lse = torch.zeros(3, 3, 1)
    o, l = flash_attn_combine(out, lse, num_splits_per_batch=[2, 3], batch_of_row=[0, 0, 1])
    assert o.shape == (3, 1, 1) and l.shape == (3, 1)
    assert o.reshape(-1).tolist() == pytest.approx([5.5, 5.5, 37.0])
    o, l = flash_attn_combine(out, lse)                           # no counts: all 3 splits everywhere
    assert o.reshape(-1).tolist() == pytest.approx([37.0] * 3)


def test_lse_comes_back_as_a_transposed_b_h_sq_buffer():
    o = torch.zeros(2, 2, 3, 4, 8)
    l = torch.zeros(2, 2, 3, 4)
    out, lse = flash_attn_combine(o, l)
    assert lse.shape == (2, 3, 4) and lse.stride() == (12, 1, 3)
    target = torch.empty(2, 3, 4, 8, dtype=torch.bfloat16)
    out, _ = flash_attn_combine(o, l, out=target, out_dtype=torch.bfloat16)
    assert out is target
    assert flash_attn_combine(o, l, out_dtype=torch.float16)[0].dtype == torch.float16


def test_a_single_split_is_copied_not_aliased():
    o = torch.ones(1, 1, 1, 1, 2)
    l = torch.zeros(1, 1, 1, 1)
    out, lse = flash_attn_combine(o, l)
    out.add_(1.0)
    lse.add_(1.0)
    assert o.reshape(-1).tolist() == [1.0, 1.0] and float(l) == 0.0


def test_garbage_rows_are_recomputed_only_from_read_splits():
    # many rows so the loop path (>= 2^15 elements per split) runs; one row has an inf behind -inf
    rows, dv = 64, 1024
    o = torch.ones(2, rows, 1, dv)
    l = torch.zeros(2, rows, 1)
    l[1, 5] = -math.inf
    o[1, 5, 0, 0] = math.inf
    out, lse = flash_attn_combine(o, l)
    assert bool(torch.isfinite(out).all()) and float(out[5, 0, 0]) == 1.0 and float(out[6, 0, 0]) == 1.0
    assert float(lse[5, 0]) == 0.0 and float(lse[6, 0]) == pytest.approx(math.log(2.0))


def test_merge_states_on_hand_values():
    a = (torch.tensor([[1.0, 0.0]]), torch.tensor([0.0]))
    b = (torch.tensor([[0.0, 1.0]]), torch.tensor([LN3]))
    out, lse = merge_states(a, b)
    assert out.reshape(-1).tolist() == pytest.approx([0.25, 0.75]) and float(lse) == pytest.approx(math.log(4.0))
    empty = (torch.tensor([[math.nan, math.nan]]), torch.tensor([-math.inf]))
    out, lse = merge_states(empty, b)
    assert out.reshape(-1).tolist() == [0.0, 1.0] and float(lse) == pytest.approx(LN3)
    _, lse = merge_states(empty, empty, guard_neg_inf=False)
    assert math.isnan(float(lse))
    out, _ = merge_states(empty, b, skip_nonpositive=False)
    assert math.isnan(float(out.reshape(-1)[0]))
    with pytest.raises(ValueError, match=r"^a/b: states must agree: out \(1, 2\) vs \(1, 3\), lse \(1,\) vs \(1,\)$"):
        merge_states(a, (torch.zeros(1, 3), torch.zeros(1)))
    with pytest.raises(ValueError, match="^a/b"):
        merge_states(a, (torch.zeros(1, 2), torch.zeros(2)))
    with pytest.raises(ValueError, match="^a/b"):
        merge_states((torch.zeros(2, 2), torch.zeros(1)), (torch.zeros(2, 2), torch.zeros(1)))


O5 = torch.zeros(3, 3, 2, 2, 4)
L5 = torch.zeros(3, 3, 2, 2)


@pytest.mark.parametrize("args, kwargs, message", [
    ((O5.double(), L5), {}, "out_partial: must be float32 (FA3's combine only supports fp32 partials), got torch.float64"),
    ((O5, L5.half()), {}, "lse_partial: must be float32 (FA3's combine only supports fp32 partials), got torch.float16"),
    (([1.0], L5), {}, "out_partial: must be a tensor, got list"),
    ((O5, None), {}, "lse_partial: must be a tensor, got NoneType"),
    ((O5[0, 0], L5[0, 0]), {}, "out_partial: must be (S, b, sq, h, dv) or varlen (S, total_q, h, dv), got (2, 2, 4)"),
    ((O5, L5[:, :2]), {}, "lse_partial: shape must be out_partial's without dv, (3, 3, 2, 2), got (3, 2, 2, 2)"),
    ((torch.zeros(257, 1, 1, 1, 1), torch.zeros(257, 1, 1, 1)), {},
     "out_partial: split count (dim 0) must lie in [1, 256], got 257"),
    ((torch.zeros(0, 1, 1, 1, 1), torch.zeros(0, 1, 1, 1)), {}, "out_partial: split count (dim 0) must lie in [1, 256], got 0"),
    ((O5, L5), {"out_dtype": torch.float64}, "out_dtype: must be one of float32, float16, bfloat16, got torch.float64"),
    ((O5, L5), {"out": torch.empty(3, 2, 2, 4, dtype=torch.half)}, "out: dtype must be the output dtype torch.float32, got torch.float16"),
    ((O5, L5), {"out": torch.empty(3, 2, 2, 5)}, "out: shape must be (3, 2, 2, 4), got (3, 2, 2, 5)"),
    ((O5, L5), {"capacity": 0}, "capacity: must be >= 1, got 0"),
    ((O5, L5), {"num_splits_per_batch": [2, 2]}, "num_splits_per_batch: must have length b=3, got 2"),
    ((O5, L5), {"num_splits_per_batch": [2, -1, 2]}, "num_splits_per_batch: entries must be >= 0, got [2, -1, 2]"),
    ((O5, L5), {"num_splits_per_batch": [2, 9, 2]},
     "num_splits_per_batch: rows would read 9 splits (min(count, capacity=16)); allowed range is [0, 3], the partial "
     "buffers' split count"),
    ((O5, L5), {"batch_of_row": [0, 0, 1]}, "batch_of_row: is only meaningful together with num_splits_per_batch"),
    ((O5, L5), {"num_splits_per_batch": [1, 1, 1], "batch_of_row": [0, 0, 1]},
     "batch_of_row: is only for the varlen layout (S, total_q, h); the batched layout implies it"),
    ((O5[:, 0], L5[:, 0]), {"num_splits_per_batch": [1]},
     "batch_of_row: is required with num_splits_per_batch in the varlen layout (S, total_q, h)"),
    ((O5[:, 0], L5[:, 0]), {"num_splits_per_batch": [1], "batch_of_row": [0]},
     "batch_of_row: must have length total_q=2, got 1"),
    ((O5[:, :, 0], L5[:, :, 0]), {"num_splits_per_batch": [1], "batch_of_row": [0]},
     "batch_of_row: must have length total_q=3, got 1"),
    ((O5[:, 0], L5[:, 0]), {"num_splits_per_batch": [1], "batch_of_row": [0, 1]},
     "batch_of_row: entries must lie in [0, 1), got [0, 1]"),
    ((O5[:, 0], L5[:, 0]), {"num_splits_per_batch": [1], "batch_of_row": [-1, 0]},
     "batch_of_row: entries must lie in [0, 1), got [-1, 0]"),
])
def test_refusals_name_the_argument_and_the_allowed_range(args, kwargs, message):
    with pytest.raises(ValueError) as info:
        flash_attn_combine(*args, **kwargs)
    assert str(info.value) == message


def test_the_per_split_loop_accumulates_the_same_row_sums():
    # S * rows * dv = 32 * 64 * 1024 = 2^21 and rows * dv = 2^16: the combine takes its in-place per-split loop.
    # Row r's lse_s = s * r / 1000 and O_s = s + 1 (constant rows): O = sum_s softmax(lse)_s * (s + 1), in float64 here.
    S, rows, dv = 32, 64, 1024
    s_idx = torch.arange(S, dtype=torch.float64).reshape(S, 1)
    lse64 = s_idx * torch.arange(rows, dtype=torch.float64).reshape(1, rows) / 1000.0
    o = (s_idx + 1).reshape(S, 1, 1, 1).expand(S, rows, 1, dv).float().clone()
    out, lse = flash_attn_combine(o, lse64.float().reshape(S, rows, 1))
    w = torch.softmax(lse64, dim=0)
    want = (w * (s_idx + 1)).sum(dim=0)
    assert out.shape == (rows, 1, dv)
    assert torch.allclose(out[:, 0, :].double(), want.reshape(rows, 1).expand(rows, dv), rtol=1e-5, atol=1e-5)
    assert torch.allclose(lse[:, 0].double(), torch.logsumexp(lse64, dim=0), rtol=1e-6, atol=1e-5)


def test_a_positive_infinite_lse_makes_the_row_nan():
    # fmaxf gives M = +inf, not -inf, so no guard: w = (exp(inf - inf), exp(0 - inf)) = (NaN, 0), Z = NaN -> LSE NaN,
    # inv_sum 0, both scales not > 0: nothing is accumulated
    o, l = partials([[math.inf], [0.0]], [[[5.0]], [[7.0]]])
    out, lse = flash_attn_combine(o, l)
    assert math.isnan(float(lse)) and float(out) == 0.0


def test_a_capacity_of_one_reads_one_split():
    # kMax = 1 is a valid capacity: only slot 0 is read, so O = O_0 and LSE = lse_0
    o, l = partials([[0.0], [0.0]], [[[1.0]], [[3.0]]])
    out, lse = flash_attn_combine(o, l, capacity=1)
    assert float(out) == 1.0 and float(lse) == 0.0


def test_the_largest_split_count_is_accepted():
    # S = 256 = FA3's limit (and kMax(256, dv) = 256): equal lse, so O = mean = 1 and LSE = ln 256
    out, lse = flash_attn_combine(torch.ones(256, 1, 1, 1, 8), torch.zeros(256, 1, 1, 1))
    assert out.reshape(-1).tolist() == pytest.approx([1.0] * 8) and float(lse) == pytest.approx(math.log(256.0))


def test_a_count_of_one_writes_split_zero_through_even_behind_neg_inf():
    # count <= 1: the combine writes nothing, the main kernel's split-0 output stands (here: O_0 = 5, lse_0 = -inf);
    # combining that one split instead would give scale 0 and O = 0
    lse = torch.tensor([[-math.inf, 0.0], [-math.inf, 0.0]]).reshape(2, 2, 1, 1)
    out = torch.tensor([[5.0, 1.0], [6.0, 3.0]]).reshape(2, 2, 1, 1, 1)
    o, l = flash_attn_combine(out, lse, num_splits_per_batch=[1, 2])
    assert o.reshape(-1).tolist() == [5.0, pytest.approx(2.0)]
    assert l.reshape(-1).tolist()[0] == -math.inf


class TestTheNoSkipNegativeControlPath:
    """``skip_nonpositive=False`` accumulates every read split; its inverse is FA3's guarded ``inv_sum``."""

    def test_an_empty_row_has_a_zero_inverse_not_an_infinite_one(self):
        # all -inf: shift 0 (the guard), w = 0, Z = 0 -> inv_sum 0 (not 1/0), scales 0: O = 0 * 3 = 0, LSE = -inf
        o, l = partials([[-math.inf], [-math.inf]], [[[3.0]], [[3.0]]])
        out, lse = flash_attn_combine(o, l, skip_nonpositive=False)
        assert float(out) == 0.0 and float(lse) == -math.inf

    def test_one_finite_split_has_scale_one(self):
        # lse (0, -inf): w = (1, 0), Z = 1, inv_sum = 1: O = 1 * 3 + 0 * 100 = 3, LSE = 0
        o, l = partials([[0.0], [-math.inf]], [[[3.0]], [[100.0]]])
        out, lse = flash_attn_combine(o, l, skip_nonpositive=False)
        assert float(out) == 3.0 and float(lse) == 0.0

    def test_splits_past_the_row_count_are_not_read(self):
        # count 2 of S = 3: slot 2 holds -inf, so its scale is 0 whatever O_2 holds: O = (1 + 3) / 2
        lse = torch.zeros(3, 1, 1, 1)
        out = torch.tensor([1.0, 3.0, 100.0]).reshape(3, 1, 1, 1, 1)
        o, l = flash_attn_combine(out, lse, num_splits_per_batch=[2], skip_nonpositive=False)
        assert float(o) == pytest.approx(2.0) and float(l) == pytest.approx(math.log(2.0))
        out[2] = math.nan      # garbage in the unread split: 0 * NaN must not reach the row
        o, _ = flash_attn_combine(out, lse, num_splits_per_batch=[2], skip_nonpositive=False)
        assert float(o) == pytest.approx(2.0)


def test_merge_states_keeps_leading_dimensions():
    # states shaped (b=2, h=3, dv=4): lse 0 and ln 3 everywhere -> scales (1/4, 3/4) per row, LSE ln 4
    a = (torch.ones(2, 3, 4), torch.zeros(2, 3))
    b = (torch.full((2, 3, 4), 5.0), torch.full((2, 3), LN3))
    out, lse = merge_states(a, b)
    assert out.shape == (2, 3, 4) and lse.shape == (2, 3)
    assert torch.allclose(out, torch.full((2, 3, 4), 4.0)) and torch.allclose(lse, torch.full((2, 3), math.log(4.0)))
    with pytest.raises(ValueError, match="^a/b"):
        merge_states((torch.ones(2, 3, 4), torch.zeros(2)), (torch.ones(2, 3, 4), torch.zeros(2)))
