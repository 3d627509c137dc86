"""Read the FA3 a kernel wheel ships: its forward kernels' tile table and its compiled host rules.

Usage::

    python scripts/read_fa3_wheel.py WHEEL [--json OUT] [--vectors OUT]

``WHEEL`` is an sglang-kernel wheel (``sgl_kernel/flash_ops.abi3.so``) or a vLLM wheel
(``vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so``), e.g. from ``pip download --no-deps sglang-kernel==0.4.10 -d /tmp/wheels``.
Needs binutils (``nm``, ``objdump``, ``readelf``, ``strings``, ``c++filt``) and an x86-64 Linux host; no GPU.

What it prints, and how each part is read (nothing is guessed from a version number):

1. **Kernel instances**: every ``FlashAttnFwdSm90`` kernel name in the shared object (``strings`` + ``c++filt``), parsed
   into (kBlockM, kBlockN, d, dv, dtype) and the mainloop's flags (causal, local, softcap, varlen, paged non-TMA,
   appended KV, PackGQA, Split, ...), grouped into a tile table: which tile each (d, dv, dtype, flags) runs with.
2. **Host rules**: the exported host functions that choose tiles and split counts (``nm -D --defined-only``:
   ``tile_size_fwd_sm90``, ``get_num_splits``, ``get_pack_gqa``, ``mha_fwd_get_scheduler_metadata``, ``mha_fwd``)
   and what their listings (``objdump -d``) show: the float constants they load (0.85, 1.1, 0.8), the 50 MiB
   bound, the 992-batch bound, whether ``get_num_splits`` reads ``params.total_q`` and whether
   ``tile_size_fwd_sm90`` takes a ninth argument (a one-warp-group decode tile).
3. **Calls into the compiled host code**: the shared object's loadable segments are mapped at their own offsets
   (no CUDA, no torch: the functions read are pure host arithmetic) and ``tile_size_fwd_sm90``, ``get_num_splits``
   and ``get_pack_gqa`` are called on grids of inputs. ``Flash_fwd_params`` is filled at the offsets of
   the ``flash.h`` layout the library was compiled with (``LAYOUTS``: 0251105a's, or the vLLM fork's before and
   after its 5824e6e2); the script picks the one layout at whose offsets ``get_num_splits``'s listing reads every
   field it must read (``choose_layout``), and refuses to call it when no layout, or more than one, fits. A call
   into anything outside the shared object but ``operator new``/``delete`` aborts the process (exit 134), never a
   wrong number.

``WHEEL`` may also be the FA3 library itself, unzipped from a wheel (``unzip -p WHEEL
vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so > fa3.so``), with ``--wheel-name``, ``--wheel-sha256``, ``--package`` and
``--version`` naming the wheel it came from (recorded as given; the library's own sha256 is read).

``--vectors OUT`` writes the call results as test vectors (JSON, with the wheel's name, version and sha256).
``--check-build BUILD`` checks that every tile refmodel picks under BUILD for an instantiated shape is instantiated.
Exit codes: 0 read (and checked), 1 a model tile not instantiated, 2 bad input (no such wheel, no FA3 library in it,
a tool missing, an unexpected layout).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import mmap
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

#: Where each wheel keeps its FA3 library.
FA3_LIBRARIES = ("sgl_kernel/flash_ops.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so")
TOOLS = ("nm", "objdump", "readelf", "strings", "c++filt")

#: Flash_fwd_params field offsets (bytes, x86-64 g++ ``offsetof``) per ``flash.h`` layout a wheel has shown; the
#: listing must read every NUM_SPLITS_READS field at one layout's offsets (``choose_layout``). upstream-0251105a:
#: Dao-AILab/flash-attention 0251105a (the sglang kernel wheels); fork-8f468e7d: vllm-project/flash-attention at
#: 8f468e7d (the same offsets from b99f8c82 to 5824e6e2^; vLLM 0.10.1-0.16.0); fork-5824e6e2: at 5824e6e2 and
#: 617264c1 (vLLM 0.17.0-0.18.1). The fork has no ``attention_chunk``. Re-derive: ``git show C:hopper/flash.h``,
#: a C++ file printing ``offsetof(Flash_fwd_params, f)``, ``g++ -std=c++17`` with a stub ``cuda.h``.
_COMMON = {"h": 104, "h_k": 108, "b": 240, "seqlen_q": 244, "seqlen_k": 248, "seqlen_knew": 252, "d": 256,
           "d_rounded": 268, "total_q": 276, "dv": 292, "dv_rounded": 296, "softcap": 304, "cu_seqlens_q": 312,
           "cu_seqlens_k": 320, "leftpad_k": 336, "seqused_q": 344, "seqused_k": 352, "knew_ptr": 416,
           "page_table": 544, "pagedkv_tma": 568, "window_size_left": 584, "window_size_right": 588}
LAYOUTS = {
    "upstream-0251105a": {**_COMMON, "attention_chunk": 592, "is_e4m3": 610, "num_splits_dynamic_ptr": 640,
                          "is_causal": 611, "is_local": 612, "num_splits": 616, "pack_gqa": 620, "arch": 676,
                          "num_sm": 680},
    "fork-8f468e7d": {**_COMMON, "is_e4m3": 602, "is_causal": 603, "is_local": 604, "num_splits": 608,
                      "pack_gqa": 612, "num_splits_dynamic_ptr": 624, "arch": 636, "num_sm": 640},
    "fork-5824e6e2": {**_COMMON, "is_e4m3": 602, "is_causal": 603, "is_local": 604, "num_splits": 608,
                      "pack_gqa": 612, "num_splits_dynamic_ptr": 632, "arch": 668, "num_sm": 672},
}
#: sizeof(Flash_fwd_params) of each layout
LAYOUT_SIZES = {"upstream-0251105a": 688, "fork-8f468e7d": 672, "fork-5824e6e2": 704}
#: 0251105a's offsets (the layout this script read first; kept as a name)
OFFSETS = LAYOUTS["upstream-0251105a"]
PARAMS_SIZE = max(LAYOUT_SIZES.values())
#: Fields get_num_splits reads in 0251105a (and in every wheel read so far).
NUM_SPLITS_READS = ("h", "h_k", "b", "seqlen_q", "seqlen_k", "d_rounded", "dv_rounded", "softcap", "cu_seqlens_q",
                    "page_table", "pagedkv_tma", "window_size_left", "window_size_right", "is_e4m3", "is_causal",
                    "is_local", "arch", "num_sm")

MAINLOOP = re.compile(
    r"flash::CollectiveMainloopFwdSm90<(\d+), cute::tuple<cute::C<\d+>, cute::C<\d+>, cute::C<\d+> >, "
    r"cute::tuple<cute::C<(\d+)>, cute::C<(\d+)>, cute::C<(\d+)> >, (\d+), cutlass::(\w+), float, "
    r"cutlass::arch::Sm(\d+), ((?:(?:true|false), )*(?:true|false))")
FLAG_NAMES = ("causal", "local", "softcap", "varlen", "paged_non_tma", "append_kv", "has_qv", "mma_pv_is_rs",
              "intra_wg_overlap", "packgqa", "split", "v_colmajor")


def fail(message: str):
    print(f"read_fa3_wheel: {message}", file=sys.stderr)
    raise SystemExit(2)


def run(cmd, **kw) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1200, **kw).stdout


# ----------------------------------------------------------------------------------------------------------
# the wheel
# ----------------------------------------------------------------------------------------------------------


def open_library(path: Path, given: dict) -> dict:
    """A bare FA3 library (``*.so``, e.g. unzipped from a wheel that was then deleted); the wheel's name, package,
    version and sha256 are recorded as given on the command line (``--wheel-name`` ...), the library's own sha256
    as read."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return {"wheel": given.get("wheel_name"), "name": given.get("package"), "version": given.get("version"),
            "sha256": given.get("wheel_sha256"), "library": path.name, "library_size": path.stat().st_size,
            "library_sha256": digest.hexdigest(), "library_date": None, "so": path}


