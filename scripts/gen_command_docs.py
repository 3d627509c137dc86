"""Regenerate docs/commands.md: every subcommand's --help and real output captured from a run.

Usage: .venv/bin/python scripts/gen_command_docs.py   (about three minutes on 2 cores; writes fa3verify-out/)
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = "fa3verify-out/docs-run"
EXE = [sys.executable, "-m", "fa3verify"]

RUNS = [
    ("prove", "Proofs under the project's fixed guard: every theorem has its expected verdict.",
     ["prove", "--cases-dir", f"{OUT}/cases"]),
    ("prove", "The guard before sglang PR #30439: the hazard is found and guard soundness is refuted (exit 1).",
     ["prove", "--guard", "pre-fix", "--cases-dir", f"{OUT}/cases"]),
    ("fuzz", "A seeded fuzz campaign against the pre-fix guard; each distinct violation is shrunk and saved.",
     ["fuzz", "--guard", "pre-fix", "--cases", "400", "--seed", "0", "--cases-dir", f"{OUT}/cases",
      "--json", f"{OUT}/fuzz.json"]),
    ("replay", "Replaying the first case the fuzz campaign saved, then the same case under the fixed guard.",
     ["replay", "@FIRST_FUZZ_CASE"]),
    ("replay", "", ["replay", "@FIRST_FUZZ_CASE", "--guard", "fixed"]),
    ("prove", "The model playing sglang 0.5.14 (its profile: pre-fix guard, tp heads): the hazard is found (exit 1).",
     ["prove", "--engine-profile", "sglang==0.5.14", "--only", "prefill-cp-hazard", "--only", "guard-soundness",
      "--cases-dir", f"{OUT}/cases"]),
    ("gate", "The CI gate on a guard file holding the pre-fix guard (exit 1, JUnit and JSON written).",
     ["gate", "--guard", "examples/guards/prefix_guard.py:should_disable", "--budget-s", "5",
      "--cases-dir", f"{OUT}/cases", "--junit", f"{OUT}/gate.xml", "--json", f"{OUT}/gate.json"]),
    ("check", "What `make check` runs: the gate on the fixed guard with a short budget.",
     ["check", "--budget-s", "5"]),
    ("report", "A one-page HTML report from the gate's JSON.",
     ["report", f"{OUT}/gate.json", "--html", f"{OUT}/gate.html"]),
    ("hazard-map", "Where reusing precomputed metadata overflows for Qwen3-30B-A3B on an H200.",
     ["hazard-map", "--model", "qwen3-30b-a3b", "--sm", "132", "--out", f"{OUT}/hazard.png"]),
    ("run-ranks", "docs/facts-fa3.md's worked example, one process per attention rank over gloo.",
     ["run-ranks", "@CORPUS_WORKED"]),
    ("catalogue", "The bug catalogue in fast mode.", ["catalogue"]),
    ("sanitize", "The start hook goes only into a virtual environment; a folder that is none is a usage error (exit 2).",
     ["sanitize", "install-hook", "--venv", f"{OUT}/no-venv"]),
    ("conform", "conform compares the model with a real engine; naming the model is a usage error (exit 2).",
     ["conform", "--engine", "model"]),
    ("engine", "The engine matrix's options (running it needs the engine environments, docs/engines.md).",
     ["engine", "matrix", "--help"]),
    ("engine", "The fix releases of a sharded matrix: each shard replays a failing family's case files only on its "
               "own later\nreleases, so after `fa3verify report merge` the fix release a shard names can be later "
               "than the unsplit run's.\n`engine fixes` replays each family's case files on the releases other "
               "shards gated, after its last failure and up\nto its first pass (each release opened once), and names "
               "the first release where every one PASSES\nNOW; releases before a family's last failure stay listed "
               "as `not_replayed`. The matrix's verdict and exit code stand.\n`engine matrix --jobs N` needs none of "
               "this: its lanes share one ledger, so its fix releases are the unsplit run's.",
     ["engine", "fixes", "--help"]),
    ("gpu-check", "The prepared GPU script's plumbing on CPU (`--dry-run`).",
     ["gpu-check", "--dry-run", "--out", f"{OUT}/gpu-check"]),
    ("invariants", "The invariant and theorem catalogue (first lines).", ["invariants"]),
]


def run(args: list[str]) -> tuple[int, str, float]:
    env = dict(os.environ, COLUMNS="110", PYTHONUNBUFFERED="1", TERM="dumb")
    # as in an activated environment (the docs show `$ fa3verify ...`): the replay lines printed read `fa3verify`
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    start = time.perf_counter()
    proc = subprocess.run(EXE + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return proc.returncode, (proc.stdout + proc.stderr).rstrip(), time.perf_counter() - start


def resolve(args: list[str]) -> list[str]:
    out = []
    for a in args:
        if a == "@FIRST_FUZZ_CASE":
            a = sorted(glob.glob(str(ROOT / OUT / "cases" / "fuzz-split-bound-*.json")))[0]
            a = os.path.relpath(a, ROOT)
        elif a == "@CORPUS_WORKED":
            found = sorted(glob.glob(str(ROOT / "tests" / "corpus" / "*worked*pre*fix*.json")))
            a = os.path.relpath(found[0], ROOT) if found else "tests/corpus/worked_example_prefix_guard.json"
        out.append(a)
    return out


def trim(text: str, limit: int = 60) -> str:
    lines = text.splitlines()
    if len(lines) <= limit:
        return text
    return "\n".join(lines[:limit] + [f"... ({len(lines) - limit} more lines)"])


def main() -> int:
    parts = ["# Command reference", "",
             "Generated by `scripts/gen_command_docs.py` from real runs on a 2-core CPU machine; timings vary.",
             "Exit codes of every subcommand: 0 pass, 1 violation found, 2 bad input or usage, 3 inconclusive.",
             "A mistyped option prints the usage of the command it was given to (`fa3verify gate --guardd x`: gate's",
             "usage), exit 2. Every output path is tried writable before any work (docs/reports.md, Output files).",
             "On a log (stdout not a terminal) each stage prints a start line and an end line on stderr: `done`, or",
             "`interrupted` after a Ctrl-C (a fuzz stage stopped by one still reports the cases it ran), or `stopped`.",
             ""]
    _, text, _ = run(["--help"])
    parts += ["## fa3verify", "", "```text", text, "```", ""]
    documented = set()
    for name, blurb, args in RUNS:
        if name not in documented:
            documented.add(name)
            _, help_text, _ = run([name, "--help"])
            parts += [f"## fa3verify {name}", "", "```text", help_text, "```", ""]
        args = resolve(args)
        code, text, seconds = run(args)
        if blurb:
            parts += [blurb, ""]
        parts += [f"```text\n$ fa3verify {' '.join(args)}", trim(text), f"# exit code {code}, {seconds:.1f} s", "```", ""]
    (ROOT / "docs" / "commands.md").write_text("\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
