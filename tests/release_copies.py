"""Source copies of installed sglang and vLLM releases with a seeded regression, for negative controls (run as
``sglang-src=PATH`` / ``vllm-src=PATH``): the release's package as links, with only the patched modules written anew
(nothing of sglang or vLLM is committed to this repository; the patches are applied at test time and fail loudly when
the release no longer contains what they patch). Only the folders on the way to a patched module are made; every
other file and folder is one link (vLLM's package is 6400 files: linking each took 6.5 s and deleting the copy 18 s
on this project's machine, and a copy without the release's bytecode compiled every module it imported afresh)."""

from __future__ import annotations

import os
import re
from pathlib import Path

BACKEND = Path("srt") / "layers" / "attention" / "flashattention_backend.py"

#: 0.5.23 with one path regressed: only the CUDA-graph replay-time metadata recompute takes its heads from
#: tp_size (as 0.5.11 - 0.5.20 did everywhere); the eager path, the capture and the guard are the release's own.
REPLAY_ONLY_HEADS_0_5_23 = (
    (r"(        self\.num_kv_heads = model_runner\.model_config\.get_num_kv_heads\(\n"
     r"            attention_tp_size\n        \)\n)",
     r"\1        self._regressed_replay_heads = (\n"
     r"            model_runner.model_config.hf_text_config.num_attention_heads // get_parallel().tp_size,\n"
     r"            model_runner.model_config.get_num_kv_heads(get_parallel().tp_size),\n"
     r"        )\n"),
    (r"sched = self\._compute_scheduler_metadata\(\n(\s+)bs,\n(\s+)metadata\.max_seq_len_k,",
     r"sched = self._regressed_replay_metadata(\n\1bs,\n\2metadata.max_seq_len_k,"),
    (r"(\n    def validate_elastic_cuda_graph_recapture\(self\) -> None:)",
     "\n    def _regressed_replay_metadata(self, *args):\n"
     "        kept = (self.num_attention_heads, self.num_kv_heads)\n"
     "        self.num_attention_heads, self.num_kv_heads = self._regressed_replay_heads\n"
     "        try:\n"
     "            return self._compute_scheduler_metadata(*args)\n"
     "        finally:\n"
     "            self.num_attention_heads, self.num_kv_heads = kept\n"
     r"\1"),
)


def linked_copy(engine: str, release: str, root: Path, modules: dict, pycache: bool = True) -> Path:
    """``root/<package>``: the ``engine`` release's installed package (``sglang`` or ``vllm``) as links, each module
    of ``modules`` ({path in the package: patches}) written anew with its patches (:func:`patch_linked_module`);
    returns ``root``. The folders on the way to those modules are real folders; everything else in the package is one
    link per file or folder. A real folder's ``__pycache__`` is a folder of links to the release's bytecode
    (``pycache``; else left out), so a patched module's stale bytecode is dropped from the copy alone."""
    from gpu_impl.engines import envs

    site = envs.env_dir(release, engine=engine) / "lib" / "python3.11" / "site-packages" / engine
    root = Path(root)
    real = {folder for module in modules for folder in Path(module).parents}
    _link_tree(site, root / engine, Path(), real, pycache)
    for module, patches in modules.items():
        patch_linked_module(root / engine / module, patches, f"{engine} {release}: {module}")
    return root


def _link_tree(src: Path, dest: Path, here: Path, real: set, pycache: bool) -> None:
    """``dest`` a real folder holding a link to each entry of ``src``, but for the folders in ``real`` (paths below
    the package), made the same way, and ``__pycache__`` (see :func:`linked_copy`)."""
    dest.mkdir(parents=True)
    for entry in os.scandir(src):
        if entry.name == "__pycache__":
            if pycache:
                (dest / entry.name).mkdir()
                for pyc in os.scandir(entry.path):
                    os.symlink(pyc.path, dest / entry.name / pyc.name)
        elif here / entry.name in real:
            _link_tree(Path(entry.path), dest / entry.name, here / entry.name, real, pycache)
        else:
            os.symlink(entry.path, dest / entry.name)


