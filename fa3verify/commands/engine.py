"""fa3verify engine: set up a release's engine environment, or gate every release (the engine matrix)."""

from __future__ import annotations

import argparse
import json

HELP = "engine environments (setup) and the gate over every sglang release (matrix)"
EPILOG = """\
examples:
  fa3verify engine setup sglang==0.5.23          # create (or reuse) the cached environment for that release
  fa3verify engine setup vllm==0.33.0            # the same for a vLLM release
  fa3verify engine matrix --budget-s 10 --json matrix.json
  fa3verify engine matrix --releases 0.5.12..0.5.16 --cases 100
  fa3verify engine matrix --cases 100 --shard 1/4 --json m1.json   # a quarter of the releases; `report merge`
"""


def register(sub) -> None:
    p = sub.add_parser("engine", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    inner = p.add_subparsers(dest="engine_command", metavar="ACTION")
    s = inner.add_parser("setup", help="create or reuse the isolated environment of an sglang or vLLM release")
    s.add_argument("release", metavar="ENGINE==V", help="the release, e.g. sglang==0.5.23 or vllm==0.33.0")
    s.set_defaults(func=run_setup)
    m = inner.add_parser("matrix", help="gate every release and print one row each")
    m.add_argument("--releases", default=None, metavar="A..B",
                   help="releases to gate, e.g. 0.5.11..0.5.23 (default: every profiled release)")
    group = m.add_mutually_exclusive_group()
    group.add_argument("--budget-s", type=float, metavar="N", help="fuzz budget per release in seconds (default 20)")
    group.add_argument("--cases", type=int, metavar="N", help="fuzz case count per release instead")
    m.add_argument("--seed", type=int, default=0, help="fuzz seed (default 0)")
    from ..sharding import add_shard_argument

    add_shard_argument(m, "releases (in release order)")
    m.add_argument("--timeout-s", type=float, default=10.0, help="z3 timeout of the witness search (default 10)")
    m.add_argument("--cases-dir", default="fa3verify-out/engine-matrix", metavar="DIR",
                   help="where each release's findings go (one folder per release)")
    m.add_argument("--json", metavar="PATH", help="write the matrix as JSON (schema fa3verify.engine-matrix/1)")
    m.add_argument("--markdown", action="store_true", help="also print the matrix as a Markdown table")
    m.add_argument("--no-probes", action="store_true",
                   help="skip the family probes (the worked example under prefill CP and DP attention, eager and "
                        "CUDA graph) run on each release beside its gate")
    m.add_argument("--no-setup", action="store_true",
                   help="report releases without a ready environment as unavailable instead of building them")
    m.set_defaults(func=run_matrix)
    p.set_defaults(func=lambda args: _no_action(p))


def _no_action(parser) -> int:
    from .. import exitcodes

    parser.print_help()
    return exitcodes.USAGE


def _release_of(text: str, option: str) -> str:
    from spec.model.engine_profiles import ProfileError, profile_for, release_named

    from ..errors import UsageError

    release = release_named(text)
    if release is None:
        want = "sglang==V or vllm==V (e.g. sglang==0.5.23)" if option == "ENGINE==V" else "sglang==V (e.g. sglang==0.5.23)"
        raise UsageError(f"{option}: want {want}, got {text!r}")
    try:
        profile_for(release)
    except ProfileError as exc:
        try:
            from gpu_impl.engines.envs import next_step
        except ModuleNotFoundError:  # real engines are not available: the profile's message alone
            raise UsageError(f"{option}: {exc}") from None
        raise UsageError(f"{option}: {exc}; {next_step('sglang', release)}") from None
    return release


def run_setup(args) -> int:
    from .. import exitcodes
    from ..errors import UsageError

    from spec.model.engine_profiles import release_named

    vllm_release = release_named(args.release, "vllm")
    if vllm_release is not None:
        engine, release = "vllm", vllm_release
    else:
        engine, release = "sglang", _release_of(args.release, "ENGINE==V")
    try:
        from gpu_impl.engines import envs
        from gpu_impl.engines.errors import EngineUnavailable
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("gpu_impl.engines"):
            raise UsageError("ENGINE==V: real engines are not available in this checkout "
                             f"(no module {exc.name})") from None
        raise
    try:
        extra = {} if vllm_release is None else {"engine": engine}
        path = envs.ensure_env(release, progress=lambda line: print(line, flush=True), **extra)
    except Exception as exc:
        if isinstance(exc, (EngineUnavailable, ValueError)):  # unknown release, failed set-up, bad name
            raise UsageError(str(exc) if str(exc).startswith(f"{engine}==") else f"{engine}=={release}: {exc}") from None
        raise
    print(f"engine environment for {engine} {release}: {path}")
    return exitcodes.PASS


def parse_releases(text):
    """The releases an ``A..B`` range (or one release) names, among the profiled ones; UsageError otherwise."""
    from spec.model.engine_profiles import ProfileError, profile_for, releases_between

    from ..errors import UsageError

    if not text:
        return releases_between()
    first, sep, last = text.partition("..")
    try:
        for r in (first, last) if sep else (first,):
            profile_for(r)
        releases = releases_between(first, last if sep else first)
    except ProfileError as exc:
        raise UsageError(f"--releases: {exc}") from None
    if not releases:
        raise UsageError(f"--releases: {text!r} names no profiled release")
    return releases


def run_matrix(args) -> int:
    from ..engine_choice import open_engine
    from ..engine_matrix import matrix_exit_code, matrix_json, matrix_markdown, matrix_table, matrix_verdict_line
    from ..engine_matrix import run_matrix as matrix
    from ..errors import UsageError
    from .arguments import budget_from_args

    from ..sharding import parse_shard

    releases = parse_releases(args.releases)
    shard = parse_shard(args.shard)
    if shard is not None:
        if shard.k > len(releases):
            raise UsageError(f"--shard: shard {shard} owns none of the {len(releases)} releases "
                             f"({releases[0]}..{releases[-1]}); want K <= {len(releases)}")
        everything, releases = releases, shard.pick(releases)
    budget, cases = budget_from_args(args)
    if not args.timeout_s > 0:
        raise UsageError(f"--timeout-s: must be > 0, got {args.timeout_s}")
    def open_release(release):
        if args.no_setup:
            from gpu_impl.engines import envs

            if not envs.env_ready(release):
                raise UsageError(f"no ready environment (--no-setup); `fa3verify engine setup sglang=={release}`")
        return open_engine(f"sglang=={release}")

    rows = matrix(releases, open_release, budget_s=budget, max_cases=cases,
                  seed=args.seed, timeout_s=args.timeout_s, cases_dir=args.cases_dir,
                  progress=_progress_line, with_probes=not args.no_probes)
    print(matrix_markdown(rows) if args.markdown else matrix_table(rows))
    from ..outputs import deliver, write_output

    data = matrix_json(rows)
    if shard is not None:
        data["shard"] = shard.to_dict({"command": "engine matrix", "releases": everything, "seed": args.seed,
                                       "cases": cases, "budget_s": budget, "timeout_s": args.timeout_s,
                                       "probes": not args.no_probes})
    code = matrix_exit_code(rows)
    print(matrix_verdict_line(rows, code) + (f" | shard {shard}" if shard is not None else ""))
    return deliver(code, [("--json", args.json,
                           lambda: write_output(args.json, json.dumps(data, indent=2) + "\n", "--json"))],
                   "engine matrix")


def _progress_line(line: str) -> None:
    """The matrix's progress (a line per stage and per release) goes to stderr, never into stdout's table."""
    import sys

    print(f"fa3verify engine matrix: {line}", file=sys.stderr, flush=True)
