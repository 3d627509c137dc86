"""Tests of real multi-rank execution: gloo on loopback, one process per attention rank.

Processes are expensive (each imports torch), so every world size is launched once per module with all its
cases, and the tests read the shared results.  Every launch has its own timeout (the launcher's), so a hang
fails the test instead of blocking the suite.
"""

import json
import os
import time
from pathlib import Path

import pytest
import torch

from fa3verify.cli import main as cli_main
from fa3verify.multirank import bitwise_equal, compare_with_simulation, resolve_world, run_ranks
from fa3verify.errors import UsageError
from gpu_impl.config import ServerConfig
from gpu_impl.distributed import attention_world_size, rank_placement, scenario_from_case

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is needed")

QWEN = {"name": "qwen3-30b-a3b", "num_heads": 32, "num_kv_heads": 4, "head_dim": 128}
#: A launch's deadline is a hang detector, not a speed goal: four ranks that each import torch took 190 s on a
#: 2-core machine at load 10, so a healthy launch must never come near it.
LAUNCH_TIMEOUT_S = 600.0
WORKED = [32768] + [100] * 7


def case(name, server, batches, guard="fixed", clear=True, expected=None, seed=0):
    data = {"schema": "fa3verify.case/1", "id": name, "source": "manual", "server": server, "model": dict(QWEN),
            "policy": {"guard": guard, "metadata_heads": "tp", "clear_stale_cp_metadata": clear},
            "batches": [{"mode": m, "seq_lens": s, "extend_lens": e} for m, s, e in batches],
            "kernel": {"name": "emulated", "mode": "strict"}, "seed": seed,
            "expected": expected or {"outcome": "pass", "invariant": None, "detail": {}}}
    try:
        from spec.model.cases import Case
    except ImportError:
        return data
    return Case.from_dict(data).to_dict()  # the project's validation of the schema


CP2 = {"tp_size": 2, "attn_cp_size": 2, "enable_prefill_cp": True, "cp_strategy": "zigzag"}
CP4 = {"tp_size": 4, "attn_cp_size": 4, "enable_prefill_cp": True, "cp_strategy": "zigzag"}
DP2 = {"tp_size": 4, "dp_size": 2, "enable_dp_attention": True}
DP2_GRAPH = {**DP2, "cuda_graph": True, "context_length": 256}
DP2_CP2 = {"tp_size": 4, "dp_size": 2, "enable_dp_attention": True, "attn_cp_size": 2, "enable_prefill_cp": True,
           "cp_strategy": "zigzag"}

TWO = {  # world 2
    "cp_only": case("cp_only", CP2, [("extend", [20, 30], [12, 30]), ("decode", [21, 31], None),
                                     ("mixed", [9, 22, 32], [9, 1, 1]), ("idle", [], None),
                                     ("extend", [10, 25], [10, 5])], seed=3),
    "cp_only_stale": case("cp_only_stale", CP2, [("extend", [20, 40], [16, 40]), ("mixed", [9, 21, 41], [9, 1, 1])],
                          clear=False, expected={"outcome": "violation", "invariant": "CP_LAYOUT_MATCHES_BATCH",
                                                 "detail": {}}),
    "dp_only_skewed": case("dp_only_skewed", DP2, [("decode", [32768] + [100] * 15, None)], guard="none",
                           expected={"outcome": "violation", "invariant": "SPLIT_BOUND", "detail": {}}),
    "dp_only_graph": case("dp_only_graph", DP2_GRAPH, [("decode", [40, 7, 100, 3, 60], None),
                                                       ("extend", [30, 20, 9], [30, 12, 9]),
                                                       ("decode", [31, 21, 10], None)], seed=5),
}
FOUR = {  # world 4
    "worked_prefix": case("worked_prefix", CP4, [("decode", WORKED, None)], guard="pre-fix",
                          expected={"outcome": "violation", "invariant": "SPLIT_BOUND", "detail": {}}),
    "worked_fixed": case("worked_fixed", CP4, [("decode", WORKED, None)], guard="fixed"),
    "dp_x_cp": case("dp_x_cp", DP2_CP2, [("extend", [16, 12, 9, 20], [16, 8, 9, 12]),
                                         ("decode", [17, 13, 10, 21], None),
                                         ("mixed", [8, 14, 11, 22], [8, 1, 1, 1]),
                                         ("extend", [12], [12])], seed=11),
}
# The fixed worked example's 32768-token numerics are beyond the emulator's memory budget: metadata only.
FOUR_NUMERICS = {"worked_prefix": True, "worked_fixed": False, "dp_x_cp": True}


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks run single-threaded too
    yield
    torch.set_num_threads(before)


