"""The drafter on the V2 model runner: after a target step, the draft decode steps of the release's autoregressive
speculator (``vllm/v1/worker/gpu/spec_decode/``, 0.28.0 on), each draft step's metadata made by the release's own code
and each call judged against its own precompute.

Invariant: what decides each draft step is vLLM's code, run unbound on a stand-in ``self`` of the speculator class
(built without its ``__init__``, which loads a draft model): the speculator's own choice
(``_configure_decode_metadata_update`` from 0.32, ``_configure_fused_multi_step_decode`` in 0.28 .. 0.31) between
the fused path, where every attention group ``supports_draft_decode_metadata_update`` (``_run_fused_multi_step_decode``
from 0.34, ``_fused_multi_step_decode`` before: the step-1 metadata built once, then before each draft step the
builder's ``update_draft_decode_metadata`` recomputes the FA3 scheduler metadata from the persistent ``seq_lens`` in
place, through the base class's ``_update_draft_decode_metadata`` from 0.32 and through each attention group in
``_generate_fused_drafts`` in 0.28 .. 0.31), and ``_multi_step_decode`` (the metadata rebuilt eagerly for each
step); the step metadata from ``_build_uniform_attn_metadata`` (0.30 on) or ``_build_draft_attn_metadata`` (0.28,
0.29). The real ``FlashAttentionImpl.forward`` makes each call.

Stood in (listed in :data:`STOOD_IN`): the draft model's forward in ``_decode`` (``_generate_draft`` before 0.34; the
layers' attention is run, the model is not) and its GPU advance of the batch after each draft step (``seq_lens`` and
``positions`` one token further for the real requests), ``_prepare_decode_inputs`` (one query token per request; each
sequence one token longer than the target step's, ``seq_lens_cpu_upper_bound`` the target step's lengths), the
runner's ``BlockTables.compute_slot_mappings`` (slots -1: no KV write is judged), and the Triton kernel of
``prepare_dcp_local_seq_lens`` (0.30: ``maybe_prepare_dcp_local_seq_lens``) the speculator module calls under DCP (as
for the target steps, ``driver_v2``). Not driven: the draft prefill (on the target batch: the target's metadata
reused, ``can_reuse_target_attn_metadata``) and a draft decode FULL CUDA graph (``SpeculatorCudaGraphManager``): a
scenario with draft tokens under a FULL graph mode is refused on the V2 runner.
"""

from __future__ import annotations

from gpu_impl.engines.protocol import Unsupported

__all__ = ["STOOD_IN", "SPECULATOR_MODULES", "speculator_class", "missing", "run_drafts"]

STOOD_IN = (
    "the V2 drafter's draft model: its forward in _decode (the layers' attention runs, nothing else) and its GPU "
    "advance after each draft step (seq_lens and positions one token further for the real requests); "
    "_prepare_decode_inputs (one query token per request, each sequence one token longer than the target step's, "
    "seq_lens_cpu_upper_bound the target step's lengths); propose's draft_max_seq_len (the target step's longest "
    "sequence plus the speculative steps, capped at max_model_len, as propose computes it); BlockTables.compute_slot_mappings (slots -1); the Triton "
    "kernel of prepare_dcp_local_seq_lens (0.30: maybe_prepare_dcp_local_seq_lens, None without DCP) in the speculator "
    "module (vLLM's get_dcp_local_seq_lens in torch)",
)

#: where the release's autoregressive speculator lives (the first module that has it): ``autoregressive`` (0.28 ..
#: 0.31 and 0.34 on), ``target_dependent_ar`` (0.32, 0.33)
SPECULATOR_MODULES = (("vllm.v1.worker.gpu.spec_decode.autoregressive.speculator", "AutoRegressiveSpeculator"),
                      ("vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator", "TargetDependentARSpeculator"))


def speculator_class():
    """The release's autoregressive speculator class with a fused draft-decode path beside the eager rebuild
    (``_fused_multi_step_decode`` and ``_multi_step_decode``; the step metadata from ``_build_uniform_attn_metadata``,
    0.30 on, or ``_build_draft_attn_metadata``, 0.28 and 0.29), or None where the release has none
    (:func:`missing` says what it lacks)."""
    return _speculator()[0]


def missing() -> str:
    """What the release lacks of the speculator this drafter drives, per module tried ('' where it has it)."""
    return _speculator()[1]


_NEEDED = (("_fused_multi_step_decode",), ("_multi_step_decode",),
           ("_build_uniform_attn_metadata", "_build_draft_attn_metadata"),
           ("_configure_decode_metadata_update", "_configure_fused_multi_step_decode"))


