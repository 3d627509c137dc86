"""Precompute guards and their loading, re-exported from spec.model.guards (the theorems evaluate the same guards).
"""

from spec.model.guards import (  # noqa: F401
    GuardSpecError,
    GuardRaised,
    should_disable_scheduler_metadata_precompute,
    prefix_guard_dp_only,
    no_guard,
    load_guard,
    evaluate_guard,
    server_args_namespace,
    LegacyServerArgs,
    legacy_server_args_variants,
    guard_disables_precompute,
    GUARD_FLAGS,
    BUILTIN_GUARDS,
)

__all__ = [
    "GuardSpecError",
    "GuardRaised",
    "should_disable_scheduler_metadata_precompute",
    "prefix_guard_dp_only",
    "no_guard",
    "load_guard",
    "evaluate_guard",
    "server_args_namespace",
    "LegacyServerArgs",
    "legacy_server_args_variants",
    "guard_disables_precompute",
    "GUARD_FLAGS",
    "BUILTIN_GUARDS",
]
