"""Bad input is exit 2 naming the field and the allowed range, never a traceback; no
input hangs the tool or runs unbounded work (FIFOs, NaN budgets, huge cases, sleeping guards)."""

import json
import os
from pathlib import Path

import pytest

from fa3verify.cli import main

REPO = Path(__file__).resolve().parents[2]
PREFIX_CASE = REPO / "tests" / "corpus" / "worked_example_prefix_guard.json"


def mutated(tmp_path, name, mutate) -> str:
    data = json.loads(PREFIX_CASE.read_text())
    mutate(data)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def set_server(**kw):
    return lambda d: d["server"].update(kw)


def set_model(**kw):
    return lambda d: d["model"].update(kw)


def set_batch(batch):
    return lambda d: d["batches"].__setitem__(0, batch)


#: (name, mutation, field the message names, allowed range text it states)
BAD_CASES = [
    ("tp_gt_heads", set_server(tp_size=64, attn_cp_size=1, enable_prefill_cp=False), "server.tp_size",
     "[1, num_heads=32]"),
    ("cp_gt_tp", set_server(attn_cp_size=8), "server.attn_cp_size", "[1, tp_size=4]"),
    ("dp_gt_tp", set_server(enable_dp_attention=True, dp_size=8, attn_cp_size=1, enable_prefill_cp=False),
     "server.dp_size", "[1, tp_size=4]"),
    ("dp_times_cp_gt_tp", set_server(enable_dp_attention=True, dp_size=2, attn_cp_size=4), "server.attn_cp_size",
     "tp_size=4"),
    ("heads_beyond_int32", set_model(num_heads=2 ** 40, num_kv_heads=2 ** 40), "model.num_heads", "[1, 1024]"),
    ("kv_heads_beyond_bound", set_model(num_kv_heads=2 ** 33), "model.num_kv_heads", "[1, 1024]"),
    ("extend_len_zero", set_batch({"mode": "extend", "seq_lens": [10], "extend_lens": [0]}),
     "batches[0].extend_lens[0]", "[1, seq_lens[0]=10]"),
    ("seq_len_zero", set_batch({"mode": "decode", "seq_lens": [0], "extend_lens": None}), "batches[0].seq_lens",
     "[1, 2^31)"),
    ("million_sequences", set_batch({"mode": "decode", "seq_lens": [5] * 1_000_000, "extend_lens": None}),
     "batches[0].seq_lens", "at most 4096"),
    ("too_many_batches", lambda d: d.__setitem__("batches", d["batches"] * 300), "batches", "at most 256"),
    ("cp_size_2_31", set_server(attn_cp_size=2 ** 31, tp_size=2 ** 31), "server.tp_size", "[1, 1024]"),
    ("huge_num_sm", set_server(num_sm=10 ** 9), "server.num_sm", "[1, 1024]"),
    ("huge_page", set_server(page_size=2 ** 40), "server.page_size", "[1, 1048576]"),
    ("huge_context", set_server(context_length=2 ** 40), "server.context_length", "[1, 2147483647]"),
    ("huge_seed", lambda d: d.__setitem__("seed", 2 ** 70), "seed", "[0, 2^63)"),
]


@pytest.mark.parametrize("name,mutate,field,allowed", BAD_CASES, ids=[c[0] for c in BAD_CASES])
@pytest.mark.parametrize("command", ["replay", "run-ranks"])
def test_bad_case_files_exit_2_naming_field_and_range(tmp_path, capsys, name, mutate, field, allowed, command):
    path = mutated(tmp_path, f"{name}.json", mutate)
    assert main([command, path]) == 2
    err = capsys.readouterr().err
    assert field in err and allowed in err and "Traceback" not in err, err


