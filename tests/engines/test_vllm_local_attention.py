"""Chunked local attention on vLLM's first driver generation (gpu_impl/engines/vllm/local.py): layers with a chunk
size are built on the release's own wrapped backend, whose builder turns each batch into virtual batches before the
FlashAttention builder's precompute, and both sides are judged; vLLM's own rule refuses FULL CUDA graphs over them.

Controls: the clean release passes the local path (its precompute over the virtual batches, the call on them); a copy
of the release whose local builder hands its calls the metadata of a precompute over the un-virtualised batch
(tests/release_copies.py ``LOCAL_UNVIRTUALISED_PRECOMPUTE``) is caught on one step, and (slow) within the gate's
default fuzz budget on 5 seeds of 5.

Engine-marked: each needs vLLM 0.33.0's cached environment and skips, naming the setup command, without one.
"""

from __future__ import annotations

import inspect

import pytest

from engine_releases import need_vllm


RELEASE = "0.33.0"
#: Llama 4 Scout's attention at tp 8 (5 query heads on 1 KV head per rank), three chunked local layers and a global
#: one; one long decode (32768 tokens: its chunk holds 32768 mod 1024 = 0 -> 1024 keys) and a chunked prefill
LAYERS = {"num_heads": 40, "num_kv_heads": 8, "head_dim": 128, "tp": 8, "num_layers": 4,
          "attention_chunk_size": [1024, 1024, 1024, None]}
DECODE = {"seq_lens": [32768]}
PREFILL = {"seq_lens": [9000, 100], "query_lens": [2000, 1]}


def _needs(release: str = RELEASE) -> None:
    need_vllm(release)


def _pairs(resp):
    return [e for e in resp["trace"] if "s_c" in e]


@pytest.fixture(scope="module")
def worker(engine_sut):
    _needs()
    return engine_sut(f"vllm=={RELEASE}").worker


@pytest.mark.engine
def test_chunked_layers_precompute_over_the_release_s_virtual_batches_and_pass(worker):
    resp = worker.run({**LAYERS, "steps": [DECODE, PREFILL]})
    assert resp["findings"] == [] and resp["shape_errors"] == []
    pairs = _pairs(resp)
    assert len(pairs) == 8 and all("local attention" in e["reached"] for e in pairs)
    decode, prefill = pairs[:4], pairs[4:]
    # the three chunked layers: one virtual batch of the last chunk's 1024 keys; the global layer: the whole sequence
    assert [e["precompute"]["max_seqlen_k"] for e in decode] == [1024, 1024, 1024, 32768]
    # the prefill: 2000 new tokens of a 9000-token sequence over 1024-token chunks make 3 virtual batches, the decode
    # one more; the global layer sees the 2 requests as scheduled
    assert [e["precompute"]["batch_size"] for e in prefill] == [4, 4, 4, 2]
    assert all(e["call"]["batch_size"] == e["precompute"]["batch_size"] for e in pairs)
    assert all(e["s_p"] == e["s_c"] for e in pairs)


@pytest.mark.engine
def test_full_cuda_graphs_over_chunked_layers_are_refused_as_vllm_refuses_them(worker):
    from gpu_impl.engines.errors import ScenarioUnsupported

    with pytest.raises(ScenarioUnsupported, match="CUDAGraphMode.FULL is not supported with ChunkedLocalAttention"):
        worker.run({**LAYERS, "cuda_graph": "full", "steps": [DECODE]})
    piecewise = worker.run({**LAYERS, "cuda_graph": "piecewise", "steps": [DECODE]})
    assert piecewise["findings"] == [] and all("piecewise" in e["reached"] for e in _pairs(piecewise))


def _copy_sut(root):
    from gpu_impl.engines.vllm.host import VllmSUT
    from gpu_impl.sut import parse_engine

    return VllmSUT(spec=parse_engine(f"vllm-src={root}"), progress=lambda line: None)


