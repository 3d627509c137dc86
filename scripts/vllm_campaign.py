"""A seeded campaign over vLLM's FlashAttention backend: configuration families x skewed batches, on the real code.

Usage: python scripts/vllm_campaign.py [--seed N] [--per-config K] [--out FILE]  (needs the vLLM engine
environment: python -m gpu_impl.engines.envs vllm==0.33.0). Prints one line per family with configurations run,
FA3 pairs seen, findings and shape errors, and the mean time per scenario; writes every differing scenario to --out.
"""

import argparse
import itertools
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_impl.engines.vllm import VllmWorker  # noqa: E402

MODELS = ((32, 4, 128), (32, 8, 128), (64, 8, 128), (16, 16, 64), (28, 4, 128), (32, 8, 256))
LENGTHS = (1, 17, 100, 1000, 4097, 32768)


def scenarios(seed: int, per_config: int):
    rng = random.Random(seed)
    for (h, hk, d), tp, cg, bi, kv, sw, dcp in itertools.product(
            MODELS, (1, 2, 4, 8), ("none", "full"), (False, True), ("auto", "fp8"), ("none", "one", "mixed"), (1, 2)):
        if h % tp or (dcp > 1 and sw != "none"):
            continue
        for _ in range(per_config):
            n = rng.choice((1, 2, 3, 8, 33, 100))
            steps = []
            for _ in range(2):
                k = [rng.choice(LENGTHS) for _ in range(n)]
                q = [1] * n
                if rng.random() < 0.3:  # chunked prefill: a few sequences take chunks, within the token budget
                    for i in rng.sample(range(n), min(n, 3)):
                        q[i] = rng.randint(1, min(k[i], 2048))
                steps.append({"seq_lens": k, "query_lens": q})
            sc = {"num_heads": h, "num_kv_heads": hk, "head_dim": d, "tp": tp, "cuda_graph": cg,
                  "batch_invariant": bi, "kv_cache_dtype": kv, "dcp": dcp, "steps": steps}
            if sw == "one":
                sc.update(num_layers=2, sliding_window=4096)
            elif sw == "mixed":
                sc.update(num_layers=2, sliding_window=[4096, None])
            family = f"cg={cg} bi={int(bi)} kv={kv} sw={sw} dcp={dcp}"
            yield family, sc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-config", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    w = VllmWorker("0.33.0", progress=lambda m: print(m, file=sys.stderr))
    print(f"vLLM {w.hello['release']} imported in {w.hello['import_s']} s")
    stats: dict = {}
    differing = []
    t0 = time.monotonic()
    n = 0
    for family, sc in scenarios(a.seed, a.per_config):
        t = time.monotonic()
        resp = w.run(sc)
        n += 1
        st = stats.setdefault(family, Counter())
        st["configs"] += 1
        st["pairs"] += sum(1 for e in resp["trace"] if "s_c" in e)
        st["aot"] += sum(1 for e in resp["trace"] if e.get("aot"))
        st["findings"] += len(resp["findings"])
        st["shape"] += len(resp["shape_errors"])
        st["seconds"] += time.monotonic() - t
        if resp["findings"] or resp["shape_errors"]:
            differing.append({"family": family, "scenario": sc,
                              "invariants": sorted({f["invariant"] for f in resp["findings"] + resp["shape_errors"]})})
    w.close()
    for family, st in sorted(stats.items()):
        print(f"{family:46s} configs={st['configs']:4d} pairs={st['pairs']:5d} aot={st['aot']:5d} "
              f"findings={st['findings']:3d} shape={st['shape']:3d} s/scenario={st['seconds'] / st['configs']:.3f}")
    total = sum(s["configs"] for s in stats.values())
    print(f"total: {total} configurations, {sum(s['findings'] for s in stats.values())} findings, "
          f"{sum(s['shape'] for s in stats.values())} shape errors, {time.monotonic() - t0:.1f} s")
    if a.out:
        Path(a.out).write_text(json.dumps(differing, indent=1))
    return 1 if any(s["findings"] for s in stats.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
