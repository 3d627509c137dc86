"""A finding explains its configuration and gives a fix hint that fits it (fa3verify/config_terms.py,
fa3verify/finding_terms.py), and on a real engine names where the engine's code made each side
(gpu_impl/engines/call_sites.py ``caller_location``):

* every token of the configuration label (``llama-3-8b/tp2/cp2+pcp/sm78/splits=0``) is explained, in order, with
  the configuration's own numbers;
* the head-count hint gives the layer's head counts for the witness's configuration and names the features under
  which the precompute must be off; it offers sglang PR #30439's guard (prefill CP or DP attention) only when that
  guard covers the witness: never for attention CP without prefill CP;
* on a source checkout, the finding names the file and function of the precompute and of the call (the seeded
  regression's own function), the real engine run once (marked ``engine``)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from fa3verify import cli
from fa3verify.summary import finding_lines
from gpu_impl.config import MODELS, ServerConfig, get_model

REPO = Path(__file__).resolve().parents[2]
WORKED = REPO / "tests" / "corpus" / "worked_example_prefix_guard.json"
QWEN = get_model("qwen3-30b-a3b")
#: what the hint said for every head-count finding before it followed the configuration
OLD_HEADS_HINT = ("precompute with the layer's own head counts (H // attn_tp_size, max(1, Hk // attn_tp_size)), or "
                  "disable the precompute under prefill CP and DP attention (the guard of sglang PR #30439)")


def _label_and_terms(server, model):
    from fa3verify.finding_terms import configuration_terms

    terms = configuration_terms(server, model)
    return terms["config"], terms["config_terms"]


@pytest.mark.parametrize("server,expected", [
    (ServerConfig(tp_size=2, attn_cp_size=2, enable_prefill_cp=True, cp_strategy="zigzag", num_sm=78),
     {"tp2": "attn_tp_size = tp_size / (attn_dp_size * attn_cp_size) = 2 / (1 * 2) = 1",
      "cp2+pcp": "attn_cp_size 2 with enable_prefill_cp", "sm78": "num_sm 78: the GPU's SM count",
      "splits=0": "num_splits 0: FA3 chooses the split count itself"}),
    (ServerConfig(tp_size=4, attn_cp_size=4), {"cp4": "attn_cp_size 4: attention context parallel without "
                                                      "enable_prefill_cp", "tp4": "= 4 / (1 * 4) = 1"}),
    (ServerConfig(tp_size=8, dp_size=2, enable_dp_attention=True, num_splits=3),
     {"dp2+dpa": "dp_size 2 with enable_dp_attention (attn_dp_size 2)", "splits=3": "a fixed split count"}),
    (ServerConfig(tp_size=2, dp_size=2, enable_deterministic_inference=True), {"dp2": "without DP attention",
                                                                               "det": "num_splits 1 on both sides"}),
    (ServerConfig(tp_size=2, attn_cp_size=2, enable_prefill_cp=True, cp_strategy="zigzag", cp_decode_sharded_kv=True),
     {"cp2+pcp+sharded-kv": "decode over CP-sharded KV"}),
])
def test_every_token_of_the_label_is_explained_in_order(server, expected):
    label, terms = _label_and_terms(server, QWEN)
    assert [token for token, _ in terms] == label.split("/")
    meanings = dict(terms)
    assert meanings["qwen3-30b-a3b"] == "the model: H=32 query heads, Hk=4 KV heads, head dim 128/128"
    for token, words in expected.items():
        assert words in meanings[token], (token, meanings[token])


def test_every_label_of_many_configurations_is_explained_token_by_token():
    rng = random.Random(0)
    for _ in range(300):
        model = MODELS[rng.choice(sorted(MODELS))]
        server = ServerConfig(tp_size=rng.choice([1, 2, 4, 8]), dp_size=rng.choice([1, 2]),
                              enable_dp_attention=rng.random() < 0.5, attn_cp_size=rng.choice([1, 2]),
                              enable_prefill_cp=rng.random() < 0.5, num_splits=rng.choice([0, 0, 1, 4]),
                              enable_deterministic_inference=rng.random() < 0.2, num_sm=rng.choice([78, 114, 132]))
        label, terms = _label_and_terms(server, model)
        assert [token for token, _ in terms] == label.split("/") and all(meaning for _, meaning in terms)


def _offers_pr_30439_as_the_fix(hint: str) -> bool:
    """Whether a hint offers sglang PR #30439's guard as a fix (the predicate the old hint fails)."""
    return "PR #30439" in hint and "does not cover" not in hint


def _heads_hint(server):
    from fa3verify.finding_terms import hint_for

    return hint_for("SPLIT_BOUND", {"heads": [[8, 1], [32, 4]]}, server, QWEN, "sglang==0.5.23's own guard")


def test_attention_cp_without_prefill_cp_is_not_told_to_use_the_guard_it_already_has():
    hint = _heads_hint(ServerConfig(tp_size=4, attn_cp_size=4))
    assert "= 32 // 1 and max(1, 4 // 1) = (32, 4) here" in hint
    assert "attn_cp_size > 1" in hint and "sglang==0.5.23's own guard kept it here" in hint
    assert "does not cover attn_cp_size > 1" in hint and not _offers_pr_30439_as_the_fix(hint)
    # negative control: the old hint offered that guard for this witness, and the predicate says so
    assert _offers_pr_30439_as_the_fix(OLD_HEADS_HINT)


