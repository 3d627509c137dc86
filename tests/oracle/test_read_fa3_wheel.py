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


def _listing(offsets, fields):
    """A get_num_splits listing that reads ``fields`` at ``offsets`` (one ``mov 0xOFF(%rdi),...`` line each)."""
    return "\n".join(f"  1234:\tmov    {offsets[f]:#x}(%rdi),%eax" for f in fields)


def test_the_params_layout_is_the_one_whose_offsets_get_num_splits_reads():
    mod = _module()
    for name, offsets in mod.LAYOUTS.items():
        assert mod.choose_layout(_listing(offsets, mod.NUM_SPLITS_READS)) == name
    # vLLM 0.10.1 .. 0.16.0's library reads is_e4m3/is_causal/is_local at 602-604 and arch/num_sm at 636/640
    # (the fork's flash.h before 5824e6e2); 0.17.0 .. 0.18.1's arch/num_sm at 668/672
    assert [mod.LAYOUTS["fork-8f468e7d"][f] for f in ("is_e4m3", "is_causal", "is_local", "arch", "num_sm")] == \
        [602, 603, 604, 636, 640]
    assert [mod.LAYOUTS["fork-5824e6e2"][f] for f in ("num_splits_dynamic_ptr", "arch", "num_sm")] == [632, 668, 672]
    assert [mod.LAYOUTS["upstream-0251105a"][f] for f in ("is_e4m3", "arch", "num_sm")] == [610, 676, 680]


def test_negative_control_a_listing_missing_one_field_has_no_layout_and_the_script_refuses_it():
    mod = _module()
    offsets = mod.LAYOUTS["fork-8f468e7d"]
    body = _listing(offsets, [f for f in mod.NUM_SPLITS_READS if f != "num_sm"])
    assert mod.choose_layout(body) is None
    rules = {"params_layout": None, "get_num_splits_reads": [f for f in mod.NUM_SPLITS_READS if f != "num_sm"]}
    try:
        mod.check_layout(rules)
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("check_layout accepted a listing that reads num_sm at no known offset")


def test_a_bare_library_needs_the_wheel_it_came_from(tmp_path):
    so = tmp_path / "fa3.so"
    so.write_bytes(b"\x7fELF")
    r = subprocess.run([sys.executable, str(SCRIPT), str(so)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--wheel-name" in r.stderr and "--wheel-sha256" in r.stderr
    assert "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, str(SCRIPT), str(so), "--wheel-name", "w.whl", "--wheel-sha256", "xyz",
                        "--package", "vllm", "--version", "0.13.0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--wheel-sha256: must be 64 lowercase hex digits" in r.stderr
