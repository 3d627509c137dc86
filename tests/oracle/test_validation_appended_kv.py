"""The call's appended-KV checks, exactly as hopper/flash_api.cpp@0251105a mha_fwd makes them (lines 929-933).

In FA3's order: ``v_new`` (931), then ``seqused_k_.has_value()`` (932: "If k_new is supplied, seqlens_k must also be
passed in"), then ``seqlen_q <= seqlen_k`` (933: "... it must have seqlen <= the seqlen of the KV cache"). A
passed ``seqused_k`` makes the call varlen (849) and so runs the prepare step (976): a call without the prepare step
cannot have passed it. The first pin fails on the model before that rule (it read ``has_seqused_k`` alone, whose
default is True, and accepted).
"""

import pytest

from refmodel.errors import FA3Rejected
from refmodel.fa3_scheduler import ScheduleInputs, call_inputs, resolve_schedule
from refmodel.validation import SRC, check_call


def call(**kw):
    base = dict(batch_size=2, seqlen_q=1, seqlen_k=1024, num_heads=8, num_heads_k=1, headdim=128, headdim_v=128,
                precompute=False)
    base.update(kw)
    return ScheduleInputs(**base)


def test_a_call_without_the_prepare_step_has_passed_no_seqlens_k():
    # not varlen (no cu_seqlens_q, cache_seqlens or leftpad): FA3 rejects a k_new at line 932
    inp = call(uses_prepare=False, has_k_new=True, seqlen_knew=4)   # has_seqused_k keeps its default
    with pytest.raises(FA3Rejected) as e:
        check_call(inp)
    assert (e.value.field, e.value.source) == ("cache_seqlens", f"{SRC}:932")
    assert e.value.fa3_message == "If k_new is supplied, seqlens_k must also be passed in"
    with pytest.raises(FA3Rejected):
        resolve_schedule(inp)
    check_call(call(uses_prepare=False, seqlen_knew=0))                 # no k_new: nothing to check


def test_the_seqlens_k_check_comes_before_the_length_check():
    # both fail: FA3 reports 932 first
    with pytest.raises(FA3Rejected) as e:
        check_call(call(uses_prepare=False, has_k_new=True, seqlen_q=2048, seqlen_k=1024))
    assert e.value.source == f"{SRC}:932"
    with pytest.raises(FA3Rejected) as e:
        check_call(call(has_k_new=True, seqlen_q=2048, seqlen_k=1024))
    assert (e.value.source, e.value.got) == (f"{SRC}:933", (2048, 1024))


def test_call_inputs_are_consistent_with_the_rule():
    with pytest.raises(FA3Rejected, match="seqlens_k must also be passed in"):
        resolve_schedule(call_inputs(2, 1, 1024, 8, 1, 128, has_cache_seqlens=False, seqlen_knew=4))
    resolve_schedule(call_inputs(2, 1, 1024, 8, 1, 128, has_cache_seqlens=True, seqlen_knew=4))


def test_line_933_compares_the_query_length_not_k_new_s():
    # 0251105a tests seqlen_q <= seqlen_k; k_new's own length is not compared with the cache on the host
    check_call(call(has_k_new=True, seqlen_knew=4096, seqlen_q=1, seqlen_k=1024))
    with pytest.raises(FA3Rejected, match="must have seqlen <= the seqlen of the KV cache"):
        check_call(call(has_k_new=True, seqlen_knew=1, seqlen_q=1025, seqlen_k=1024))


def test_seqused_k_passed_reads_both_fields():
    from types import SimpleNamespace

    from refmodel.validation import seqused_k_passed

    assert seqused_k_passed(call()) and not seqused_k_passed(call(uses_prepare=False))
    assert not seqused_k_passed(call(has_seqused_k=False))
    assert seqused_k_passed(SimpleNamespace())   # inputs that do not say count as passing it


def test_appends_kv_reads_k_new_or_its_length():
    # params.knew_ptr (flash_api.cpp@0251105a 575 at precompute from max_seqlen_k_new > 0; 929-961 at the call from
    # k_new_.has_value()): inputs that do not say whether k_new was passed append only with a positive length
    from types import SimpleNamespace

    from refmodel.validation import appends_kv

    assert not appends_kv(SimpleNamespace(seqlen_knew=0))
    assert appends_kv(SimpleNamespace(seqlen_knew=1))
    assert appends_kv(SimpleNamespace(has_k_new=True, seqlen_knew=0))     # a varlen k_new: params.seqlen_knew is 0
    assert not appends_kv(call(seqlen_knew=0)) and appends_kv(call(has_k_new=True, seqlen_knew=0))
