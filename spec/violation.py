"""The name the checks use for the project's one finding type (:class:`spec.finding.Finding`).

``Violation`` *is* ``Finding``: spec's invariants and domain assumptions (``spec.model.config``: the ``ASSUMPTION_*``
name, ``detail`` {"field": ...}), the kernel model's plan checks (``gpu_impl.kernels``) and a scenario run's
findings (``Violation.at_step``, ``gpu_impl.scenario``) make one, and the same object reaches every report.
``spec.invariants`` re-exports it.
"""

from __future__ import annotations

from .finding import Finding

__all__ = ["Violation"]

#: The one finding type, under the name the checks use (``spec.finding``).
Violation = Finding
