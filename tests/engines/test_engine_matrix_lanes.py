"""The engine matrix's lanes (fa3verify.matrix_lanes): releases gated side by side give the rows and fix releases of
a release-by-release run.

The scheduler is pinned with lanes played here (a row answered after a delay chosen per release, so a later release
can finish first): a release's replays wait for every earlier release's row, so they carry every earlier failing
row's case files; the negative control is a scheduler that hands the replays out at once, which loses them. A SIGINT
stops the run: no release is handed out after it and those not gated are inconclusive rows. Process lanes
(``--jobs N``) run on a real sglang release: the same row and fix releases as one lane in this process; a lane
that misses its deadline makes its release's row inconclusive, naming the deadline, and a new lane takes the next
release; --jobs outside its range is exit 2 naming it.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine_releases import need_sglang
from fa3verify import cli, matrix_lanes
from fa3verify.engine_matrix import INTERRUPTED, MatrixRow, ReleaseRun, RowOptions
from fa3verify.matrix_fixes import CaseReplays, FixLedger
from spec.process.worker_client import WorkerError

RELEASES = ["0.5.20", "0.5.21", "0.5.22", "0.5.23"]


class PlayedLane:
    """A lane whose row for a release comes after ``delays[release]`` seconds (from a thread, as a process lane's
    does); the releases in ``failing`` fail with one case file each (or, ``until_interrupted``, run until the lane
    is interrupted and answer an interrupted row); its replays are recorded per release."""

    def __init__(self, delays: dict, failing: set, replayed: dict, until_interrupted: bool = False):
        self.delays, self.failing, self.replayed = delays, failing, replayed
        self.until_interrupted = until_interrupted
        self.interrupted = threading.Event()

    def start_row(self, release, answers):
        def answer():
            if self.until_interrupted and release in self.failing:
                self.interrupted.wait(10)
                answers.put((self, "row", ReleaseRun(MatrixRow(release=release, verdict="inconclusive", exit_code=3,
                                                               engine="sglang"), interrupted=True)))
                return
            time.sleep(self.delays.get(release, 0.0))
            bad = release in self.failing
            row = MatrixRow(release=release, verdict="fail" if bad else "pass", exit_code=1 if bad else 0,
                            engine="sglang", case_files=[f"{release}.json"] if bad else [])
            cases = [CaseReplays(release, f"{release}.json", f"family of {release}", "eager", "SPLIT_BOUND")] \
                if bad else []
            answers.put((self, "row", ReleaseRun(row, cases=cases, open=True)))

        threading.Thread(target=answer, daemon=True).start()

    def start_replay(self, release, files, answers):
        self.replayed[release] = list(files)
        answers.put((self, "replay", ({f: "STILL FAILS" for f in files}, 0.0, False)))

    def interrupt(self):
        self.interrupted.set()

    def kill(self):
        pass

    def close(self):
        pass


def _schedule(lanes, releases=RELEASES):
    ledger = FixLedger()
    rows = matrix_lanes._schedule(releases, lanes, None, ledger, RowOptions(engine="sglang"), say=lambda line: None)
    return rows, ledger.entries(releases)


def _every_earlier_failure_replayed(replayed: dict, failing: set) -> bool:
    """Each release's replays carry the case file of every failing row up to it (its own included)."""
    return all(set(replayed.get(r, [])) >= {f"{f}.json" for f in failing if RELEASES.index(f) <= RELEASES.index(r)}
               for r in RELEASES)


def _two_lanes_where_a_later_release_finishes_first():
    # 0.5.20 fails and answers last; 0.5.21 (the other lane) answers at once and must wait for 0.5.20's row
    delays, failing, replayed = {"0.5.20": 0.4}, {"0.5.20", "0.5.22"}, {}
    lanes = [PlayedLane(delays, failing, replayed), PlayedLane(delays, failing, replayed)]
    return lanes, failing, replayed


