"""gpu-check's ``metadata_lifecycle`` stage: the metadata's life across launches, observed on the real kernel.

refmodel.metadata_lifecycle predicts what happens to FA3's scheduler metadata when it outlives one call
(hopper/flash_api.cpp 1004-1025, 1167-1188; tile_scheduler.hpp 763-788; flash_fwd_combine_kernel.h 439-441):

* **reused metadata**: a launch given metadata runs no prepare step and does not zero the tile-count semaphore; its
  scheduler adds its tile fetches, then the combine (S_c > 1) or the host writes 0 back. Predicted: the semaphore
  reads 0 after each of several launches over the same tensor, and every launch computes the same, correct output.
* **a stale semaphore**: a launch whose semaphore starts at ``s`` > 0 never hands out the tiles
  ``[num_sm, min(T, num_sm + s))`` (:func:`refmodel.metadata_lifecycle.skipped_tiles`). Predicted: wrong output
  exactly when that range is not empty.
* **a CUDA graph over a persistent buffer**: the capture fixes S_c and the metadata view; a replay reads whatever
  the buffer holds. Predicted by the emulator's plan check (gpu_impl.kernels.plan_checks over the replayed batch and
  the buffer's metadata): a replay after the metadata is recomputed for the new batch agrees with the oracle; a replay
  over metadata left from another batch is wrong exactly when the check finds a violation.

The stage runs one worker task on the real kernel (a crash is recorded, never lost) and compares each observation
with its prediction (:func:`judge_observation`). The dry run skips it: semaphores and graphs need a GPU.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Optional

from spec.finding import StageStatus

if TYPE_CHECKING:
    from .runner import GpuCheck, Stage

#: The shapes: Qwen3-30B-A3B's heads at tp=1 (H=32, Hk=4, d=128), bf16, decode, contiguous caches. ``reuse`` and the
#: graph: 8 sequences in 8192 slots (three batches of lengths: the first precompute, the recomputed replay, a stale
#: replay whose lengths outgrow the metadata's); ``stale_semaphore``: 64 sequences in 1024 slots (T = 256 tiles >
#: 132 SMs, so a start s > 0 skips tiles); ``graph_heads``: the worked example's batch (one 32768-token sequence and
#: seven of 100) with its buffer recomputed with the pre-fix heads (8, 1): the seed's bug inside a graph replay.
HEADS, HEADS_K, HEAD_DIM = 32, 4, 128
BATCH, WIDTH = 8, 8192
LENS_A = (8000, 300, 1200, 50, 4096, 700, 2500, 64)
LENS_B = (1000, 8100, 60, 3000, 200, 5000, 80, 7000)
LENS_C = (8190, 8190, 8190, 8190, 8190, 8190, 8190, 8190)
MANY_BATCH, MANY_WIDTH = 64, 1024
MANY_LENS = tuple((37 * i) % 1000 + 20 for i in range(MANY_BATCH))
WORKED_WIDTH = 32768
WORKED_LENS = (32768,) + (100,) * 7
PRE_FIX_HEADS = (8, 1)
REUSED_LAUNCHES = 3
#: the worker tasks, in order; a crash (an illegal memory access) ends only its own part
PARTS = ("reuse", "graph", "graph_heads")


def run(check: GpuCheck, stage: Stage) -> None:
    p = check.plan
    stage.expectation = ("every observation as refmodel.metadata_lifecycle and the plan check predict: the semaphore "
                         "reads 0 after reused launches, a stale semaphore skips tiles, a graph replay is right "
                         "exactly when its buffer's metadata passes the plan check")
    if p.dry_run:
        stage.status = StageStatus.SKIPPED
        stage.message = "dry run: the semaphore and CUDA graphs need a GPU"
        return
    limit = check.budget(120.0, reserve=30)
    if limit < 10:
        stage.status, stage.message = StageStatus.INCONCLUSIVE, "no time left"
        return
    observations, describe = [], None
    end = time.perf_counter() + limit
    for part in PARTS:
        left = min(end - time.perf_counter(), check.budget(limit, reserve=30))  # the stage's one budget
        if left < 10:
            observations.append({"name": part, "error": "no time left"})
            continue
        res = check.pool.run(functools.partial(lifecycle_task, p.adapter, p.seed, part), timeout_s=left)
        if res.ok:
            observations += res.value["observations"]
            describe = describe or res.value.get("describe")
        else:
            observations.append(crash_observation(part, res.kind, res.summary(), check.num_sm))
            path = check.save_case("metadata_lifecycle", f"{part}-worker", {"result": res.to_dict()})
            check.finding("metadata_lifecycle", f"{part}:worker:{res.kind}", f"lifecycle {part}: {res.summary()}",
                          case_file=path)
    stage.numbers["observations"] = observations
    stage.numbers["describe"] = describe
    verdicts = [judge_observation(o) for o in observations]
    for o, v in zip(observations, verdicts):
        o["agrees_with_model"] = v
        if v is False:
            path = check.save_case("metadata_lifecycle", o["name"], o)
            check.finding("metadata_lifecycle", o["name"], f"{o['name']}: observed {o.get('observed')} where the "
                          f"model predicts {o.get('predicted')}", case_file=path)
    if any(v is False for v in verdicts):
        stage.status = StageStatus.FAIL
    elif any(v is None for v in verdicts):
        stage.status = StageStatus.INCONCLUSIVE
    else:
        stage.status = StageStatus.PASS
    stage.message = ", ".join(f"{o['name']}: {'as predicted' if v else 'NOT as predicted' if v is False else 'not observed'}"
                              for o, v in zip(observations, verdicts))


def judge_observation(o: dict) -> Optional[bool]:
    """True when an observation is what the model predicts, False when it contradicts it, None when it did not run.

    ``o["predicted"]`` and ``o["observed"]`` hold the same keys: ``semaphore_after`` (a list of ints: equal),
    ``output_correct`` (a bool: equal), ``outputs_identical`` (a bool: equal)."""
    if o.get("error") or o.get("observed") is None or o.get("predicted") is None:
        return None
    pred, obs = o["predicted"], o["observed"]
    for key, want in pred.items():
        if key not in obs:
            return None
        if obs[key] != want:
            return False
    return True


def predict_launch(values: list, schedule, start: int, num_sm: int) -> dict:
    """The model's prediction for one launch given metadata ``values`` whose semaphore holds ``start``."""
    from refmodel.metadata_lifecycle import launch_tiles, semaphore_after_launch, skipped_tiles

    tiles = launch_tiles(values, schedule)
    _, after = semaphore_after_launch(start, tiles, num_sm, schedule.num_splits, kernel_runs=True)
    skipped = skipped_tiles(tiles, start, num_sm)
    return {"tiles": tiles, "semaphore_after": after, "skipped_tiles": skipped}


