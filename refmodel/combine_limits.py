"""How many splits FA3's combine kernel reads: kMax of ``run_mha_fwd_combine_`` (flash_fwd_combine_launch_template.h).

Plain ints, no torch: the scheduler, the invariants and the combine model read it from here (refmodel.fa3_scheduler
re-exports it).
"""

from __future__ import annotations

__all__ = ["combine_capacity"]


def combine_capacity(num_splits_call: int, headdim_v: int) -> int:
    """Most splits FA3's combine reads, kMax (flash_fwd_combine_launch_template.h `run_mha_fwd_combine_`).

    The combine is launched with kBlockK 64 when dv <= 64, else 128; only kBlockK 64 has a 16-split instance.
    S_c is the call's split count (the buffers' split dim); splits at index >= kMax are never read.
    """
    if num_splits_call < 0 or headdim_v < 0:
        raise ValueError(f"num_splits_call/headdim_v: must be >= 0, got {num_splits_call}, {headdim_v}")
    if headdim_v <= 64 and num_splits_call <= 16:
        return 16
    for cap in (32, 64, 128):
        if num_splits_call <= cap:
            return cap
    return 256
