"""Kernel adapters on CPU: the emulated FA3 kernel, and the CPU-checkable parts of the real-FA3 adapter.

Tolerance rule (FA3's own, via ``refmodel.tolerance.fa3_output_close``): an output is accepted when
``max|out - exact| <= 2 * max|lowp - exact| + atol``, where ``exact`` is refmodel's float64 attention and
``lowp`` a same-precision reference (inputs rounded to their dtype, float32 softmax, P rounded to the input
dtype), for bf16 and float32 inputs alike. ``atol`` is refmodel's 1e-3 plus FA3's ``fwd_atol`` (hopper's
``test_flash_attn.py``: ``2 * (out_ref + 0.3 - 0.3 - out_ref)`` in the output dtype, i.e. the output dtype's
rounding at the output's magnitude): the kernel returns q's dtype, so a bf16 output of magnitude 2..4 carries
up to 0.0078 of pure rounding that ``lowp`` (left in float32) does not have. LSEs (float32 on both sides,
natural log) must agree within ``1e-3`` absolute.

Head dims are always real (64 or 128): FA3's tiles depend on them.
"""

from __future__ import annotations


import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import refmodel
from gpu_impl.errors import KernelUnavailable, MetadataShapeError, OutOfBoundsAccess
from gpu_impl.kernels import available, load, register
from gpu_impl.kernels.base import CallArgs, KernelAdapter, build_tile_plan, call_schedule, call_shape, check_plan
from gpu_impl.kernels.emulated import EmulatedKernel
from gpu_impl.kernels.fa3 import effective_call_inputs, find_fa3_module, gather_paged_kv
from refmodel.fa3_scheduler import resolve_schedule
from refmodel.metadata import UNWRITTEN, decode_metadata
from refmodel.tolerance import ATOL, fa3_output_close, reference_outputs

LSE_ATOL = 1e-3


# ----------------------------------------------------------------------------------------------------------
# Call builders
# ----------------------------------------------------------------------------------------------------------


def paged_cache(lens, num_heads_k, d, dtype, page_size, width_pages=None, seed=0, fill=True):
    """Paged K/V + page table for sequences of `lens` (pages laid out in order, shuffled per sequence)."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_seq = [max(1, -(-L // page_size)) for L in lens]
    width = width_pages or max(pages_per_seq)
    total = sum(pages_per_seq)
    perm = torch.randperm(total, generator=gen).to(torch.int32)
    table = torch.zeros(len(lens), width, dtype=torch.int32)
    off = 0
    for i, n in enumerate(pages_per_seq):
        table[i, :n] = perm[off:off + n]
        off += n
    shape = (total, page_size, num_heads_k, d)
    if fill:
        k = torch.randn(shape, generator=gen).to(dtype)
        v = torch.randn(shape, generator=gen).to(dtype)
    else:
        k, v = torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)
    return k, v, table


def contiguous_cache(lens, num_heads_k, d, dtype, width=None, seed=0, fill=True):
    gen = torch.Generator().manual_seed(seed)
    shape = (len(lens), width or max(max(lens), 1), num_heads_k, d)
    if fill:
        return torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)
    return torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)


def queries(b, lq, num_heads, d, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, lq, num_heads, d, generator=gen).to(dtype)


def output_rounding_atol(exact: torch.Tensor, dtype: torch.dtype) -> float:
    """FA3's ``fwd_atol``: twice the rounding of ``x + 0.3 - 0.3`` in the output dtype, over the output."""
    r = exact.to(dtype)
    return 2 * (r + 0.3 - 0.3 - r).abs().max().item() if r.numel() else 0.0


def assert_matches_oracle(out, lse, q, k, v, **kw):
    exact, lowp = reference_outputs(q, k, v, **kw)
    ok, err, bound = fa3_output_close(out, exact, lowp, atol=ATOL + output_rounding_atol(exact, out.dtype))
    assert ok, f"output error {err:.3g} > FA3 bound {bound:.3g}"
    _, ref_lse = refmodel.attention(q, k, v, **kw)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse)), "LSE finiteness differs from the oracle"
    if finite.any():
        assert (lse[finite].double() - ref_lse[finite].double()).abs().max().item() <= LSE_ATOL


# ----------------------------------------------------------------------------------------------------------
# Registry and interface
# ----------------------------------------------------------------------------------------------------------