def _deep(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    return str(p), "nested at most"


def _digits(tmp_path):
    p = tmp_path / "digits.json"
    p.write_text(PREFIX_CASE.read_text().rstrip().rstrip("}") + ', "seed": ' + "9" * 5000 + "}")
    return str(p), "4300 digits"


def _directory(tmp_path):
    (tmp_path / "adir").mkdir()
    return str(tmp_path / "adir"), "is a directory"


def _symlink_loop(tmp_path):
    os.symlink(tmp_path / "loop_b", tmp_path / "loop_a")
    os.symlink(tmp_path / "loop_a", tmp_path / "loop_b")
    return str(tmp_path / "loop_a"), "symbolic link loop"


def _fifo(tmp_path):
    os.mkfifo(tmp_path / "case.fifo")
    return str(tmp_path / "case.fifo"), "not a regular file"


def _big(tmp_path):
    p = tmp_path / "big.json"
    with open(p, "wb") as fh:
        fh.truncate(17 * 1024 * 1024)
    return str(p), "at most"


def _not_utf8(tmp_path):
    p = tmp_path / "latin.json"
    p.write_bytes(b"\xff\xfe{}")
    return str(p), "UTF-8"


PATHS = [_deep, _digits, _directory, _symlink_loop, _fifo, _big, _not_utf8]


@pytest.mark.parametrize("make", PATHS, ids=[m.__name__.strip("_") for m in PATHS])
@pytest.mark.parametrize("command", [["replay"], ["run-ranks"], ["report", "--html", "OUT"]])
def test_unreadable_inputs_exit_2_without_hanging(tmp_path, capsys, make, command):
    path, words = make(tmp_path)
    argv = [command[0], path] + [str(tmp_path / "out.html") if a == "OUT" else a for a in command[1:]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err


def test_unreadable_file_exits_2(tmp_path, capsys, monkeypatch):
    # root reads every file, so the permission error is produced where the file is opened
    import fa3verify.outputs as outputs

    path = tmp_path / "case.json"
    path.write_text(PREFIX_CASE.read_text())

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(outputs.os, "open", denied)
    assert main(["replay", str(path)]) == 2
    assert "permission denied" in capsys.readouterr().err


NUMBERS = [
    (["fuzz", "--budget-s", "nan"], "--budget-s"), (["fuzz", "--budget-s", "inf"], "--budget-s"),
    (["fuzz", "--budget-s", "-1"], "--budget-s"), (["gate", "--budget-s", "nan"], "--budget-s"),
    (["gate", "--timeout-s", "0"], "--timeout-s"), (["gate", "--timeout-s", "nan"], "--timeout-s"),
    (["gate", "--timeout-s", "inf"], "--timeout-s"), (["prove", "--timeout-s", "nan"], "--timeout-s"),
    (["prove", "--timeout-s=-inf"], "--timeout-s"), (["check", "--budget-s", "nan"], "--budget-s"),
    (["run-ranks", str(PREFIX_CASE), "--timeout-s", "nan"], "--timeout-s"),
    (["gpu-check", "--dry-run", "--fuzz-budget-s", "nan"], "--fuzz-budget-s"),
    (["gpu-check", "--dry-run", "--total-budget-s", "inf"], "--total-budget-s"),
    (["gpu-check", "--dry-run", "--workers", "0"], "--workers"),
    (["fuzz", "--cases", "100000000000"], "--cases"), (["fuzz", "--seed", "-1"], "--seed"),
    (["run-ranks", str(PREFIX_CASE), "--world", "100000"], "--world"),
    (["fuzz", "--guard-timeout-s", "nan"], "--guard-timeout-s"),
]


@pytest.mark.parametrize("argv,flag", NUMBERS, ids=[" ".join(a[:3]) for a, _ in NUMBERS])
def test_non_finite_or_out_of_range_numbers_exit_2(tmp_path, capsys, argv, flag):
    argv = [str(tmp_path / "x.png") if a == "OUT.png" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and "expected" in err and "Traceback" not in err, err


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "tpu", "", "cuda:99"])
@pytest.mark.parametrize("command", [["fuzz", "--cases", "1"], ["replay", str(PREFIX_CASE)]])
def test_unknown_device_exits_2(capsys, device, command):
    assert main(command + ["--device", device]) == 2
    err = capsys.readouterr().err
    assert "--device" in err and "Traceback" not in err


def test_a_guard_that_sleeps_is_stopped_at_its_deadline(tmp_path, capsys):
    guard = tmp_path / "sleepy.py"
    guard.write_text("import time\ndef g(a):\n    time.sleep(600)\n    return True\n")
    out = tmp_path / "fuzz.json"
    rc = main(["fuzz", "--guard", f"{guard}:g", "--guard-timeout-s", "0.5", "--cases", "3", "--out",
               str(tmp_path / "cases"), "--json", str(out)])
    assert rc == 1
    summary = json.loads(out.read_text())
    assert "GUARD_TIMEOUT" in {f["invariant"] for f in summary["findings"]}


def test_replay_with_tensors_refuses_batches_beyond_the_numerics_bound(tmp_path, capsys):
    path = mutated(tmp_path, "long.json", set_batch({"mode": "decode", "seq_lens": [2 ** 30] * 4,
                                                     "extend_lens": None}))
    assert main(["replay", path, "--numerics"]) == 2
    assert "batches[0].seq_lens" in capsys.readouterr().err
