"""Example guard with the pre-fix semantics (before sglang PR #30439).

Only DP attention disables the FA3 scheduler-metadata precompute; prefill CP does not.
Use it with ``--guard examples/guards/prefix_guard.py:should_disable``.
"""


def should_disable(server_args):
    """Return True when the backend must not precompute FA3 scheduler metadata (DP attention only)."""
    return bool(getattr(server_args, "enable_dp_attention", False))