def patched_copy(release: str, dest: Path, patches, module: Path = BACKEND) -> Path:
    """``dest/python``: release ``release``'s installed sglang as links, ``module`` patched (each pattern must
    match exactly once); returns the checkout root to pass as ``sglang-src=``."""
    return linked_copy("sglang", release, Path(dest) / "python", {module: patches})


def patch_linked_module(target: Path, patches, label: str) -> None:
    """Replaces the link ``target`` by a patched copy of the file it points to (each pattern must match exactly
    once) and drops that module's stale bytecode. ``target`` must be a link in a real folder of the copy: through a
    linked folder, the patch would replace the release's own file in its cached environment (every later run of
    that release would then judge the patched code in the release's name), so that is refused."""
    target = Path(target)
    if not target.is_symlink() or target.parent.resolve() != Path(os.path.abspath(target.parent)):
        raise AssertionError(f"{label}: {target} is not a link in a real folder of the copy; name the module when "
                             f"the copy is made (linked_copy's modules, vllm_patched_copy's more=) so its folders "
                             f"are made real")
    text = target.read_text()
    for pattern, repl in patches:
        text, n = re.subn(pattern, repl, text)
        if n != 1:
            raise AssertionError(f"{label} matches {pattern!r} {n} times, not once")
    target.unlink()
    target.write_text(text)
    for pyc in (target.parent / "__pycache__").glob(target.stem + ".*"):
        pyc.unlink()


def replay_only_regression(dest: Path) -> Path:
    """0.5.23 with only its graph-replay recompute regressed (:data:`REPLAY_ONLY_HEADS_0_5_23`)."""
    return patched_copy("0.5.23", dest, REPLAY_ONLY_HEADS_0_5_23)


VLLM_BACKEND = Path("v1") / "attention" / "backends" / "flash_attn.py"

#: vLLM 0.33.0 with vLLM #20301's pattern seeded into its own builder: the precompute (non-DCP path) asks FA3's
#: heuristic split count (0) while the call keeps ``max_num_splits`` (the full CUDA graph's 32).
PR20301_0_33_0 = (
    (r"(seqlens=seq_lens,\n\s+max_seq_len=max_seq_len,\n\s+causal=causal,\n\s+)max_num_splits=max_num_splits,",
     r"\1max_num_splits=0,"),
)


def vllm_patched_copy(release: str, dest: Path, patches=(), module: Path = VLLM_BACKEND, more=None) -> Path:
    """``dest``: vLLM release ``release``'s installed package as links (``dest/vllm``), ``module`` patched (each
    pattern must match exactly once; none: the clean copy) and each module of ``more`` ({path: patches}) likewise;
    returns the checkout root to pass as ``vllm-src=``."""
    return linked_copy("vllm", release, dest, {module: patches, **(more or {})}, pycache=False)


#: The DiffKV finding of every release with the DiffKV backend (0.14.0 on: the builder's precompute passes no
#: ``headdim_v``, so FA3's wrapper schedules for V's size = K's while the call runs V 128 under K 192) fixed by passing
#: the V head size the call has: the builder's KV-cache spec's ``head_size_v`` (the driver's spec carries the DiffKV
#: backend's V size; K's size where the layers' sizes agree). One line of ``get_scheduler_metadata``'s arguments, the
#: same in 0.20.0, 0.33.0 and 0.34.0.
ALIGNED_DIFFKV_HEADDIM_V = (
    (r"(\n(\s+)headdim=self\.headdim,\n)",
     r"\1\2headdim_v=getattr(self.kv_cache_spec, 'head_size_v', None) or self.headdim,\n"),
)


#: vLLM 0.34.0 with one path regressed: on the full-CUDA-graph path only (the one path where ``max_num_splits`` > 1)
#: the call passes half the split bound the precompute was given (16 for 32); eager, piecewise, batch invariance and
#: the DCP calls are the release's own.
CALL_HALF_SPLITS_0_34_0 = (
    (r"(\n[ ]+)num_splits = attn_metadata\.max_num_splits\n([ ]+if self\.fa4_hd256:)",
     r"\1num_splits = attn_metadata.max_num_splits\1if num_splits > 1:\1    num_splits //= 2\n\2"),
)

