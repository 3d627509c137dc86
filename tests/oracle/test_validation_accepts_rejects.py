"""Pins of refmodel.validation and refmodel.errors: what FA3 accepts and rejects, at each edge.

Source: Dao-AILab/flash-attention `hopper/flash_api.cpp` at 0251105a. The precompute
(``mha_fwd_get_scheduler_metadata``, lines 548-550) checks only h % h_k; the call (``mha_fwd``) checks head
dims (780-792), their alignment (854-856), appended KV (931-933) and the split count (1095, and
``run_mha_fwd`` line 371). Each expected outcome below is read off those lines.
"""

import pytest

from refmodel.errors import FA3Rejected, OutsideModel, ProcessAbort
from refmodel.fa3_scheduler import ScheduleInputs
from refmodel.validation import (
    MODELLED_ARCH,
    SRC,
    check_call,
    check_call_split_count,
    check_model_range,
    check_precompute,
    effective_num_splits_argument,
)


def inputs(**kw):
    base = dict(batch_size=2, seqlen_q=1, seqlen_k=1024, num_heads=8, num_heads_k=1, headdim=128, headdim_v=128)
    base.update(kw)
    return ScheduleInputs(**base)


def test_the_source_revision_and_the_modelled_architecture():
    assert SRC == "hopper/flash_api.cpp@0251105a" and MODELLED_ARCH == 90


@pytest.mark.parametrize("n, stored", [(0, 0), (-1, 0), (-(2**40), 0), (1, 1), (256, 256), (2**31, -(2**31)),
                                       (2**32 + 3, 3)])
def test_num_splits_is_tested_on_int64_then_narrowed_to_int(n, stored):
    # lines 610, 983: `params.num_splits = num_splits <= 0 ? 0 : num_splits` on int64_t, stored in an int field
    assert effective_num_splits_argument(n) == stored


def test_an_architecture_other_than_sm90_is_outside_the_model():
    with pytest.raises(OutsideModel) as e:
        check_model_range(inputs(arch=80))
    assert e.value.field == "arch" and e.value.allowed == "sm90 (arch 90) only" and e.value.got == 80
    assert str(e.value) == ("arch: the model covers sm90 (arch 90) only, got 80 (FA3's sm8x tiles (tile_size_fwd_sm8x), "
                            "semaphore and PackGQA rules are not modelled; the sm90 kernel does not run on other "
                            "architectures)")
    check_model_range(inputs(arch=90))


@pytest.mark.parametrize("field, attr, low", [
    ("batch_size", "batch_size", 0), ("max_seqlen_q", "seqlen_q", 0), ("max_seqlen_k", "seqlen_k", 0),
    ("num_heads", "num_heads", 1), ("num_heads_k", "num_heads_k", 0), ("headdim", "headdim", 1),
    ("headdim_v", "headdim_v", 1), ("num_sm", "num_sm", 1), ("max_seqlen_k_new", "seqlen_knew", 0),
])
def test_each_size_must_lie_in_its_int_range(field, attr, low):
    check_model_range(inputs(**{attr: low}))            # the lowest value is covered
    check_model_range(inputs(**{attr: 2**31 - 1}))      # INT_MAX is covered
    for bad in (low - 1, 2**31):
        with pytest.raises(OutsideModel) as e:
            check_model_range(inputs(**{attr: bad}))
        assert e.value.field == field and e.value.allowed == f"{low}..2147483647" and e.value.got == bad
        assert str(e.value) == f"{field}: the model covers {low}..2147483647, got {bad!r}"


def test_page_size_is_none_or_a_positive_int():
    check_model_range(inputs(page_size=None))
    check_model_range(inputs(page_size=1))
    check_model_range(inputs(page_size=2**31 - 1))
    for bad in (0, 2**31):
        with pytest.raises(OutsideModel) as e:
            check_model_range(inputs(page_size=bad))
        assert e.value.field == "page_size" and e.value.allowed == "1..2147483647 or None" and e.value.got == bad