def test_registry_loads_emulated_and_rejects_unknown():
    kern = load("emulated")
    assert kern.name == "emulated" and kern.mode == "strict"
    assert "emulated FA3" in kern.describe()
    assert {"emulated", "fa3"} <= set(available())
    with pytest.raises(ValueError, match="unknown kernel adapter"):
        load("nope")
    with pytest.raises(ValueError, match="mode"):
        load("emulated", mode="lenient")


def test_registry_accepts_new_adapter():
    class Echo(EmulatedKernel):
        name = "echo-test"

    register("echo-test", lambda **kw: Echo(**kw), replace=True)
    kern = load("echo-test", mode="gpu-like")
    assert isinstance(kern, KernelAdapter) and kern.mode == "gpu-like"
    with pytest.raises(ValueError, match="already registered"):
        register("echo-test", lambda **kw: Echo(**kw))


@pytest.mark.parametrize("arg,value", [("k", torch.zeros(1)), ("rotary_cos", torch.zeros(1)),
                                       ("cache_batch_idx", torch.zeros(1, dtype=torch.int32)),
                                       ("attention_chunk", 4), ("q_descale", torch.ones(1))])
def test_unsupported_arguments_name_themselves(arg, value):
    """The real-kernel adapter's refusal (the emulated adapter models these: tests/oracle/test_fa3_interface.py)."""
    from gpu_impl.kernels.base import reject_unsupported

    with pytest.raises(NotImplementedError, match=rf"^{arg}:"):
        reject_unsupported("fa3", {arg: value})
    reject_unsupported("fa3", {"rotary_seqlens": torch.zeros(1, dtype=torch.int32)})   # FA3 ignores it alone


def test_fa3_unavailable_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA present: unavailability is tested on CPU machines")
    with pytest.raises(KernelUnavailable, match="CUDA is not available"):
        load("fa3")


def test_find_fa3_module_lists_every_failure():
    with pytest.raises(KernelUnavailable) as info:
        find_fa3_module(["no_such_fa3_module_x", "no_such_fa3_module_y"])
    assert "no_such_fa3_module_x" in str(info.value) and "no_such_fa3_module_y" in str(info.value)


# ----------------------------------------------------------------------------------------------------------
# Emulated vs oracle on fresh metadata (random shapes, real head dims)
# ----------------------------------------------------------------------------------------------------------


@st.composite
def call_cases(draw):
    b = draw(st.integers(1, 3))
    heads = draw(st.sampled_from([(4, 1), (4, 4), (8, 2)]))
    d = draw(st.sampled_from([64, 128]))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float32]))
    lens = draw(st.lists(st.integers(0, 900), min_size=b, max_size=b))
    varlen_q = draw(st.booleans())
    lqs = draw(st.lists(st.integers(1, 3), min_size=b, max_size=b)) if varlen_q else [draw(st.integers(1, 3))] * b
    page_size = draw(st.sampled_from([None, 1, 16, 64]))
    causal = draw(st.booleans())
    num_splits = draw(st.sampled_from([0, 0, 1, 3]))
    use_md = draw(st.booleans())
    num_sm = draw(st.sampled_from([132, 16]))
    window = draw(st.sampled_from([(-1, -1), (-1, -1), (200, 0), (300, -1)]))
    softcap = draw(st.sampled_from([0.0, 0.0, 30.0]))
    return dict(b=b, heads=heads, d=d, dtype=dtype, lens=lens, lqs=lqs, varlen_q=varlen_q, page_size=page_size,
                causal=causal, num_splits=num_splits, use_md=use_md, num_sm=num_sm, window=window, softcap=softcap)


def build_case(case, seed=0):
    b, (h, hk), d, dtype = case["b"], case["heads"], case["d"], case["dtype"]
    lens, lqs, ps = case["lens"], case["lqs"], case["page_size"]
    # every sequence's queries sit at the end of its keys (decode/extend), so lens >= lq is not required
    cache_seqlens = torch.tensor(lens, dtype=torch.int32)
    if ps is None:
        k, v = contiguous_cache(lens, hk, d, dtype, width=max(max(lens), 1) + 7, seed=seed)
        page_table = None
    else:
        k, v, page_table = paged_cache(lens, hk, d, dtype, ps, seed=seed)
    kw = dict(cache_seqlens=cache_seqlens, page_table=page_table, causal=case["causal"],
              window_size=case.get("window", (-1, -1)), softcap=case.get("softcap", 0.0))
    if case["varlen_q"]:
        gen = torch.Generator().manual_seed(seed + 1)
        q = torch.randn(sum(lqs), h, d, generator=gen).to(dtype)
        cu = torch.tensor([0] + list(torch.tensor(lqs).cumsum(0).tolist()), dtype=torch.int32)
        kw.update(cu_seqlens_q=cu, max_seqlen_q=max(lqs))
    else:
        q = queries(b, lqs[0], h, d, dtype, seed=seed + 1)
    return q, k, v, kw


