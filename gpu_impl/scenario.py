"""One entry point that runs a scenario: a configuration plus a sequence of batches, end to end.

A scenario is what a case file describes (spec.model.cases): server and model, the backend policy (guard,
metadata head counts, runner hygiene), and steps (decode, extend, mixed, idle). `run_scenario` drives the
eager runner (CP-v2 metadata lifetime), distributes decode batches over attention DP ranks, lets the backend
precompute (or skip) FA3 metadata, and checks every call: at the metadata level always (spec's invariants),
and with tensors through a kernel adapter when `numerics=True`, comparing with the float64 oracle.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from refmodel.fa3_builds import UPSTREAM as UPSTREAM_BUILD
from spec.finding import Outcome
from spec.violation import Violation

from .backend import DecodeCall, FlashAttentionBackend
from .config import ModelConfig, ServerConfig
from .runner import Batch, EagerRunner, ForwardMode

MODES = {"decode": ForwardMode.DECODE, "extend": ForwardMode.EXTEND, "mixed": ForwardMode.MIXED,
         "idle": ForwardMode.IDLE}


@dataclass
class Step:
    """One forward step: its mode and lengths (extend_lens for extend/mixed, None for decode/idle)."""

    mode: str
    seq_lens: list[int]
    extend_lens: Optional[list[int]] = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"batches[].mode: must be one of {sorted(MODES)}, got {self.mode!r}")
        if any(int(s) < 1 for s in self.seq_lens):
            raise ValueError(f"batches[].seq_lens: every length must be >= 1, got {self.seq_lens}")

    def to_dict(self) -> dict:
        return {"mode": self.mode, "seq_lens": list(self.seq_lens), "extend_lens": self.extend_lens}


@dataclass
class Scenario:
    """A configuration, a backend policy and a sequence of steps (what a case file replays)."""

    server: ServerConfig
    model: ModelConfig
    guard: Callable[[Any], Any]
    steps: list[Step]
    guard_spec: str = "fixed"
    metadata_heads: str = "tp"
    clear_stale_cp_metadata: bool = True
    seed: int = 0
    #: the ``max_seqlen_k`` a CUDA-graph replay precomputes with (``gpu_impl.backend.GRAPH_REPLAY_SEQLEN_K``)
    graph_replay_seqlen_k: str = "max_seq_len"
    #: the FA3 build (refmodel.fa3_builds) the backend's precompute and calls are scheduled and judged under: the
    #: one the release's kernel wheel ships (spec.model.engine_profiles), upstream's by default
    fa3_build: str = UPSTREAM_BUILD
    #: seeded defects (names in gpu_impl.defects.DEFECTS, applied by gpu_impl.defects.seed_run); a SeededPolicy
    #: guard adds its own
    defects: frozenset = frozenset()
    #: engine-owned options (``{options key: object}``, ``gpu_impl.plugin.EnginePlugin.options_key``) of a case drawn
    #: for one engine's configuration; only that engine runs them (empty: any system under test)
    options: dict = field(default_factory=dict)
    #: the driven sequence of a lifecycle case (``spec.model.case_lifecycle``: ``layers`` a step, ``engine_defect``);
    #: the engine drivers run it (sglang: the run request's ``layers``/``lifecycle_defect``; vLLM: ``num_layers``/
    #: ``lifecycle_defect``); None: one layer, no engine defect
    lifecycle: Optional[dict] = None

    def all_defects(self) -> frozenset:
        """The defects in force: ``defects`` plus those the guard carries (``gpu_impl.defects.scenario_defects``)."""
        from .defects import scenario_defects

        return scenario_defects(self)


@dataclass
class ScenarioResult:
    """Findings, the per-step trace of every metadata computation and call, and outputs (numerics only)."""

    findings: list[Violation] = field(default_factory=list)
    shape_errors: list[Violation] = field(default_factory=list)
    trace: list[dict] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def outcome(self) -> Outcome:
        """VIOLATION when the run found something, else SHAPE_ERROR (FA3's loud check), else PASS."""
        return Outcome.of(self.findings, self.shape_errors)


def distribute_over_dp(seq_lens: Sequence[int], attn_dp_size: int) -> list[list[int]]:
    """Split a global decode batch over attention DP ranks round-robin (row i to rank i % dp)."""
    ranks: list[list[int]] = [[] for _ in range(attn_dp_size)]
    for i, length in enumerate(seq_lens):
        ranks[i % attn_dp_size].append(int(length))
    return ranks


@dataclass
class ScenarioRun:
    """Per-run state: one eager runner per attention DP rank, and which scenario step built each batch."""

    scn: Scenario
    runners: list = field(default_factory=list)
    batch_steps: dict = field(default_factory=dict)

    def runner(self, dp_rank: int) -> EagerRunner:
        while len(self.runners) <= dp_rank:
            self.runners.append(EagerRunner(self.scn.server,
                                            clear_stale_cp_metadata=self.scn.clear_stale_cp_metadata))
        return self.runners[dp_rank]

    def step(self, dp_rank: int, batch: Batch, index: int):
        """Step DP rank `dp_rank`'s runner on `batch`, remembering the scenario step that built the batch."""
        self.batch_steps[batch.batch_id] = index
        return self.runner(dp_rank).step(batch)


def prepare_run(scn: Scenario, kernel=None):
    """(scenario with its seeded defects applied, its backend, the kernel playing the scenario's GPU).

    The in-process run and every rank of a multi-process run start here, so both see the same defects, applied
    from outside by ``gpu_impl.defects.seed_run``. The emulator takes the server's SM count; real FA3 runs on its
    own device.
    """
    from .defects import seed_run

    scn, backend, kernel = seed_run(scn, _backend_of, kernel)
    if kernel is not None and hasattr(kernel, "with_num_sm"):
        kernel = kernel.with_num_sm(scn.server.num_sm)
    return scn, backend, kernel


def _backend_of(scn: Scenario) -> FlashAttentionBackend:
    return FlashAttentionBackend(scn.server, scn.model, scn.guard, scn.metadata_heads,
                                 graph_replay_seqlen_k=scn.graph_replay_seqlen_k, fa3_build=scn.fa3_build)


def run_scenario(scn: Scenario, kernel=None, numerics: bool = False, device: str = "cpu") -> ScenarioResult:
    """Run every step of a scenario; findings name the invariant, the step and the DP rank.

    Numerics run the emulated kernel, which models upstream's FA3: such a run is judged under upstream's build
    whatever build the scenario names (as the engines' stand-ins do), so metadata and outputs come from one build.
    """
    if numerics and scn.fa3_build != UPSTREAM_BUILD:
        scn = dataclasses.replace(scn, fa3_build=UPSTREAM_BUILD)
    scn, backend, kernel = prepare_run(scn, kernel)
    run = ScenarioRun(scn)
    result = ScenarioResult()
    for index, step in enumerate(scn.steps):
        if step.mode in ("extend", "mixed"):
            _run_extend_step(run, index, step, result, numerics=numerics, device=device)
        else:
            seqs = step.seq_lens if step.mode == "decode" else []
            step_decode_runners(run, index, seqs)
            _run_decode_step(backend, scn, index, seqs, result, kernel, numerics, device)
    return result


def step_decode_runners(run: ScenarioRun, index: int, seq_lens: Sequence[int], only_rank: Optional[int] = None) -> None:
    """A decode step passes through every DP rank's runner too: prepare_for_decode clears CP metadata
    (schedule_batch.py); a rank with no rows runs IDLE. `only_rank` restricts it to one rank (multi-process)."""
    for dp_rank, rows in enumerate(distribute_over_dp(seq_lens, run.scn.server.attn_dp_size)):
        if only_rank is not None and dp_rank != only_rank:
            continue
        mode = ForwardMode.DECODE if rows else ForwardMode.IDLE
        run.step(dp_rank, Batch(mode=mode, seq_lens=tuple(rows)), index)


#: Extend numerics above this many attention scores (heads x sum of extend_len * seq_len) are skipped, and the
#: trace says so: the float64 oracle is quadratic, and numerics cases use short sequences (< 64 tokens).
EXTEND_NUMERICS_MAX_SCORES = 1 << 22


def distribute_extend_over_dp(seq_lens: Sequence[int], extend_lens: Sequence[int],
                              attn_dp_size: int) -> list[tuple[list[int], list[int]]]:
    """Split a global extend batch over attention DP ranks round-robin, as `distribute_over_dp` does for decode
    (each DP rank's scheduler runs its own requests; python/sglang/srt/managers/data_parallel_controller.py)."""
    seqs = distribute_over_dp(seq_lens, attn_dp_size)
    exts: list[list[int]] = [[] for _ in range(attn_dp_size)]
    for i, length in enumerate(extend_lens):
        exts[i % attn_dp_size].append(int(length))
    return list(zip(seqs, exts))


def _run_extend_step(run: ScenarioRun, index: int, step: Step, result: ScenarioResult,
                     numerics: bool = False, device: str = "cpu") -> None:
    scn = run.scn
    extend = step.extend_lens if step.extend_lens is not None else list(step.seq_lens)
    shares = distribute_extend_over_dp(step.seq_lens, extend, scn.server.attn_dp_size)
    for dp_rank, (seqs, exts) in enumerate(shares):
        if not seqs:
            continue  # an idle DP rank runs no extend (IDLE forward)
        batch = Batch(mode=MODES[step.mode], seq_lens=tuple(seqs), extend_lens=tuple(exts))
        trace = run.step(dp_rank, batch, index)
        entry = extend_trace_entry(index, step.mode, dp_rank, trace)
        result.trace.append(entry)
        finding = cp_path_finding(run.batch_steps, index, step.mode, dp_rank, trace)
        if finding is not None:
            result.findings.append(finding)
        if numerics:
            _run_extend_numerics(scn, index, dp_rank, batch, trace.took_cp_path, entry, result, device)


def cp_path_finding(batch_steps: dict, index: int, mode: str, dp_rank: int, trace) -> Optional[Violation]:
    """CP_PATH_MATCHES_ACTIVITY when the backend's CP path choice differs from CP-v2 activity (the runner fix of
    PR #30439, eager_runner.py), naming the step the attached CP metadata was built at; else None."""
    if trace.took_cp_path == trace.cp_v2_active:
        return None
    built = None if trace.metadata_built_for is None else \
        batch_steps.get(trace.metadata_built_for)
    source = "no CP metadata" if trace.metadata_built_for is None else (
        f"CP metadata built at step {built}" if built is not None else "CP metadata built outside this scenario")
    return Violation.at_step(
        "CP_PATH_MATCHES_ACTIVITY", index, dp_rank,
        f"step {index} ({mode}): backend took the CP path={trace.took_cp_path} but CP-v2 active="
        f"{trace.cp_v2_active}; {source}, this is step {index}",
        {"mode": mode, "stale": trace.metadata_was_stale, "metadata_built_at_step": built})


def extend_trace_entry(index: int, mode: str, dp_rank: int, trace) -> dict:
    """The trace record of one DP rank's extend step (the CP-v2 decisions of eager_runner.py, modelled in runner.py)."""
    return {"step": index, "mode": mode, "dp_rank": dp_rank, "cp_v2_active": trace.cp_v2_active,
            "took_cp_path": trace.took_cp_path, "cp_metadata_was_stale": trace.metadata_was_stale,
            "cp_metadata_built": trace.built_metadata}


def extend_numerics_plan(scn: Scenario, batch: Batch, took_cp_path: bool) -> tuple[str, Optional[str]]:
    """Which extend path the backend runs and whether numerics run: ("cp" | "plain", None) or (path, skip reason)
    (forward_extend in flashattention_backend.py chooses the CP branch when the runner left CP metadata)."""
    path = "cp" if took_cp_path else "plain"
    h, _ = scn.server.layer_heads(scn.model)
    scores = h * sum(e * s for e, s in zip(batch.extend_lens, batch.seq_lens))
    if scores > EXTEND_NUMERICS_MAX_SCORES:
        return path, f"skipped: {scores} attention scores > {EXTEND_NUMERICS_MAX_SCORES}"
    return path, None


def extend_tensors(scn: Scenario, index: int, dp_rank: int, batch: Batch, device: str = "cpu"):
    """Seeded q/k/v of one DP rank's extend batch with the layer's head counts and the real head dims (bf16), as
    an attention module such as qwen3_moe.py holds them."""
    from .cp_attention import prefill_tensors

    h, hk = scn.server.layer_heads(scn.model)
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(scn.model.dtype, torch.bfloat16)
    return prefill_tensors(batch.seq_lens, batch.extend_lens, h, hk, scn.model.head_dim, scn.model.head_dim_v,
                           seed=rank_seed(scn.seed, index, dp_rank), dtype=dtype, device=device)


def layout_mismatch_finding(index: int, dp_rank: int, mode: str, exc) -> Violation:
    """The finding for a stale CP layout on a batch it was not built for (prepare_cp_forward, cp/utils.py)."""
    return Violation.at_step("CP_LAYOUT_MATCHES_BATCH", index, dp_rank, str(exc),
                             {"mode": mode, "path": "cp", **exc.detail})


def judge_extend_output(index: int, dp_rank: int, mode: str, path: str, batch: Batch, q, k, v,
                        out: torch.Tensor) -> Optional[Violation]:
    """Compare an extend output with the oracle (full causal attention, no CP) under FA3's tolerance rule
    (``gpu_impl.oracle_check``, a NaN output read as a closeness miss); None when it matches, else a
    MATCHES_ORACLE finding with the rows past the bound."""
    from refmodel.tolerance import reference_outputs

    from .cp_attention import plain_call_args
    from .oracle_check import compare_output

    args = plain_call_args(q, k, v, batch.seq_lens, batch.extend_lens)
    exact, low = reference_outputs(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), **args)
    miss = compare_output(out, exact, low, nan_check=False, error_rows=True)
    if miss is None:
        return None
    return Violation.at_step(miss.invariant, index, dp_rank, f"step {index} ({mode}, {path} path): {miss.message}",
                             {"mode": mode, "path": path, **miss.detail,
                              "seq_lens": list(batch.seq_lens), "extend_lens": list(batch.extend_lens)})