def test_num_splits_must_be_an_int64():
    check_model_range(inputs(num_splits=-(2**63)))
    check_model_range(inputs(num_splits=2**63 - 1))
    for bad in (2**63, -(2**63) - 1):
        with pytest.raises(OutsideModel) as e:
            check_model_range(inputs(num_splits=bad))
        assert e.value.field == "num_splits" and e.value.allowed == "an int64 value" and e.value.got == bad


def test_the_precompute_checks_only_the_head_ratio():
    check_precompute(inputs(headdim=512, headdim_v=3, num_splits=1000))   # what only the call rejects passes here
    with pytest.raises(FA3Rejected) as e:
        check_precompute(inputs(num_heads=8, num_heads_k=3))
    assert e.value.field == "num_heads" and e.value.source == f"{SRC}:550" and e.value.got == (8, 3)
    assert e.value.fa3_message == "Number of heads in key/value must divide number of heads in query"
    with pytest.raises(ProcessAbort) as e:
        check_precompute(inputs(num_heads_k=0))
    assert e.value.field == "num_heads_k" and e.value.got == 0 and e.value.source == f"{SRC}:550"
    assert e.value.reason == "num_heads % num_heads_k divides by zero on the host (SIGFPE)"
    with pytest.raises(OutsideModel):
        check_precompute(inputs(arch=100))


def _rejected(**kw):
    with pytest.raises(FA3Rejected) as e:
        check_call(inputs(**kw))
    return e.value


def test_the_call_rejects_head_dims_over_256_first():
    check_call(inputs(headdim=256, headdim_v=256))
    e = _rejected(headdim=264, headdim_v=264, num_heads_k=3)     # line 780 comes before the head ratio (781)
    assert (e.field, e.source, e.got) == ("headdim", f"{SRC}:780", 264)
    assert e.fa3_message == "FlashAttention forward only supports head dimension at most 256"
    e = _rejected(num_heads_k=3)
    assert (e.field, e.source) == ("num_heads", f"{SRC}:781")
    with pytest.raises(ProcessAbort):
        check_call(inputs(num_heads_k=0))


@pytest.mark.parametrize("d, dv, ok", [
    (192, 128, True), (136, 128, True), (192, 104, True),    # Q/K in (128, 192], V in (96, 128]
    (128, 96, False), (200, 128, False), (192, 96, False), (192, 136, False),
    (64, 512, True), (64, 8, True), (32, 256, True),        # Q/K <= 64, V <= 512
    (64, 520, False), (72, 64, False),
    # each end of each band: d = 128 is below the first band, 193 above it; dv = 129 and 513 above theirs
    (128, 104, False), (193, 104, False), (192, 129, False), (65, 72, False), (64, 513, False),
])
def test_a_different_v_head_dim_is_accepted_in_two_bands_only(d, dv, ok):
    if ok:
        check_call(inputs(headdim=d, headdim_v=dv))
    else:
        e = _rejected(headdim=d, headdim_v=dv)
        assert (e.field, e.source, e.got) == ("headdim_v", f"{SRC}:783-786", (d, dv))
        assert e.fa3_message.startswith("If V headdim is different from Q/K dim")


@pytest.mark.parametrize("d, dv, field, line", [
    (129, 104, "headdim", "855"),     # 129 lies in (128, 192]: the band check passes, alignment (8) rejects d
    (192, 97, "headdim_v", "856"),    # 97 lies in (96, 128]: the band check passes, alignment rejects dv
    (257, 257, "headdim", "780"),     # over 256: line 780 rejects before any alignment check
])
def test_the_band_ends_are_open_or_closed_as_fa3_writes_them(d, dv, field, line):
    e = _rejected(headdim=d, headdim_v=dv)
    assert (e.field, e.source) == (field, f"{SRC}:{line}")


def test_v_head_dim_over_256_needs_a_16_bit_type():
    check_call(inputs(headdim=64, headdim_v=512, element_size=2))
    check_call(inputs(headdim=64, headdim_v=256, element_size=1))
    e = _rejected(headdim=64, headdim_v=272, element_size=1)
    assert (e.field, e.source, e.got) == ("headdim_v", f"{SRC}:788-791", 272)
    e = _rejected(headdim=64, headdim_v=257, element_size=1)     # 257 > 256: refused here, before alignment
    assert (e.field, e.source) == ("headdim_v", f"{SRC}:788-791")
    assert e.fa3_message == "HeaddimV > 256 requires fp16 and bf16 data type"


