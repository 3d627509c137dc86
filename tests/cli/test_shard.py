"""Scale out the way CI does: `--shard K/N` on fuzz, conform and the engine matrix is a partition of the
campaign (fa3verify/sharding.py, fa3verify/campaign.py), and `report merge` joins the shard reports into the
unsplit run's verdict (fa3verify/report_merge.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from fa3verify import cli
from fa3verify.campaign import Budget, Observation, run_campaign
from fa3verify.sharding import Shard, parse_shard

from fake_engines import ProfileSUT, install

FUZZ = ["fuzz", "--guard", "pre-fix", "--cases", "60", "--seed", "0"]


class Recorder:
    """A target that records every case it is given and passes it."""

    def __init__(self):
        self.seen = []

    def observe(self, case):
        self.seen.append(case)
        return Observation("pass")


def strategy(rng: random.Random):
    value = rng.getrandbits(64)
    return None if value % 7 == 0 else value  # some draws give no case, as a family may


def cases_of(seed: int, cases: int, shard=None) -> list:
    target = Recorder()
    run_campaign(target, strategy, budget=Budget(cases=cases), seed=seed, shard=shard)
    return target.seen


def covers_exactly(whole: list, parts: list) -> bool:
    """The parts are disjoint and together are the whole campaign's cases."""
    joined = [c for part in parts for c in part]
    return sorted(joined) == sorted(whole) and len(set(joined)) == len(joined)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_n_shards_run_exactly_the_unsplit_campaigns_cases(n):
    whole = cases_of(3, 200)
    parts = [cases_of(3, 200, Shard(k, n)) for k in range(1, n + 1)]
    assert covers_exactly(whole, parts)
    assert all(parts) or n > len(whole)


def test_negative_control_a_shard_of_another_seed_is_caught():
    whole = cases_of(3, 200)
    parts = [cases_of(3, 200, Shard(1, 2)), cases_of(4, 200, Shard(2, 2))]  # the defect: shard 2 reseeded
    assert not covers_exactly(whole, parts)
    overlapping = [cases_of(3, 200, Shard(1, 2)), cases_of(3, 200)]  # the defect: a shard that owns everything
    assert not covers_exactly(whole, overlapping)


@pytest.mark.parametrize("text", ["0/3", "4/3", "x", "1/0", "-1/2", "1/2/3", "", "2/99999"])
def test_bad_shards_are_exit_2_naming_the_option_and_its_range(text, capsys):
    for argv in (["fuzz", "--cases", "5"], ["conform", "--engine", "sglang==0.5.23", "--cases", "5"],
                 ["engine", "matrix", "--releases", "0.5.23", "--cases", "5"]):
        assert cli.main([*argv, f"--shard={text}"]) == 2
        err = capsys.readouterr().err
        assert "--shard:" in err and "1 <= K <= N" in err, err


def test_a_shard_that_owns_nothing_is_exit_2(capsys):
    assert cli.main(["fuzz", "--cases", "2", "--shard", "3/3"]) == 2
    assert "--shard: shard 3/3 owns no draw of --cases 2" in capsys.readouterr().err
    assert cli.main(["engine", "matrix", "--releases", "0.5.22..0.5.23", "--cases", "2", "--shard", "3/3"]) == 2
    assert "owns none of the 2 releases" in capsys.readouterr().err


def test_parse_shard():
    assert parse_shard("2/4") == Shard(2, 4) and parse_shard(None) is None
    assert Shard(2, 3).pick(list("abcdefg")) == ["b", "e"]


# -- fuzz shards and report merge --------------------------------------------------------------------------------

def _fuzz_shards(tmp_path, n: int, argv=FUZZ) -> list:
    paths = []
    for k in range(1, n + 1):
        path = tmp_path / f"shard-{k}.json"
        code = cli.main([*argv, "--shard", f"{k}/{n}", "--cases-dir", str(tmp_path / f"cases-{k}"),
                         "--json", str(path)])
        assert code in (0, 1)
        paths.append(str(path))
    return paths