def _speculator():
    import importlib

    why = []
    for module, name in SPECULATOR_MODULES:
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError as exc:
            why.append(f"{module}: {type(exc).__name__}: {exc}")
            continue
        except AttributeError:
            why.append(f"{module} has no {name}")
            continue
        lacks = [" or ".join(alts) for alts in _NEEDED if not any(hasattr(cls, m) for m in alts)]
        if not lacks:
            return cls, ""
        why.append(f"{module}.{name} has no {', no '.join(lacks)}")
    return None, "; ".join(why)


#: the speculator's own choice between the fused update and the eager rebuild, and the flag it sets:
#: ``_configure_decode_metadata_update`` / ``supports_decode_metadata_update`` (0.32 on; the update through the base
#: class's ``_update_draft_decode_metadata``), ``_configure_fused_multi_step_decode`` / ``use_fused_multi_step_decode``
#: (0.28 .. 0.31; ``_generate_fused_drafts`` calls each attention group's ``update_draft_decode_metadata``)
_CONFIGURE = {"_configure_decode_metadata_update": "supports_decode_metadata_update",
              "_configure_fused_multi_step_decode": "use_fused_multi_step_decode"}


def _configure(spec) -> bool:
    """Run the release's own choice (fused update or eager rebuild); whether it chose the fused update."""
    for method, flag in _CONFIGURE.items():
        if hasattr(spec, method):
            getattr(spec, method)()
            return bool(getattr(spec, flag))
    raise AssertionError("speculator_class() checked one of them")


def _multi_step(spec, fused: bool):
    """The release's multi-step draft decode entry (``num_reqs, skip_attn, batch_desc, num_tokens_across_dp,
    seq_lens_cpu_upper_bound`` and, 0.32 on, ``num_speculative_steps``): fused, ``_run_fused_multi_step_decode``
    (0.34 on) or ``_fused_multi_step_decode`` (0.28 .. 0.33); else ``_multi_step_decode``."""
    if not fused:
        return spec._multi_step_decode
    return getattr(spec, "_run_fused_multi_step_decode", None) or spec._fused_multi_step_decode


class _SlotsStandIn:
    """The runner's ``BlockTables`` as the speculator reads it: its input tables, slot mappings and DCP fields."""

    def __init__(self, tables, num_tokens: int):
        import torch

        self._tables = tables
        self.input_block_tables = [tables.table]
        self.slot_mappings = torch.full((1, num_tokens), -1, dtype=torch.int64)
        self.cp_size, self.cp_rank, self.cp_interleave = tables.cp_size, tables.cp_rank, tables.cp_interleave

    def compute_slot_mappings(self, idx_mapping, query_start_loc, positions, num_tokens):
        return self.slot_mappings[:, :num_tokens]

    def __getattr__(self, name):  # a FULL draft graph's capture batch: the runner's (driver_v2's stand-in)
        return getattr(self._tables, name)


def _maybe_dcp_local_seq_lens(out, seq_lens, num_reqs, dcp_size, dcp_rank, cp_interleave, *, num_reqs_padded=None):
    """Stand-in for 0.30's ``cp_utils.maybe_prepare_dcp_local_seq_lens`` (a Triton kernel): None without DCP, as
    the release's own returns, else the local lengths as ``driver_v2.dcp_local_seq_lens`` computes them."""
    from gpu_impl.engines.vllm.driver_v2 import dcp_local_seq_lens

    if dcp_size == 1:
        return None
    return dcp_local_seq_lens(out, seq_lens, num_reqs, dcp_size, dcp_rank, cp_interleave,
                              num_reqs_padded=num_reqs_padded)


