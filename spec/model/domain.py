"""The serving-backend configuration domain the metadata theorems quantify over (docs/facts-fa3.md
sections 1 and 3).

A configuration is a discrete server setup (`Server`) and a model's attention shapes (`Model`). From it the
backend derives the precompute's head counts (`metadata_heads`: "tp" as sglang does, `H // tp_size` and
`max(1, Hk // tp_size)`; or "attn_tp", the root-cause fix) and the layer call's head counts
(`H // attn_tp_size`, `max(1, Hk // attn_tp_size)`). Lengths and batch contents are *not* part of the
configuration: the theorems keep them symbolic.

`attn_tp_size` follows sglang `compute_dp_attention_world_info` (python/sglang/srt/layers/dp_attention.py):
`attn_dp_size = dp_size if enable_dp_attention else 1`, `attn_tp_size = tp_size // attn_dp_size // attn_cp_size`.
(docs/facts-fa3.md section 1 writes `tp_size // (dp_size * attn_cp_size)`, the DP-attention-on case.)

Every validity rule is a named assumption (`ASSUMPTIONS`); `valid(cfg, dropped)` ignores the dropped ones, so
`fa3verify prove --drop-assumption NAME` can check whether a guard is still sound without it.

Guards are plain callables `guard(server_args) -> bool` (True: skip the precompute), evaluated concretely on a
`types.SimpleNamespace` with sglang's attribute names (`server_args(cfg)`), and also on namespaces lacking one
flag at a time (older sglang versions): a guard that raises there is reported by `guard_robustness`.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Optional

from refmodel.fa3_scheduler import ScheduleInputs, call_inputs, precompute_inputs

from spec.model.config import (ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP, ASSUMPTION_DETERMINISTIC_ONE_SPLIT,
                     ASSUMPTION_DP_ATTENTION_NEEDS_DP, ASSUMPTION_HEADS_DIVISIBLE, ASSUMPTION_MLA_NEVER_PRECOMPUTES,
                     ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL,
                     ASSUMPTION_PREFILL_CP_NEEDS_CP_SIZE, ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY,
                     ASSUMPTION_SAME_NUM_SPLITS, ASSUMPTION_SAME_SM_COUNT, ASSUMPTION_SHARDED_KV_NEEDS_CP,
                     ASSUMPTION_TP_DIVISIBLE, MODELS, ModelConfig, ServerConfig)
from spec.model.guards import BUILTIN_GUARDS, evaluate_guard, load_guard, no_guard, server_args_namespace
from spec.model.guards import prefix_guard_dp_only as prefix_guard
from spec.model.guards import should_disable_scheduler_metadata_precompute as fixed_guard

__all__ = [
    "Model", "Server", "Config", "MODELS", "NUM_SMS", "ASSUMPTIONS", "assumption_name_error", "violations", "valid", "enumerate_configs",
    "server_args", "prefix_guard", "fixed_guard", "no_guard", "GUARDS", "resolve_guard", "precomputes",
    "guard_robustness", "GUARD_FLAGS", "FIXED_SPLITS_REPRESENTATIVE", "METADATA_HEADS",
]

#: SM counts of the GPUs in the domain (H800/H20-class 78, A100 108, H100 PCIe 114, H100/H200 SXM 132).
NUM_SMS = (78, 108, 114, 132)
#: A positive num_splits in the enumeration stands for "a fixed split count"; the theorems treat it as a
#: symbolic value in 1..256, so this representative only names the class.
FIXED_SPLITS_REPRESENTATIVE = 8
METADATA_HEADS = ("tp", "attn_tp")


#: The configuration classes and the model registry are spec.model.config's (the backend uses the same ones).
Model = ModelConfig
Server = ServerConfig


@dataclass(frozen=True)
class Config:
    """One discrete configuration: server + model, with the derived head counts (sglang dp_attention.py)."""

    server: Server
    model: Model

    @property
    def attn_dp_size(self) -> int:
        """dp_size with DP attention, else 1 (ServerConfig.attn_dp_size, compute_dp_attention_world_info)."""
        return self.server.attn_dp_size

    @property
    def attn_tp_size(self) -> int:
        """tp_size // attn_dp_size // attn_cp_size (ServerConfig.attn_tp_size, compute_dp_attention_world_info)."""
        return self.server.attn_tp_size

    @property
    def call_heads(self) -> tuple[int, int]:
        """Heads of the layer's tensors: H // attn_tp_size, max(1, Hk // attn_tp_size) (ServerConfig.layer_heads)."""
        if self.attn_tp_size < 1:
            return self.model.num_heads, self.model.num_kv_heads
        return self.server.layer_heads(self.model)

    def precompute_heads(self, metadata_heads: str = "tp") -> tuple[int, int]:
        """Heads given to get_scheduler_metadata: "tp" as sglang (ServerConfig.precompute_heads), or "attn_tp"."""
        if metadata_heads not in METADATA_HEADS:
            raise ValueError(f"metadata_heads: must be one of {METADATA_HEADS}, got {metadata_heads!r}")
        return self.server.precompute_heads(self.model) if metadata_heads == "tp" else self.call_heads

    @property
    def backend_num_splits(self) -> int:
        """num_splits the backend passes on both sides: 1 under deterministic inference (ServerConfig)."""
        return self.server.backend_num_splits

    @property
    def sharded_kv(self) -> bool:
        """The call runs over a rank-local shard of the KV (the fork's CP decode path)."""
        return self.server.cp_decode_sharded_kv and self.server.attn_cp_size > 1

    def precompute_inputs(self, metadata_heads: str = "tp", batch_size: int = 1, max_seqlen_k: int = 0) -> ScheduleInputs:
        """refmodel inputs of sglang's get_scheduler_metadata (docs/facts-fa3.md section 3: max_seqlen_q=1, cu_seqlens_q,
        causal)."""
        h, hk = self.precompute_heads(metadata_heads)
        m = self.model
        return precompute_inputs(batch_size, 1, max_seqlen_k, h, hk, m.head_dim, qkv_dtype=m.dtype,
                                 headdim_v=m.head_dim_v, varlen_q=True, page_size=self.server.page_size, causal=True,
                                 num_splits=self.backend_num_splits, num_sm=self.server.num_sm)

    def call_inputs(self, batch_size: int = 1, seqlen_k: int = 0) -> ScheduleInputs:
        """refmodel inputs of the layer's flash_attn_with_kvcache call (paged, cache_seqlens, cu_seqlens_q, causal)."""
        h, hk = self.call_heads
        m = self.model
        return call_inputs(batch_size, 1, seqlen_k, h, hk, m.head_dim, headdim_v=m.head_dim_v, qkv_dtype=m.dtype,
                           varlen_q=True, has_cache_seqlens=True, page_size=self.server.page_size, causal=True,
                           num_splits=self.backend_num_splits, num_sm=self.server.num_sm)

    def to_dict(self) -> dict:
        """{"server", "model"} with every field (the fork flag included)."""
        return {"server": self.server.to_dict(include_fork_fields=True), "model": self.model.to_dict()}

    def label(self) -> str:
        """A short human label: model/tp/dp/cp flags/SM count/split policy."""
        s = self.server
        parts = [self.model.name, f"tp{s.tp_size}"]
        if s.dp_size > 1:
            parts.append(f"dp{s.dp_size}{'+dpa' if s.enable_dp_attention else ''}")
        if s.attn_cp_size > 1:
            parts.append(f"cp{s.attn_cp_size}{'+pcp' if s.enable_prefill_cp else ''}"
                         f"{'+sharded-kv' if s.cp_decode_sharded_kv else ''}")
        parts.append(f"sm{s.num_sm}")
        parts.append("det" if s.enable_deterministic_inference else f"splits={s.num_splits}")
        return "/".join(parts)