def launch(cases, **kw):
    start = time.perf_counter()
    results = run_ranks(list(cases.values()), timeout_s=LAUNCH_TIMEOUT_S, **kw)
    elapsed = time.perf_counter() - start
    assert elapsed < LAUNCH_TIMEOUT_S + 15
    for r in results:
        assert r.outcome not in ("timeout", "rank_error"), r.error
        assert_all_gone(r.pids)
    return dict(zip(cases, results))


def assert_all_gone(pids):
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


class ListenWatch:
    """Polls /proc while a launch runs: the local addresses of every listening TCP socket of our children."""

    def __init__(self):
        import threading

        self.addresses = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _children(self):
        me = str(os.getpid())
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/status") as fh:
                    if any(line.split()[1:2] == [me] for line in fh if line.startswith("PPid:")):
                        yield pid
            except OSError:
                continue

    def _run(self):
        while not self._stop.is_set():
            inodes = set()
            for pid in self._children():
                try:
                    for fd in os.listdir(f"/proc/{pid}/fd"):
                        target = os.readlink(f"/proc/{pid}/fd/{fd}")
                        if target.startswith("socket:["):
                            inodes.add(target[8:-1])
                except OSError:
                    continue
            for table in ("/proc/net/tcp", "/proc/net/tcp6"):
                try:
                    with open(table) as fh:
                        rows = [line.split() for line in fh][1:]
                except OSError:
                    continue
                for row in rows:
                    if row[3] == "0A" and row[9] in inodes:  # LISTEN
                        self.addresses.add(row[1].split(":")[0])
            time.sleep(0.02)


CORPUS = Path(__file__).resolve().parent.parent / "corpus"


