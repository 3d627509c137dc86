"""The drafter on the V2 model runner: after a target step, the draft decode steps of the release's autoregressive
speculator (``vllm/v1/worker/gpu/spec_decode/``), each draft step's metadata made by the release's own code and each
call judged against its own precompute.

Invariant: what decides each draft step is vLLM's code, run unbound on a stand-in ``self`` of the speculator class
(built without its ``__init__``, which loads a draft model): ``_run_fused_multi_step_decode`` where every attention
group ``supports_draft_decode_metadata_update`` (the fused path: the step-1 metadata built once by
``_build_uniform_attn_metadata``, then before each draft step ``_update_draft_decode_metadata``, which makes the
builder's ``update_draft_decode_metadata`` recompute the FA3 scheduler metadata from the persistent ``seq_lens``
in place), else ``_multi_step_decode`` (the metadata rebuilt eagerly by ``_build_uniform_attn_metadata`` for each
step); the speculator's own ``_configure_decode_metadata_update`` chooses. The real ``FlashAttentionImpl.forward``
makes each call.

Stood in (listed in :data:`STOOD_IN`): the draft model's forward in ``_decode`` (``_generate_draft`` in 0.32 and
0.33; the layers' attention is run, the model is not) and its GPU advance of the batch after each draft step (``seq_lens`` and ``positions`` one token
further for the real requests), ``_prepare_decode_inputs`` (one query token per request; each sequence one token
longer than the target step's, ``seq_lens_cpu_upper_bound`` the target step's lengths), the runner's
``BlockTables.compute_slot_mappings`` (slots -1: no KV write is judged), and the Triton kernel of
``prepare_dcp_local_seq_lens`` the speculator module calls under DCP (as for the target steps, ``driver_v2``). Not driven: the draft prefill (on the target
batch: the target's metadata reused, ``can_reuse_target_attn_metadata``) and a draft decode FULL CUDA graph
(``SpeculatorCudaGraphManager``): a scenario with draft tokens under a FULL graph mode is refused on the V2 runner.
"""

from __future__ import annotations

from gpu_impl.engines.protocol import Unsupported

__all__ = ["STOOD_IN", "SPECULATOR_MODULES", "speculator_class", "run_drafts"]

STOOD_IN = (
    "the V2 drafter's draft model: its forward in _decode (the layers' attention runs, nothing else) and its GPU "
    "advance after each draft step (seq_lens and positions one token further for the real requests); "
    "_prepare_decode_inputs (one query token per request, each sequence one token longer than the target step's, "
    "seq_lens_cpu_upper_bound the target step's lengths); BlockTables.compute_slot_mappings (slots -1); the Triton "
    "kernel of prepare_dcp_local_seq_lens in the speculator module (vLLM's get_dcp_local_seq_lens in torch)",
)

#: where the release's autoregressive speculator lives (the first module that has it): ``autoregressive`` (0.34 on;
#: 0.28 .. 0.31 there too, without the fused update of the base class), ``target_dependent_ar`` (0.32, 0.33)
SPECULATOR_MODULES = (("vllm.v1.worker.gpu.spec_decode.autoregressive.speculator", "AutoRegressiveSpeculator"),
                      ("vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator", "TargetDependentARSpeculator"))


def speculator_class():
    """The release's autoregressive speculator class, or None where it has none with the fused draft-decode update
    (the base class's ``_update_draft_decode_metadata`` and ``_build_uniform_attn_metadata``, 0.32 on)."""
    import importlib

    for module, name in SPECULATOR_MODULES:
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if all(hasattr(cls, m) for m in ("_fused_multi_step_decode", "_multi_step_decode",
                                          "_build_uniform_attn_metadata", "_update_draft_decode_metadata")):
            return cls
    return None


def _multi_step(spec, fused: bool):
    """The release's multi-step draft decode entry (``num_reqs, skip_attn, batch_desc, num_tokens_across_dp,
    seq_lens_cpu_upper_bound, num_speculative_steps``): fused, ``_run_fused_multi_step_decode`` (0.34 on) or
    ``_fused_multi_step_decode`` (0.32, 0.33); else ``_multi_step_decode``."""
    if not fused:
        return spec._multi_step_decode
    return getattr(spec, "_run_fused_multi_step_decode", None) or spec._fused_multi_step_decode


