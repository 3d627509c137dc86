"""The harness on real sglang releases (marked ``engine``): gate, replay and conform against released code.

These need the engine runtime (``gpu_impl.engines``) and the cached environments of 0.5.13 and 0.5.23
(``fa3verify engine setup sglang==V``); without them they skip, naming what is missing. The numbers are the
worked example of docs/facts-fa3.md section 1 (S_p 109, S_c 29, 86 splits under prefill CP on a pre-fix release)."""

import json

import pytest

from fa3verify import cli
from spec.model.cases import Case

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("shared_workers")]

OLD, NEW = "0.5.13", "0.5.23"


@pytest.fixture
def shared_workers(engine_pool, monkeypatch):
    """The commands' engines run on the test process's one worker per release (tests/engine_pool.py), so this
    file starts each release's worker once instead of once per command; each command still opens its own system
    under test and sends every request to the release's own code."""
    from engine_pool import route_opens

    route_opens(engine_pool, monkeypatch)


@pytest.fixture(scope="module")
def gate_cases(tmp_path_factory):
    """One cases directory for both gates: their witness searches on the model (the search without a guard is the
    same for every release) are then computed once, the second gate's answered by the suite's theorem memo
    (tests/conftest.py), which gives back a refutation only to a run with the same cases directory; each gate's
    findings are still its own (case files named by their content, engine included)."""
    return tmp_path_factory.mktemp("gate-cases")


def _need_env(release):
    try:
        from gpu_impl.engines import envs
    except ModuleNotFoundError as exc:
        pytest.skip(f"no engine runtime in this checkout ({exc.name})")
    ready = getattr(envs, "env_ready", None)
    if ready is None or not ready(release):
        pytest.skip(f"no environment for sglang {release}: run `fa3verify engine setup sglang=={release}`")


def test_gate_on_a_pre_fix_release_finds_the_worked_example_bug(tmp_path, gate_cases):
    _need_env(OLD)
    code = cli.main(["gate", "--engine", f"sglang=={OLD}", "--cases", "20", "--cases-dir", str(gate_cases),
                     "--json", str(tmp_path / "g.json")])
    assert code == 1
    data = json.loads((tmp_path / "g.json").read_text())
    assert "SPLIT_BOUND" in {f["invariant"] for f in data["findings"]}
    case_file = next(f["case_file"] for f in data["findings"] if f["invariant"] == "SPLIT_BOUND")
    assert Case.load(case_file).engine["release"] == OLD
    assert cli.main(["replay", case_file]) == 1  # replays on the release it names
    from gpu_impl.engines import envs

    if envs.env_ready(NEW):  # the same scenario on the fixed release's code passes
        assert cli.main(["replay", case_file, "--engine", f"sglang=={NEW}"]) == 0


def test_gate_on_the_fixed_release_passes(gate_cases):
    _need_env(NEW)
    assert cli.main(["gate", "--engine", f"sglang=={NEW}", "--cases", "20", "--cases-dir", str(gate_cases)]) == 0


#: Settled: 0.5.16+ replay a decode CUDA graph without CPU lengths (FlashAttentionBackend.needs_cpu_seq_lens = False),
#: so the replay precomputes with max_context_len as max_seqlen_k; their profiles say so (graph_replay_seqlen_k).
@pytest.mark.parametrize("release", [OLD, NEW])
def test_conformance_of_the_profiles(release, tmp_path):
    _need_env(release)
    code = cli.main(["conform", "--engine", f"sglang=={release}", "--cases", "30", "--cases-dir", str(tmp_path),
                     "--no-assumption-probes", "--json", str(tmp_path / "c.json")])
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["conform"]["compared"] > 0
    assert code == 0, data["conform"]["differences"][:3]


@pytest.mark.parametrize("release, expected", [(OLD, 1), (NEW, 0)])
def test_replay_with_numerics_runs_the_releases_calls_through_the_emulator(release, expected, capsys):
    """--numerics sends the release's own FA3 calls (0.5.23: attention_chunk=None, only_qv=False) to the
    emulator's numerics: on the pre-fix release the worked example's long sequence (row 0: 86 splits for 29
    partial buffers) comes out NaN, the bug's symptom (docs/facts-fa3.md section 1); the fixed release's output has none."""
    _need_env(release)
    code = cli.main(["replay", "tests/corpus/worked_example_prefix_guard.json", "--engine", f"sglang=={release}",
                     "--numerics"])
    out = capsys.readouterr().out
    assert code == expected, out
    assert ("STILL FAILS" if expected else "PASSES NOW") in out
    assert ("NO_NAN at step 0, dp rank 0: NaN in the attention output of real rows [0]" in out) == bool(expected)