def _run_extend_numerics(scn: Scenario, index: int, dp_rank: int, batch: Batch, took_cp_path: bool, entry: dict,
                         result: ScenarioResult, device: str) -> None:
    from .cp_attention import CPLayoutMismatch, cp_prefill_attention, plain_prefill_attention

    path, skip = extend_numerics_plan(scn, batch, took_cp_path)
    entry["numerics"] = skip or path
    if skip:
        return
    q, k, v = extend_tensors(scn, index, dp_rank, batch, device)
    if path == "cp":
        layout = batch.attn_cp_metadata.layout
        try:
            res = cp_prefill_attention(layout, q, k, v, seq_lens=batch.seq_lens, extend_lens=batch.extend_lens)
        except CPLayoutMismatch as exc:
            entry["numerics"] = "layout_mismatch"
            result.findings.append(layout_mismatch_finding(index, dp_rank, batch.mode.value, exc))
            return
        entry["cp_calls"] = [c.to_dict() for c in res.calls]
        out = res.out
    else:
        out, _ = plain_prefill_attention(q, k, v, batch.seq_lens, batch.extend_lens)
    finding = judge_extend_output(index, dp_rank, batch.mode.value, path, batch, q, k, v, out)
    if finding is not None:
        result.findings.append(finding)
        return
    result.outputs.append(out.detach().cpu())


