"""vLLM's batch-invariant mode as each release reads it (gpu_impl/engines/vllm/invariance.py).

A server sets ``VLLM_BATCH_INVARIANT`` before it starts; the worker drives many configurations in one process. 0.11.1
.. 0.11.2 cache the reading (``functools.cache``) and 0.12.0 .. 0.18.1 read it once at import (a module constant), so
the worker makes the release read it again per configuration:

- fast: on stand-ins of the three shapes of the release's module (cached reader, import-time constant, absent),
  ``set_batch_invariance`` makes each answer what was set; the negative control: setting only the environment
  variable leaves the cached and the constant readers on their first answer (what the worker did before);
- engine (each needs its release's environment, skipped without): on 0.18.1 (import-time constant) and 0.11.1
  (cached reader) one worker runs the same configuration with and without batch invariance, in both orders, and the
  release's builder and call pass ``num_splits=1`` exactly when it is on.
"""

from __future__ import annotations

import functools
import os
import sys
import types

import pytest

from engine_releases import vllm_worker
from gpu_impl.engines.vllm import invariance

#: a Nemotron-NAS model, 32 query heads, its first layer 1 KV head, its second 8; one skewed decode step
HETERO = {"num_heads": 32, "num_kv_heads": 1, "num_layers": 2, "layer_kv_heads": [1, 8],
          "steps": [{"seq_lens": [32768] + [100] * 7}]}


def _cached_module():
    """0.11.1's shape: ``@cache def vllm_is_batch_invariant()`` reading the variable."""
    m = types.ModuleType(invariance.MODULE)

    @functools.cache
    def vllm_is_batch_invariant():
        return int(os.getenv("VLLM_BATCH_INVARIANT", "0")) != 0

    m.vllm_is_batch_invariant = vllm_is_batch_invariant
    return m


def _constant_module():
    """0.12.0 .. 0.18.1's shape: a constant read at import by ``_read_vllm_batch_invariant``."""
    m = types.ModuleType(invariance.MODULE)
    m._read_vllm_batch_invariant = lambda: int(os.getenv("VLLM_BATCH_INVARIANT", "0")) != 0
    m.VLLM_BATCH_INVARIANT = m._read_vllm_batch_invariant()
    m.vllm_is_batch_invariant = lambda: m.VLLM_BATCH_INVARIANT
    return m


def _installed_reading_off(monkeypatch, make):
    """The release module ``make`` builds, installed while the variable says off; it reads off."""
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    mod = make()
    monkeypatch.setitem(sys.modules, invariance.MODULE, mod)
    assert mod.vllm_is_batch_invariant() is False
    return mod


@pytest.mark.parametrize("make", [_cached_module, _constant_module], ids=["cached", "import-time constant"])
def test_the_release_reads_each_configurations_setting(monkeypatch, make):
    mod = _installed_reading_off(monkeypatch, make)
    for on in (True, False, True):
        invariance.set_batch_invariance(on)
        assert os.environ["VLLM_BATCH_INVARIANT"] == ("1" if on else "0")
        assert mod.vllm_is_batch_invariant() is on
        assert invariance.release_reads_batch_invariance() is on


@pytest.mark.parametrize("make", [_cached_module, _constant_module], ids=["cached", "import-time constant"])
def test_negative_control_the_variable_alone_leaves_the_first_reading(monkeypatch, make):
    """What the worker did before: only the environment variable, so the release kept its first answer."""
    mod = _installed_reading_off(monkeypatch, make)
    os.environ["VLLM_BATCH_INVARIANT"] = "1"
    assert mod.vllm_is_batch_invariant() is False


def test_a_module_not_imported_yet_is_left_to_its_import(monkeypatch):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    monkeypatch.delitem(sys.modules, invariance.MODULE, raising=False)
    invariance.set_batch_invariance(True)
    assert os.environ["VLLM_BATCH_INVARIANT"] == "1" and invariance.MODULE not in sys.modules


#: 0.11.1 (the cached reader) is slow-marked: the stand-in test above pins the same path fast
@pytest.fixture(scope="module", params=["0.18.1", pytest.param("0.11.1", marks=pytest.mark.slow)])
def worker(request):
    yield from vllm_worker(request.param)


@pytest.mark.engine
def test_the_release_passes_num_splits_1_exactly_under_batch_invariance(worker):
    for on in (False, True, False, True):
        resp = worker.run({**HETERO, "batch_invariant": on})
        pairs = [e for e in resp["trace"] if "s_c" in e]
        splits = {(p["precompute"]["num_splits"], p["call"]["num_splits"]) for p in pairs}
        assert splits == ({(1, 1)} if on else {(0, 0)}), (on, splits)
        # the model config's KV heads in the precompute either way (the layers finding); under batch invariance the
        # split counts agree (1) and the input mismatch remains
        assert [(p["precompute"]["num_heads_k"], p["call"]["num_heads_k"]) for p in pairs] == [(1, 1), (1, 8)]
        invariants = {f["invariant"] for f in resp["findings"]}
        assert invariants == ({"SHARED_PRECOMPUTE_MATCHES_LAYER"} if on else
                              {"SPLIT_BOUND", "COMBINE_CAPACITY", "SHARED_PRECOMPUTE_MATCHES_LAYER"}), (on, invariants)
