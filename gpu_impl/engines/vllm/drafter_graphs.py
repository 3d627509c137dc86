"""The V2 runner's FULL draft-decode CUDA graphs: the release's speculator dispatches its draft decode through its own
``SpeculatorCudaGraphManager`` (``spec_decode/autoregressive/cudagraph_utils.py``), captures the draft decode routine
it replays (the fused loop ``_fused_multi_step_decode`` where the builders support the draft-decode metadata update,
DCP 1; one ``_decode`` step otherwise) and replays it with ``run_fullgraph``.

Invariant: what decides is vLLM's code, run on the drafter's stand-in ``self`` (``drafter_v2``): the speculator's
``init_cudagraph_manager`` makes the decode graph manager (FULL_DECODE_ONLY under a FULL decode mode), its
``_run_multi_step_decode`` dispatches (``dispatch_cg_and_sync_dp``, ``specialize_spec_tokens``; 0.34 on: before,
``propose`` makes that call inline and the driver makes it as ``propose`` does, then calls the release's multi-step
entry) and runs the fused or the eager path, its ``capture`` captures the decode routine through the manager's own ``create_forward_fn``
(``prepare_inputs_to_capture`` with the capture batch, ``max_seq_len = max_model_len``). A graph holds what its
capture ran: with the fused update, each draft step's FA3 precompute (``update_draft_decode_metadata`` ->
``get_scheduler_metadata`` with the capture's scalars), the builder's store into its persistent buffer
(``_store_scheduler_metadata``) and the step's FA3 call; a replay re-issues them in order on the persistent buffers
as the replay found them (the capture-time scalars, the replay-time ``seq_lens``), which is what a CUDA-graph replay
launches: the metadata a replayed draft call reads is the one recomputed inside the same replay.

Stood in (listed in :data:`STOOD_IN`): the CUDA-graph capture itself (``CudaGraphManager.capture``'s
``torch.cuda.graph``: the decode routine of the descriptor a batch dispatches to is run once with its launches
recorded, on first use; the warm-up run before it is left out, as in ``driver_v2``), the replay of the captured store
(the release's own ``_store_scheduler_metadata`` called on the replay's recompute, standing for its captured device
copy), the draft model's advance of the batch inside a replayed graph (the real requests' rows one token further),
the speculative config (``SpeculativeConfig`` needs a draft model's config: a stand-in with method ``eagle``, the
scenario's draft tokens, no dynamic speculation, no multi-module MTP; read by ``init_cudagraph_manager`` through
``VllmConfig.get_draft_decode_cudagraph_request_sizes`` and by the capture's ``num_speculative_tokens``) and the draft
prefill's graph manager (the draft prefill is not driven: its capture does nothing) and, before 0.34, ``propose``'s
draft-decode dispatch (the same ``dispatch_cg_and_sync_dp`` call over the decode manager, one token per request).
"""

from __future__ import annotations

import types

from gpu_impl.engines.protocol import Unsupported

__all__ = ["STOOD_IN", "PATH", "run_graphed"]

STOOD_IN = (
    "the V2 drafter's FULL draft-decode graphs: the CUDA-graph capture (the dispatched descriptor's decode routine run "
    "once with its launches recorded, on first use, no warm-up run), the replay of the captured store (the release's "
    "_store_scheduler_metadata on the replay's recompute), the draft model's advance inside a replay (the real "
    "requests' rows), the speculative config (method eagle, the scenario's draft tokens, no dynamic speculation) and "
    "the draft prefill's graph manager (no capture); before 0.34, propose's draft-decode dispatch "
    "(dispatch_cg_and_sync_dp over the decode manager, one token per request, as propose calls it)",
)

#: the reach label of a draft call made inside a FULL draft-decode graph (its capture or a replay)
PATH = "V2 drafter FULL graph"


class _SpeculativeConfigStandIn:
    """What the speculator's graph code reads of ``SpeculativeConfig`` (a draft model's config would need loading)."""

    method = "eagle"
    draft_decode_context_parallel_size = None
    enable_adaptive_verification = False

    def __init__(self, steps: int):
        self.num_speculative_tokens = steps

    def use_multi_module_mtp(self) -> bool:
        return False

    def use_gemma4_mtp(self) -> bool:
        return False

    def uses_dynamic_speculative_decoding(self) -> bool:
        return False


class _ConfigWithSpeculator:
    """The release's ``VllmConfig`` as the speculator sees it, with the speculative config stand-in: its own methods and
    properties run on this object (so they read the stand-in), every other field is the config's."""

    def __init__(self, vc, speculative):
        self._vc, self.speculative_config = vc, speculative

    def __getattr__(self, name):
        attr = getattr(type(self._vc), name, None)
        if isinstance(attr, property):
            return attr.fget(self)
        if isinstance(attr, types.FunctionType):
            return types.MethodType(attr, self)
        return getattr(self._vc, name)


class _NoPrefillGraphs:
    """The draft prefill's graph manager: not driven (the draft prefill reuses the target's metadata)."""

    use_breakable_cg = False

    def capture(self, *args, **kwargs) -> None:
        return None


class _DraftGraph:
    """A captured FULL draft-decode graph: the launches its capture recorded, re-issued in order at each replay."""

    def __init__(self, ops, replay):
        self.ops, self._replay = ops, replay

    def replay(self) -> None:
        self._replay(self.ops)


def supported(cls) -> bool:
    """Whether the release's speculator has the draft-decode graph manager and capture this module drives
    (``init_cudagraph_manager`` and ``capture``: 0.28 on)."""
    return all(hasattr(cls, m) for m in ("init_cudagraph_manager", "capture"))