# ------------------------------------------------------------------------------------------------------------
# Assumptions
# ------------------------------------------------------------------------------------------------------------

ASSUMPTIONS: dict[str, str] = {
    ASSUMPTION_TP_DIVISIBLE: "tp_size is divisible by attn_dp_size * attn_cp_size (sglang compute_dp_attention_world_info).",
    ASSUMPTION_DP_ATTENTION_NEEDS_DP: "enable_dp_attention comes with dp_size > 1 (with dp_size 1 sglang turns it off).",
    ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY: "enable_prefill_cp requires a cp_strategy ('zigzag'); CP-v2 is never active without one.",
    ASSUMPTION_PREFILL_CP_NEEDS_CP_SIZE: "enable_prefill_cp comes with attn_cp_size > 1.",
    ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP: "on a non-MLA FA3 model, attn_cp_size > 1 comes with enable_prefill_cp "
                                "(sglang server-args validation; prefill CP is the only CP path for such models).",
    ASSUMPTION_HEADS_DIVISIBLE: "num_heads is divisible by attn_tp_size; num_kv_heads is divisible by attn_tp_size, or "
                       "attn_tp_size by num_kv_heads (sglang attention modules assert it at model load).",
    ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL: "num_heads is divisible by tp_size (what a precompute with H // tp_size heads "
                       "would need to be exact; no release checks it: spec/model/assumption_facts.json).",
    ASSUMPTION_MLA_NEVER_PRECOMPUTES: "MLA models never precompute FA3 scheduler metadata (flashattention_backend.py: non-MLA only).",
    ASSUMPTION_DETERMINISTIC_ONE_SPLIT: "deterministic inference passes num_splits=1 on both sides (flashattention_backend.py).",
    ASSUMPTION_SAME_NUM_SPLITS: "the precompute and the call get the same num_splits argument (self.num_splits).",
    ASSUMPTION_SAME_SM_COUNT: "the precompute and the call see the same SM count (same device, sm_margin 0).",
    ASSUMPTION_SHARDED_KV_NEEDS_CP: "the sharded-KV CP decode path exists only with attn_cp_size > 1.",
}


