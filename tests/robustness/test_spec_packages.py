"""spec/ is three packages by concept with no import cycle: `process` (worker processes, deadlines, interrupts) at
the bottom, the data model `model` (configurations, the backend's guard, engine profiles, case files) on it, and
`theorems` (the catalogue and every z3 theorem) on both; spec.invariants and spec.violation sit beside them."""

import ast
from pathlib import Path

from spec.theorems import CATALOGUE, GROUPS, THEOREMS, Theorem

ROOT = Path(__file__).resolve().parents[2]
#: package -> the spec packages it may import (besides itself and spec's top-level modules)
PACKAGES = {"process": set(), "model": {"process"}, "theorems": {"process", "model"}}


def module_graph(root: Path, top: str = "spec") -> dict:
    """Module -> the project modules it imports (at the top or inside functions alike)."""
    mods = {}
    for path in sorted((root / top).rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in mods.items():
        base = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                b = base
                for _ in range(max(node.level - 1, 0)):
                    b = b.rpartition(".")[0]
                full = (b + ("." + node.module if node.module else "")) if node.level else (node.module or "")
                deps |= {c for c in [full] + [f"{full}.{a.name}" for a in node.names] if c in mods and c != name}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in mods and a.name != name}
        graph[name] = deps
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_spec_has_no_import_cycle():
    assert cycles(module_graph(ROOT)) == []


def test_an_import_cycle_is_found(tmp_path):
    pkg = tmp_path / "spec" / "model"
    pkg.mkdir(parents=True)
    (tmp_path / "spec" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from spec.model.b import g\n")
    (pkg / "b.py").write_text("from . import a\n")
    assert cycles(module_graph(tmp_path)) == [["spec.model.a", "spec.model.b"]]


def test_spec_packages_import_only_downward():
    bad = []
    for name, deps in module_graph(ROOT).items():
        parts = name.split(".")
        if len(parts) < 3 or parts[1] not in PACKAGES:
            continue
        for dep in deps:
            target = dep.split(".")
            if len(target) >= 2 and target[1] in PACKAGES and target[1] != parts[1] \
                    and target[1] not in PACKAGES[parts[1]]:
                bad.append(f"{name} imports {dep}")
    assert not bad, "\n".join(bad)


def test_every_theorem_is_a_value_with_its_sources_and_a_group_that_builds_it():
    assert len(CATALOGUE) == len(THEOREMS) == len({t.name for t in CATALOGUE})
    for t in CATALOGUE:
        assert isinstance(t, Theorem)
        assert t.statement and t.models and all(isinstance(m, str) and m for m in t.models), t.name
        assert t.group in GROUPS, t.name
    assert [t.group for t in CATALOGUE] == sorted((t.group for t in CATALOGUE), key=list(GROUPS).index), \
        "the catalogue runs group by group, in GROUPS' order"
