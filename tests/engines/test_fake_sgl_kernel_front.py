"""The fake ``sgl_kernel.flash_attn`` front (gpu_impl/engines/fakes): what it hands FA3 from what sglang passes.

sglang 0.5.23's wrapper (sglang/kernels/ops/attention/flash_attention_v3.py) passes ``attention_chunk=None`` and
``only_qv=False`` on every call, and ``out=`` when the forward batch has an output buffer; FA3's ``mha_fwd`` takes
``attention_chunk`` 0 for "no chunking" and has no ``only_qv``."""

import importlib.util
from pathlib import Path

import pytest
import torch

import gpu_impl

FRONT = Path(gpu_impl.__file__).parent / "engines" / "fakes" / "sgl_kernel" / "flash_attn.py"


@pytest.fixture()
def front():
    spec = importlib.util.spec_from_file_location("fake_sgl_kernel_flash_attn", FRONT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Recorder:
    def __init__(self, result):
        self.result, self.calls = result, []

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, **named):
        self.calls.append(named)
        return self.result


def test_none_defaults_become_fa3s_and_only_qv_false_is_dropped(front):
    impl = _Recorder(torch.ones(2, 3))
    front.install(impl)
    front.flash_attn_with_kvcache("q", "k", "v", attention_chunk=None, softcap=None, window_size=None,
                                  num_splits=None, sm_margin=None, only_qv=False, sinks=None, causal=True)
    assert impl.calls == [{"attention_chunk": 0, "softcap": 0.0, "window_size": (-1, -1), "num_splits": 0,
                           "sm_margin": 0, "causal": True}]


def test_set_values_pass_unchanged(front):
    impl = _Recorder(torch.ones(1))
    front.install(impl)
    front.flash_attn_with_kvcache("q", "k", "v", attention_chunk=128, window_size=(64, 0), num_splits=3)
    assert impl.calls == [{"attention_chunk": 128, "window_size": (64, 0), "num_splits": 3}]


@pytest.mark.parametrize("named, what", [({"only_qv": True}, "only_qv=True"), ({"sinks": torch.zeros(1)}, "sinks")])
def test_unmodelled_paths_are_refused_by_name(front, named, what):
    impl = _Recorder(torch.ones(1))
    front.install(impl)
    with pytest.raises(NotImplementedError, match=what.split("=")[0]):
        front.flash_attn_with_kvcache("q", "k", "v", **named)
    assert impl.calls == []


def test_out_receives_the_output_and_is_returned_with_the_lse(front):
    o, lse = torch.full((2, 3), 2.0), torch.zeros(3, 2)
    front.install(_Recorder((o, lse)))
    out = torch.zeros(2, 3, dtype=torch.bfloat16)
    got = front.flash_attn_with_kvcache("q", "k", "v", out=out, return_softmax_lse=True)
    assert got[0] is out and torch.equal(out, o.to(torch.bfloat16)) and got[1] is lse
    front.install(_Recorder(o))
    out = torch.zeros(2, 3)
    assert front.flash_attn_with_kvcache("q", "k", "v", out=out) is out and torch.equal(out, o)
    out = torch.zeros(2, 1, 3)  # sglang's out is a (tokens, heads, dv) view; the kernel's output may be shaped apart
    assert front.flash_attn_with_kvcache("q", "k", "v", out=out) is out and torch.equal(out, o.reshape(2, 1, 3))