def open_wheel(path: Path, workdir: Path, given: Optional[dict] = None) -> dict:
    """Name, version, sha256 and the extracted FA3 library of a wheel (or a bare library: ``open_library``)."""
    if not path.is_file():
        fail(f"WHEEL: no such file {path}")
    if path.name.endswith(".so"):
        given = given or {}
        absent = [k for k in ("wheel_name", "wheel_sha256", "package", "version") if not given.get(k)]
        if absent:
            fail(f"WHEEL: {path.name} is a bare library; name the wheel it came from with "
                 + ", ".join("--" + k.replace("_", "-") for k in absent))
        if not re.fullmatch(r"[0-9a-f]{64}", given["wheel_sha256"]):
            fail(f"--wheel-sha256: must be 64 lowercase hex digits, got {given['wheel_sha256']!r}")
        return open_library(path, given)
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    try:
        z = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        fail(f"WHEEL: not a wheel (zip) file: {path}")
    names = set(z.namelist())
    member = next((m for m in FA3_LIBRARIES if m in names), None)
    if member is None:
        fail(f"WHEEL: holds none of {', '.join(FA3_LIBRARIES)}")
    meta = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
    fields = {}
    if meta:
        for line in z.read(meta).decode("utf-8", "replace").splitlines():
            if ":" in line and not line.startswith(" "):
                k, v = line.split(":", 1)
                fields.setdefault(k.strip(), v.strip())
    info = z.getinfo(member)
    so = workdir / Path(member).name
    with z.open(member) as src, so.open("wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 24)
    return {"wheel": path.name, "name": fields.get("Name"), "version": fields.get("Version"),
            "sha256": digest.hexdigest(), "library": member, "library_size": info.file_size,
            "library_date": "%04d-%02d-%02d" % info.date_time[:3], "so": so}


# ----------------------------------------------------------------------------------------------------------
# 1. kernel instances
# ----------------------------------------------------------------------------------------------------------


def kernel_instances(so: Path) -> list[dict]:
    """The forward mainloops instantiated in the library (one row per distinct mainloop)."""
    strings = subprocess.run(["strings", "-n", "40", str(so)], capture_output=True, check=True, timeout=1200).stdout
    names = sorted({m.group(0).decode() for m in re.finditer(rb"_ZN[0-9A-Za-z_]*FlashAttnFwdSm90[0-9A-Za-z_]*",
                                                               strings)})
    demangled = run(["c++filt"], input="\n".join(names))
    rows = set()
    for line in demangled.splitlines():
        for m in MAINLOOP.finditer(line):
            flags = [f == "true" for f in m.group(8).split(", ")]
            rows.add((int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)), m.group(6),
                      int(m.group(7)), int(m.group(1)), tuple(flags[:len(FLAG_NAMES)])))
    out = []
    for bm, bn, d, dv, dtype, arch, stages, flags in sorted(rows):
        out.append({"block_m": bm, "block_n": bn, "d": d, "dv": dv, "dtype": dtype, "arch": arch, "stages": stages,
                    **dict(zip(FLAG_NAMES, flags))})
    return out


