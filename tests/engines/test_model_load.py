"""gpu_impl.engines.sglang.model_load without an engine: the release's attention constructor is played by stand-ins
that assert as sglang's do. Its verdict is the constructor's (an assert is a rejection with its source line), the
layout readers return the configuration's rank-0 layout, the constructor stops at the first thing it builds after
its head split, and a constructor that stops before it sets its head counts, or needs what CPU lacks, decides
nothing (tests/engines/test_model_load_real.py runs the releases' own)."""

from __future__ import annotations

import linecache
from types import SimpleNamespace

import pytest

from gpu_impl.engines.sglang import model_load


def _module(body):
    """A stand-in model module: its layout reader and norm as module globals, ``Qwen3Attention`` running ``body``."""
    mod = SimpleNamespace(__name__="standin_qwen3")
    mod.get_attention_tp_size = lambda: 1  # replaced by the configuration's layout while a constructor runs

    def RMSNorm(*_a, **_k):  # noqa: N802 - the name the release imports
        raise RuntimeError("allocating weights on CUDA")

    mod.RMSNorm = RMSNorm

    class Qwen3Attention:
        def __init__(self, hidden_size, num_heads, num_kv_heads, layer_id=0, head_dim=None, prefix=""):
            body(self, mod, num_heads, num_kv_heads)

    return mod, Qwen3Attention


#: the stand-in constructor's body, compiled as "qwen3.py" (outside pytest's assert rewriting, as a wheel's is)
_SPLIT_SOURCE = """
def _split(self, mod, h, hk):
    attn_tp = mod.get_attention_tp_size()
    assert h % attn_tp == 0
    self.num_heads = h // attn_tp
    assert hk % attn_tp == 0 if hk >= attn_tp else attn_tp % hk == 0
    self.num_kv_heads = max(1, hk // attn_tp)
    self.norm = mod.RMSNorm(128)
"""
linecache.cache["qwen3.py"] = (len(_SPLIT_SOURCE), None, _SPLIT_SOURCE.splitlines(True), "qwen3.py")
_ns: dict = {}
exec(compile(_SPLIT_SOURCE, "qwen3.py", "exec"), _ns)
_split = _ns["_split"]


def _run(monkeypatch, body, sa, model):
    mod, cls = _module(body)
    monkeypatch.setattr(model_load, "_attention_class", lambda: cls)
    monkeypatch.setattr(model_load.inspect, "getmodule", lambda _c: mod)
    return model_load.head_split(sa, model), mod


FALCON = {"num_heads": 71, "num_kv_heads": 1, "head_dim": 64}


def _sa(**kw):
    return SimpleNamespace(**{"tp_size": 1, "dp_size": 1, "enable_dp_attention": False, "attn_cp_size": 1, **kw})


def test_the_constructors_assert_is_the_rejection_with_its_source_line(monkeypatch):
    got, mod = _run(monkeypatch, _split, _sa(tp_size=2), FALCON)
    assert got["accepted"] is False and got["stage"] == "model_load" and got["check"] == model_load.CHECK
    assert got["message"] == ("AssertionError: assert h % attn_tp == 0 (qwen3.py line 4)")
    assert mod.get_attention_tp_size() == 1 and mod.RMSNorm.__name__ == "RMSNorm"  # restored after the run


def test_a_split_that_divides_loads_and_the_constructor_stops_before_its_weights(monkeypatch):
    assert _run(monkeypatch, _split, _sa(tp_size=2, attn_cp_size=2), FALCON)[0] is None  # attn_tp 1
    assert _run(monkeypatch, _split, _sa(tp_size=8, dp_size=2, enable_dp_attention=True),
                {"num_heads": 32, "num_kv_heads": 2, "head_dim": 128})[0] is None  # attn_tp 4 replicates 2


def test_the_layout_is_the_configurations_attention_tp_width():
    assert model_load.attention_tp_size(_sa(tp_size=8, dp_size=2, enable_dp_attention=True, attn_cp_size=2)) == 2
    assert model_load.attention_tp_size(_sa(tp_size=8, dp_size=2)) == 8  # dp without DP attention
    assert model_load.attention_tp_size(_sa(tp_size=0)) == 0


def test_a_layout_that_does_not_divide_builds_no_module(monkeypatch):
    def never(*_a):
        raise AssertionError("not to be built")

    assert _run(monkeypatch, never, _sa(tp_size=0), FALCON)[0] is None


def test_a_constructor_that_stops_before_its_head_counts_decides_nothing(monkeypatch):
    def early(self, mod, h, hk):  # the norm first: nothing of the split was checked
        self.norm = mod.RMSNorm(128)
        _split(self, mod, h, hk)

    got, _ = _run(monkeypatch, early, _sa(tp_size=2), FALCON)
    assert got["accepted"] is None and "before it set the layer's head counts" in got["message"]


def test_a_constructor_that_needs_what_cpu_lacks_is_inconclusive_never_a_pass(monkeypatch):
    def cuda(self, mod, h, hk):
        raise RuntimeError("no CUDA device")

    got, _ = _run(monkeypatch, cuda, _sa(tp_size=2), FALCON)
    assert got["accepted"] is None and "RuntimeError: no CUDA device" in got["message"]


@pytest.mark.parametrize("name", model_load.STOP_AT)
def test_every_stop_name_ends_the_constructor(name, monkeypatch):
    mod = SimpleNamespace(**{name: lambda *a, **k: "built"})
    with model_load._faked(mod, {"attn_tp_size": 2, "tp_size": 2, "zero": 0, "parallel": None}):
        with pytest.raises(model_load.PastHeadSplit):
            getattr(mod, name)()
    assert getattr(mod, name)() == "built"


def test_a_reader_that_raises_after_the_head_split_does_not_reject(monkeypatch):
    """0.5.16's Qwen3Attention reads ``get_server_args()`` after its split, a name STOP_AT did not list: its
    "Global server args is not set yet!" ValueError was counted as the release rejecting every configuration."""
    def late_reader(self, mod, h, hk):
        attn_tp = mod.get_attention_tp_size()
        self.num_heads, self.num_kv_heads = h // attn_tp, max(1, hk // attn_tp)
        raise ValueError("Global server args is not set yet!")

    assert _run(monkeypatch, late_reader, _sa(tp_size=2, attn_cp_size=2), FALCON)[0] is None


def test_the_same_error_before_the_kv_split_is_still_the_releases_rejection(monkeypatch):
    def early_reader(self, mod, h, hk):  # negative control: only the query heads were split
        self.num_heads = h // mod.get_attention_tp_size()
        raise ValueError("Global server args is not set yet!")

    got, _ = _run(monkeypatch, early_reader, _sa(tp_size=2, attn_cp_size=2), FALCON)
    assert got["accepted"] is False and "Global server args is not set yet!" in got["message"]


def test_a_failure_after_the_split_that_is_not_a_check_does_not_reject(monkeypatch):
    def cuda_after(self, mod, h, hk):
        self.num_heads, self.num_kv_heads = h, hk
        raise RuntimeError("no CUDA device")

    assert _run(monkeypatch, cuda_after, _sa(), FALCON)[0] is None
