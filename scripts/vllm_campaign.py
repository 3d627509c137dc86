"""Per-family counts of a vLLM campaign: the one campaign (``fa3verify fuzz --engine vllm==V`` runs the same) with
a tally of the configuration families drawn (``gpu_impl.engines.vllm.strategies.vllm_family_label``).

Usage: python scripts/vllm_campaign.py [--release 0.33.0] [--seed N] [--cases N]. The loop, the generator and case
saving are the campaign's (``fa3verify.commands.fuzz.fuzz``); this only counts what was drawn and prints it per family.
"""

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fa3verify.commands.fuzz import fuzz  # noqa: E402
from fa3verify.strategies import FAMILIES  # noqa: E402
from gpu_impl.engines.vllm.strategies import vllm_case, vllm_family_label  # noqa: E402
from gpu_impl.sut import open_sut  # noqa: E402


class ShapeCounting:
    """The vLLM system under test, counting the loud shape errors (safe: not failures of the campaign) per family."""

    def __init__(self, sut, tally):
        self.sut, self.spec, self.tally = sut, sut.spec, tally

    def run(self, scenario, **kw):
        result = self.sut.run(scenario, **kw)
        if result.shape_errors:
            self.tally["shape"] += 1
        return result

    def identity(self):
        return self.sut.identity()

    def start(self):
        return self.sut.start()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--release", default="0.33.0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--out", default="fa3verify-out/cases")
    a = ap.parse_args(argv)
    tally: Counter = Counter()
    shapes: Counter = Counter()

    def counted(rng):
        case = vllm_case(rng)
        tally[vllm_family_label(case)] += 1
        return case

    FAMILIES["vllm-counted"] = counted
    with open_sut(f"vllm=={a.release}") as sut:
        t = time.monotonic()
        summary = fuzz(sut=ShapeCounting(sut, shapes), seed=a.seed, max_cases=a.cases, budget_s=None, out_dir=a.out,
                       strategy="vllm-counted", show_progress=False)
        total = time.monotonic() - t
    for label, n in sorted(tally.items()):
        print(f"{label:46s} configurations={n}")
    print(f"total: {summary.cases} configurations in {len(tally)} families, {len(summary.findings)} distinct "
          f"findings, {shapes['shape']} configurations with a loud shape error (safe), {summary.elapsed_s:.1f} s in the campaign ({total:.1f} s with the worker start)")
    for f in summary.findings:
        print(f"  {f.invariant}: {f.message}\n    replay: {f.replay}")
    return summary.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
