"""Case files (schema fa3verify.case/1): round trip, stable file names, and CaseFormatError naming the bad field."""

import json

import pytest

from spec.model.cases import SCHEMA, Case, CaseFormatError


def _case(**over):
    parts = dict(
        source="prove:prefill-cp-hazard",
        server={"tp_size": 4, "dp_size": 1, "attn_cp_size": 4, "enable_dp_attention": False, "enable_prefill_cp": True,
                "cp_strategy": "zigzag", "page_size": 1, "num_splits": 0, "enable_deterministic_inference": False,
                "cuda_graph": False, "num_sm": 132, "context_length": 32768},
        model={"name": "qwen3-30b-a3b", "num_heads": 32, "num_kv_heads": 4, "head_dim": 128, "head_dim_v": 128,
               "dtype": "bfloat16", "is_mla": False, "has_sliding_window_layers": False},
        policy={"guard": "pre-fix", "metadata_heads": "tp", "clear_stale_cp_metadata": True},
        batches=[{"mode": "decode", "seq_lens": [32768] + [100] * 7, "extend_lens": None}],
        kernel={"name": "emulated", "mode": "strict"}, seed=3,
        expected={"outcome": "violation", "invariant": "SPLIT_BOUND", "detail": {"S_p": 109, "S_c": 29}},
        notes="docs/facts-fa3.md's worked example")
    parts.update(over)
    return Case.from_parts(**parts)


def test_round_trip_and_stable_signature(tmp_path):
    c = _case()
    assert c.schema == SCHEMA and c.id == c.signature()
    again = Case.from_json(c.to_json())
    assert again.to_dict() == c.to_dict()
    p1 = c.save(tmp_path)
    assert Case.load(p1).to_dict() == c.to_dict()
    p2 = _case(notes="different notes, same violation").save(tmp_path)
    assert p1 == p2 and len(list(tmp_path.iterdir())) == 1  # one file per distinct signature
    assert Case.load(p1).notes == "docs/facts-fa3.md's worked example"  # the first finder's file is kept
    other = _case(batches=[{"mode": "decode", "seq_lens": [32768], "extend_lens": None}]).save(tmp_path)
    assert other != p1 and p1.name.startswith("prove-split-bound-")


def test_extend_batches_and_policy_extensions():
    c = _case(batches=[{"mode": "extend", "seq_lens": [100, 40], "extend_lens": [100, 8]},
                       {"mode": "idle", "seq_lens": [], "extend_lens": None}],
              policy={"guard": "examples/guards/prefix_guard.py:should_disable", "metadata_heads": "attn_tp",
                      "clear_stale_cp_metadata": False, "cp_decode_kv": "sharded"})
    assert Case.from_json(c.to_json()).policy["cp_decode_kv"] == "sharded"


@pytest.mark.parametrize("path, value, field", [
    (("schema",), "fa3verify.case/0", "schema"),
    (("source",), "proof", "source"),
    (("server", "tp_size"), 0, "server.tp_size"),
    (("server", "num_splits"), 300, "server.num_splits"),
    (("server", "cp_strategy"), "ring", "server.cp_strategy"),
    (("server", "tensor_parallel"), 2, "server.tensor_parallel"),
    (("model", "num_kv_heads"), 5, "model.num_kv_heads"),
    (("model", "dtype"), "float32", "model.dtype"),
    (("policy", "metadata_heads"), "dp", "policy.metadata_heads"),
    (("policy", "guard"), "", "policy.guard"),
    (("batches",), [], "batches"),
    (("batches", 0, "mode"), "prefill", "batches[0].mode"),
    (("batches", 0, "seq_lens"), [1, -2], "batches[0].seq_lens"),
    (("kernel", "name"), "cuda", "kernel.name"),
    (("expected", "outcome"), "crash", "expected.outcome"),
    (("expected", "invariant"), None, "expected.invariant"),
    (("seed",), -1, "seed"),
])
def test_malformed_fields_raise_case_format_error_naming_the_field(tmp_path, path, value, field):
    data = _case().to_dict()
    obj = data
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(data))
    with pytest.raises(CaseFormatError) as info:
        Case.load(f)
    assert info.value.field == field and field in str(info.value)
    assert "expected" in str(info.value)


def test_extend_lens_must_match_and_not_exceed_seq_lens():
    data = _case().to_dict()
    data["batches"] = [{"mode": "extend", "seq_lens": [10, 20], "extend_lens": [11, 1]}]
    with pytest.raises(CaseFormatError, match=r"batches\[0\]\.extend_lens\[0\]"):
        Case.from_dict(data)
    data["batches"] = [{"mode": "mixed", "seq_lens": [10], "extend_lens": None}]
    with pytest.raises(CaseFormatError, match=r"batches\[0\]\.extend_lens"):
        Case.from_dict(data)


def test_not_json_and_missing_file(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("{not json")
    with pytest.raises(CaseFormatError, match="valid JSON"):
        Case.load(f)
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(CaseFormatError, match="UTF-8"):
        Case.load(f)
    with pytest.raises(FileNotFoundError):
        Case.load(tmp_path / "absent.json")
    assert issubclass(CaseFormatError, ValueError)


@pytest.mark.parametrize("release, ok", [
    ("0.5.23", True), ("0.8.5.post1", True), ("0.9.0.1", True), ("0.10.1.1", True),   # every form a registry lists
    ("0.10", False), ("0.10.1.1.1", False), ("v0.10.1", False), ("0.10.1rc1", False),
])
def test_engine_release_takes_every_published_release_number(release, ok):
    """A case found on a release that shares another's row (vLLM 0.9.0.1, 0.10.1.1) records its own number."""
    data = _case(engine={"name": "vllm", "release": release}).to_dict() if ok else _case().to_dict()
    if ok:
        assert Case.from_dict(data).engine["release"] == release
    else:
        data["engine"] = {"name": "vllm", "release": release}
        with pytest.raises(CaseFormatError, match=r"engine\.release"):
            Case.from_dict(data)
