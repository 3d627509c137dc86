"""FA3 for an engine run under the runtime sanitizer: plain emulator-backed entry points, no checking shim.

Invariant: what ``sgl_kernel.flash_attn`` (fake) routes to in the driver's ``fa3="emulator"`` mode behaves as
real FA3 does on its side of the metadata hand-off -- ``get_scheduler_metadata`` returns refmodel's metadata
(``refmodel.metadata``, FA3's ``mha_fwd_get_scheduler_metadata``) and ``flash_attn_with_kvcache`` takes the
steps of ``mha_fwd`` (``hopper/flash_api.cpp``) through ``gpu_impl.kernels.emulated``: its own schedule, the
shape check of a given metadata tensor (a loud ``MetadataShapeError``), then the metadata is *trusted* -- it
checks nothing else and reports nothing, exactly like the real kernel. Whatever checking happens is the
sanitizer's (``fa3verify.sanitize`` wraps these functions as it wraps real FA3).

``numerics=False`` (the default in the engine driver) stops after FA3's host steps and the tile plan: the
output is zeros of the right shape (no attention is computed; the driver's record-mode KV pool aliases a few
pages, so numerics would mean nothing); ``numerics=True`` runs the emulator's numerics in ``gpu-like`` mode (a
faulty hand-off gives NaN, as on a GPU). What the emulator's plan would have made of each call (its
``check_plan`` verdicts, seen by no one in a real run) is kept in :attr:`EmulatorFA3.plans` for the driver's
trace, so a test can tell the sanitizer's verdict from the kernel's own damage.
"""

from __future__ import annotations

__all__ = ["EmulatorFA3"]


class EmulatorFA3:
    """The three FA3 entry points over ``gpu_impl.kernels.emulated.EmulatedKernel`` (gpu-like), sgl_kernel naming."""

    def __init__(self, num_sm: int, arch: int = 90, numerics: bool = False):
        self.num_sm, self.arch, self.numerics = int(num_sm), int(arch), bool(numerics)
        kernel_class = _emulated_class() if numerics else _plan_only_class()
        self.kernel = kernel_class(mode="gpu-like", num_sm=self.num_sm, arch=self.arch)
        #: per call: {"metadata_passed", "plan_violations": [invariant, ...]} (what the kernel would have done)
        self.plans: list = []

    def get_scheduler_metadata(self, *args, **kwargs):
        """sgl_kernel's ``get_scheduler_metadata`` (either naming), answered by refmodel through the emulator."""
        from ..fa3_records import bind_precompute, translate_precompute

        sig, bound = bind_precompute(*args, **kwargs)
        return self.kernel.get_scheduler_metadata(**translate_precompute(bound, sig, "fa3"))

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, **named):
        """``mha_fwd`` through the emulator (its shape check raises; the rest of the metadata is trusted); the
        arguments come as the fake ``sgl_kernel.flash_attn`` front hands them on (``fa3_arguments``)."""
        result = self.kernel.flash_attn_with_kvcache(q, k_cache, v_cache, **named)
        trace = self.kernel.last_trace
        self.plans.append({"metadata_passed": named.get("scheduler_metadata") is not None,
                           "plan_violations": sorted({v["invariant"] for v in trace.get("verdicts", [])})})
        return result

    def flash_attn_varlen_func(self, *args, **kwargs):
        from .sglang.driver import Unsupported

        raise Unsupported("flash_attn_varlen_func (extend) is not run by the engine driver")


def _emulated_class():
    from ..kernels.emulated import EmulatedKernel

    return EmulatedKernel


def _plan_only_class():
    """The emulator with its numerics pass replaced by zeros (schedule, shape check and tile plan unchanged)."""
    import torch

    EmulatedKernel = _emulated_class()

    class PlanOnlyEmulatedKernel(EmulatedKernel):
        name = "emulated (plan only)"

        def _numerics(self, args, plan, poison):
            from ..kernels.call_features import out_dtype_for

            q, dv = args.q, args.v_cache.shape[-1]
            out = torch.zeros(q.shape[:-1] + (dv,), dtype=out_dtype_for(q.dtype), device=q.device)
            lse_shape = (q.shape[0], q.shape[1], q.shape[2]) if q.dim() == 4 else (q.shape[0], q.shape[1])
            lse = torch.zeros(lse_shape, dtype=torch.float32, device=q.device)
            lse = lse.transpose(1, 2) if q.dim() == 4 else lse.transpose(0, 1)
            return out, lse.contiguous()

    return PlanOnlyEmulatedKernel
