"""Count import statements inside function bodies under a package folder (an AST walk: every ``import`` or
``from ... import`` with a ``def`` or ``lambda`` above it), against all import statements there.

    python3 scripts/function_imports.py fa3verify            # "N of M import statements inside functions (P%)"
    python3 scripts/function_imports.py fa3verify --files    # and the count per file, most first
"""

from __future__ import annotations

import ast
import pathlib
import sys


def count(root: pathlib.Path) -> tuple:
    """(imports inside functions, all imports, {file: imports inside functions})."""
    inside = total = 0
    per: dict = {}

    def walk(node, in_def: bool, path: str) -> None:
        nonlocal inside, total
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                total += 1
                if in_def:
                    inside += 1
                    per[path] = per.get(path, 0) + 1
            walk(child, in_def or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)), path)

    for f in sorted(root.rglob("*.py")):
        walk(ast.parse(f.read_text(encoding="utf-8")), False, f.as_posix())
    return inside, total, per


def main(argv) -> int:
    if not argv or not pathlib.Path(argv[0]).is_dir():
        print(__doc__, file=sys.stderr)
        return 2
    inside, total, per = count(pathlib.Path(argv[0]))
    print(f"{inside} of {total} import statements inside functions ({100 * inside / max(total, 1):.0f}%)")
    if "--files" in argv:
        for path, n in sorted(per.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"{n:4d} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