def run_drafts(cfg, query_lens, seq_lens, front) -> int:
    """The draft decode steps after one target step of ``cfg`` (a ``driver_v2.ConfigV2``), the scenario's
    ``draft_tokens`` being the speculator's ``num_speculative_steps``; the number of draft steps made."""
    import numpy as np
    import torch
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    steps = int(cfg.s.get("draft_tokens", 0) or 0)
    if steps <= 1:
        return 0  # one speculative token: no draft decode step (the speculator returns after its prefill)
    cls, lacks = _speculator()
    if cls is None:
        raise Unsupported("draft_tokens: this release's V2 runner has no autoregressive speculator with the fused "
                          "draft-decode path beside the eager rebuild that the V2 drafter drives (0.28 on): " + lacks)
    graphed = cfg.s["cuda_graph"] in ("full", "full_and_piecewise")  # the speculator's own FULL decode graphs
    if graphed:
        from gpu_impl.engines.vllm.drafter_graphs import supported

        if not supported(cls):
            raise Unsupported("draft_tokens: the V2 runner's draft decode under a FULL CUDA graph "
                              "(SpeculatorCudaGraphManager) is driven where the speculator has its own draft-decode "
                              "graph manager (init_cudagraph_manager, capture)")
    n = len(seq_lens)
    limit = cfg.s["max_model_len"]
    # a stand-in self: the release's methods, none of its __init__ (which loads a draft model); the methods the
    # class leaves abstract (the draft model's: _decode, _prefill, load_draft_model, propose, ...) are the stand-ins
    # below or never called
    def unused(*args, **kwargs):
        raise AssertionError("not called by the draft decode steps")

    stand_in = type("SpeculatorStandIn", (cls,), {name: unused for name in getattr(cls, "__abstractmethods__", ())})
    spec = object.__new__(stand_in)
    b = cfg.buffers
    fields = dict(
        vllm_config=cfg.vc, max_model_len=limit, eplb_state=None, pcp_manager=None, dcp_size=cfg.s["dcp"], input_buffers=b,
        attn_groups=cfg.attn_groups, kv_cache_config=cfg.kv_cache_config, max_num_reqs=cfg.s["max_num_seqs"],
        block_tables=_SlotsStandIn(cfg.block_tables, b.positions.shape[0]),
        arange_np=np.arange(cfg.s["max_num_seqs"] + 1, dtype=np.int32),
        arange=torch.arange(cfg.s["max_num_seqs"] + 1, dtype=torch.int32),  # _build_draft_attn_metadata (0.28, 0.29)
        draft_is_prefilling=torch.zeros(cfg.s["max_num_seqs"], dtype=torch.bool),
        idx_mapping=torch.arange(cfg.s["max_num_seqs"], dtype=torch.int32),
        current_draft_step=torch.zeros((), dtype=torch.int32), num_speculative_steps=steps,
        # as propose sets it: the target step's longest sequence (its CPU upper bound) plus the speculative steps
        draft_max_seq_len=min(max(seq_lens) + steps, limit))
    for name, value in fields.items():
        if not isinstance(getattr(stand_in, name, None), property):  # max_model_len: the config's, from 0.34
            setattr(spec, name, value)
    spec.on_multi_step_decode_begin = spec.on_multi_step_decode_end = lambda num_reqs: None

    state: dict = {"ops": None}  # while a FULL draft-decode graph is captured: its recorded launches

    def advance(num_reqs):
        b.seq_lens[:num_reqs] = torch.clamp(b.seq_lens[:num_reqs] + 1, max=limit)
        b.positions[:num_reqs] += 1

    def decode(num_reqs, num_tokens_padded, attn_metadata, *args, **kwargs):
        """The draft model's step, stood in: its attention layers' forward, then its advance of the batch."""
        md = next(iter(attn_metadata.values()))
        cfg._forward_tokens(md, num_tokens_padded)
        if state["ops"] is not None:
            state["ops"].append(("advance",))
        advance(num_reqs)

    import vllm.v1.worker.gpu.spec_decode.speculator as base

    from gpu_impl.engines.vllm.driver_v2 import dcp_local_seq_lens

    # its Triton kernel (DCP), as for the target steps: prepare_dcp_local_seq_lens (0.29, 0.31 on), or 0.30's
    # maybe_prepare_dcp_local_seq_lens (the same, None without DCP)
    base.prepare_dcp_local_seq_lens = dcp_local_seq_lens
    base.maybe_prepare_dcp_local_seq_lens = _maybe_dcp_local_seq_lens
    spec._decode = spec._generate_draft = decode  # the draft model's step: _decode (0.34 on), _generate_draft before
    fused = _configure(spec)  # the release decides: fused update or an eager rebuild per step
    def prepare_inputs(*args, **kwargs):
        """``_prepare_decode_inputs``, stood in: one query token per request, each sequence one token longer."""
        b.query_start_loc.zero_()
        b.query_start_loc[:n + 1] = torch.arange(n + 1, dtype=torch.int32)
        b.query_start_loc[n + 1:] = n
        b.seq_lens.zero_()
        b.seq_lens[:n] = torch.tensor([min(limit, k + 1) for k in seq_lens], dtype=torch.int32)
        b.positions[:n] = torch.tensor([min(limit, k + 1) - 1 for k in seq_lens], dtype=b.positions.dtype)

    upper = torch.tensor(seq_lens, dtype=torch.int32)
    cfg.draft_graph = {}  # checked event index -> "capture" / "replay": a draft call inside a FULL draft graph
    import inspect

    multi_step = _multi_step(spec, fused)
    # num_speculative_steps is the entry's own argument from 0.32 (the attribute before)
    extra = (steps,) if "num_speculative_steps" in inspect.signature(multi_step).parameters else ()

    def entry(desc):
        multi_step(n, False, desc, None, upper, *extra)

    if graphed:
        from gpu_impl.engines.vllm.drafter_graphs import run_graphed

        run_graphed(spec, cfg, front, n, upper, steps, prepare_inputs, advance, state, entry)
        cfg.draft_fused = fused
        return steps - 1
    prepare_inputs()
    entry(BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=n, num_reqs=n))
    cfg.draft_fused = fused
    return steps - 1
