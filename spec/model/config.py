"""Model shapes and serving-engine parallel configuration, with the domain they are valid in.

Two dataclasses describe one deployment of the system under test:

* :class:`ModelConfig` -- the attention shapes of a model (query/KV heads, head dims, dtype).
* :class:`ServerConfig` -- the sglang ``ServerArgs`` fields that decide how attention heads are
  split over ranks and whether FA3 scheduler metadata is precomputed.

Head counts (read in sglang, not copied):

* ``attn_tp_size`` follows ``compute_dp_attention_world_info`` in
  ``python/sglang/srt/layers/dp_attention.py``: ``attn_dp_size = dp_size if enable_dp_attention
  else 1`` and ``attn_tp_size = tp_size // attn_dp_size // attn_cp_size``.  So with DP attention
  off, ``dp_size`` does not enter the formula (plain data parallelism runs whole engines side by
  side), while ``attn_cp_size`` always does.  docs/facts-fa3.md section 1 writes
  ``tp_size // (dp_size * attn_cp_size)``, which is the DP-attention-on case.
* The heads a layer's tensors carry follow the attention modules (e.g.
  ``python/sglang/srt/models/qwen3_moe.py``, ``llama.py``): ``H // attn_tp_size`` query heads
  (asserted divisible) and ``max(1, Hk // attn_tp_size)`` KV heads, where ``Hk >= attn_tp_size``
  requires ``Hk % attn_tp_size == 0`` and ``Hk < attn_tp_size`` requires ``attn_tp_size % Hk == 0``
  (each KV head is then replicated on ``attn_tp_size // Hk`` ranks).
* The precompute (``FlashAttentionBackend.__init__`` in
  ``python/sglang/srt/layers/attention/flashattention_backend.py``) uses
  ``num_attention_heads // tp_size`` and ``ModelConfig.get_num_kv_heads(tp_size)`` =
  ``max(1, Hk // tp_size)`` (``python/sglang/srt/configs/model_config.py``): the full TP size.

Every validation rule is a named domain assumption (:data:`DOMAIN_ASSUMPTIONS`); callers (the
prover's ``--drop-assumption NAME``) may validate with a set of them dropped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Collection, Mapping, NamedTuple, Optional

from spec.violation import Violation

DTYPES = ("bfloat16", "float16", "float8_e4m3")
CP_STRATEGIES = (None, "zigzag")
MAX_NUM_SPLITS = 256  # FA3 enforces num_splits <= 256 at call time (hopper/flash_api.cpp)
MAX_HEAD_DIM = 256  # FA3 hopper forward: qk head dim up to 256
MAX_HEAD_DIM_V = 512  # FA3 hopper forward: v head dim up to 512 (d <= 64 only, see tile_size.h)
H200_NUM_SM = 132


# --------------------------------------------------------------------------------------------
# Domain assumptions: one name per validation rule.
# --------------------------------------------------------------------------------------------


class Assumption(NamedTuple):
    """A named validation rule of the configuration domain."""

    name: str
    description: str


ASSUMPTION_POSITIVE_SIZES = "ASSUMPTION_POSITIVE_SIZES"
ASSUMPTION_TP_DIVISIBLE = "ASSUMPTION_TP_DIVISIBLE"
ASSUMPTION_HEADS_POSITIVE = "ASSUMPTION_HEADS_POSITIVE"
ASSUMPTION_GQA_GROUPS = "ASSUMPTION_GQA_GROUPS"
ASSUMPTION_HEADS_DIVISIBLE_ATTN_TP = "ASSUMPTION_HEADS_DIVISIBLE_ATTN_TP"
ASSUMPTION_KV_HEADS_SPLIT_ATTN_TP = "ASSUMPTION_KV_HEADS_SPLIT_ATTN_TP"
ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL = "ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL"
ASSUMPTION_HEAD_DIM_SUPPORTED = "ASSUMPTION_HEAD_DIM_SUPPORTED"
ASSUMPTION_DTYPE_SUPPORTED = "ASSUMPTION_DTYPE_SUPPORTED"
ASSUMPTION_CP_STRATEGY_KNOWN = "ASSUMPTION_CP_STRATEGY_KNOWN"
ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY = "ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY"
ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP = "ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP"
ASSUMPTION_NUM_SPLITS_RANGE = "ASSUMPTION_NUM_SPLITS_RANGE"

# Names of the prover's domain assumptions (spec.model.domain.ASSUMPTIONS) that are not a validation rule here; the
# prover's other assumptions share the names above (one spelling for both, ``prove --drop-assumption NAME``).
ASSUMPTION_DP_ATTENTION_NEEDS_DP = "ASSUMPTION_DP_ATTENTION_NEEDS_DP"
ASSUMPTION_PREFILL_CP_NEEDS_CP_SIZE = "ASSUMPTION_PREFILL_CP_NEEDS_CP_SIZE"
ASSUMPTION_HEADS_DIVISIBLE = "ASSUMPTION_HEADS_DIVISIBLE"
ASSUMPTION_MLA_NEVER_PRECOMPUTES = "ASSUMPTION_MLA_NEVER_PRECOMPUTES"
ASSUMPTION_DETERMINISTIC_ONE_SPLIT = "ASSUMPTION_DETERMINISTIC_ONE_SPLIT"
ASSUMPTION_SAME_NUM_SPLITS = "ASSUMPTION_SAME_NUM_SPLITS"
ASSUMPTION_SAME_SM_COUNT = "ASSUMPTION_SAME_SM_COUNT"
ASSUMPTION_SHARDED_KV_NEEDS_CP = "ASSUMPTION_SHARDED_KV_NEEDS_CP"

DOMAIN_ASSUMPTIONS: list[Assumption] = [
    Assumption(
        ASSUMPTION_POSITIVE_SIZES,
        "tp_size, dp_size, attn_cp_size, page_size, num_sm and context_length are integers >= 1",
    ),
    Assumption(
        ASSUMPTION_TP_DIVISIBLE,
        "tp_size is divisible by attn_dp_size * attn_cp_size (attn_dp_size = dp_size with DP "
        "attention, else 1), as compute_dp_attention_world_info needs",
    ),
    Assumption(ASSUMPTION_HEADS_POSITIVE, "num_heads >= 1 and 1 <= num_kv_heads <= num_heads"),
    Assumption(ASSUMPTION_GQA_GROUPS, "num_heads is divisible by num_kv_heads (whole GQA groups)"),
    Assumption(
        ASSUMPTION_HEADS_DIVISIBLE_ATTN_TP,
        "num_heads is divisible by attn_tp_size (sglang attention modules assert it)",
    ),
    Assumption(
        ASSUMPTION_KV_HEADS_SPLIT_ATTN_TP,
        "num_kv_heads is divisible by attn_tp_size when >= it, else attn_tp_size is divisible by "
        "num_kv_heads (KV heads replicated); sglang attention modules assert it",
    ),
    Assumption(
        ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL,
        "num_heads is divisible by tp_size, so the precompute's num_heads // tp_size is exact and "
        ">= 1 (a domain restriction of this project; sglang itself does not check it)",
    ),
    Assumption(
        ASSUMPTION_HEAD_DIM_SUPPORTED,
        f"head_dim is a multiple of 8 in [8, {MAX_HEAD_DIM}] and head_dim_v a multiple of 8 in "
        f"[8, {MAX_HEAD_DIM_V}] (FA3 hopper forward)",
    ),
    Assumption(ASSUMPTION_DTYPE_SUPPORTED, f"dtype is one of {', '.join(DTYPES)}"),
    Assumption(ASSUMPTION_CP_STRATEGY_KNOWN, "cp_strategy is None or 'zigzag'"),
    Assumption(
        ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY,
        "enable_prefill_cp requires a cp_strategy (CP-v2 is never active without one)",
    ),
    Assumption(
        ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP,
        "attn_cp_size > 1 requires enable_prefill_cp for non-MLA FA3 models (the prefill CP path "
        "is the only CP path this model covers for them)",
    ),
    Assumption(
        ASSUMPTION_NUM_SPLITS_RANGE,
        f"num_splits is 0 (heuristic) or a fixed count in [1, {MAX_NUM_SPLITS}]",
    ),
]

ASSUMPTION_NAMES: frozenset[str] = frozenset(a.name for a in DOMAIN_ASSUMPTIONS)


def check_dropped_assumptions(dropped: Collection[str]) -> frozenset[str]:
    """Return ``dropped`` as a frozenset after checking every name is a known assumption."""
    dropped = frozenset(dropped)
    unknown = sorted(dropped - ASSUMPTION_NAMES)
    if unknown:
        raise ValueError(
            f"unknown assumption name(s) {unknown}; known: {sorted(ASSUMPTION_NAMES)}"
        )
    return dropped


def assumption_violation(assumption: str, field: str, message: str) -> Violation:
    """One broken domain assumption: the rule (``invariant``, an ``ASSUMPTION_*`` name), its field
    (``detail["field"]``) and why (``message``)."""
    return Violation(assumption, None, {"field": field}, message)


# --------------------------------------------------------------------------------------------
# Strict dict (de)serialisation shared by both dataclasses.
# --------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _from_dict(cls, data: Mapping[str, Any], types: Mapping[str, str]):
    if not isinstance(data, Mapping):
        raise ValueError(f"{cls.__name__}.from_dict expects a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(
            f"{cls.__name__}: unknown field(s) {unknown}; allowed fields: {sorted(fields)}"
        )
    missing = [
        name
        for name, f in fields.items()
        if name not in data
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(f"{cls.__name__}: missing required field(s) {missing}")
    for name, value in data.items():
        kind = types[name]
        ok = {
            "int": _is_int(value),
            "bool": isinstance(value, bool),
            "str": isinstance(value, str),
            "opt_int": value is None or _is_int(value),
            "opt_str": value is None or isinstance(value, str),
        }[kind]
        if not ok:
            raise ValueError(
                f"{cls.__name__}.{name}: expected {kind.replace('opt_', 'None or ')}, "
                f"got {value!r} ({type(value).__name__})"
            )
    return cls(**dict(data))


# --------------------------------------------------------------------------------------------
# ModelConfig
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """Attention shapes of one model, as sglang's ``ModelConfig`` reads them from the HF config.

    ``head_dim_v`` defaults to ``head_dim``.  ``is_mla`` marks MLA models (no FA3 scheduler
    metadata precompute for them); ``has_sliding_window_layers`` marks models with SWA layers
    (those layers never consume the precomputed metadata).
    """

    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: Optional[int] = None
    dtype: str = "bfloat16"
    is_mla: bool = False
    has_sliding_window_layers: bool = False

    def __post_init__(self):
        if self.head_dim_v is None:
            object.__setattr__(self, "head_dim_v", self.head_dim)

    def violations(self) -> list[Violation]:
        """List the model-only domain assumptions this shape breaks (following sglang's ModelConfig)."""
        out: list[Violation] = []
        for name in ("num_heads", "num_kv_heads", "head_dim", "head_dim_v"):
            if not _is_int(getattr(self, name)):
                raise ValueError(f"ModelConfig.{name}: expected int, got {getattr(self, name)!r}")
        if self.num_heads < 1:
            out.append(assumption_violation(ASSUMPTION_HEADS_POSITIVE, "num_heads",
                                 f"num_heads must be >= 1, got {self.num_heads}"))
        if not 1 <= self.num_kv_heads <= max(self.num_heads, 1):
            out.append(assumption_violation(
                ASSUMPTION_HEADS_POSITIVE, "num_kv_heads",
                f"num_kv_heads must be in [1, num_heads={self.num_heads}], got {self.num_kv_heads}"))
        elif self.num_heads >= 1 and self.num_heads % self.num_kv_heads != 0:
            out.append(assumption_violation(
                ASSUMPTION_GQA_GROUPS, "num_kv_heads",
                f"num_heads={self.num_heads} must be divisible by num_kv_heads={self.num_kv_heads}"))
        for name, limit in (("head_dim", MAX_HEAD_DIM), ("head_dim_v", MAX_HEAD_DIM_V)):
            value = getattr(self, name)
            if not (8 <= value <= limit and value % 8 == 0):
                out.append(assumption_violation(
                    ASSUMPTION_HEAD_DIM_SUPPORTED, name,
                    f"{name} must be a multiple of 8 in [8, {limit}], got {value}"))
        if self.dtype not in DTYPES:
            out.append(assumption_violation(ASSUMPTION_DTYPE_SUPPORTED, "dtype",
                                 f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}"))
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form of this model shape (all fields, ``head_dim_v`` resolved)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        """Build from a JSON case-file mapping; ValueError names any unknown, missing or mistyped field."""
        return _from_dict(cls, data, _MODEL_TYPES)


_MODEL_TYPES = {
    "name": "str",
    "num_heads": "int",
    "num_kv_heads": "int",
    "head_dim": "int",
    "head_dim_v": "opt_int",
    "dtype": "str",
    "is_mla": "bool",
    "has_sliding_window_layers": "bool",
}


# Real shapes, from each model's Hugging Face config.json (num_attention_heads,
# num_key_value_heads / n_head_kv / multi_query, head_dim or hidden_size // num_attention_heads).
MODELS: dict[str, ModelConfig] = {
    # meta-llama/Meta-Llama-3-8B: hidden 4096, 32 heads, 8 KV heads -> head_dim 128.
    "llama-3-8b": ModelConfig("llama-3-8b", 32, 8, 128),
    # Qwen/Qwen3-30B-A3B: 32 heads, 4 KV heads, head_dim 128 (docs/facts-fa3.md's worked example).
    "qwen3-30b-a3b": ModelConfig("qwen3-30b-a3b", 32, 4, 128),
    # Qwen/Qwen3-235B-A22B: 64 heads, 4 KV heads, head_dim 128.
    "qwen3-235b-a22b": ModelConfig("qwen3-235b-a22b", 64, 4, 128),
    # meta-llama/Llama-2-7b-hf: hidden 4096, 32 heads, no GQA (32 KV heads) -> head_dim 128.
    "llama-2-7b": ModelConfig("llama-2-7b", 32, 32, 128),
    # bigcode/starcoder (gpt_bigcode): n_embd 6144, n_head 48, multi_query -> MQA, head_dim 128.
    "starcoder": ModelConfig("starcoder", 48, 1, 128),
    # tiiuae/falcon-7b: hidden 4544, n_head 71, multi_query -> MQA, head_dim 64. 71 is prime,
    # so only tp_size = 1 passes ASSUMPTION_HEADS_DIVISIBLE_ATTN_TP / _PRECOMPUTE_HEADS_INTEGRAL.
    "falcon-7b": ModelConfig("falcon-7b", 71, 1, 64),
    # google/gemma-2-9b: 16 heads, 8 KV heads, head_dim 256, alternating sliding-window layers.
    "gemma-2-9b": ModelConfig("gemma-2-9b", 16, 8, 256, has_sliding_window_layers=True),
    # meta-llama/Llama-3.2-1B: hidden 2048, 32 heads, 8 KV heads, head_dim 64.
    "llama-3.2-1b": ModelConfig("llama-3.2-1b", 32, 8, 64),
    # deepseek-ai/DeepSeek-V2-Lite: MLA (q/k head dim 192, v 128, 16 heads); the backend never precomputes for MLA.
    "deepseek-v2-lite": ModelConfig("deepseek-v2-lite", 16, 16, 192, 128, is_mla=True),
}


def get_model(name: str) -> ModelConfig:
    """Look a model shape up in :data:`MODELS`, naming the known ones when it is absent."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(MODELS)}") from None


# --------------------------------------------------------------------------------------------
# ServerConfig
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerConfig:
    """The sglang ``ServerArgs`` fields that shape FA3 attention (``python/sglang/srt/server_args.py``).

    ``num_splits`` is what the backend would pass to FA3 when not deterministic: 0 means the split
    heuristic (sglang's default), a positive value a fixed split count (a what-if; sglang itself
    only uses 0 or 1).  ``cuda_graph`` is ``not disable_cuda_graph``.
    """

    tp_size: int = 1
    dp_size: int = 1
    attn_cp_size: int = 1
    enable_dp_attention: bool = False
    enable_prefill_cp: bool = False
    cp_strategy: Optional[str] = None
    page_size: int = 1
    num_splits: int = 0
    enable_deterministic_inference: bool = False
    cuda_graph: bool = False
    num_sm: int = H200_NUM_SM
    context_length: int = 32768
    cp_decode_sharded_kv: bool = False

    # ---- derived -------------------------------------------------------------------------

    @property
    def attn_dp_size(self) -> int:
        """DP size of attention: ``dp_size`` with DP attention, else 1 (sglang dp_attention.py)."""
        return self.dp_size if self.enable_dp_attention else 1

    @property
    def attn_tp_size(self) -> int:
        """Attention TP size: ``tp_size // attn_dp_size // attn_cp_size`` (compute_dp_attention_world_info)."""
        return self.tp_size // self.attn_dp_size // self.attn_cp_size

    @property
    def backend_num_splits(self) -> int:
        """Split count the FA3 backend passes: 1 under deterministic inference, else ``num_splits``
        (``FlashAttentionBackend.__init__`` in flashattention_backend.py)."""
        return 1 if self.enable_deterministic_inference else self.num_splits

    def precompute_heads(self, model: ModelConfig) -> tuple[int, int]:
        """Heads the backend passes to ``get_scheduler_metadata``: ``(H // tp_size, max(1, Hk // tp_size))``
        (flashattention_backend.py ``__init__`` / model_config.py ``get_num_kv_heads``)."""
        return model.num_heads // self.tp_size, max(1, model.num_kv_heads // self.tp_size)

    def layer_heads(self, model: ModelConfig) -> tuple[int, int]:
        """Heads a layer's q/k/v tensors carry: ``(H // attn_tp_size, max(1, Hk // attn_tp_size))``
        (attention modules such as ``python/sglang/srt/models/qwen3_moe.py``)."""
        attn_tp = self.attn_tp_size
        return model.num_heads // attn_tp, max(1, model.num_kv_heads // attn_tp)

    def kv_head_replication(self, model: ModelConfig) -> int:
        """How many attention-TP ranks hold a copy of each KV head (1 when KV heads are partitioned)."""
        attn_tp = self.attn_tp_size
        return attn_tp // model.num_kv_heads if model.num_kv_heads < attn_tp else 1

    def head_counts_differ(self, model: ModelConfig) -> bool:
        """Whether precompute and layer head counts differ (the PR #30439 head-count mismatch)."""
        return self.precompute_heads(model) != self.layer_heads(model)

    # ---- validation ----------------------------------------------------------------------

    def violations(self, model: Optional[ModelConfig] = None) -> list[Violation]:
        """List every domain assumption this configuration (with ``model``, if given) breaks."""
        out: list[Violation] = []
        for name in ("tp_size", "dp_size", "attn_cp_size", "page_size", "num_splits",
                     "num_sm", "context_length"):
            if not _is_int(getattr(self, name)):
                raise ValueError(f"ServerConfig.{name}: expected int, got {getattr(self, name)!r}")
        sizes_ok = True
        for name in ("tp_size", "dp_size", "attn_cp_size", "page_size", "num_sm", "context_length"):
            value = getattr(self, name)
            if value < 1:
                sizes_ok = False
                out.append(assumption_violation(ASSUMPTION_POSITIVE_SIZES, name,
                                     f"{name} must be >= 1, got {value}"))
        if not 0 <= self.num_splits <= MAX_NUM_SPLITS:
            out.append(assumption_violation(
                ASSUMPTION_NUM_SPLITS_RANGE, "num_splits",
                f"num_splits must be 0 (heuristic) or in [1, {MAX_NUM_SPLITS}], got {self.num_splits}"))
        if self.cp_strategy not in CP_STRATEGIES:
            out.append(assumption_violation(ASSUMPTION_CP_STRATEGY_KNOWN, "cp_strategy",
                                 f"cp_strategy must be one of {list(CP_STRATEGIES)}, "
                                 f"got {self.cp_strategy!r}"))
        if self.enable_prefill_cp and self.cp_strategy is None:
            out.append(assumption_violation(ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY, "cp_strategy",
                                 "enable_prefill_cp=True requires cp_strategy='zigzag', got None"))
        if not sizes_ok:
            return out + (model.violations() if model is not None else [])
        group = self.attn_dp_size * self.attn_cp_size
        tp_ok = self.tp_size % group == 0
        if not tp_ok:
            out.append(assumption_violation(
                ASSUMPTION_TP_DIVISIBLE, "tp_size",
                f"tp_size={self.tp_size} must be divisible by attn_dp_size*attn_cp_size="
                f"{self.attn_dp_size}*{self.attn_cp_size}={group}"))
        if model is None:
            return out
        model_out = model.violations()
        out.extend(model_out)
        if self.attn_cp_size > 1 and not self.enable_prefill_cp and not model.is_mla:
            out.append(assumption_violation(
                ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP, "enable_prefill_cp",
                f"attn_cp_size={self.attn_cp_size} > 1 requires enable_prefill_cp=True for the "
                f"non-MLA model {model.name!r}"))
        if any(v.invariant == ASSUMPTION_HEADS_POSITIVE for v in model_out) or not tp_ok:
            return out
        attn_tp = self.attn_tp_size
        H, Hk = model.num_heads, model.num_kv_heads
        if H % attn_tp != 0:
            out.append(assumption_violation(
                ASSUMPTION_HEADS_DIVISIBLE_ATTN_TP, "num_heads",
                f"num_heads={H} of {model.name!r} must be divisible by attn_tp_size={attn_tp}"))
        if Hk >= attn_tp and Hk % attn_tp != 0:
            out.append(assumption_violation(
                ASSUMPTION_KV_HEADS_SPLIT_ATTN_TP, "num_kv_heads",
                f"num_kv_heads={Hk} >= attn_tp_size={attn_tp} must be divisible by it"))
        if Hk < attn_tp and attn_tp % Hk != 0:
            out.append(assumption_violation(
                ASSUMPTION_KV_HEADS_SPLIT_ATTN_TP, "num_kv_heads",
                f"attn_tp_size={attn_tp} > num_kv_heads={Hk} must be divisible by it "
                f"(KV heads are replicated)"))
        if H % self.tp_size != 0:
            out.append(assumption_violation(
                ASSUMPTION_PRECOMPUTE_HEADS_INTEGRAL, "tp_size",
                f"num_heads={H} of {model.name!r} must be divisible by tp_size={self.tp_size}"))
        return out

    def validate(self, model: Optional[ModelConfig] = None,
                 dropped: Collection[str] = ()) -> None:
        """Raise ValueError for the first broken assumption not in ``dropped``, naming field and range."""
        validate_config(model, self, dropped)

    def to_dict(self, include_fork_fields: bool = False) -> dict[str, Any]:
        """Plain-JSON form of these server args; the fork's ``cp_decode_sharded_kv`` only when set or asked for."""
        d = dataclasses.asdict(self)
        if not (include_fork_fields or self.cp_decode_sharded_kv):
            d.pop("cp_decode_sharded_kv")
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ServerConfig":
        """Build from a JSON case-file mapping; ValueError names any unknown or mistyped field."""
        return _from_dict(cls, data, _SERVER_TYPES)


_SERVER_TYPES = {
    "tp_size": "int",
    "dp_size": "int",
    "attn_cp_size": "int",
    "enable_dp_attention": "bool",
    "enable_prefill_cp": "bool",
    "cp_strategy": "opt_str",
    "page_size": "int",
    "num_splits": "int",
    "enable_deterministic_inference": "bool",
    "cuda_graph": "bool",
    "num_sm": "int",
    "context_length": "int",
    "cp_decode_sharded_kv": "bool",
}


def config_violations(model: Optional[ModelConfig], server: ServerConfig,
                      dropped: Collection[str] = ()) -> list[Violation]:
    """Every broken domain assumption of (model, server) whose name is not in ``dropped``."""
    dropped = check_dropped_assumptions(dropped)
    return [v for v in server.violations(model) if v.invariant not in dropped]


def validate_config(model: Optional[ModelConfig], server: ServerConfig,
                    dropped: Collection[str] = ()) -> None:
    """Raise ``ValueError`` naming the field, rule and allowed range of the first kept violation."""
    found = config_violations(model, server, dropped)
    if found:
        v = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ValueError(f"{v.detail['field']}: {v.message} [{v.invariant}]{more}")


def is_valid_config(model: Optional[ModelConfig], server: ServerConfig,
                    dropped: Collection[str] = ()) -> bool:
    """Whether (model, server) satisfies every domain assumption not in ``dropped``."""
    return not config_violations(model, server, dropped)
