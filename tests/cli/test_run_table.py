"""The verdict table fits where it is printed (fa3verify/run_table.py): on a terminal of 80, 100 or 200 columns no
line is wider than the terminal, no column collapses, and every check name and case file is whole; on a log (not a
terminal) the plain form has every name and every note whole, nothing cut; every form shows a campaign's reach per
metadata path."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from fa3verify.summary import Check, RunSummary, print_table, write_reports

#: the width from which the table form is used (fa3verify.run_table.TABLE_MIN_WIDTH)
TABLE_MIN_WIDTH = 120

#: two names sharing their first 44 characters (the old table cut both to the same 43 characters and an ellipsis)
NAME_A = "fuzz on sglang-src=/work/checkouts/sglang/python: no OOB, matches FA3's rules"
NAME_B = "fuzz on sglang-src=/work/checkouts/sglang/python: witness replay of guard-soundness"
CASE = "fa3verify-out/cases/fuzz-combine-capacity-15d9e33a43c46b68.json"
CASE_LONG = "fa3verify-out/engine-matrix/sglang-0.5.23/cases/prove-split-bound-f44120159389662a.json"
MESSAGE = ("guard soundness: no witness over 6192 configurations (1392 precompute, 4800 call), every model, SM count "
           "and split policy; the guard disables the precompute whenever prefill CP or DP attention is on")
DOMAIN = {"name": "sglang==0.5.23", "family": None, "drawn": 310, "accepted": 250,
          "rejected": {"tp_size must divide the head count": 40, "cp needs tp": 20}, "cases": 250,
          "reach": {"eager": 180, "capture": 41, "replay": 37, "dp-idle": 0, "layer:full-attention": 250,
                    "layer:sliding-window": 0},
          "not_covered": {"dp-idle": "reached by no case of this run",
                          "layer:sliding-window": "no drawn model has sliding-window layers"},
          "not_drawn": {}}


def _summary() -> RunSummary:
    return RunSummary(command="gate", cases=250, failures=3, elapsed_s=12.5, domain=DOMAIN, checks=[
        Check("guard-soundness", "theorem", "proved", 2.77, message=MESSAGE + "\nsecond line of the message"),
        Check("drift-breaks-h_k", "theorem", "refuted", 1.56, case_file=CASE_LONG, message="changing only h_k",
              expected="the hazard class"),
        Check(NAME_B, "replay", "pass", 3.1, message="the witness passes on the release"),
        Check(NAME_A, "property", "fail", 19.6, failed=True, case_file=CASE, message="250 cases, 3 failing"),
        Check("int32-split-heuristic", "theorem", "expected-refutation", 0.2, inconclusive=False,
              message="FA3's int L2 split branch gives -40 splits"),
    ])


def _render(width=None, terminal=True) -> list:
    buf = io.StringIO()
    console = (Console(file=buf, width=width, force_terminal=True, color_system=None) if terminal
               else Console(file=buf, force_terminal=False, color_system=None))
    print_table(_summary(), console)
    return buf.getvalue().splitlines()


def _column_text(lines, column: int) -> str:
    """The text of one table column read down the rows (a wrapped cell joined up), spaces removed; for the list
    form (no columns), the whole text so read."""
    cells = [line.split("│")[column] if line.count("│") >= 6 else line for line in lines]
    return "".join(cell.strip() for cell in cells).replace(" ", "")


@pytest.mark.parametrize("width", [80, 100, 200])
def test_a_terminal_table_fits_its_width_and_keeps_names_and_case_files_whole(width):
    lines = _render(width)
    assert lines and max(len(line) for line in lines) <= width
    text = "\n".join(lines)
    for whole in ("guard-soundness", "drift-breaks-h_k", "int32-split-heuristic"):
        assert whole in text  # short names on one line
    for whole in (NAME_A, NAME_B, CASE, CASE_LONG):  # long ones whole, wrapped over lines when they must be
        assert whole.replace(" ", "") in _column_text(lines, 1 if whole in (NAME_A, NAME_B) else 5), (width, whole)
    assert "refuted (expected)" in text and "expected-refutation" in text and "fail" in text
    assert "eager 180, capture 41, replay 37, dp-idle 0" in text  # reach per path on the command line
    assert "verdict: FAIL" in lines[-1]


@pytest.mark.parametrize("width", [80, 100])
def test_below_the_table_width_the_rows_become_a_list_with_no_collapsed_column(width):
    lines = _render(width)
    assert width < TABLE_MIN_WIDTH and not any("│" in line for line in lines)
    assert any(line.startswith("fail 19.60s property: ") for line in lines)
    assert any(line.strip() == CASE for line in lines)  # a case path that fits is on a line of its own, whole


def test_a_200_column_terminal_gets_the_table_with_every_name_on_one_line():
    lines = _render(200)
    assert any("┃ check" in line for line in lines)
    for name in (NAME_A, NAME_B, CASE):  # CASE_LONG (87 characters) folds in its column, whole (test above)
        assert any(name in line for line in lines), name


def test_a_log_gets_the_plain_complete_form():
    lines = _render(terminal=False)
    text = "\n".join(lines)
    assert not re.search("[│┃┏━…]", text)
    assert f"  fail 19.60s property: {NAME_A}" in lines and f"  pass 3.10s replay: {NAME_B}" in lines
    assert f"      {MESSAGE}" in lines and "      second line of the message" in lines  # every note line whole
    assert f"      case file: {CASE_LONG}" in lines
    assert "  not covered: layer:sliding-window: no drawn model has sliding-window layers" in lines
    assert any(line.startswith("domain sglang==0.5.23: 310 configurations drawn, 250 accepted, 60 rejected")
               for line in lines)


def test_negative_control_the_old_fixed_width_table_cut_names_and_notes():
    """The defect the forms replaced: a table of fixed column widths at 160 columns (the old log form) cuts the
    note and makes the two fuzz names read the same; the same predicates catch it."""
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=160, force_terminal=False, color_system=None)
    table = Table(title="fa3verify gate")
    table.add_column("check", no_wrap=True, overflow="ellipsis", max_width=44)
    table.add_column("case file / note", no_wrap=True, overflow="ellipsis", max_width=80)
    for c in _summary().checks:
        table.add_row(c.name, c.case_file or c.message.splitlines()[0])
    console.print(table)
    lines = buf.getvalue().splitlines()
    assert not any(NAME_A in line for line in lines) and f"      {MESSAGE}" not in lines
    cut = [line.split("│")[1].strip() for line in lines if "fuzz on sglang-src" in line]
    assert len(cut) == 2 and cut[0] == cut[1]


def test_the_form_follows_the_console():
    from fa3verify.run_table import TABLE_MIN_WIDTH as table_min_width, form_for

    assert table_min_width == TABLE_MIN_WIDTH
    assert form_for(Console(file=io.StringIO(), force_terminal=False)) == "plain"
    assert form_for(Console(file=io.StringIO(), force_terminal=True, width=80)) == "list"
    assert form_for(Console(file=io.StringIO(), force_terminal=True, width=TABLE_MIN_WIDTH)) == "table"


def test_a_run_commands_log_output_carries_the_reach(capsys):
    """Through write_reports, as gate and fuzz print (stdout captured: not a terminal)."""
    write_reports(_summary(), object())
    out = capsys.readouterr().out
    assert "reach (cases per metadata path): eager 180, capture 41, replay 37, dp-idle 0" in out
    assert "reach (cases per layer type): full-attention 250, sliding-window 0" in out
    assert NAME_A in out and MESSAGE in out
