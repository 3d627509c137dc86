"""The ``lifecycle`` object of a case file (schema fa3verify.case/1): the sequence a lifecycle finding was made on.

Invariant: a lifecycle case replays the sequence that failed: ``layers`` attention layers a step over one precompute
(the metadata's reuse across layers; an engine driver runs that many), and, where the case was found with one, the
seeded engine defect of the driven sequence (``engine_defect``: a name of
``gpu_impl.engines.lifecycle_judge.ENGINE_DEFECTS``; the engine's driver checks the name, as a replay checks
``defects``). Both optional; a case without the object runs one layer a step and no engine defect (every case file
written before the object existed). An engine option ``num_layers`` (``options.<key>.num_layers``), where also given, must agree with ``layers``.
``check_lifecycle`` raises ``CaseFormatError`` naming the field.
"""

from __future__ import annotations

from typing import Any, Optional

from spec.model.case_bounds import CaseFormatError

__all__ = ["LIFECYCLE_FIELDS", "MAX_LIFECYCLE_LAYERS", "check_lifecycle"]

LIFECYCLE_FIELDS = ("layers", "engine_defect")
MAX_LIFECYCLE_LAYERS = 64


def check_lifecycle(value: Any, options: Optional[dict] = None) -> Optional[dict]:
    """The validated ``lifecycle`` object (None when absent); CaseFormatError names the first bad field."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CaseFormatError("lifecycle", "a JSON object with fields " + ", ".join(LIFECYCLE_FIELDS), value)
    unknown = sorted(set(value) - set(LIFECYCLE_FIELDS))
    if unknown:
        raise CaseFormatError(f"lifecycle.{unknown[0]}", "one of the fields " + ", ".join(LIFECYCLE_FIELDS),
                              unknown[0])
    out = {"layers": value.get("layers", 1), "engine_defect": value.get("engine_defect")}
    layers = out["layers"]
    if not isinstance(layers, int) or isinstance(layers, bool) or not 1 <= layers <= MAX_LIFECYCLE_LAYERS:
        raise CaseFormatError("lifecycle.layers", f"an integer in [1, {MAX_LIFECYCLE_LAYERS}]", layers)
    defect = out["engine_defect"]
    if defect is not None and (not isinstance(defect, str) or not defect):
        raise CaseFormatError("lifecycle.engine_defect", "null or the name of a seeded engine defect "
                                                         "(gpu_impl.engines.lifecycle_judge.ENGINE_DEFECTS)", defect)
    for key, engine_options in (options or {}).items():  # the case's engine-owned options (``Case.options``)
        given = engine_options.get("num_layers") if isinstance(engine_options, dict) else None
        if given is not None and given != layers:
            raise CaseFormatError("lifecycle.layers", f"the case's {key}.num_layers ({given}) where both are given",
                                  layers)
    return out