@settings(max_examples=int(__import__("os").environ.get("KERNEL_EXAMPLES", "25")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(call_cases())
def test_emulated_matches_oracle_on_fresh_metadata(case):
    q, k, v, kw = build_case(case)
    kern = load("emulated", num_sm=case["num_sm"])
    call_kw = dict(kw, num_splits=case["num_splits"])
    if case["use_md"]:
        b, (h, hk), d = case["b"], case["heads"], case["d"]
        seqlen_k = k.shape[1] if kw["page_table"] is None else kw["page_table"].shape[1] * k.shape[1]
        md = kern.get_scheduler_metadata(
            b, max(case["lqs"]), seqlen_k, h, hk, d, kw["cache_seqlens"],
            qkv_dtype=torch.bfloat16, cu_seqlens_q=kw.get("cu_seqlens_q"),
            page_size=None if kw["page_table"] is None else k.shape[1], causal=case["causal"],
            window_size=kw["window_size"], has_softcap=kw["softcap"] > 0, num_splits=case["num_splits"])
        call_kw["scheduler_metadata"] = md
    out, lse, *_ = kern.flash_attn_with_kvcache(q, k, v, return_softmax_lse=True, **call_kw)
    trace = kern.last_trace
    event(f"S_c > 1: {trace['schedule']['num_splits'] > 1}; "
          f"per-batch splits > 1: {max(trace['metadata']['num_splits'], default=1) > 1}")
    assert trace["ok"] and trace["verdicts"] == []
    assert trace["metadata"]["source"] in ("metadata", "prepare")
    assert out.dtype == q.dtype and out.shape == q.shape
    assert_matches_oracle(out, lse, q, k, v, **kw)


def test_emulated_splits_for_real_in_the_random_domain():
    """The random domain above reaches S_c > 1 with per-batch split counts from the metadata."""
    case = dict(b=2, heads=(8, 2), d=128, dtype=torch.float32, lens=[900, 40], lqs=[1, 1], varlen_q=False,
                page_size=16, causal=True, num_splits=0, use_md=True, num_sm=132)
    q, k, v, kw = build_case(case)
    kern = load("emulated")
    md = kern.get_scheduler_metadata(2, 1, kw["page_table"].shape[1] * 16, 8, 2, 128, kw["cache_seqlens"],
                                     page_size=16, causal=True)
    out, lse, *_ = kern.flash_attn_with_kvcache(q, k, v, scheduler_metadata=md, return_softmax_lse=True, **kw)
    schedule = kern.last_trace["schedule"]
    assert schedule["num_splits"] > 1
    assert max(kern.last_trace["metadata"]["num_splits"]) > 1
    assert_matches_oracle(out, lse, q, k, v, **kw)


def test_non_varlen_call_without_metadata():
    """No cache_seqlens: no prepare step, every batch gets S_c splits (static scheduler)."""
    q = queries(2, 2, 8, 128, torch.float32)
    k, v = contiguous_cache([700, 700], 2, 128, torch.float32)
    kern = load("emulated")
    out, lse, *_ = kern.flash_attn_with_kvcache(q, k, v, num_splits=4, return_softmax_lse=True)
    assert kern.last_trace["metadata"]["source"] == "static" and kern.last_trace["schedule"]["num_splits"] == 4
    assert_matches_oracle(out, lse, q, k, v)


def test_split_count_one_ignores_metadata_split_counts():
    """S_c == 1 (num_splits=1 at the call): FA3 ignores md's split counts, even huge ones (harmless class)."""
    lens = [3000, 50]
    q = queries(2, 1, 8, 128, torch.float32)
    k, v, table = paged_cache(lens, 1, 128, torch.float32, 64)
    cs = torch.tensor(lens, dtype=torch.int32)
    kern = load("emulated")
    md = kern.get_scheduler_metadata(2, 1, table.shape[1] * 64, 8, 1, 128, cs, page_size=64, causal=True)
    assert decode_metadata(md, 2, True, True).num_splits[0] > 1
    out, lse, *_ = kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True,
                                            scheduler_metadata=md, num_splits=1, return_softmax_lse=True)
    assert kern.last_trace["ok"] and kern.last_trace["schedule"]["num_splits"] == 1
    assert_matches_oracle(out, lse, q, k, v, cache_seqlens=cs, page_table=table, causal=True)


def test_stale_cache_seqlens_are_harmless():
    """Metadata from older lengths, same b: the KV ranges use the call's own lengths (harmless class)."""
    q = queries(3, 1, 8, 128, torch.float32)
    k, v, table = paged_cache([900, 400, 10], 2, 128, torch.float32, 16)
    kern = load("emulated")
    old = torch.tensor([880, 390, 9], dtype=torch.int32)
    new = torch.tensor([900, 400, 10], dtype=torch.int32)
    md = kern.get_scheduler_metadata(3, 1, table.shape[1] * 16, 8, 2, 128, old, page_size=16, causal=True)
    out, lse, *_ = kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=new, page_table=table, causal=True,
                                            scheduler_metadata=md, return_softmax_lse=True)
    assert kern.last_trace["ok"]
    assert_matches_oracle(out, lse, q, k, v, cache_seqlens=new, page_table=table, causal=True)


