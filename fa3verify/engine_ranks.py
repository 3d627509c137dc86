"""``run-ranks --engine X`` on a real engine: the case runs in-process on the engine, and the output says so.

Invariant: run-ranks never reports a multi-process result it did not produce. One process per attention rank
(``fa3verify.multirank``) drives our model only; a real engine's worker runs every attention rank of a
scenario in one process (``gpu_impl.engines``: the per-rank parallel layout is set through the release's own
API, collectives are not exercised). So with a real engine each case is replayed in-process on it
(``fa3verify.commands.replay.replay``) and every line of output names that.
"""

from __future__ import annotations

from . import exitcodes
from .errors import UsageError

NOTE = ("note: one process per attention rank is not available for real engines; every attention rank of the "
        "case ran in-process in {spec}'s engine worker (per-rank layout set through the release's own API, no "
        "collectives exercised)")


def run_on_engine(args) -> int:
    """Replay each case in-process on ``args.engine``; exit 1 if any still fails, 0 if all pass."""
    from .engine_choice import open_engine, parse_engine_option, start_engine
    from .finding_terms import print_backend_terms
    from .commands.replay import replay
    from .summary import RunSummary, write_json

    spec = parse_engine_option(args.engine)
    if args.compare:
        raise UsageError(f"--compare: compares processes with the in-process run; with --engine {spec} the case "
                         f"runs in-process only, so there is nothing to compare")
    print(NOTE.format(spec=spec))
    ignored = [o for o, given in (("--world", args.world is not None), ("--backend", args.backend != "gloo"),
                                  ("--out-dir", args.out_dir is not None)) if given]
    if ignored:
        verb = "applies" if len(ignored) == 1 else "apply"
        print(f"note: {', '.join(ignored)} {verb} to the multi-process run only; ignored here")
    total = RunSummary(command="run-ranks")
    codes = []
    with open_engine(spec) as sut:
        start_engine(sut, "run-ranks")  # its own progress line on stderr, as the other commands' engines
        for path in args.cases:
            summary, observed = replay(path, sut=sut, numerics=False if args.metadata_only else None)
            print(f"case: {path}  (in-process on {spec})")
            print(f"  observed: {observed.outcome}" + (f" ({', '.join(observed.invariants)})"
                                                       if observed.invariants else ""))
            for f in observed.findings[:5]:
                print(f"  {f.invariant} at step {f.step}, dp rank {f.dp_rank}: {str(f.message)[:160]}")
            if summary.findings:
                print_backend_terms(summary.findings[0])
            codes.append(exitcodes.VIOLATION if observed.findings else exitcodes.PASS)
            total.merge(summary)
    total.cases = len(args.cases)
    from .outputs import deliver

    return deliver(exitcodes.combine(codes), [("--json", args.json, lambda: write_json(total, args.json))],
                   "run-ranks")