#: The same one-path regression with the precompute aligned to its call: ``_get_scheduler_metadata`` asks FA3 for
#: the same halved bound whenever it is > 1 (both sides 16 on the full-graph path), a copy that must pass.
ALIGNED_HALF_SPLITS_0_34_0 = CALL_HALF_SPLITS_0_34_0 + (
    (r"(\n[ ]+)num_splits=max_num_splits,\n([ ]+\)\n)",
     r"\1num_splits=max_num_splits // 2 if max_num_splits > 1 else max_num_splits,\n\2"),
) + ALIGNED_DIFFKV_HEADDIM_V


def record_captured_scalars_before(method: str) -> tuple:
    """The patch of the aligned copies that adds ``build_for_cudagraph_capture`` to the builder, before its method
    ``method``: it records the scalars each CUDA graph is captured with (``max_query_len`` and ``max_seq_len`` of the
    capture's padded batch, keyed by its requests and tokens) and builds as the base class does."""
    return (rf"(\n    def {method}\(\n)",
            "\n    def build_for_cudagraph_capture(self, common_attn_metadata):\n"
            "        captured = self.__dict__.setdefault(\"_captured_scalars\", {})\n"
            "        captured[(common_attn_metadata.num_reqs, common_attn_metadata.num_actual_tokens)] = (\n"
            "            common_attn_metadata.max_query_len, common_attn_metadata.max_seq_len)\n"
            "        return super().build_for_cudagraph_capture(common_attn_metadata)\n"
            r"\1")


#: 0.34.0 with its full-graph replay finding fixed by aligning the replay's precompute with the captured call
#: (docs/engines-vllm.md, "What would fix it"): the builder records the scalars each CUDA graph is captured with
#: (``build_for_cudagraph_capture``: ``max_query_len`` and ``max_seq_len`` of the capture's padded batch), and a build
#: whose padded batch is a captured graph's (a FULL replay; DCP 1) precomputes with those scalars, as the replayed
#: call runs with them. Eager, piecewise and batches above the largest graph keep their own. And the DiffKV finding
#: fixed (:data:`ALIGNED_DIFFKV_HEADDIM_V`); :data:`ALIGNED_REPLAY_ONLY_0_34_0` without it.
ALIGNED_REPLAY_ONLY_0_34_0 = (
    record_captured_scalars_before("_get_scheduler_metadata"),
    (r"(\n        causal = common_attn_metadata\.causal\n)",
     r"\1        self._replay_scalars = (\n"
     r"            self.__dict__.get('_captured_scalars', {}).get((num_reqs, num_actual_tokens))\n"
     r"            if self.use_full_cuda_graph and self.dcp_world_size == 1 else None)\n"),
    (r"(\n        return get_scheduler_metadata\(\n            batch_size=batch_size,\n)",
     r"\n        if self.__dict__.get('_replay_scalars') is not None:\n"
     r"            max_query_len, max_seq_len = self._replay_scalars\1"),
)
ALIGNED_REPLAY_0_34_0 = ALIGNED_REPLAY_ONLY_0_34_0 + ALIGNED_DIFFKV_HEADDIM_V


