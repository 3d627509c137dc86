"""Seeded defects: one registry of the historical bugs the catalogue re-creates, by name.

Each defect is a named transformation of one layer of the system under test, applied from outside: the backend
(`gpu_impl.backend`), the scenario runner (`gpu_impl.scenario`) and the emulated kernel (`gpu_impl.kernels.emulated`)
consult no defect names. The registry is the single source of the names (the bug catalogue, `fa3verify.catalogue`,
looks them up here, and an unknown name is an error that lists the known ones); :func:`seed_run` applies a
scenario's defects when the run is assembled: policy-layer ones rewrite the scenario's policy
(:func:`apply_policy_defects`), backend- and kernel-layer ones replace the backend and the kernel by seeded
subclasses that override the one step each defect changes (:func:`seed_backend`, :func:`seed_kernel`; the mixins
are in :mod:`gpu_impl.seeded_defects`).

Layers:

* ``policy``  -- already a policy knob of the backend model (a guard, ``metadata_heads``, the runner's
  ``clear_stale_cp_metadata``); listed so the catalogue can name it, switched through the policy itself;
* ``backend`` -- how the sglang-like backend precomputes and hands metadata to the call (``FlashAttentionBackend``);
* ``kernel``  -- the emulated FA3 kernel (``EmulatedKernel``): combine, masking, scheduling heuristics;
* ``caller``  -- a serving engine's own metadata builder that the backend model does not have (vLLM's cascade
  attention); the catalogue plays the caller in a directed kernel-level case.

``kind`` is ``"defect"`` for a bug that the switch adds, or ``"counterfactual-fix"`` for a bug that upstream FA3
itself has (and so the models have by default): the switch *removes* it, which is how the catalogue shows that
nothing fires without it. ``"hazard-control"`` is a defect with no upstream report, seeded to show that a hazard
class the prover names is found by the fuzzer (``precompute-max-seqlen-q-off-by-one``, theorem 9's drift).

Case files of schema ``fa3verify.case/1`` have no field for defects, so a seeded-defect policy travels as a guard
spec: :data:`SEEDED_POLICIES` maps a module-level name such as ``gpu_impl.defects:graph_metadata_new_buffer`` to a
:class:`SeededPolicy`, a guard (it delegates to a built-in guard) that also carries the defect switches.
``run_scenario`` reads them with :func:`defects_of`; replaying such a case with ``--guard fixed`` drops the defect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

__all__ = ["Defect", "DEFECTS", "LAYERS", "check_defects", "defects_in_layer", "SeededPolicy", "SEEDED_POLICIES",
           "defects_of", "apply_policy_defects", "guard_without_dp_attention_clause", "GRAPH_CAPTURE_SEQLEN_K",
           "FINITE_MASK_SENTINEL", "scenario_defects", "seed_backend", "seed_kernel", "seed_run"]

LAYERS = ("policy", "backend", "kernel", "caller")
KINDS = ("defect", "counterfactual-fix", "hazard-control")

#: KV extent (tokens) FA3's host code saw when the decode graph was captured, under the seeded defect
#: ``graph-split-count-from-capture``. Upstream does not pin the value; any capture extent below the run-time
#: one exposes the same class (vLLM #51119 calls such a value a "capture hint").
GRAPH_CAPTURE_SEQLEN_K = 4096

#: FlashInfer's finite masking sentinel before PR #4401 (``math::inf = 5e4``), in the raw (unscaled) q.k domain.
FINITE_MASK_SENTINEL = -5.0e4


@dataclass(frozen=True)
class Defect:
    """One seeded defect: its switch name, layer, what it does, and the upstream report it re-creates."""

    name: str
    layer: str
    description: str
    reference: str
    url: str
    kind: str = "defect"

    def __post_init__(self):
        if self.layer not in LAYERS:
            raise ValueError(f"Defect.layer: must be one of {LAYERS}, got {self.layer!r}")
        if self.kind not in KINDS:
            raise ValueError(f"Defect.kind: must be one of {KINDS}, got {self.kind!r}")


_ALL = (
    Defect("guard-without-prefill-cp-clause", "policy",
           "the precompute guard disables only under DP attention (guard 'pre-fix'), so prefill CP precomputes "
           "with H // tp_size heads while the layer calls with H // attn_tp_size",
           "sglang PR #30439", "https://github.com/sgl-project/sglang/pull/30439"),
    Defect("guard-without-dp-attention-clause", "policy",
           "the precompute guard lacks the DP-attention clause that sglang PR #24632 added (before it there was no "
           "guard at all), so DP attention precomputes with H // tp_size heads",
           "sglang PR #24632", "https://github.com/sgl-project/sglang/pull/24632"),
    Defect("runner-keeps-stale-cp-metadata", "policy",
           "the eager runner does not clear CP-v2 metadata when CP-v2 is inactive (clear_stale_cp_metadata=False)",
           "sglang PR #30439 (runner part)", "https://github.com/sgl-project/sglang/pull/30439"),
    Defect("graph-split-count-from-capture", "backend",
           "under CUDA graph the call's split count S_c (buffer rows, split kernel) is frozen at capture from the "
           f"capture-time KV extent ({GRAPH_CAPTURE_SEQLEN_K} tokens), while the metadata is recomputed at replay "
           "with the heuristic on the run-time max_seqlen_k",
           "vLLM PR #20301", "https://github.com/vllm-project/vllm/pull/20301"),
    Defect("cascade-prefix-metadata-batch-size", "caller",
           "cascade attention's prefix metadata is built with batch_size=num_reqs while the prefix call runs as a "
           "single batch (the shared prefix against all query tokens)",
           "vLLM PR #17283", "https://github.com/vllm-project/vllm/pull/17283"),
    Defect("call-not-varlen", "backend",
           "metadata is precomputed as varlen (get_scheduler_metadata hard-codes it) while the layer's call passes "
           "neither cu_seqlens_q nor cache_seqlens",
           "vllm-project/flash-attention PR #161/#162", "https://github.com/vllm-project/flash-attention/pull/162"),
    Defect("graph-metadata-new-buffer", "backend",
           "at CUDA-graph replay the backend writes the new metadata into a fresh tensor instead of copying it into "
           "the buffer the graph captured; the graph reads what the last capture left there",
           "sglang PR #27664", "https://github.com/sgl-project/sglang/pull/27664"),
    Defect("combine-no-neg-inf-guard", "kernel",
           "the split-KV combine shifts by the row max without the M == -inf -> 0 guard: all-empty rows give NaN",
           "FlashInfer issue #4051", "https://github.com/flashinfer-ai/flashinfer/issues/4051"),
    Defect("finite-mask-sentinel", "kernel",
           f"masking and the running max start from a finite sentinel ({FINITE_MASK_SENTINEL:g} in the raw q.k "
           "domain) instead of -inf: fully masked rows get a finite LSE, rows whose logits all lie below the "
           "sentinel return zeros",
           "FlashInfer PR #4401", "https://github.com/flashinfer-ai/flashinfer/pull/4401"),
    Defect("heuristic-zero-division", "kernel",
           "the split heuristic divides the SM count by total_mblocks with no guard and no empty-Q early exit: an "
           "empty workload (batch 0 or seqlen_q 0) raises ZeroDivisionError",
           "Dao-AILab/flash-attention 484b9813 (#2515)",
           "https://github.com/Dao-AILab/flash-attention/commit/484b9813f57814023387e91aab0364beaad096c8"),
    Defect("fa3-kernel-uses-host-tiles", "kernel",
           "counterfactual fix of FA3's own inconsistency: the kernel uses the host's tiles (d_rounded, dv_rounded) "
           "instead of the <64, 256> template for d <= 64 with 64 < dv <= 192",
           "FA3 hopper/flash_api.cpp (read from source)",
           "https://github.com/Dao-AILab/flash-attention/blob/0251105a/hopper/flash_api.cpp",
           kind="counterfactual-fix"),
    Defect("graph-metadata-before-padding", "backend",
           "under CUDA graph the metadata is computed for the real rows only (before the batch is padded to the "
           "graph batch size) while the captured call runs with the padded batch",
           "vllm-project/flash-attention PR #82 (review)", "https://github.com/vllm-project/flash-attention/pull/82"),
    Defect("precompute-max-seqlen-q-off-by-one", "caller",
           "vLLM's metadata builder asks get_scheduler_metadata for max_seqlen_q one more than the call's "
           "max_seqlen_q; under vLLM's FA3 fork the decode tile reads seqlen_q * (h / h_k) <= 64, so the two sides "
           "can choose different tiles (theorem fork-tile-drift); applied by the vLLM driver",
           "none (a hazard control for vllm-project/flash-attention hopper/heuristics.h use_one_mma_wg)",
           "https://github.com/vllm-project/flash-attention/blob/main/hopper/heuristics.h", kind="hazard-control"),
    Defect("precompute-max-seqlen-q-two", "backend",
           "the decode precompute passes max_seqlen_q 2 for one-row sequences; from sglang-kernel 0.4.5 get_num_splits "
           "bounds a varlen call by its real rows (params.total_q) and the precompute by b * max_seqlen_q, so the "
           "two sides can choose different split counts (theorem total-q-drift)",
           "none (a hazard control for the sglang kernel wheels' get_num_splits, read by scripts/read_fa3_wheel.py)",
           "https://github.com/sgl-project/sgl-attn", kind="hazard-control"),
)

#: name -> Defect, the one registry.
DEFECTS: dict[str, Defect] = {d.name: d for d in _ALL}


def check_defects(names: Iterable[str], layer: str | None = None) -> frozenset:
    """Validate switch names (optionally all of one layer); ValueError names the unknown ones and the known ones."""
    names = frozenset(names)
    unknown = sorted(names - set(DEFECTS))
    if unknown:
        raise ValueError(f"defects: unknown name(s) {unknown}; known: {sorted(DEFECTS)}")
    if layer is not None:
        wrong = sorted(n for n in names if DEFECTS[n].layer != layer)
        if wrong:
            raise ValueError(f"defects: {wrong} are not {layer}-layer switches "
                             f"({', '.join(DEFECTS[n].layer for n in wrong)})")
    return names


def defects_in_layer(names: Iterable[str], layer: str) -> frozenset:
    """The subset of ``names`` that lives in ``layer`` (names are validated first)."""
    return frozenset(n for n in check_defects(names) if DEFECTS[n].layer == layer)


class SeededPolicy:
    """A guard (delegating to a built-in one) that also carries seeded defect switches.

    Called like a guard: ``policy(server_args) -> bool``. ``defects`` is read by ``run_scenario``.
    """

    def __init__(self, name: str, base_guard: str, defects: Iterable[str], metadata_heads: str = "tp"):
        self.name = name
        self.base_guard = base_guard
        self.defects = check_defects(defects)
        self.metadata_heads = metadata_heads
        self.__qualname__ = name
        self.__module__ = __name__

    def _guard(self) -> Callable[[Any], Any]:
        from spec.model.guards import BUILTIN_GUARDS

        return BUILTIN_GUARDS[self.base_guard]

    def __call__(self, server_args: Any) -> bool:
        return bool(self._guard()(server_args))

    @property
    def spec(self) -> str:
        """The guard spec a case file uses: ``gpu_impl.defects:<name>``."""
        return f"{__name__}:{self.name}"

    def __repr__(self) -> str:
        return f"SeededPolicy({self.name!r}, guard={self.base_guard!r}, defects={sorted(self.defects)})"


def _prefill_cp_only(server_args: Any) -> bool:
    """The fixed guard without sglang PR #24632's DP-attention clause: only prefill CP disables the precompute."""
    return bool(getattr(server_args, "enable_prefill_cp", False))