@pytest.mark.parametrize("server,condition", [
    (ServerConfig(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag"), "enable_prefill_cp"),
    (ServerConfig(tp_size=8, dp_size=4, enable_dp_attention=True), "enable_dp_attention"),
])
def test_a_witness_the_guard_of_pr_30439_covers_is_offered_that_guard(server, condition):
    hint = _heads_hint(server)
    assert f"make the precompute off when {condition}" in hint and _offers_pr_30439_as_the_fix(hint)
    h, hk = server.layer_heads(QWEN)
    assert f"= ({h}, {hk}) here" in hint


def test_a_cli_finding_prints_its_configuration_terms_and_the_fitted_hint(tmp_path, capsys):
    assert cli.main(["replay", str(WORKED), "--json", str(tmp_path / "r.json")]) == 1
    out = capsys.readouterr().out
    assert "    cp4+pcp: attn_cp_size 4 with enable_prefill_cp" in out
    found = json.loads((tmp_path / "r.json").read_text())["findings"][0]
    assert [t for t, _ in found["config_terms"]] == found["config"].split("/")
    assert found["hint"] != OLD_HEADS_HINT and "= (32, 4) here" in found["hint"]
    lines = finding_lines(found)
    assert any(line.startswith(f"    configuration {found['config']}:") for line in lines)
    assert "      sm132: num_sm 132: the GPU's SM count, which FA3's split heuristic divides the work over " \
           "(132 on an H100 SXM or H200, 114 on an H100 PCIe; other values stand for a partitioned GPU)" in lines


# -- on a source checkout: where each side was made -----------------------------------------------------------

@pytest.mark.engine
def test_a_finding_on_a_checkout_names_the_function_that_made_each_side(tmp_path, capsys):
    from gpu_impl.engines import envs
    from release_copies import replay_only_regression

    if not envs.env_ready("0.5.23"):
        pytest.skip("no environment for sglang 0.5.23: run `fa3verify engine setup sglang==0.5.23`")
    root = replay_only_regression(tmp_path / "copy")  # only the graph replay's recompute takes tp_size heads
    case = json.loads(WORKED.read_text())
    case["server"].update({"enable_prefill_cp": False, "cp_strategy": None, "cuda_graph": True})
    case["policy"]["guard"] = "fixed"
    case_path = tmp_path / "cp-without-prefill-cp.json"
    case_path.write_text(json.dumps(case))
    rc = cli.main(["replay", str(case_path), "--engine", f"sglang-src={root}", "--json", str(tmp_path / "r.json")])
    assert rc == 1
    found = json.loads((tmp_path / "r.json").read_text())["findings"][0]
    backend = "sglang/srt/layers/attention/flashattention_backend.py"
    # the precompute: made by the seeded regression's own function, the call by the release's forward_decode
    assert re.fullmatch(rf"FlashAttentionBackend\._compute_scheduler_metadata \({backend}:\d+\), from "
                        rf"FlashAttentionBackend\._regressed_replay_metadata \({backend}:\d+\)",
                        found["source"]["precompute"]), found["source"]
    assert found["source"]["call"].startswith(f"FlashAttentionBackend.forward_decode ({backend}:")
    assert found["path"] == "replay" and found["config"] == "qwen3-30b-a3b/tp4/cp4/sm132/splits=0"
    assert dict(found["config_terms"])["cp4"] == "attn_cp_size 4: attention context parallel without enable_prefill_cp"
    assert not _offers_pr_30439_as_the_fix(found["hint"]) and "attn_cp_size > 1" in found["hint"]
    out = capsys.readouterr().out
    assert "  precompute made in: FlashAttentionBackend._compute_scheduler_metadata (" in out
    assert any(line.startswith("    precompute made in: ") for line in finding_lines(found))


def test_caller_location_names_the_engines_function_past_its_fa3_wrappers():
    """Stand-in engine modules (named ``sglang.*``, as the engine's are): the backend's function calls the
    engine's dispatcher of FA3's own name, which goes through a module outside the engine (as torch's dispatch);
    the location names the backend's function and its caller, never the dispatcher nor the outside module."""
    from gpu_impl.engines.call_sites import caller_location

    seen = []

    def fake_front(*a):  # this project's fake FA3 front
        seen.append(caller_location("flash_attn_with_kvcache"))

    outside = {"__name__": "torch._ops", "fake_front": fake_front}
    exec("def dispatch():\n    fake_front()\n", outside)
    dispatcher = {"__name__": "sglang.jit_kernel.flash_attention_v3", "dispatch": outside["dispatch"]}
    exec("def flash_attn_with_kvcache():\n    dispatch()\n", dispatcher)
    backend = {"__name__": "sglang.srt.layers.attention.flashattention_backend",
               "flash_attn_with_kvcache": dispatcher["flash_attn_with_kvcache"]}
    exec("class FlashAttentionBackend:\n    def forward_decode(self):\n        flash_attn_with_kvcache()\n"
         "def run():\n    FlashAttentionBackend().forward_decode()\n", backend)
    backend["run"]()
    assert re.fullmatch(r"FlashAttentionBackend\.forward_decode \(sglang/srt/layers/attention/flashattention_backend"
                        r"\.py:3\), from run \(sglang/srt/layers/attention/flashattention_backend\.py:5\)", seen[0]), seen
    # negative control: from code outside any engine package there is nothing to name
    fake_front()
    assert seen[1] is None