#: A release with cascade attention (0.20.0 .. 0.31.0, the V1 runner's path) with one path regressed: both FA3 calls
#: of ``cascade_attention`` (the shared prefix and the suffixes) pass half the split bound their precomputes were
#: given whenever it is > 1 (16 for the full CUDA graph's 32); every other path is the release's own.
CASCADE_HALF_SPLITS = (
    (r"(scheduler_metadata=prefix_scheduler_metadata,\n(?:.*\n){0,12}?\s+)"
     r"num_splits=1 if envs\.VLLM_BATCH_INVARIANT else max_num_splits,",
     r"\1num_splits=1 if envs.VLLM_BATCH_INVARIANT else (max_num_splits // 2 if max_num_splits > 1 else max_num_splits),"),
    (r"(scheduler_metadata=suffix_scheduler_metadata,\n(?:.*\n){0,12}?\s+)"
     r"num_splits=1 if envs\.VLLM_BATCH_INVARIANT else max_num_splits,",
     r"\1num_splits=1 if envs.VLLM_BATCH_INVARIANT else (max_num_splits // 2 if max_num_splits > 1 else max_num_splits),"),
)
#: 0.31.0 (its V1 runner) with that regression
CASCADE_HALF_SPLITS_0_31_0 = CASCADE_HALF_SPLITS
#: The layers finding of 0.11.0 .. 0.28.0 (the builder precomputes with ``ModelConfig.get_num_kv_heads``, the first
#: attention block's count, on a model whose layers have their own) fixed as 0.29.0 fixed it: the builder's KV heads
#: from its attention group's KV-cache spec.
ALIGNED_LAYER_KV_HEADS_0_20_0 = (
    (r"\n(        )self\.num_heads_kv = self\.model_config\.get_num_kv_heads\(self\.parallel_config\)\n",
     r"\n\1self.num_heads_kv = kv_cache_spec.num_kv_heads\n"),
)
#: 0.20.0 with the full-graph replay finding of 0.34.0 (its V1 runner captures a FULL graph with ``max_seq_len =
#: max_model_len`` while each replay's build precomputes with the batch's own) fixed the way :data:`ALIGNED_REPLAY_0_34_0`
#: fixes it, on 0.20.0's lines: its builder has no ``build_for_cudagraph_capture`` of its own (the base class's calls
#: ``build``) and precomputes inside a nested ``schedule``, which takes the captured scalars on a replay; and its
#: DiffKV and layers findings fixed (:data:`ALIGNED_DIFFKV_HEADDIM_V`, :data:`ALIGNED_LAYER_KV_HEADS_0_20_0`).
ALIGNED_REPLAY_0_20_0 = (
    record_captured_scalars_before("build"),
    ALIGNED_REPLAY_0_34_0[1],
    (r"(\n            if aot_schedule:\n)(                return get_scheduler_metadata\(\n                    batch_size=batch_size,\n)",
     r"\1                if self.__dict__.get('_replay_scalars') is not None:\n"
     r"                    max_query_len, max_seq_len = self._replay_scalars\n\2"),
) + ALIGNED_DIFFKV_HEADDIM_V + ALIGNED_LAYER_KV_HEADS_0_20_0
#: 0.20.0 (its replay aligned: :data:`ALIGNED_REPLAY_0_20_0`; its V2 runner is not driven) with the same one-path
#: regression on cascade
CASCADE_HALF_SPLITS_0_20_0 = ALIGNED_REPLAY_0_20_0 + CASCADE_HALF_SPLITS
#: 0.33.0 with the same full-graph replay finding as 0.34.0 fixed the same way: its V1 runner also captures a FULL graph
#: with ``max_seq_len = max_model_len`` (and a non-uniform graph with ``max_query_len`` = its token count) while each
#: replay's build precomputes with the batch's own (docs/engines-vllm.md, the first generation's capture and replay);
#: the same lines of ``FlashAttentionMetadataBuilder`` in both releases. The passing base of the 0.33.0 controls.
ALIGNED_REPLAY_0_33_0 = ALIGNED_REPLAY_0_34_0
#: 0.33.0 with only its replay aligned: the release's own DiffKV precompute (no ``headdim_v``) kept, the seeded
#: defect of the DiffKV control (its fix: :data:`ALIGNED_DIFFKV_HEADDIM_V`)
ALIGNED_REPLAY_ONLY_0_33_0 = ALIGNED_REPLAY_ONLY_0_34_0

#: A passing release (0.33.0, its V1 runner, replay aligned: :data:`ALIGNED_REPLAY_0_33_0`) with the same one-path
#: regression as :data:`CALL_HALF_SPLITS_0_34_0`: the same lines of ``FlashAttentionImpl.forward`` in both releases.
CALL_HALF_SPLITS_0_33_0 = ALIGNED_REPLAY_0_33_0 + CALL_HALF_SPLITS_0_34_0

#: 0.33.0 whose builder stores a replay's recompute only into a buffer that is still all zero (the first store, the
#: first capture's): every later replay reads the metadata an earlier step made -- the V1 runner's counterpart of the
#: sglang copy whose replay-time recompute is switched off (tests/engines/test_engine_lifecycle.py).
STORE_ONCE_0_33_0 = (
    (r"\n(            )self\.scheduler_metadata\[:n\] = scheduler_metadata\n",
     r"\n\1if not bool(self.scheduler_metadata.any()):\n\1    self.scheduler_metadata[:n] = scheduler_metadata\n"),
)