# ----------------------------------------------------------------------------------------------------------
# docs/facts-fa3.md's worked example: 8 sequences (32768 + 7 x 100), H=32, Hk=4, d=128, bf16, causal, num_splits=0
# ----------------------------------------------------------------------------------------------------------

WORKED_LENS = [32768] + [100] * 7
H, HK, D = 32, 4, 128


@pytest.fixture(scope="module")
def worked_paged():
    """Paged (page_size 1, as sglang) worked-example call; page-table width 32768 (= max length)."""
    k, v, table = paged_cache(WORKED_LENS, HK, D, torch.bfloat16, page_size=1, seed=3)
    q = queries(8, 1, H, D, torch.bfloat16, seed=4)
    cs = torch.tensor(WORKED_LENS, dtype=torch.int32)
    return q, k, v, table, cs


def worked_metadata(kern, cs, heads, heads_k, page_size=1):
    return kern.get_scheduler_metadata(8, 1, max(WORKED_LENS), heads, heads_k, D, cs, qkv_dtype=torch.bfloat16,
                                       page_size=page_size, causal=True, num_splits=0)


def test_worked_example_strict_raises_split_bound(worked_paged):
    q, k, v, table, cs = worked_paged
    kern = load("emulated", mode="strict")
    md = worked_metadata(kern, cs, H // 4, max(1, HK // 4))  # sglang's tp=4 head counts: 8 / 1
    with pytest.raises(OutOfBoundsAccess) as info:
        kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True,
                                     scheduler_metadata=md, num_splits=0)
    exc = info.value
    assert exc.invariant == "SPLIT_BOUND" and exc.batch == 0
    assert exc.indices["splits"] == list(range(29, 86))
    assert "SPLIT_BOUND" in str(exc) and "batch 0" in str(exc) and "29..85" in str(exc)
    assert "COMBINE_CAPACITY" in [v.invariant for v in exc.violations]  # 86 > kMax = 32 as well
    trace = kern.last_trace
    assert trace["schedule"]["num_splits"] == 29 and trace["metadata"]["num_splits"][0] == 86
    assert trace["schedule"]["metadata_size"] == 33 and trace["numerics"] == "skipped"
    # runtime is measured in the benchmarks (fa3verify bench), not asserted here


def test_worked_example_strict_contiguous_cache():
    """Contiguous cache (causal dropped for decode, kBlockN 176): S_c = 29, metadata from 8/1 heads gives 94."""
    q = queries(8, 1, H, D, torch.bfloat16)
    k, v = contiguous_cache(WORKED_LENS, HK, D, torch.bfloat16, fill=False)  # never read: the fault is certain
    cs = torch.tensor(WORKED_LENS, dtype=torch.int32)
    kern = load("emulated")
    md = worked_metadata(kern, cs, 8, 1, page_size=None)
    with pytest.raises(OutOfBoundsAccess) as info:
        kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, causal=True, scheduler_metadata=md)
    assert info.value.invariant == "SPLIT_BOUND" and info.value.batch == 0
    assert info.value.indices["splits"] == list(range(29, 94))


