"""scripts/read_fa3_wheel.py without a wheel: its kernel-name parsing, its instance check, and its bad-input exits.

The wheel-dependent parts (calling the compiled host functions) ran once to produce the stored vectors
(fa3verify/fidelity_vectors/sglang-kernel-*.json, tests/oracle/test_fidelity_wheel_builds.py); their commands are in
docs/fa3-builds.md.
"""

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "read_fa3_wheel.py"


def _module():
    spec = importlib.util.spec_from_file_location("read_fa3_wheel", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# a demangled forward kernel name as c++filt prints it (sglang-kernel 0.4.10, fp8 d 192 / dv 192: local, varlen, appended KV, PackGQA, Split)
KERNEL = ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
          "flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, "
          "cute::tuple<cute::C<128>, cute::C<160>, cute::C<192> >, 192, cutlass::float_e4m3_t, float, "
          "cutlass::arch::Sm90, false, true, false, true, false, true, false, false, true, true, true, false, false, "
          "cutlass::bfloat16_t, false, 1>, flash::CollectiveEpilogueFwd<...> > > >(...)")


def test_a_kernel_name_gives_its_tile_head_dims_dtype_and_flags():
    m = _module().MAINLOOP.search(KERNEL)
    assert m is not None
    assert (m.group(2), m.group(3), m.group(4), m.group(5), m.group(6), m.group(7)) == \
        ("128", "160", "192", "192", "float_e4m3_t", "90")
    flags = dict(zip(_module().FLAG_NAMES, [f == "true" for f in m.group(8).split(", ")]))
    assert flags["local"] and flags["varlen"] and flags["append_kv"] and flags["packgqa"] and flags["split"]
    assert not flags["causal"] and not flags["softcap"] and not flags["paged_non_tma"]


def _instances(tiles):
    base = {"dtype": "bfloat16_t", "d": 64, "dv": 64, "arch": 90, "stages": 2, "causal": False, "local": True,
            "paged_non_tma": False, "softcap": False}
    return [{**base, "block_m": m, "block_n": n} for m, n in tiles]


def test_the_instance_check_reports_a_model_tile_that_is_not_instantiated():
    mod = _module()
    # bf16 d 64 local non-causal: the sglang builds pick 192 x 192, and 64 x 192 with the decode tile
    checked, missing = mod.tiles_not_instantiated(_instances([(192, 192), (64, 192)]), "sglang-kernel-0.4.5")
    assert (checked, missing) == (2, [])
    # negative control: a library with the fork's 192 x 160 instead
    checked, missing = mod.tiles_not_instantiated(_instances([(192, 160), (64, 192)]), "sglang-kernel-0.4.5")
    assert checked == 2 and [m["model"] for m in missing] == [[192, 192]]
    # the fork picks no decode tile for local attention: only one tile to check
    checked, missing = mod.tiles_not_instantiated(_instances([(192, 160)]), "vllm-fork-617264c1")
    assert (checked, missing) == (1, [])


def test_bad_input_exits_2_naming_the_wheel(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none.whl")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "WHEEL: no such file" in r.stderr and "Traceback" not in r.stderr
    empty = tmp_path / "empty-0.1-py3-none-any.whl"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("empty/__init__.py", "")
    r = subprocess.run([sys.executable, str(SCRIPT), str(empty)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "WHEEL: holds none of" in r.stderr and "Traceback" not in r.stderr
