"""Helpers every gpu-check worker task shares (module level: tasks are pickled into spawned worker processes).

Invariant: a task loads its kernel adapter inside the worker (never in the parent, which must stay CUDA-free for
the spawn context) and synchronises a CUDA device before it reads results, so an illegal memory access surfaces
inside the task that caused it.
"""

from __future__ import annotations


def worker_init(threads: int) -> None:
    """Each worker: torch with ``threads`` CPU threads (the oracle runs on CPU)."""
    import torch

    torch.set_num_threads(max(1, int(threads)))


def task_kernel(adapter: dict, mode: str, **options):
    from ..fidelity import load_adapter

    return load_adapter(adapter["name"], mode, adapter.get("device"), **{**adapter.get("options", {}), **options})


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()

