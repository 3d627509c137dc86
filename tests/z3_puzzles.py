"""Hard z3 queries for the prover's bound and interrupt tests (not a test module)."""

from __future__ import annotations

from spec.theorems import z3ctx


def pigeonhole(s, pigeons: int, tag: str = "") -> None:
    """Add pigeons-into-(pigeons - 1)-holes to `s`: unsat, and far more work than a few milliseconds of z3's search.
    Terms are built in the current theorem context (spec.theorems.z3ctx), so a fresh context gives a fresh copy."""
    import z3

    holes = pigeons - 1
    x = [[z3ctx.Bool(f"{tag}p{i}h{j}") for j in range(holes)] for i in range(pigeons)]
    for i in range(pigeons):
        s.add(z3.Or(x[i]))
    for j in range(holes):
        for i in range(pigeons):
            for k in range(i + 1, pigeons):
                s.add(z3.Not(z3.And(x[i][j], x[k][j])))
