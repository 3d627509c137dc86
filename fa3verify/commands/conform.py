"""fa3verify conform: does the model pass FA3 what a real sglang release does, on the same random configurations?"""

from __future__ import annotations

import argparse
import json

from ..engine_choice import add_engine_argument, add_profile_argument
from ..sharding import add_shard_argument

HELP = "compare the model (under a release's profile) with the real engine, FA3 call by FA3 call"
EPILOG = """\
Draws random configurations and batches (the fuzzer's strategies), skips those the release's own ServerArgs
validation rejects (counted), runs the rest on the model under the release's profile (spec/model/engine_profiles.json:
precompute heads and guard) and on the real engine, and compares per (step, DP rank, eager|capture|replay)
what each passes to get_scheduler_metadata and flash_attn_with_kvcache (heads, batch, max_seqlen_k,
page-table width, page size, num_splits, causal, softcap, dtype, whether metadata is passed), the split
counts and the verdicts. Each configuration that differs is a fidelity finding with a case file; so is a
configuration spec assumes away (docs/invariants.md) that the release accepts. Exit 1 on any difference.

examples:
  fa3verify conform --engine sglang==0.5.23 --cases 300 --seed 0
  fa3verify conform --engine sglang-src=../sglang/python --engine-profile sglang==0.5.23 --json conform.json
  fa3verify conform --engine vllm==0.33.0            # vLLM's profile, claim by claim, on its own code
  fa3verify conform --engine sglang==0.5.23 --cases 900 --shard 1/3 --json c1.json   # join: `report merge`
"""


