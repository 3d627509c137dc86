"""The vLLM release survey (gpu_impl/engines/vllm/survey.json, scripts/vllm_survey.py) and the rows: every release
with FA3 ahead-of-time scheduling from 0.8.5 through 0.32.x is a row of vllm_recipes.RECIPES, shares a row (its
driven files byte-identical), or is unavailable with its reason; an unavailable release is inconclusive (exit 3)
with that reason, never a traceback. Data only: no engine environment is needed."""

import copy
import json

import pytest

from gpu_impl.engines import envs
from gpu_impl.engines.vllm import recipes as vllm_recipes
from gpu_impl.engines.errors import ReleaseUnavailable

SURVEY = json.loads(vllm_recipes.SURVEY_FILE.read_text())
STATUS = json.loads(vllm_recipes.RELEASES_FILE.read_text())


def _in_range(first, last):
    return [r for r in STATUS["registry_releases"] if vllm_recipes.version_key(first) <= vllm_recipes.version_key(r) <= vllm_recipes.version_key(last)]


def test_every_release_from_0_8_5_to_0_32_is_surveyed():
    expected = _in_range("0.8.5", "0.32.99")
    assert len(expected) == 44 and expected[0] == "0.8.5" and expected[-1] == "0.32.0"
    assert [e["release"] for e in SURVEY["releases"]] == expected
    for e in SURVEY["releases"]:
        assert "precompute" in e["features"], e["release"]  # every surveyed release precomputes FA3 metadata


def test_every_surveyed_release_is_a_row_shares_one_or_is_unavailable_with_a_reason():
    assert vllm_recipes.survey_gaps(SURVEY) == []
    for release in (e["release"] for e in SURVEY["releases"]):
        kinds = [release in vllm_recipes.RECIPES, release in vllm_recipes.SHARES_ROW,
                 release in vllm_recipes.UNAVAILABLE]
        assert kinds.count(True) == 1, release
    assert set(vllm_recipes.DRIVER_GENERATIONS) == set(vllm_recipes.RELEASES)


def test_the_coverage_check_catches_a_dropped_release_and_a_shared_row_that_differs():
    """Negative control: a release left out of every list, and a patch release whose driven files differ from the
    row it claims to share, are both reported."""
    dropped = next(iter(vllm_recipes.UNAVAILABLE or vllm_recipes.SHARES_ROW))
    unavailable = {k: v for k, v in vllm_recipes.UNAVAILABLE.items() if k != dropped}
    shares = {k: v for k, v in vllm_recipes.SHARES_ROW.items() if k != dropped}
    gaps = vllm_recipes.survey_gaps(SURVEY, shares=shares, unavailable=unavailable)
    assert gaps == [f"{dropped}: surveyed, but neither a row, nor sharing one, nor unavailable with a reason"]
    survey = copy.deepcopy(SURVEY)
    shared, row = next(iter(vllm_recipes.SHARES_ROW.items()))
    entry = next(e for e in survey["releases"] if e["release"] == shared)
    entry["driven"] = {**entry["driven"], "vllm/v1/attention/backends/flash_attn.py": "0" * 16}
    assert vllm_recipes.survey_gaps(survey) == [f"{shared}: shares row {row}, but its driven files differ from that "
                                                f"release's (or the survey lacks it)"]
    assert vllm_recipes.survey_gaps(SURVEY, unavailable={**vllm_recipes.UNAVAILABLE, dropped: " "},
                                    shares=shares) == gaps


def test_a_shared_release_runs_as_its_row():
    for release, row in vllm_recipes.SHARES_ROW.items():
        assert envs.check_release(release, engine="vllm") == row
        mine = next(e for e in SURVEY["releases"] if e["release"] == release)
        theirs = next(e for e in SURVEY["releases"] if e["release"] == row)
        assert mine["driven"] == theirs["driven"] and mine["row"] == theirs["row"]  # one group of the survey


@pytest.fixture
def unavailable(monkeypatch):
    """The survey's unavailable releases; since every surveyed release runs (0.8.5 .. 0.10.0 under generation v0),
    a synthetic one with its reason, so that the unavailable path stays exercised."""
    if not vllm_recipes.UNAVAILABLE:
        monkeypatch.setattr(vllm_recipes, "UNAVAILABLE",
                            {"0.35.0": "not driven: a synthetic entry standing for a release no generation drives"})
    return vllm_recipes.UNAVAILABLE


def test_an_unavailable_release_is_inconclusive_with_its_reason(unavailable):
    from gpu_impl.engines.errors import NoPrecompute

    release, reason = next(iter(unavailable.items()))
    with pytest.raises(ReleaseUnavailable) as err:
        envs.check_release(release, engine="vllm")
    assert reason in str(err.value) and f"vllm=={release}: unavailable" in str(err.value)
    with pytest.raises(NoPrecompute):
        envs.check_release("0.8.0", engine="vllm")  # no precompute: not on the survey, nothing to gate (exit 2)


@pytest.mark.parametrize("command", [["engine", "setup"], ["gate", "--engine"]])
def test_setup_and_gate_of_an_unavailable_release_exit_3_naming_the_reason(command, capsys, tmp_path, unavailable):
    from fa3verify.cli import main

    release, reason = next(iter(unavailable.items()))
    extra = ["--json", str(tmp_path / "g.json")] if command[0] == "gate" else []
    assert main(command + [f"vllm=={release}"] + extra) == 3
    err = capsys.readouterr().err
    assert reason in err and "Traceback" not in err
    assert main(command + ["vllm==0.8.4"] + extra) == 2  # before the first precompute: bad input, named


def test_the_docs_table_of_the_survey_is_the_data():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "engines-vllm.md").read_text()
    start = text.index("<!-- vllm-survey-table:")
    block = text[text.index("\n", start) + 1:text.index("<!-- end vllm-survey-table -->")].strip()
    assert block == vllm_recipes.survey_markdown(SURVEY)