def test_a_release_s_replays_wait_for_every_earlier_row_so_two_lanes_name_the_fixes_one_lane_names():
    lanes, failing, replayed = _two_lanes_where_a_later_release_finishes_first()
    rows, entries = _schedule(lanes)
    assert [rows[r].verdict for r in RELEASES] == ["fail", "pass", "fail", "pass"]
    assert _every_earlier_failure_replayed(replayed, failing), replayed
    one_replayed: dict = {}
    _, one_lane = _schedule([PlayedLane({}, failing, one_replayed)])
    assert entries == one_lane and one_replayed == replayed
    assert [e["found_on"] for e in entries] == ["0.5.20", "0.5.22"]  # release order, whichever lane answered first


def test_negative_control_replays_handed_out_at_once_miss_an_earlier_release_s_failure(monkeypatch):
    monkeypatch.setattr(matrix_lanes, "_earlier_rows_known", lambda release, releases, order, rows: True)
    lanes, failing, replayed = _two_lanes_where_a_later_release_finishes_first()
    _schedule(lanes)
    assert not _every_earlier_failure_replayed(replayed, failing), replayed
    assert "0.5.20.json" not in replayed["0.5.21"]


def test_a_sigint_stops_the_run_and_the_releases_not_gated_are_inconclusive_rows():
    # 0.5.20 passes; 0.5.21 runs until interrupted; nothing after it may be gated
    replayed: dict = {}
    lane = PlayedLane({}, {"0.5.21"}, replayed, until_interrupted=True)
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        rows, _ = _schedule([lane])
    finally:
        timer.cancel()
    assert rows["0.5.20"].verdict == "pass" and rows["0.5.21"].verdict == "inconclusive"
    for release in ("0.5.22", "0.5.23"):
        assert rows[release].verdict == "inconclusive" and rows[release].message == INTERRUPTED
        assert release not in replayed


def test_a_lane_that_does_not_end_on_the_sigint_is_killed_after_the_grace_and_its_row_says_so(monkeypatch):
    monkeypatch.setattr(matrix_lanes, "STOP_GRACE_S", 0.3)
    killed = threading.Event()

    class Deaf(PlayedLane):
        """Ignores the SIGINT; answers only when killed, as a killed process lane does."""

        def start_row(self, release, answers):
            self.release, self.answers = release, answers

        def interrupt(self):
            pass

        def kill(self):
            killed.set()
            self.answers.put((self, "row", WorkerError("engine matrix lane 1 (pid 1): exited (code -9) without an "
                                                       "answer")))

    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    try:
        rows, _ = _schedule([Deaf({}, set(), {})], releases=["0.5.22", "0.5.23"])
    finally:
        timer.cancel()
    assert killed.is_set() and time.monotonic() - start < 10
    assert rows["0.5.22"].verdict == "inconclusive" and "interrupted (SIGINT) while gated" in rows["0.5.22"].message
    assert rows["0.5.23"].message == INTERRUPTED


def test_jobs_outside_its_range_or_a_bad_lane_deadline_is_exit_2_naming_it(monkeypatch, capsys):
    for jobs in ("0", "33"):
        assert cli.main(["engine", "matrix", "--jobs", jobs, "--releases", "0.5.23", "--no-setup"]) == 2
        err = capsys.readouterr().err
        assert "--jobs: must be in 1..32" in err and f"got {jobs}" in err
    for bad in ("soon", "0", "90000"):
        monkeypatch.setenv(matrix_lanes.ENV_LANE_TIMEOUT, bad)
        assert cli.main(["engine", "matrix", "--jobs", "2", "--releases", "0.5.23", "--no-setup"]) == 2
        err = capsys.readouterr().err
        assert matrix_lanes.ENV_LANE_TIMEOUT in err and "lanes side by side" not in err, err


