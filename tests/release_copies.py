"""Source copies of installed sglang releases with a seeded regression, for negative controls (run as
``sglang-src=PATH``): the release's package as a tree of links, with only the patched module written anew
(nothing of sglang is committed to this repository; the patches are applied at test time and fail loudly when
the release no longer contains what they patch)."""

from __future__ import annotations

import os
import re
import shutil
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


def patched_copy(release: str, dest: Path, patches, module: Path = BACKEND) -> Path:
    """``dest/python``: release ``release``'s installed sglang as links, ``module`` patched (each pattern must
    match exactly once); returns the checkout root to pass as ``sglang-src=``."""
    from gpu_impl.engines import envs

    site = envs.env_dir(release) / "lib" / "python3.11" / "site-packages" / "sglang"
    root = Path(dest) / "python"
    shutil.copytree(site, root / "sglang", copy_function=os.symlink)
    target = root / "sglang" / module
    text = target.read_text()
    for pattern, repl in patches:
        text, n = re.subn(pattern, repl, text)
        if n != 1:
            raise AssertionError(f"sglang {release}: {module} matches {pattern!r} {n} times, not once")
    target.unlink()
    target.write_text(text)
    for pyc in (target.parent / "__pycache__").glob(target.stem + ".*"):
        pyc.unlink()
    return root


def replay_only_regression(dest: Path) -> Path:
    """0.5.23 with only its graph-replay recompute regressed (:data:`REPLAY_ONLY_HEADS_0_5_23`)."""
    return patched_copy("0.5.23", dest, REPLAY_ONLY_HEADS_0_5_23)