def tile_table(instances: list[dict]) -> dict:
    """(dtype, d, dv, causal, local, paged_non_tma, softcap, packgqa, split) -> the tiles instantiated for it."""
    table: dict = {}
    for r in instances:
        if r["arch"] != 90:
            continue
        key = (r["dtype"], r["d"], r["dv"], r["causal"], r["local"], r["paged_non_tma"], r["softcap"])
        table.setdefault(key, set()).add((r["block_m"], r["block_n"]))
    return table


# ----------------------------------------------------------------------------------------------------------
# 2. host rules, from the exported symbols and their listings
# ----------------------------------------------------------------------------------------------------------


def symbols(so: Path) -> dict:
    """Defined dynamic symbols: mangled name -> address."""
    out = {}
    for line in run(["nm", "-D", "--defined-only", str(so)]).splitlines():
        parts = line.split()
        if len(parts) == 3:
            out[parts[2]] = int(parts[0], 16)
    return out


def find(syms: dict, needle: str) -> tuple[str, int]:
    hits = [(n, a) for n, a in syms.items() if needle in n]
    if len(hits) != 1:
        fail(f"library: expected one exported symbol containing {needle!r}, found {len(hits)}")
    return hits[0]


def listing(so: Path, address: int, length: int = 0x1400) -> str:
    return run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={address:#x}",
                f"--stop-address={address + length:#x}", str(so)])


