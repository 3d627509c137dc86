"""Which FA3 build a vLLM release's driver judges under, and the faked op schema of the releases before fork 8f468e7d.

No engine environment is needed: the host's choice (``release_fa3_build``) and the driver's reading of it
(``front.release_build``) are plain functions.
"""

import types

import pytest

from gpu_impl.engines.vllm import glue
from gpu_impl.engines.vllm.front import BUILD_VARIABLE, VLLM_BUILD, release_build
from gpu_impl.engines.vllm.host import release_fa3_build


@pytest.mark.parametrize("release, build", [
    ("0.10.1", "vllm-fork-2d3b7508"), ("0.11.0", "vllm-fork-2d3b7508"), ("0.11.1", "vllm-fork-a8937124"),
    ("0.16.0", "vllm-fork-a8937124"), ("0.17.0", "vllm-fork-1c81743f"), ("0.18.1", "vllm-fork-1c81743f"),
    ("0.19.0", "vllm-fork-617264c1"), ("0.33.0", "vllm-fork-617264c1"),
    ("0.8.5", "vllm-fork-8798f277"), ("0.9.2", "vllm-fork-8798f277"), ("0.10.0", "vllm-fork-8798f277"),
    ("0.9.0.1", "vllm-fork-8798f277"),
    ("0.7.3", VLLM_BUILD),   # no FA3 source recorded: the build modelled for 0.33.0
])
def test_each_release_is_judged_under_the_build_its_wheel_ships(release, build):
    assert release_fa3_build(release) == build


def _worker_env(monkeypatch, tmp_path, release, source):
    """The environment a VllmWorker gives its driver (no process started, no engine environment built)."""
    from gpu_impl.engines import envs
    from gpu_impl.engines.host import EngineHost
    from gpu_impl.engines.vllm import host

    seen = {}
    monkeypatch.setattr(envs, "ensure_env", lambda *a, **k: tmp_path)
    monkeypatch.setattr(EngineHost, "__init__", lambda self, python, module, label, engine, env, **k: seen.update(env))
    host.VllmWorker(release, progress=lambda *_: None, source=source)
    return seen


def test_a_checkout_is_judged_under_the_build_of_the_release_it_runs_beside(monkeypatch, tmp_path):
    monkeypatch.delenv(BUILD_VARIABLE, raising=False)
    assert _worker_env(monkeypatch, tmp_path, "0.16.0", tmp_path)[BUILD_VARIABLE] == "vllm-fork-a8937124"
    assert _worker_env(monkeypatch, tmp_path, "0.16.0", None)[BUILD_VARIABLE] == "vllm-fork-a8937124"
    # a user's choice is kept for a checkout, never for a release (whose build is recorded)
    monkeypatch.setenv(BUILD_VARIABLE, "vllm-fork-617264c1")
    assert _worker_env(monkeypatch, tmp_path, "0.16.0", tmp_path)[BUILD_VARIABLE] == "vllm-fork-617264c1"
    assert _worker_env(monkeypatch, tmp_path, "0.16.0", None)[BUILD_VARIABLE] == "vllm-fork-a8937124"


def test_the_driver_reads_the_build_from_its_environment(monkeypatch):
    monkeypatch.delenv(BUILD_VARIABLE, raising=False)
    assert release_build() == VLLM_BUILD
    monkeypatch.setenv(BUILD_VARIABLE, "vllm-fork-a8937124")
    assert release_build() == "vllm-fork-a8937124"
    # negative control: a name that is no build is refused, never judged under a default
    monkeypatch.setenv(BUILD_VARIABLE, "vllm-fork-nope")
    with pytest.raises(ValueError, match="build: must be one of"):
        release_build()


def test_the_fwd_schema_before_context_parallelism_drops_exactly_its_three_arguments():
    assert glue.FWD_SCHEMA.endswith("int cp_world_size=1, int cp_rank=0, Tensor? cp_tot_seqused_k=None) -> Tensor[]")
    assert glue.FWD_SCHEMA_BEFORE_CP.endswith("int sm_margin, Tensor? s_aux=None) -> Tensor[]")
    assert "cp_" not in glue.FWD_SCHEMA_BEFORE_CP


def test_the_interface_file_decides_which_schema(monkeypatch, tmp_path):
    pkg = tmp_path / "vllm"
    (pkg / "vllm_flash_attn").mkdir(parents=True)
    iface = pkg / "vllm_flash_attn" / "flash_attn_interface.py"
    spec = types.SimpleNamespace(submodule_search_locations=[str(pkg)])
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "vllm" else None)
    iface.write_text("def flash_attn_varlen_func(q, k, v):\n    return _vllm_fa3_C.fwd(q, k, v, s_aux)\n")
    assert glue._interface_passes_cp() is False       # 0.10.1 .. 0.11.0 (fork 2d3b7508)
    iface.write_text("    cp_world_size=1, cp_rank=0,\n")
    assert glue._interface_passes_cp() is True        # 0.11.1 on
