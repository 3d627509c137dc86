"""Example guard with the fixed semantics of sglang PR #30439.

Prefill context parallel or DP attention disables the FA3 scheduler-metadata precompute.
Flags are read with ``getattr(..., False)`` so ServerArgs of older sglang versions, which lack
``enable_prefill_cp``, do not make the guard raise.
Use it with ``--guard examples/guards/fixed_guard.py:should_disable``.
"""


def should_disable(server_args):
    """Return True when the backend must not precompute FA3 scheduler metadata."""
    return bool(
        getattr(server_args, "enable_prefill_cp", False)
        or getattr(server_args, "enable_dp_attention", False)
    )