def _signatures(report: dict) -> set:
    msg = report["checks"][0]["message"]
    return set(msg.split("distinct signatures: ")[1].split(", ")) if "distinct signatures: " in msg else set()


def test_merged_fuzz_shards_give_the_unsplit_verdict(tmp_path, capsys):
    whole = tmp_path / "whole.json"
    assert cli.main([*FUZZ, "--cases-dir", str(tmp_path / "whole"), "--json", str(whole)]) == 1
    paths = _fuzz_shards(tmp_path, 3)
    merged = tmp_path / "merged.json"
    assert cli.main(["report", "merge", *paths, "--json", str(merged), "--junit", str(tmp_path / "m.xml")]) == 1
    w, m = json.loads(whole.read_text()), json.loads(merged.read_text())
    assert (m["cases"], m["failures"], m["exit_code"], m["verdict"]) == (w["cases"], w["failures"], 1, "fail")
    shards = [json.loads(Path(p).read_text()) for p in paths]
    assert set().union(*map(_signatures, shards)) == _signatures(w)
    assert m["shards"] == 3 and [s["k"] for s in m["merged_from"]] == [1, 2, 3]
    assert "<testsuite" in (tmp_path / "m.xml").read_text()


def test_merged_passing_shards_pass(tmp_path):
    paths = _fuzz_shards(tmp_path, 2, ["fuzz", "--cases", "20", "--seed", "1"])
    assert cli.main(["report", "merge", *paths, "--json", "-"]) == 0


@pytest.mark.parametrize("defect,message", [
    ("another seed", "another campaign"), ("another N", "not the same split"), ("twice", "both shard 1/2"),
    ("missing", "missing"), ("unsharded", "not a shard report"), ("another cases", "another campaign"),
])
def test_mismatched_shard_reports_are_exit_2(tmp_path, capsys, defect, message):
    base = ["fuzz", "--cases", "10", "--seed", "1"]
    one, two = _fuzz_shards(tmp_path, 2, base)
    other = tmp_path / "other.json"
    extra = {"another seed": ["fuzz", "--cases", "10", "--seed", "2", "--shard", "2/2"],
             "another N": [*base, "--shard", "2/3"], "unsharded": base,
             "another cases": ["fuzz", "--cases", "12", "--seed", "1", "--shard", "2/2"]}.get(defect)
    if extra:
        assert cli.main([*extra, "--cases-dir", str(tmp_path / "o"), "--json", str(other)]) in (0, 1)
    inputs = {"twice": [one, one], "missing": [one]}.get(defect, [one, str(other)])
    capsys.readouterr()
    assert cli.main(["report", "merge", *inputs]) == 2
    assert message in capsys.readouterr().err


def test_a_shard_that_could_not_decide_keeps_the_merge_inconclusive(tmp_path):
    one, two = _fuzz_shards(tmp_path, 2, ["fuzz", "--cases", "20", "--seed", "1"])
    data = json.loads(Path(two).read_text())
    data["checks"][0].update(verdict="inconclusive", inconclusive=True)
    data.update(exit_code=3, verdict="inconclusive")
    Path(two).write_text(json.dumps(data))
    assert cli.main(["report", "merge", one, two, "--json", str(tmp_path / "m.json")]) == 3
    assert json.loads((tmp_path / "m.json").read_text())["verdict"] == "inconclusive"


def test_report_merge_refuses_html_and_render_refuses_two_files(tmp_path, capsys):
    one, two = _fuzz_shards(tmp_path, 2, ["fuzz", "--cases", "10", "--seed", "1"])
    assert cli.main(["report", "merge", one, two, "--html", str(tmp_path / "x.html")]) == 2
    assert cli.main(["report", one, two, "--html", str(tmp_path / "x.html")]) == 2
    assert "report merge" in capsys.readouterr().err
    assert cli.main(["report", one]) == 2


# -- conform and the engine matrix -------------------------------------------------------------------------------

