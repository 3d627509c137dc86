"""A Hypothesis fuzz test of the command line itself.

Random argument vectors and random mutations of corpus case files must end in exit 0, 1, 2 or 3, never with a
traceback or an internal error, and must touch no file outside the run's output folder. Bounded (a few dozen
examples, each either rejected at once or a run of a few cases) and deterministic (derandomized)."""

import contextlib
import hashlib
import io
import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from fa3verify.cli import main

REPO = Path(__file__).resolve().parents[2]
CORPUS = sorted((REPO / "tests" / "corpus").glob("*.json"))
WATCHED = [REPO / "tests" / "corpus", REPO / "examples"]

SETTINGS = settings(max_examples=40, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))

NUMBERS = ["nan", "inf", "-inf", "0", "-1", "1", "2", "0.5", "1e308", "99999999999999999999", "abc", ""]
PATHY = ["{out}/r.json", "{out}", "{out}/sub/dir/x.xml", "{case}", "{out}/afile/x", "/", ".", ""]
OPTIONS = {
    "--budget-s": NUMBERS, "--cases": NUMBERS, "--timeout-s": NUMBERS, "--seed": NUMBERS,
    "--guard-timeout-s": NUMBERS, "--device": ["cpu", "cuda", "gpu", "cuda:7", ""],
    "--guard": ["fixed", "pre-fix", "none", "nope", "os:system", "{out}/nofile.py:g", ":", "a:b:c", ""],
    "--metadata-heads": ["tp", "attn_tp", "x"], "--kernel": ["emulated", "fa3", "x"],
    "--json": PATHY, "--junit": PATHY, "--out": PATHY, "--cases-dir": PATHY, "--html": PATHY,
    "--only": ["hazard", "nope", ""], "--drop-assumption": ["ASSUMPTION_TP_DIVISIBLE", "X"],
}
FLAGS = ["--numerics", "--trust-case-guard", "--keep-stale-cp-metadata", "--metadata-only", "--help-me"]
#: Commands whose valid runs are short. prove and gate always get a bad --timeout-s (their full run is long).
COMMANDS = ["replay", "fuzz", "report", "prove", "gate", "invariants", "nosuchcommand"]


def _tree_digest() -> str:
    h = hashlib.sha256()
    for root in WATCHED:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                st_ = p.stat()
                h.update(f"{p}:{st_.st_size}:{st_.st_mtime_ns}".encode())
    return h.hexdigest()


def _run(argv, out: Path) -> tuple:
    """main(argv) in `out` as the working directory: (exit code, stderr)."""
    err, stdout = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(out)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        os.chdir(cwd)
    return code, err.getvalue()


def _check(code, err, argv):
    assert code in (0, 1, 2, 3), (argv, code, err)
    assert "Traceback" not in err and "internal error" not in err, (argv, err)


@st.composite
def argvs(draw):
    command = draw(st.sampled_from(COMMANDS))
    argv = [command]
    if command in ("replay", "report"):
        argv.append(draw(st.sampled_from(["{case}", "{out}", "{out}/missing.json", "{fifo}", ""])))
    if command == "fuzz":
        argv += ["--cases", draw(st.sampled_from(["1", "2"]))]
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            opt = draw(st.sampled_from(sorted(OPTIONS)))
            argv += [opt, draw(st.sampled_from(OPTIONS[opt]))]
        else:
            argv.append(draw(st.sampled_from(FLAGS)))
    if command in ("prove", "gate"):
        argv += ["--timeout-s", draw(st.sampled_from(["nan", "0", "-1", "inf"]))]
    return argv


@SETTINGS
@given(argvs())
def test_random_command_lines_end_in_a_documented_exit_code(argv):
    before = _tree_digest()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        (out / "afile").write_text("x")
        case = out / "case.json"
        case.write_text(CORPUS[0].read_text())
        os.mkfifo(out / "in.fifo")
        argv = [a.format(out=out, case=case, fifo=out / "in.fifo") for a in argv]
        code, err = _run(argv, out)
        _check(code, err, argv)
        assert case.read_text() == CORPUS[0].read_text(), "the input case file was changed"
    assert _tree_digest() == before, "a file outside the output folder was touched"


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                   st.sampled_from([0, 1, -1, 2 ** 31, 2 ** 31 - 1, 2 ** 63, 4096, 4097]),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                   st.lists(st.integers(-5, 2 ** 32), max_size=6), st.dictionaries(st.text(max_size=4),
                                                                                  st.integers(), max_size=2))


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:4]):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated_cases(draw):
    data = json.loads(draw(st.sampled_from(CORPUS)).read_text())
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(data) if p]
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["set", "set", "delete"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(VALUES)
    return data


def _dump(data) -> str:
    """JSON text; NaN and Infinity are written as Python writes them (non-standard), so readers must cope."""
    return json.dumps(data, default=str)


@SETTINGS
@given(mutated_cases(), st.sampled_from([[], ["--guard", "fixed"], ["--guard", "pre-fix"], ["--trust-case-guard"]]))
def test_mutated_corpus_cases_replay_to_a_documented_exit_code(data, extra):
    before = _tree_digest()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        case = out / "case.json"
        case.write_text(_dump(data))
        code, err = _run(["replay", str(case), "--json", str(out / "r.json"), *extra], out)
        _check(code, err, ["replay", data, extra])
    assert _tree_digest() == before, "a file outside the output folder was touched"


def test_negative_control_the_oracle_sees_an_overwritten_input(monkeypatch):
    """Seeded defect: with the output checks switched off, `replay CASE --json CASE` overwrites the case file,
    which the fuzz test's assertion on the input must catch."""
    import fa3verify.outputs as outputs

    monkeypatch.setattr(outputs, "check_outputs", lambda command, args: None)
    with tempfile.TemporaryDirectory() as tmp:
        case = Path(tmp) / "case.json"
        case.write_text(CORPUS[0].read_text())
        code, err = _run(["replay", str(case), "--json", str(case)], Path(tmp))
        _check(code, err, "negative control")
        assert case.read_text() != CORPUS[0].read_text()
