"""fa3verify: command line and harness of fa3-verify (prove, fuzz, replay, gate, bench, reports).

Nothing in the project imports this package; it sits on spec, refmodel and gpu_impl.
"""

__version__ = "0.1.0"