def test_a_lane_past_its_deadline_is_an_inconclusive_row_and_a_new_lane_takes_the_next_release(monkeypatch, tmp_path,
                                                                                               capsys):
    monkeypatch.setenv(matrix_lanes.ENV_LANE_TIMEOUT, "0.2")  # no lane starts Python and gates within 0.2 s
    out = tmp_path / "m.json"
    code = cli.main(["engine", "matrix", "--releases", "0.5.22..0.5.23", "--jobs", "2", "--cases", "5", "--no-setup",
                     "--no-probes", "--cases-dir", str(tmp_path / "cases"), "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert code == 3
    assert [r["verdict"] for r in rows] == ["inconclusive", "inconclusive"]
    pids = set()
    for r in rows:
        assert "no answer within 0.2 s; killed" in r["message"] and matrix_lanes.ENV_LANE_TIMEOUT in r["message"]
        pids.add(r["message"].split("(pid ")[1].split(")")[0])
    assert len(pids) == 2  # each release its own lane


def _row_facts(data: dict) -> list:
    keep = ("release", "verdict", "exit_code", "invariants", "families", "paths", "cases", "reach", "rejected")
    return [{k: r[k] for k in keep} | {"case_files": sorted(Path(f).name for f in r["case_files"])}
            for r in data["rows"]]


def _fix_facts(data: dict) -> list:
    return [{k: e[k] for k in ("found_on", "family", "replays", "first_pass")} for e in data["fixes"]]


def test_a_process_lane_gives_the_row_and_fix_releases_of_the_lane_in_this_process(monkeypatch, tmp_path):
    need_sglang("0.5.13")
    # the second run (the lane) reads the first's z3 rows
    monkeypatch.setenv("FA3VERIFY_Z3_CACHE", str(tmp_path / "z3"))
    runs = {}
    for jobs in ("1", "2"):
        out = tmp_path / f"m{jobs}.json"
        code = cli.main(["engine", "matrix", "--releases", "0.5.13", "--jobs", jobs, "--cases", "5", "--no-probes",
                         "--no-setup", "--cases-dir", str(tmp_path / f"cases{jobs}"), "--json", str(out)])
        assert code == 1, jobs
        runs[jobs] = json.loads(out.read_text())
    assert _row_facts(runs["2"]) == _row_facts(runs["1"])
    assert _fix_facts(runs["2"]) == _fix_facts(runs["1"]) and runs["2"]["fixes"]
    assert all(e["replays"]["0.5.13"] == "STILL FAILS" for e in runs["2"]["fixes"])


def test_a_sigint_reaches_the_process_lanes_and_the_matrix_ends_inconclusive_never_passing(tmp_path):
    need_sglang("0.5.23")
    out = tmp_path / "m.json"
    proc = subprocess.Popen([sys.executable, "-m", "fa3verify", "engine", "matrix", "--releases", "0.5.23",
                             "--jobs", "2",
                             "--budget-s", "120", "--no-probes", "--no-setup", "--cases-dir", str(tmp_path / "cases"),
                             "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    deadline = time.monotonic() + 120
    seen = []
    while time.monotonic() < deadline:
        try:
            seen.append(lines.get(timeout=1))
        except queue.Empty:
            continue
        if "gate (witness searches" in seen[-1]:
            break
    assert seen and "gate (witness searches" in seen[-1], seen
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=90)
    assert time.monotonic() - sent < 60
    assert proc.returncode == 3, (proc.returncode, stdout, seen)  # 0.5.23 passes its gate: only the SIGINT ends it
    (row,) = json.loads(out.read_text())["rows"]
    assert row["verdict"] == "inconclusive" and row["seconds"] < 60, row


def test_a_lane_whose_gate_raised_ends_the_run_as_an_internal_error_never_a_row():
    """A lane answering that its request raised (not a worker's failure) is a defect here: the run stops with it
    (the command's internal error, exit 3), it is never turned into a row."""
    crash = matrix_lanes._raised_or({matrix_lanes.RAISED: "TypeError: boom", "traceback": "Traceback ..."}, dict)
    assert isinstance(crash, matrix_lanes.LaneCrash) and "TypeError: boom" in str(crash)

    class Raising(PlayedLane):
        def start_row(self, release, answers):
            answers.put((self, "row", crash))

    with pytest.raises(matrix_lanes.LaneCrash, match="boom"):
        _schedule([Raising({}, set(), {})])
    with pytest.raises(WorkerError, match="not an object"):
        matrix_lanes._raised_or(["a list"], dict)
