"""fa3verify sanitize: the runtime metadata sanitizer's hook file and replays of what it recorded."""

from __future__ import annotations

import argparse
import os
import sys

from .arguments import with_engine_examples
from ..errors import UsageError

HELP = "runtime sanitizer: install the FA3VERIFY_SANITIZE start hook, replay a recorded mismatch"
EPILOG = """\
The sanitizer itself runs inside your process: `import fa3verify.sanitize; fa3verify.sanitize.install("raise")`,
`pytest --fa3verify-sanitize=raise`, or -- once the start hook is installed (first example below) -- any
interpreter of that environment started with FA3VERIFY_SANITIZE=raise|warn|record (spawned workers included). See docs/sanitize.md.

examples:
  fa3verify sanitize install-hook                       # into the environment running fa3verify
  fa3verify sanitize install-hook --venv /path/to/venv  # into another venv (fa3verify must import there)
{sanitize}  fa3verify sanitize replay fa3verify-sanitize/pair-split_bound-1a2b3c4d5e6f7a8b.json
  fa3verify report fa3verify-sanitize/sanitize-12345.jsonl --html sanitize.html
"""


def register(sub) -> None:
    p = sub.add_parser("sanitize", help=HELP, description=HELP, epilog=with_engine_examples(EPILOG),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ops = p.add_subparsers(dest="sanitize_command", metavar="ACTION")
    hook = ops.add_parser("install-hook", help="write the FA3VERIFY_SANITIZE start hook (.pth) into a venv")
    hook.add_argument("--venv", metavar="PATH", help="the virtual environment (default: the one running fa3verify)")
    hook.add_argument("--add-path", action="append", default=[], metavar="DIR",
                      help="also put DIR on that environment's sys.path (e.g. a checkout of fa3-verify); repeatable")
    hook.add_argument("--no-import-check", action="store_true",
                      help="do not check that fa3verify imports in that environment")
    unhook = ops.add_parser("uninstall-hook", help="remove the start hook written by install-hook")
    unhook.add_argument("--venv", metavar="PATH", help="the virtual environment (default: the one running fa3verify)")
    rep = ops.add_parser("replay", help="re-run the checks on a pair file the sanitizer wrote; 1 if it still fails")
    rep.add_argument("pair", metavar="PAIR.json", help="a pair file (schema fa3verify.sanitize-pair/1)")
    p.set_defaults(func=run, sanitize_parser=p)


def _python_of(venv):
    if venv is None:
        return None
    for rel in ("bin/python", "bin/python3", "Scripts/python.exe"):
        cand = os.path.join(venv, rel)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise UsageError(f"--venv: no Python interpreter under {venv} (expected {venv}/bin/python)")


def run(args) -> int:
    action = getattr(args, "sanitize_command", None)
    if action is None:
        args.sanitize_parser.print_help()
        return 2
    if action == "replay":
        return _replay(args.pair)
    from ..sanitize import hook

    python = _python_of(args.venv)
    try:
        site = hook.site_packages_of(python)
        if action == "uninstall-hook":
            path, what = hook.remove_pth(site)
            print(f"{what}: {path}")
            return 0
        if not args.no_import_check:
            _check_importable(python or sys.executable, args.add_path)
        path, what = hook.write_pth(site, args.add_path)
    except hook.HookFileError as exc:
        raise UsageError(str(exc)) from None
    print(f"{what}: {path}")
    print("activate with FA3VERIFY_SANITIZE=raise|warn|record (FA3VERIFY_SANITIZE_DIR for the output folder)")
    return 0


def _check_importable(python: str, add_paths) -> None:
    """The hook's import must work in that environment (with the extra paths), or nothing is written."""
    import subprocess

    from ..sanitize.hook import HookFileError

    env = {k: v for k, v in os.environ.items() if k not in ("FA3VERIFY_SANITIZE", "PYTHONPATH")}
    if add_paths:
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in add_paths)
    probe = subprocess.run([python, "-c", "import fa3verify.sanitize.hook"], capture_output=True, text=True,
                           timeout=120, env=env)
    if probe.returncode != 0:
        raise HookFileError(f"--venv: fa3verify does not import in {python}, so the hook would fail at every start; "
                            f"install fa3-verify there or pass --add-path DIR (nothing written): "
                            f"{probe.stderr.strip()[-300:]}")


def _replay(path: str) -> int:
    from gpu_impl.fa3_calls import argument_check, deep_check, pair_summary, quick_check

    from ..sanitize.records import load_pair

    if not os.path.isfile(path):
        raise UsageError(f"PAIR.json: no such file: {path}")
    try:
        pre, call, recorded = load_pair(path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cause = argument_check(pre, call)      # the precompute's arguments against the call's, in both checks
    found = quick_check(pre, call) + cause
    exact = None
    if call.lengths_known() and (pre is None or pre.lengths_known()) and call.metadata_passed:
        exact = deep_check(pre, call) + cause
    summary = pair_summary(pre, call)
    print(f"pair: {path}")
    print(f"recorded: {', '.join(sorted({v['invariant'] for v in recorded})) or 'none'}")
    print(f"S_p={summary['s_p']} S_c={summary['s_c']}")
    print(f"quick check: {', '.join(v.invariant for v in found) or 'pass'}")
    for v in found:
        print(f"  {v.invariant}: {v.message}")
    if exact is not None:
        print(f"deep check: {', '.join(v.invariant for v in exact) or 'pass'}")
        for v in exact[:3]:
            print(f"  {v.invariant} (batch {v.batch}): {v.message}")
    still = bool(exact) if exact is not None else bool(found)
    print("verdict: " + ("STILL FAILS" if still else "PASSES NOW"))
    return 1 if still else 0