#: where the release keeps its chunked local attention layer (moved in 0.14.0)
VLLM_CHUNKED_LOCAL = Path("model_executor") / "layers" / "attention" / "chunked_local_attention.py"

#: A release with the wrapped chunked-local backend with one path regressed: the local layers' builder makes its
#: virtual batches and builds the FlashAttention metadata for them, but hands the calls the scheduler metadata of a
#: second build over the batch as scheduled (the un-virtualised batch: every request's whole sequence, not its
#: chunk); every other path is the release's own.
LOCAL_UNVIRTUALISED_PRECOMPUTE = (
    (r"(\n(\s+)metadata = super\(\)\.build\(common_prefix_len, cm, fast_build\)\n)",
     r"\1\2metadata.scheduler_metadata = super().build(\n"
     r"\2    common_prefix_len, common_attn_metadata, fast_build\n\2).scheduler_metadata\n"),
)


def vllm_local_regression_copy(dest: Path, release: str = "0.33.0", aligned=None, patches=LOCAL_UNVIRTUALISED_PRECOMPUTE
                               ) -> Path:
    """vLLM ``release`` (its full-graph replay aligned by ``aligned``: :data:`ALIGNED_REPLAY_0_33_0` by default, the
    passing base of the 0.33.0 controls) with ``patches`` applied to its chunked local attention module (none: the
    passing control, the aligned copy with the release's own local path)."""
    return vllm_patched_copy(release, dest, ALIGNED_REPLAY_0_33_0 if aligned is None else aligned,
                             more={VLLM_CHUNKED_LOCAL: patches} if patches else None)

#: vLLM 0.33.0 whose metadata builder takes the precompute's KV heads from the model config
#: (``ModelConfig.get_num_kv_heads``, as 0.11.0 .. 0.28.0 do) instead of its attention group's KV-cache spec, while each
#: layer calls FA3 with its own: on a model whose layers differ from its config, every group but the first
#: precomputes with another layer's heads.
MODEL_CONFIG_KV_HEADS_0_33_0 = (
    (r"\n(        )self\.num_heads_kv = kv_cache_spec\.num_kv_heads\n",
     r"\n\1self.num_heads_kv = self.model_config.get_num_kv_heads(self.parallel_config)\n"),
)


#: 0.34.0 with one path regressed: the V2 runner's draft decode steps (``update_draft_decode_metadata``, the fused
#: draft-decode update the speculator calls before each draft step) precompute with a split bound of 128 where the
#: draft step's call passes the metadata's own (0 outside FULL graphs: FA3's heuristic); the target steps, every other
#: path and the draft calls are the release's own.
DRAFT_UPDATE_SPLITS_0_34_0 = (
    (r"(\n            causal=metadata\.causal,\n            )max_num_splits=metadata\.max_num_splits,\n",
     r"\1max_num_splits=metadata.max_num_splits or 128,\n"),
)

#: 0.31.0 with the same one-path regression (the same lines of ``update_draft_decode_metadata``, which 0.28.0 ..
#: 0.31.0's speculator reaches through each attention group's ``update_draft_decode_metadata`` in
#: ``_generate_fused_drafts``; the pattern matches once in 0.28.0, 0.29.0 and 0.30.0 too)
DRAFT_UPDATE_SPLITS_0_31_0 = DRAFT_UPDATE_SPLITS_0_34_0

#: 0.34.0 with one path regressed: the fused draft-decode update under a full-graph mode (the one place its metadata's
#: ``max_num_splits`` is > 0: the FULL draft-decode graph's in-graph recompute, and a draft batch above the captured
#: graphs) precomputes with twice the split bound the draft call passes (64 for 32); eager and piecewise modes (0) and
#: every target step are the release's own.
DRAFT_GRAPH_UPDATE_SPLITS_0_34_0 = (
    (r"(\n            causal=metadata\.causal,\n            )max_num_splits=metadata\.max_num_splits,\n",
     r"\1max_num_splits=metadata.max_num_splits * 2,\n"),
)
