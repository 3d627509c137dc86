"""Regenerate ``gpu_impl/engines/sglang/server_args.json``: the server arguments that reach sglang's FA3
backend, its parallel layout or the CUDA-graph runner, as each release's own argument parser defines them.

Runs ``ServerArgs.add_cli_args`` (``python/sglang/srt/server_args.py``) inside each built engine environment
(``python -m gpu_impl.engines.envs V`` builds one) and records, per argument, its destination, flag, type, choices
and default. Releases without an environment are skipped (the file keeps what it had for them).

Usage: ``PYTHONPATH=. python scripts/gen_sglang_domains.py [V ...]`` (default: every release with a built env).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_impl.engines import envs
from gpu_impl.engines.sglang import recipes
from gpu_impl.engines.sglang.domain import DATA_FILE, SERVER_ARGS  # noqa: E402

PROBE = r"""
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
want = set(json.loads(sys.argv[1]))
out = {}
for a in p._actions:
    names = [a.dest] + [o.lstrip("-").replace("-", "_") for o in a.option_strings]
    hit = [n for n in names if n in want]
    if hit:
        default = None if a.default is argparse.SUPPRESS else a.default
        out[hit[0]] = {"dest": a.dest, "flags": list(a.option_strings), "type": getattr(a.type, "__name__", None),
                       "choices": sorted(a.choices, key=str) if a.choices else None,
                       "default": default if isinstance(default, (int, float, str, bool, list, type(None))) else str(default),
                       "nargs": a.nargs, "store_true": a.nargs == 0 and a.const is True}
print(json.dumps(out))
"""


def probe(release: str) -> dict:
    py = envs.env_dir(release) / "bin" / "python"
    out = subprocess.run([str(py), "-c", PROBE, json.dumps(sorted(SERVER_ARGS))], capture_output=True, text=True,
                         timeout=600, env=envs.driver_environ(), stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise SystemExit(f"sglang=={release}: the argument probe failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list) -> int:
    releases = argv or [r for r in recipes.RELEASES if (envs.env_dir(r) / "bin" / "python").exists()]
    data = json.loads(DATA_FILE.read_text()) if DATA_FILE.exists() else {"releases": {}}
    for release in releases:
        print(f"sglang=={release} ...", flush=True)
        data["releases"][release] = probe(release)
    data["releases"] = dict(sorted(data["releases"].items(), key=lambda kv: recipes.release_key(kv[0])))
    DATA_FILE.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(f"wrote {DATA_FILE.relative_to(ROOT)}: {', '.join(data['releases'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
