"""gpu-check's ``environment`` stage: Python, torch and CUDA versions, the GPU, the FA3 module and its file,
compute-sanitizer; and whether a real (non-dry) run can go ahead on this machine.

Invariant: probing never raises (a missing torch, GPU or FA3 module is recorded with its reason), and a real run
goes ahead only on a visible sm90 GPU with an importable FA3 module (``hopper/flash_api.cpp`` needs sm90).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any, Callable, Optional


def print_environment(say: Callable[[str], None], e: dict) -> None:
    """The probed environment, one line per part, through ``say``."""
    say(f"python {e.get('python')} | torch {e.get('torch')} (CUDA build {e.get('torch_cuda')}) | "
        f"{e.get('cpu_count')} CPUs")
    gpu = e.get("gpu")
    say("GPU: " + (f"{gpu['name']} sm{gpu['capability']} {gpu['sms']} SMs {gpu['memory_gib']} GiB"
                   if gpu else f"none ({e.get('gpu_reason', 'CUDA not available')})"))
    if e.get("nvidia_smi"):
        say(f"nvidia-smi: {e['nvidia_smi']}")
    fa3 = e.get("fa3") or {}
    say("FA3 module: " + (f"{fa3['module']} from {fa3['file']} (paged KV: {fa3.get('paged_kv')})"
                          if fa3.get("module") else f"not importable ({fa3.get('reason', '?')[:300]})"))
    say(f"compute-sanitizer: {e.get('compute_sanitizer') or 'not on PATH'}")


def probe_environment() -> dict:
    """Python/torch/CUDA versions, the GPU, the FA3 module and compute-sanitizer (never raises)."""
    env: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable,
                           "platform": platform.platform(), "cpu_count": os.cpu_count(),
                           "pythonpath": os.environ.get("PYTHONPATH", "")}
    try:
        import torch

        env.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            env["gpu"] = {"name": props.name, "capability": f"{props.major}{props.minor}",
                          "sms": props.multi_processor_count,
                          "memory_gib": round(props.total_memory / 2**30, 1), "count": torch.cuda.device_count()}
        else:
            env["gpu_reason"] = f"torch.cuda.is_available() is False (CUDA build {torch.version.cuda})"
    except Exception as exc:  # noqa: BLE001
        env["torch"] = None
        env["gpu_reason"] = f"torch not importable: {exc}"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            env["nvidia_smi"] = out.stdout.strip().replace("\n", "; ") or out.stderr.strip()[:200]
        except Exception as exc:  # noqa: BLE001
            env["nvidia_smi"] = f"failed: {exc}"
    try:
        from gpu_impl.kernels.fa3 import find_fa3_module, module_supports_paged_kv

        name, module = find_fa3_module()
        env["fa3"] = {"module": name, "file": getattr(module, "__file__", None),
                      "paged_kv": module_supports_paged_kv(name)}
        try:
            from importlib.metadata import version

            env["fa3"]["fa3_fwd_version"] = version("fa3-fwd")
        except Exception:  # noqa: BLE001
            pass
    except Exception as exc:  # noqa: BLE001 - KernelUnavailable, or an import error of gpu_impl itself
        env["fa3"] = {"module": None, "reason": str(exc)[:2000]}
    env["compute_sanitizer"] = shutil.which("compute-sanitizer")
    return env


def gpu_problem(env: dict) -> Optional[str]:
    """Why the real run cannot go ahead here (None when it can): no CUDA, not sm90, no FA3 module."""
    if not env.get("cuda_available"):
        return (f"no CUDA GPU visible ({env.get('gpu_reason', 'CUDA not available')}; torch {env.get('torch')}): "
                f"the real FA3 kernel needs an sm90 GPU")
    gpu = env.get("gpu") or {}
    if not str(gpu.get("capability", "")).startswith("9"):
        return f"GPU {gpu.get('name')} is sm{gpu.get('capability')}; FA3 (hopper) needs sm90"
    fa3 = env.get("fa3") or {}
    if not fa3.get("module"):
        return f"no FA3 module importable: {fa3.get('reason', '?')[:600]}"
    return None