def function_body(text: str) -> str:
    """A listing cut at the next function's label."""
    lines = text.splitlines()
    out, started = [], False
    for line in lines:
        if re.match(r"^[0-9a-f]+ <", line):
            if started:
                break
            started = True
        if started:
            out.append(line)
    return "\n".join(out)


def rodata_constants(so: Path, body: str, segments: list) -> dict:
    """Finite float32 and float64 constants a listing loads RIP-relative (``movss``/``mulsd``/... ADDR(%rip))."""
    out = {"float32": set(), "float64": set()}
    with so.open("rb") as f:
        for m in re.finditer(r"\b(\w+?)(ss|sd)\s+0x[0-9a-f]+\(%rip\),%xmm\d+\s+# ([0-9a-f]+)", body):
            addr = int(m.group(3), 16)
            off = next((o + addr - v for v, o, fs, _ in segments if v <= addr < v + fs), None)
            if off is None:
                continue
            f.seek(off)
            kind, fmt = ("float32", "<f") if m.group(2) == "ss" else ("float64", "<d")
            value = struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
            if value == value and abs(value) != float("inf"):
                out[kind].add(round(value, 6))
    return {k: sorted(v) for k, v in out.items()}


def load_segments(so: Path) -> list:
    """(vaddr, file offset, file size, mem size, flags) of every PT_LOAD."""
    segs = []
    for line in run(["readelf", "-lW", str(so)]).splitlines():
        parts = line.split()
        if parts and parts[0] == "LOAD":
            segs.append((int(parts[2], 16), int(parts[1], 16), int(parts[4], 16), int(parts[5], 16)))
    return segs


def host_rules(so: Path, syms: dict) -> dict:
    """What the compiled host functions show (see the module docstring, part 2)."""
    segs = load_segments(so)
    tile_name, tile_addr = find(syms, "tile_size_fwd_sm90")
    ns_name, ns_addr = find(syms, "get_num_splits")
    pk_name, _ = find(syms, "get_pack_gqa")
    md_name, md_addr = find(syms, "mha_fwd_get_scheduler_metadata")
    fwd_name, fwd_addr = find(syms, "_Z7mha_fwd")
    tile_args = run(["c++filt", tile_name]).strip()
    ns_body = function_body(listing(so, ns_addr))
    md_body = function_body(listing(so, md_addr, 0x4000))
    fwd_body = function_body(listing(so, fwd_addr, 0x9000))
    layout = choose_layout(ns_body)
    offsets = LAYOUTS[layout] if layout else OFFSETS
    reads = {f: bool(re.search(rf"\b{offsets[f]:#x}\(%r[a-z0-9]+\)", ns_body)) for f in offsets}
    return {
        "params_layout": layout,
        "tile_size_fwd_sm90": tile_args,
        "tile_size_arguments": tile_args.count(",") + 1,
        "get_num_splits": run(["c++filt", ns_name]).strip(),
        "get_pack_gqa": run(["c++filt", pk_name]).strip(),
        "get_num_splits_constants": rodata_constants(so, ns_body, segs),
        "get_num_splits_max_splits_128": "$0x7f," in ns_body,
        "get_num_splits_50MiB": "$0x3200000" in ns_body,
        "get_num_splits_reads": sorted(f for f, r in reads.items() if r),
        "get_num_splits_reads_total_q": reads.get("total_q", False),
        "get_num_splits_calls": sorted(set(re.findall(r"call\s+[0-9a-f]+ <([^>@]+)", ns_body))),
        "scheduler_metadata_992": "$0x3e0" in md_body or "$0x3df" in md_body,
        "mha_fwd_992": "$0x3e0" in fwd_body or "$0x3df" in fwd_body,
        "mha_fwd_split_cap_256": "$0x100" in fwd_body,
        "scheduler_metadata_calls_get_num_splits": "get_num_splits" in md_body,
        "mha_fwd_calls_get_num_splits": "get_num_splits" in fwd_body,
    }