@pytest.mark.engine
def test_a_local_precompute_over_the_unvirtualised_batch_is_caught(tmp_path):
    _needs()
    from release_copies import vllm_local_regression_copy

    with _copy_sut(vllm_local_regression_copy(tmp_path / "seeded")) as sut:
        resp = sut.worker.run({**LAYERS, "steps": [DECODE]})
    invariants = {f["invariant"] for f in resp["findings"]}
    assert {"SPLIT_BOUND", "COMBINE_CAPACITY"} <= invariants, resp["findings"][:3]
    assert all(f["detail"]["s_p"] > f["detail"]["s_c"] for f in resp["findings"] if f["invariant"] == "SPLIT_BOUND")


@pytest.mark.engine
@pytest.mark.slow
def test_the_local_regression_is_found_within_the_gate_budget_on_five_seeds(tmp_path):
    """The gate's campaign (family vllm-paths-both-drafts: 0.33.0 ships both runners, releases.json ``v2_runner``, and
    its V2 runner's drafter is driven; its chunked-local draws stay on the V1 runner) on the copy with the regression
    finds it on
    every seed within the gate's default fuzz budget (the copy without it, replay aligned, passes its gate:
    tests/engines/test_vllm_checkout.py; the one-step test above pins the same defect)."""
    _needs()
    from fa3verify.commands.gate import gate
    from release_copies import vllm_local_regression_copy
    from engines.test_vllm_release_copies import SEEDS, _first_failure, _started_as_the_gate_starts_it

    budget = inspect.signature(gate).parameters["budget_s"].default
    seeded = vllm_local_regression_copy(tmp_path / "seeded")
    with _started_as_the_gate_starts_it(_copy_sut(seeded)) as sut:
        assert sut.domain().family == "vllm-paths-both-drafts"
        found = {seed: _first_failure(sut, seed, budget_s=budget) for seed in SEEDS}
    assert all(f is not None and f[0] in ("SPLIT_BOUND", "COMBINE_CAPACITY", "BATCH_PERMUTATION")
               for f in found.values()), found


@pytest.mark.engine
@pytest.mark.parametrize("release", ["0.9.2", "0.10.0"])
def test_generation_v0_makes_the_local_metadata_as_the_release_does(engine_sut, release):
    """Driver generation v0. 0.9.2: the builder's own local branch (the runner's attention_chunk_size, a second
    ``schedule(...)`` over the virtual batches) feeds the ``use_irope`` layers, the plain metadata the global one.
    0.10.0: the runner's virtual batches (the release's ``make_local_attention_virtual_batches``) for the
    ChunkedLocalAttentionSpec group, built by that group's own builder. The same numbers as the wrapped backend's."""
    _needs(release)
    resp = engine_sut(f"vllm=={release}").worker.run({**LAYERS, "steps": [DECODE, PREFILL]})
    assert resp["findings"] == [] and resp["shape_errors"] == []
    pairs = _pairs(resp)
    assert [e["precompute"]["max_seqlen_k"] for e in pairs[:4]] == [1024, 1024, 1024, 32768]
    assert [e["precompute"]["batch_size"] for e in pairs[4:]] == [4, 4, 4, 2]
    assert all(e["s_p"] == e["s_c"] for e in pairs) and all("local attention" in e["reached"] for e in pairs)


#: two decode steps on the graph of capture size 2 (captured at the first): 3000 and 500 tokens, then one more each
REPLAYED = {**LAYERS, "cuda_graph": "full", "capture_sizes": [1, 2, 4, 8], "max_model_len": 8192,
            "steps": [{"seq_lens": [3000, 500]}, {"seq_lens": [3001, 501]}]}


