"""fa3verify gpu-check: one prepared run of the real-FA3 checks on a GPU machine (or all of its plumbing on CPU).

Stages, in the order they run (each with a time budget inside one overall deadline, so the run ends within
``--total-budget-s``, default 420 s; the summary is rewritten after every stage, so a killed run keeps what
it did). One module each:

``environment``     (:mod:`.environment`) GPU, torch and CUDA versions, the FA3 module found and its file,
                    compute-sanitizer.
``crash_isolation`` (:mod:`.crash_isolation`) a worker that exits on purpose is recorded and replaced.
``worked_example``  (:mod:`.worked_example`) docs/facts-fa3.md's worked example (Qwen3-30B-A3B, H=32, Hk=4, d=128, bf16,
                    tp=4, attn_cp=4; one 32768-token and seven 100-token sequences; num_splits=0) through the
                    backend, in a worker: with the pre-fix guard the precompute uses h_k=1 and the call overflows
                    its split buffers: expected NaN or an illegal memory access (a recorded crash), or a wrong
                    result; with the fixed guard expected to agree with the float64 oracle under FA3's tolerance.
``fidelity``        (:mod:`.fidelity_stage`) refmodel vs the adapter's ``get_scheduler_metadata`` on written slots
                    (ties as multisets) and the call's split count, over ``--fidelity-configs`` random
                    configurations, in workers.
``fuzz``            (:mod:`.fuzz_stage`, cases from :mod:`.fuzz_cases`) differential fuzz: random backend
                    configurations and skewed decode batches through the backend with the fixed guard, the kernel
                    launched for real (gpu-like mode), every output against the oracle; one case per worker task,
                    so a crash costs one case; ``--fuzz-budget-s`` seconds.
``gpu_tests``       (:mod:`.gpu_tests`) ``pytest -m gpu tests/gpu`` in a subprocess; counts from its JUnit XML.
``sanitizer``       (:mod:`.memcheck`) the pre-fix worked example under ``compute-sanitizer --tool memcheck``
                    (only when it is on PATH), expecting memcheck errors.
``fa3_sanitize``    (:mod:`.fa3_sanitize`) the worked example with ``fa3verify.sanitize`` over the FA3 module: the
                    pre-fix metadata is refused before launch (SPLIT_BOUND), the fresh one runs; sanitizer time
                    per call against the kernel's (``fa3verify.sanitize.gpu_stage``).

The stage runner (:mod:`.runner`: deadline, crash isolation, summary rewriting, case files, JUnit and memcheck
parsing) runs :data:`.stages.STAGES` under the :class:`.plan.Plan`; the command line is
:mod:`fa3verify.commands.gpu_check`.

Every crash, failing fuzz case and mismatch is written as a JSON file under ``OUT/cases`` (with the error text):
a failing fuzz case as a replayable ``fa3verify.case/1`` scenario case (``fa3verify replay`` reads it; the seeded
defects of a negative-control run in its ``defects``), the other stages' evidence as ``fa3verify.gpu_check_case/1``. ``--dry-run`` runs the same stages on CPU with the emulated kernel: fewer configurations, a short fuzz,
the emulator's gpu-like mode for the pre-fix case so the NaN appears, and the worked example scaled to fit a
CPU (a 16-SM GPU and a 4096-token long sequence: S_p = 14, S_c = 4, metadata split count 11 > 4).

Exit codes: 0 every stage met its expectation, 1 one did not, 3 a stage could not run (no GPU or no FA3
module without --dry-run, a timeout), 2 bad arguments.
"""

from .plan import Plan, make_plan
from .runner import SCHEMA, STATUS_CODE, SUMMARY_NAME, GpuCheck, Stage, junit_counts, junit_failures, parse_memcheck
from .stages import STAGE_NAMES, STAGES

__all__ = ["Plan", "make_plan", "SCHEMA", "STATUS_CODE", "SUMMARY_NAME", "GpuCheck", "Stage", "junit_counts",
           "junit_failures", "parse_memcheck", "STAGE_NAMES", "STAGES"]