def layout_reads(body: str, layout: str) -> list[str]:
    """The fields of NUM_SPLITS_READS that a listing reads at ``layout``'s offsets (``0xOFF(%reg)`` operands)."""
    offsets = LAYOUTS[layout]
    return [f for f in NUM_SPLITS_READS if re.search(rf"\b{offsets[f]:#x}\(%r[a-z0-9]+\)", body)]


def choose_layout(body: str):
    """The one layout at whose offsets ``get_num_splits``'s listing reads every field it must read, else None."""
    full = [name for name in LAYOUTS if len(layout_reads(body, name)) == len(NUM_SPLITS_READS)]
    return full[0] if len(full) == 1 else None


def check_layout(rules: dict) -> None:
    """get_num_splits must read every field of NUM_SPLITS_READS at one known layout's offsets (LAYOUTS)."""
    if rules.get("params_layout") is None:
        missing = [f for f in NUM_SPLITS_READS if f not in rules["get_num_splits_reads"]]
        fail(f"library: get_num_splits does not read {', '.join(missing)} at the offsets of any known "
             f"Flash_fwd_params layout ({', '.join(LAYOUTS)}); its layout differs, so its calls are not made")


# ----------------------------------------------------------------------------------------------------------
# 3. calls into the compiled host code
# ----------------------------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
PROT_R, PROT_W, PROT_X = 1, 2, 4
MAP_PRIVATE, MAP_FIXED, MAP_ANON = 0x02, 0x10, 0x20
PAGE = mmap.PAGESIZE