def register(sub) -> None:
    p = sub.add_parser("conform", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_argument(p, default=None, help_extra=" (required; not 'model')")
    add_profile_argument(p)
    p.add_argument("--cases", type=int, default=200, metavar="N", help="random configurations (default 200)")
    p.add_argument("--seed", type=int, default=0, help="generation seed (default 0)")
    add_shard_argument(p, "configurations")
    p.add_argument("--no-assumption-probes", action="store_true",
                   help="do not put the configurations spec assumes away to the release's validation")
    p.add_argument("--cases-dir", default="fa3verify-out/cases", metavar="DIR", help="where findings are saved")
    p.add_argument("--json", metavar="PATH", help="write the summary and the conformance counts as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..engine_choice import parse_engine_option
    from ..errors import UsageError

    if args.engine is None:
        raise UsageError("--engine: required (sglang==V, sglang-src=PATH or vllm==V): conform compares the model "
                         "(or vLLM's profile) with it")
    if args.cases < 1:
        raise UsageError(f"--cases: must be >= 1, got {args.cases}")
    from ..sharding import check_cases, parse_shard

    shard = parse_shard(args.shard)
    check_cases(shard, args.cases)
    spec = parse_engine_option(args.engine)
    how = spec.plugin.conformance(spec)  # the engine's plugin says how it is conformed
    if how is None:
        raise UsageError(f"--engine: conform compares the model with a real engine; '{spec}' is the model itself")
    return CONFORMANCES[how](args, spec, shard)


def _conform_claims(args, spec, shard) -> int:
    """``own-profile``: the engine's own profile checked claim by claim on its code (not over drawn configurations)."""
    from ..errors import UsageError

    if shard is not None:
        raise UsageError(f"--shard: {spec} conforms claim by claim, not over drawn configurations; "
                         f"--shard applies to engines conformed over drawn configurations")
    return _conform_vllm(args, spec)


def _conform_drawn(args, spec, shard) -> int:
    """``model-profile``: the model under the engine's release profile against the engine on drawn configurations."""
    from ..conformance import conform, summarise
    from ..engine_choice import conform_profile, open_engine, start_engine
    from ..progress import stage
    from ..summary import finding_text, print_table

    with open_engine(spec) as sut:
        profile = conform_profile(args.engine_profile, sut)
        print(f"engine: {spec}   profile: {profile.describe()}")
        start_engine(sut, "conform")
        with stage("conform", f"conform {args.cases} configurations on {spec}"
                              + (f", shard {shard}" if shard else ""),
                   result=lambda: f"{report.compared} compared, {len(report.differences)} differing"):
            report = conform(sut, profile, cases=args.cases, seed=args.seed, cases_dir=args.cases_dir,
                             probes=not args.no_assumption_probes, progress=_progress_every_25(args.cases),
                             shard=shard)
    summary = summarise(report)
    if shard is not None:
        summary.seed = args.seed
        summary.shard = shard.to_dict({"command": "conform", "seed": args.seed, "cases": args.cases,
                                       "engine": args.engine, "profile": profile.describe(),
                                       "probes": not args.no_assumption_probes})
    print_table(summary)
    print(f"configurations: {report.cases} drawn, {report.compared} compared, {report.skipped_rejected} rejected "
          f"by the release" + (f" {report.rejected_reasons}" if report.rejected_reasons else "")
          + f"; sliding-window calls not compared: {report.sliding_window_calls}")
    for f in summary.findings[:10]:
        print(finding_text(f))  # the one renderer: evidence, case file and the replay lines as typed
    from ..output_writer import deliver, write_output

    return deliver(summary.exit_code, [("--json", args.json, lambda: write_output(
        args.json, json.dumps({**summary.to_dict(), "conform": report.to_dict()}, indent=2) + "\n", "--json"))],
        "conform")


#: how conform runs, by the answer of the engine's plugin (``EnginePlugin.conformance``)
CONFORMANCES = {"model-profile": _conform_drawn, "own-profile": _conform_claims}


def _progress_every_25(total: int):
    """conform's progress callback: a line on stderr every 25 compared configurations, on logs only."""
    import sys

    from ..progress import log_lines_enabled

    if not log_lines_enabled():
        return None

    def say(report) -> None:
        print(f"fa3verify conform: {report.cases}/{total} configurations drawn, {report.compared} compared, "
              f"{len(report.differences)} differing so far", file=sys.stderr, flush=True)
    return say


def _conform_vllm(args, spec) -> int:
    """``--engine vllm==V``: the release's vLLM profile checked claim by claim on its own code."""
    from ..conformance_vllm import conform_vllm
    from ..engine_choice import open_engine
    from ..errors import UsageError
    from ..summary import print_table
    from spec.model.engine_profiles import ProfileError, engine_profile_for, release_named

    if not args.engine_profile and spec.release is None:
        from ..engine_choice import open_engine as _open

        with _open(spec) as probe:  # a checkout conforms to its nearest release's profile unless told otherwise
            release = probe.release
    else:
        release = spec.release
    if not args.engine_profile and spec.release is not None:  # the release named by --engine must be one we drive
        from gpu_impl.engines.envs import check_release
        from gpu_impl.engines.errors import UnknownRelease

        try:
            check_release(spec.release, engine="vllm")
        except UnknownRelease as exc:
            raise UsageError(f"--engine: {exc}") from None
    # the profile comes from --engine-profile when given, else from the release --engine names: errors name that one
    option = "--engine-profile" if args.engine_profile else "--engine"
    text = args.engine_profile or f"vllm=={release}"
    if release_named(text, "vllm") is None:
        raise UsageError(f"--engine-profile: {spec} runs vLLM's code; want vllm==V, got {text!r}")
    try:
        profile = engine_profile_for(text)[1]
    except ProfileError as exc:
        raise UsageError(f"{option}: {exc}") from None
    from ..engine_choice import start_engine
    from ..progress import stage

    with open_engine(spec) as sut:
        print(f"engine: {spec}   profile: {profile.describe()}")
        start_engine(sut, "conform")
        with stage("conform", f"conform {spec}'s claims against its profile"):
            summary = conform_vllm(sut, profile)
    print_table(summary)
    for f in summary.findings[:10]:
        print(f"  {f.message[:300]}")
    from ..output_writer import deliver, write_output

    return deliver(summary.exit_code, [("--json", args.json, lambda: write_output(
        args.json, json.dumps(summary.to_dict(), indent=2) + "\n", "--json"))], "conform")
