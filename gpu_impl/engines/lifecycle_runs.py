"""The metadata-lifecycle sequences driven on real engines, and their matrix over releases.

Each sequence is multi-layer and multi-step, eager or under CUDA graphs (capture, then replays of padded batches),
run through a release's own backend by its driver (``sglang_driver`` / ``vllm_driver``), every launch judged by
``lifecycle_judge`` besides the pair checks. :data:`SGLANG_SEQUENCES` and :data:`VLLM_SEQUENCES` are the clean
sequences (the release's code as shipped); ``defect`` seeds one of ``lifecycle_judge.ENGINE_DEFECTS`` into a run (the
negative controls, tests/engines/test_engine_lifecycle.py).

Run as ``python -m gpu_impl.engines.lifecycle_runs ENGINE...`` (``sglang==V`` or ``vllm==V`` with a built
environment): one line per release and sequence with the invariants found at which steps; exit 0 when nothing is
found, 1 when something is, 2 on bad usage, 3 when a release cannot be run.
"""

from __future__ import annotations

import sys
import time

from .errors import DriverError, ScenarioUnsupported

__all__ = ["SGLANG_SEQUENCES", "VLLM_SEQUENCES", "run_sglang", "run_vllm", "found_by_invariant", "matrix_row", "main"]

#: name -> (server fields, model name, decode batches); every sglang sequence runs LAYERS layers
SGLANG_SEQUENCES = {
    "eager-3-steps": ({"tp_size": 1, "cuda_graph": False, "context_length": 4096}, "qwen3-30b-a3b",
                      ([300, 200], [310, 210], [3000, 100, 50])),
    "graph-capture-replay-padded": ({"tp_size": 1, "cuda_graph": True, "context_length": 4096}, "qwen3-30b-a3b",
                                    ([3000, 100], [200, 300], [1000, 50], [4000, 100, 20, 30, 40, 50])),
    "prefill-cp-skewed-decode": ({"tp_size": 4, "attn_cp_size": 4, "enable_prefill_cp": True, "cp_strategy": "zigzag",
                                  "cuda_graph": False, "context_length": 32768}, "qwen3-30b-a3b",
                                 ([32768] + [100] * 7, [32000] + [101] * 7)),
}
#: name -> scenario fields of the vLLM driver; every vLLM sequence runs LAYERS layers
VLLM_SEQUENCES = {
    "eager-3-steps": {"cuda_graph": "none", "max_model_len": 8192,
                      "steps": [{"seq_lens": [300, 200]}, {"seq_lens": [310, 210]}, {"seq_lens": [3000, 100, 50]}]},
    "full-graph-replay-padded": {"cuda_graph": "full", "max_model_len": 8192,
                                 "steps": [{"seq_lens": [3000, 100]}, {"seq_lens": [200, 300]},
                                           {"seq_lens": [1000, 50]}, {"seq_lens": [4000, 100, 20, 30, 40, 50]}]},
    # decode context parallel 2 under full graphs, then a step whose context is empty (vLLM skips the context
    # attention's metadata build, skip_dcp_context_attention, while the graph still replays the context call)
    "dcp-full-graph-empty-context": {"cuda_graph": "full", "tp": 4, "dcp": 2, "max_model_len": 40960,
                                     "steps": [{"seq_lens": [32768, 100]}, {"seq_lens": [1, 1]}]},
}
#: layers per step in every sequence (the metadata's reuse across layers)
LAYERS = 2


def sglang_scenario(name: str):
    from ..config import ServerConfig, get_model
    from ..scenario import Scenario, Step

    server, model, batches = SGLANG_SEQUENCES[name]
    return Scenario(server=ServerConfig(**server), model=get_model(model), guard=None,
                    steps=[Step("decode", list(b)) for b in batches])


def run_sglang(sut, scenario, layers: int = LAYERS, defect=None):
    """One scenario on a started sglang SUT with ``layers`` layers a step and the seeded ``defect`` (None: none)."""
    from .protocol import result_from_wire, scenario_to_wire

    resp = sut.request({"op": "run", "scenario": scenario_to_wire(scenario), "numerics": False, "layers": layers,
                        "lifecycle_defect": defect})
    return result_from_wire(sut._answer(resp))


def run_vllm(worker, fields: dict, layers: int = LAYERS, defect=None) -> dict:
    """One scenario on a vLLM worker with ``layers`` layers and the seeded ``defect``: the driver's answer."""
    return worker.run({**fields, "num_layers": layers, "lifecycle_defect": defect})


def found_by_invariant(findings) -> dict:
    """invariant -> sorted steps it was found at (findings as objects or the driver's dicts)."""
    out: dict = {}
    for f in findings:
        inv = f["invariant"] if isinstance(f, dict) else f.invariant
        step = f.get("step") if isinstance(f, dict) else f.step
        out.setdefault(inv, set()).add(step)
    return {k: sorted(v, key=lambda s: -1 if s is None else s) for k, v in sorted(out.items())}


def matrix_row(engine: str) -> list:
    """[(sequence, {invariant: steps}, seconds)] for one ``sglang==V`` / ``vllm==V`` over its clean sequences."""
    kind, _, release = engine.partition("==")
    rows = []
    if kind == "sglang":
        from ..sut import open_sut

        sut = open_sut(engine)
        try:
            sut.start()
            for name in SGLANG_SEQUENCES:
                t = time.monotonic()
                result = run_sglang(sut, sglang_scenario(name))
                rows.append((name, found_by_invariant(list(result.findings) + list(result.shape_errors)),
                             round(time.monotonic() - t, 2)))
        finally:
            sut.close()
    elif kind == "vllm":
        from .vllm.host import VllmWorker

        worker = VllmWorker(release, progress=lambda m: None)
        try:
            for name, fields in VLLM_SEQUENCES.items():
                t = time.monotonic()
                try:
                    out = run_vllm(worker, fields)
                except (ValueError, ScenarioUnsupported, DriverError) as exc:  # this sequence only: the rest run
                    rows.append((name, {"not run": str(exc).splitlines()[0][:200]}, round(time.monotonic() - t, 2)))
                    if not worker.running:
                        worker = VllmWorker(release, progress=lambda m: None)
                    continue
                rows.append((name, found_by_invariant(out["findings"] + out["shape_errors"]),
                             round(time.monotonic() - t, 2)))
        finally:
            worker.close()
    else:
        raise ValueError(f"engine: sglang==V or vllm==V, got {engine!r}")
    return rows


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bad = [a for a in argv if not a.startswith(("sglang==", "vllm=="))]
    if not argv or bad:  # checked before any release runs
        print("usage: python -m gpu_impl.engines.lifecycle_runs ENGINE... (each sglang==V or vllm==V)"
              + (f"; got {bad[0]!r}" if bad else ""), file=sys.stderr)
        return 2
    found_any, failed = False, False
    for engine in argv:
        try:
            rows = matrix_row(engine)
        except Exception as exc:  # noqa: BLE001 - a release that cannot run is inconclusive, named; the next runs
            print(f"{engine}: not run: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            failed = True
            continue
        for name, found, seconds in rows:
            if "not run" in found:  # a sequence the release cannot run: inconclusive, named
                failed = True
                print(f"{engine}  {name}: not run: {found['not run']}")
                continue
            found_any = found_any or bool(found)
            text = "; ".join(f"{k} at steps {v}" for k, v in found.items()) or "nothing"
            print(f"{engine}  {name}  ({LAYERS} layers, {seconds} s): {text}")
    return 1 if found_any else (3 if failed else 0)


if __name__ == "__main__":
    raise SystemExit(main())