def violations(cfg: Config, dropped: frozenset = frozenset()) -> list[tuple[str, str]]:
    """(assumption, message) for every assumption `cfg` breaks that is not in `dropped`."""
    s, m = cfg.server, cfg.model
    out: list[tuple[str, str]] = []

    def need(name: str, ok: bool, msg: str) -> None:
        if not ok and name not in dropped:
            out.append((name, msg))

    group = cfg.attn_dp_size * s.attn_cp_size
    need(ASSUMPTION_TP_DIVISIBLE, s.tp_size % group == 0, f"tp_size={s.tp_size} not divisible by {group}")
    need(ASSUMPTION_DP_ATTENTION_NEEDS_DP, not s.enable_dp_attention or s.dp_size > 1, "enable_dp_attention with dp_size=1")
    need(ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY, not s.enable_prefill_cp or s.cp_strategy is not None,
         "enable_prefill_cp without cp_strategy")
    need(ASSUMPTION_PREFILL_CP_NEEDS_CP_SIZE, not s.enable_prefill_cp or s.attn_cp_size > 1, "enable_prefill_cp with attn_cp_size=1")
    need(ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP, m.is_mla or s.attn_cp_size == 1 or s.enable_prefill_cp,
         f"attn_cp_size={s.attn_cp_size} without enable_prefill_cp on non-MLA {m.name}")
    t = cfg.attn_tp_size
    heads_ok = (t >= 1 and m.num_heads % t == 0
                and (m.num_kv_heads % t == 0 if m.num_kv_heads >= t else t % m.num_kv_heads == 0))
    need(ASSUMPTION_HEADS_DIVISIBLE, heads_ok, f"{m.name} heads {m.num_heads}/{m.num_kv_heads} vs attn_tp={t}")
    need(ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL, m.num_heads % s.tp_size == 0,
         f"{m.name} heads {m.num_heads} not divisible by tp={s.tp_size}")
    need(ASSUMPTION_SHARDED_KV_NEEDS_CP, not s.cp_decode_sharded_kv or s.attn_cp_size > 1, "cp_decode_sharded_kv with attn_cp_size=1")
    need(ASSUMPTION_DETERMINISTIC_ONE_SPLIT, not (s.enable_deterministic_inference and s.num_splits not in (0, 1)),
         "deterministic inference with a num_splits other than 1")
    if t < 1 and ASSUMPTION_TP_DIVISIBLE in dropped:
        out.append((ASSUMPTION_TP_DIVISIBLE, f"attn_tp_size={t} < 1: no configuration"))
    return out


