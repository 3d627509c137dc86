"""Class 1: never a false pass. Any observed violation or guard fault is never exit 0; zero checks run is
exit 3 or 2, never 0; an unknown name is exit 2. Guards that exit, hang or return non-bools are faults."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fa3verify.cli import main

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "corpus"
FIXED_CASE = str(CORPUS / "worked_example_fixed_guard.json")
PREFIX_CASE = str(CORPUS / "worked_example_prefix_guard.json")

GUARDS = {
    "raises": "def g(a):\n    raise RuntimeError('boom')\n",
    "sys_exit": "import sys\ndef g(a):\n    sys.exit(0)\n",
    "os_exit": "import os\ndef g(a):\n    os._exit(0)\n",
    "generator": "def g(a):\n    yield False\n",
    "instance": "class C:\n    pass\ndef g(a):\n    return C()\n",
    "coroutine": "async def g(a):\n    return False\n",
    "string_false": "def g(a):\n    return 'False'\n",
    "none": "def g(a):\n    return None\n",
}
IMPORT_EXITS = {
    "import_sys_exit": "import sys\nsys.exit(0)\ndef g(a):\n    return True\n",
    "import_os_exit": "import os\nos._exit(0)\ndef g(a):\n    return True\n",
}


def write_guard(tmp_path, kind: str) -> str:
    path = tmp_path / f"guard_{kind}.py"
    path.write_text({**GUARDS, **IMPORT_EXITS}[kind])
    return f"{path}:g"


def cli(*argv, cwd=None, timeout=300):
    """Run the command line in a child process (a guard calling os._exit must not end the test run)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "fa3verify", *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def run_guarded(kind: str, capfd, *argv):
    """The command line for a guard of ``kind``: in a child process when the guard calls os._exit (were its
    isolation lost, it would end the test run), else in this process. Either way ``err`` holds what the tool and
    the guard's own process wrote (capfd reads the file descriptors), so "no Traceback" reads the same text."""
    if "os_exit" in kind:
        return cli(*argv)
    code = main(list(argv))
    out, err = capfd.readouterr()
    return code, out, err


def _case(tmp_path, base: str, name: str, mutate) -> str:
    data = json.loads(Path(base).read_text())
    mutate(data)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


# -- replay ------------------------------------------------------------------------------------------------------

def test_replay_of_a_case_expected_to_pass_that_now_fails_is_exit_1(capsys):
    assert main(["replay", FIXED_CASE, "--guard", "pre-fix"]) == 1
    out = capsys.readouterr().out
    assert "PASSES" not in out and "SPLIT_BOUND" in out


def test_replay_with_an_unknown_expected_invariant_is_exit_2(tmp_path, capsys):
    case = _case(tmp_path, PREFIX_CASE, "typo.json", lambda d: d["expected"].update(invariant="SPLIT_BOUDN"))
    assert main(["replay", case]) == 2
    err = capsys.readouterr().err
    assert "expected.invariant" in err and "SPLIT_BOUND" in err and "Traceback" not in err


def test_replay_with_a_different_violation_than_recorded_is_exit_1(tmp_path, capsys):
    case = _case(tmp_path, PREFIX_CASE, "other.json", lambda d: d["expected"].update(invariant="QUERY_COVER"))
    assert main(["replay", case]) == 1
    assert "FAILS DIFFERENTLY" in capsys.readouterr().out


@pytest.mark.parametrize("kind", sorted(GUARDS))
def test_replay_with_a_faulty_guard_is_exit_1(tmp_path, kind, capfd):
    rc, out, err = run_guarded(kind, capfd, "replay", FIXED_CASE, "--guard", write_guard(tmp_path, kind))
    assert rc == 1, (out, err)
    assert "GUARD_RAISED" in out and "PASSES" not in out and "Traceback" not in err


@pytest.mark.parametrize("field,value", [("policy", {"guard": "pre-fix", "metadata_heads": "tp",
                                                     "clear_stale_cp_metadata": True, "cp_decode_kv": "sharded"}),
                                         ("server", "sharded-flag")])
def test_sharded_kv_cases_are_inconclusive_not_replayed_as_replicated(tmp_path, field, value, capsys):
    def mutate(d):
        if value == "sharded-flag":
            d["server"]["cp_decode_sharded_kv"] = True
        else:
            d[field] = value
    case = _case(tmp_path, PREFIX_CASE, "sharded.json", mutate)
    assert main(["replay", case]) == 3
    assert "INCONCLUSIVE" in capsys.readouterr().out