@pytest.mark.engine
#: 0.9.1 slow-marked: 0.9.2 pins the same builder branch (0.9.1 differs in its split bound only)
@pytest.mark.parametrize("release", [pytest.param("0.9.1", marks=pytest.mark.slow), "0.9.2"])
def test_full_graph_replays_of_chunked_layers_read_their_captures_local_metadata(engine_sut, release):
    """0.9.1 .. 0.9.2 accept full CUDA graphs over chunked local layers; the builder's local branch makes
    ``local_query_start_loc``, ``local_seqused_k``, ``local_block_table`` and ``local_scheduler_metadata`` as new
    tensors on every build (flash_attn.py), outside the persistent buffers a replay's build refills. A replay of a
    graph captured at an earlier step re-issues the local layers' captured calls on the capture's tensors: each reads
    the local metadata precomputed for the capture batch (2 requests of max_model_len: 1024 keys in each last chunk),
    not the step's (READS_OWN_STEP_METADATA, the three local layers only). Control: the global layer's replayed call
    reads the step's own metadata (its persistent buffer was refilled), and the same steps without chunked layers pass."""
    _needs(release)
    worker = engine_sut(f"vllm=={release}").worker
    resp = worker.run(dict(REPLAYED))
    stale = [f for f in resp["findings"] if f["invariant"] == "READS_OWN_STEP_METADATA"]
    assert {f["invariant"] for f in resp["findings"]} == {"READS_OWN_STEP_METADATA"} and len(stale) == 3, \
        resp["findings"]
    replayed = [e for e in _pairs(resp) if e.get("path") == "full"][4:]   # the second step's replay
    assert [e["precompute"]["max_seqlen_k"] for e in replayed] == [1024, 1024, 1024, 3001]
    assert all("local attention" in e["reached"] for e in replayed)
    control = worker.run({**REPLAYED, "attention_chunk_size": None})
    assert control["findings"] == [], control["findings"]


@pytest.mark.engine
#: 0.10.2 slow-marked: 0.10.1 pins the same wrapped-builder capture (0.10.2 differs in the capture's key lengths)
@pytest.mark.parametrize("release", ["0.10.0", "0.10.1", pytest.param("0.10.2", marks=pytest.mark.slow)])
def test_full_graph_replays_of_chunked_layers_on_0_10_read_refilled_metadata(engine_sut, release):
    """0.10.0 .. 0.10.2 accept full CUDA graphs over chunked local layers, and a replay of the graph captured at the
    first step reads, in the three local layers, a persistent metadata buffer refilled by the second step's build
    (the front matches its bytes to the step's precomputes of both attention groups): no finding. 0.10.0: the chunked
    KV-cache group's own builder's buffer, its precompute over the step's virtual batches (1024-token chunks: 953 and
    501 keys); 0.10.1 .. 0.10.2: ``_dummy_run`` gives every layer of the KV-cache group the last attention group's
    capture metadata (graphs.json ``capture_metadata_layers``), the global layers' (Llama 4's first layer is chunked),
    so the local layers replay on the global builder's buffer (3001 keys). Control: the same steps without chunked
    layers pass."""
    _needs(release)
    worker = engine_sut(f"vllm=={release}").worker
    resp = worker.run(dict(REPLAYED))
    assert resp["findings"] == [] and resp["shape_errors"] == [], resp["findings"]
    replayed = [e for e in _pairs(resp) if e.get("path") == "full"][4:]   # the second step's replay
    local_keys = 953 if release == "0.10.0" else 3001
    assert [e["precompute"]["max_seqlen_k"] for e in replayed] == [local_keys] * 3 + [3001]
    assert all("local attention" in e["reached"] and e["s_p"] == e["s_c"] for e in replayed)
    control = worker.run({**REPLAYED, "attention_chunk_size": None})
    assert control["findings"] == [], control["findings"]


#: a prefill of 8 requests (max_num_seqs 8) whose new tokens touch two 1024-token chunks each: 16 virtual batches
OVERFLOWING = {**LAYERS, "capture_sizes": [1, 2, 4, 8], "max_model_len": 8192, "max_num_seqs": 8,
               "steps": [{"seq_lens": [1500] * 8, "query_lens": [1000] * 8}]}


@pytest.mark.engine
@pytest.mark.parametrize("release", ["0.10.0", "0.10.1"])
def test_more_virtual_batches_than_max_num_seqs_stop_the_release_under_a_full_graph(engine_sut, release):
    """Under a full CUDA graph the chunked group's FlashAttention builder copies its precompute into its persistent
    buffer of max_num_seqs + 1 int32; 16 virtual batches make 17: the release's own copy raises (RuntimeError), so the
    step is refused naming it. Control: the same step under piecewise graphs runs (no buffer) and passes."""
    _needs(release)
    from gpu_impl.engines.errors import ScenarioUnsupported

    worker = engine_sut(f"vllm=={release}").worker
    with pytest.raises(ScenarioUnsupported, match=r"buffer of max_num_seqs \+ 1 = 9 int32 .* more virtual batches"):
        worker.run({**OVERFLOWING, "cuda_graph": "full"})
    piecewise = worker.run({**OVERFLOWING, "cuda_graph": "piecewise"})
    assert piecewise["findings"] == [] and [e["precompute"]["batch_size"] for e in _pairs(piecewise)] == [16] * 3 + [8]


