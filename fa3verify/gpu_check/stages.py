"""The stages of one gpu-check run, in the order they run (``environment`` is probed by the runner first).

Invariant: :data:`STAGES` is the one list of stages; ``--skip`` choices, the summary's stage names and the run
order all come from it. The order puts the checks of the model first (fidelity per build, the emulator against the
kernel, the metadata's life across launches) and compute-sanitizer, the slowest, last.
"""

from __future__ import annotations

from . import (crash_isolation, emulator_stage, fa3_sanitize, fidelity_stage, fuzz_stage, gpu_tests, lifecycle_stage,
               memcheck, worked_example)

STAGES = (
    ("crash_isolation", crash_isolation.run),
    ("worked_example", worked_example.run),
    ("fidelity", fidelity_stage.run),
    ("emulator_agreement", emulator_stage.run),
    ("metadata_lifecycle", lifecycle_stage.run),
    ("fa3_sanitize", fa3_sanitize.run),
    ("fuzz", fuzz_stage.run),
    ("gpu_tests", gpu_tests.run),
    ("sanitizer", memcheck.run),
)
STAGE_NAMES = tuple(name for name, _ in STAGES)
