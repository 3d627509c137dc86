"""Lay out the FA3 builds a GPU machine without network needs, in two git-ignored folders of the repository.

    python scripts/prepare_fa3_builds.py                          # fa3-fwd 0.0.3 into .whl/, vLLM 0.34.0's FA3
    python scripts/prepare_fa3_builds.py --vllm 0.34.0 --vllm-wheel /path/vllm-0.34.0-...whl
    python scripts/prepare_fa3_builds.py --no-vllm                # only the fa3-fwd wheel

* ``.whl/``: the ``fa3-fwd`` wheel (upstream FA3, forward only), which ``scripts/gpu_check.sh`` installs there.
* ``.fa3builds/vllm-V.tar.xz``: vLLM V's FA3 exactly as its wheel ships it: ``vllm/vllm_flash_attn/__init__.py``,
  ``flash_attn_interface.py`` and ``_vllm_fa3_C.abi3.so``, byte for byte (xz-compressed to fit a transfer). The
  script gpu_check.sh unpacks each into a folder it passes as ``--fa3-build``. ``.fa3builds/manifest.json`` records
  each file's sha256 and the wheel it came from.

Wheels come from the package registry (``pip download --no-deps``), or from ``--vllm-wheel``. The sglang-kernel
wheels are not laid out: their ``sgl_kernel/flash_ops.abi3.so`` alone is 1.1 GB (0.4.10), past what a device run
can carry (docs/gpu-guide.md). Exit codes: 0 done, 2 bad arguments, 3 a download or a wheel failed.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FA3_FWD = "fa3-fwd==0.0.3"
#: what is taken from a vLLM wheel: enough to import vllm.vllm_flash_attn's FA3 (nothing else of vLLM)
VLLM_FILES = ("vllm/vllm_flash_attn/__init__.py", "vllm/vllm_flash_attn/flash_attn_interface.py",
              "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so")
#: the device machine's Python (docs/gpu-guide.md): what pip downloads for
DEVICE_PY = ("--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def pip_download(spec: str, dest: str) -> str:
    """Download one wheel (no dependencies) into ``dest``; its path."""
    os.makedirs(dest, exist_ok=True)
    before = set(os.listdir(dest))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", dest, *DEVICE_PY]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    proc = subprocess.run(cmd + [spec], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download {spec} failed: {proc.stderr.strip()[-500:]}")
    name = spec.split("==")[0].replace("-", "_")
    got = sorted(f for f in os.listdir(dest) if f.startswith(name) and f.endswith(".whl"))
    new = [f for f in got if f not in before] or got
    if not new:
        raise RuntimeError(f"pip download {spec}: no wheel in {dest}")
    return os.path.join(dest, new[-1])


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack_vllm(wheel: str, release: str, out_dir: str) -> dict:
    """``out_dir/vllm-<release>.tar.xz`` from a vLLM wheel; the manifest entry."""
    entry = {"release": release, "wheel": os.path.basename(wheel), "files": {}}
    buf = io.BytesIO()
    with zipfile.ZipFile(wheel) as zf, tarfile.open(fileobj=buf, mode="w") as tar:
        names = set(zf.namelist())
        missing = [f for f in VLLM_FILES if f not in names]
        if missing:
            raise RuntimeError(f"{wheel}: has no {', '.join(missing)} (a vLLM release without FA3?)")
        for f in VLLM_FILES:
            data = zf.read(f)
            entry["files"][f] = {"sha256": sha256(data), "bytes": len(data)}
            info = tarfile.TarInfo(f"vllm-{release}/{f}")
            info.size, info.mode = len(data), 0o755 if f.endswith(".so") else 0o644
            tar.addfile(info, io.BytesIO(data))
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"vllm-{release}.tar.xz")
    with open(path, "wb") as fh:
        fh.write(lzma.compress(buf.getvalue(), preset=6))
    entry["archive"] = os.path.relpath(path, REPO)
    entry["archive_bytes"] = os.path.getsize(path)
    return entry


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm", default="0.34.0", metavar="V", help="the vLLM release whose FA3 to lay out (default "
                                                                  "0.34.0)")
    p.add_argument("--vllm-wheel", metavar="WHEEL", help="take vLLM's FA3 from this wheel instead of downloading it")
    p.add_argument("--no-vllm", action="store_true", help="lay out no vLLM build")
    p.add_argument("--no-fa3-fwd", action="store_true", help="do not download the fa3-fwd wheel")
    a = p.parse_args(argv)
    if a.vllm_wheel and not os.path.isfile(a.vllm_wheel):
        print(f"--vllm-wheel: no such file: {a.vllm_wheel}", file=sys.stderr)
        return 2
    manifest_path = os.path.join(REPO, ".fa3builds", "manifest.json")
    manifest = {"vllm": {}}
    if os.path.isfile(manifest_path):
        with open(manifest_path) as fh:
            manifest = json.load(fh)
    try:
        if not a.no_fa3_fwd:
            whl = pip_download(FA3_FWD, os.path.join(REPO, ".whl"))
            with open(whl, "rb") as fh:
                manifest["fa3_fwd"] = {"wheel": os.path.basename(whl), "sha256": sha256(fh.read())}
            print(f"fa3-fwd: {os.path.relpath(whl, REPO)}")
        if not a.no_vllm:
            with tempfile.TemporaryDirectory() as tmp:
                wheel = a.vllm_wheel or pip_download(f"vllm=={a.vllm}", tmp)
                entry = pack_vllm(wheel, a.vllm, os.path.join(REPO, ".fa3builds"))
            manifest.setdefault("vllm", {})[a.vllm] = entry
            print(f"vLLM {a.vllm}'s FA3: {entry['archive']} ({entry['archive_bytes'] >> 20} MiB)")
    except (RuntimeError, OSError, zipfile.BadZipFile, subprocess.TimeoutExpired) as exc:
        print(f"prepare_fa3_builds: {exc}", file=sys.stderr)
        return 3
    os.makedirs(os.path.dirname(manifest_path), exist_ok=True)
    with open(manifest_path, "w") as fh:
        json.dump(manifest, fh, indent=2)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
