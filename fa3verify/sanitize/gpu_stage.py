"""The worked example under the runtime sanitizer over a real FA3 module (gpu-check stage ``fa3_sanitize``).

Invariant checked: with the sanitizer installed (mode raise), FA3 metadata precomputed with the pre-fix head
counts (H//tp, max(1, Hk//tp)) = (8, 1) is refused before the kernel launches (MetadataMismatch naming
SPLIT_BOUND), and the fresh precompute (32, 4) runs; the sanitizer's time per call is measured against the
real kernel's. docs/facts-fa3.md section 1 shapes (H=32, Hk=4, d=128, bf16; one long and seven 100-token sequences),
with a contiguous KV cache (the fa3-fwd wheel has no paged KV). Dry run: the emulator behind a stand-in
module, a 16-SM device and a 4096-token sequence.
"""

from __future__ import annotations

import statistics
import time
import types
from typing import Optional

import torch

__all__ = ["sanitize_worked_example_task"]


def _module(adapter: dict, num_sm: Optional[int]):
    if adapter.get("name") == "emulated":
        from gpu_impl.kernels.emulated import EmulatedKernel

        kernel = EmulatedKernel(mode="strict", num_sm=num_sm or 132)
        mod = types.ModuleType("fa3verify_dry_run_fa3")
        mod.get_scheduler_metadata = kernel.get_scheduler_metadata
        mod.flash_attn_with_kvcache = kernel.flash_attn_with_kvcache
        return "fa3verify_dry_run_fa3", mod
    from gpu_impl.kernels.fa3 import find_fa3_module

    return find_fa3_module()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def sanitize_worked_example_task(adapter: dict, long_len: int, num_sm: Optional[int], out_dir: str,
                                 timing_calls: int = 20, seed: int = 0) -> dict:
    import sys

    from gpu_impl.fa3_calls import MetadataMismatch
    from gpu_impl.oracle_check import all_finite

    from .core import Sanitizer

    device = adapter.get("device") or "cpu"
    name, module = _module(adapter, num_sm)
    sys.modules.setdefault(name, module)
    entry = {name: {"get_scheduler_metadata": "precompute", "flash_attn_with_kvcache": "call"}}
    san = Sanitizer(mode="raise", out_dir=out_dir, num_sm=num_sm, entry_points=entry, import_hook=False,
                    follow_copies=False).install()
    gen = torch.Generator().manual_seed(seed)
    lens = [long_len] + [100] * 7
    b, H, Hk, d = len(lens), 32, 4, 128
    cs = torch.tensor(lens, dtype=torch.int32, device=device)
    cu = torch.arange(b + 1, dtype=torch.int32, device=device)
    q = torch.randn(b, H, d, generator=gen).to(torch.bfloat16).to(device)
    k = (torch.randn(b, long_len, Hk, d, generator=gen) * 0.5).to(torch.bfloat16).to(device)
    v = torch.randn(b, long_len, Hk, d, generator=gen).to(torch.bfloat16).to(device)
    out = {"module": name, "device": device, "lens": lens}

    def precompute(heads):
        return module.get_scheduler_metadata(b, 1, long_len, heads[0], heads[1], d, cs, torch.bfloat16,
                                             cu_seqlens_q=cu, causal=True)

    def call(md, fn=None):
        return (fn or module.flash_attn_with_kvcache)(q, k, v, cache_seqlens=cs, cu_seqlens_q=cu, max_seqlen_q=1,
                                                      causal=True, scheduler_metadata=md)

    try:
        stale = precompute((8, 1))
        try:
            call(stale)
            out["stale"] = {"caught": False}
        except MetadataMismatch as exc:
            out["stale"] = {"caught": True, "invariant": exc.violations[0].invariant, "message": str(exc)[:2000],
                            "case_file": exc.case_path}
        fresh = precompute((H, Hk))
        o = call(fresh)
        _sync(device)
        # read from the device of the first call's tensors unless given (CheckingFA3._settle_device)
        out["num_sm"], out["num_sm_source"] = san.checker.num_sm, san.checker.num_sm_source
        out["fresh"] = {"ran": True, "finite": all_finite(o),
                        "violations": len(san.checker.violations()) - int(out["stale"]["caught"])}
        original = module.flash_attn_with_kvcache.__fa3verify_original__

        warm = 3 if device.startswith("cuda") else 0

        def timed(fn):
            samples = []
            for i in range(timing_calls + warm):
                _sync(device)
                t0 = time.perf_counter()
                call(fresh, fn)
                _sync(device)
                if i >= warm:
                    samples.append((time.perf_counter() - t0) * 1e6)
            return statistics.median(samples)

        out["kernel_call_us"] = timed(original)
        out["sanitized_call_us"] = timed(None)
        out["overhead_us"] = out["sanitized_call_us"] - out["kernel_call_us"]
        out["summary"] = {k: v for k, v in san.status().items() if k in ("checked_calls", "violation_events", "files")}
    finally:
        san.uninstall()
    out["restored"] = getattr(module.flash_attn_with_kvcache, "__fa3verify_original__", None) is None
    return out
