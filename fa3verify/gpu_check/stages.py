"""The stages of one gpu-check run, in the order they run (``environment`` is probed by the runner first).

Invariant: :data:`STAGES` is the one list of stages; ``--skip`` choices, the summary's stage names and the run
order all come from it.
"""

from __future__ import annotations

from . import crash_isolation, fa3_sanitize, fidelity_stage, fuzz_stage, gpu_tests, memcheck, worked_example

STAGES = (
    ("crash_isolation", crash_isolation.run),
    ("worked_example", worked_example.run),
    ("fidelity", fidelity_stage.run),
    ("fuzz", fuzz_stage.run),
    ("gpu_tests", gpu_tests.run),
    ("sanitizer", memcheck.run),
    ("fa3_sanitize", fa3_sanitize.run),
)
STAGE_NAMES = tuple(name for name, _ in STAGES)