def test_worked_example_gpu_like_poisons_batch_zero(worked_paged):
    q, k, v, table, cs = worked_paged
    kern = load("emulated", mode="gpu-like")
    md = worked_metadata(kern, cs, 8, 1)
    out, lse, *_ = kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True,
                                            scheduler_metadata=md, return_softmax_lse=True)
    assert torch.isnan(out[0]).all() and torch.isnan(lse[0]).all()
    assert not torch.isnan(out[1:]).any() and not torch.isnan(lse[1:]).any()
    assert kern.last_trace["poisoned_batches"] == [0]
    assert [v["invariant"] for v in kern.last_trace["verdicts"]][0] == "SPLIT_BOUND"
    # a verdict is spec's Violation: the offending indices under "detail", the sentence under "message"
    first = kern.last_trace["verdicts"][0]
    assert list(first) == ["invariant", "batch", "detail", "message"] and first["batch"] == 0
    assert first["detail"]["splits"] == list(range(29, 86)) and "splits 29..85" in first["message"]
    assert kern.last_trace["numerics"] == "computed (poisoned batches skipped)"  # no work on batch 0
    # the other seven sequences are still right: compare them with the oracle on their own
    sub = dict(cache_seqlens=cs[1:], page_table=table[1:], causal=True)
    assert_matches_oracle(out[1:], lse[1:], q[1:], k, v, **sub)


def test_worked_example_fresh_metadata_matches_oracle(worked_paged):
    q, k, v, table, cs = worked_paged
    kern = load("emulated")
    md = worked_metadata(kern, cs, H, HK)  # the call's own head counts (the fix)
    try:
        out, lse, *_ = kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True,
                                                scheduler_metadata=md, return_softmax_lse=True)
    except MemoryError as exc:
        # the metadata check passed before the numerics were refused
        assert kern.last_trace["ok"] and kern.last_trace["metadata"]["num_splits"][0] == 29
        pytest.fail(f"numerics refused as too large for this machine: {exc}")
    assert kern.last_trace["ok"] and kern.last_trace["metadata"]["num_splits"][0] == 29
    assert_matches_oracle(out, lse, q, k, v, cache_seqlens=cs, page_table=table, causal=True)


# ----------------------------------------------------------------------------------------------------------
# Negative controls: each invariant fires, with the right batch and indices
# ----------------------------------------------------------------------------------------------------------


def small_decode(lens, heads=(8, 2), page_size=16, dtype=torch.float32, fill=True):
    q = queries(len(lens), 1, heads[0], 128, dtype)
    k, v, table = paged_cache(lens, heads[1], 128, dtype, page_size, fill=fill)
    return q, k, v, table, torch.tensor(lens, dtype=torch.int32)


def test_unwritten_batch_idx_slot_is_batch_permutation():
    """Metadata for 3 sequences, call with 4 (same b4 = 4): the call reads slot 3, never written."""
    q, k, v, table, cs = small_decode([900, 300, 40, 20])
    kern = load("emulated")
    md = kern.get_scheduler_metadata(3, 1, table.shape[1] * 16, 8, 2, 128, cs[:3], page_size=16, causal=True)
    assert md.numel() == 4 * 4 + 1 and int(md[2 * 4 + 3]) == UNWRITTEN
    with pytest.raises(OutOfBoundsAccess) as info:
        kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True, scheduler_metadata=md)
    assert info.value.invariant == "BATCH_PERMUTATION"
    assert info.value.indices.get("virtual_batch") == 3
    # gpu-like: the batch no tile visits is garbage (NaN), the others are computed
    out = load("emulated", mode="gpu-like").flash_attn_with_kvcache(
        q, k, v, cache_seqlens=cs, page_table=table, causal=True, scheduler_metadata=md)
    nan_batches = [i for i in range(4) if torch.isnan(out[i]).any()]
    assert nan_batches and not torch.isnan(out[0]).any()


def test_batch_idx_out_of_range_is_batch_permutation():
    q, k, v, table, cs = small_decode([900, 300, 40, 20])
    kern = load("emulated")
    md = kern.get_scheduler_metadata(4, 1, table.shape[1] * 16, 8, 2, 128, cs, page_size=16, causal=True).clone()
    md[2 * 4 + 1] = 7  # varlen_batch_idx[1] = 7: outside the call's 4 batches
    with pytest.raises(OutOfBoundsAccess) as info:
        kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True, scheduler_metadata=md)
    assert info.value.invariant == "BATCH_PERMUTATION"


