"""Steps the vLLM campaign tests share (tests/engines/test_campaign_vllm.py, tests/engines/test_fuzz_vllm_decode_tile.py): a seeded
defect found by the campaign on vLLM's own code and saved as a case file, and that case file replayed through the
CLI as still failing with the defect and passing without it."""

from __future__ import annotations

from fa3verify.cli import main


def find_seeded_split(sut, out_dir, defect: str, strategy: str, max_cases: int, release: str):
    """Fuzz ``strategy`` on ``sut`` with ``defect`` seeded: the campaign fails with SPLIT_BOUND and saves a case
    naming ``vllm==release`` and the defect; returns (the case file, the loaded case)."""
    from fa3verify.commands.fuzz import fuzz
    from spec.model.cases import Case

    summary = fuzz(sut=sut, max_cases=max_cases, budget_s=None, out_dir=str(out_dir),
                   defects={defect}, strategy=strategy, show_progress=False)
    assert summary.exit_code == 1
    split = [f for f in summary.findings if f.invariant == "SPLIT_BOUND"]
    assert split, [f.invariant for f in summary.findings]
    case = Case.load(split[0].case_file)
    assert case.engine == {"name": "vllm", "release": release} and case.defects == [defect]
    return split[0].case_file, case


def assert_cli_replays_as_seeded(case_file: str, capsys) -> None:
    """``fa3verify replay CASE`` still fails (exit 1, STILL FAILS); with ``--without-defects`` it passes (exit 0,
    PASSES NOW)."""
    capsys.readouterr()
    assert main(["replay", case_file]) == 1
    assert "STILL FAILS" in capsys.readouterr().out
    assert main(["replay", case_file, "--without-defects"]) == 0
    assert "PASSES NOW" in capsys.readouterr().out
