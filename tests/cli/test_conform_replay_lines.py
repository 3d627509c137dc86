"""Every printed replay line runs as typed: each replay command `conform` prints (the model's side and
the engine's side of a conformance difference, ``fa3verify.commands.conform.conform_replay_line``) runs without a usage
error, also for a case found on a checkout, where the engine's side names it (``--engine sglang-src=PATH``), as the
gate's lines do (``fa3verify.finding_terms.replay_line``). The engine is a stand-in (tests/fake_engines.py): the
model under 0.5.14's profile, with attn_tp heads, presented as a checkout."""

from __future__ import annotations

import json
import shlex

from fa3verify import cli

from fake_engines import ProfileSUT, install


def _printed_replays(out: str) -> list:
    """Every replay command of every `replay:` line (a conformance difference prints two, joined by '; ')."""
    found = set()
    for line in out.splitlines():
        if line.strip().startswith("replay: "):
            found.update(part.strip() for part in line.strip()[len("replay: "):].split("; "))
    return sorted(found)


def _conform_on_a_checkout(monkeypatch, tmp_path, capsys):
    checkout = tmp_path / "sglang" / "python"
    checkout.mkdir(parents=True)
    install(monkeypatch, lambda spec: ProfileSUT("0.5.14", heads="attn_tp", kind=spec.kind, path=spec.path))
    code = cli.main(["conform", "--engine", f"sglang-src={checkout}", "--engine-profile", "sglang==0.5.14",
                     "--cases", "60", "--no-assumption-probes", "--cases-dir", str(tmp_path / "cases"),
                     "--json", str(tmp_path / "c.json")])
    return code, capsys.readouterr().out, checkout


def test_every_replay_line_conform_prints_runs_as_typed(monkeypatch, tmp_path, capsys):
    code, out, checkout = _conform_on_a_checkout(monkeypatch, tmp_path, capsys)
    assert code == 1, out
    lines = _printed_replays(out)
    assert lines, out
    engine_side = [line for line in lines if "--engine model" not in line]
    assert engine_side and all(f"--engine sglang-src={checkout}" in line for line in engine_side), lines
    for line in lines:
        argv = shlex.split(line)
        assert argv[:2] == ["fa3verify", "replay"], line
        assert cli.main(argv[1:]) in (0, 1), line  # runs: the side reproduces (1) or passes (0), never exit 2
    capsys.readouterr()
    saved = json.loads((tmp_path / "c.json").read_text())["findings"]
    assert saved and all(f"--engine sglang-src={checkout}" in f["replay"] for f in saved)
    # negative control: the engine's line as conform wrote it before (no --engine) is refused, exit 2
    bare = shlex.split(engine_side[0])
    i = bare.index("--engine")
    assert cli.main(bare[1:i] + bare[i + 2:]) == 2


def test_a_release_case_line_needs_no_engine_option(monkeypatch, tmp_path, capsys):
    install(monkeypatch, lambda spec: ProfileSUT(spec.release, heads="attn_tp"))
    assert cli.main(["conform", "--engine", "sglang==0.5.14", "--cases", "60", "--no-assumption-probes",
                     "--cases-dir", str(tmp_path)]) == 1
    lines = _printed_replays(capsys.readouterr().out)
    assert lines and not [line for line in lines if "--engine sglang" in line]
    for line in lines:
        assert cli.main(shlex.split(line)[1:]) in (0, 1), line