def test_reduced_m_blocks_is_query_cover():
    """Metadata computed for 1 query row per sequence, call with 40 rows: m-blocks do not cover the rows."""
    lens, lq = [600, 500], 40
    q = queries(2, lq, 8, 128, torch.float32)
    k, v, table = paged_cache(lens, 2, 128, torch.float32, 16)
    cs = torch.tensor(lens, dtype=torch.int32)
    kern = load("emulated")
    md = kern.get_scheduler_metadata(2, 1, table.shape[1] * 16, 8, 2, 128, cs, page_size=16, causal=True)
    with pytest.raises(OutOfBoundsAccess) as info:
        kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True, scheduler_metadata=md)
    exc = info.value
    assert exc.invariant == "QUERY_COVER" and exc.batch in (0, 1)
    # gpu-like: packed rows >= 128 (rows 16.. of the 8-heads-per-KV-head packing... ) are NaN, covered rows exact
    out, lse, *_ = load("emulated", mode="gpu-like").flash_attn_with_kvcache(
        q, k, v, cache_seqlens=cs, page_table=table, causal=True, scheduler_metadata=md, return_softmax_lse=True)
    qhpk = 4
    covered_rows = 128 // qhpk  # one m-block of 128 packed rows = 32 query rows for every head
    assert torch.isnan(out[:, covered_rows:]).all()
    assert not torch.isnan(out[:, :covered_rows]).any()
    ref, ref_lse = refmodel.attention(q, k, v, cache_seqlens=cs, page_table=table, causal=True)
    assert (out[:, :covered_rows].double() - ref[:, :covered_rows].double()).abs().max() < 1e-3


def test_split_count_above_capacity_is_combine_capacity():
    """A split count above kMax. kMax >= S_c always, so it also breaks SPLIT_BOUND (reported first)."""
    q, k, v, table, cs = small_decode([2000, 30], fill=False)
    kern = load("emulated")
    md = kern.get_scheduler_metadata(2, 1, table.shape[1] * 16, 8, 2, 128, cs, page_size=16, causal=True).clone()
    plan_md = decode_metadata(md, 2, True, True)
    vb = plan_md.batch_idx.index(0)
    md[vb] = 40  # kMax is 32 for this call (S_c <= 32, dv = 128)
    with pytest.raises(OutOfBoundsAccess) as info:
        kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True, scheduler_metadata=md)
    by_name = {v.invariant: v for v in info.value.violations}
    assert info.value.invariant == "SPLIT_BOUND"
    assert "COMBINE_CAPACITY" in by_name and by_name["COMBINE_CAPACITY"].batch == 0
    assert by_name["COMBINE_CAPACITY"].indices["splits"] == list(range(32, 40))
    assert kern.last_trace["combine_capacity"] == 32


def test_wrong_size_metadata_is_metadata_shape_error():
    q, k, v, table, cs = small_decode([300, 200, 100, 50])
    kern = load("emulated")
    cs5 = torch.tensor([300, 200, 100, 50, 10], dtype=torch.int32)
    md = kern.get_scheduler_metadata(5, 1, table.shape[1] * 16, 8, 2, 128, cs5, page_size=16, causal=True)
    with pytest.raises(MetadataShapeError, match="scheduler_metadata: shape must be"):
        kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True, scheduler_metadata=md)
    good = kern.get_scheduler_metadata(4, 1, table.shape[1] * 16, 8, 2, 128, cs, page_size=16, causal=True)
    with pytest.raises(MetadataShapeError, match="int32"):
        kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True,
                                     scheduler_metadata=good.to(torch.int64))


def test_gpu_like_without_fault_equals_strict():
    q, k, v, table, cs = small_decode([700, 100])
    md = load("emulated").get_scheduler_metadata(2, 1, table.shape[1] * 16, 8, 2, 128, cs, page_size=16, causal=True)
    a = load("emulated").flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True,
                                                 scheduler_metadata=md)
    b = load("emulated", mode="gpu-like").flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table,
                                                                  causal=True, scheduler_metadata=md)
    assert torch.equal(a, b)


