"""gpu_impl: the system under test.

An sglang-like FA3 attention backend with the scheduler-metadata precompute guard (`backend`, `guards`),
the CP/DP rank layout (`config`, `zigzag`, `runner`), kernel adapters (`kernels`: a CPU emulation that
behaves like FA3 on stale metadata, and real FA3 on a GPU) and one entry point that runs a scenario
(`scenario.run_scenario`). Built on refmodel and spec; imports nothing from fa3verify.
"""

from .errors import KernelUnavailable, MetadataShapeError, OutOfBoundsAccess

__all__ = ["KernelUnavailable", "MetadataShapeError", "OutOfBoundsAccess"]
