"""Errors of the real-engine runtime: each names what is wrong and what is allowed (the CLI exits 2 on them)."""

from __future__ import annotations

from spec.process.worker_client import WorkerError

from ..sut import EngineSpecError
from ..sut import ScenarioUnsupported as _Unsupported


class EngineUnavailable(EngineSpecError):
    """An engine spec names something this suite cannot drive: an unknown release, a release without the FA3
    metadata precompute, a checkout that does not import, or an environment that could not be built."""


class UnknownRelease(EngineUnavailable):
    """The release is not on the registry (``gpu_impl.engines.sglang.recipes.RELEASES``)."""


class NoPrecompute(EngineUnavailable):
    """The release predates the FA3 metadata precompute (first in 0.5.11): there is nothing to gate."""


class EnvSetupError(EngineUnavailable):
    """Building a release's engine environment failed (the message names the step and pip's last lines)."""


class CheckoutImportError(EngineUnavailable):
    """An sglang checkout or wheel does not import in its environment (the message names the failing import)."""


class ScenarioUnsupported(EngineUnavailable, _Unsupported):
    """The scenario uses a feature the engine driver does not run (MLA, fp8 KV cache, a release without the kit)."""


class DriverError(WorkerError):
    """The engine worker missed its deadline (``timed_out``; it was killed), died, or answered something that is not
    a response, or the engine's code crashed: inconclusive, never a pass or a violation (``spec.process.worker_client``)."""


class ReleaseUnavailable(DriverError):
    """A release on the vLLM release survey (``gpu_impl/engines/vllm/survey.json``) that this suite cannot run:
    the message names the exact reason (the import error, the missing symbol). Inconclusive (exit 3), never a pass, a
    violation or a usage error: the release is real and known, it just cannot be judged here."""