def test_call_prepare_uses_kernel_tiles():
    """Without metadata the call's own prepare step runs with the kernel's tiles and forced PackGQA."""
    q, k, v, table, cs = small_decode([900, 100], fill=False)
    shape = call_shape(q, k, v, cs, None, table)
    args = CallArgs(q=q, k_cache=k, v_cache=v, cache_seqlens=cs, page_table=table, causal=True)
    schedule = call_schedule(shape, args)
    plan = build_tile_plan(shape, schedule)
    assert plan.source == "prepare" and plan.batch_idx == [0, 1]
    assert plan.num_m_blocks == [1, 1] and plan.num_splits[0] > 1


# ----------------------------------------------------------------------------------------------------------
# The real-FA3 adapter's CPU-checkable parts: page gather and the effective call shape
# ----------------------------------------------------------------------------------------------------------


def test_gather_paged_kv_matches_page_lookup():
    lens = [37, 5, 16]
    k, _, table = paged_cache(lens, 2, 64, torch.float32, page_size=8, width_pages=6)
    table[1, 3:] = -1  # unused tail entries may hold anything
    dense = gather_paged_kv(k, table)
    assert dense.shape == (3, 6 * 8, 2, 64) and dense.is_contiguous()
    for bb, L in enumerate(lens):
        for p in range(L):
            assert torch.equal(dense[bb, p], k[int(table[bb, p // 8]), p % 8])


def test_effective_call_inputs_for_a_build_without_paged_kv():
    q = queries(8, 1, H, D, torch.bfloat16)
    k, v, table = paged_cache(WORKED_LENS, HK, D, torch.bfloat16, page_size=1, fill=False)
    cs = torch.tensor(WORKED_LENS, dtype=torch.int32)
    native = effective_call_inputs(q, k, v, cs, page_table=table, causal=True, paged_kv_supported=True)
    gathered = effective_call_inputs(q, k, v, cs, page_table=table, causal=True, paged_kv_supported=False)
    assert native.page_size == 1 and gathered.page_size is None
    assert native.seqlen_k == gathered.seqlen_k == 32768
    s_native, s_gathered = resolve_schedule(native), resolve_schedule(gathered)
    assert s_native.masking.is_causal and s_native.block_n == 128
    assert not s_gathered.masking.is_causal and s_gathered.block_n == 176  # decode drops causal when contiguous
    # the hazard survives: metadata for the same (contiguous) shape with tp=4 heads over-splits the call
    md = refmodel.get_scheduler_metadata(8, 1, 32768, 8, 1, D, cs, page_size=None, causal=True)
    assert s_gathered.num_splits == 29 and decode_metadata(md, 8, True, False).num_splits[0] == 94
    assert md.numel() == s_gathered.metadata_size


# ----------------------------------------------------------------------------------------------------------
# The emulator's verdicts are spec.invariants' verdicts on the vectors the call reads
# ----------------------------------------------------------------------------------------------------------


def _negative_plans():
    kern = load("emulated")
    out = []
    # worked example, tp=4 metadata
    q = queries(8, 1, H, D, torch.bfloat16)
    k, v, table = paged_cache(WORKED_LENS, HK, D, torch.bfloat16, page_size=1, fill=False)
    cs = torch.tensor(WORKED_LENS, dtype=torch.int32)
    out.append(("worked", q, k, v, table, cs, worked_metadata(kern, cs, 8, 1)))
    # unwritten slot (b_p = 3, b_c = 4), out-of-range batch index, split count above capacity
    q, k, v, table, cs = small_decode([900, 300, 40, 20], fill=False)
    width = table.shape[1] * 16
    out.append(("unwritten", q, k, v, table, cs,
                kern.get_scheduler_metadata(3, 1, width, 8, 2, 128, cs[:3], page_size=16, causal=True)))
    md = kern.get_scheduler_metadata(4, 1, width, 8, 2, 128, cs, page_size=16, causal=True).clone()
    md[2 * 4 + 1] = 7
    out.append(("outside", q, k, v, table, cs, md))
    md = kern.get_scheduler_metadata(4, 1, width, 8, 2, 128, cs, page_size=16, causal=True).clone()
    md[0] = 40
    out.append(("capacity", q, k, v, table, cs, md))
    # reduced m-blocks
    q = queries(2, 40, 8, 128, torch.float32)
    k, v, table = paged_cache([600, 500], 2, 128, torch.float32, 16, fill=False)
    cs = torch.tensor([600, 500], dtype=torch.int32)
    out.append(("m_blocks", q, k, v, table, cs,
                kern.get_scheduler_metadata(2, 1, table.shape[1] * 16, 8, 2, 128, cs, page_size=16, causal=True)))
    return out


#: The invariant each negative plan breaks first (spec.invariants' order), and the batch it names.
EXPECTED_FIRST = {"worked": ("SPLIT_BOUND", 0), "unwritten": ("BATCH_PERMUTATION", 3),
                  "outside": ("BATCH_PERMUTATION", None), "capacity": ("SPLIT_BOUND", None),
                  "m_blocks": ("QUERY_COVER", None)}


@pytest.mark.parametrize("case", _negative_plans(), ids=lambda c: c[0])
def test_each_negative_plan_is_refused_with_spec_verdicts(case):
    name, q, k, v, table, cs, md = case
    shape = call_shape(q, k, v, cs, None, table)
    plan = build_tile_plan(shape, call_schedule(shape, CallArgs(q=q, k_cache=k, v_cache=v, cache_seqlens=cs,
                                                                page_table=table, causal=True)), md)
    found = check_plan(plan)
    invariant, batch = EXPECTED_FIRST[name]
    assert found and found[0].invariant == invariant
    if batch is not None:
        assert found[0].batch == batch


# ----------------------------------------------------------------------------------------------------------
# The real-FA3 adapter's plumbing, on CPU, against a fake FA3 module (the emulator behind FA3's signatures)
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_fa3(monkeypatch):
    """Pretend CUDA (sm90, 132 SMs) and a `fa3_fwd_interface` without paged KV, backed by the emulator."""
    import sys
    import types

    backend = EmulatedKernel(mode="gpu-like")
    calls = []

    def flash_attn_with_kvcache(q, k_cache, v_cache, **kw):
        assert kw.get("page_table") is None, "fa3-fwd has no paged KV: the adapter must gather"
        calls.append(kw)
        out, lse, *_ = backend.flash_attn_with_kvcache(q, k_cache, v_cache, **kw)
        s_c = backend.last_trace["schedule"]["num_splits"]
        accum = torch.empty(s_c, 1) if s_c > 1 else None
        return (out, lse, accum, None) if kw.get("return_softmax_lse") else out

    def get_scheduler_metadata(*args, **kw):
        assert kw.get("page_size") is None, "fa3-fwd has no paged KV: metadata must be for the contiguous call"
        return backend.get_scheduler_metadata(*args, **kw)

    module = types.ModuleType("fa3_fwd_interface")
    module.flash_attn_with_kvcache = flash_attn_with_kvcache
    module.get_scheduler_metadata = get_scheduler_metadata
    config = types.ModuleType("fa3_fwd_config")
    config.CONFIG = {"build_flags": {"FLASHATTENTION_DISABLE_PAGEDKV": True}}
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", module)
    monkeypatch.setitem(sys.modules, "fa3_fwd_config", config)
    props = types.SimpleNamespace(major=9, minor=0, multi_processor_count=132, name="fake H200")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: props)
    return calls


def test_fa3_adapter_plumbing_with_fake_module(fake_fa3):
    kern = load("fa3", mode="strict")
    assert kern.module_name == "fa3_fwd_interface" and not kern.paged_kv_supported
    assert "pages gathered" in kern.describe()
    q, k, v, table, cs = small_decode([900, 300, 40], heads=(8, 2), page_size=16)
    md = kern.get_scheduler_metadata(3, 1, table.shape[1] * 16, 8, 2, 128, cs, page_size=16, causal=True)
    out, lse, *_ = kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True,
                                            scheduler_metadata=md, return_softmax_lse=True)
    trace = kern.last_trace
    assert trace["ok"] and trace["launched"] and trace["gathered_paged_kv"]
    assert trace["schedule"]["page_size"] is None
    assert trace["observed_num_splits"] in (None, trace["schedule"]["num_splits"])
    assert_matches_oracle(out, lse, q, k, v, cache_seqlens=cs, page_table=table, causal=True)
    # strict refuses to launch a call whose metadata over-splits it; gpu-like launches
    bad = md.clone()
    bad[0] = 64
    with pytest.raises(OutOfBoundsAccess):
        kern.flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table, causal=True, scheduler_metadata=bad)
    assert kern.last_trace["launched"] is False and len(fake_fa3) == 1
    out = load("fa3", mode="gpu-like").flash_attn_with_kvcache(q, k, v, cache_seqlens=cs, page_table=table,
                                                               causal=True, scheduler_metadata=bad)
    assert len(fake_fa3) == 2 and torch.isnan(out).any()