def test_conform_shards_compare_the_unsplit_configurations(monkeypatch, tmp_path):
    install(monkeypatch, lambda spec: ProfileSUT(spec.release, heads="attn_tp"))  # differs: findings to compare
    base = ["conform", "--engine", "sglang==0.5.14", "--cases", "40", "--seed", "2", "--no-assumption-probes"]
    assert cli.main([*base, "--cases-dir", str(tmp_path / "w"), "--json", str(tmp_path / "w.json")]) == 1
    paths = []
    for k in (1, 2, 3):
        paths.append(str(tmp_path / f"c{k}.json"))
        assert cli.main([*base, "--shard", f"{k}/3", "--cases-dir", str(tmp_path / f"c{k}"),
                         "--json", paths[-1]]) in (0, 1)
    whole = json.loads((tmp_path / "w.json").read_text())
    parts = [json.loads(Path(p).read_text()) for p in paths]
    assert sum(p["conform"]["cases"] for p in parts) == whole["conform"]["cases"]
    assert sum(p["conform"]["compared"] for p in parts) == whole["conform"]["compared"]
    indices = sorted(d[0] for p in parts for d in p["conform"]["differences"])
    assert indices == sorted(d[0] for d in whole["conform"]["differences"])  # named by their campaign index
    assert cli.main(["report", "merge", *paths, "--json", str(tmp_path / "m.json")]) == 1
    assert json.loads((tmp_path / "m.json").read_text())["failures"] == whole["failures"]


def test_engine_matrix_shards_split_the_releases_and_merge(monkeypatch, tmp_path, capsys):
    """The shards write into the unsplit run's --cases-dir (one folder per release, case files named by their
    content), so the suite's theorem memo (tests/conftest.py) answers their z3 searches from the unsplit run's."""
    install(monkeypatch, lambda spec: ProfileSUT(spec.release))
    base = ["engine", "matrix", "--releases", "0.5.13..0.5.15", "--cases", "10", "--no-probes",
            "--cases-dir", str(tmp_path / "out")]
    assert cli.main([*base, "--json", str(tmp_path / "w.json")]) == 1
    paths = []
    for k in (1, 2):
        paths.append(str(tmp_path / f"m{k}.json"))
        assert cli.main([*base, "--shard", f"{k}/2", "--json", paths[-1]]) in (0, 1, 3)
    parts = [json.loads(Path(p).read_text()) for p in paths]
    assert [r["release"] for r in parts[0]["rows"]] == ["0.5.13", "0.5.15"]
    assert [r["release"] for r in parts[1]["rows"]] == ["0.5.14"]
    whole = json.loads((tmp_path / "w.json").read_text())
    code = cli.main(["report", "merge", *paths, "--json", str(tmp_path / "merged.json"),
                     "--junit", str(tmp_path / "merged.xml")])
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert code == whole["exit_code"] == merged["exit_code"]
    assert [(r["release"], r["verdict"]) for r in merged["rows"]] == [(r["release"], r["verdict"])
                                                                       for r in whole["rows"]]
    assert merged["rows"][0]["release"] == "0.5.13" and "sglang 0.5.14" in (tmp_path / "merged.xml").read_text()
    assert cli.main(["report", "merge", paths[0]]) == 2  # the 0.5.14 shard is missing


def test_report_merge_never_overwrites_a_shard_report_nor_writes_into_a_folder(tmp_path, capsys):
    one, two = _fuzz_shards(tmp_path, 2, ["fuzz", "--cases", "10", "--seed", "1"])
    before = Path(one).read_text()
    assert cli.main(["report", "merge", one, two, "--json", one]) == 2
    assert "--json:" in capsys.readouterr().err and Path(one).read_text() == before
    (tmp_path / "adir").mkdir()
    assert cli.main(["report", "merge", one, two, "--junit", str(tmp_path / "adir")]) == 2
    assert "--junit:" in capsys.readouterr().err


class _AdaptingDomain:
    """A domain whose draws depend on what earlier cases reached, as an sglang release's does."""

    adapts = True
    name = "sglang==0.5.23"


