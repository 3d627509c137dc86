"""Refresh tests/file_seconds.json, the suite's per-file seconds that tests/conftest.py orders test files by (the
longest first, so the last file to start under ``-n auto --dist loadfile`` is a short one).

Invariant: a file's entry is the sum of its tests' durations (setup, call and teardown) in the JUnit XML of a
timing run; files in the run replace their entries, the others keep theirs, and files that no longer exist are
dropped.

Usage (docs/performance.md):
  python scripts/file_seconds.py --run [PYTEST ARGS...]   # runs pytest with --junitxml, then merges
  python scripts/file_seconds.py --from RUN.xml [...]      # merges JUnit XML from an earlier run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests" / "file_seconds.json"


def file_seconds(junit_xml: Path) -> dict:
    """{tests/cli/test_x.py: seconds} summed over the run's test cases."""
    out: dict = defaultdict(float)
    for case in ET.parse(junit_xml).iter("testcase"):
        cls = case.get("classname") or ""
        parts = cls.split(".")  # tests.test_x, tests.test_x.TestClass, tests.gpu.test_y
        first = next((i for i, p in enumerate(parts) if p.startswith("test_")), None)
        if parts[0] != "tests" or first is None:
            continue
        out["/".join(parts[:first + 1]) + ".py"] += float(case.get("time") or 0.0)
    return dict(out)


def merge(table: dict, measured: dict, root: Path = ROOT) -> dict:
    merged = {f: s for f, s in table.items() if (root / f).exists()}
    merged.update({f: round(s, 1) for f, s in measured.items()})
    return dict(sorted(merged.items(), key=lambda kv: (-kv[1], kv[0])))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--from", dest="junit", nargs="+", type=Path, help="JUnit XML files of timing runs")
    group.add_argument("--run", nargs=argparse.REMAINDER, help="pytest arguments (default: the whole suite)")
    ap.add_argument("--table", type=Path, default=TABLE)
    args = ap.parse_args(argv)
    runs = list(args.junit or [])
    if args.run is not None:
        xml = Path(tempfile.mkdtemp()) / "timing.xml"
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", f"--junitxml={xml}", *args.run], cwd=ROOT)
        if not xml.exists():
            print(f"pytest wrote no JUnit XML (exit {rc})", file=sys.stderr)
            return 2
        runs.append(xml)
    measured: dict = {}
    for run in runs:
        if not run.is_file():
            print(f"--from: {run} is not a file", file=sys.stderr)
            return 2
        measured.update(file_seconds(run))
    table = json.loads(args.table.read_text()) if args.table.exists() else {}
    merged = merge(table, measured)
    args.table.write_text(json.dumps(merged, indent=1) + "\n")
    print(f"{args.table}: {len(measured)} files measured, {len(merged)} in the table, "
          f"{sum(merged.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