def run_graphed(spec, cfg, front, n: int, upper, steps: int, prepare_inputs, advance, state, entry) -> None:
    """The draft decode steps of a batch of ``n`` requests under the scenario's FULL decode mode, through the
    release's ``_run_multi_step_decode`` (module doc). ``prepare_inputs``: the drafter's ``_prepare_decode_inputs``
    stand-in; ``advance(rows)``: the draft model's advance; ``state["ops"]``: the list the draft model's stand-in
    records its advance in while a graph is captured; ``entry(desc)``: the release's multi-step draft decode entry
    on a dispatched descriptor (before 0.34, where ``propose`` dispatches inline)."""
    import torch
    import vllm.v1.worker.gpu.cudagraph_utils as cg
    from vllm.config.compilation import CUDAGraphMode

    if not supported(type(spec)):
        raise Unsupported("draft_tokens: the V2 runner's draft decode under a FULL CUDA graph is driven where the "
                          "speculator has its own draft-decode graph manager (init_cudagraph_manager, capture)")
    spec.vllm_config = _ConfigWithSpeculator(cfg.vc, _SpeculativeConfigStandIn(steps))
    spec.speculative_config = spec.vllm_config.speculative_config
    spec.model_state, spec.dp_size, spec.dp_rank, spec.device = cfg.model_state, 1, 0, torch.device("cpu")
    spec.prefill_cudagraph_manager = _NoPrefillGraphs()
    spec.last_token_indices = torch.zeros(cfg.s["max_num_seqs"], dtype=torch.int64)
    spec.target_input_buffers, spec.target_attn_groups = cfg.buffers, cfg.attn_groups  # read by capture() (0.28 ..)
    spec.init_cudagraph_manager(cfg.mode)  # the release's own: FULL_DECODE_ONLY under a FULL decode mode
    spec.prefill_cudagraph_manager = _NoPrefillGraphs()  # made there too before 0.34: the draft prefill, not driven
    manager = spec.decode_cudagraph_manager
    # every descriptor counts as captured (vLLM captures them all at start-up); each is captured on first use and
    # kept for the scenario's later steps (the launches it recorded: cfg.draft_graph_ops)
    manager._graphs_captured = True
    kept = cfg.__dict__.setdefault("draft_graph_ops", {})
    builder = cfg.builder
    pre_plain, store_plain = front.c_get_scheduler_metadata, builder._store_scheduler_metadata

    def replay(ops) -> None:
        start = len(front.checker.events)
        front.path, front.checker.replaying = "replay", True
        try:
            md = None
            for op in ops:
                if isinstance(op, dict):
                    front.c_fwd(**op)
                elif op[0] == "pre":
                    md = pre_plain(**op[1])
                elif op[0] == "store":
                    store_plain(md)
                else:
                    advance(n)
        finally:
            front.path, front.checker.replaying = "eager", False
        cfg.draft_graph.update({i: "replay" for i in range(start, len(front.checker.events))})

    def capture_one(self, create_forward_fn, progress_bar_desc="", stream=None):
        """``CudaGraphManager.capture``, stood in: the pending descriptor's routine run once, its launches
        recorded (the FA3 precomputes, the builder's stores, the calls, the draft model's advance)."""
        desc = pending[0]
        forward_fn = create_forward_fn(desc, warmup=False)
        ops: list = []

        def pre(**a):
            ops.append(("pre", dict(a)))
            return pre_plain(**a)

        def store(md):
            ops.append(("store",))
            return store_plain(md)

        start = len(front.checker.events)
        front.c_get_scheduler_metadata, builder._store_scheduler_metadata = pre, store
        front.recording, state["ops"] = ops, ops
        try:
            forward_fn(CUDAGraphMode.NONE)
        finally:
            front.recording, state["ops"] = None, None
            front.c_get_scheduler_metadata, builder._store_scheduler_metadata = pre_plain, store_plain
        cfg.draft_graph.update({i: "capture" for i in range(start, len(front.checker.events))})
        self.graphs[desc] = _DraftGraph(ops, replay)
        kept[desc] = ops

    manager.graphs.update({desc: _DraftGraph(ops, replay) for desc, ops in kept.items()})
    dispatch_plain = manager.dispatch
    pending: list = []

    def dispatch(*args, **kwargs):
        """The manager's own dispatch; a FULL descriptor not captured yet is captured now (graphs on first use)."""
        desc = dispatch_plain(*args, **kwargs)
        if desc.cg_mode == CUDAGraphMode.FULL and desc not in manager.graphs:
            pending[:] = [desc]
            base = cg.CudaGraphManager.capture
            cg.CudaGraphManager.capture = capture_one
            try:
                spec.capture()  # the release's own: the draft prefill's (stood in: nothing) and the decode routine's
            finally:
                cg.CudaGraphManager.capture = base
        return desc

    manager.dispatch = dispatch
    if hasattr(spec, "_run_multi_step_decode"):  # 0.34 on: the speculator dispatches its draft decode itself
        spec._prepare_decode_inputs = prepare_inputs
        spec._run_multi_step_decode(None, None, n, False, None, upper, False, steps)
        return
    # before 0.34, propose dispatches inline: the same call, as propose makes it (dispatch_cg_and_sync_dp over the
    # decode manager, one token per request), then the release's own multi-step entry (entry)
    from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp

    desc, _ = dispatch_cg_and_sync_dp(manager, n, n, uniform_token_count=1, dp_size=1, dp_rank=0)
    prepare_inputs()
    entry(desc)
