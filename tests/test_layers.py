"""Layering: refmodel at the bottom, spec on refmodel, gpu_impl on both, fa3verify on all; nothing imports upward."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "refmodel": {"refmodel"},
    "spec": {"refmodel", "spec"},
    "gpu_impl": {"refmodel", "spec", "gpu_impl"},
    "fa3verify": {"refmodel", "spec", "gpu_impl", "fa3verify"},
}
PROJECT = set(ALLOWED)


def imported_packages(path: Path, package: str) -> set:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add(package if node.level else (node.module or "").split(".")[0])
    return found & PROJECT


def test_no_package_imports_upward():
    bad = []
    for package, allowed in ALLOWED.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for target in imported_packages(path, package) - allowed:
                bad.append(f"{path.relative_to(ROOT)} imports {target}")
    assert not bad, "\n".join(bad)


def test_an_upward_import_is_detected(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nfrom fa3verify.cli import main\nfrom . import prepare\n")
    assert imported_packages(bad, "refmodel") - ALLOWED["refmodel"] == {"fa3verify"}