def test_a_domain_that_adapts_to_earlier_cases_is_never_sharded():
    """Its shards would not together run the unsplit campaign's cases: refused, naming --shard."""
    from fa3verify.errors import UsageError
    from fa3verify.commands.fuzz import run_campaign as fuzz_campaign
    from fa3verify.policy import load_policy

    with pytest.raises(UsageError, match="--shard: sglang==0.5.23's domain weights each draw"):
        fuzz_campaign(load_policy("fixed"), kernel=None, max_cases=4, shard=Shard(1, 2), domain=_AdaptingDomain())


def test_the_release_domain_adapts_and_the_model_and_vllm_domains_do_not():
    from gpu_impl.domain import ConfigDomain
    from gpu_impl.engines.sglang.domain import ReleaseDomain

    assert ReleaseDomain.adapts and not ConfigDomain.adapts
    assert not ConfigDomain("model", family="scenario").adapts


def _matrix_shard(tmp_path, k: int, rows: list, fixes=None) -> str:
    """An engine-matrix shard report (``engine matrix --shard K/2 --json``) over three releases."""
    campaign = {"command": "engine matrix", "engine": "sglang", "releases": ["0.5.13", "0.5.14", "0.5.15"],
                "seed": 0, "cases": 10, "budget_s": None, "timeout_s": 10.0, "probes": False}
    data = {"schema": "fa3verify.engine-matrix/1", "exit_code": 1 if any(r["verdict"] == "fail" for r in rows) else 0,
            "rows": rows, "shard": {"k": k, "n": 2, "campaign": campaign}}
    if fixes is not None:
        data["fixes"] = fixes
    path = tmp_path / f"m{k}.json"
    path.write_text(json.dumps(data))
    return str(path)


def _row(release: str, verdict: str) -> dict:
    return {"release": release, "verdict": verdict, "exit_code": 1 if verdict == "fail" else 0, "engine": "vllm"}


def test_report_merge_keeps_the_engine_matrixs_fix_releases(tmp_path, capsys):
    """Each shard's fix releases (every failing row's case files replayed on the shard's later releases) survive
    the merge, in release order, and each entry names the later releases another shard gated (never replayed)."""
    fix = {"found_on": "0.5.13", "family": "tp", "paths": ["eager"], "invariants": ["SPLIT_BOUND"],
           "case_files": ["c.json"], "still_fails_on_own_release": True,
           "replays": {"0.5.13": "STILL FAILS", "0.5.15": "PASSES NOW"}, "first_pass": "0.5.15",
           "still_failing_later": []}
    one = _matrix_shard(tmp_path, 1, [_row("0.5.13", "fail"), _row("0.5.15", "pass")], fixes=[fix])
    two = _matrix_shard(tmp_path, 2, [_row("0.5.14", "pass")], fixes=[])
    assert cli.main(["report", "merge", one, two, "--json", str(tmp_path / "merged.json"),
                     "--junit", str(tmp_path / "merged.xml")]) == 1
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert 'name="vllm 0.5.14"' in (tmp_path / "merged.xml").read_text()  # each row named by its own engine
    assert [e["found_on"] for e in merged["fixes"]] == ["0.5.13"]
    entry = merged["fixes"][0]
    assert entry["first_pass"] == "0.5.15" and entry["not_replayed"] == ["0.5.14"]
    assert entry["unreplayed_before_first_pass"] == ["0.5.14"]
    out = capsys.readouterr().out
    assert "first passes on 0.5.15" in out and "not replayed on 0.5.14" in out


def test_report_merge_refuses_shards_that_differ_in_computing_fix_releases(tmp_path, capsys):
    one = _matrix_shard(tmp_path, 1, [_row("0.5.13", "pass"), _row("0.5.15", "pass")], fixes=[])
    two = _matrix_shard(tmp_path, 2, [_row("0.5.14", "pass")])  # run with --no-fixes
    assert cli.main(["report", "merge", one, two]) == 2
    assert "--no-fixes" in capsys.readouterr().err
    plain = [_matrix_shard(tmp_path, 1, [_row("0.5.13", "pass"), _row("0.5.15", "pass")]), two]
    assert cli.main(["report", "merge", *plain, "--json", str(tmp_path / "m.json")]) == 0
    assert "fixes" not in json.loads((tmp_path / "m.json").read_text())
