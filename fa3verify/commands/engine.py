"""fa3verify engine: set up a release's engine environment, or gate every release (the engine matrix)."""

from __future__ import annotations

import argparse
import json
import sys

from gpu_impl.plugin import engine_phrases, release_forms, release_spec

from .arguments import with_engine_examples
from ..errors import UsageError
from ..outputs import deliver, write_output

HELP = ("engine environments (setup), the gate over every release of an engine (matrix) and the fix releases of a "
        "sharded matrix (fixes)")
EPILOG = """\
examples:
{engine.setup}  fa3verify engine matrix --budget-s 10 --json matrix.json
  fa3verify engine matrix --releases 0.5.12..0.5.16 --cases 100
{engine.matrix}  fa3verify engine matrix --jobs 2 --json matrix.json   # two releases at a time, each lane its own process
  fa3verify engine matrix --cases 100 --shard 1/4 --json m1.json   # a quarter of the releases; `report merge`
  fa3verify engine fixes merged.json --json merged-fixes.json   # after `report merge`: the fix releases across shards
"""


#: --jobs: the lanes of `engine matrix` (each a process holding one release's engine)
JOBS_RANGE = (1, 32)


def register(sub) -> None:
    p = sub.add_parser("engine", help=HELP, description=HELP, epilog=with_engine_examples(EPILOG),
                       formatter_class=argparse.RawDescriptionHelpFormatter)

    kinds = [row["kind"] for row in release_forms()]
    inner = p.add_subparsers(dest="engine_command", metavar="ACTION")
    s = inner.add_parser("setup", help=f"create or reuse the isolated environment of an "
                                       f"{' or '.join(engine_phrases('name'))} release")
    s.add_argument("release", metavar="ENGINE==V",
                   help=f"the release, e.g. {' or '.join(row['example'] for row in release_forms())}")
    s.set_defaults(func=run_setup)
    m = inner.add_parser("matrix", help="gate every release and print one row each, then each failing row's fix "
                                        "release")
    m.add_argument("--engine", default=kinds[0], metavar="ENGINE",
                   help=f"whose releases: an engine form that takes a release ({' or '.join(kinds)}; default "
                        f"{kinds[0]})")
    m.add_argument("--releases", default=None, metavar="A..B",
                   help=f"releases to gate, e.g. {' or '.join(engine_phrases('release range'))} (default: every "
                        f"release the engine lists: {', '.join(engine_phrases('matrix releases'))})")
    group = m.add_mutually_exclusive_group()
    group.add_argument("--budget-s", type=float, metavar="N", help="fuzz budget per release in seconds (default 20)")
    group.add_argument("--cases", type=int, metavar="N", help="fuzz case count per release instead")
    m.add_argument("--seed", type=int, default=0, help="fuzz seed (default 0)")
    from ..sharding import add_shard_argument

    add_shard_argument(m, "releases (in release order)")
    m.add_argument("--jobs", type=int, default=1, metavar="N",
                   help=f"releases gated side by side, each lane its own process ({JOBS_RANGE[0]}..{JOBS_RANGE[1]}; "
                        f"default 1: one release at a time in this process); the rows and fix releases are those of "
                        f"one lane, each release's fuzz budget its own")
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
    m.add_argument("--no-fixes", action="store_true",
                   help="skip the fix releases (each failing row's case files replayed on its own release and on "
                        "every later one)")
    m.set_defaults(func=run_matrix)
    f = inner.add_parser("fixes", help="complete the fix releases of a merged sharded matrix: each failing family's "
                                       "case files replayed on the later releases other shards gated")
    f.add_argument("matrix", metavar="MATRIX.json",
                   help="a matrix joined by `fa3verify report merge` from shards run with --json (and without "
                        "--no-fixes)")
    f.add_argument("--json", metavar="PATH", help="write the matrix with its fix releases completed (same schema)")
    f.add_argument("--markdown", action="store_true", help="print the fix releases as a Markdown table")
    f.add_argument("--no-setup", action="store_true",
                   help="give NOT RUN on releases without a ready environment instead of building them")
    f.set_defaults(func=run_fixes)
    p.set_defaults(func=lambda args: _no_action(p))


def _no_action(parser) -> int:
    from .. import exitcodes

    parser.print_help()
    return exitcodes.USAGE


def _release_spec(text: str, option: str):
    """The EngineSpec ``ENGINE==V`` names (a form that takes a release) if its plugin can set V up
    (``check_setup_release``: its message, and what to run instead); UsageError otherwise."""
    spec = release_spec(text)
    if spec is None:
        forms = [row["prefix"] + "V" for row in release_forms()]
        raise UsageError(f"{option}: want {' or '.join(forms)} (e.g. {release_forms()[0]['example']}), got {text!r}")
    try:
        spec.plugin.check_setup_release(spec.release)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None
    return spec


