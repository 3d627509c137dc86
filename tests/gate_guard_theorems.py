"""``python tests/gate_guard_theorems.py ARGS...``: the command line with every prove stage cut to the theorems
that evaluate the guard (prefill-cp-hazard and 4-guard-*), for tests whose subject is what surrounds the proofs (a guard
that ends its process, the CI script's artifacts), not the other theorems: everything else is the real command."""

import inspect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fa3verify.commands.prove as proving  # noqa: E402

GUARD_THEOREMS = ["prefill-cp-hazard", "4-guard"]


def cut_prove_stage() -> None:
    """Make ``fa3verify.commands.prove.theorem_results`` run only :data:`GUARD_THEOREMS`."""
    real = proving.theorem_results
    signature = inspect.signature(real)

    def guard_theorems_only(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments["only"] = GUARD_THEOREMS
        return real(*bound.args, **bound.kwargs)

    proving.theorem_results = guard_theorems_only


if __name__ == "__main__":
    cut_prove_stage()
    from fa3verify.cli import main

    sys.exit(main(sys.argv[1:]))
