"""Engine throughput: worker import cost and scenarios/s after import, on real sglang releases (not a test).

Usage: ``PYTHONPATH=. python scripts/engine_throughput.py 0.5.13 0.5.23`` (builds the environments on first use).
Prints, per release: worker start (import) seconds, scenarios/s for a 4-row decode batch (tp 2) and for the
worked example (Qwen3-30B-A3B shapes, tp 4, attn_cp 4, one 32768-token and seven 100-token rows), eager, and for
the worked example under CUDA graph (each run captures the graph, then replays it once).
"""

from __future__ import annotations

import sys
import time

from gpu_impl.config import ServerConfig, get_model
from gpu_impl.scenario import Scenario, Step
from gpu_impl.sut import open_sut


def rate(sut, scn, n: int) -> float:
    sut.run(scn)
    start = time.perf_counter()
    for _ in range(n):
        sut.run(scn)
    return n / (time.perf_counter() - start)


def main(releases) -> None:
    model = get_model("qwen3-30b-a3b")
    small = Scenario(server=ServerConfig(tp_size=2), model=model, guard=None,
                     steps=[Step("decode", [1000, 200, 300, 50])])
    worked = Scenario(server=ServerConfig(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag",
                                          context_length=40960),
                      model=model, guard=None, steps=[Step("decode", [32768] + [100] * 7)])
    graph = Scenario(server=ServerConfig(tp_size=4, attn_cp_size=4, enable_prefill_cp=True, cp_strategy="zigzag",
                                         context_length=40960, cuda_graph=True),
                     model=model, guard=None, steps=[Step("decode", [32768] + [100] * 7)])
    for release in releases:
        with open_sut(f"sglang=={release}") as sut:
            hello = sut.start()
            print(f"sglang=={release}: worker start {hello['start_s']:.1f}s (import {hello['import_s']:.1f}s); "
                  f"4-row decode {rate(sut, small, 40):.1f} scenarios/s; worked example {rate(sut, worked, 10):.1f} "
                  f"scenarios/s; worked example, CUDA graph {rate(sut, graph, 10):.1f} scenarios/s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["0.5.13", "0.5.23"])