def run_setup(args) -> int:
    from .. import exitcodes

    spec = _release_spec(args.release, "ENGINE==V")
    engine, release = spec.kind, spec.release
    try:
        from gpu_impl.engines import envs
        from gpu_impl.engines.errors import EngineUnavailable
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("gpu_impl.engines"):
            raise UsageError("ENGINE==V: real engines are not available in this checkout "
                             f"(no module {exc.name})") from None
        raise
    try:
        path = envs.ensure_env(release, progress=lambda line: print(line, flush=True), engine=engine)
    except Exception as exc:
        if isinstance(exc, (EngineUnavailable, ValueError)):  # unknown release, failed set-up, bad name
            raise UsageError(str(exc) if str(exc).startswith(f"{engine}==") else f"{engine}=={release}: {exc}") from None
        raise
    print(f"engine environment for {engine} {release}: {path}")
    return exitcodes.PASS


def engine_releases(engine: str) -> list:
    """``(release, runs_as)`` of every release the matrix gates for ``engine`` (``gpu_impl.sut.releases_of``);
    UsageError naming --engine and the allowed kinds otherwise."""
    from gpu_impl.sut import EngineSpecError, releases_of

    try:
        return releases_of(engine)
    except EngineSpecError as exc:
        raise UsageError(str(exc)) from None
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("gpu_impl.engines"):
            raise UsageError(f"--engine: {engine}: real engines are not available in this checkout "
                             f"(no module {exc.name})") from None
        raise


def parse_releases(text, engine: str):
    """The releases an ``A..B`` range (or one release) names among those the matrix gates for ``engine``; each end
    must be one of them (a release's profile error explains one that is not); UsageError otherwise."""
    from gpu_impl.sut import ENGINE_REGISTRY

    from gpu_impl.plugin import engine_profile_for

    listed = [r for r, _ in engine_releases(engine)]
    if not text:
        return listed
    first, sep, last = text.partition("..")
    ends = []
    for r in (first, last) if sep else (first,):
        if r in listed:
            ends.append(r)
            continue
        try:
            found = engine_profile_for(ENGINE_REGISTRY[engine]["prefix"] + r)[1].release
        except ValueError as exc:
            raise UsageError(f"--releases: {exc}") from None
        if found not in listed:
            raise UsageError(f"--releases: {r!r} is not a {engine} release the matrix gates "
                             f"({', '.join(listed) or 'none'})")
        ends.append(found)
    lo, hi = listed.index(ends[0]), listed.index(ends[-1])
    if lo > hi:
        raise UsageError(f"--releases: release range {text} is empty (first is after last)")
    return listed[lo:hi + 1]


def release_opener(engine: str, no_setup: bool):
    """``open_release(release)``: the release's engine opened as the matrix opens it; with ``no_setup`` a release
    without a ready environment is a UsageError naming the setup command instead of a build."""
    from ..engine_choice import open_engine
    from gpu_impl.sut import ENGINE_REGISTRY

    prefix = ENGINE_REGISTRY[engine]["prefix"]
    runs_as = dict(engine_releases(engine))

    def open_release(release):
        if no_setup:
            from gpu_impl.engines import envs

            if not envs.env_ready(runs_as.get(release) or release, engine=engine):
                raise UsageError(f"no ready environment (--no-setup); `fa3verify engine setup {prefix}{release}`")
        return open_engine(f"{prefix}{release}")

    return open_release


def run_matrix(args) -> int:
    from ..engine_matrix import matrix_exit_code, matrix_json, matrix_markdown, matrix_table, matrix_verdict_line
    from ..matrix_lanes import run_matrix as matrix
    from .arguments import budget_from_args

    from ..sharding import parse_shard

    releases = parse_releases(args.releases, args.engine)
    runs_as = dict(engine_releases(args.engine))
    shard = parse_shard(args.shard)
    if shard is not None:
        if shard.k > len(releases):
            raise UsageError(f"--shard: shard {shard} owns none of the {len(releases)} releases "
                             f"({releases[0]}..{releases[-1]}); want K <= {len(releases)}")
        everything, releases = releases, shard.pick(releases)
    budget, cases = budget_from_args(args)
    if not args.timeout_s > 0:
        raise UsageError(f"--timeout-s: must be > 0, got {args.timeout_s}")
    if not JOBS_RANGE[0] <= args.jobs <= JOBS_RANGE[1]:
        raise UsageError(f"--jobs: must be in {JOBS_RANGE[0]}..{JOBS_RANGE[1]}, got {args.jobs}")
    open_release = release_opener(args.engine, args.no_setup)
    fixes = None if args.no_fixes else []
    rows = matrix(releases, open_release, budget_s=budget, max_cases=cases,
                  seed=args.seed, timeout_s=args.timeout_s, cases_dir=args.cases_dir,
                  progress=progress_line, with_probes=not args.no_probes, engine=args.engine,
                  runs_as=runs_as, fixes=fixes, jobs=args.jobs, no_setup=args.no_setup)
    print(matrix_markdown(rows) if args.markdown else matrix_table(rows))
    if fixes is not None:
        from ..matrix_fixes import fixes_markdown, fixes_table

        print(("\n" + fixes_markdown(fixes)) if args.markdown and fixes else fixes_table(fixes))

    data = matrix_json(rows, fixes)
    if shard is not None:
        data["shard"] = shard.to_dict({"command": "engine matrix", "engine": args.engine, "releases": everything,
                                       "seed": args.seed,
                                       "cases": cases, "budget_s": budget, "timeout_s": args.timeout_s,
                                       "probes": not args.no_probes})
    code = matrix_exit_code(rows)
    print(matrix_verdict_line(rows, code) + (f" | shard {shard}" if shard is not None else ""))
    return deliver(code, [("--json", args.json,
                           lambda: write_output(args.json, json.dumps(data, indent=2) + "\n", "--json"))],
                   "engine matrix")