#: The fixed guard minus the DP-attention clause (entry 2's seeded guard), loadable as a guard spec.
guard_without_dp_attention_clause = _prefill_cp_only

graph_split_count_from_capture = SeededPolicy("graph_split_count_from_capture", "fixed",
                                              ["graph-split-count-from-capture"])
call_not_varlen = SeededPolicy("call_not_varlen", "fixed", ["call-not-varlen"])
graph_metadata_new_buffer = SeededPolicy("graph_metadata_new_buffer", "none", ["graph-metadata-new-buffer"])
graph_metadata_before_padding = SeededPolicy("graph_metadata_before_padding", "fixed",
                                             ["graph-metadata-before-padding"])

#: name -> SeededPolicy, the policies case files may name as ``gpu_impl.defects:<name>``.
SEEDED_POLICIES: dict[str, SeededPolicy] = {p.name: p for p in (
    graph_split_count_from_capture, call_not_varlen, graph_metadata_new_buffer, graph_metadata_before_padding)}


def apply_policy_defects(scn: Any, defects: Iterable[str]) -> Any:
    """A copy of a ``gpu_impl.scenario.Scenario`` with its policy-layer switches applied (guard, runner hygiene)."""
    import dataclasses

    from spec.model.guards import prefix_guard_dp_only

    policy = defects_in_layer(defects, "policy")
    if not policy:
        return scn
    changes: dict = {}
    if "guard-without-prefill-cp-clause" in policy and "guard-without-dp-attention-clause" in policy:
        from spec.model.guards import no_guard

        changes["guard"] = no_guard
    elif "guard-without-prefill-cp-clause" in policy:
        changes["guard"] = prefix_guard_dp_only
    elif "guard-without-dp-attention-clause" in policy:
        changes["guard"] = guard_without_dp_attention_clause
    if "runner-keeps-stale-cp-metadata" in policy:
        changes["clear_stale_cp_metadata"] = False
    return dataclasses.replace(scn, **changes)