class _SlotsStandIn:
    """The runner's ``BlockTables`` as the speculator reads it: its input tables, slot mappings and DCP fields."""

    def __init__(self, tables, num_tokens: int):
        import torch

        self.input_block_tables = [tables.table]
        self.slot_mappings = torch.full((1, num_tokens), -1, dtype=torch.int64)
        self.cp_size, self.cp_rank, self.cp_interleave = tables.cp_size, tables.cp_rank, tables.cp_interleave

    def compute_slot_mappings(self, idx_mapping, query_start_loc, positions, num_tokens):
        return self.slot_mappings[:, :num_tokens]


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
    cls = speculator_class()
    if cls is None:
        raise Unsupported("draft_tokens: this release's V2 runner has no speculator with the draft-decode metadata "
                          "update (spec_decode/speculator.py _update_draft_decode_metadata, 0.32 on) that the V2 "
                          "drafter drives")
    if cfg.s["cuda_graph"] in ("full", "full_and_piecewise"):
        raise Unsupported("draft_tokens: the V2 runner's draft decode under a FULL CUDA graph "
                          "(SpeculatorCudaGraphManager) is not driven")
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
        vllm_config=cfg.vc, max_model_len=limit, eplb_state=None, pcp_manager=None, draft_max_seq_len=limit, dcp_size=cfg.s["dcp"], input_buffers=b,
        attn_groups=cfg.attn_groups, kv_cache_config=cfg.kv_cache_config, max_num_reqs=cfg.s["max_num_seqs"],
        block_tables=_SlotsStandIn(cfg.block_tables, b.positions.shape[0]),
        arange_np=np.arange(cfg.s["max_num_seqs"] + 1, dtype=np.int32),
        draft_is_prefilling=torch.zeros(cfg.s["max_num_seqs"], dtype=torch.bool),
        idx_mapping=torch.arange(cfg.s["max_num_seqs"], dtype=torch.int32),
        current_draft_step=torch.zeros((), dtype=torch.int32), num_speculative_steps=steps)
    for name, value in fields.items():
        if not isinstance(getattr(stand_in, name, None), property):  # max_model_len: the config's, from 0.34
            setattr(spec, name, value)
    spec.on_multi_step_decode_begin = spec.on_multi_step_decode_end = lambda num_reqs: None

    def decode(num_reqs, num_tokens_padded, attn_metadata, *args, **kwargs):
        """The draft model's step, stood in: its attention layers' forward, then its advance of the batch."""
        md = next(iter(attn_metadata.values()))
        cfg._forward_tokens(md, num_tokens_padded)
        b.seq_lens[:num_reqs] = torch.clamp(b.seq_lens[:num_reqs] + 1, max=limit)
        b.positions[:num_reqs] += 1

    import vllm.v1.worker.gpu.spec_decode.speculator as base

    from gpu_impl.engines.vllm.driver_v2 import dcp_local_seq_lens

    base.prepare_dcp_local_seq_lens = dcp_local_seq_lens  # its Triton kernel (DCP), as for the target steps
    spec._decode = spec._generate_draft = decode  # the draft model's step: _decode (0.34 on), _generate_draft before
    spec._configure_decode_metadata_update()  # the release decides: fused update or an eager rebuild per step
    # _prepare_decode_inputs, stood in: one query token per request, each sequence one token longer
    b.query_start_loc.zero_()
    b.query_start_loc[:n + 1] = torch.arange(n + 1, dtype=torch.int32)
    b.query_start_loc[n + 1:] = n
    b.seq_lens.zero_()
    b.seq_lens[:n] = torch.tensor([min(limit, k + 1) for k in seq_lens], dtype=torch.int32)
    b.positions[:n] = torch.tensor([min(limit, k + 1) - 1 for k in seq_lens], dtype=b.positions.dtype)
    upper = torch.tensor(seq_lens, dtype=torch.int32)
    desc = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=n, num_reqs=n)
    _multi_step(spec, bool(spec.supports_decode_metadata_update))(n, False, desc, None, upper, steps)
    cfg.draft_fused = bool(spec.supports_decode_metadata_update)
    return steps - 1