FIXES_FIELD = "MATRIX.json"


def load_merged_matrix(path: str) -> dict:
    """A merged matrix report with fix entries, checked before anything runs (UsageError naming the field)."""
    from ..engine_matrix import SCHEMA
    from ..outputs import read_json

    data = read_json(path, FIXES_FIELD)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise UsageError(f"{FIXES_FIELD}: {path}: expected a matrix report of schema {SCHEMA}")
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and isinstance(r.get("release"), str)
                                                         and isinstance(r.get("engine"), str) for r in rows):
        raise UsageError(f"{FIXES_FIELD}: {path}: rows: expected a non-empty list of rows with release and engine")
    engines = {r["engine"] for r in rows}
    if len(engines) != 1:
        raise UsageError(f"{FIXES_FIELD}: {path}: rows of more than one engine ({', '.join(sorted(engines))})")
    kinds = [row["kind"] for row in release_forms()]
    if not engines <= set(kinds):
        raise UsageError(f"{FIXES_FIELD}: {path}: rows: engine {next(iter(engines))!r} is not one with releases "
                         f"({' or '.join(kinds)})")
    fixes = data.get("fixes")
    if fixes is None:
        raise UsageError(f"{FIXES_FIELD}: {path}: no fix releases (the shards ran with --no-fixes)")
    if not isinstance(fixes, list) or not all(
            isinstance(e, dict) and isinstance(e.get("found_on"), str) and isinstance(e.get("replays"), dict)
            and isinstance(e.get("case_files"), list) and isinstance(e.get("not_replayed", []), list) for e in fixes):
        raise UsageError(f"{FIXES_FIELD}: {path}: fixes: expected entries with found_on, replays, case_files and "
                         f"not_replayed")
    if data.get("exit_code") not in (0, 1, 3):
        raise UsageError(f"{FIXES_FIELD}: {path}: exit_code: expected the matrix's exit code, 0, 1 or 3")
    if not any("not_replayed" in e for e in fixes) and fixes:
        raise UsageError(f"{FIXES_FIELD}: {path}: not a merged sharded matrix (no entry has not_replayed): an "
                         f"unsplit matrix names its fix releases itself")
    return data


def run_fixes(args) -> int:
    from ..matrix_fixes import across_shards, fixes_markdown, fixes_table, replay_across_shards

    data = load_merged_matrix(args.matrix)
    engine = data["rows"][0]["engine"]
    releases = [r["release"] for r in data["rows"]]
    entries = data["fixes"]
    todo = across_shards(entries, releases)
    progress_line(f"{len(todo)} of {len(entries)} families have releases gated by another shard to replay on "
                  f"({len({r for t in todo.values() for r in t})} releases, each opened once)", "engine fixes")

    n = replay_across_shards(entries, releases, release_opener(engine, args.no_setup),
                             say=lambda line: progress_line(line, "engine fixes"))
    print(("\n" + fixes_markdown(entries)) if args.markdown and entries else fixes_table(entries))
    code = data.get("exit_code")
    print(f"fix releases completed: {n} case replays on releases other shards gated; the matrix's verdict stands "
          f"(exit {code})")
    return deliver(code, [("--json", args.json,
                           lambda: write_output(args.json, json.dumps(data, indent=2) + "\n", "--json"))],
                   "engine fixes")


def progress_line(line: str, command: str = "engine matrix") -> None:
    """The matrix's progress (a line per stage and per release) goes to stderr, never into stdout's table."""
    print(f"fa3verify {command}: {line}", file=sys.stderr, flush=True)