class Mapped:
    """The library's PT_LOAD segments mapped at base + vaddr; its PLT slots bound to itself or to new/delete."""

    def __init__(self, so: Path, syms: dict):
        segs = load_segments(so)
        top = max(v + m for v, _, _, m in segs)
        size = (top + PAGE - 1) // PAGE * PAGE
        base = _libc.mmap(None, size, 0, MAP_PRIVATE | MAP_ANON, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            fail("mmap: cannot reserve the library's address range")
        self.base, self._fd = base, open(so, "rb")
        for vaddr, off, fsz, msz in segs:
            start, pad = vaddr // PAGE * PAGE, vaddr % PAGE
            length = (fsz + pad + PAGE - 1) // PAGE * PAGE
            got = _libc.mmap(base + start, length, PROT_R | PROT_W | PROT_X, MAP_PRIVATE | MAP_FIXED,
                             self._fd.fileno(), off - pad)
            if got != base + start:
                fail("mmap: cannot map a segment")
            end = start + length
            mend = (vaddr + msz + PAGE - 1) // PAGE * PAGE
            if mend > end:
                _libc.mmap(base + end, mend - end, PROT_R | PROT_W, MAP_PRIVATE | MAP_FIXED | MAP_ANON, -1, 0)
        malloc = ctypes.cast(_libc.malloc, ctypes.c_void_p).value
        free = ctypes.cast(_libc.free, ctypes.c_void_p).value
        abort = ctypes.cast(_libc.abort, ctypes.c_void_p).value
        for line in run(["readelf", "-rW", "--use-dynamic", str(so)]).splitlines() + \
                run(["readelf", "-rW", str(so)]).splitlines():
            parts = line.split()
            if len(parts) < 5 or parts[2] not in ("R_X86_64_JUMP_SLOT", "R_X86_64_GLOB_DAT"):
                continue
            slot, value, name = int(parts[0], 16), int(parts[3], 16), parts[4].split("@")[0]
            if value:
                target = base + value
            elif name in ("_Znwm", "_Znam"):
                target = malloc
            elif name in ("_ZdlPv", "_ZdlPvm", "_ZdaPv", "_ZdaPvm"):
                target = free
            elif name in ("memmove", "memcpy", "memset"):
                target = ctypes.cast(getattr(_libc, name), ctypes.c_void_p).value
            else:
                target = abort
            ctypes.c_uint64.from_address(base + slot).value = target
        self.syms = syms

    def function(self, needle: str, restype, *argtypes):
        name, addr = find(self.syms, needle)
        return ctypes.CFUNCTYPE(restype, *argtypes)(self.base + addr)


def tile_caller(lib: Mapped, nargs: int):
    """tile_size_fwd_sm90(d, dv, causal, local, elem, v_colmajor, paged_non_tma, softcap[, one_mma_wg]) -> (M, N)."""
    B, I = ctypes.c_bool, ctypes.c_int
    types = [I, I, B, B, I, B, B, B] + ([B] if nargs == 9 else [])
    fn = lib.function("tile_size_fwd_sm90", None, ctypes.c_void_p, *types)
    out = ctypes.create_string_buffer(16)

    def tile(*args):
        fn(ctypes.addressof(out), *args[:nargs])
        # std::tuple<int, int, bool, bool> (libstdc++ stores the last element first): kBlockM at 8, kBlockN at 4
        return struct.unpack_from("<i", out, 8)[0], struct.unpack_from("<i", out, 4)[0]
    return tile


def params_caller(lib: Mapped, needle: str, layout: str = "upstream-0251105a"):
    fn = lib.function(needle, ctypes.c_int, ctypes.c_void_p)
    buf = ctypes.create_string_buffer(PARAMS_SIZE + 64)
    offsets = LAYOUTS[layout]

    def call(**fields) -> int:
        ctypes.memset(buf, 0, len(buf))
        for k, v in fields.items():
            off = offsets[k]
            if k in ("cu_seqlens_q", "page_table", "num_splits_dynamic_ptr"):
                struct.pack_into("<Q", buf, off, 0x1000 if v else 0)   # tested for null, never read
            elif k in ("pagedkv_tma", "is_e4m3", "is_causal", "is_local", "pack_gqa"):
                struct.pack_into("<B", buf, off, int(bool(v)))
            elif k == "softcap":
                struct.pack_into("<f", buf, off, float(v))
            else:
                struct.pack_into("<i", buf, off, int(v))
        return fn(ctypes.addressof(buf))
    return call


def round_up_headdim(d: int) -> int:
    for r in (64, 96, 128, 192, 256):
        if d <= r:
            return r
    return 256


def vectors(lib: Mapped, rules: dict) -> dict:
    """Call the wheel's host functions on fixed grids; rows are inputs followed by outputs."""
    nargs = rules["tile_size_arguments"]
    tile = tile_caller(lib, nargs)
    tiles = []
    for d in (64, 96, 128, 192, 256):
        for dv in (64, 96, 128, 192, 256, 512):
            for c in (0, 1):
                for loc in (0, 1):
                    for e in (1, 2):
                        for vc in (0, 1):
                            for pg in (0, 1):
                                for sc in (0, 1):
                                    for wg in ((0, 1) if nargs == 9 else (0,)):
                                        tiles.append([d, dv, c, loc, e, vc, pg, sc, wg,
                                                      *tile(d, dv, c, loc, e, vc, pg, sc, wg)])
    splits = []
    call = params_caller(lib, "get_num_splits", rules["params_layout"])
    for b in (1, 8):
        for sq, total_q in ((1, None), (4, None), (17, None), (64, 0), (128, None), (1024, None), (64, 64)):
            for sk in (832, 4096, 32768):
                for h, hk in ((32, 4), (32, 1), (8, 8)):
                    for d, dv in ((64, 64), (128, 128)):
                        for causal, local in ((0, 0), (1, 0), (0, 1)):
                            for varlen in (0, 1):
                                for paged, tma in ((0, 0), (1, 0)):
                                    tq = b * sq if total_q is None else total_q
                                    f = dict(b=b, seqlen_q=sq, seqlen_k=sk, h=h, h_k=hk, d=d, dv=dv,
                                             d_rounded=round_up_headdim(d), dv_rounded=round_up_headdim(dv),
                                             is_causal=causal, is_local=local,
                                             window_size_left=1000 if local else -1,
                                             window_size_right=0 if (causal or local) else -1,
                                             cu_seqlens_q=varlen, num_splits_dynamic_ptr=varlen,
                                             total_q=tq, page_table=paged,
                                             pagedkv_tma=tma, arch=90, num_sm=132)
                                    splits.append([b, sq, tq, sk, h, hk, d, dv, causal, local, varlen, paged,
                                                   tma, call(**f)])
    pack = []
    call = params_caller(lib, "get_pack_gqa", rules["params_layout"])
    for h, hk in ((8, 8), (32, 4), (32, 1), (64, 8)):
        for sq in (1, 2, 4, 8, 9, 16, 17, 64, 100, 300):
            for d in (64, 128, 256):
                for causal, local in ((0, 0), (1, 0), (0, 1)):
                    for varlen in (0, 1):
                        for num_splits in (1, 2):
                            for paged, tma in ((0, 0), (1, 0), (1, 1)):
                                f = dict(b=2, seqlen_q=sq, seqlen_k=4096, h=h, h_k=hk, d=d, dv=d,
                                         d_rounded=round_up_headdim(d), dv_rounded=round_up_headdim(d),
                                         is_causal=causal, is_local=local, window_size_left=1000 if local else -1,
                                         window_size_right=0 if (causal or local) else -1, cu_seqlens_q=varlen,
                                         num_splits_dynamic_ptr=varlen, total_q=2 * sq, page_table=paged,
                                         pagedkv_tma=tma, arch=90, num_sm=132, num_splits=num_splits)
                                pack.append([sq, h, hk, d, causal, local, varlen, num_splits, paged, tma,
                                             int(call(**f) & 0xFF != 0)])
    return {"tiles": tiles, "get_num_splits": splits, "get_pack_gqa": pack,
            "get_pack_gqa_columns": ["seqlen_q", "h", "h_k", "d", "causal", "local", "varlen", "num_splits", "paged",
                                     "pagedkv_tma", "pack_gqa"],
            "get_num_splits_columns": ["b", "seqlen_q", "total_q", "seqlen_k", "h", "h_k", "d", "dv", "causal",
                                       "local", "varlen", "paged", "pagedkv_tma", "num_splits"],
            "get_num_splits_fixed": {"num_splits_dynamic_ptr": "non-null when varlen (as both entry points set it)","arch": 90, "num_sm": 132, "window_size_left": "1000 when local, else -1",
                                     "window_size_right": "0 when causal or local, else -1", "softcap": 0,
                                     "is_e4m3": 0, "seqlen_knew": 0},
            "tiles_columns": ["d", "dv", "causal", "local", "element_size", "v_colmajor", "paged_kv_non_tma",
                              "softcap", "one_mma_wg", "block_m", "block_n"]}


def tiles_not_instantiated(instances: list[dict], build_name: str) -> tuple[int, list]:
    """Every tile the model picks under ``build_name`` for an instantiated sm90 shape must be instantiated too.

    For each (dtype, d, dv, causal, local, paged non-TMA, softcap) the library instantiates, the model's tile
    (refmodel.fa3_builds ``tile_size_fwd_sm90_build``; with the one-warp-group decode tile too, for d 64 or 128,
    where the build has one and, for the fork, not local) must be among that shape's instantiated tiles. Returns
    (tiles checked, the ones missing).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from refmodel import fa3_builds

    kind = fa3_builds.build(build_name).one_mma_wg
    table = tile_table(instances)
    checked, missing = 0, []
    for (dtype, d, dv, c, loc, pg, sc), tiles in sorted(table.items()):
        e = 1 if dtype.startswith("float_e4m3") else 2
        for wg in (False, True):
            if wg and (kind is None or d not in (64, 128) or (kind == "fork" and loc)):
                continue
            t = fa3_builds.tile_size_fwd_sm90_build(build_name, d, dv, c, loc, e, pg, sc, False, wg)
            checked += 1
            if t not in tiles:
                missing.append({"shape": [dtype, d, dv, c, loc, pg, sc], "one_mma_wg": wg, "model": list(t),
                                "instantiated": sorted(tiles)})
    return checked, missing


# ----------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--json", type=Path, default=None, help="write everything read as JSON")
    ap.add_argument("--vectors", type=Path, default=None, help="write the call results as test vectors (JSON)")
    ap.add_argument("--no-instances", action="store_true", help="skip the kernel-instance scan (the slow part)")
    ap.add_argument("--check-build", default=None, metavar="BUILD",
                    help="check that every tile the model picks under BUILD is instantiated (exit 1 if not)")
    ap.add_argument("--wheel-name", default=None, help="with a bare library: the wheel file it was unzipped from")
    ap.add_argument("--wheel-sha256", default=None, help="with a bare library: that wheel's sha256")
    ap.add_argument("--package", default=None, help="with a bare library: the wheel's package name")
    ap.add_argument("--version", default=None, help="with a bare library: the wheel's version")
    args = ap.parse_args(argv)
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        fail(f"tools: {', '.join(missing)} not on PATH (install binutils)")
    with tempfile.TemporaryDirectory(prefix="fa3wheel-") as tmp:
        w = open_wheel(args.wheel, Path(tmp), {"wheel_name": args.wheel_name, "wheel_sha256": args.wheel_sha256,
                                                "package": args.package, "version": args.version})
        so = w.pop("so")
        syms = symbols(so)
        exported = all(any(n in name for name in syms) for n in ("tile_size_fwd_sm90", "get_num_splits"))
        if exported:
            rules = host_rules(so, syms)
            check_layout(rules)
            vec = vectors(Mapped(so, syms), rules)
        else:
            rules = {"exported": "tile_size_fwd_sm90 / get_num_splits are not exported (inlined): no host rule "
                                 "can be called; only the kernel instances are read"}
            vec = None
        inst = [] if args.no_instances else kernel_instances(so)
    print(f"wheel {w['wheel']}  {w['name']} {w['version']}  sha256 {w['sha256']}")
    if w.get("library_sha256"):
        print(f"library {w['library']} ({w['library_size']} bytes, sha256 {w['library_sha256']}; unzipped from the "
              f"wheel named above)")
    else:
        print(f"library {w['library']} ({w['library_size']} bytes, zip date {w['library_date']})")
    print("host rules:")
    for k, v in rules.items():
        print(f"  {k}: {v}")
    if inst:
        table = tile_table(inst)
        print(f"kernel instances: {len(inst)} mainloops; sm90 tile table ({len(table)} shapes):")
        for key in sorted(table):
            dtype, d, dv, c, loc, pg, sc = key
            tiles = " ".join(f"{m}x{n}" for m, n in sorted(table[key]))
            print(f"  {dtype:12s} d {d:3d} dv {dv:3d} causal {int(c)} local {int(loc)} paged_non_tma {int(pg)} "
                  f"softcap {int(sc)}: {tiles}")
    if vec:
        print(f"tile_size_fwd_sm90 called on {len(vec['tiles'])} inputs; get_num_splits on "
              f"{len(vec['get_num_splits'])}; get_pack_gqa on {len(vec['get_pack_gqa'])}")
    summary = {**w, "host_rules": rules, "instances": inst}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    status = 0
    if args.check_build and inst:
        checked, missing = tiles_not_instantiated(inst, args.check_build)
        print(f"model tiles under {args.check_build}: {checked} checked, {len(missing)} not instantiated")
        for m in missing[:20]:
            print(f"  {m}")
        status = 1 if missing else 0
    if args.vectors and vec is None:
        fail("--vectors: this wheel exports no host function to call")
    if args.vectors:
        out = {"schema": "fa3verify.wheel_vectors/1", "generator": "scripts/read_fa3_wheel.py",
               "wheel": w["wheel"], "package": w["name"], "version": w["version"], "sha256": w["sha256"],
               "library": w["library"], **({"library_sha256": w["library_sha256"]} if "library_sha256" in w else {}),
               "host_rules": rules, **vec}
        args.vectors.write_text(json.dumps(out, separators=(",", ":")) + "\n")
        print(f"wrote {args.vectors}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