def valid(cfg: Config, dropped: frozenset = frozenset()) -> bool:
    """Whether `cfg` satisfies every assumption not in `dropped` (the domain follows sglang's validation)."""
    return not violations(cfg, frozenset(dropped))


def assumption_name_error(names, field: str = "dropped_assumptions") -> Optional[str]:
    """The usage message for the names in ``names`` that are not prover assumptions (None when all are).

    A name is spelled as in :data:`ASSUMPTIONS` (``ASSUMPTION_*``, the same names as ``spec.model.config``); an old short
    spelling (``TP_DIVISIBLE``) is refused with its current name."""
    unknown = sorted(frozenset(names) - set(ASSUMPTIONS))
    if not unknown:
        return None
    renamed = [f"{n} is now ASSUMPTION_{n}" for n in unknown if f"ASSUMPTION_{n}" in ASSUMPTIONS]
    hint = f" ({'; '.join(renamed)})" if renamed else ""
    return f"{field}: unknown name(s) {', '.join(unknown)}{hint}; allowed: {', '.join(sorted(ASSUMPTIONS))}"


def check_names(dropped) -> frozenset:
    dropped = frozenset(dropped)
    message = assumption_name_error(dropped)
    if message:
        raise ValueError(message)
    return dropped


def enumerate_configs(dropped: frozenset = frozenset(), models=None, num_sms=NUM_SMS,
                      page_sizes=(1, 64)) -> Iterator[Config]:
    """Every valid discrete configuration (with `dropped` assumptions ignored): a few thousand, grouped later.

    Axes: model; tp 1,2,4,8; dp 1,2,4,8 with DP attention (plain DP: dp 2 as the representative, it replicates
    whole engines); attn_cp 1,2,4,8; prefill CP on/off with strategy None/zigzag; the sharded-KV CP decode path
    on/off; num_splits 0 or fixed; deterministic on/off; page size; SM count. CUDA graph is enumerated off: it only
    changes the call's page-table width, which the theorems keep symbolic.
    """
    dropped = check_names(dropped)
    models = tuple(MODELS.values()) if models is None else tuple(models)
    return iter(_configs(dropped, models, tuple(num_sms), tuple(page_sizes)))


@lru_cache(maxsize=32)
def _configs(dropped: frozenset, models: tuple, num_sms: tuple, page_sizes: tuple) -> tuple:
    out = []
    for model in models:
        for tp, dp, cp in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)):
            for dpa, pcp, strategy, sharded in itertools.product((False, True), (False, True), (None, "zigzag"),
                                                                 (False, True)):
                if strategy is not None and not pcp:
                    continue  # a strategy without prefill CP changes nothing
                if dp > 1 and not dpa and dp != 2:
                    continue  # plain DP replicates whole engines: one representative
                for det, ns in ((False, 0), (False, FIXED_SPLITS_REPRESENTATIVE), (True, 0)):
                    base = Server(tp_size=tp, dp_size=dp, attn_cp_size=cp, enable_dp_attention=dpa,
                                  enable_prefill_cp=pcp, cp_strategy=strategy, num_splits=ns,
                                  enable_deterministic_inference=det, cp_decode_sharded_kv=sharded)
                    cfg = Config(base, model)
                    # validity does not read page_size or num_sm: check once, then expand
                    if cfg.attn_tp_size < 1 or not valid(cfg, dropped):
                        continue
                    for page, sm in itertools.product(page_sizes, num_sms):
                        out.append(Config(dataclasses.replace(base, page_size=page, num_sm=sm), model))
    return tuple(out)


