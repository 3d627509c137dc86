"""The numerics check (NaN or infinity in an output, closeness to the oracle under FA3's rule, and their messages) is
written once, in ``gpu_impl/oracle_check.py``: no other module of spec, gpu_impl or fa3verify tests a tensor for NaN or
infinity or compares it with a reference itself. refmodel is not scanned: it is the oracle and the rule
(``refmodel.attention``, ``refmodel.tolerance``, and FA3's own NaN handling in ``refmodel.combine``)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("spec", "gpu_impl", "fa3verify")
HOME = "gpu_impl/oracle_check.py"

#: Calls that test values for NaN or infinity, or compare them with a reference.
CHECKS = {"isnan", "isinf", "isneginf", "isposinf", "isfinite", "allclose", "isclose", "fa3_output_close"}
#: ``math.isnan`` / ``math.isinf`` / ``math.isfinite`` test one Python float (an argument, a JSON number, a z3 model
#: of FA3's float rules), never an output: not a numerics check.
SCALAR = {"isnan", "isinf", "isfinite"}


def numerics_checks(source: str) -> list:
    """Each call in ``source`` that checks values for NaN/infinity or closeness, as ``ast.unparse`` writes it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name not in CHECKS:
            continue
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "math" \
                and name in SCALAR:
            continue
        found.append(ast.unparse(node))
    return found


def test_the_numerics_check_is_written_once():
    bad = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel != HOME:
                bad += [f"{rel}: {c}" for c in numerics_checks(path.read_text())]
    assert not bad, "call gpu_impl.oracle_check instead:\n" + "\n".join(bad)
    assert numerics_checks((ROOT / HOME).read_text()), "the scan no longer sees the check it protects"


def test_a_second_numerics_check_is_found():
    seeded = ("import math, torch\n"
              "def judge(out, ref, x):\n"
              "    if torch.isnan(out).any() or out.isinf().any():\n"
              "        return 'nan'\n"
              "    ok = torch.allclose(out, ref, atol=1e-2) and fa3_output_close(out, ref, ref)[0]\n"
              "    return ok and math.isfinite(x) and math.isclose(x, 1.0)\n")
    assert sorted(numerics_checks(seeded)) == sorted(["torch.isnan(out)", "out.isinf()", "math.isclose(x, 1.0)",
                                                      "torch.allclose(out, ref, atol=0.01)",
                                                      "fa3_output_close(out, ref, ref)"])
