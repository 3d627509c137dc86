"""The one source of random cases: every generator the campaign (``fa3verify.campaign``) draws from, by family.

A family is ``family(rng) -> case | None`` over a ``random.Random`` the campaign seeds with one 64-bit draw:

* ``scenario`` -- the whole scenario space (:mod:`.scenarios`): what ``fuzz``, ``gate`` and ``check`` run;
  ``release`` -- its metadata-level cases with ``num_splits`` 0, configurations a release runs (``conform``);
  ``gpu-decode`` -- its decode corner on a real GPU's SM count, every call on tensors (gpu-check's fuzz stage);
* the catalogue's scenario families (:mod:`.families`: ``prefill-cp``, ``dp-attention``, ...): focused corners,
  each a ``FuzzCase`` run on a scenario system under test;
* ``vllm`` / ``vllm-full-graph`` / ``vllm-decode-tile`` / ``vllm-v2`` -- vLLM's configuration families
  (:mod:`.vllm`; ``vllm-decode-tile`` draws around the fork's decode-tile boundary, theorem 9; ``vllm-v2`` adds
  vLLM's FULL_AND_PIECEWISE mode for releases the V2 runner drives; ``vllm-paths`` adds shared prefixes, drafts and
  DCP's fresh-prefill steps for releases the V1 runner drives, ``vllm-paths-both`` half of them on the V2 runner of a
  release that ships both), the family a ``vllm==V`` engine's own domain
  names (``gpu_impl.engines.vllm.host.VllmSUT.domain``);
* a system under test's own domain (:mod:`.engine_domain`, ``domain_strategy(sut.domain())``): what a campaign
  on a system draws when no family is named -- a family the domain names, or the configurations an sglang
  release's own checks accept (``gpu_impl.engines.sglang.domain``);
* the kernel-level call families (:mod:`.kernel_calls`: ``kernel:cascade-prefix``, ...): FA3 calls run on the
  kernel-level system under test (``fa3verify.kernel_cases.KernelCallSUT``);
* ``fidelity`` (:mod:`.fidelity_configs`): precompute configurations for the metadata fidelity check, one seeded
  generator per index so that gpu-check's workers can take chunks of a stream (not a campaign family).
"""

from __future__ import annotations

from typing import Callable

from . import families, kernel_calls, vllm
from .engine_domain import domain_strategy
from .scenarios import (CONTEXT_LENGTHS, NUM_SPLITS_POLICIES, NUMERICS_MAX_LEN, NUMERICS_SHARE, PAGE_SIZES, SM_COUNTS,
                        STEP_KINDS, FuzzCase, decode_step, extend_step, gpu_decode_case, random_fuzz_case,
                        random_server_config, release_fuzz_case, random_steps, rank_layouts)

__all__ = ["FAMILIES", "KERNEL_FAMILIES", "family", "domain_strategy", "is_kernel_family", "FuzzCase",
           "random_fuzz_case", "gpu_decode_case", "release_fuzz_case",
           "random_server_config", "random_steps", "rank_layouts", "decode_step", "extend_step", "SM_COUNTS",
           "PAGE_SIZES", "CONTEXT_LENGTHS", "NUM_SPLITS_POLICIES", "NUMERICS_SHARE", "NUMERICS_MAX_LEN", "STEP_KINDS"]

#: Scenario families (FuzzCase generators), by name.
FAMILIES: dict[str, Callable] = {
    "scenario": random_fuzz_case,
    "release": release_fuzz_case,
    "gpu-decode": gpu_decode_case,
    "prefill-cp": families.prefill_cp,
    "dp-attention": families.dp_attention,
    "dp-attention-graph": families.dp_attention_graph,
    "cp-steps": families.cp_steps,
    "graph-tp": families.graph_tp,
    "eager-tp": families.eager_tp,
    "graph-padding": families.graph_padding,
    "tile-corner": families.tile_corner,
    "large-decode-batch": families.large_decode_batch,
    "vllm": vllm.vllm_case,
    "vllm-full-graph": vllm.vllm_full_graph_case,
    "vllm-decode-tile": vllm.vllm_decode_tile_case,
    "vllm-v2": vllm.vllm_v2_case,
    "vllm-paths": vllm.vllm_paths_case,
    "vllm-paths-both": vllm.vllm_paths_both_case,
}

#: Kernel-level call families, by name (spelled ``kernel:<name>`` where a family name must say its kind).
KERNEL_FAMILIES: dict[str, Callable] = {
    "cascade-prefix": kernel_calls.cascade_prefix,
    "masked-rows": kernel_calls.masked_rows,
    "below-sentinel": kernel_calls.below_sentinel,
    "empty-workload": kernel_calls.empty_workload,
}


def is_kernel_family(name: str) -> bool:
    """True for ``kernel:<name>`` (a kernel-level call family)."""
    return name.startswith("kernel:")


def family(name: str) -> Callable:
    """The generator a family name names; ValueError lists the known names."""
    if is_kernel_family(name) and name[len("kernel:"):] in KERNEL_FAMILIES:
        return KERNEL_FAMILIES[name[len("kernel:"):]]
    if name in FAMILIES:
        return FAMILIES[name]
    known = sorted(FAMILIES) + [f"kernel:{k}" for k in sorted(KERNEL_FAMILIES)]
    raise ValueError(f"strategy family: unknown {name!r}; known: {', '.join(known)}")