def _run_decode_step(backend: FlashAttentionBackend, scn: Scenario, index: int, seq_lens: Sequence[int],
                     result: ScenarioResult, kernel, numerics: bool, device: str) -> None:
    dp_batches = distribute_over_dp(seq_lens, scn.server.attn_dp_size)
    for call in backend.decode_calls(dp_batches):
        verdict = backend.check_decode(call)
        entry = {"step": index, "mode": "decode", **verdict.to_dict()}
        result.trace.append(entry)
        detail = {"mode": "decode", "path": call.path, "s_p": verdict.s_p, "s_c": verdict.s_c,
                  "seq_lens": call.seq_lens}
        if verdict.shape_error:
            result.shape_errors.append(Violation.at_step("SHAPE", index, call.dp_rank, verdict.shape_error, detail))
            continue
        if numerics and backend.metadata_only:
            entry["numerics"] = backend.metadata_only
        if not numerics or backend.metadata_only:
            for v in verdict.violations:
                d = v.to_dict() if hasattr(v, "to_dict") else dict(v)
                result.findings.append(Violation.at_step(d.get("invariant", "UNKNOWN"), index, call.dp_rank,
                                                         d.get("message", str(d)), {**detail, **d}))
            continue
        _run_decode_numerics(backend, scn, index, call, result, kernel, device, detail)


