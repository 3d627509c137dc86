"""The sglang version glue passes a rank's layout only through fields the release declares (no engine env needed).

0.5.18 - 0.5.20 declare ``get_parallel().override`` fields in a ``_PARALLEL_FIELDS`` constant and 0.5.21+ in
``_parallel_fields()``; each raises ``ValueError("unknown parallel field(s): ...")`` on any other name
(``sglang/srt/runtime_context.py``). These tests play both forms with a stand-in module.
"""

from __future__ import annotations

import contextlib
import sys
import types

import pytest

from gpu_impl.engines.sglang import glue as sglang_glue
from spec.model.config import ServerConfig

TOPOLOGY = frozenset({"tp_size", "tp_rank", "attn_tp_size", "attn_tp_rank", "attn_cp_size", "attn_cp_rank",
                      "attn_dp_size", "attn_dp_rank"})


def _runtime_context(declared, as_function: bool):
    seen = {}

    class Parallel:
        @contextlib.contextmanager
        def override(self, **kwargs):
            unknown = set(kwargs) - declared
            if unknown:
                raise ValueError(f"unknown parallel field(s): {sorted(unknown)}")
            seen.update(kwargs)
            yield self

    rc = types.ModuleType("sglang.srt.runtime_context")
    rc.get_parallel = lambda: Parallel()
    if as_function:
        rc._parallel_fields = lambda: declared
    else:
        rc._PARALLEL_FIELDS = declared
    return rc, seen


def _install(monkeypatch, rc) -> ServerConfig:
    """Put the stand-in ``sglang.srt.runtime_context`` in place; the prefill-CP layout the tests play."""
    srt = types.ModuleType("sglang.srt")
    srt.runtime_context = rc
    monkeypatch.setitem(sys.modules, "sglang", types.ModuleType("sglang"))
    monkeypatch.setitem(sys.modules, "sglang.srt", srt)
    monkeypatch.setitem(sys.modules, "sglang.srt.runtime_context", rc)
    return ServerConfig(tp_size=4, attn_cp_size=2, enable_prefill_cp=True)


@pytest.mark.parametrize("release,as_function", [("0.5.18", False), ("0.5.20", False), ("0.5.23", True)])
def test_layout_override_passes_only_declared_fields(monkeypatch, release, as_function):
    rc, seen = _runtime_context(TOPOLOGY, as_function)
    server = _install(monkeypatch, rc)
    with sglang_glue.parallel_layout(release, sglang_glue.layout_values(server, 0)):
        pass
    assert set(seen) <= TOPOLOGY and seen["attn_cp_size"] == 2 and seen["tp_size"] == 4


def test_a_release_without_a_declared_field_set_gets_every_field(monkeypatch):
    # negative control: with neither form declared, the glue passes its whole table, and a release that
    # rejects unknown names says so (the error the engine matrix met on 0.5.18 before the constant was read)
    rc, _ = _runtime_context(TOPOLOGY, as_function=True)
    del rc._parallel_fields
    server = _install(monkeypatch, rc)
    with pytest.raises(ValueError, match="unknown parallel field"):
        with sglang_glue.parallel_layout("0.5.19", sglang_glue.layout_values(server, 0)):
            pass