# -- guards that end the process, hang, or return non-bools -----------------------------------------------------

@pytest.mark.parametrize("kind", ["sys_exit", "os_exit", "generator", "coroutine", "string_false", "instance"])
def test_fuzz_with_a_faulty_guard_is_exit_1(tmp_path, kind, capfd):
    rc, out, err = run_guarded(kind, capfd, "fuzz", "--guard", write_guard(tmp_path, kind), "--cases", "3", "--out",
                       str(tmp_path / "cases"), "--json", str(tmp_path / "fuzz.json"))
    assert rc == 1, (out, err)
    summary = json.loads((tmp_path / "fuzz.json").read_text())
    assert summary["exit_code"] == 1 and "GUARD_RAISED" in {f["invariant"] for f in summary["findings"]}


@pytest.mark.parametrize("kind", ["sys_exit", "os_exit", "string_false"])
def test_prove_with_a_faulty_guard_fails(tmp_path, kind, capfd):
    rc, out, err = run_guarded(kind, capfd, "prove", "--guard", write_guard(tmp_path, kind), "--only", "prefill-cp-hazard",
                               "--only",
                       "guard-soundness", "--cases-dir", str(tmp_path / "cases"))
    assert rc == 1, (out, err)
    assert "verdict: FAIL" in out


@pytest.mark.parametrize("kind", sorted(IMPORT_EXITS))
@pytest.mark.parametrize("command", [["fuzz", "--cases", "2"], ["prove", "--only", "prefill-cp-hazard"],
                                     ["gate", "--cases", "2"]])
def test_a_guard_that_exits_at_import_is_a_usage_error(tmp_path, kind, command, capfd):
    rc, out, err = run_guarded(kind, capfd, *command, "--guard", write_guard(tmp_path, kind),
                               "--cases-dir" if command[0] != "fuzz" else "--out", str(tmp_path / "cases"))
    assert rc == 2, (out, err)
    assert "--guard" in err and "Traceback" not in err


#: The gate's command line with its prove stage cut to the theorems that evaluate the guard (3 and 4), to keep
#: the test short; everything else is the real gate (tests/gate_guard_theorems.py).
GATE_WITH_GUARD_THEOREMS = REPO / "tests" / "gate_guard_theorems.py"


@pytest.mark.parametrize("kind", ["sys_exit", "os_exit"])
def test_gate_with_a_guard_that_exits_fails(tmp_path, kind, monkeypatch, capfd):
    argv = ["gate", "--guard", write_guard(tmp_path, kind), "--cases", "3", "--cases-dir", str(tmp_path / "cases"),
            "--json", str(tmp_path / "gate.json")]
    if kind == "os_exit":  # a child process, as in run_guarded
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.run([sys.executable, str(GATE_WITH_GUARD_THEOREMS), *argv], capture_output=True,
                              text=True, env=env, timeout=300)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    else:  # the same cut of the prove stage, in this process
        import fa3verify.commands.prove as p
        from gate_guard_theorems import cut_prove_stage

        monkeypatch.setattr(p, "theorem_results", p.theorem_results)  # undone after the test
        cut_prove_stage()
        rc = main(argv)
        out, err = capfd.readouterr()
    assert rc == 1, (out, err)
    assert json.loads((tmp_path / "gate.json").read_text())["verdict"] == "fail"


# -- nothing ran -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["no-such-theorem", "freshnesss"])
def test_prove_only_an_unknown_theorem_is_exit_2(name, capsys):
    assert main(["prove", "--only", name]) == 2
    err = capsys.readouterr().err
    assert "--only" in err and "freshness" in err


def test_a_summary_with_no_checks_is_inconclusive():
    from fa3verify.summary import RunSummary

    assert RunSummary(command="prove").exit_code == 3


def test_gpu_check_with_every_stage_skipped_is_inconclusive(tmp_path, capfd):
    from fa3verify.commands.gpu_check import STAGE_NAMES

    skips = [a for name in STAGE_NAMES for a in ("--skip", name)]
    rc = main(["gpu-check", "--dry-run", "--out", str(tmp_path / "gc"), *skips])
    out, err = capfd.readouterr()
    assert rc == 3, (out, err)
    assert "PASS" not in out.split("verdict:")[-1]
