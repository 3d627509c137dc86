"""An sglang release's own configuration space: its server arguments that reach the FA3 backend, the parallel
layout or the CUDA-graph runner, drawn over a superset of what its argument parser takes, kept only where the
release's own checks accept them.

Invariant: a configuration is run only if the release's ``ServerArgs`` validation accepts it and its model-load
head split holds (both asked of the release, ``SglangSUT.validate`` -> ``gpu_impl.engines.sglang.validation``; the head
split is the release's own ``Qwen3Attention.__init__``, run on CPU by ``gpu_impl.engines.sglang.model_load``); nothing
is left out because this project's prover assumes it. Every rejection is counted with the release's message.

Data: ``sglang/server_args.json``: per release, the arguments as ``ServerArgs.add_cli_args`` defines them
(``scripts/gen_sglang_domains.py``, run in each built environment; a release without an entry uses the nearest
older one that has it), and the draw table (values drawn for integer arguments the parser leaves unbounded,
weights of the target paths and flags, arguments not drawn and why).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import random
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional

from gpu_impl.domain import ConfigDomain, DomainDraw
from gpu_impl.engines.sglang.validation import FIELD_NAMES

__all__ = ["DATA_FILE", "SERVER_ARGS", "ReleaseDomain", "release_arguments", "draw_table"]

DATA_FILE = Path(__file__).resolve().parent / "server_args.json"

#: The server arguments read from each release (those that reach the backend, its layout or the graph runner).
SERVER_ARGS = ("tp_size", "dp_size", "attn_cp_size", "enable_dp_attention", "enable_prefill_cp",
               "enable_prefill_context_parallel", "cp_strategy", "prefill_cp_mode", "page_size",
               "disable_cuda_graph", "cuda_graph_bs", "cuda_graph_max_bs", "enable_deterministic_inference",
               "speculative_algorithm", "speculative_eagle_topk", "attention_backend", "decode_attention_backend",
               "kv_cache_dtype")


#: The ServerConfig fields the release's validation is given (``validation.FIELD_NAMES`` and CUDA graph): a
#: verdict is cached on these and the model's shape (the SM count and context length are not server arguments).
VALIDATED_FIELDS = tuple(FIELD_NAMES) + ("cuda_graph",)

#: How a rejection at model load begins (``SglangSUT.validate``): counted under that message, not "ServerArgs".
MODEL_LOAD = "model load"


@lru_cache(maxsize=None)
def _data() -> dict:
    return json.loads(DATA_FILE.read_text())


def draw_table() -> dict:
    """The draw table (values, weights, arguments not drawn): data, the same for every release."""
    return _data()["draw"]


def release_arguments(release: str) -> tuple:
    """(release whose definitions are used, {dest: definition}) for ``release``: its own entry, else the nearest
    older release that has one (else the oldest)."""
    from gpu_impl.engines.sglang.recipes import release_key

    have = sorted(_data()["releases"], key=release_key)
    older = [r for r in have if release_key(r) <= release_key(release)]
    used = older[-1] if older else have[0]
    return used, _data()["releases"][used]


class ReleaseDomain(ConfigDomain):
    """One sglang release's configuration space, filtered by ``validate(server, model) -> (accepted, message)``
    (the release's own ServerArgs; ``accepted`` None when its validation cannot run on CPU: counted as rejected
    with that message, never run)."""

    adapts = True  #: cells are reweighted by the share of their cases that reached a precompute

    def __init__(self, release: str, validate: Callable, label: Optional[str] = None):
        table = draw_table()
        used, args = release_arguments(release)
        super().__init__(label or f"sglang=={release}", not_covered=dict(table["not_covered"]),
                         not_drawn={k: v for k, v in table["not_drawn"].items() if k in args})
        self.release, self.arguments_of, self.arguments = release, used, args
        self.validate = validate
        self.table = table
        self.verdicts: dict = {}
        self.priors = self._cells()
        self.tries: collections.Counter = collections.Counter()
        self.hits: collections.Counter = collections.Counter()

    # -- drawing -----------------------------------------------------------------------------------------
    def _choice(self, rng: random.Random, name: str):
        return rng.choice(self.table["values"][name])

    def _flag(self, rng: random.Random, name: str) -> bool:
        return rng.random() < self.table["weights"][name]

    def _strategy(self, rng: random.Random):
        """cp_strategy: None or one of the release's own choices (any string where it declares none)."""
        spec = self.arguments.get("cp_strategy")
        if spec is None:
            return None
        options = [None] + list(spec.get("choices") or self.table["values"]["cp_strategy"])
        return rng.choice(options)

    def _cells(self) -> dict:
        """Prior weight of each cell (target path, DP attention, prefill CP): the table's target weight times
        the flags' probabilities (an idle DP rank needs DP attention; prefill CP only where the release has it)."""
        w = self.table["weights"]
        has_pcp = "enable_prefill_cp" in self.arguments or "enable_prefill_context_parallel" in self.arguments
        cells = {}
        for target, tw in w["targets"].items():
            for dpa in ((True,) if target == "dp-idle" else (False, True)):
                for pcp in ((False, True) if has_pcp else (False,)):
                    p = tw
                    if target != "dp-idle":
                        p *= w["enable_dp_attention"] if dpa else 1 - w["enable_dp_attention"]
                    if has_pcp:
                        p *= w["enable_prefill_cp"] if pcp else 1 - w["enable_prefill_cp"]
                    cells[(target, dpa, pcp)] = p
        return cells

    def cell_weights(self) -> dict:
        """Each cell's weight now: its prior times (``floor`` + the share of its cases that reached a path where
        the release precomputed, Laplace-smoothed): cells whose configurations the release runs without a
        precompute (its guard) are drawn less, never never."""
        floor = float(self.table["adapt"]["floor"])
        return {c: p * (floor + (self.hits[c] + 1) / (self.tries[c] + 2)) for c, p in self.priors.items()}

    def observe(self, cell, reached) -> None:
        """A case drawn for ``cell`` ran and reached ``reached`` (paths; None when it did not run)."""
        self.tries[cell] += 1
        self.hits[cell] += bool(reached)

    def _server(self, rng: random.Random, cell):
        from gpu_impl.config import ServerConfig

        target, dp_attention, prefill_cp = cell
        cuda_graph = target != "eager"
        dp = self._choice(rng, "dp_size")
        if target == "dp-idle":
            dp = rng.choice([d for d in self.table["values"]["dp_size"] if d > 1])
        return ServerConfig(
            tp_size=self._choice(rng, "tp_size"), dp_size=dp,
            attn_cp_size=self._choice(rng, "attn_cp_size") if "attn_cp_size" in self.arguments else 1,
            enable_dp_attention=dp_attention, enable_prefill_cp=prefill_cp,
            cp_strategy=self._strategy(rng) if (prefill_cp or self._flag(rng, "cp_strategy_alone")) else None,
            page_size=self._choice(rng, "page_size"), num_splits=0,
            enable_deterministic_inference=self._flag(rng, "enable_deterministic_inference"),
            cuda_graph=cuda_graph, num_sm=self._choice(rng, "num_sm"),
            context_length=self._choice(rng, "context_length"))

    def _model(self, rng: random.Random):
        from gpu_impl.config import MODELS

        return MODELS[rng.choice(self.table["values"]["models"])]

    def draw_config(self, rng: random.Random):
        """Up to ``tries`` configurations for one target path (drawn by weight); the first the release accepts,
        else None. Every rejection is counted by reason. The target path and the guard-relevant flags are drawn
        as a cell by :meth:`cell_weights`."""
        weights = self.cell_weights()
        cell = rng.choices(list(weights), weights=list(weights.values()))[0]
        for _ in range(int(self.table["tries"])):
            server, model = self._server(rng, cell), self._model(rng)
            reason = self.admit(server, model)
            if reason is None:
                self.accept()
                return DomainDraw(server, model, cell[0], cell)
            self.reject(reason)
        return None

    # -- the release's checks ------------------------------------------------------------------------------
    def admit(self, server, model) -> Optional[str]:
        """None when the release accepts (server, model); else its reason (its own message, from ServerArgs or
        from its model-load head split). Verdicts are cached per configuration: the release is asked once."""
        key = (tuple(getattr(server, f) for f in VALIDATED_FIELDS), dataclasses.astuple(model)[1:])
        if key not in self.verdicts:
            accepted, message = self.validate(server, model)
            if accepted is True:
                reason = None
            elif accepted is None:
                reason = f"inconclusive (validation did not run on CPU): {message}"
            elif message.startswith(MODEL_LOAD):
                reason = message
            else:
                reason = f"ServerArgs: {message}"
            self.verdicts[key] = reason
        return self.verdicts[key]