@pytest.mark.engine
def test_a_stale_local_buffer_at_a_full_graph_replay_is_caught(tmp_path):
    """Negative control of the test above: a copy of 0.10.1 whose FlashAttention builders store their precompute
    into the persistent buffer only while it is all zero (the first store, the capture's; tests/release_copies.py
    ``STORE_ONCE_0_33_0``, the same line in 0.10.1): at the second step's replay the four layers read metadata made
    at the first step: READS_OWN_STEP_METADATA on all four."""
    _needs("0.10.1")
    from release_copies import STORE_ONCE_0_33_0, vllm_patched_copy

    with _copy_sut(vllm_patched_copy("0.10.1", tmp_path / "seeded", STORE_ONCE_0_33_0)) as sut:
        resp = sut.worker.run(dict(REPLAYED))
    stale = [f for f in resp["findings"] if f["invariant"] == "READS_OWN_STEP_METADATA"]
    assert len(stale) == 4 and all(f["step"] == 1 for f in stale), resp["findings"]


def test_capture_metadata_goes_to_the_layers_the_release_s_dummy_run_gives_it_to():
    """graphs.json ``capture_metadata_layers``: 0.10.1 .. 0.10.2 give every layer of the KV-cache group the last
    attention group's capture metadata (the groups in the order of their first layer); 0.11.0 on each layer its own
    group's. Controls: a model whose last-made group is a chunked one, and the later rule."""
    from gpu_impl.engines.vllm.graphs import capture_metadata_rule, capture_seq_len_rule
    from gpu_impl.engines.vllm.local import capture_layer_metadata

    names, local = ["l0", "l1", "l2", "l3"], {"l0": "m1024", "l1": "m1024", "l3": "m2048"}
    assert [capture_metadata_rule(r) for r in ("0.10.1", "0.10.2", "0.11.0")] == [
        "kv_cache_group", "kv_cache_group", "attention_group"]
    assert capture_seq_len_rule("0.10.2") == "max_model_len" and capture_seq_len_rule("0.11.0") == "max_query_len"
    assert capture_layer_metadata("kv_cache_group", names, [1024, 1024, None, None], local) == {}
    assert capture_layer_metadata("kv_cache_group", names, [None, 1024, None, 2048], local) == dict.fromkeys(
        names, "m2048")
    assert capture_layer_metadata("attention_group", names, [1024, 1024, None, 2048], local) is local


def test_no_pinned_memory_answers_both_ways_a_release_asks(monkeypatch):
    """A CPU torch has no pinned-memory allocator: the local path's stand-in turns off vLLM's cached PIN_MEMORY
    (0.33.0) and its per-call is_pin_memory_available (0.32.0, whose make_local_attention_virtual_batches crashed
    the gate's worker with "pin_memory=True requires a CUDA ... backend" before)."""
    import sys
    import types

    from gpu_impl.engines.vllm import local

    cached = types.SimpleNamespace(PIN_MEMORY=True)
    asked = types.SimpleNamespace(is_pin_memory_available=lambda: True)
    for module in (cached, asked):
        fake = types.ModuleType("vllm.utils.torch_utils")
        fake.__dict__.update(vars(module))
        monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
        monkeypatch.setitem(sys.modules, "vllm.utils", types.ModuleType("vllm.utils"))
        monkeypatch.setitem(sys.modules, "vllm.utils.torch_utils", fake)
        sys.modules["vllm"].utils = sys.modules["vllm.utils"]
        sys.modules["vllm.utils"].torch_utils = fake
        local.no_pinned_memory()
        if hasattr(module, "PIN_MEMORY"):
            assert fake.PIN_MEMORY is False
        else:
            assert fake.is_pin_memory_available() is False