# ------------------------------------------------------------------------------------------------------------
# Guards
# ------------------------------------------------------------------------------------------------------------

#: ServerArgs attributes a guard may read that older sglang versions lack (prefill CP arrived late).
GUARD_FLAGS = ("enable_prefill_cp", "enable_dp_attention", "attn_cp_size", "cp_strategy", "dp_size")


def server_args(cfg: Config, missing: tuple = ()) -> SimpleNamespace:
    """A ServerArgs-like namespace with sglang's attribute names (spec.model.guards); `missing` attributes are left out."""
    ns = server_args_namespace(cfg.server)
    for name in missing:
        if hasattr(ns, name):
            delattr(ns, name)
    return ns


GUARDS: dict[str, Callable[[Any], Any]] = dict(BUILTIN_GUARDS)


def resolve_guard(guard) -> tuple[Callable[[Any], Any], str]:
    """(callable, label) for a guard given as a callable, a name in GUARDS, or a spec.model.guards.load_guard spec."""
    if callable(guard):
        for name, fn in GUARDS.items():
            if fn is guard:
                return guard, name
        mod, qual = getattr(guard, "__module__", None), getattr(guard, "__qualname__", "")
        if mod and qual.isidentifier() and mod != "__main__":
            return guard, f"{mod}:{qual}"
        return guard, qual or repr(guard)
    if isinstance(guard, str):
        return load_guard(guard), guard
    raise ValueError(f"guard: a callable, one of {sorted(GUARDS)}, 'package.module:function' or "
                     f"'path/to/file.py:function', got {guard!r}")


def precomputes(cfg: Config, guard: Callable[[Any], Any], dropped: frozenset = frozenset()) -> bool:
    """Whether the backend computes scheduler metadata for decode under `cfg` (docs/facts-fa3.md section 3).

    Only non-MLA models precompute (unless ASSUMPTION_MLA_NEVER_PRECOMPUTES is dropped), and only when the guard does not
    disable it. Exceptions from the guard propagate (see `guard_robustness`).
    """
    if cfg.model.is_mla and ASSUMPTION_MLA_NEVER_PRECOMPUTES not in dropped:
        return False
    return not evaluate_guard(guard, server_args(cfg))


def guard_robustness(guard: Callable[[Any], Any], configs) -> list[dict]:
    """Evaluate `guard` on every config's ServerArgs and on copies lacking each of GUARD_FLAGS; list the raises.

    Each entry: {"config", "missing_attribute", "error", "message"}; the message names the attribute so a user can
    switch to `getattr(server_args, NAME, False)`.
    """
    out: list[dict] = []
    seen: set = set()
    for cfg in configs:
        for missing in [()] + [(f,) for f in GUARD_FLAGS]:
            try:
                guard(server_args(cfg, missing))
            except Exception as exc:  # noqa: BLE001 - any exception from a user guard is the finding
                attr = getattr(exc, "name", None) or (missing[0] if missing else None)
                key = (attr, type(exc).__name__)
                if key in seen:
                    continue
                seen.add(key)
                out.append({"config": cfg.label(), "missing_attribute": attr, "error": type(exc).__name__,
                            "message": f"guard raised {type(exc).__name__}({exc}) on a ServerArgs "
                                       f"{'lacking ' + repr(missing[0]) if missing else 'with every flag'}"
                                       f"{' (attribute ' + repr(attr) + ')' if attr else ''}; read flags with "
                                       f"getattr(server_args, NAME, False)"})
    return out