def plan_violations(q, k, v, lens, metadata_values: list, num_sm: int, arch: int) -> list:
    """The emulator's plan check for a call over batch ``lens`` given ``metadata_values`` (CPU tensors): violations."""
    import torch

    from gpu_impl.kernels.base import CallArgs, build_tile_plan, call_schedule, call_shape, check_plan

    cs = torch.tensor(list(lens), dtype=torch.int32)
    md = torch.tensor(metadata_values, dtype=torch.int32)
    args = CallArgs(q=q, k_cache=k, v_cache=v, cache_seqlens=cs, causal=True, scheduler_metadata=md)
    shape = call_shape(q, k, v, cs)
    schedule = call_schedule(shape, args, num_sm, arch)
    return sorted({x.invariant for x in check_plan(build_tile_plan(shape, schedule, md))})


def crash_observation(part: str, kind: str, summary: str, num_sm: Optional[int] = None) -> dict:
    """A part whose worker died. For ``graph_heads`` the model's prediction is worked out here on the CPU (the
    emulator's metadata for the pre-fix heads, which the fidelity stage checks against the real one, and the plan
    check): when it predicts a violation, the observed outcome of the crash is a launch that was not correct. The
    other parts' models predict correct launches, so their crash is an error, never an agreement."""
    if part != "graph_heads" or not num_sm:
        return {"name": part, "crashed": kind, "summary": summary, "error": f"the worker died ({kind}): {summary}"}
    import torch

    from gpu_impl.kernels import load

    emulated = load("emulated", device="cpu", num_sm=int(num_sm))
    lens = torch.tensor(WORKED_LENS, dtype=torch.int32)
    md = emulated.get_scheduler_metadata(BATCH, 1, WORKED_WIDTH, PRE_FIX_HEADS[0], PRE_FIX_HEADS[1], HEAD_DIM, lens,
                                         causal=True)
    q = torch.zeros(BATCH, 1, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    k = torch.zeros(BATCH, WORKED_WIDTH, HEADS_K, HEAD_DIM, dtype=torch.bfloat16)
    viol = plan_violations(q, k, k, WORKED_LENS, [int(x) for x in md.tolist()], int(num_sm), 90)
    return {"name": "graph_replay_pre_fix_heads", "crashed": kind, "summary": summary, "violations": viol,
            "predicted": {"output_correct": not viol}, "observed": {"output_correct": False, "crash": kind}}


class _Bench:
    """One decode shape on the device: q/k/v (CPU copies for the oracle), the module's precompute and call."""

    def __init__(self, kernel, batch: int, width: int, seed: int):
        import torch

        self.kernel, self.module, self.dev = kernel, kernel.module, kernel.device
        self.batch, self.width = batch, width
        gen = torch.Generator().manual_seed(seed)
        self.q_cpu = torch.randn(batch, 1, HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
        self.k_cpu = torch.randn(batch, width, HEADS_K, HEAD_DIM, generator=gen).to(torch.bfloat16)
        self.v_cpu = torch.randn(batch, width, HEADS_K, HEAD_DIM, generator=gen).to(torch.bfloat16)
        self.q, self.k, self.v = (t.to(self.dev) for t in (self.q_cpu, self.k_cpu, self.v_cpu))

    def lens(self, lens):
        import torch

        return torch.tensor(list(lens), dtype=torch.int32, device=self.dev)

    def precompute(self, cs, heads=(HEADS, HEADS_K)):
        return self.module.get_scheduler_metadata(self.batch, 1, self.width, heads[0], heads[1], HEAD_DIM, cs,
                                                  causal=True)

    def call(self, cs, md):
        return self.module.flash_attn_with_kvcache(self.q, self.k, self.v, cache_seqlens=cs, scheduler_metadata=md,
                                                   causal=True)

    def schedule(self, lens):
        import torch

        from gpu_impl.kernels.base import CallArgs, call_schedule, call_shape

        shape = call_shape(self.q_cpu, self.k_cpu, self.v_cpu, torch.tensor(list(lens), dtype=torch.int32))
        args = CallArgs(q=self.q_cpu, k_cache=self.k_cpu, v_cache=self.v_cpu, causal=True)
        return call_schedule(shape, args, int(self.kernel.num_sm), int(self.kernel.arch))

    def violations(self, lens, values) -> list:
        return plan_violations(self.q_cpu, self.k_cpu, self.v_cpu, lens, values, int(self.kernel.num_sm),
                               int(self.kernel.arch))

    def correct(self, out, lens) -> bool:
        import torch

        from gpu_impl.oracle_check import closeness
        from refmodel.tolerance import reference_outputs

        from gpu_impl.oracle_check import nan_rows

        if nan_rows(out):
            return False
        exact, lowp = reference_outputs(self.q_cpu, self.k_cpu, self.v_cpu,
                                        cache_seqlens=torch.tensor(list(lens), dtype=torch.int32), causal=True)
        return bool(closeness(out.float().cpu(), exact, lowp)[0])


def _has_nan(out) -> bool:
    from gpu_impl.oracle_check import nan_rows

    return bool(nan_rows(out))


def _semaphore_offset(schedule) -> int:
    from refmodel.metadata_layout import MetadataLayout

    return MetadataLayout.for_schedule(schedule).semaphore_offset


def _observe(name: str, body) -> dict:
    o = {"name": name}
    try:
        body(o)
    except Exception as exc:  # recorded; the other observations still run
        o["error"] = f"{type(exc).__name__}: {exc}"
    return o


def lifecycle_task(adapter: dict, seed: int = 0, part: str = "reuse") -> dict:
    """Worker task on the real kernel: one part (:data:`PARTS`) of the module doc's observations, each with its
    prediction."""
    import torch

    from .tasks import task_kernel

    kernel = task_kernel(adapter, "gpu-like")
    num_sm = int(kernel.num_sm)
    observations = []
    if part == "reuse":
        bench = _Bench(kernel, BATCH, WIDTH, seed)
        schedule = bench.schedule(LENS_A)
        sem = _semaphore_offset(schedule)

        def reused(o):
            cs = bench.lens(LENS_A)
            md = bench.precompute(cs)
            torch.cuda.synchronize()
            values = [int(x) for x in md.cpu().tolist()]
            pred = predict_launch(values, schedule, values[sem], num_sm)
            o.update(launches=REUSED_LAUNCHES, s_c=schedule.num_splits, tiles=pred["tiles"],
                     semaphore_before=values[sem])
            outs, sems = [], []
            for _ in range(REUSED_LAUNCHES):
                outs.append(bench.call(cs, md).clone())
                torch.cuda.synchronize()
                sems.append(int(md[sem].item()))
            o["predicted"] = {"semaphore_after": [pred["semaphore_after"]] * REUSED_LAUNCHES, "output_correct": True,
                              "outputs_identical": True}
            o["observed"] = {"semaphore_after": sems, "output_correct": bench.correct(outs[0], LENS_A),
                             "outputs_identical": all(torch.equal(outs[0], x) for x in outs[1:])}

        observations.append(_observe("reused_metadata", reused))
        many = _Bench(kernel, MANY_BATCH, MANY_WIDTH, seed + 1)
        many_schedule = many.schedule(MANY_LENS)
        many_sem = _semaphore_offset(many_schedule)
        for start in (0, 1, 8):
            def stale(o, start=start):
                cs = many.lens(MANY_LENS)
                md = many.precompute(cs)
                torch.cuda.synchronize()
                values = [int(x) for x in md.cpu().tolist()]
                pred = predict_launch(values, many_schedule, start, num_sm)
                o.update(start=start, s_c=many_schedule.num_splits, tiles=pred["tiles"],
                         skipped_tiles=pred["skipped_tiles"])
                md[many_sem] = start
                # what the caching allocator hands the call's partial buffers next holds NaN
                torch.full((64 << 20,), float("nan"), dtype=torch.float32, device=many.dev)
                out = many.call(cs, md)
                torch.cuda.synchronize()
                o["predicted"] = {"semaphore_after": [pred["semaphore_after"]],
                                  "output_correct": pred["skipped_tiles"] == 0}
                o["observed"] = {"semaphore_after": [int(md[many_sem].item())],
                                 "output_correct": many.correct(out, MANY_LENS),
                                 "nan": _has_nan(out)}

            observations.append(_observe(f"semaphore_start_{start}", stale))
    elif part in ("graph", "graph_heads"):
        worked = part == "graph_heads"
        bench = _Bench(kernel, BATCH, WORKED_WIDTH if worked else WIDTH, seed + 2)
        first = WORKED_LENS if worked else LENS_A
        cs_buf = bench.lens(first)
        md = bench.precompute(cs_buf)
        n = int(md.numel())
        buf = torch.zeros(n + 64, dtype=torch.int32, device=bench.dev)
        buf[:n].copy_(md)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            bench.call(cs_buf, buf[:n])
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out_static = bench.call(cs_buf, buf[:n])
        torch.cuda.synchronize()

        def replay(o, lens, heads, recompute: bool):
            cs = bench.lens(lens)
            if recompute:
                fresh = bench.precompute(cs, heads)
                torch.cuda.synchronize()
                if fresh.numel() != n:
                    raise RuntimeError(f"the recomputed metadata has {fresh.numel()} ints, the captured view {n}")
                buf[:n].copy_(fresh)
            cs_buf.copy_(cs)
            values = [int(x) for x in buf[:n].cpu().tolist()]
            viol = bench.violations(lens, values)
            o.update(lens=list(lens), precompute_heads=list(heads), recomputed=recompute, violations=viol)
            o["predicted"] = {"output_correct": not viol}
            graph.replay()
            torch.cuda.synchronize()
            o["observed"] = {"output_correct": bench.correct(out_static, lens),
                             "nan": _has_nan(out_static)}

        if worked:
            observations.append(_observe("graph_replay_pre_fix_heads",
                                         lambda o: replay(o, WORKED_LENS, PRE_FIX_HEADS, True)))
        else:
            observations.append(_observe("graph_replay_recomputed",
                                         lambda o: replay(o, LENS_B, (HEADS, HEADS_K), True)))
            observations.append(_observe("graph_replay_stale", lambda o: replay(o, LENS_C, (HEADS, HEADS_K), False)))
    else:
        raise ValueError(f"part: one of {PARTS}, got {part!r}")
    return {"observations": observations, "describe": kernel.describe()}