@pytest.mark.parametrize("element_size, alignment", [(1, 16), (2, 8), (4, 8)])
def test_head_dims_must_be_multiples_of_the_alignment(element_size, alignment):
    check_call(inputs(headdim=64, headdim_v=64, element_size=element_size))
    e = _rejected(headdim=64 + alignment // 2, headdim_v=64 + alignment // 2, element_size=element_size)
    assert (e.field, e.source, e.got) == ("headdim", f"{SRC}:855", 64 + alignment // 2)
    assert e.fa3_message == f"head_size should be a multiple of {alignment}"
    e = _rejected(headdim=64, headdim_v=64 + alignment // 2, element_size=element_size)
    assert (e.field, e.source, e.got) == ("headdim_v", f"{SRC}:856", 64 + alignment // 2)
    assert e.fa3_message == f"head_size_v should be a multiple of {alignment}"


def test_appended_kv_needs_seqused_k_and_seqlen_q_within_the_cache():
    check_call(inputs(seqlen_knew=0, has_seqused_k=False, seqlen_q=4096))   # no new KV: neither check
    check_call(inputs(seqlen_knew=16, seqlen_q=1024, seqlen_k=1024))          # seqlen_q == seqlen_k is accepted
    e = _rejected(seqlen_knew=1, has_seqused_k=False)        # one appended token is "k_new supplied"
    assert (e.field, e.source) == ("cache_seqlens", f"{SRC}:932")
    assert e.fa3_message == "If k_new is supplied, seqlens_k must also be passed in"
    e = _rejected(seqlen_knew=16, seqlen_q=1025, seqlen_k=1024)
    assert (e.field, e.source, e.got) == ("seqlen_q", f"{SRC}:933", (1025, 1024))
    assert e.fa3_message == "If k_new is supplied, it must have seqlen <= the seqlen of the KV cache"


def test_the_call_split_count_lies_in_1_to_256():
    check_call_split_count(1)
    check_call_split_count(256)
    with pytest.raises(FA3Rejected) as e:
        check_call_split_count(257)
    assert (e.value.field, e.value.source, e.value.got) == ("num_splits", f"{SRC}:1095", 257)
    assert e.value.fa3_message == "num_splits > 256 not supported"
    with pytest.raises(FA3Rejected) as e:
        check_call_split_count(0)
    assert (e.value.field, e.value.source, e.value.got) == ("num_splits", f"{SRC}:371 (run_mha_fwd)", 0)
    assert e.value.fa3_message == "Expected params.num_splits >= 1 to be true, but got false."
    check_call_split_count(0, kernel_runs=False)        # line 1167: no kernel, no run_mha_fwd check
    with pytest.raises(FA3Rejected):
        check_call_split_count(257, kernel_runs=False)  # line 1095 is checked whether the kernel runs or not


def test_the_error_messages_name_the_field_the_value_and_the_source():
    e = FA3Rejected("num_heads", "msg", "src:1", (8, 3))
    assert str(e) == 'num_heads: FA3 rejects this (got (8, 3)): "msg" (src:1)'
    assert str(FA3Rejected("f", "m", "s")) == 'f: FA3 rejects this: "m" (s)'
    a = ProcessAbort("num_heads_k", "why", "src:2", 0)
    assert str(a) == ("num_heads_k: FA3 ends the process here (got 0): why (src:2); loud, but not safe for a "
                      "server: every request on the process is lost")
    assert str(ProcessAbort("f", "r", "s")).startswith("f: FA3 ends the process here: r (s);")
    o = OutsideModel("arch", "sm90", 80, "why")
    assert (o.field, o.allowed, o.got) == ("arch", "sm90", 80) and str(o) == "arch: the model covers sm90, got 80 (why)"
    assert str(OutsideModel("x", "1..2")) == "x: the model covers 1..2, got None"
    assert isinstance(FA3Rejected("f", "m", "s"), ValueError) and isinstance(OutsideModel("f", "a"), ValueError)
    assert isinstance(ProcessAbort("f", "r", "s"), RuntimeError)


def test_inputs_without_a_seqused_k_field_count_as_passing_it():
    # check_call reads fields by name; a caller's inputs object that has no has_seqused_k is treated as passing
    # seqlens_k (the default of ScheduleInputs), so appended KV is accepted
    from types import SimpleNamespace

    fields = {f: getattr(inputs(seqlen_knew=16), f) for f in ScheduleInputs.__dataclass_fields__ if f != "has_seqused_k"}
    check_call(SimpleNamespace(**fields))


def test_a_passed_k_new_is_checked_even_with_no_static_new_length():
    # flash_api.cpp 929-933 test `k_new_.has_value()`, not its length: a varlen k_new (cu_seqlens_k_new; line 951
    # leaves params.seqlen_knew 0) and a k_new of zero rows are "supplied" and meet both checks
    e = _rejected(seqlen_knew=0, has_k_new=True, has_seqused_k=False)
    assert (e.field, e.source) == ("cache_seqlens", f"{SRC}:932")
    assert e.fa3_message == "If k_new is supplied, seqlens_k must also be passed in"
    e = _rejected(seqlen_knew=0, has_k_new=True, seqlen_q=1025, seqlen_k=1024)
    assert (e.field, e.source, e.got) == ("seqlen_q", f"{SRC}:933", (1025, 1024))
    assert e.fa3_message == "If k_new is supplied, it must have seqlen <= the seqlen of the KV cache"
    check_call(inputs(seqlen_knew=0, has_k_new=True, seqlen_q=1024, seqlen_k=1024))   # both checks pass
    check_call(inputs(seqlen_knew=0, has_k_new=False, has_seqused_k=False, seqlen_q=4096))  # no k_new: no check
    assert inputs(has_k_new=True).appends_kv and inputs(seqlen_knew=1).appends_kv and not inputs().appends_kv


def test_call_inputs_take_a_passed_k_new_and_default_it_from_the_new_length():
    from refmodel import call_inputs

    assert call_inputs(1, 1, 64, 8, 8, 128, seqlen_knew=4).has_k_new is True
    assert call_inputs(1, 1, 64, 8, 8, 128).has_k_new is False
    assert call_inputs(1, 1, 64, 8, 8, 128, has_k_new=True).has_k_new is True
    assert call_inputs(1, 1, 64, 8, 8, 128, seqlen_knew=4, has_k_new=False).appends_kv  # a length is appended KV


def test_a_recorded_call_with_a_varlen_k_new_meets_the_appended_kv_checks():
    # the record of flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cu_seqlens_k_new=...): k is (total, h_k, d),
    # so the static new length is 0; FA3 still rejects it without cache_seqlens (932) or with seqlen_q > seqlen_k (933)
    import torch

    from gpu_impl.fa3_records import call_schedule_of, record_call

    q, kc = torch.zeros(2, 4, 8, 128, dtype=torch.bfloat16), torch.zeros(2, 64, 8, 128, dtype=torch.bfloat16)
    k_new = torch.zeros(6, 8, 128, dtype=torch.bfloat16)
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    rec = record_call(q, kc, kc, k_new, k_new, cu_seqlens_k_new=cu)
    assert rec.seqlen_k_new == 0 and rec.has_k_new is True
    with pytest.raises(FA3Rejected) as e:
        call_schedule_of(rec)
    assert (e.value.field, e.value.source) == ("cache_seqlens", f"{SRC}:932")
    short = torch.zeros(2, 2, 8, 128, dtype=torch.bfloat16)   # seqlen_k 2 < seqlen_q 4
    with pytest.raises(FA3Rejected) as e:
        call_schedule_of(record_call(q, short, short, k_new, k_new, cache_seqlens=torch.tensor([1, 1], dtype=torch.int32),
                                     cu_seqlens_k_new=cu))
    assert (e.value.field, e.value.source, e.value.got) == ("seqlen_q", f"{SRC}:933", (4, 2))
    call_schedule_of(record_call(q, kc, kc, k_new, k_new, cache_seqlens=torch.tensor([1, 1], dtype=torch.int32),
                                 cu_seqlens_k_new=cu))   # accepted with both
    assert record_call(q, kc, kc).has_k_new is False
