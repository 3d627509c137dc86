"""The harness names no engine: what fa3verify says or does about an engine (its examples, help words, profiles,
theorem, sanitizer entry points and worker driver) comes from the engine's folder, through its plugin. A file of
fa3verify that names an engine is found (a seeded copy naming one is the negative control)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from gpu_impl.sut import parse_engine
from gpu_impl.plugin import (engine_examples, engine_phrase, load_plugin, release_forms, release_spec,
                             sanitizer_targets)

ROOT = Path(__file__).resolve().parents[2]

#: Files allowed to name an engine: none (an engine's words live in its folder under gpu_impl/engines/).
PENDING: set = set()


def engine_names() -> list:
    """Every registered engine that has releases, by its kind (``sglang``, ``vllm``, ...)."""
    return [row["kind"] for row in release_forms()]


def files_naming_an_engine(root: Path) -> set:
    """The Python files under ``root/fa3verify`` whose text names a registered engine (any case)."""
    pattern = re.compile("|".join(re.escape(name) for name in engine_names()), re.IGNORECASE)
    return {str(p.relative_to(root)) for p in sorted((root / "fa3verify").rglob("*.py"))
            if pattern.search(p.read_text())}


def test_no_fa3verify_file_names_an_engine():
    assert files_naming_an_engine(ROOT) - PENDING == set()


def test_every_pending_file_still_names_an_engine():
    """A file that no longer names one leaves the list (so the list cannot hide a new one)."""
    assert PENDING <= files_naming_an_engine(ROOT)


def test_negative_control_a_file_naming_an_engine_is_found(tmp_path):
    shutil.copytree(ROOT / "fa3verify" / "commands", tmp_path / "fa3verify" / "commands")
    assert files_naming_an_engine(tmp_path) - PENDING == set()
    seeded = tmp_path / "fa3verify" / "commands" / "gate.py"
    seeded.write_text(seeded.read_text() + f"\n# runs on {engine_names()[0].upper()} releases\n")
    assert files_naming_an_engine(tmp_path) - PENDING == {"fa3verify/commands/gate.py"}


def test_the_help_examples_and_words_are_the_engines():
    """The examples of a command's help and its phrases come from the engines' words.json, in registry order."""
    lines = engine_examples("gate").splitlines()
    assert lines and all(line.startswith("  fa3verify gate --engine ") for line in lines)
    forms = [row["example"].split("==")[0] for row in release_forms()]
    firsts = [next(i for i, line in enumerate(lines) if f"--engine {form}" in line) for form in forms]
    assert firsts == sorted(firsts)  # registry order
    assert engine_phrase("modelled") == "sglang"
    assert engine_examples("no such place") == ""


def test_the_flow_theorem_and_profiles_are_plugin_members():
    from gpu_impl.engines.vllm.theorems import THEOREM

    vllm, sglang = release_spec("vllm==0.33.0"), release_spec("sglang==0.5.23")
    assert vllm.plugin.flow_theorem == THEOREM and sglang.plugin.flow_theorem is None
    assert (sglang.plugin.profile_proof(), vllm.plugin.profile_proof()) == ("model-policy", "flow-theorem")
    assert parse_engine("model").plugin.profile_proof() is None
    assert sglang.plugin.release_profile("0.5.23").release == "0.5.23"
    assert vllm.plugin.release_profile("0.33.0").release == "0.33.0"
    assert release_spec("model") is None and release_spec("vllm-src=/x") is None


def test_the_sanitizer_wraps_what_the_plugins_list():
    from fa3verify.sanitize.targets import ENTRY_POINTS, FA3_ENTRY_POINTS, KNOWN_REBINDERS

    points, rebinders = sanitizer_targets()
    assert ENTRY_POINTS == {**FA3_ENTRY_POINTS, **points} and KNOWN_REBINDERS == rebinders
    for row in release_forms():  # every engine with releases lists its own fronts and re-binders
        plugin = load_plugin(row["plugin"])
        assert plugin.sanitizer_entry_points() and plugin.sanitizer_rebinders(), row["kind"]
        assert all(m.split(".")[0] == row["kind"] for m in plugin.sanitizer_entry_points()), row["kind"]


def test_an_engine_without_a_worker_driver_cannot_run_under_the_sanitizer():
    import pytest

    from fa3verify.sanitize.engine import open_sanitized

    with pytest.raises(ValueError, match="no worker driver"):
        open_sanitized("vllm==0.33.0")