def _corpus_scenario_cases() -> dict:
    cases = {}
    for path in sorted(CORPUS.glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("schema") == "fa3verify.case/1":
            cases[path.name] = data
    return cases


@pytest.fixture(scope="module")
def corpus():
    """The regression corpus's scenario cases by world size; worlds 2 and 4 run in the launches of TWO and FOUR."""
    by_world: dict = {}
    for name, data in _corpus_scenario_cases().items():
        by_world.setdefault(resolve_world([data], None), {})[name] = data
    return by_world


def launch_with_corpus(cases, corpus_cases, numerics):
    """One launch of ``cases`` (checked as `launch` does) followed by ``corpus_cases`` (numerics on, as a corpus
    run has them): the corpus results are only compared with the simulation, by the corpus test."""
    start = time.perf_counter()
    results = run_ranks([*cases.values(), *corpus_cases.values()], timeout_s=LAUNCH_TIMEOUT_S,
                        numerics=[*numerics, *[True] * len(corpus_cases)])
    assert time.perf_counter() - start < LAUNCH_TIMEOUT_S + 15
    for r in results:
        assert_all_gone(r.pids)
    for r in results[:len(cases)]:
        assert r.outcome not in ("timeout", "rank_error"), r.error
    return dict(zip([*cases, *corpus_cases], results))


@pytest.fixture(scope="module")
def two(corpus):
    with ListenWatch() as watch:
        results = launch_with_corpus(TWO, corpus.get(2, {}), [True] * len(TWO))
    results["_listening"] = watch.addresses
    return results


@pytest.fixture(scope="module")
def four(corpus):
    return launch_with_corpus(FOUR, corpus.get(4, {}), [FOUR_NUMERICS[k] for k in FOUR])


# ---------------------------------------------------------------------------------------------
# Placement and world size (no processes)
# ---------------------------------------------------------------------------------------------


def test_world_is_attn_dp_times_attn_cp_and_ranks_are_dp_major():
    srv = ServerConfig(**DP2_CP2)
    assert attention_world_size(srv) == 4
    places = [rank_placement(srv, r) for r in range(4)]
    assert [(p.dp_rank, p.cp_rank) for p in places] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert places[3].cp_group == (2, 3) and places[2].is_cp_leader
    assert attention_world_size(ServerConfig(tp_size=4, dp_size=2)) == 1  # no DP attention: one attention rank
    with pytest.raises(ValueError, match="rank"):
        rank_placement(srv, 4)


def test_world_mismatch_is_a_usage_error_naming_both_numbers(tmp_path, capsys):
    with pytest.raises(UsageError, match=r"--world.*= 4 ranks.*--world 2"):
        resolve_world([FOUR["dp_x_cp"]], 2)
    path = tmp_path / "case.json"
    path.write_text(__import__("json").dumps(TWO["cp_only"]))
    assert cli_main(["run-ranks", str(path), "--world", "3"]) == 2
    err = capsys.readouterr().err
    assert "--world" in err and "= 2 ranks" in err and "--world 3" in err


def test_bad_case_files_are_usage_errors(tmp_path, capsys):
    assert cli_main(["run-ranks", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "fa3verify.case/1"}')
    assert cli_main(["run-ranks", str(bad)]) == 2
    assert "CASE" in capsys.readouterr().err
    path = tmp_path / "case.json"
    path.write_text(__import__("json").dumps(TWO["cp_only"]))
    assert cli_main(["run-ranks", str(path), "--timeout-s", "0"]) == 2
    assert "--timeout-s" in capsys.readouterr().err


def test_scenario_from_case_reads_the_policy():
    scn = scenario_from_case(TWO["cp_only_stale"])
    assert scn.clear_stale_cp_metadata is False and scn.guard_spec == "fixed" and scn.seed == 0
    assert [s.mode for s in scn.steps] == ["extend", "mixed"]


# ---------------------------------------------------------------------------------------------
# Two processes: CP only and DP only
# ---------------------------------------------------------------------------------------------


def test_every_listening_socket_of_the_ranks_is_on_loopback(two):
    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("needs Linux /proc")
    seen = two["_listening"]
    assert seen, "no listening socket of the ranks was seen (gloo listens while the group is up)"
    # 127.0.0.1 in /proc/net/tcp's little-endian hex; ::ffff:127.0.0.1 or ::1 in tcp6
    assert seen <= {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}, seen


@pytest.mark.parametrize("name", list(TWO))
def test_two_process_runs_agree_with_the_in_process_simulation(two, name):
    assert compare_with_simulation(TWO[name], two[name]) == []


def test_cp_only_passes_and_every_rank_made_its_own_call(two):
    r = two["cp_only"]
    assert r.outcome == "pass" and r.failing_ranks == [] and r.world == 2
    extend = r.trace[0]
    assert extend["took_cp_path"] and [c["rank"] for c in extend["cp_calls"]] == [0, 1]
    assert extend["cp_calls"][0]["cache_seqlens"] != extend["cp_calls"][1]["cache_seqlens"]
    # per-rank traces: each CP rank recorded its own call only
    assert [t["cp_call"]["rank"] for t in (r.ranks[0]["trace"][0], r.ranks[1]["trace"][0])] == [0, 1]
    # extend, decode, mixed, (idle: nothing), extend
    assert len(r.outputs) == 4 and r.outputs[0].shape == (42, 32, 128) and r.outputs[1].shape == (2, 32, 128)


def test_stale_cp_layout_fails_on_both_cp_ranks(two):
    r = two["cp_only_stale"]
    assert r.outcome == "violation"
    assert {f["invariant"] for f in r.findings} == {"CP_PATH_MATCHES_ACTIVITY", "CP_LAYOUT_MATCHES_BATCH"}
    assert r.failing_ranks == [0, 1]


def test_skewed_dp_batch_fails_on_the_dp_rank_holding_the_long_sequence(two):
    r = two["dp_only_skewed"]
    assert [(f["invariant"], f["dp_rank"]) for f in r.findings] == [("SPLIT_BOUND", 0)]
    assert r.failing_ranks == [0]
    assert r.ranks[0]["findings"] == ["SPLIT_BOUND"] and r.ranks[1]["findings"] == []
    assert [t["s_p"] for t in r.trace] == [109, 1]


def test_cuda_graph_batch_is_agreed_across_dp_ranks(two):
    r = two["dp_only_graph"]
    assert r.outcome == "pass"
    decode = [t for t in r.trace if t["mode"] == "decode"]
    # 5 rows round-robin: 3 and 2 -> both ranks replay the 4-row graph, padded rows have seq_len 1
    assert [t["seq_lens"] for t in decode[:2]] == [[40, 100, 60, 1], [7, 3, 1, 1]]


# ---------------------------------------------------------------------------------------------
# Four processes: CP 4 (the worked example) and DP x CP
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(FOUR))
def test_four_process_runs_agree_with_the_in_process_simulation(four, name):
    assert compare_with_simulation(FOUR[name], four[name], numerics=FOUR_NUMERICS[name]) == []


def test_worked_example_pre_fix_fails_on_every_cp_rank_and_fixed_passes(four):
    pre = four["worked_prefix"]
    assert pre.outcome == "violation" and pre.findings[0]["invariant"] == "SPLIT_BOUND"
    assert pre.findings[0]["detail"]["s_p"] == 109 and pre.findings[0]["detail"]["s_c"] == 29
    assert pre.failing_ranks == [0, 1, 2, 3]
    assert all(rank["findings"] == ["SPLIT_BOUND"] for rank in pre.ranks)
    fixed = four["worked_fixed"]
    assert fixed.outcome == "pass" and fixed.failing_ranks == []
    assert all(not t["precomputed"] for rank in fixed.ranks for t in rank["trace"])


def test_dp_x_cp_splits_batches_over_dp_and_cp(four):
    r = four["dp_x_cp"]
    assert r.outcome == "pass"
    first = [t for t in r.trace if t["step"] == 0]
    assert [(t["dp_rank"], t["took_cp_path"]) for t in first] == [(0, True), (1, True)]
    assert all([c["rank"] for c in t["cp_calls"]] == [0, 1] for t in first)
    last = [t for t in r.trace if t["step"] == 3]
    assert [t["dp_rank"] for t in last] == [0]  # DP rank 1 has nothing to extend: idle
    assert r.ranks[2]["trace"][3]["idle"] and r.ranks[3]["trace"][3]["idle"]


# ---------------------------------------------------------------------------------------------
# Failure handling
# ---------------------------------------------------------------------------------------------


def test_a_killed_rank_ends_the_run_with_a_verdict_naming_it():
    start = time.perf_counter()
    [r] = run_ranks(TWO["cp_only"], timeout_s=LAUNCH_TIMEOUT_S, inject_fault="1:exit:7")
    assert time.perf_counter() - start < LAUNCH_TIMEOUT_S
    assert r.outcome == "rank_error" and r.failed_rank == 1 and r.exit_code == 1
    assert "rank 1" in r.error and "exited with code 7" in r.error
    assert_all_gone(r.pids)


def test_a_raising_rank_is_reported_by_the_cli_with_its_error(tmp_path, capsys):
    path = tmp_path / "case.json"
    path.write_text(__import__("json").dumps(TWO["cp_only"]))
    code = cli_main(["run-ranks", str(path), "--inject-fault", "1:raise", "--timeout-s", str(LAUNCH_TIMEOUT_S),
                     "--out-dir", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 1
    assert "rank_error" in out and "rank 1: RuntimeError: injected fault on rank 1" in out
    assert (tmp_path / "out" / "error-rank-1.json").exists()


def test_a_hung_rank_is_killed_at_the_timeout():
    start = time.perf_counter()
    [r] = run_ranks(TWO["cp_only"], timeout_s=6, inject_fault="1:hang")
    assert time.perf_counter() - start < 6 + 60  # the deadline, then SIGTERM/SIGKILL and joins (slow under load)
    assert r.outcome == "timeout" and r.exit_code == 3
    assert_all_gone(r.pids)


def test_bitwise_equal_sees_nan_payloads_and_dtypes():
    a = torch.tensor([1.0, float("nan")], dtype=torch.bfloat16)
    assert bitwise_equal(a, a.clone())
    assert not bitwise_equal(a, a.float())
    assert not bitwise_equal(a, torch.tensor([1.0, 2.0], dtype=torch.bfloat16))


# ---------------------------------------------------------------------------------------------
# The regression corpus: one process per rank agrees with the in-process simulation on every case
# ---------------------------------------------------------------------------------------------

def test_every_corpus_case_agrees_with_the_in_process_simulation(corpus, two, four):
    """Worlds 2 and 4 were launched after TWO's and FOUR's cases (module fixtures); other worlds launch here."""
    assert sum(map(len, corpus.values())) >= 8
    disagreements = []
    for world, group in sorted(corpus.items()):
        if world in (2, 4):
            launched = two if world == 2 else four
            results = [launched[name] for name in group]
        else:
            results = run_ranks(list(group.values()), timeout_s=LAUNCH_TIMEOUT_S)
        for (name, case), result in zip(group.items(), results):
            diffs = compare_with_simulation(case, result)
            if diffs:
                disagreements.append(f"{name} (world {world}): {diffs}")
    assert not disagreements, "\n".join(disagreements)


class _Proc:
    def __init__(self, exitcode):
        self.exitcode = exitcode


class _Ctx:
    def __init__(self, *codes):
        self.processes = [_Proc(c) for c in codes]


def test_the_earliest_report_is_blamed_even_before_its_rank_has_exited(tmp_path):
    """Rank 1 raised and reported first; rank 0's broken collective made it exit first: rank 1 is the cause."""
    from fa3verify.multirank import describe_failure

    (tmp_path / "error-rank-1.json").write_text(json.dumps({"rank": 1, "error": "RuntimeError: cause", "time": 10.0}))
    (tmp_path / "error-rank-0.json").write_text(json.dumps({"rank": 0, "error": "DistBackendError: peer", "time": 11.0}))
    failure = describe_failure(_Ctx(1, None), tmp_path, first_seen=[0])
    assert failure["failed_rank"] == 1 and failure["error"] == "rank 1: RuntimeError: cause"
    # and with the order of reports reversed, the other rank is blamed (the choice follows the times)
    (tmp_path / "error-rank-1.json").write_text(json.dumps({"rank": 1, "error": "RuntimeError: cause", "time": 12.0}))
    assert describe_failure(_Ctx(1, None), tmp_path, first_seen=[0])["failed_rank"] == 0


def test_a_rank_reports_its_error_before_tearing_its_group_down(tmp_path, monkeypatch):
    """The report's time precedes the teardown that breaks the peers' collectives (else a peer's report of the
    broken collective could be earlier, and the peer be blamed)."""
    import torch.distributed as dist

    import gpu_impl.distributed as gd

    seen = {}

    def fail(*args, **kwargs):
        raise RuntimeError("cause")

    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: None)
    monkeypatch.setattr(dist, "destroy_process_group",
                        lambda *a, **k: seen.setdefault("report_at_teardown", (tmp_path / "error-rank-1.json").exists()))
    monkeypatch.setattr(gd, "_run_cases_in_group", fail)
    with pytest.raises(RuntimeError):
        gd.rank_main(1, {"world": 2, "cases": [], "out_dir": str(tmp_path), "backend": "gloo", "numerics": False,
                         "timeout_s": 5.0, "store_path": str(tmp_path / "store")})
    assert seen == {"report_at_teardown": True}
    report = json.loads((tmp_path / "error-rank-1.json").read_text())
    assert report["error"] == "RuntimeError: cause" and "Traceback" in report["traceback"]