def defects_of(guard: Any) -> frozenset:
    """The defect switches a guard carries (a :class:`SeededPolicy`), else the empty set."""
    found = getattr(guard, "defects", None)
    return check_defects(found) if found else frozenset()


def scenario_defects(scn: Any) -> frozenset:
    """The defects in force for a ``gpu_impl.scenario.Scenario``: its ``defects`` plus those its guard carries."""
    return check_defects(scn.defects) | defects_of(scn.guard)


def seed_backend(backend: Any, defects: Iterable[str]) -> Any:
    """``backend`` with its backend-side defects seeded: a copy of a subclass overriding the steps they change.

    Backend- and kernel-layer names are accepted (the kernel counterfactual ``fa3-kernel-uses-host-tiles`` changes
    the metadata-level check too); with none of them the backend itself is returned.
    """
    from .seeded_defects import seeded_copy

    names = defects_in_layer(defects, "backend") | defects_in_layer(defects, "kernel")
    return seeded_copy(backend, names, "backend") if names else backend


def seed_kernel(kernel: Any, defects: Iterable[str]) -> Any:
    """A copy of an emulated ``kernel`` with the kernel-layer ``defects`` seeded (ValueError for other layers)."""
    from .seeded_defects import seeded_copy

    return seeded_copy(kernel, check_defects(defects, layer="kernel"), "kernel")


def seed_run(scn: Any, make_backend: Callable[[Any], Any], kernel: Any = None) -> tuple:
    """(scenario with its policy defects applied, its seeded backend, its seeded kernel) for one run.

    ``make_backend(scenario)`` builds the unseeded backend; a kernel-layer defect needs a kernel with
    ``with_defects`` (the emulator), else ValueError names the kernel and the defects.
    """
    defects = scenario_defects(scn)
    scn = apply_policy_defects(scn, defects)
    backend = seed_backend(make_backend(scn), defects)
    kernel_defects = defects_in_layer(defects, "kernel")
    if kernel_defects and kernel is not None:
        if not hasattr(kernel, "with_defects"):
            name = getattr(kernel, "name", kernel)
            raise ValueError(f"defects: kernel {name!r} cannot seed {sorted(kernel_defects)}")
        kernel = kernel.with_defects(kernel_defects)
    return scn, backend, kernel
