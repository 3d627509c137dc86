"""gpu_impl: the systems under test, behind one interface (`sut.SystemUnderTest`).

It holds every system the harness checks: the model (an sglang-like FA3 attention backend with the
scheduler-metadata precompute guard, `backend` and `guards`, the CP/DP rank layout, `config`, `zigzag` and
`runner`, and its entry point `scenario.run_scenario`), the real engines (released sglang and vLLM code run in
cached environments, `engines`), and the kernel adapters (`kernels`: a CPU emulation that behaves like FA3 on stale
metadata, and real FA3 on a GPU). Built on refmodel and spec; imports nothing from fa3verify.
"""

from spec.model.cases import set_case_options

from .errors import KernelUnavailable, MetadataShapeError, OutOfBoundsAccess


def _case_options_schemas() -> dict:
    from .plugin import case_options_schemas

    return case_options_schemas()


# a case's engine-owned options are validated by the schema of the engine whose plugin files them (spec names none)
set_case_options(_case_options_schemas)

__all__ = ["KernelUnavailable", "MetadataShapeError", "OutOfBoundsAccess"]
