"""Layering: refmodel at the bottom, spec on refmodel, gpu_impl on both, fa3verify on all; nothing imports upward."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


def private_imports(path: Path, module: str) -> list:
    """``from M import _name`` lines of a module whose M is another module of the project (a private name is the
    defining module's own: make it public, or move the code)."""
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target.split(".")[0] not in PROJECT or target == module:
            continue
        found += [f"{target}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def names_matched_by_string(path: Path) -> list:
    """Comparisons of a class's ``__name__`` with a string (``type(exc).__name__ == "EngineUnavailable"``): an
    exception or type matched by name matches any class of that name and misses a renamed one; use isinstance."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any(isinstance(s, ast.Attribute) and s.attr == "__name__" for s in sides)
        strings = [s for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)
                   or isinstance(s, (ast.Tuple, ast.List, ast.Set)) and s.elts
                   and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in s.elts)]
        main_guard = any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)
        if named and strings and not main_guard:
            found.append(f"line {node.lineno}")
    return found


def _modules():
    for package in ALLOWED:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path, ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def snippet(tmp_path, *lines: str) -> Path:
    """A module holding ``lines``: the input of a rule's negative control."""
    path = tmp_path / "x.py"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def offences(rule, paths) -> list:
    """"path where" for every place a rule (a function of one file's path) finds in ``paths``."""
    return [f"{path.relative_to(ROOT)} {where}" for path in paths for where in rule(path)]


def test_no_module_imports_another_modules_private_names():
    bad = [f"{path.relative_to(ROOT)} imports {name}" for path, module in _modules()
           for name in private_imports(path, module)]
    assert not bad, "\n".join(bad)


def test_a_private_import_across_modules_is_detected(tmp_path):
    bad = snippet(tmp_path, "from .scenario import _seed, jsonable", "from spec.model.guards import _load",
                  "from . import _own", "from typing import _T")
    assert private_imports(bad, "gpu_impl.x") == ["gpu_impl.scenario._seed", "spec.model.guards._load", "gpu_impl._own"]


def test_no_exception_or_type_is_matched_by_its_name():
    bad = offences(names_matched_by_string, [path for path, _ in _modules()])
    assert not bad, "\n".join(bad)


def test_a_name_match_is_detected(tmp_path):
    bad = snippet(tmp_path, "ok = __name__ == '__main__'", "a = type(exc).__name__ == 'EngineUnavailable'",
                  "b = any(c.__name__ in ('X', 'Y') for c in type(exc).__mro__)", "c = isinstance(exc, ValueError)")
    assert names_matched_by_string(bad) == ["line 2", "line 3"]


#: The project's one finding type (spec.finding.Finding: what a check found broken and what every report says of
#: it; spec.violation.Violation is the same class, by name); a class whose name ends in either suffix is a second.
ONE_CLASS_EACH = ("Violation", "Finding")


def classes_by_suffix(root: Path) -> dict:
    """{suffix: ["path:line Name", ...]} of the classes in the project packages under ``root`` whose name ends in
    a suffix of :data:`ONE_CLASS_EACH`."""
    found = {suffix: [] for suffix in ONE_CLASS_EACH}
    for package in ALLOWED:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    for suffix in ONE_CLASS_EACH:
                        if node.name.endswith(suffix):
                            found[suffix].append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    return found


ONE_FINDING = {"Violation": 0, "Finding": 1}


def test_one_finding_class_and_no_violation_class_beside_it():
    found = classes_by_suffix(ROOT)
    assert {suffix: len(where) for suffix, where in found.items()} == ONE_FINDING, found
    assert found["Finding"] == [f"spec/finding.py:{found['Finding'][0].split(':')[1].split()[0]} Finding"], found


def test_a_second_violation_or_finding_class_is_detected(tmp_path):
    (tmp_path / "spec").mkdir()
    (tmp_path / "spec" / "invariants.py").write_text("class Violation:\n    pass\n")
    (tmp_path / "gpu_impl" / "kernels").mkdir(parents=True)
    (tmp_path / "gpu_impl" / "kernels" / "plan_checks.py").write_text(
        "from dataclasses import dataclass\n\n\n@dataclass\nclass PlanViolation:\n    invariant: str\n")
    (tmp_path / "gpu_impl" / "scenario.py").write_text("class StepFinding:\n    pass\n")
    (tmp_path / "fa3verify").mkdir()
    (tmp_path / "fa3verify" / "summary.py").write_text("class Finding:\n    pass\n\n\nclass FindingTerms:\n    pass\n")
    found = classes_by_suffix(tmp_path)
    assert found == {"Violation": ["spec/invariants.py:1 Violation", "gpu_impl/kernels/plan_checks.py:5 PlanViolation"],
                     "Finding": ["gpu_impl/scenario.py:1 StepFinding", "fa3verify/summary.py:1 Finding"]}
    assert {suffix: len(where) for suffix, where in found.items()} != ONE_FINDING


#: What names an engine's kind in text: the registry's kinds (gpu_impl/engine_forms.json).
ENGINE_NAMES = {"model", "sglang", "vllm", "sglang-src", "vllm-src", "sut"}
KIND_FLAGS = {"is_model", "is_source"}


def engine_kind_branches(path: Path) -> list:
    """Where the harness asks what kind of engine it holds instead of asking the engine: a ``.kind`` or
    ``.engine`` compared with an engine's name, ``.is_model`` / ``.is_source`` (also through ``getattr``), or
    ``startswith("sglang...")`` / ``startswith("vllm...")`` on engine text. The system under test and its
    registry row (``gpu_impl.sut.EngineSpec``) answer every such question."""
    def names_engine(node) -> bool:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value in ENGINE_NAMES
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_engine(e) for e in node.elts)
        return False

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr in ("kind", "engine") for s in sides) \
                    and any(names_engine(s) for s in sides):
                found.append(f"line {node.lineno}: compares an engine's kind")
        elif isinstance(node, ast.Attribute) and node.attr in KIND_FLAGS:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in KIND_FLAGS:
            found.append(f"line {node.lineno}: getattr {node.args[1].value}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                and node.args[0].value.startswith(("sglang", "vllm")):
            found.append(f"line {node.lineno}: startswith({node.args[0].value!r})")
    return found


def test_the_harness_has_no_engine_kind_branches():
    bad = offences(engine_kind_branches, sorted((ROOT / "fa3verify").rglob("*.py")))
    assert not bad, "\n".join(bad)


def test_an_engine_kind_branch_is_detected(tmp_path):
    bad = snippet(tmp_path, "a = spec.kind == 'sglang'", "b = sut.spec.is_model", "c = text.startswith('vllm==')",
                  "d = sut.spec.engine in ('vllm', 'sglang')", "e = getattr(engine, 'is_source', False)",
                  "ok = panel.kind == 'dp' or res.kind == 'timeout' or spec.runs_scenario_policy",
                  "ok2 = name.startswith('gpu_impl.engines')")
    assert [w.split(":")[0] for w in engine_kind_branches(bad)] == ["line 1", "line 2", "line 3", "line 4", "line 5"]
