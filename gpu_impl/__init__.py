"""gpu_impl: the systems under test, behind one interface (`sut.SystemUnderTest`).

It holds every system the harness checks: the model (an sglang-like FA3 attention backend with the
scheduler-metadata precompute guard, `backend` and `guards`, the CP/DP rank layout, `config`, `zigzag` and
`runner`, and its entry point `scenario.run_scenario`), the real engines (released sglang and vLLM code run in
cached environments, `engines`), and the kernel adapters (`kernels`: a CPU emulation that behaves like FA3 on stale
metadata, and real FA3 on a GPU). Built on refmodel and spec; imports nothing from fa3verify.
"""

from .errors import KernelUnavailable, MetadataShapeError, OutOfBoundsAccess

__all__ = ["KernelUnavailable", "MetadataShapeError", "OutOfBoundsAccess"]