def _run_decode_numerics(backend: FlashAttentionBackend, scn: Scenario, index: int, call: DecodeCall,
                         result: ScenarioResult, kernel, device: str, detail: dict) -> None:
    from .errors import MetadataShapeError, OutOfBoundsAccess

    tensors = decode_tensors(backend, call, seed=rank_seed(scn.seed, index, call.dp_rank), device=device)
    layers = [False] + ([True] if scn.model.has_sliding_window_layers else [])
    for sliding in layers:
        try:
            out, lse = backend.forward_decode(kernel, call, *tensors, sliding_window=sliding)
        except OutOfBoundsAccess as exc:
            result.findings.append(Violation.at_step(exc.invariant, index, call.dp_rank, str(exc),
                                                     {**detail, "batch": exc.batch, "indices": jsonable(exc.indices)}))
            return
        except MetadataShapeError as exc:
            result.shape_errors.append(Violation.at_step("SHAPE", index, call.dp_rank, str(exc), detail))
            return
        finding = judge_decode_output(scn, backend, index, call, sliding, out, detail, tensors)
        if finding is not None:
            result.findings.append(finding)
            return
        result.outputs.append(out[: call.real_rows].detach().cpu())


def judge_decode_output(scn: Scenario, backend: FlashAttentionBackend, index: int, call: DecodeCall, sliding: bool,
                        out: torch.Tensor, detail: dict, tensors=None) -> Optional[Violation]:
    """Compare one decode call's output rows (the real ones, not a CUDA graph's padding) with the oracle over the
    call's seeded tensors (``tensors``, else made again from the scenario's seed: rank 0 of a multi-process run) under
    FA3's tolerance rule (``gpu_impl.oracle_check``); None when it matches, else its NO_NAN or MATCHES_ORACLE
    finding at this step."""
    from refmodel.tolerance import reference_outputs

    from .oracle_check import compare_output

    if tensors is None:
        tensors = decode_tensors(backend, call, seed=rank_seed(scn.seed, index, call.dp_rank))
    q, k_cache, v_cache, page_table = tensors
    seqlens = torch.tensor(call.seq_lens, dtype=torch.int32, device=q.device)
    cu = torch.arange(len(call.seq_lens) + 1, dtype=torch.int32, device=q.device)
    ref, low = reference_outputs(q, k_cache, v_cache, cache_seqlens=seqlens, cu_seqlens_q=cu, max_seqlen_q=1,
                                 page_table=page_table, causal=True)
    rows = call.real_rows
    miss = compare_output(out[:rows], ref[:rows], low[:rows])
    if miss is None:
        return None
    return Violation.at_step(miss.invariant, index, call.dp_rank, miss.message,
                             {**detail, **miss.detail, "sliding_window": sliding})


def decode_tensors(backend: FlashAttentionBackend, call: DecodeCall, seed: int, device: str = "cpu"):
    """Seeded q, paged k/v caches and a page table for one decode call, with the layer's head counts.

    Pages are assigned in a seeded random order so page-table indexing is exercised; padded rows (CUDA graph)
    point at page 0.
    """
    model, page = backend.model, backend.server.page_size
    h, hk = call.call_heads
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(model.dtype, torch.bfloat16)
    gen = torch.Generator().manual_seed(seed)
    bs = len(call.seq_lens)
    width = call.call_seqlen_k // page
    pages_needed = [-(-n // page) for n in call.seq_lens]
    total_pages = max(1, sum(pages_needed))
    perm = torch.randperm(total_pages, generator=gen)
    table = torch.zeros((bs, width), dtype=torch.int32)
    used = 0
    for row, need in enumerate(pages_needed):
        table[row, :need] = perm[used:used + need].to(torch.int32)
        used += need
    q = torch.randn((bs, h, model.head_dim), generator=gen).to(dtype)
    k = torch.randn((total_pages, page, hk, model.head_dim), generator=gen).to(dtype)
    v = torch.randn((total_pages, page, hk, model.head_dim_v), generator=gen).to(dtype)
    return q.to(device), k.to(device), v.to(device), table.to(device)


def rank_seed(base: int, step: int, rank: Optional[int]) -> int:
    digest = hashlib.sha256(json.dumps([base, step, rank]).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def jsonable(x):
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, range)):
        return [jsonable(v) for v in x]
    if isinstance(x, torch.Tensor):
        return x.tolist()
    return x
